"""Run an NRI plugin (`gpushare nri run`, or the Go device-injector) as a child process for the tests.

The plugin's stderr is collected by one reader thread (`gpushare-harness-log`, joined on stop) so a
test can wait for a log line ("nri: synchronized") and the benchmark can read `took_ms=` fields.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from localcluster.containerd import Containerd
from localcluster.lifecycle import Lifecycle, terminate

ROOT = Path(__file__).resolve().parents[2]
GPUSHARE = ROOT / ".venv" / "bin" / "gpushare"
READY_LINE = "nri: synchronized"
NRI_NAME = "gpushare"  # the name `gpushare nri run` registers under


class PluginProcessError(RuntimeError):
    """The plugin exited or never logged the awaited line; the message carries its log tail."""


def gpushare_command(
    nri_socket: str, *, pod_resources_socket: str | None = None, config: Path | None = None
) -> list[str]:
    exe = [str(GPUSHARE)] if GPUSHARE.exists() else [sys.executable, "-m", "cli.main"]
    cmd = [*exe, "nri", "run", "--socket", nri_socket]
    if pod_resources_socket:
        cmd += ["--pod-resources-socket", pod_resources_socket]
    if config is not None:
        cmd += ["--config", str(config)]
    return cmd


class PluginProcess(Lifecycle):
    def __init__(
        self, argv: Sequence[str], *, ready_line: str | None = READY_LINE, containerd: Containerd | None = None
    ) -> None:
        """``containerd``: the instance the plugin connects to; ``start`` then returns only once that
        containerd calls the plugin, which is later than the plugin's own ``ready_line``."""
        self.argv = list(argv)
        self.ready_line = ready_line
        self.containerd = containerd
        self._proc: subprocess.Popen[str] | None = None
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None

    @classmethod
    def gpushare(
        cls, containerd: Containerd, *, pod_resources_socket: str | None = None, config: Path | None = None
    ) -> PluginProcess:
        cmd = gpushare_command(containerd.nri_socket, pod_resources_socket=pod_resources_socket, config=config)
        return cls(cmd, containerd=containerd)

    def registrations(self) -> int:
        """How often the containerd given has added this plugin (0 without one)."""
        return self.containerd.nri_plugin_registrations(NRI_NAME) if self.containerd is not None else 0

    def wait_registered(self, *, more_than: int, timeout_s: float = 30.0) -> None:
        """Wait until the containerd given calls this plugin again (see ``registrations``)."""
        if self.containerd is None:
            raise PluginProcessError(f"{' '.join(self.argv)}: no containerd given to wait for")
        self.containerd.wait_nri_plugin(NRI_NAME, more_than=more_than, timeout_s=timeout_s)

    def start(self, timeout_s: float = 20.0) -> None:
        before = self.registrations()
        self._proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._reader = threading.Thread(target=self._read, name="gpushare-harness-log", daemon=True)
        self._reader.start()
        if self.ready_line:
            self.wait_for(self.ready_line, timeout_s=timeout_s)
        if self.containerd is not None:
            self.wait_registered(more_than=before, timeout_s=timeout_s)

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            with self._cond:
                self._lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def lines(self) -> list[str]:
        with self._cond:
            return list(self._lines)

    def mark(self) -> int:
        """Index of the next log line, to wait for lines logged after this point."""
        with self._cond:
            return len(self._lines)

    def wait_for(self, needle: str, *, since: int = 0, timeout_s: float = 20.0) -> str:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for line in self._lines[since:]:
                    if needle in line:
                        return line
                if self._proc is not None and self._proc.poll() is not None and self._reader_done():
                    raise self._fail(f"exited ({self._proc.returncode}) before logging {needle!r}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._fail(f"did not log {needle!r} within {timeout_s} s")
                self._cond.wait(min(left, 0.2))

    def _reader_done(self) -> bool:
        return self._reader is None or not self._reader.is_alive()

    def _fail(self, what: str) -> PluginProcessError:
        tail = "\n".join(self._lines[-30:])
        return PluginProcessError(f"{' '.join(self.argv)} {what}; output:\n{tail}")

    def kill(self) -> None:
        """SIGKILL, as a crash: the process cleans nothing up; ``stop`` then reaps it."""
        if self._proc is not None:
            self._proc.kill()

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def handler_times_ms(self, since: int = 0, field: str = "took") -> list[float]:
        """Every `<field>_ms=` / `<field>_us=` value the plugin logged, in milliseconds.

        gpushare logs `took_ms` (wall time of its handler) and `cpu_ms` (the handler thread's CPU
        time, which a loaded machine's scheduling does not inflate); the Go plugin logs `took_us`.
        """
        pattern = re.compile(rf"\b{re.escape(field)}_(ms|us)=([0-9.]+)")
        times = []
        for line in self.lines[since:]:
            m = pattern.search(line)
            if m:
                value = float(m.group(2))
                times.append(value if m.group(1) == "ms" else value / 1000.0)
        return times

    def stop(self, timeout_s: float = 10.0) -> int | None:
        proc, self._proc = self._proc, None
        rc = terminate(proc, timeout_s) if proc is not None else None
        if self._reader is not None:
            self._reader.join(timeout=5)
            self._reader = None
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
        return rc

    def close(self) -> None:
        self.stop()
