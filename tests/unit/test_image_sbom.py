"""The images' SBOM (hack/image/sbom.py): what dpkg's status and the dist-infos say becomes an SPDX
2.3 document trivy and grype can read, and the document is attached to the OCI archive as a referrer
of the image manifest."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import re
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

from localcluster import oci

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "image"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_sbom", REPO / "hack" / "image" / "sbom.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("image_sbom", module)
    spec.loader.exec_module(module)
    return module


sbom = _load()
IMAGE = sbom.ImageRef("docker.io/gpushare/agent:0.1.0", "0.1.0", "sha256:" + "ab" * 32, "amd64")


def _fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def _contents() -> object:
    return sbom.Contents(
        debs=sbom.parse_dpkg_status(_fixture("dpkg-status")),
        dists=[
            sbom.parse_dist_metadata(_fixture(f"METADATA-{n}"), f"/site/{n}.dist-info")
            for n in ("gpushare", "grpcio", "freetext")
        ],
        os_id="debian",
        os_version="12.8",
        os_version_id="12",
    )


def test_dpkg_status_gives_the_installed_packages_with_their_sources() -> None:
    debs = {p.name: p for p in sbom.parse_dpkg_status(_fixture("dpkg-status"))}
    assert sorted(debs) == ["base-files", "passwd", "python3", "tzdata"]  # libfoo1 left only its conffiles
    assert debs["python3"] == sbom.DebPackage("python3", "3.11.2-1+b1", "amd64", "python3-defaults", "3.11.2-1")
    assert debs["passwd"] == sbom.DebPackage("passwd", "1:4.13+dfsg1-1+b1", "amd64", "shadow", "1:4.13+dfsg1-1+b1")
    assert debs["base-files"].source == "base-files" and debs["tzdata"].arch == "all"


def test_a_dpkg_status_that_is_not_one_is_refused_naming_the_line() -> None:
    with pytest.raises(sbom.SbomError, match="neither a field nor its continuation: 'garbage'"):
        sbom.parse_dpkg_status("Package: a\ngarbage\n")
    with pytest.raises(sbom.SbomError, match="lacks Package, Version or Architecture"):
        sbom.parse_dpkg_status("Package: a\nStatus: install ok installed\n")


def test_deb_purls_encode_epochs_and_name_a_different_source() -> None:
    debs = {p.name: p for p in sbom.parse_dpkg_status(_fixture("dpkg-status"))}
    assert sbom.deb_purl(debs["base-files"], "debian-12") == (
        "pkg:deb/debian/base-files@12.4%2Bdeb12u8?arch=amd64&distro=debian-12"
    )
    assert sbom.deb_purl(debs["passwd"], "debian-12") == (
        "pkg:deb/debian/passwd@1%3A4.13%2Bdfsg1-1%2Bb1?arch=amd64&distro=debian-12&upstream=shadow"
    )
    assert sbom.deb_purl(debs["python3"], "debian-12") == (
        "pkg:deb/debian/python3@3.11.2-1%2Bb1?arch=amd64&distro=debian-12&upstream=python3-defaults%403.11.2-1"
    )


@pytest.mark.parametrize(
    ("fixture", "name", "version", "license_id", "text"),
    [
        ("gpushare", "gpushare", "0.1.0", "Apache-2.0", ""),  # License-Expression (metadata 2.4)
        ("grpcio", "grpcio", "1.85.4", "Apache-2.0", ""),  # a License name we know
        ("classified", "typing_extensions", "4.16.0", "PSF-2.0", ""),  # the Trove classifier only
        ("freetext", "protobuf", "7.36.2", "LicenseRef-pypi-protobuf", "3-Clause BSD License"),
        ("unknown", "Some.Pkg_Name", "1.0+local.1", "NOASSERTION", ""),
    ],
)
def test_dist_metadata_gives_name_version_and_licence(
    fixture: str, name: str, version: str, license_id: str, text: str
) -> None:
    dist = sbom.parse_dist_metadata(_fixture(f"METADATA-{fixture}"), "/x.dist-info")
    assert (dist.name, dist.version, dist.license, dist.license_text) == (name, version, license_id, text)


def test_metadata_without_a_version_is_refused_naming_where_it_is() -> None:
    with pytest.raises(sbom.SbomError, match=r"/usr/x\.dist-info: no Name or Version"):
        sbom.parse_dist_metadata("Metadata-Version: 2.1\nName: x\n", "/usr/x.dist-info")


def test_pypi_purls_follow_the_purl_rules() -> None:
    dist = sbom.parse_dist_metadata(_fixture("METADATA-unknown"))
    assert sbom.pypi_purl(dist) == "pkg:pypi/some.pkg-name@1.0%2Blocal.1"
    grpcio = sbom.parse_dist_metadata(_fixture("METADATA-grpcio"))
    assert sbom.pypi_purl(grpcio) == "pkg:pypi/grpcio@1.85.4"


def test_the_document_is_spdx_2_3_with_every_package_under_the_image() -> None:
    doc = sbom.spdx_document(IMAGE, _contents(), "2026-01-02T03:04:05Z", "gpushare-image-build-0.1.0")
    assert (doc["spdxVersion"], doc["dataLicense"], doc["SPDXID"]) == ("SPDX-2.3", "CC0-1.0", "SPDXRef-DOCUMENT")
    assert doc["creationInfo"] == {"created": "2026-01-02T03:04:05Z", "creators": ["Tool: gpushare-image-build-0.1.0"]}
    assert doc["documentNamespace"].startswith("urn:uuid:")
    packages = {p["SPDXID"]: p for p in doc["packages"]}
    assert len(packages) == len(doc["packages"]), "SPDX IDs must be unique"
    for spdx_id, pkg in packages.items():
        assert re.fullmatch(r"SPDXRef-[A-Za-z0-9.-]+", spdx_id), spdx_id
        assert {"name", "versionInfo", "downloadLocation", "licenseConcluded", "licenseDeclared"} <= set(pkg), pkg
    edges = {(r["spdxElementId"], r["relationshipType"], r["relatedSpdxElement"]) for r in doc["relationships"]}
    for a, _, b in edges:
        assert a in packages or a == "SPDXRef-DOCUMENT", a
        assert b in packages, b
    assert ("SPDXRef-DOCUMENT", "DESCRIBES", "SPDXRef-ContainerImage") in edges
    image = packages["SPDXRef-ContainerImage"]
    assert (image["name"], image["versionInfo"], image["primaryPackagePurpose"]) == (
        "docker.io/gpushare/agent",
        "0.1.0",
        "CONTAINER",
    )
    assert image["externalRefs"][0]["referenceLocator"] == (
        f"pkg:oci/agent@sha256%3A{'ab' * 32}?arch=amd64&repository_url=docker.io/gpushare/agent&tag=0.1.0"
    )
    # trivy types a component by its ID's prefix, and scans what the operating system contains as its packages.
    os_pkg = packages["SPDXRef-OperatingSystem-debian"]
    assert (os_pkg["name"], os_pkg["versionInfo"], os_pkg["primaryPackagePurpose"]) == (
        "debian",
        "12.8",
        "OPERATING-SYSTEM",
    )
    python3 = packages["SPDXRef-Package-deb-python3-amd64"]
    assert python3["versionInfo"] == "3.11.2-1+b1"
    assert python3["sourceInfo"] == "built package from: python3-defaults 3.11.2-1"
    assert ("SPDXRef-OperatingSystem-debian", "CONTAINS", "SPDXRef-Package-deb-python3-amd64") in edges
    debs = [p for p in packages.values() if p["SPDXID"].startswith("SPDXRef-Package-deb-")]
    assert len(debs) == 4 and all(
        p["externalRefs"][0]["referenceLocator"].startswith(f"pkg:deb/debian/{p['name']}@") for p in debs
    )
    gpushare = packages["SPDXRef-Package-pypi-gpushare"]
    assert (gpushare["versionInfo"], gpushare["licenseDeclared"]) == ("0.1.0", "Apache-2.0")
    assert gpushare["externalRefs"][0]["referenceLocator"] == "pkg:pypi/gpushare@0.1.0"
    assert ("SPDXRef-ContainerImage", "CONTAINS", "SPDXRef-Package-pypi-gpushare") in edges
    # A licence written out in METADATA is kept, word for word, as the LicenseRef's text.
    assert doc["hasExtractedLicensingInfos"] == [
        {"licenseId": "LicenseRef-pypi-protobuf", "name": "pypi-protobuf", "extractedText": "3-Clause BSD License"}
    ]


def test_equal_ids_after_cleaning_are_made_unique() -> None:
    contents = sbom.Contents(
        dists=[sbom.PyDist("a_b", "1", "MIT"), sbom.PyDist("a+b", "2", "MIT")], os_id="debian", os_version_id="12"
    )
    ids = [p["SPDXID"] for p in sbom.spdx_document(IMAGE, contents, "t", "x")["packages"]]
    assert len(ids) == len(set(ids)) and "SPDXRef-Package-pypi-a-b-2" in ids


def _layer(path: Path, files: dict[str, bytes]) -> oci.Layer:
    def fill(w: oci.LayerWriter) -> None:
        for name, data in files.items():
            w.add_bytes(name, data)

    return oci.write_layer(path, fill)


def test_the_contents_are_read_from_the_layers_as_applied(tmp_path: Path) -> None:
    site = "usr/local/lib/python3.11/dist-packages"
    base = _layer(
        tmp_path / "base.tar.gz",
        {
            "var/lib/dpkg/status": _fixture("dpkg-status").encode(),
            "usr/lib/os-release": b'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n',
            "etc/debian_version": b"12.8\n",
            "usr/share/doc/python3/copyright": b"not wanted",
        },
    )
    deps = _layer(
        tmp_path / "deps.tar.gz",
        {
            f"{site}/grpcio-1.85.4.dist-info/METADATA": _fixture("METADATA-grpcio").encode(),
            f"{site}/protobuf-7.36.2.dist-info/METADATA": _fixture("METADATA-freetext").encode(),
            f"{site}/grpc/__init__.py": b"",
        },
    )
    app = _layer(
        tmp_path / "app.tar.gz",
        {
            f"{site}/gpushare-0.1.0.dist-info/METADATA": _fixture("METADATA-gpushare").encode(),
            f"{site}/.wh.protobuf-7.36.2.dist-info": b"",  # a later layer removed protobuf
        },
    )
    files = sbom.layer_files([base.path, deps.path, app.path])
    assert "usr/share/doc/python3/copyright" not in files and f"{site}/grpc/__init__.py" not in files
    contents = sbom.contents_of(files)
    assert [d.name for d in contents.dists] == ["gpushare", "grpcio"]
    assert contents.dists[0].location == f"/{site}/gpushare-0.1.0.dist-info"
    assert (contents.os_id, contents.os_version, contents.os_version_id) == ("debian", "12.8", "12")
    assert [p.name for p in contents.debs] == ["base-files", "passwd", "python3", "tzdata"]


def test_an_image_without_a_dpkg_status_is_refused_naming_the_file() -> None:
    with pytest.raises(sbom.SbomError, match="no /var/lib/dpkg/status"):
        sbom.contents_of({})


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    handle = tar.extractfile(name)
    assert handle is not None
    return handle.read()


def test_the_sbom_is_attached_as_a_referrer_of_the_image_manifest(tmp_path: Path) -> None:
    layer = _layer(tmp_path / "l.tar.gz", {"etc/hostname": b"x\n"})
    archive = tmp_path / "image.oci.tar"
    config = oci.ImageConfig(entrypoint=["true"])
    digest = oci.write_archive(archive, "docker.io/gpushare/agent:0.1.0", [layer], config, ["l"])
    with tarfile.open(archive) as tar:
        before = {m.name: _member(tar, m.name) for m in tar if m.isreg() and m.name != "index.json"}
    document = b'{"spdxVersion": "SPDX-2.3"}\n'
    for _ in range(2):  # attaching again replaces the referrer rather than adding a second
        referrer = sbom.attach(archive, document, "2026-01-02T03:04:05Z", oci.EPOCH)
    with tarfile.open(archive) as tar:
        index = json.loads(_member(tar, "index.json"))
        image, artifact = index["manifests"]
        assert image["digest"] == digest and image["annotations"]["io.containerd.image.name"].endswith(":0.1.0")
        assert artifact == {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": referrer,
            "size": len(_member(tar, f"blobs/sha256/{referrer[7:]}")),
            "artifactType": "application/spdx+json",
        }
        manifest = json.loads(_member(tar, f"blobs/sha256/{referrer[7:]}"))
        assert manifest["artifactType"] == "application/spdx+json"
        assert manifest["subject"] == {k: image[k] for k in ("mediaType", "digest", "size")}
        # The empty config of an artifact (image-spec: "Guidance for an Empty Descriptor").
        assert manifest["config"] == {
            "mediaType": "application/vnd.oci.empty.v1+json",
            "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
            "size": 2,
        }
        assert _member(tar, f"blobs/sha256/{manifest['config']['digest'][7:]}") == b"{}"
        (blob,) = manifest["layers"]
        assert blob["mediaType"] == "application/spdx+json"
        assert _member(tar, f"blobs/sha256/{blob['digest'][7:]}") == document
        assert blob["digest"] == "sha256:" + hashlib.sha256(document).hexdigest()
        # Everything the image was is still there, byte for byte.
        assert {name: _member(tar, name) for name in before} == before


def test_an_archive_with_no_single_image_gets_no_sbom(tmp_path: Path) -> None:
    archive = tmp_path / "empty.oci.tar"
    with tarfile.open(archive, "w") as tar:
        raw = json.dumps({"schemaVersion": 2, "manifests": []}).encode()
        info = tarfile.TarInfo("index.json")
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
    with pytest.raises(sbom.SbomError, match="lists 0 images"):
        sbom.attach(archive, b"{}", "t", 0)
    with tarfile.open(archive) as tar:
        assert tar.getnames() == ["index.json"]


def test_created_honours_source_date_epoch() -> None:
    assert sbom.created_time({"SOURCE_DATE_EPOCH": "946684800"}) == "2000-01-01T00:00:00Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", sbom.created_time({}))
