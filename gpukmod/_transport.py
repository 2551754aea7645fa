"""What the client needs from a netlink backend, and how it picks one.

Two backends speak the same protocol: ``_native`` (the cffi C helper; the default) and
``_pyroute2`` (pure Python; the fallback when the extension is not built, and an
independent peer in tests: it frames and parses messages with pyroute2's own classes).
"""

from __future__ import annotations

import errno
import importlib
from typing import Protocol, cast

from gpukmod.errors import KmodError, KmodUnavailable
from gpukmod.protocol import Message


class Transport(Protocol):
    """One netlink socket bound on the gpukmod unit."""

    name: str
    portid: int

    def send(self, msg_type: int, flags: int, seq: int, payload: bytes) -> None:
        """Send one message to the kernel; ``KmodError`` on failure."""

    def receive(self, timeout_s: float) -> list[Message]:
        """The messages of the next datagram, or ``[]`` when ``timeout_s`` passes first."""

    def close(self) -> None:
        """Close the socket (idempotent). An open socket keeps the module from unloading."""


class ModuleOps(Protocol):
    """Loading, unloading and version reading of the kernel module."""

    def load(self, path: str, params: str) -> None: ...

    def unload(self, name: str) -> None: ...

    def version(self, name: str) -> str | None: ...


BACKENDS = ("native", "pyroute2")


def open_transport(unit: int, backend: str = "auto") -> Transport:
    """Open a socket with ``backend`` ("native", "pyroute2" or "auto": native, else pyroute2)."""
    if backend not in ("auto", *BACKENDS):
        raise KmodError(errno.EINVAL, "open", f"unknown backend {backend!r}; choose auto, native or pyroute2")
    problems: list[str] = []
    for name in BACKENDS if backend == "auto" else (backend,):
        try:
            # Imported on demand: either backend may be missing on a given machine.
            if name == "native":
                return cast(Transport, importlib.import_module("gpukmod._native").NativeTransport(unit))
            return cast(Transport, importlib.import_module("gpukmod._pyroute2").Pyroute2Transport(unit))
        except ImportError as exc:
            problems.append(f"{name}: {exc}")
    raise KmodUnavailable("; ".join(problems))


def module_ops() -> ModuleOps:
    """The native helper's module operations, else the ctypes fallback."""
    try:
        return cast(ModuleOps, importlib.import_module("gpukmod._native").NativeModuleOps())
    except ImportError:
        return cast(ModuleOps, importlib.import_module("gpukmod._sysmod").SyscallModuleOps())
