"""The host side of the peers we start: commands, processes, free ports, mounts and cgroups.

Every process the harness starts is found again through ``/proc`` (its command line names our
private root directory) and stopped by PID; every mount and cgroup lives under a private name and
is removed the same way. Nothing here touches what it did not create.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import random
import re
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from localcluster.errors import ClusterError

CGROUP_FS = Path("/sys/fs/cgroup")
MOUNTINFO = Path("/proc/self/mountinfo")
# mountinfo writes space, tab, newline and backslash in a path as three octal digits (\040).
_MOUNTINFO_ESCAPE = re.compile(r"\\([0-7]{3})")


def run_command(argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run a command to completion; ClusterError with its stderr when it fails."""
    try:
        return subprocess.run(list(argv), check=True, capture_output=True, text=True, **kw)
    except subprocess.CalledProcessError as e:
        raise ClusterError(f"{argv[0]} failed ({e.returncode}): {' '.join(argv)}\n{e.stderr.strip()}") from e


# Listeners get ports below the kernel's ephemeral range: a port the kernel hands out for
# bind(0) is also one it hands to outgoing connections, and with a cluster's components
# opening hundreds of those, a component started a few seconds after its port was picked
# (the scheduler, after the API server is ready) found it taken ("address already in use").
_LISTEN_PORTS_FROM = 20000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A port free on 127.0.0.1 right now, outside the range outgoing connections draw from."""
    high = _ephemeral_low()
    candidates = list(range(_LISTEN_PORTS_FROM, high)) if high > _LISTEN_PORTS_FROM else []
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no room below the range: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_body(port: int, path: str, timeout_s: float = 2.0) -> bytes | None:
    """The body of GET http://127.0.0.1:<port><path>, or None when nothing answers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        return conn.getresponse().read()
    except OSError:
        return None
    finally:
        conn.close()


# -- processes ------------------------------------------------------------------------------------


def is_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cmdline(pid: int) -> list[str]:
    """The process's argv, or [] when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def all_pids() -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]


def process_identity(pid: int) -> tuple[int, int] | None:
    """(pid, start time in clock ticks): a PID alone may be reused by another process."""
    try:
        return pid, int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def pids_mentioning(text: str) -> list[int]:
    """Live processes other than this one whose command line mentions ``text`` (e.g. our root dir)."""
    me = os.getpid()
    return [pid for pid in all_pids() if pid != me and any(text in a for a in cmdline(pid)) and is_alive(pid)]


def rss_mib(pid: int) -> float | None:
    """The process's resident memory (VmRSS) in MiB, or None when it is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def stop_pid(pid: int, popen: subprocess.Popen[bytes] | None, timeout_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``; reaps the child when we started it in this process."""
    if not is_alive(pid):
        if popen is not None:
            popen.wait()
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if popen is not None and popen.poll() is not None:
            return
        if popen is None and not is_alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if popen is not None:
        popen.wait(timeout=10)


# -- mounts ---------------------------------------------------------------------------------------


def mounts_under(root: Path, mountinfo: str | None = None) -> list[str]:
    """Mount points at or below ``root``, latest first: a mount made inside another comes before it,
    which is the order to unmount them in. ``mountinfo`` defaults to this process's."""
    text = MOUNTINFO.read_text() if mountinfo is None else mountinfo
    prefix = str(root).rstrip("/")
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = _MOUNTINFO_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return list(reversed(found))


def unmount_below(root: Path) -> None:
    """Lazily unmount everything at or below ``root``, latest first; a busy mount goes when released."""
    for point in mounts_under(root):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


# -- cgroups (v1 hierarchies, and the unified one of a hybrid setup) ------------------------------


def cgroup_hierarchies() -> list[Path]:
    return sorted(p for p in CGROUP_FS.iterdir() if p.is_dir()) if CGROUP_FS.is_dir() else []


def cgroup_pids(parent: str) -> set[int]:
    """Every process in the cgroup subtree ``parent``, across all hierarchies."""
    pids: set[int] = set()
    for h in cgroup_hierarchies():
        top = h / parent.lstrip("/")
        for procs in top.rglob("cgroup.procs") if top.is_dir() else ():
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(line) for line in procs.read_text().split())
    return pids


def make_cgroup_root(name: str) -> None:
    """kubelet refuses a cgroupRoot that does not exist; create it in every v1 hierarchy."""
    for h in cgroup_hierarchies():
        if h.name == "unified":  # the v2 part of a hybrid setup: kubelet on v1 does not use it
            continue
        d = h / name.lstrip("/")
        d.mkdir(exist_ok=True)
        if h.name == "cpuset":  # a new v1 cpuset is empty (no cpus, no mems) and refuses tasks
            for f in ("cpuset.cpus", "cpuset.mems"):
                if not (d / f).read_text().strip():
                    (d / f).write_text((h / f).read_text())


def remove_cgroup_root(name: str) -> list[str]:
    """Kill whatever still lives below ``name`` and rmdir the tree, leaves first. Returns what stayed."""
    left: list[str] = []
    for _attempt in range(50):
        left = []
        for h in cgroup_hierarchies():
            top = h / name.lstrip("/")
            if not top.is_dir():
                continue
            for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda t: len(t[0]), reverse=True):
                with contextlib.suppress(OSError):
                    for pid in Path(dirpath, "cgroup.procs").read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
                try:
                    os.rmdir(dirpath)
                except OSError:
                    left.append(dirpath)
        if not left:
            return []
        time.sleep(0.1)
    return left
