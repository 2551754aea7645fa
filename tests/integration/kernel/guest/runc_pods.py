"""Pods of real runc containers in a kubepods-shaped cgroup v2 tree, inside the QEMU guest.

The guest has no kubelet, no containerd and no systemd. What kubelet would create (``kubepods``,
the QoS level, the pod) is created here the way kubelet does it on cgroup v2: one directory per
level with the parent's controllers enabled for it. Below a pod, the host's runc (reached over
the guest's 9p root) creates each container's cgroup from ``linux.cgroupsPath`` in its
config.json, with its cgroupfs driver. For the systemd layout that same driver is handed the
systemd-shaped path (``...-pod<uid>.slice/cri-containerd-<id>.scope``): the tree on disk is then
the one kubelet and containerd create through systemd, and the tree is all spot's killer reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup")
RUNC = "/usr/sbin/runc"
BUSYBOX = Path("/bin/busybox")
RUNC_TIMEOUT_S = 60
# Each round forks one 1 s sleeper into the background; the foreground ``sleep 0`` makes ash reap
# the finished ones (it waits for any child), so the loop forks without end but the number of
# live tasks stays bounded by the CPU the loop gets. A pids.max would not do: ash exits when a
# fork fails.
FORK_LOOP = "sleep 3600 & sleep 3600 & while :; do sleep 1 & sleep 0; done"
SLEEPERS = "sleep 3600 & sleep 3600 & exec sleep 3600"
# Containers wait for the gate (a file the test creates in a folder bound into each) before
# their script: with one vCPU, runc setting up a container behind running fork loops is slow.
_GATED = "until [ -e /gate/open ]; do sleep 0.1; done; "


def pod_rel(driver: str, qos: str, uid: str) -> str:
    """The pod's cgroup below the root, as kubelet names it (``qos``: besteffort, burstable, guaranteed)."""
    if driver == "cgroupfs":
        return f"kubepods/pod{uid}" if qos == "guaranteed" else f"kubepods/{qos}/pod{uid}"
    unit = uid.replace("-", "_")  # systemd unit names may not hold "-" inside a component
    if qos == "guaranteed":
        return f"kubepods.slice/kubepods-pod{unit}.slice"
    return f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{unit}.slice"


def container_rel(driver: str, pod: str, container_id: str) -> str:
    return f"{pod}/{container_id}" if driver == "cgroupfs" else f"{pod}/cri-containerd-{container_id}.scope"


def tasks_below(d: Path) -> list[int]:
    """Every task in ``d`` and its descendants, read directly (not through the code under test)."""
    pids: list[int] = []
    for dirpath, _, _ in os.walk(d):
        with contextlib.suppress(FileNotFoundError):  # removed while we walked
            pids += [int(x) for x in Path(dirpath, "cgroup.procs").read_text().split()]
    return pids


def populated(d: Path) -> bool:
    for line in (d / "cgroup.events").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "populated":
            return value == "1"
    raise AssertionError(f"no populated line in {d / 'cgroup.events'}")


def start_time(pid: int) -> int | None:
    """The task's start time in clock ticks, or None once it has exited (zombies count as exited:
    the kernel drops a task from its cgroup as it exits, before its parent reaps it)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def make_qos_tree(driver: str) -> list[Path]:
    """kubepods and its BestEffort and Burstable levels, top first."""
    if driver == "cgroupfs":
        rels = ["kubepods", "kubepods/besteffort", "kubepods/burstable"]
    else:
        rels = ["kubepods.slice", "kubepods.slice/kubepods-besteffort.slice", "kubepods.slice/kubepods-burstable.slice"]
    # Default weights everywhere: at kubelet's BestEffort weight of 1, one vCPU busy with the
    # Burstable pod's fork loops starves runc setting up a BestEffort container for minutes.
    return [make_cgroup(CGROUP_ROOT / rel) for rel in rels]


def make_cgroup(d: Path) -> Path:
    """Create ``d`` with the controllers its parent has, enabled for it (cpu, memory, pids)."""
    parent = d.parent
    wanted = {"cpu", "memory", "pids"} & set((parent / "cgroup.controllers").read_text().split())
    enabled = set((parent / "cgroup.subtree_control").read_text().split())
    if wanted - enabled:
        (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(wanted - enabled)))
    d.mkdir(exist_ok=True)
    return d


def remove_tree(top: Path) -> None:
    """Kill whatever is left below ``top`` and remove the directories, deepest first."""
    if not top.is_dir():
        return
    (top / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + 10
    while populated(top) and time.monotonic() < deadline:
        time.sleep(0.01)
    for dirpath, _, _ in sorted(os.walk(top), key=lambda w: -len(Path(w[0]).parts)):
        Path(dirpath).rmdir()


@dataclass(frozen=True)
class Container:
    id: str
    cgroup: Path


class Runc:
    """The host's runc with its state in a tmpfs and one shared read-only busybox rootfs."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.state_root = work / "runc-state"
        self.rootfs = work / "rootfs"
        self.gate = work / "gate"
        self.gate.mkdir()
        (self.rootfs / "bin").mkdir(parents=True)
        for d in ("proc", "dev", "tmp", "gate"):
            (self.rootfs / d).mkdir()
        shutil.copy2(BUSYBOX, self.rootfs / "bin" / "busybox")
        for applet in ("sh", "sleep"):
            (self.rootfs / "bin" / applet).symlink_to("busybox")
        self.started: list[Container] = []

    def _config(self, cgroups_path: str, script: str, own_pidns: bool) -> dict[str, Any]:
        namespaces = [{"type": t} for t in ("mount", "ipc", "uts")]
        if own_pidns:
            namespaces.append({"type": "pid"})
        return {
            "ociVersion": "1.0.2",
            "process": {
                "terminal": False,
                "user": {"uid": 0, "gid": 0},
                "args": ["sh", "-c", _GATED + script],
                "env": ["PATH=/bin"],
                "cwd": "/",
                "noNewPrivileges": True,
            },
            "root": {"path": str(self.rootfs), "readonly": True},
            "hostname": "borrower",
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]},
                {"destination": "/gate", "type": "bind", "source": str(self.gate), "options": ["rbind", "ro"]},
            ],
            "linux": {"cgroupsPath": cgroups_path, "namespaces": namespaces},
        }

    def _runc(self, *args: str, logs: Path) -> str:
        """runc's stdout; its stdout and stderr go to files under ``logs``, never to pipes: a
        detached container keeps them, and a pipe would then never reach EOF."""
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / "stdout", "w+") as out, open(logs / "stderr", "w+") as err:
            proc = subprocess.run(
                [RUNC, "--root", str(self.state_root), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                timeout=RUNC_TIMEOUT_S,
                check=False,
            )
            out.seek(0)
            err.seek(0)
            text, problem = out.read(), err.read()
        if proc.returncode != 0:
            raise AssertionError(f"runc {' '.join(args)} exited {proc.returncode}: {problem[-2000:]}")
        return text

    def run(self, container_id: str, cgroup_rel: str, script: str, *, own_pidns: bool = False) -> Container:
        """``runc run --detach`` one container whose cgroup is ``/<cgroup_rel>``."""
        bundle = self.work / "bundles" / container_id
        bundle.mkdir(parents=True)
        (bundle / "config.json").write_text(json.dumps(self._config("/" + cgroup_rel, script, own_pidns)))
        self._runc("run", "--detach", "--bundle", str(bundle), container_id, logs=bundle / "stdio")
        c = Container(container_id, CGROUP_ROOT / cgroup_rel)
        self.started.append(c)
        return c

    def open_gate(self) -> None:
        """Let every container started so far, and every one started later, run its script."""
        (self.gate / "open").touch()

    def statuses(self) -> dict[str, str]:
        """runc's status ("running", "stopped", ...) of every container it knows, by ID."""
        listed = json.loads(self._runc("list", "--format", "json", logs=self.work / "list")) or []
        return {str(c["id"]): str(c["status"]) for c in listed}

    def delete_all(self) -> None:
        """``runc delete --force`` every container started here (it also removes their cgroups)."""
        problems: list[str] = []
        for c in reversed(self.started):
            try:
                self._runc("delete", "--force", c.id, logs=self.work / "delete")
            except AssertionError as exc:
                problems.append(str(exc))
        self.started.clear()
        assert not problems, problems
