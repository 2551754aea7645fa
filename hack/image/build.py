"""Build the gpushare images as OCI archives, and import them into a running containerd.

    python hack/image/build.py agent [--containerd-socket SOCK]   # `make image`
    python hack/image/build.py kmod  [--containerd-socket SOCK]   # `make image-kmod`
    python hack/image/build.py agent --arch arm64                  # `make image-arm64`

Three gzip layers (layers.py: Debian base, Python dependencies, gpushare), each cached under
`$GPUSHARE_CACHE/image/layers` by a hash of its inputs. A rebuild with unchanged inputs reuses
the archive and takes about a second. The base layer is keyed on its package list, not on the
Debian archive: `--rebuild` fetches security updates.

Every archive written is checked to be of its architecture (arch.py: the config, the index and
every ELF file of every layer). Each archive comes with its SBOM (sbom.py: SPDX 2.3 JSON of every
Debian package and Python distribution in the image), written next to it and attached inside it
as an OCI referrer.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import sbom
from arch import ARCHES, Arch, archive_problems
from layers import FLAVOURS, HERE, MIB, Builder, BuildError, Flavour, cache_root, hash_parts, project_version, run

from localcluster import oci  # the layers module put the repository root on the path


@dataclass(frozen=True)
class Result:
    name: str
    archive: Path
    layers: list[tuple[str, oci.Layer]]
    reused: bool
    sbom: Path
    debs: int
    dists: int

    @property
    def uncompressed(self) -> int:
        return sum(layer.uncompressed for _, layer in self.layers)


def build(flavour: Flavour, repository: str, cache: Path, rebuild: bool, arch: Arch = ARCHES["amd64"]) -> Result:
    version = project_version()
    name = f"{_qualified(repository)}:{version}"
    builder = Builder(flavour, cache, rebuild, arch)
    layers = [("base", builder.base()), ("deps", builder.deps()), ("gpushare", builder.app())]
    config = oci.ImageConfig(
        entrypoint=["gpushare"],
        cmd=["--help"],
        env=[
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG=C.UTF-8",
            "PYTHONDONTWRITEBYTECODE=1",  # the byte code was left out on purpose; keep the rootfs clean
        ],
        labels={
            "org.opencontainers.image.title": repository.rsplit("/", 1)[-1],
            "org.opencontainers.image.description": flavour.description,
            "org.opencontainers.image.version": version,
            "org.opencontainers.image.licenses": "Apache-2.0",
        },
        architecture=arch.name,
    )
    history = [f"{kind} layer {layer.diff_id}" for kind, layer in layers]
    suffix = "" if arch.native else f"-{arch.name}"
    archive = builder.cache / f"{repository.replace('/', '-')}-{version}{suffix}.oci.tar"
    sbom_path = sbom_path_of(archive)
    key_file = archive.with_name(archive.name + ".key")
    document = json.dumps(config.document([x for _, x in layers], history), sort_keys=True)
    key = hash_parts(name, document, (HERE / "sbom.py").read_bytes())
    reused = archive.is_file() and sbom_path.is_file() and key_file.is_file() and key_file.read_text().strip() == key
    if not reused:
        key_file.unlink(missing_ok=True)  # a build that stops half way is never taken for a whole one
        digest = oci.write_archive(archive, name, [x for _, x in layers], config, history)
        problems, _ = archive_problems(archive, arch)
        if problems:
            shown = "\n  ".join(problems[:20])
            raise BuildError(f"{archive} is not a clean {arch.name} image ({len(problems)} problems):\n  {shown}")
        _write_sbom(archive, sbom_path, sbom.ImageRef(name, version, digest, arch.name), [x for _, x in layers])
        key_file.write_text(key + "\n")
    doc = json.loads(sbom_path.read_text())
    purls = [ref["referenceLocator"] for p in doc["packages"] for ref in p.get("externalRefs", [])]
    debs = sum(p.startswith("pkg:deb/") for p in purls)
    dists = sum(p.startswith("pkg:pypi/") for p in purls)
    return Result(name, archive, layers, reused, sbom_path, debs, dists)


def sbom_path_of(archive: Path) -> Path:
    """`gpushare-agent-0.1.0.oci.tar` -> `gpushare-agent-0.1.0.spdx.json`, beside it."""
    return archive.with_name(archive.name.removesuffix(".oci.tar") + ".spdx.json")


def _write_sbom(archive: Path, path: Path, image: sbom.ImageRef, layers: list[oci.Layer]) -> None:
    """The image's SBOM from its layers as built: beside the archive, and attached inside it."""
    try:
        contents = sbom.contents_of(sbom.layer_files(layer.path for layer in layers))
    except sbom.SbomError as exc:
        raise BuildError(f"SBOM of {image.name}: {exc}") from exc
    created = sbom.created_time(os.environ)
    document = sbom.spdx_document(image, contents, created, f"gpushare-image-build-{image.version}")
    raw = (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(raw)
    tmp.replace(path)
    sbom.attach(archive, raw, created, oci.EPOCH)


def _qualified(repository: str) -> str:
    """`gpushare/agent` -> `docker.io/gpushare/agent`: the name the CRI looks the image up by."""
    first = repository.split("/", 1)[0]
    if "/" in repository and ("." in first or ":" in first or first == "localhost"):
        return repository
    return f"docker.io/{repository if '/' in repository else 'library/' + repository}"


def find_ctr(explicit: str | None, cache: Path) -> str:
    candidates = [
        explicit,
        shutil.which("ctr"),
        cache / "containerd/2.x/bin/ctr",
        cache / "containerd/1.7.24/usr/bin/ctr",
    ]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return str(c)
    raise BuildError("no ctr binary: pass --ctr, put ctr on PATH, or `make containerd-deps`")


def _listening(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2.0)
        try:
            sock.connect(path)
        except OSError:
            return False
    return True


def import_image(archive: Path, address: str, ctr: str) -> float:
    started = time.monotonic()
    cmd = [ctr, "--address", address, "-n", "k8s.io", "images", "import", str(archive)]
    run(cmd, f"ctr images import into {address}")
    return time.monotonic() - started


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("flavour", choices=sorted(FLAVOURS), help="agent: the DaemonSet's agent; kmod: its init container")
    p.add_argument("--repository", help="image repository (default gpushare/agent or gpushare/agent-kmod)")
    p.add_argument(
        "--containerd-socket",
        action="append",
        help="import the image into the containerd at this socket; repeatable (default $CONTAINERD_ADDRESS)",
    )
    p.add_argument(
        "--only-if-running", action="store_true", help="skip a socket no containerd answers on instead of failing"
    )
    p.add_argument("--ctr", default=os.environ.get("CTR"), help="ctr binary (default: PATH, then the cache's)")
    p.add_argument("--rebuild", action="store_true", help="ignore cached layers (fetches Debian security updates)")
    p.add_argument("--max-mib", type=float, default=0.0, help="fail when the unpacked image is larger (0: no limit)")
    p.add_argument(
        "--arch",
        choices=sorted(ARCHES),
        default="amd64",
        help="CPU architecture; arm64 is emulated (`make image-deps-arm64`) and written as <name>-arm64.oci.tar",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    started = time.monotonic()
    flavour = FLAVOURS[args.flavour]
    cache = cache_root()
    if sys.version_info[:2] != (3, 11):
        print(f"image: needs Python 3.11 (Debian bookworm's) to pick wheels; this is {sys.version.split()[0]}")
        return 1
    (cache / "image").mkdir(parents=True, exist_ok=True)
    # One build at a time per cache: `make image` and `make image-kmod` share layers and a build dir.
    lock = (cache / "image" / ".lock").open("w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        arch = ARCHES[args.arch]
        sockets = args.containerd_socket or []
        if sockets and not arch.native:
            raise BuildError(
                f"an {arch.name} image does not run on this machine's containerd: import it on an {arch.name} node"
            )
        result = build(flavour, args.repository or flavour.repository, cache, args.rebuild, arch)
        took = time.monotonic() - started
        _report(result, took)
        if args.max_mib and result.uncompressed > args.max_mib * MIB:
            print(f"image: {result.uncompressed / MIB:.1f} MiB is over the {args.max_mib:.0f} MiB budget")
            return 1
        env_socket = os.environ.get("CONTAINERD_ADDRESS")
        for sock in sockets or ([env_socket] if env_socket and arch.native else []):
            if not _listening(sock):
                if args.only_if_running:
                    print(f"imported:   nothing: no containerd answers at {sock}")
                    continue
                raise BuildError(f"no containerd answers at {sock} (is the cluster up?)")
            spent = import_image(result.archive, sock, find_ctr(args.ctr, cache))
            print(f"imported:   {result.name} into {sock} (namespace k8s.io) in {spent:.1f} s")
    except BuildError as exc:
        print(f"image: {exc}", file=sys.stderr)
        return 1
    finally:
        lock.close()
    return 0


def _report(result: Result, took: float) -> None:
    parts = ", ".join(f"{kind} {layer.uncompressed / MIB:.1f}" for kind, layer in result.layers)
    print(f"image:      {result.name}")
    print(f"archive:    {result.archive} ({result.archive.stat().st_size / MIB:.1f} MiB)")
    print(f"size:       {result.uncompressed / MIB:.1f} MiB uncompressed (layers in MiB: {parts})")
    print(f"sbom:       {result.sbom} ({result.debs} Debian packages, {result.dists} Python distributions)")
    print(f"build time: {took:.1f} s{' (unchanged: archive reused)' if result.reused else ''}")


if __name__ == "__main__":
    sys.exit(main())
