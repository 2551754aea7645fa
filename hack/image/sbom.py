"""The software bill of materials of a gpushare image: SPDX 2.3 JSON, the format trivy and grype read.

It lists every Debian package the rootfs' dpkg status has installed (name, version, architecture,
source package, `pkg:deb/debian/...`), the Debian release they belong to, and every Python
distribution with a `*.dist-info/METADATA` in the image (name, version, licence, `pkg:pypi/...`),
gpushare's own wheel among them, all read from the image's layers as built.

`build.py` writes it next to the OCI archive and attaches it to the archive's image layout as an
OCI referrer: an artifact manifest with `artifactType: application/spdx+json` whose `subject` is
the image manifest, listed in `index.json` beside the image, as registries and `oras` expect.

The parsers and the document builder are plain functions over plain data; `layer_files` and
`attach` are the only parts that read or write files.
"""

from __future__ import annotations

import email.parser
import hashlib
import io
import json
import os
import re
import tarfile
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

SPDX_MEDIA_TYPE = "application/spdx+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_JSON = b"{}"
DPKG_STATUS = "var/lib/dpkg/status"
OS_RELEASE = ("usr/lib/os-release", "etc/os-release")  # the first is the file; the second links to it
DEBIAN_VERSION = "etc/debian_version"
_DIST_METADATA = re.compile(r"^(?:.*/)?(?:site|dist)-packages/[^/]+\.dist-info/METADATA$")
_SPDXID_UNSAFE = re.compile(r"[^A-Za-z0-9.-]+")
# Licence names found in METADATA's `License` field or its Trove classifiers, and the SPDX
# identifier each means. Anything else is kept verbatim as a LicenseRef with its text.
_LICENSE_NAMES = {
    "apache-2.0": "Apache-2.0",
    "apache 2.0": "Apache-2.0",
    "apache license 2.0": "Apache-2.0",
    "apache license, version 2.0": "Apache-2.0",
    "apache software license 2.0": "Apache-2.0",
    "mit": "MIT",
    "mit license": "MIT",
    "bsd-2-clause": "BSD-2-Clause",
    "bsd-3-clause": "BSD-3-Clause",
    "isc": "ISC",
    "isc license": "ISC",
    "mpl-2.0": "MPL-2.0",
    "psf-2.0": "PSF-2.0",
    "0bsd": "0BSD",
}
_CLASSIFIER_LICENSES = {
    "License :: OSI Approved :: Apache Software License": "Apache-2.0",
    "License :: OSI Approved :: MIT License": "MIT",
    "License :: OSI Approved :: ISC License (ISCL)": "ISC",
    "License :: OSI Approved :: Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
    "License :: OSI Approved :: Python Software Foundation License": "PSF-2.0",
}


class SbomError(ValueError):
    """The image's package data cannot be read as expected; the message names the file."""


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    arch: str
    source: str  # the source package's name (the binary's own when dpkg records none)
    source_version: str


@dataclass(frozen=True)
class PyDist:
    name: str
    version: str
    license: str  # an SPDX expression, a LicenseRef-... id, or NOASSERTION
    license_text: str = ""  # the METADATA text a LicenseRef stands for
    location: str = ""  # the dist-info directory, in the image


@dataclass(frozen=True)
class ImageRef:
    """What the document describes: the image's full name, its version, manifest digest and architecture."""

    name: str  # docker.io/gpushare/agent:0.1.0
    version: str
    manifest_digest: str
    arch: str


@dataclass
class Contents:
    debs: list[DebPackage] = field(default_factory=list)
    dists: list[PyDist] = field(default_factory=list)
    os_id: str = ""  # os-release ID, e.g. debian
    os_version: str = ""  # the point release, e.g. 12.8 (VERSION_ID, 12, without /etc/debian_version)
    os_version_id: str = ""  # os-release VERSION_ID, e.g. 12


def _stanzas(text: str) -> Iterable[dict[str, str]]:
    fields: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        if not line.strip():
            if fields:
                yield fields
            fields, last = {}, ""
        elif line[0] in " \t":
            if last:
                fields[last] += "\n" + line.strip()
        else:
            key, sep, value = line.partition(":")
            if not sep:
                raise SbomError(f"dpkg status: a line is neither a field nor its continuation: {line!r}")
            last = key.strip()
            fields[last] = value.strip()
    if fields:
        yield fields


def parse_dpkg_status(text: str) -> list[DebPackage]:
    """The installed packages of a dpkg status file, sorted by name and architecture.

    Packages whose status is not "installed" (removed with their config files left, half
    unpacked) are not in the image as software and are left out.
    """
    out = []
    for fields in _stanzas(text):
        name, version, arch = fields.get("Package"), fields.get("Version"), fields.get("Architecture")
        status = fields.get("Status", "").split()
        if not (name and version and arch):
            raise SbomError(f"dpkg status: a stanza lacks Package, Version or Architecture: {sorted(fields)}")
        if status[-1:] != ["installed"]:
            continue
        source, _, rest = fields.get("Source", name).partition(" ")
        source_version = rest.strip().strip("()") or version
        out.append(DebPackage(name, version, arch, source, source_version))
    return sorted(out, key=lambda p: (p.name, p.arch))


def parse_os_release(text: str) -> dict[str, str]:
    """KEY=value lines of os-release(5), quotes removed."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            out[key] = value.strip().strip("\"'")
    return out


def _license_of(name: str, headers: email.message.Message) -> tuple[str, str]:
    expression = (headers.get("License-Expression") or "").strip()
    if expression:
        return expression, ""
    free = (headers.get("License") or "").strip()
    if free.lower() in _LICENSE_NAMES:
        return _LICENSE_NAMES[free.lower()], ""
    classified = {
        _CLASSIFIER_LICENSES[c.strip()]
        for c in headers.get_all("Classifier") or []
        if c.strip() in _CLASSIFIER_LICENSES
    }
    if len(classified) == 1:
        return classified.pop(), ""
    if free and free.upper() not in ("UNKNOWN", "NONE"):
        return f"LicenseRef-pypi-{_id_part(name)}", free
    return "NOASSERTION", ""


def parse_dist_metadata(text: str, location: str = "") -> PyDist:
    """One distribution's METADATA (core metadata, RFC 822 headers): its name, version and licence."""
    headers = email.parser.HeaderParser().parsestr(text)
    name, version = (headers.get("Name") or "").strip(), (headers.get("Version") or "").strip()
    if not name or not version:
        raise SbomError(f"{location or 'METADATA'}: no Name or Version header")
    license_id, license_text = _license_of(name, headers)
    return PyDist(name, version, license_id, license_text, location)


def _id_part(text: str) -> str:
    return _SPDXID_UNSAFE.sub("-", text).strip("-") or "x"


def _pct(text: str, safe: str = "") -> str:
    return quote(text, safe=".-_~" + safe)


def deb_purl(pkg: DebPackage, distro: str) -> str:
    """`pkg:deb/debian/NAME@VERSION?arch=ARCH&distro=DISTRO[&upstream=SOURCE[@VERSION]]` (qualifiers sorted)."""
    qualifiers = {"arch": pkg.arch, "distro": distro}
    if pkg.source != pkg.name or pkg.source_version != pkg.version:
        qualifiers["upstream"] = (
            pkg.source if pkg.source_version == pkg.version else f"{pkg.source}@{pkg.source_version}"
        )
    query = "&".join(f"{k}={_pct(v)}" for k, v in sorted(qualifiers.items()) if v)
    return f"pkg:deb/debian/{_pct(pkg.name)}@{_pct(pkg.version)}?{query}"


def pypi_purl(dist: PyDist) -> str:
    """`pkg:pypi/NAME@VERSION`, the name lowercased with `_` as `-` (the purl spec's pypi rule)."""
    return f"pkg:pypi/{_pct(dist.name.lower().replace('_', '-'))}@{_pct(dist.version)}"


def oci_purl(image: ImageRef) -> str:
    repository, _, tag = image.name.rpartition(":")
    qualifiers = {"arch": image.arch, "repository_url": repository, "tag": tag}
    query = "&".join(f"{k}={_pct(v, '/')}" for k, v in sorted(qualifiers.items()))
    return f"pkg:oci/{_pct(repository.rsplit('/', 1)[-1].lower())}@{_pct(image.manifest_digest)}?{query}"


def _purl_ref(purl: str) -> list[dict[str, str]]:
    return [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": purl}]


def created_time(environ: dict[str, str] | os._Environ[str]) -> str:
    """When the document was made: $SOURCE_DATE_EPOCH (reproducible builds) when set, else now."""
    raw = environ.get("SOURCE_DATE_EPOCH", "").strip()
    when = datetime.fromtimestamp(int(raw), UTC) if raw.isdecimal() else datetime.now(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def spdx_document(image: ImageRef, contents: Contents, created: str, tool: str) -> dict[str, object]:
    """The SPDX 2.3 document: the image CONTAINS the Debian release, which CONTAINS its packages,
    and the image CONTAINS each Python distribution.

    Element IDs follow trivy's convention (`SPDXRef-OperatingSystem-*`, `SPDXRef-Package-*`): its
    SBOM reader types a component by that prefix, and scans the packages under the operating
    system as Debian's.
    """
    image_id = "SPDXRef-ContainerImage"
    os_id = f"SPDXRef-OperatingSystem-{_id_part(contents.os_id or 'unknown')}"
    packages: list[dict[str, object]] = [
        {
            "SPDXID": image_id,
            "name": image.name.rpartition(":")[0],
            "versionInfo": image.version,
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": False,
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "primaryPackagePurpose": "CONTAINER",
            "externalRefs": _purl_ref(oci_purl(image)),
        },
        {
            "SPDXID": os_id,
            "name": contents.os_id or "unknown",
            "versionInfo": contents.os_version or contents.os_version_id or "NOASSERTION",
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": False,
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "primaryPackagePurpose": "OPERATING-SYSTEM",
        },
    ]
    relationships = [
        {"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES", "relatedSpdxElement": image_id},
        {"spdxElementId": image_id, "relationshipType": "CONTAINS", "relatedSpdxElement": os_id},
    ]
    used: set[str] = {image_id, os_id}

    def unique(base: str) -> str:
        candidate, n = base, 1
        while candidate in used:
            n += 1
            candidate = f"{base}-{n}"
        used.add(candidate)
        return candidate

    distro = f"{contents.os_id}-{contents.os_version_id}" if contents.os_id else ""
    for deb in contents.debs:
        spdx_id = unique(f"SPDXRef-Package-deb-{_id_part(deb.name)}-{_id_part(deb.arch)}")
        packages.append(
            {
                "SPDXID": spdx_id,
                "name": deb.name,
                "versionInfo": deb.version,
                "supplier": "Organization: Debian",
                "downloadLocation": "NOASSERTION",
                "filesAnalyzed": False,
                "sourceInfo": f"built package from: {deb.source} {deb.source_version}",
                "licenseConcluded": "NOASSERTION",
                "licenseDeclared": "NOASSERTION",
                "primaryPackagePurpose": "LIBRARY",
                "externalRefs": _purl_ref(deb_purl(deb, distro)),
            }
        )
        relationships.append({"spdxElementId": os_id, "relationshipType": "CONTAINS", "relatedSpdxElement": spdx_id})
    extracted: dict[str, str] = {}
    for dist in contents.dists:
        spdx_id = unique(f"SPDXRef-Package-pypi-{_id_part(dist.name)}")
        if dist.license_text:
            extracted[dist.license] = dist.license_text
        entry: dict[str, object] = {
            "SPDXID": spdx_id,
            "name": dist.name,
            "versionInfo": dist.version,
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": False,
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": dist.license,
            "primaryPackagePurpose": "LIBRARY",
            "externalRefs": _purl_ref(pypi_purl(dist)),
        }
        if dist.location:
            entry["sourceInfo"] = f"package found in: {dist.location}"
        packages.append(entry)
        relationships.append({"spdxElementId": image_id, "relationshipType": "CONTAINS", "relatedSpdxElement": spdx_id})
    seed = f"{image.name}@{image.manifest_digest}@{created}"
    document: dict[str, object] = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": image.name,
        "documentNamespace": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, seed)}",
        "creationInfo": {"created": created, "creators": [f"Tool: {tool}"]},
        "packages": packages,
        "relationships": relationships,
    }
    if extracted:
        document["hasExtractedLicensingInfos"] = [
            {"licenseId": k, "name": k.removeprefix("LicenseRef-"), "extractedText": v}
            for k, v in sorted(extracted.items())
        ]
    return document


def wanted(name: str) -> bool:
    """The files of an image that say what it holds."""
    return name in (DPKG_STATUS, DEBIAN_VERSION, *OS_RELEASE) or bool(_DIST_METADATA.match(name))


def contents_of(files: dict[str, bytes]) -> Contents:
    """What `files` (path in the image -> bytes, as `layer_files` returns) say the image holds."""
    out = Contents()
    status = files.get(DPKG_STATUS)
    if status is None:
        raise SbomError(f"the image has no /{DPKG_STATUS}: its Debian packages cannot be listed")
    out.debs = parse_dpkg_status(status.decode("utf-8", "replace"))
    release = next((files[p] for p in OS_RELEASE if p in files), b"")
    fields = parse_os_release(release.decode("utf-8", "replace"))
    out.os_id, out.os_version_id = fields.get("ID", ""), fields.get("VERSION_ID", "")
    point = files.get(DEBIAN_VERSION, b"").decode("utf-8", "replace").strip()
    out.os_version = point if point[:1].isdigit() else out.os_version_id
    dists = []
    for path in sorted(p for p in files if _DIST_METADATA.match(p)):
        dists.append(parse_dist_metadata(files[path].decode("utf-8", "replace"), "/" + path.rsplit("/", 1)[0]))
    out.dists = sorted(dists, key=lambda d: (d.name.lower(), d.version, d.location))
    return out


def layer_files(layers: Iterable[Path], keep: Callable[[str], bool] = wanted) -> dict[str, bytes]:
    """The regular files `keep` picks from gzip layer tarballs applied in order: a later layer's
    file replaces an earlier one, and a whiteout (`.wh.NAME`) removes what it names."""
    found: dict[str, bytes] = {}
    for layer in layers:
        with tarfile.open(layer, "r:gz") as tar:
            for info in tar:
                name = info.name.removeprefix("./").lstrip("/")
                head, _, base = name.rpartition("/")
                if base.startswith(".wh."):
                    gone = f"{head}/{base[4:]}".lstrip("/")
                    for path in [p for p in found if p == gone or p.startswith(gone + "/")]:
                        del found[path]
                    continue
                if info.isreg() and keep(name):
                    handle = tar.extractfile(info)
                    if handle is not None:
                        found[name] = handle.read()
    return found


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def referrer_manifest(sbom: bytes, subject: dict[str, object], created: str) -> bytes:
    """The OCI artifact manifest that carries `sbom` and refers to the image manifest `subject`
    (its descriptor): the empty config, one layer, `artifactType` as the layer's media type."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "artifactType": SPDX_MEDIA_TYPE,
        "config": {"mediaType": MEDIA_EMPTY, "digest": _digest(EMPTY_JSON), "size": len(EMPTY_JSON)},
        "layers": [
            {
                "mediaType": SPDX_MEDIA_TYPE,
                "digest": _digest(sbom),
                "size": len(sbom),
                "annotations": {"org.opencontainers.image.title": "sbom.spdx.json"},
            }
        ],
        "subject": {k: subject[k] for k in ("mediaType", "digest", "size")},
        "annotations": {"org.opencontainers.image.created": created},
    }
    return _json(manifest)


def with_referrer(index: dict[str, object], manifest: bytes) -> dict[str, object]:
    """`index` (an image layout's index.json) with the artifact manifest listed, once, after the
    images; earlier SBOM referrers are dropped, so a rebuilt archive lists only its own."""
    kept = [
        m
        for m in index.get("manifests", [])  # type: ignore[attr-defined]
        if not (isinstance(m, dict) and m.get("artifactType") == SPDX_MEDIA_TYPE)
    ]
    entry = {
        "mediaType": MEDIA_MANIFEST,
        "digest": _digest(manifest),
        "size": len(manifest),
        "artifactType": SPDX_MEDIA_TYPE,
    }
    return {**index, "manifests": [*kept, entry]}


def image_descriptor(index: dict[str, object]) -> dict[str, object]:
    """The one image manifest an archive's index.json names (not counting referrers)."""
    images = [
        m
        for m in index.get("manifests", [])  # type: ignore[attr-defined]
        if isinstance(m, dict) and m.get("mediaType") == MEDIA_MANIFEST and "artifactType" not in m
    ]
    if len(images) != 1:
        raise SbomError(f"index.json lists {len(images)} images; an SBOM can only be attached to exactly one")
    return dict(images[0])


def _member(name: str, size: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, mtime
    return info


def attach(archive: Path, sbom: bytes, created: str, mtime: int) -> str:
    """Rewrite the OCI archive with `sbom` as a referrer of its image (atomically); returns the
    artifact manifest's digest. Every other member is copied as it was."""
    tmp = archive.with_name(f"{archive.name}.{os.getpid()}.sbom.tmp")
    with tarfile.open(archive, "r:") as src:
        index_member = src.getmember("index.json")
        raw_index = src.extractfile(index_member)
        if raw_index is None:
            raise SbomError(f"{archive}: index.json is not a file")
        index = json.loads(raw_index.read())
        subject = image_descriptor(index)
        manifest = referrer_manifest(sbom, subject, created)
        new_index = _json(with_referrer(index, manifest))
        blobs = {_digest(b): b for b in (sbom, EMPTY_JSON, manifest)}
        try:
            _copy_with(src, tmp, blobs, new_index, mtime)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    tmp.replace(archive)
    return _digest(manifest)


def _copy_with(src: tarfile.TarFile, tmp: Path, blobs: dict[str, bytes], index: bytes, mtime: int) -> None:
    """`src`'s members but index.json into `tmp`, then the blobs it lacks and the new index."""
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as out:
        for info in src:
            if info.name == "index.json":
                continue
            if info.name.startswith("blobs/sha256/"):
                blobs.pop("sha256:" + info.name.rsplit("/", 1)[1], None)  # already there: kept as is
            out.addfile(info, src.extractfile(info) if info.isreg() else None)
        for digest, data in sorted(blobs.items()):
            out.addfile(_member(f"blobs/sha256/{digest.split(':', 1)[1]}", len(data), mtime), io.BytesIO(data))
        out.addfile(_member("index.json", len(index), mtime), io.BytesIO(index))


def read_archive_json(archive: Path, name: str) -> object:
    """A JSON member of an OCI archive (index.json, or blobs/sha256/HEX)."""
    with tarfile.open(archive, "r:") as tar:
        handle = tar.extractfile(name)
        if handle is None:
            raise SbomError(f"{archive}: {name} is not a file")
        return json.loads(handle.read())
