"""Helpers for the tests that run inside the QEMU guest against the real gpukmod.ko."""

from __future__ import annotations

import contextlib
import errno
import os
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpukmod import KmodError, load, loaded_version, unload

WORKER = Path(__file__).resolve().parent / "worker.py"
GPU_TYPE = 0x46


def ko_path(var: str = "GPUKMOD_KO") -> Path:
    """The module built for this kernel by the host side (tests/integration/kernel/test_qemu.py)."""
    return Path(os.environ[var])


def in_guest() -> bool:
    return "GPUKMOD_KO" in os.environ


def ensure_unloaded() -> None:
    """Unload gpukmod if it is loaded; retries briefly while closed sockets drain."""
    deadline = time.monotonic() + 5
    while loaded_version() is not None:
        try:
            unload()
        except KmodError as exc:
            if exc.errno != errno.EAGAIN or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextlib.contextmanager
def module_loaded(max_block_ms: int = 3000, ko: Path | None = None, *, release_on_close: bool = True) -> Iterator[None]:
    """Load the module with ``max_block_ms`` for the block, unload it after."""
    ensure_unloaded()
    load(ko or ko_path(), f"max_block_ms={max_block_ms} release_on_close={int(release_on_close)}")
    try:
        yield
    finally:
        ensure_unloaded()


@dataclass
class Worker:
    """A worker.py process; ``new_pidns`` starts it as pid 1 of a fresh pid namespace."""

    proc: subprocess.Popen[str]
    pidns: int

    @classmethod
    def start(cls, *, new_pidns: bool = True) -> Worker:
        argv = [sys.executable, str(WORKER)]
        if new_pidns:
            argv = ["unshare", "--pid", "--fork", "--", *argv]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        assert proc.stdout is not None and proc.stdin is not None
        try:
            first = proc.stdout.readline().strip()
            if first != "ready":
                raise RuntimeError(f"worker did not start: {first!r}, exit {proc.poll()}")
            proc.stdin.write("pidns\n")
            word, inode = proc.stdout.readline().split()
            assert word == "pidns"
        except BaseException:
            proc.kill()
            proc.wait()
            proc.stdin.close()
            proc.stdout.close()
            raise
        return cls(proc, int(inode))

    def ioctl_async(self, ioc_type: int = GPU_TYPE, nr: int = 1, k: int = 1) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"ioctl {ioc_type} {nr} {k}\n")

    def result(self) -> list[tuple[int, float]]:
        """(errno, seconds) per ioctl of the last ``ioctl_async``."""
        assert self.proc.stdout is not None
        words = self.proc.stdout.readline().split()
        assert words and words[0] == "done", words
        return [(int(words[i]), float(words[i + 1])) for i in range(1, len(words), 2)]

    def ioctl(self, ioc_type: int = GPU_TYPE, nr: int = 1, k: int = 1) -> list[tuple[int, float]]:
        self.ioctl_async(ioc_type, nr, k)
        return self.result()

    def exec_async(self, path: Path) -> None:
        """Run ``path`` (in this worker's pid namespace); ``result`` gives its exit status and time."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"exec {path}\n")

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("exit\n")
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def write_ia32_ioctl(path: Path, cmd: int) -> Path:
    """Write a static 32-bit x86 program that does ioctl(0, cmd, 0) through int 0x80 and exits
    with the errno (25 = ENOTTY on /dev/null). It enters through __ia32_compat_sys_ioctl, so
    it exercises the compat hook without a 32-bit toolchain."""
    base = 0x08048000
    code = (
        b"\xb8\x36\x00\x00\x00"  # mov eax, 54 (ioctl)
        + b"\x31\xdb"  # xor ebx, ebx (fd 0)
        + b"\xb9"
        + struct.pack("<I", cmd)  # mov ecx, cmd
        + b"\x31\xd2"  # xor edx, edx
        + b"\xcd\x80"  # int 0x80
        + b"\xf7\xd8"  # neg eax: -errno -> errno
        + b"\x89\xc3"  # mov ebx, eax
        + b"\xb8\x01\x00\x00\x00"  # mov eax, 1 (exit)
        + b"\xcd\x80"  # int 0x80
    )
    size = 52 + 32 + len(code)
    ident = b"\x7fELF\x01\x01\x01" + b"\0" * 9
    ehdr = ident + struct.pack("<HHIIIIIHHHHHH", 2, 3, 1, base + 84, 52, 0, 0, 52, 32, 1, 0, 0, 0)
    phdr = struct.pack("<IIIIIIII", 1, 0, base, base, size, size, 5, 0x1000)
    path.write_bytes(ehdr + phdr + code)
    path.chmod(0o755)
    return path


@contextlib.contextmanager
def worker(*, new_pidns: bool = True) -> Iterator[Worker]:
    w = Worker.start(new_pidns=new_pidns)
    try:
        yield w
    finally:
        w.stop()
