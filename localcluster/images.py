"""Container images for the containerd tier and the cluster, built locally from busybox-static (no registry).

An OCI image-layout tarball holding one uncompressed layer (busybox and its applet links) is what
`ctr -n k8s.io image import` takes (docs/testing-containerd.md). Two images share that layer:

- `BUSYBOX_IMAGE`: test containers run their own command in it;
- `PAUSE_IMAGE`: the CRI sandbox image, a shell loop that sleeps and exits on TERM.

Tarballs are cached under `$GPUSHARE_CACHE/images` (`busybox-v<N>.tar`, `pause-v<N>.tar`) and
rebuilt when missing.
"""

from __future__ import annotations

import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from localcluster import oci
from localcluster.paths import cache_dir

BUSYBOX_IMAGE = "gpushare.local/busybox:test"
PAUSE_IMAGE = "gpushare.local/pause:test"
BUSYBOX_BIN = Path("/bin/busybox")
_PAUSE_SCRIPT = "trap 'exit 0' TERM INT; while true; do sleep 3600 & wait $!; done"
# Bumped whenever the image contents change, so cached tarballs of an older layout are not reused.
_LAYOUT_VERSION = 2


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


def _fill_busybox(writer: oci.LayerWriter, busybox: Path) -> None:
    """busybox and its applet links, a passwd/group for root, and the directories a container needs."""
    for d in ("bin", "dev", "etc", "proc", "sys", "run", "var"):
        info = tarfile.TarInfo(d)
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        writer.add(info)
    tmp = tarfile.TarInfo("tmp")
    tmp.type, tmp.mode = tarfile.DIRTYPE, 0o1777
    writer.add(tmp)
    writer.add_bytes("bin/busybox", busybox.read_bytes(), mode=0o755)
    for applet in _applets(busybox):
        link = tarfile.TarInfo(f"bin/{applet}")
        link.type, link.linkname = tarfile.SYMTYPE, "busybox"
        writer.add(link)
    writer.add_bytes("etc/passwd", b"root:x:0:0:root:/:/bin/sh\n")
    writer.add_bytes("etc/group", b"root:x:0:\n")


def write_image_tar(dest: Path, name: str, layer: oci.Layer, entrypoint: list[str], cmd: list[str]) -> None:
    """Write an OCI image archive of the one busybox layer at `dest`, named `name` for ctr import."""
    config = oci.ImageConfig(entrypoint=entrypoint, cmd=cmd, env=["PATH=/bin"])
    oci.write_archive(dest, name, [layer], config, history=["busybox-static and its applets"])


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
    layer = oci.write_layer(directory / f"busybox-v{_LAYOUT_VERSION}.layer.tar.gz", lambda w: _fill_busybox(w, busybox))
    write_image_tar(wanted[0].path, BUSYBOX_IMAGE, layer, [], ["sh"])
    write_image_tar(wanted[1].path, PAUSE_IMAGE, layer, ["/bin/sh", "-c", _PAUSE_SCRIPT], [])
    return wanted
