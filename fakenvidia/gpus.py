"""The mock NVML's configuration: how many GPUs it reports, their names, and the driver it claims to be.

The mock reads a key=value file (fakenvidia/mock_nvml/config.c documents the format and is its
authority: it refuses what it does not understand). ``FakeGpus`` writes that file, and checks the
same limits first so a bad value fails here, in Python, with every problem listed, rather than
as an ``nvmlInit_v2`` error in a Go program's log.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fakenvidia.errors import FakeNvidiaError

# The mock's own limits and defaults (mock.h, config.c).
MAX_GPUS = 16
MAX_NAME_CHARS = 95
MAX_SEED_CHARS = 63
MAX_MEMORY_MIB = 1 << 24
DEFAULT_NAME = "NVIDIA A100-SXM4-40GB"
# A real R570 data-centre driver and the CUDA version it reports (12.8, as NVML writes it).
DEFAULT_DRIVER_VERSION = "570.172.08"
DEFAULT_CUDA_DRIVER_VERSION = 12080

_PRINTABLE = re.compile(r"[\x20-\x7e]+")
_VERSION = re.compile(r"[0-9][0-9.]*")


@dataclass(frozen=True)
class FakeGpus:
    """The GPUs of one fake node. ``names`` overrides ``name`` for the GPUs it lists by index."""

    count: int = 8
    name: str = DEFAULT_NAME
    names: Mapping[int, str] = field(default_factory=dict)
    memory_mib: int = 40960
    driver_version: str = DEFAULT_DRIVER_VERSION
    cuda_driver_version: int = DEFAULT_CUDA_DRIVER_VERSION
    # Nodes with different seeds have different GPU UUIDs; the same seed gives the same UUIDs.
    uuid_seed: str = "gpushare"
    # Where the mock reads health events; a relative path is relative to the config file.
    events_dir: str | None = None

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise FakeNvidiaError("fakenvidia: GPUs refused:\n" + "\n".join(f"  - {p}" for p in problems))

    def problems(self) -> list[str]:
        problems = []
        if not 1 <= self.count <= MAX_GPUS:
            problems.append(f"count: 1 to {MAX_GPUS} GPUs (got {self.count})")
        for key, value in [("name", self.name), *((f"name.{i}", n) for i, n in self.names.items())]:
            if not _is_text(value, MAX_NAME_CHARS):
                problems.append(f"{key}: 1 to {MAX_NAME_CHARS} printable ASCII characters (got {value!r})")
        problems += [f"names: GPU {i} is not one of the {self.count}" for i in self.names if not 0 <= i < self.count]
        if not 1 <= self.memory_mib <= MAX_MEMORY_MIB:
            problems.append(f"memory_mib: 1 to {MAX_MEMORY_MIB} (got {self.memory_mib})")
        if not (_VERSION.fullmatch(self.driver_version) and len(self.driver_version) < 80):
            problems.append(f"driver_version: digits and dots such as 570.172.08 (got {self.driver_version!r})")
        if not 1 <= self.cuda_driver_version <= 999999:
            problems.append(f"cuda_driver_version: NVML's number, 12080 for 12.8 (got {self.cuda_driver_version})")
        if not _is_text(self.uuid_seed, MAX_SEED_CHARS):
            problems.append(f"uuid_seed: 1 to {MAX_SEED_CHARS} printable ASCII characters (got {self.uuid_seed!r})")
        if self.events_dir is not None and not _is_text(self.events_dir, 4095):
            problems.append(f"events_dir: a path of printable ASCII characters (got {self.events_dir!r})")
        return problems

    def name_of(self, index: int) -> str:
        return self.names.get(index, self.name)

    def render(self) -> str:
        """The config file's text."""
        lines = [
            "# gpushare mock NVML (fakenvidia/mock_nvml/config.c)",
            f"count = {self.count}",
            f"name = {self.name}",
            *(f"name.{i} = {n}" for i, n in sorted(self.names.items())),
            f"memory_mib = {self.memory_mib}",
            f"driver_version = {self.driver_version}",
            f"cuda_driver_version = {self.cuda_driver_version}",
            f"uuid_seed = {self.uuid_seed}",
        ]
        if self.events_dir is not None:
            lines.append(f"events_dir = {self.events_dir}")
        return "\n".join(lines) + "\n"

    def write(self, path: Path) -> Path:
        path.write_text(self.render())
        return path


def _is_text(value: str, max_chars: int) -> bool:
    """What the mock takes as a value: printable ASCII, no blanks at either end (it trims them)."""
    return bool(_PRINTABLE.fullmatch(value)) and value == value.strip() and len(value) <= max_chars
