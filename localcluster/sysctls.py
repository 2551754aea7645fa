"""kubelet's global sysctls, put back when the last kubelet of ours stops.

kubelet sets six kernel sysctls on start (vm.overcommit_memory, kernel.panic, ...). They are global:
the machine's values are recorded once (in /run) before the first kubelet starts and written back
when the last kubelet of ours stops.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from localcluster.host import cmdline, pids_mentioning
from localcluster.layout import NODE_NAME

SYSCTL_DIR = Path("/proc/sys")
# What kubelet's container manager writes on start (pkg/kubelet/cm setupKernelTunables).
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# /run: cleared by a reboot, which also resets the sysctls.
SYSCTL_RECORD = Path("/run/gpushare-kube-sysctls.json")


def read_sysctls() -> dict[str, str]:
    return {k: (SYSCTL_DIR / k).read_text().strip() for k in KUBELET_SYSCTLS if (SYSCTL_DIR / k).exists()}


def write_sysctls(values: dict[str, str]) -> None:
    for key, value in values.items():
        path = SYSCTL_DIR / key
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value)


def our_kubelets() -> list[int]:
    """Live kubelets started by this harness (any cluster): their command line carries our node name."""
    found = []
    for pid in pids_mentioning(f"--hostname-override={NODE_NAME}"):
        argv = cmdline(pid)  # empty if it just exited
        if argv and Path(argv[0]).name == "kubelet" and any(a.startswith("--config=/tmp/") for a in argv):
            found.append(pid)
    return found


def record_sysctls(record: Path = SYSCTL_RECORD) -> None:
    """Before a kubelet starts: remember the machine's values, unless a record already exists.

    One record for the machine, not one per cluster: a second cluster started while a first
    kubelet runs would otherwise remember kubelet's values and put those "back".
    """
    record.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError), open(record, "x") as f:
        json.dump(read_sysctls(), f)


def restore_sysctls(record: Path = SYSCTL_RECORD) -> None:
    """After a kubelet stopped: when no kubelet of ours runs any more, write the record back."""
    if our_kubelets() or not record.exists():
        return
    with contextlib.suppress(OSError, ValueError):
        write_sysctls(json.loads(record.read_text()))
        record.unlink()
