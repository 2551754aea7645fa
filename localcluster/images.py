"""Container images for the containerd tier and the cluster, built locally from busybox-static (no registry).

An OCI image-layout tarball holding one uncompressed layer (busybox and its applet links) is what
`ctr -n k8s.io image import` takes (docs/testing-containerd.md). Two images share that layer:

- `BUSYBOX_IMAGE`: test containers run their own command in it;
- `PAUSE_IMAGE`: the CRI sandbox image, a shell loop that sleeps and exits on TERM.

Tarballs are cached under `$GPUSHARE_CACHE/images` (`busybox-v<N>.tar`, `pause-v<N>.tar`) and
rebuilt when missing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from localcluster.paths import cache_dir

BUSYBOX_IMAGE = "gpushare.local/busybox:test"
PAUSE_IMAGE = "gpushare.local/pause:test"
BUSYBOX_BIN = Path("/bin/busybox")
_PAUSE_SCRIPT = "trap 'exit 0' TERM INT; while true; do sleep 3600 & wait $!; done"
_MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
_MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
# Bumped whenever the image contents change, so cached tarballs of an older layout are not reused.
_LAYOUT_VERSION = 1


class ImageBuildError(RuntimeError):
    """busybox-static is missing or unusable (run `hack/containerd/install.sh base`)."""


@dataclass(frozen=True)
class ImageTar:
    name: str
    path: Path


def _applets(busybox: Path) -> list[str]:
    try:
        out = subprocess.run([str(busybox), "--list"], check=True, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ImageBuildError(
            f"cannot run {busybox} --list ({exc}); install busybox-static: hack/containerd/install.sh base"
        ) from exc
    return sorted({a for a in out.stdout.split() if a and "/" not in a and a != "busybox"})


def _layer_bytes(busybox: Path) -> bytes:
    """A deterministic tar: fixed mtimes and owners, so the layer digest is stable across builds."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add_dir(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)

        for d in ("bin", "dev", "etc", "proc", "sys", "run", "var"):
            add_dir(d)
        add_dir("tmp", 0o1777)
        data = busybox.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
        for applet in _applets(busybox):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        for name, text in (("etc/passwd", "root:x:0:0:root:/:/bin/sh\n"), ("etc/group", "root:x:0:\n")):
            raw = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(raw), 0o644
            tar.addfile(info, io.BytesIO(raw))
    return buf.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest.split(':', 1)[1]}")
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))
    return digest


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write_image_tar(dest: Path, name: str, layer: bytes, entrypoint: list[str], cmd: list[str]) -> None:
    """Write an OCI image layout (one layer) as a tarball at `dest`, named `name` for ctr import."""
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Entrypoint": entrypoint or None, "Cmd": cmd or None},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
    }
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")  # concurrent builders never share a file
    with tarfile.open(tmp, "w") as tar:
        config_raw = _json(config)
        manifest = {
            "schemaVersion": 2,
            "mediaType": _MEDIA_MANIFEST,
            "config": {"mediaType": _MEDIA_CONFIG, "digest": _blob(tar, config_raw), "size": len(config_raw)},
            "layers": [{"mediaType": _MEDIA_LAYER, "digest": _blob(tar, layer), "size": len(layer)}],
        }
        manifest_raw = _json(manifest)
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": _MEDIA_MANIFEST,
                    "digest": _blob(tar, manifest_raw),
                    "size": len(manifest_raw),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                    },
                }
            ],
        }
        for fname, raw in (("oci-layout", _json({"imageLayoutVersion": "1.0.0"})), ("index.json", _json(index))):
            info = tarfile.TarInfo(fname)
            info.size, info.mode = len(raw), 0o644
            tar.addfile(info, io.BytesIO(raw))
    tmp.replace(dest)


def ensure_images(busybox: Path = BUSYBOX_BIN, directory: Path | None = None) -> list[ImageTar]:
    """Build (once) and return the busybox and pause image tarballs."""
    directory = directory or cache_dir() / "images"
    if not busybox.is_file():
        raise ImageBuildError(f"{busybox} is missing; install busybox-static: hack/containerd/install.sh base")
    directory.mkdir(parents=True, exist_ok=True)
    wanted = [
        ImageTar(BUSYBOX_IMAGE, directory / f"busybox-v{_LAYOUT_VERSION}.tar"),
        ImageTar(PAUSE_IMAGE, directory / f"pause-v{_LAYOUT_VERSION}.tar"),
    ]
    if all(img.path.is_file() for img in wanted):
        return wanted
    layer = _layer_bytes(busybox)
    write_image_tar(wanted[0].path, BUSYBOX_IMAGE, layer, [], ["sh"])
    write_image_tar(wanted[1].path, PAUSE_IMAGE, layer, ["/bin/sh", "-c", _PAUSE_SCRIPT], [])
    return wanted
