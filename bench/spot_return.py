"""Spot return, measured on the product: the real agent process on the real one-node cluster.

    .venv/bin/python bench/spot_return.py [--returns 200] [--sizes 1,4,8,16] [--minutes M] [--quick]
        [--shape one-owner|owner-per-borrower] [--json OUT] [--agent-log FILE]

What runs: a private one-node cluster (localcluster: etcd, kube-apiserver, scheduler,
controller-manager, kubelet, containerd 2.4.2 + runc), the fake vendor device plugin with 16
fake GPUs, the fake dcgm file (every GPU at 0 %), and ``gpushare agent`` as a host process —
its real loop, its real ``KubeClient``, PodResources, device plugins, NRI plugin and spot
runtime. The one thing stood in for is gpukmod, which cannot load on this host: the agent runs
with ``--kmod-socket`` (controller/spot/notice_socket.py), so the owner's return enters the
agent where the kernel's notice enters it (the bridge's notice thread), and every gpukmod
command the agent sends comes back here stamped with the agent's CLOCK_MONOTONIC (same host,
same clock).

Per size N (1, 4, 8, 16) the owners are lendable and idle, so after the idle window (1 s here)
the agent lends their GPUs and watches their pid namespaces (``detect``). ``--shape``:

- ``one-owner`` (default): one owner pod holds the N GPUs, as the product promises; each
  borrower gets one of them (the NRI plugin takes it from the vendor plugin's own ``Allocate``
  answer for that GPU, docs/nri.md);
- ``owner-per-borrower``: N owner pods of one GPU each, all returning at the same instant (N
  notices in one write): N borrowers die per return, through N notices the agent handles
  one after another on its notice thread. For N = 1 both shapes are the same.

Then, per return:

1. N borrower pods (busybox under containerd 2.4.2: three sleepers and a loop forking every
   10 ms, requesting ``gpushare/spot-gpu``) are created at once and run;
2. once the agent's ``/status`` shows them lent (a pass that began after their trees were up;
   an annotation written on one of them asks for that pass at once) the bench writes
   ``notice <pidns>`` — the owner container's ``/proc/<pid>/ns/pid`` inode, read here — and
   starts the clock just before that write;
3. it measures, from that instant:
   - **dead**: every task of every borrower pod gone, seen by this process polling the pods'
     cgroups (the ``pids`` hierarchy on v1; the agent decides in ``freezer``) every ~1 ms; then
     every borrower pid it listed before the notice must be gone, a zombie, or inside do_exit;
   - **released**: the timestamp of the agent's ``release <pidns>`` command (the last owner's);
   - **API**: every borrower pod deleted (deletionTimestamp or gone) and its ``OwnerBack``
     Event written, as this process's watch on the API server sees them arrive;
4. until the pods are gone it keeps looking at their cgroups: a task there again (kubelet
   restarting a killed container before the delete reaches it) is a borrower back on the
   owner's GPU, reported per return and failing the run;
5. it waits until the pods are gone and the owners are away again, and starts the next return.

Prints per N and latency: n, p50 with its 95 % bootstrap interval, p99 (bench/stats.py: n/a
below 200 samples), max, beside the figures from before (docs/spot.md), plus each return's wall
time and what a full ``--returns 200`` run would take. Goals (judged only with p99, so with 200
returns of that size): return -> owner released p99 < 100 ms at 8 borrowers and < 150 ms at 16,
what an owner of a lent 8- or 16-GPU machine waits. ``--minutes`` splits a
wall-time budget evenly over the sizes and runs as many returns as fit (at most ``--returns``).

Needs root and the cluster binaries and images (``make kube-deps``). Brings up its own cluster
and removes it, with every pod and process it started, at the end. Exit status 1 when a goal is
missed, a size failed, or a borrower came back.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import http.client
import json
import os
import shutil
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stats import estimate_median, format_percentile, median, tail_percentile  # noqa: E402
from deviceplugins.policies import FAKE_DEVICE_PREFIX  # noqa: E402
from gpumetrics.fake_exporter import FakeGpu, write_dcgm  # noqa: E402
from gpushare import keys  # noqa: E402
from localcluster.agent import FAKE_RESOURCE, AgentProcess, FakeGpus, process_agent  # noqa: E402
from localcluster.bringup import running_cluster  # noqa: E402
from localcluster.cluster import Cluster  # noqa: E402
from localcluster.pods import pod_manifest  # noqa: E402
from tests.harness.worlds.spot import spot_settings  # noqa: E402
from tests.integration.spot.trees import tree_script  # noqa: E402

GPUS = 16
SIZES = "1,4,8,16"
RETURNS = 200
QUICK_RETURNS = 2
SHAPES = ("one-owner", "owner-per-borrower")
IDLE_WINDOW_S = 1.0
POLL_S = 0.001  # the bench's cgroup poll period: its resolution for "dead"
TASKS_PER_POD = 6  # pause + sh + 3 sleepers + the fork loop's shell
OWNER_NS, SPOT_NS = "team", "spot"
# Borrowers -> the owner's release p99 (ms) it must stay under: what the owner of a lent machine waits.
RELEASE_GOALS = {8: 100.0, 16: 150.0}
# docs/spot.md, before the agent was measured as a process: (p50, largest of the runs) in ms.
BEFORE = {
    1: "trees 2.95/29.1, containers 17.2/26.7",
    4: "trees 9.1/30.0, containers 44.2/90.2",
    16: "trees 30.1/64.8, containers 83.1/116.4",
}
LATENCIES = (
    ("dead", "return -> every borrower task dead"),
    ("released", "return -> owner released"),
    ("api", "return -> pods deleted + Events"),
)


class BenchError(RuntimeError):
    """A return that did not happen as the product promises, or a step that timed out."""


def wait_until(what: str, ok: Callable[[], bool], timeout_s: float, step_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(step_s)


# -- the other end of `gpushare agent --kmod-socket` ---------------------------------------------


@dataclass(frozen=True)
class KmodCommand:
    verb: str
    at: float  # the agent's CLOCK_MONOTONIC, in seconds
    ids: tuple[int, ...]


class KmodPeer:
    """Listens where the agent connects instead of gpukmod; records its commands, sends notices."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(4)
        self._server.settimeout(0.5)
        self._cond = threading.Condition()
        self._conn: socket.socket | None = None
        self._stop = threading.Event()
        self.commands: list[KmodCommand] = []
        self.connections = 0
        threading.Thread(target=self._accept, name="bench-kmod-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._cond:
                self._conn = conn
                self.connections += 1
            threading.Thread(target=self._read, args=(conn,), name="bench-kmod-read", daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        buf = b""
        with contextlib.suppress(OSError):
            while chunk := conn.recv(4096):
                *lines, buf = (buf + chunk).split(b"\n")
                parsed = [line.decode().split() for line in lines]
                with self._cond:
                    for verb, t_ns, *ids in parsed:
                        self.commands.append(KmodCommand(verb, int(t_ns) / 1e9, tuple(int(i) for i in ids)))
                    self._cond.notify_all()

    def notice(self, *pidns: int) -> float:
        """Send the notices in one write; returns the monotonic time just before it: the return's t0."""
        with self._cond:
            conn = self._conn
        if conn is None:
            raise BenchError("the agent never connected to the kmod socket")
        line = "".join(f"notice {p}\n" for p in pidns).encode()
        t0 = time.monotonic()
        conn.sendall(line)
        return t0

    def last_state(self, pidns: int) -> str:
        """The last of detect/undetect/release/delete the agent sent for ``pidns`` ("" if none)."""
        with self._cond:
            for cmd in reversed(self.commands):
                if pidns in cmd.ids and cmd.verb in ("detect", "undetect", "release", "delete"):
                    return cmd.verb
        return ""

    def detected(self) -> set[int]:
        with self._cond:
            return {i for c in self.commands if c.verb == "detect" for i in c.ids}

    def wait_command(self, verb: str, pidns: int, after: float, timeout_s: float) -> float:
        """The agent's time of its first ``verb`` for ``pidns`` sent at or after ``after``."""

        def find() -> float | None:
            return next((c.at for c in self.commands if c.verb == verb and pidns in c.ids and c.at >= after), None)

        with self._cond:
            if not self._cond.wait_for(lambda: find() is not None, timeout_s):
                raise BenchError(f"the agent sent no {verb} {pidns} within {timeout_s:.0f} s of the notice")
            at = find()
        assert at is not None
        return at

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            conn = self._conn
        if conn is not None:
            conn.close()
        self._server.close()


# -- the API server as it changes: pods and Events in the borrowers' namespace ----------------------


@dataclass
class PodSeen:
    name: str
    phase: str = ""
    deleting_at: float | None = None  # first watch event with a deletionTimestamp (or DELETED)
    gone_at: float | None = None
    events: dict[str, float] = field(default_factory=dict)  # reason -> arrival of its first Event
    status: dict[str, Any] = field(default_factory=dict)  # the latest pod status seen

    def create_error(self) -> str:
        """Why kubelet could not create a container of the pod ("" when it could), e.g. an NRI refusal."""
        for st in self.status.get("containerStatuses") or ():
            waiting = (st.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in ("CreateContainerError", "RunContainerError"):
                return f"{waiting['reason']}: {waiting.get('message', '')}"
        return ""

    def describe(self) -> str:
        why = " ".join(x for x in (self.status.get("reason", ""), self.status.get("message", "")) if x)
        return f"{self.name}: {self.phase or '?'} {why} {self.create_error()}".rstrip()


class ApiWatch:
    """Two watch streams (pods, Events) of one namespace, each object stamped with its arrival."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self._cluster = cluster
        self._ns = namespace
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._conns: list[http.client.HTTPSConnection] = []
        self.pods: dict[str, PodSeen] = {}  # by uid
        self._early_events: dict[str, dict[str, float]] = {}  # Events whose pod was not seen yet
        pki = cluster.layout.pki
        self._ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self._ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        for resource, handle in (("pods", self._on_pod), ("events", self._on_event)):
            threading.Thread(
                target=self._stream, args=(resource, handle), name=f"bench-watch-{resource}", daemon=True
            ).start()

    def _stream(self, resource: str, handle: Callable[[str, dict[str, Any], float], None]) -> None:
        path = f"/api/v1/namespaces/{self._ns}/{resource}"
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    doc = self._cluster.request("GET", path)
                    rv = doc["metadata"]["resourceVersion"]
                    for item in doc["items"]:
                        handle("ADDED", item, time.monotonic())
                rv = self._watch(path, rv, handle)
            except (OSError, http.client.HTTPException, ValueError, KeyError):
                if self._stop.wait(0.2):
                    return

    def _watch(self, path: str, rv: str, handle: Callable[[str, dict[str, Any], float], None]) -> str:
        """One watch request from ``rv``; returns where to go on ("" = list again)."""
        conn = http.client.HTTPSConnection("127.0.0.1", self._cluster.ports.apiserver, context=self._ctx, timeout=330)
        self._conns.append(conn)
        try:
            conn.request("GET", f"{path}?watch=1&resourceVersion={rv}&timeoutSeconds=300&allowWatchBookmarks=true")
            resp = conn.getresponse()
            if resp.status != 200:
                return ""
            for line in resp:
                event = json.loads(line)
                at = time.monotonic()
                if event["type"] == "ERROR":  # 410 Gone: too old to resume
                    return ""
                rv = event["object"]["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    handle(event["type"], event["object"], at)
            return rv
        finally:
            conn.close()
            self._conns.remove(conn)

    def _on_pod(self, etype: str, pod: dict[str, Any], at: float) -> None:
        meta = pod["metadata"]
        with self._cond:
            seen = self.pods.setdefault(meta["uid"], PodSeen(meta["name"]))
            seen.events.update({r: t for r, t in self._early_events.pop(meta["uid"], {}).items()})
            seen.status = pod.get("status") or {}
            seen.phase = seen.status.get("phase", "")
            if (meta.get("deletionTimestamp") or etype == "DELETED") and seen.deleting_at is None:
                seen.deleting_at = at
            if etype == "DELETED":
                seen.gone_at = at
            self._cond.notify_all()

    def _on_event(self, etype: str, event: dict[str, Any], at: float) -> None:
        uid = (event.get("involvedObject") or {}).get("uid", "")
        reason = event.get("reason", "")
        with self._cond:
            seen = self.pods.get(uid)
            target = seen.events if seen is not None else self._early_events.setdefault(uid, {})
            target.setdefault(reason, at)
            self._cond.notify_all()

    def wait(self, what: str, ok: Callable[[], bool], timeout_s: float) -> None:
        """Until ``ok()``, asked on every watch event and at least every 0.5 s."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not ok():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(f"timed out after {timeout_s:.0f} s waiting for {what} (API watch)")
                self._cond.wait(min(left, 0.5))

    def close(self) -> None:
        self._stop.set()
        for conn in list(self._conns):
            with contextlib.suppress(OSError):
                if conn.sock is not None:
                    conn.sock.shutdown(socket.SHUT_RDWR)


# -- the pods' cgroups, read by the bench itself ------------------------------------------------------


class PodCgroups:
    """kubelet's pod cgroups (cgroupfs driver) in one hierarchy: ``pids`` on v1, the unified tree on v2."""

    def __init__(self, kubelet_cgroup_root: str) -> None:
        v1 = Path("/sys/fs/cgroup/pids/cgroup.procs").exists()
        base = Path("/sys/fs/cgroup/pids") if v1 else Path("/sys/fs/cgroup")
        self.version = "v1 (pids hierarchy)" if v1 else "v2"
        self.kubepods = base / kubelet_cgroup_root.lstrip("/") / "kubepods"

    def pod_dir(self, uid: str) -> Path | None:
        for qos in ("", "besteffort", "burstable"):
            d = self.kubepods / qos / f"pod{uid}"
            if d.is_dir():
                return d
        return None

    @staticmethod
    def dirs(pod_dir: Path) -> list[Path]:
        return [Path(d) for d, _, _ in os.walk(pod_dir)]

    @staticmethod
    def pids(d: Path) -> list[int]:
        try:
            return [int(p) for p in (d / "cgroup.procs").read_text().split()]
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENODEV):  # removed (ENODEV: while we read it)
                return []
            raise

    def tasks(self, pod_dir: Path) -> list[int]:
        return [p for d in self.dirs(pod_dir) for p in self.pids(d)]

    def wait_empty(self, pod_dirs: list[Path], t0: float, timeout_s: float = 10.0) -> tuple[float, float]:
        """Poll until no cgroup below any pod lists a task. Returns (alive, empty): the start of the
        last read that still found a task and the end of the poll that first found none, so the last
        task died between the two, however late this process was scheduled."""
        live = [d for pod in pod_dirs for d in self.dirs(pod)]
        alive_at = t0
        while True:
            still = []
            for d in live:
                before_read = time.monotonic()
                if self.pids(d):
                    still.append(d)
                    alive_at = before_read
            live = still
            if not live:
                empty_at = time.monotonic()
                # A cgroup made since the list was taken (a container started late) counts too.
                live = [d for pod in pod_dirs if pod.is_dir() for d in self.dirs(pod) if self.pids(d)]
                if not live:
                    return alive_at, empty_at
            if time.monotonic() - t0 > timeout_s:
                raise BenchError(f"borrower tasks alive {timeout_s:.0f} s after the notice: {live}")
            time.sleep(POLL_S)


PF_EXITING = 0x4  # include/linux/sched.h: the task is inside do_exit


def process_identity(pid: int) -> tuple[int, int] | None:
    """(pid, start time) of a process that still exists and is no zombie; None otherwise."""
    stat = _stat(pid)
    return None if stat is None or stat[0] in ("Z", "X") else (pid, int(stat[19]))


class Comeback:
    """Looks at the borrower pods' cgroups after the kill until stopped; notes the first task that
    appears again there with a GPU device node in its ``/dev`` (kubelet restarting a killed
    container before the delete reaches it): a borrower back on the owner's GPU.

    A task without one is not counted: after the kill kubelet starts the pod's sandbox again
    (the pause process holds no device), and then tries the borrower container, which the NRI
    plugin refuses once the lend has ended (docs/nri.md)."""

    PERIOD_S = 0.02  # coarse: it detects, the kill's own timing is wait_empty's

    def __init__(self, cgroups: PodCgroups, pod_dirs: list[Path]) -> None:
        self._cgroups = cgroups
        self._pod_dirs = pod_dirs
        self._stop = threading.Event()
        self.first_at: float | None = None
        self.what = ""
        self._thread = threading.Thread(target=self._run, name="bench-comeback", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.PERIOD_S):
            for pod in self._pod_dirs:
                pids = [p for p in self._shallow(pod) if sees_gpu(p)]
                if pids:
                    self.first_at = time.monotonic()
                    self.what = describe(pids[:1]).strip()
                    return

    def _shallow(self, pod: Path) -> list[int]:
        """Tasks of the pod and of its containers (one level down: where kubelet puts a new container)."""
        try:
            children = [Path(e.path) for e in os.scandir(pod) if e.is_dir()]
        except FileNotFoundError:
            return []
        return [p for d in (pod, *children) for p in self._cgroups.pids(d)]

    def stop(self) -> float | None:
        self._stop.set()
        self._thread.join(2.0)
        return self.first_at


def sees_gpu(pid: int) -> bool:
    """Whether the task's mount namespace has a fake GPU node in /dev (what a lent bundle adds)."""
    try:
        return any(name.startswith(FAKE_DEVICE_PREFIX) for name in os.listdir(f"/proc/{pid}/root/dev"))
    except OSError:
        return False  # gone already, or not yet set up: nothing to hold


def liveness(pid: int, started: int) -> str:
    """``gone`` (exited, a zombie, or the pid reused), ``exiting`` (inside do_exit: it runs no user
    code any more, and past cgroup_exit it has closed its files and dropped its memory) or
    ``running``; from one read of /proc/<pid>/stat, so a task that exits meanwhile is not misread."""
    stat = _stat(pid)
    if stat is None or stat[0] in ("Z", "X") or int(stat[19]) != started:
        return "gone"
    return "exiting" if int(stat[6]) & PF_EXITING else "running"


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from the state field on (index 0 = state, 6 = flags, 19 = start time)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def describe(pids: list[int]) -> str:
    """What a failure report needs to know of each pid: its state, flags, command line and cgroups."""
    out = []
    for pid in pids:
        stat = _stat(pid) or ["?"] * 20
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            cgroups = Path(f"/proc/{pid}/cgroup").read_text().replace("\n", "; ")
        except OSError as exc:
            cmd, cgroups = f"({exc})", ""
        out.append(f"pid {pid} state {stat[0]} flags {stat[6]} cmd {cmd!r} cgroups {cgroups}")
    return "\n  ".join(["", *out])


def pidns_of_container(cgroups: PodCgroups, pod_uid: str, container_id: str) -> int:
    """The pid-namespace inode of the container's processes, read from /proc/<pid>/ns/pid."""
    pod_dir = cgroups.pod_dir(pod_uid)
    pids = cgroups.pids(pod_dir / container_id) if pod_dir is not None else []
    if not pids:
        raise BenchError(f"no process in the cgroup of container {container_id} (pod {pod_uid})")
    return os.stat(f"/proc/{pids[0]}/ns/pid").st_ino


# -- one size: the owners, their N borrowers and the returns ------------------------------------------------


@dataclass
class Return:
    dead_ms: float  # the first poll that found every borrower cgroup empty ended
    alive_ms: float  # the last read that still found a task began (0: none after the notice)
    released_ms: float  # the last owner released (one owner unless --shape owner-per-borrower)
    api_ms: float
    wall_s: float  # the whole cycle: owners away again -> borrowers up -> return -> pods gone
    exiting: int  # borrower pids still inside do_exit (no zombie yet) when their cgroups emptied
    came_back_ms: float | None  # a task in a borrower pod again after the kill (kubelet restarted it)
    came_back: str  # that task
    phases_s: dict[str, float]
    agent: dict[str, Any]  # the agent's own last_return (its clock, from the notice's arrival)


@dataclass(frozen=True)
class Owner:
    name: str
    gpus: int
    uid: str
    pidns: int

    @property
    def key(self) -> str:
        return f"{OWNER_NS}/{self.name}/app"


class Bench:
    def __init__(self, cluster: Cluster, agent: AgentProcess, peer: KmodPeer, watch: ApiWatch) -> None:
        self.cluster = cluster
        self.agent = agent
        self.peer = peer
        self.watch = watch
        self.cgroups = PodCgroups(cluster.layout.cgroup_root)
        self.pool = ThreadPoolExecutor(max_workers=GPUS, thread_name_prefix="bench-create")

    def fail(self, why: str) -> BenchError:
        tail = "\n".join(self.agent.log_text().splitlines()[-40:])
        return BenchError(f"{why}\nagent log tail:\n{tail}")

    def spot_of(self, owners: list[Owner]) -> list[dict[str, Any]]:
        keys_ = {o.key for o in owners}
        return [g for g in self.agent.status()["spot"] if g["owner"] in keys_]

    def start_owners(self, n: int, shape: str) -> list[Owner]:
        """``one-owner``: one pod holding n GPUs; ``owner-per-borrower``: n pods holding one each."""
        count, gpus = (1, n) if shape == "one-owner" else (n, 1)
        names = [f"owner-n{n}" if count == 1 else f"owner-n{n}-{i}" for i in range(count)]

        def start(name: str) -> Owner:
            m = pod_manifest(
                name, namespace=OWNER_NS, resources={FAKE_RESOURCE: str(gpus)}, labels={keys.LABEL_LENDABLE: "true"}
            )
            uid = self.cluster.request("POST", f"/api/v1/namespaces/{OWNER_NS}/pods", m)["metadata"]["uid"]
            pod = self.cluster.wait_pod_phase(name, ["Running"], namespace=OWNER_NS, timeout_s=120)
            cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
            return Owner(name, gpus, uid, pidns_of_container(self.cgroups, uid, cid))

        owners = list(self.pool.map(start, names))
        what = f"the agent to see {count} owner(s) with {n} GPUs in all"
        wait_until(what, lambda: len(self.spot_of(owners)) == n, 60, 0.1)
        return owners

    def stop_owners(self, owners: list[Owner]) -> None:
        names = [o.name for o in owners]
        self.cluster.kubectl("delete", "pod", "-n", OWNER_NS, *names, "--wait=true", "--timeout=120s")
        wait_until("the agent to forget the owners", lambda: not self.spot_of(owners), 60, 0.1)

    def wait_away(self, owners: list[Owner]) -> None:
        """Every GPU of the owners lent out again and every owner's pid namespace armed."""

        def away() -> bool:
            states = {g["state"] for g in self.spot_of(owners)}
            return states == {"away"} and all(self.peer.last_state(o.pidns) == "detect" for o in owners)

        try:
            wait_until("the owners away and armed", away, 60, 0.05)
        except BenchError as exc:
            detected, ours = self.peer.detected(), {o.pidns for o in owners}
            if detected and not ours <= detected:
                raise self.fail(f"the agent watches pid namespaces {detected}, the owners' are {ours}") from exc
            raise self.fail(str(exc)) from exc

    def create_borrowers(self, n: int, cycle: int) -> dict[str, str]:
        """n borrower pods created at once; their uids -> names."""

        def create(i: int) -> tuple[str, str]:
            name = f"b{n}-{cycle}-{i}"
            m = pod_manifest(name, namespace=SPOT_NS, resources={keys.RESOURCE_SPOT_GPU: "1"})
            m["spec"]["containers"][0]["command"] = ["sh", "-c", tree_script(3, forker=True)]
            doc = self.cluster.request("POST", f"/api/v1/namespaces/{SPOT_NS}/pods", m)
            return doc["metadata"]["uid"], name

        return dict(self.pool.map(create, range(n)))

    def wait_running(self, pods: dict[str, str]) -> dict[str, Path]:
        """Every borrower Running with its whole tree in its pod cgroup; uid -> pod cgroup."""

        def seen() -> list[PodSeen]:
            return [self.watch.pods.get(uid, PodSeen(name)) for uid, name in pods.items()]

        refused_since: list[float] = []

        def settled() -> bool:
            if any(p.create_error() for p in seen()):
                refused_since.append(time.monotonic())
                # kubelet retries a refused create; refused for 10 s means refused for good.
                return refused_since[-1] - refused_since[0] > 10.0
            refused_since.clear()
            return {p.phase for p in seen()} <= {"Running", "Failed", "Succeeded"}

        try:
            self.watch.wait("the borrowers Running", settled, 120)
        except BenchError as exc:
            raise self.fail(f"{exc}:\n  " + "\n  ".join(p.describe() for p in seen())) from exc
        if not_running := [p.describe() for p in seen() if p.phase != "Running"]:
            raise self.fail("borrowers not running:\n  " + "\n  ".join(not_running))
        dirs: dict[str, Path] = {}

        def trees_up() -> bool:
            for uid in pods:
                d = dirs.get(uid) or self.cgroups.pod_dir(uid)
                if d is None or len(self.cgroups.tasks(d)) < TASKS_PER_POD:
                    return False
                dirs[uid] = d
            return True

        wait_until("every borrower's process tree", trees_up, 60)
        return dirs

    def wait_armed(self, owners: list[Owner], pods: dict[str, str], since: float) -> None:
        """A pass that began after the trees were up lent every GPU to these borrowers."""
        want = {f"{SPOT_NS}/{name}" for name in pods.values()}
        keys_ = {o.key for o in owners}

        def armed() -> bool:
            status = self.agent.status()
            gpus = [g for g in status["spot"] if g["owner"] in keys_]
            lent = {b for g in gpus for b in g["borrowers"]}
            return status["at"] > since and all(g["state"] == "stolen" for g in gpus) and lent == want

        wait_until("the agent to lend to every borrower", armed, 60, 0.05)

    def wake_pass(self, pods: dict[str, str], cycle: int) -> None:
        """Have the agent run a pass now rather than at its next --period: any change to a pod on its node does."""
        name = next(iter(pods.values()))
        patch = {"metadata": {"annotations": {"bench.gpushare.k8s.io/trees-up": str(cycle)}}}
        path = f"/api/v1/namespaces/{SPOT_NS}/pods/{name}"
        self.cluster.request("PATCH", path, patch, content_type="application/merge-patch+json")

    def one_return(self, owners: list[Owner], n: int, cycle: int) -> Return:
        phases: dict[str, float] = {}
        start = mark = time.monotonic()

        def phase(name: str) -> None:
            nonlocal mark
            now = time.monotonic()
            phases[name] = now - mark
            mark = now

        self.wait_away(owners)
        phase("owners away")
        pods = self.create_borrowers(n, cycle)
        dirs = self.wait_running(pods)
        phase("borrowers up")
        since = time.time()
        self.wake_pass(pods, cycle)
        self.wait_armed(owners, pods, since)
        phase("lent")
        before = {ident for d in dirs.values() for p in self.cgroups.tasks(d) if (ident := process_identity(p))}
        errors_before = self.agent.status()["spot_runtime"]["kill_errors"]

        t0 = self.peer.notice(*(o.pidns for o in owners))
        alive, dead = self.cgroups.wait_empty(list(dirs.values()), t0)
        # Every pid listed before the notice: gone, a zombie, or inside do_exit past cgroup_exit.
        states = {pid: liveness(pid, started) for pid, started in before}
        running = [pid for pid, state in states.items() if state == "running"]
        if running:
            raise self.fail(f"borrower pids still running after their pod cgroups emptied: {describe(running)}")
        comeback = Comeback(self.cgroups, list(dirs.values()))
        try:
            released = max(self.peer.wait_command("release", o.pidns, t0, 10) for o in owners)
            api = self.wait_deleted(pods)
            phase("return")
            self.watch.wait("the borrower pods gone", lambda: all(self.watch.pods[u].gone_at for u in pods), 120)
            phase("pods gone")
        finally:
            back_at = comeback.stop()
        status = self.agent.status()["spot_runtime"]
        if status["kill_errors"] != errors_before:
            raise self.fail(f"the agent counted kill errors: {errors_before} -> {status['kill_errors']}")
        return Return(
            dead_ms=(dead - t0) * 1000,
            alive_ms=(alive - t0) * 1000,
            released_ms=(released - t0) * 1000,
            api_ms=(api - t0) * 1000,
            wall_s=time.monotonic() - start,
            exiting=sum(1 for state in states.values() if state == "exiting"),
            came_back_ms=None if back_at is None else (back_at - t0) * 1000,
            came_back=comeback.what,
            phases_s=phases,
            agent=status["last_return"],
        )

    def wait_deleted(self, pods: dict[str, str]) -> float:
        """When the last borrower was both deleted and given its OwnerBack Event, as the watch saw them."""

        def done_at(seen: PodSeen | None) -> float | None:
            if seen is None or seen.deleting_at is None or "OwnerBack" not in seen.events:
                return None
            return max(seen.deleting_at, seen.events["OwnerBack"])

        self.watch.wait(
            "the borrowers deleted with OwnerBack Events",
            lambda: all(done_at(self.watch.pods.get(u)) is not None for u in pods),
            30,
        )
        return max(done_at(self.watch.pods.get(u)) or 0.0 for u in pods)

    def run_size(self, n: int, shape: str, returns: int, budget_s: float | None) -> list[Return]:
        owners = self.start_owners(n, shape)
        out: list[Return] = []
        started = time.monotonic()
        try:
            for cycle in range(returns):
                if out and budget_s is not None:
                    left = budget_s - (time.monotonic() - started)
                    if left < median([r.wall_s for r in out]):
                        break
                r = self.one_return(owners, n, cycle)
                out.append(r)
                print(
                    f"  n={n:2d} return {cycle + 1:3d}: dead {r.alive_ms:6.2f}..{r.dead_ms:6.2f} ms, "
                    f"released {r.released_ms:7.2f} ms, "
                    f"API {r.api_ms:7.1f} ms, in do_exit {r.exiting}, "
                    f"{'tasks back at ' + format(r.came_back_ms, '.0f') + ' ms, ' if r.came_back_ms else ''}"
                    f"cycle {r.wall_s:5.2f} s "
                    f"({', '.join(f'{k} {v:.2f}' for k, v in r.phases_s.items())})",
                    flush=True,
                )
        finally:
            # A failed return leaves its borrowers behind; they must not meet the next size's owners.
            self.cluster.kubectl("delete", "pods", "-n", SPOT_NS, "--all", "--wait=true", "--timeout=120s")
            self.stop_owners(owners)
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=True)


# -- the environment ---------------------------------------------------------------------------------


@contextlib.contextmanager
def environment(root: Path) -> Iterator[Bench]:
    """Cluster, 16 fake GPUs, the metrics file, the kmod peer, the agent; all removed after."""
    with running_cluster() as cluster:
        for ns in (OWNER_NS, SPOT_NS):
            cluster.kubectl("create", "namespace", ns, check=False)
        metrics = root / "metrics" / "dcgm.prom"
        metrics.parent.mkdir()
        write_dcgm(metrics, [FakeGpu(f"fakegpu{i}", 0.0) for i in range(GPUS)])
        peer = KmodPeer(root / "kmod.sock")
        base = spot_settings(cluster, metrics)
        settings = dataclasses.replace(
            base,
            config={**base.config, "idleWindow": f"{IDLE_WINDOW_S}s"},
            args=(*base.args, "--kmod-socket", str(peer.path)),
        )
        gpus = FakeGpus(root, str(cluster.device_plugin_dir), count=GPUS)
        agent = process_agent(cluster, root, settings)
        watch = ApiWatch(cluster, SPOT_NS)
        bench = Bench(cluster, agent, peer, watch)
        try:
            gpus.start()
            wait_until(f"{FAKE_RESOURCE}={GPUS}", lambda: allocatable(cluster, FAKE_RESOURCE) == str(GPUS), 60, 0.2)
            agent.start()
            agent.wait_healthy()
            wait_until("the agent on the kmod socket", lambda: peer.connections > 0, 30)
            mode = agent.status()["spot_runtime"]["mode"]
            if mode != "kernel module + utilization":
                raise BenchError(f"the agent does not take returns from the kmod socket: spot mode {mode!r}")
            yield bench
        finally:
            for ns in (SPOT_NS, OWNER_NS):
                cluster.kubectl("delete", "pods", "-n", ns, "--all", "--wait=true", "--timeout=120s", check=False)
            bench.close()
            watch.close()
            agent.close()
            gpus.stop()
            peer.close()


def allocatable(cluster: Cluster, resource: str) -> str:
    return str(cluster.node()["status"]["allocatable"].get(resource, ""))


# -- the report ---------------------------------------------------------------------------------------


def summarize(results: dict[int, list[Return]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n, rets in results.items():
        if not rets:
            continue
        row: dict[str, Any] = {"returns": len(rets), "cycle_median_s": median([r.wall_s for r in rets])}
        for key, _ in LATENCIES:
            samples = [getattr(r, f"{key}_ms") for r in rets]
            est = estimate_median(samples)
            row[key] = {
                "p50_ms": est.median,
                "ci95_ms": [est.low, est.high] if est.has_interval else None,
                "p99_ms": tail_percentile(samples, 99),
                "max_ms": max(samples),
                "samples_ms": samples,
            }
        agent_dead = [r.agent["return_to_dead_ms"] for r in rets if "return_to_dead_ms" in r.agent]
        agent_rel = [r.agent["release_ms"] for r in rets if "release_ms" in r.agent]
        row["agent_view"] = {
            "return_to_dead_p50_ms": median(agent_dead) if agent_dead else None,
            "release_p50_ms": median(agent_rel) if agent_rel else None,
        }
        row["released_while_a_task_was_read"] = sum(1 for r in rets if r.released_ms < r.alive_ms)
        row["dead_window_median_ms"] = median([r.dead_ms - r.alive_ms for r in rets])
        row["returns_with_pids_in_do_exit"] = sum(1 for r in rets if r.exiting)
        row["returns_with_tasks_back"] = [
            {"ms": r.came_back_ms, "task": r.came_back} for r in rets if r.came_back_ms is not None
        ]
        row["phases_median_s"] = {k: median([r.phases_s[k] for r in rets]) for k in rets[0].phases_s}
        out[str(n)] = row
    return out


def print_table(results: dict[int, list[Return]]) -> None:
    print(
        f"\n{'N':>3} {'latency':38s} {'n':>4} {'p50 ms [95 % CI]':>26} {'p99 ms':>14} {'max ms':>9}  before: p50/p99*"
    )
    for n, rets in results.items():
        for key, label in LATENCIES:
            samples = [getattr(r, f"{key}_ms") for r in rets]
            if not samples:
                continue
            est = estimate_median(samples)
            ci = est.interval(".1f")
            before = BEFORE.get(n, "") if key == "dead" else "(not measured before)"
            print(
                f"{n:3d} {label:38s} {len(samples):4d} {est.median:9.2f} {ci:>16} "
                f"{format_percentile(samples, 99, '.2f'):>14} {max(samples):9.2f}  {before}"
            )
    print("* before: bench/spot_return.py at e0975fc, a shortened in-process pass (docs/spot.md); its 'p99' was the")
    print("  largest of 30 (process trees in v1 cgroups) or 10 (containerd 2.4.2 containers) runs.")


def print_checks(results: dict[int, list[Return]]) -> None:
    """What the agent saw itself, and whether it ever released an owner before its borrowers were dead."""
    for n, rets in results.items():
        if not rets:
            continue
        early = sum(1 for r in rets if r.released_ms < r.alive_ms)
        late_seen = sum(1 for r in rets if r.alive_ms <= r.released_ms < r.dead_ms)
        gap = median([r.dead_ms - r.alive_ms for r in rets])
        dead = [r.agent["return_to_dead_ms"] for r in rets if "return_to_dead_ms" in r.agent]
        rel = [r.agent["release_ms"] for r in rets if "release_ms" in r.agent]
        own = f"dead p50 {median(dead):.2f} ms, released p50 {median(rel):.2f} ms" if dead and rel else "n/a"
        back = sorted(r.came_back_ms for r in rets if r.came_back_ms is not None)
        if back:
            print(
                f"N={n:2d}: BORROWER TASKS BACK after the kill, before the pods were gone: {len(back)} of {len(rets)} "
                f"returns, first seen {back[0]:.0f}..{back[-1]:.0f} ms after the notice (kubelet restarted a killed "
                "container before the delete reached it)"
            )
        print(
            f"N={n:2d}: owner released while the bench still read a borrower task: {early} of {len(rets)}; "
            f"released between the bench's last task and its empty poll: {late_seen}; "
            f"the bench's window for 'dead' (last task read .. empty poll): median {gap:.2f} ms; "
            f"pids still in do_exit when the cgroups emptied: {sum(1 for r in rets if r.exiting)} returns; "
            f"the agent's own view (from the notice's arrival, last owner): {own}"
        )


def print_goals(results: dict[int, list[Return]]) -> bool:
    ok = True
    for n, goal in RELEASE_GOALS.items():
        if n not in results:
            continue
        samples = [r.released_ms for r in results[n]]
        p99 = tail_percentile(samples, 99) if samples else None
        if p99 is None:
            print(f"goal released p99 < {goal:.0f} ms at {n} borrowers: not judged (n={len(samples)} < 200)")
        else:
            verdict = "met" if p99 < goal else "MISSED"
            print(f"goal released p99 < {goal:.0f} ms at {n} borrowers: {verdict} (p99 {p99:.2f} ms, n={len(samples)})")
            ok = ok and p99 < goal
    return ok


def print_walls(results: dict[int, list[Return]], setup_s: float) -> None:
    per_n = {n: median([r.wall_s for r in rets]) for n, rets in results.items() if rets}
    for n, rets in results.items():
        if rets:
            phases = {k: median([r.phases_s[k] for r in rets]) for k in rets[0].phases_s}
            text = ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
            print(f"cycle wall time, {n:2d} borrowers: median {per_n[n]:.2f} s ({text}; medians in s)")
    if per_n:
        sizes = [int(n) for n in SIZES.split(",")]
        full = setup_s + sum(RETURNS * per_n.get(n, max(per_n.values())) for n in sizes)
        print(f"estimate for --returns {RETURNS} over {SIZES}: {full / 60:.0f} min (setup {setup_s:.0f} s included)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--returns", type=int, default=None, help=f"returns per size (default {RETURNS})")
    ap.add_argument("--sizes", default=SIZES, help=f"borrower counts, at most {GPUS} (default {SIZES})")
    ap.add_argument("--minutes", type=float, default=None, help="wall-time budget, split evenly over the sizes")
    ap.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK_RETURNS} returns per size")
    ap.add_argument(
        "--shape",
        choices=SHAPES,
        default=SHAPES[0],
        help="one-owner: one owner pod holds the N GPUs (the product case); owner-per-borrower: N owner pods "
        "of one GPU each, all returning at the same instant (N notices in one write)",
    )
    ap.add_argument("--json", type=Path, help="write every sample here")
    ap.add_argument("--agent-log", type=Path, help="keep the agent's log here (its directory is removed at the end)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if any(not 1 <= n <= GPUS for n in sizes):
        ap.error(f"--sizes: each size must be 1..{GPUS}, got {args.sizes}")
    if os.geteuid() != 0:
        ap.error("needs root (the cluster, cgroups, /proc/<pid>/ns)")
    returns = args.returns or (QUICK_RETURNS if args.quick else RETURNS)
    budget_s = None if args.minutes is None else args.minutes * 60 / len(sizes)
    results: dict[int, list[Return]] = {}
    failures: dict[int, str] = {}
    load_start = os.getloadavg()[0]
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="gs-sr", dir="/tmp"))
    setup_s = 0.0
    try:
        with environment(root) as bench:
            setup_s = time.monotonic() - started
            print(
                f"spot return on the agent process: {GPUS} fake GPUs, containerd 2.4.2, "
                f"cgroup {bench.cgroups.version}, shape {args.shape}, "
                f"idle window {IDLE_WINDOW_S:g} s, setup {setup_s:.0f} s",
                flush=True,
            )
            for n in sizes:
                try:
                    results[n] = bench.run_size(n, args.shape, returns, budget_s)
                except BenchError as exc:
                    failures[n] = str(exc)
                    print(f"N={n}: FAILED: {exc}", flush=True)
    finally:
        if args.agent_log and (root / "agent.log").exists():
            shutil.copyfile(root / "agent.log", args.agent_log)
        shutil.rmtree(root, ignore_errors=True)
    print_table(results)
    print_checks(results)
    print_walls(results, setup_s)
    load_end = os.getloadavg()[0]
    print(
        f"load average: {load_start:.1f} at start, {load_end:.1f} at end (2 cores); "
        f"total {time.monotonic() - started:.0f} s"
    )
    ok = print_goals(results)
    for n, why in failures.items():
        print(f"N={n} failed: {why.split(chr(10) + 'agent log tail:')[0]}")
    if args.json:
        doc = {
            "shape": args.shape,
            "sizes": summarize(results),
            "failures": failures,
            "load": [load_start, load_end],
            "setup_s": setup_s,
        }
        args.json.write_text(json.dumps(doc, indent=2))
    came_back = any(r.came_back_ms is not None for rets in results.values() for r in rets)
    return 0 if ok and not failures and not came_back else 1


if __name__ == "__main__":
    sys.exit(main())
