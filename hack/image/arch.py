"""The CPU architectures an image can be built for, and the check that an archive is one.

    python hack/image/arch.py ARCHIVE arm64   # exit 1 naming each file or field of another architecture

amd64 is the builder's own. arm64 is built on an amd64 machine by emulation: mmdebstrap runs
arm64's maintainer scripts, and pip builds gpushare's cffi extension, under qemu-user-static
registered with binfmt_misc (`make image-deps-arm64`); PyPI's aarch64 wheels give the rest.
"""

from __future__ import annotations

import gzip
import json
import platform
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ELF_MAGIC = b"\x7fELF"


@dataclass(frozen=True)
class Arch:
    name: str  # Debian's and OCI's name
    machine: str  # the kernel's (uname -m) and the wheel tags' name
    elf_machine: int  # e_machine of its ELF files

    @property
    def multiarch(self) -> str:
        """Debian's library directory, /usr/lib/<multiarch>, and binutils' prefix."""
        return f"{self.machine}-linux-gnu"

    @property
    def native(self) -> bool:
        """Whether the builder runs this architecture's binaries itself."""
        return self.machine == platform.machine()

    @property
    def wheel_platforms(self) -> tuple[str, ...]:
        """pip's --platform tags for wheels bookworm (glibc 2.36) runs, PyPI's and a local build's."""
        manylinux = (f"manylinux_2_{minor}_{self.machine}" for minor in range(36, 16, -1))
        return (*manylinux, f"manylinux2014_{self.machine}", f"linux_{self.machine}")


ARCHES = {
    "amd64": Arch("amd64", "x86_64", 62),  # EM_X86_64
    "arm64": Arch("arm64", "aarch64", 183),  # EM_AARCH64
}
MACHINE_NAMES = {62: "x86-64", 183: "aarch64", 3: "i386", 40: "arm", 243: "riscv"}


def elf_machine(header: bytes) -> int | None:
    """e_machine of an ELF file's first 20 bytes; None when it is no ELF file."""
    if len(header) < 20 or not header.startswith(ELF_MAGIC):
        return None
    order = "little" if header[5] == 1 else "big"
    return int.from_bytes(header[18:20], order)


def _layer_elves(tar: tarfile.TarFile) -> Iterator[tuple[str, int]]:
    for info in tar:
        if info.isreg() and info.size >= 20:
            handle = tar.extractfile(info)
            machine = elf_machine(handle.read(20)) if handle else None
            if machine is not None:
                yield info.name, machine


def archive_problems(archive: Path, arch: Arch) -> tuple[list[str], int]:
    """What in the OCI archive is not `arch`: the index's platform, the config's architecture and
    every ELF file of every layer; and how many ELF files were looked at."""
    problems: list[str] = []
    checked = 0
    with tarfile.open(archive, "r:") as outer:

        def blob(digest: str) -> tarfile.ExFileObject:
            handle = outer.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            if handle is None:
                raise ValueError(f"{archive}: blob {digest} is missing")
            return handle

        index_file = outer.extractfile("index.json")
        if index_file is None:
            return [f"{archive}: no index.json"], 0
        images = [m for m in json.load(index_file)["manifests"] if "artifactType" not in m]
        for desc in images:
            platform = desc.get("platform", {}).get("architecture")
            if platform != arch.name:
                problems.append(f"index.json: platform architecture {platform!r}, not {arch.name!r}")
            manifest = json.load(blob(desc["digest"]))
            config = json.load(blob(manifest["config"]["digest"]))
            if config.get("architecture") != arch.name:
                problems.append(f"image config: architecture {config.get('architecture')!r}, not {arch.name!r}")
            for layer in manifest["layers"]:
                with gzip.open(blob(layer["digest"])) as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
                    for name, machine in _layer_elves(tar):
                        checked += 1
                        if machine != arch.elf_machine:
                            problems.append(f"/{name}: ELF for {MACHINE_NAMES.get(machine, machine)}, not {arch.name}")
    return problems, checked


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in ARCHES:
        print(f"usage: arch.py ARCHIVE {{{','.join(ARCHES)}}}", file=sys.stderr)
        return 2
    problems, checked = archive_problems(Path(argv[0]), ARCHES[argv[1]])
    for line in problems[:50]:
        print(f"arch: {line}")
    if problems:
        print(f"arch: {len(problems)} problems; {argv[0]} is not a clean {argv[1]} image", file=sys.stderr)
        return 1
    if not checked:
        print(f"arch: {argv[0]} holds no ELF file: nothing shows its architecture", file=sys.stderr)
        return 1
    print(f"arch: {argv[0]}: config and index say {argv[1]}, and all {checked} ELF files are {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
