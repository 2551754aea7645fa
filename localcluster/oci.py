"""A small OCI image writer: gzip layers with stable digests, and an OCI image-layout archive.

No registry and no container engine is needed: `ctr -n k8s.io images import` and
`skopeo copy oci-archive:...` both take the archive this writes.

Layers are deterministic: entries come in the order they are added (callers sort), every
mtime is `EPOCH`, owners are numeric only, and the gzip header carries neither a name nor a
time. The same files therefore give the same layer digest, whichever machine built them.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Protocol

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
# 2000-01-01: a fixed, plausible time. Tools that warn about files dated 1970 stay quiet.
EPOCH = 946684800
# Level 6: within a few percent of level 9 on these layers, at about half the time.
_GZIP_LEVEL = 6
_CHUNK = 1 << 20


class _Sink(Protocol):
    def write(self, data: memoryview, /) -> int: ...


class _Hashing(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through to `sink` (if any)."""

    def __init__(self, sink: _Sink | None) -> None:
        super().__init__()
        self._sink = sink
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data)
        self.sha256.update(view)
        self.size += view.nbytes
        if self._sink is not None:
            self._sink.write(view)
        return view.nbytes

    @property
    def digest(self) -> str:
        return "sha256:" + self.sha256.hexdigest()


@dataclass(frozen=True)
class Layer:
    """One gzip layer blob on disk and the numbers a manifest and a config need."""

    path: Path
    digest: str  # of the gzip blob (manifest)
    diff_id: str  # of the uncompressed tar (config rootfs)
    size: int  # gzip bytes
    uncompressed: int  # tar bytes: about what the layer takes once unpacked

    def save_meta(self, path: Path) -> None:
        meta = {k: v for k, v in asdict(self).items() if k != "path"}
        path.write_text(json.dumps(meta, sort_keys=True) + "\n")

    @classmethod
    def load(cls, blob: Path, meta: Path) -> Layer | None:
        """The layer recorded at `meta` if both files are there, else None (build it again)."""
        if not (blob.is_file() and meta.is_file()):
            return None
        raw = json.loads(meta.read_text())
        layer = cls(blob, str(raw["digest"]), str(raw["diff_id"]), int(raw["size"]), int(raw["uncompressed"]))
        return layer if blob.stat().st_size == layer.size else None


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = EPOCH
    info.uname = info.gname = ""
    # Keep extended attributes (file capabilities); drop access and change times.
    info.pax_headers = {k: v for k, v in info.pax_headers.items() if k.startswith("SCHILY.xattr.")}
    return info


class LayerWriter:
    """Entries of one layer; `write_layer` makes one and turns it into a `Layer`."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self._tar = tar
        self._dirs: set[str] = set()

    def add(self, info: tarfile.TarInfo, data: IO[bytes] | None = None) -> None:
        if info.isdir():
            if info.name in self._dirs:
                return
            self._dirs.add(info.name)
        self._tar.addfile(_normalise(info), data)

    def add_parents(self, path: str) -> None:
        """Directory entries (root-owned, 0755) for every parent of `path` not yet in the layer."""
        parts = path.strip("/").split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            info = tarfile.TarInfo("/".join(parts[:depth]))
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            self.add(info)

    def add_bytes(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self.add_parents(name)
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), mode
        self.add(info, io.BytesIO(data))

    def add_tree(self, root: Path, prefix: str, keep: Callable[[str], bool] = lambda _: True) -> None:
        """Everything under `root` as `prefix/...`, root-owned; `keep(relative path)` filters.

        Modes are reduced to 0755 (executable) or 0644 so a builder's umask never shows in a digest.
        """
        self.add_parents(prefix + "/x")
        top = tarfile.TarInfo(prefix)
        top.type, top.mode = tarfile.DIRTYPE, 0o755
        self.add(top)
        for rel in _walk(root):
            if not keep(rel):
                continue
            path = root / rel
            st = path.lstat()
            info = tarfile.TarInfo(f"{prefix}/{rel}")
            if stat.S_ISLNK(st.st_mode):
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(path), 0o777
                self.add(info)
            elif stat.S_ISDIR(st.st_mode):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                self.add(info)
            elif stat.S_ISREG(st.st_mode):
                info.size, info.mode = st.st_size, 0o755 if st.st_mode & 0o111 else 0o644
                with path.open("rb") as fh:
                    self.add(info, fh)

    def add_rootfs_tar(self, src: Path, keep: Callable[[str], bool]) -> int:
        """Copy a root filesystem tarball (mmdebstrap's), filtered by `keep(name)`; returns entries dropped.

        A hard link whose target was dropped is dropped too: extracting it would fail.
        """
        dropped = 0
        kept: set[str] = set()
        with tarfile.open(src, "r:*") as tar:
            for info in tar:
                name = info.name.removeprefix("./").rstrip("/")
                if not name or not keep(name):
                    dropped += 1
                    continue
                info.name = name
                if info.islnk():
                    info.linkname = info.linkname.removeprefix("./")
                    if info.linkname not in kept:
                        dropped += 1
                        continue
                kept.add(name)
                self.add(info, tar.extractfile(info) if info.isreg() else None)
        return dropped


def _walk(root: Path) -> Iterator[str]:
    """Relative paths under `root`, sorted, directories before their contents, links not followed."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath).relative_to(root)
        for name in sorted(dirnames + filenames):
            yield str(base / name) if str(base) != "." else name


def write_layer(dest: Path, fill: Callable[[LayerWriter], None]) -> Layer:
    """Write the gzip layer `fill` produces to `dest` (atomically) and return its numbers."""
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as out:
        compressed = _Hashing(out)
        with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, compresslevel=_GZIP_LEVEL, mtime=0) as gz:
            raw = _Hashing(gz)
            with tarfile.open(fileobj=raw, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                fill(LayerWriter(tar))
    tmp.replace(dest)
    return Layer(dest, compressed.digest, raw.digest, compressed.size, raw.size)


@dataclass(frozen=True)
class ImageConfig:
    """What runs: the parts of the OCI image config a builder chooses."""

    entrypoint: list[str]
    cmd: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    working_dir: str = "/"
    architecture: str = "amd64"  # OCI's (GOARCH's) name: amd64, arm64

    def document(self, layers: list[Layer], history: list[str]) -> dict[str, object]:
        return {
            "architecture": self.architecture,
            "os": "linux",
            "config": {
                "Entrypoint": self.entrypoint,
                "Cmd": self.cmd or None,
                "Env": self.env,
                "Labels": self.labels,
                "WorkingDir": self.working_dir,
            },
            "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
            "history": [{"created_by": h} for h in history],
        }


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _blob_info(digest: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(f"blobs/sha256/{digest.split(':', 1)[1]}")
    info.size, info.mode, info.mtime = size, 0o644, EPOCH
    return info


def _add_blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    tar.addfile(_blob_info(digest, len(data)), io.BytesIO(data))
    return digest


def write_archive(dest: Path, name: str, layers: list[Layer], config: ImageConfig, history: list[str]) -> str:
    """Write an OCI image-layout tarball at `dest` (atomically); returns the manifest digest.

    `name` is the full reference (`docker.io/gpushare/agent:0.2.0`): ctr imports under the
    `io.containerd.image.name` annotation verbatim, and the CRI looks images up by their
    normalised name, so a short name would never be found by the kubelet.
    """
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        config_raw = _json(config.document(layers, history))
        config_digest = _add_blob(tar, config_raw)
        seen: set[str] = set()
        for layer in layers:
            if layer.digest not in seen:  # two layers with the same files are stored once
                seen.add(layer.digest)
                with layer.path.open("rb") as fh:
                    tar.addfile(_blob_info(layer.digest, layer.size), fh)
        manifest = {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": len(config_raw)},
            "layers": [{"mediaType": MEDIA_LAYER_GZIP, "digest": x.digest, "size": x.size} for x in layers],
        }
        manifest_raw = _json(manifest)
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": MEDIA_MANIFEST,
                    "digest": _add_blob(tar, manifest_raw),
                    "size": len(manifest_raw),
                    "platform": {"architecture": config.architecture, "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                    },
                }
            ],
        }
        for fname, raw in (("oci-layout", _json({"imageLayoutVersion": "1.0.0"})), ("index.json", _json(index))):
            info = tarfile.TarInfo(fname)
            info.size, info.mode, info.mtime = len(raw), 0o644, EPOCH
            tar.addfile(info, io.BytesIO(raw))
    tmp.replace(dest)
    return "sha256:" + hashlib.sha256(manifest_raw).hexdigest()
