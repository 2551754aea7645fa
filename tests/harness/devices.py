"""Fake GPU device nodes for the tests: a character device with a private node path.

The node borrows the kernel's fuse driver number (10:229): opening it works wherever the device
cgroup allows it, and, unlike /dev/null or /dev/zero, runc's default device allow-list does not
contain it, so a container can open it only if its own device cgroup rule was added. It is created
with mknod in a private temp dir under a fake GPU name: no real device node is touched.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

FUSE_MAJOR, FUSE_MINOR = 10, 229
LOOP_MAJOR = 7


@dataclass
class FakeDevice:
    path: Path
    major: int
    minor: int
    kind: str = "c"

    def __enter__(self) -> FakeDevice:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        shutil.rmtree(self.path.parent, ignore_errors=True)


def make_fake_device(name: str = "fakegpu0", *, block: bool = False) -> FakeDevice:
    """mknod a char node 10:229 (or a block node 7:200, never opened) in a fresh temp dir."""
    directory = Path(tempfile.mkdtemp(prefix="gs-dev-", dir="/tmp"))
    path = directory / name
    if block:
        major, minor, kind, mode = LOOP_MAJOR, 200, "b", stat.S_IFBLK
    else:
        major, minor, kind, mode = FUSE_MAJOR, FUSE_MINOR, "c", stat.S_IFCHR
    os.mknod(path, mode | 0o666, os.makedev(major, minor))
    return FakeDevice(path, major, minor, kind)
