"""A CPU boost for tasks already SIGKILLed: their exit runs now instead of behind their pod's CPU weight.

A killed task still has to be scheduled to run its exit, and kubelet gives a BestEffort pod and
its QoS cgroup the least CPU weight there is (v1 ``cpu.shares`` 2, v2 ``cpu.weight`` 1). On a
busy node the dying tasks of a borrower queue behind everything else while the owner waits.

CPU weights only count between siblings, so the raise goes all the way up: the killed pods'
cgroups and every cgroup above them to the top of the hierarchy (the QoS cgroup, ``kubepods``,
kubelet's ``cgroupRoot``) get the highest weight for the length of the kill: one write per
cgroup, whatever the number of tasks. On the way up the dying tasks then win against the node's
daemons, which the kill itself keeps busy (containerd's shims and runc tearing the containers
down took most of both cores in the 120 ms after a kill of 8 borrowers). Only pods whose every
task already has SIGKILL pending are raised at their own level, so no tenant's code runs on it;
every other pod keeps its weight relative to its siblings. When the last kill that raised a
cgroup ends, its weight is written back, unless someone (kubelet) wrote another since.

The weight is the cpu controller's alone: nothing that decides "dead" (the task hierarchies
on v1, ``cgroup.procs``/``populated`` on v2) moves. A node without a writable cpu controller
for pods gets no boost and the kill goes on without it.

An agent that dies during a kill must not leave ``kubepods`` at the highest weight (kubelet
writes it only when it starts): every raise is noted with the weight it replaced in a journal
(``/run/gpushare/exit-boost.json``, a tmpfs, so it goes with the cgroups at a reboot), and
``recover`` puts back whatever it still shows raised, when the agent starts again.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from podcgroups.cgroups import CGROUP_ROOT, PodCgroup
from podcgroups.errors import ExitBoostJournalError
from podcgroups.paths import CgroupVersion

V1_FILE, V1_MAX = "cpu.shares", "262144"  # the v1 maximum
V2_FILE, V2_MAX = "cpu.weight", "10000"  # the v2 maximum
_V1_CPU = ("cpu", "cpu,cpuacct")  # the cpu hierarchy's mount names below the v1 root
JOURNAL = Path("/run/gpushare/exit-boost.json")


@dataclass
class _Raised:
    holders: int
    original: str
    value: str


class ExitBoost:
    """Raises and restores CPU weights; one per process, shared by every kill (thread-safe)."""

    def __init__(self, journal: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._raised: dict[Path, _Raised] = {}
        self._journal = journal  # None: no journal (tests, tools); the agent's kills use JOURNAL

    def recover(self, cgroup_root: Path = Path(CGROUP_ROOT)) -> list[Path]:
        """Put back the weights a kill of an earlier run of this process raised and never restored
        (the journal), where they still show the raise; the weight files put back.

        Only a ``cpu.shares`` or ``cpu.weight`` file below ``cgroup_root`` is ever written; an entry
        naming anything else, or a journal that is not one, raises ``ExitBoostJournalError``
        naming what is wrong, after the journal is removed and nothing was written for it.
        """
        if self._journal is None or not self._journal.exists():
            return []
        try:
            noted = json.loads(self._journal.read_text())
        except (OSError, ValueError) as exc:
            self._drop_journal()
            raise ExitBoostJournalError(f"gpushare: {self._journal} is not a weight journal ({exc}); removed") from exc
        entries, bad = _journal_entries(noted, cgroup_root)
        restored: list[Path] = []
        for path, original, value in entries:
            with contextlib.suppress(OSError):
                if path.read_text().strip() == value:
                    path.write_text(original)
                    restored.append(path)
        self._drop_journal()
        if bad:
            raise ExitBoostJournalError(
                f"gpushare: {self._journal} held {len(bad)} entries that are no raised CPU weight below "
                f"{cgroup_root}, left alone: {'; '.join(bad[:3])}"
            )
        return restored

    def _drop_journal(self) -> None:
        if self._journal is not None:
            with contextlib.suppress(OSError):
                self._journal.unlink()

    def raise_for(self, pods: Iterable[PodCgroup]) -> list[Path]:
        """Give these pods, and their QoS cgroups, the highest weight; the weight files now held
        (pass them to ``restore``). A file that cannot be read or written is skipped."""
        held: list[Path] = []
        for path, value in sorted({w for cg in pods for w in weight_files(cg)}):
            with self._lock:
                entry = self._raised.get(path)
                if entry is not None:
                    entry.holders += 1
                    held.append(path)
                    continue
                try:
                    original = path.read_text().strip()
                    if original != value:
                        path.write_text(value)
                except OSError:
                    continue  # no cpu controller there, or the pod is already gone
                self._raised[path] = _Raised(1, original, value)
                held.append(path)
                self._write_journal()
        return held

    def restore(self, held: Sequence[Path]) -> None:
        """Release what ``raise_for`` gave; the last holder writes the weight back."""
        for path in held:
            with self._lock:
                entry = self._raised.get(path)
                if entry is None:
                    continue
                entry.holders -= 1
                if entry.holders > 0:
                    continue
                del self._raised[path]
                self._write_journal()
                try:
                    if entry.original != entry.value and path.read_text().strip() == entry.value:
                        path.write_text(entry.original)
                except OSError:
                    pass  # the pod's cgroup is gone with the pod: nothing to give back

    def _write_journal(self) -> None:
        """Under the lock: the weights raised now and what they replaced, or no journal when none is."""
        if self._journal is None:
            return
        with contextlib.suppress(OSError):
            if not self._raised:
                self._journal.unlink(missing_ok=True)
                return
            self._journal.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._journal.with_suffix(".tmp")
            tmp.write_text(json.dumps({str(p): [e.original, e.value] for p, e in self._raised.items()}))
            os.replace(tmp, self._journal)

    def raised(self) -> dict[Path, str]:
        """Weight file -> the value it had before, for every weight raised now (status, tests)."""
        with self._lock:
            return {p: e.original for p, e in self._raised.items()}


def _journal_entries(noted: object, cgroup_root: Path) -> tuple[list[tuple[Path, str, str]], list[str]]:
    """(weight file, original, raised value) for each well-formed entry, and a description of each other."""
    if not isinstance(noted, dict):
        return [], [f"the journal is a {type(noted).__name__}, not an object"]
    good: list[tuple[Path, str, str]] = []
    bad: list[str] = []
    for key, entry in sorted(noted.items()):
        path = Path(str(key))
        ok_entry = (
            isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) and x.isdecimal() for x in entry)
        )
        below = path.is_absolute() and ".." not in path.parts and path.is_relative_to(cgroup_root)
        if not (ok_entry and below and path.name in (V1_FILE, V2_FILE)):
            bad.append(f"{str(key)[:120]!r}: {str(entry)[:40]}")
            continue
        good.append((path, entry[0], entry[1]))
    return good, bad


def weight_files(cg: PodCgroup) -> list[tuple[Path, str]]:
    """(weight file, highest value) of the pod's cgroup and of every cgroup above it, below the
    hierarchy's root (which has no weight), where they exist."""
    layout = cg.layout
    out: list[tuple[Path, str]] = []
    for pod_dir in cg.dirs:
        try:
            rel = pod_dir.relative_to(layout.root)
        except ValueError:
            continue
        levels = [rel, *list(rel.parents)[:-1]]  # the pod, then up to the top, "." left out
        if layout.version is CgroupVersion.V2:
            out += [(layout.root / level / V2_FILE, V2_MAX) for level in levels]
            continue
        base = next((layout.root.parent / n for n in _V1_CPU if (layout.root.parent / n / V1_FILE).exists()), None)
        if base is not None:
            out += [(base / level / V1_FILE, V1_MAX) for level in levels]
    return out


__all__ = ["JOURNAL", "ExitBoost", "ExitBoostJournalError", "weight_files"]
