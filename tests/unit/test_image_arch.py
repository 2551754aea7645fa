"""An image archive is of one architecture (hack/image/arch.py): its index, its config and every ELF
file in its layers. `make image-arm64` builds the arm64 agent under emulation and runs this check
on it; here it runs on small archives made on the spot."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from localcluster import oci

REPO = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_arch", REPO / "hack" / "image" / "arch.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("image_arch", module)
    spec.loader.exec_module(module)
    return module


arch = _load()


def _elf(machine: int) -> bytes:
    """The first bytes of a 64-bit little-endian ELF shared object for `machine`."""
    return b"\x7fELF\x02\x01\x01" + bytes(9) + (3).to_bytes(2, "little") + machine.to_bytes(2, "little") + bytes(44)


def _archive(tmp_path: Path, architecture: str, files: dict[str, bytes]) -> Path:
    def fill(w: oci.LayerWriter) -> None:
        for name, data in files.items():
            w.add_bytes(name, data)

    layer = oci.write_layer(tmp_path / "layer.tar.gz", fill)
    archive = tmp_path / f"image-{architecture}.oci.tar"
    config = oci.ImageConfig(entrypoint=["gpushare"], architecture=architecture)
    oci.write_archive(archive, "docker.io/gpushare/agent:0.1.0", [layer], config, ["test"])
    return archive


def test_elf_machine_reads_the_header() -> None:
    assert arch.elf_machine(_elf(183)) == 183
    assert arch.elf_machine(Path(sys.executable).resolve().read_bytes()[:20]) == arch.ARCHES["amd64"].elf_machine
    assert arch.elf_machine(b"#!/usr/bin/python3\n" + bytes(8)) is None
    assert arch.elf_machine(b"\x7fELF") is None  # too short to hold e_machine


def test_a_clean_arm64_archive_passes(tmp_path: Path) -> None:
    files = {"usr/bin/python3.11": _elf(183), "usr/lib/x.so": _elf(183), "usr/bin/gpushare": b"#!/usr/bin/python3\n"}
    assert arch.archive_problems(_archive(tmp_path, "arm64", files), arch.ARCHES["arm64"]) == ([], 2)


def test_every_file_and_field_of_another_architecture_is_named(tmp_path: Path) -> None:
    files = {"usr/bin/python3.11": _elf(183), "usr/local/lib/grpc/cygrpc.so": _elf(62)}
    problems, checked = arch.archive_problems(_archive(tmp_path, "amd64", files), arch.ARCHES["arm64"])
    assert checked == 2
    assert problems == [
        "index.json: platform architecture 'amd64', not 'arm64'",
        "image config: architecture 'amd64', not 'arm64'",
        "/usr/local/lib/grpc/cygrpc.so: ELF for x86-64, not arm64",
    ]


def test_the_command_fails_naming_the_problem_and_on_an_archive_with_no_elf(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = _archive(tmp_path, "arm64", {"usr/lib/x.so": _elf(62)})
    assert arch.main([str(bad), "arm64"]) == 1
    assert "/usr/lib/x.so: ELF for x86-64, not arm64" in capsys.readouterr().out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert arch.main([str(_archive(empty, "arm64", {"etc/hostname": b"x\n"})), "arm64"]) == 1
    assert "holds no ELF file" in capsys.readouterr().err
    assert arch.main([str(bad), "riscv64"]) == 2
