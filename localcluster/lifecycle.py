"""The context-manager shape shared by the harness's peers (containerd, plugin processes, servers)."""

from __future__ import annotations

import signal
import subprocess
from types import TracebackType
from typing import Any, Self


def terminate(proc: subprocess.Popen[Any], timeout_s: float) -> int:
    """SIGTERM a child we started, SIGKILL it after `timeout_s`; return its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    return proc.returncode


class Lifecycle:
    """`with peer:` starts it, and closes it again if the start fails half-way; exit closes it."""

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
