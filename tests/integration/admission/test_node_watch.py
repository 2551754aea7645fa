"""The agent's Node watch against the real API server: a share count written back while it is
held is lowered again from the watch event, a count not held is left alone, and the time of the
write-back is kept for the drain's settle window. Another Node object stands in for the agent's
own (kubelet's status writes are the admin's PATCHes here), since the real node's kubelet would
rewrite any count of a resource it does not manage."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from controller.io.kube_client import KubeClient
from controller.share.node_watch import NodeWatch
from tests.integration.admission.conftest import OTHER_NODE, OTHER_NODE_SHARE, Admission

FULL = "4"


def _shown(a: Admission) -> tuple[str, str]:
    status = a.cluster.request("GET", f"/api/v1/nodes/{OTHER_NODE}")["status"]
    return status["capacity"][OTHER_NODE_SHARE], status["allocatable"][OTHER_NODE_SHARE]


def _write_back(a: Admission, count: str) -> None:
    body = {"status": {"capacity": {OTHER_NODE_SHARE: count}, "allocatable": {OTHER_NODE_SHARE: count}}}
    with KubeClient.from_kubeconfig(str(a.cluster.kubeconfig)) as admin:
        admin.patch_node_status(OTHER_NODE, body["status"])


def _until(what: str, ok: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        time.sleep(0.1)


def test_a_held_count_written_back_is_lowered_from_the_watch_and_its_time_kept(admission: Admission) -> None:
    a = admission
    stop = threading.Event()
    with KubeClient.from_kubeconfig(str(a.cluster.kubeconfig)) as client:
        watch = NodeWatch(client, OTHER_NODE, resync_s=300.0)
        thread = threading.Thread(target=watch.run, args=(stop,), name="test-node-watch", daemon=True)
        try:
            assert _shown(a) == (FULL, FULL)
            watch.hold({OTHER_NODE_SHARE: 1})
            thread.start()
            _until("the LIST's count lowered to the held one", lambda: _shown(a) == ("1", "1"))

            _write_back(a, FULL)  # kubelet's node status: the full count again
            _until("the written-back count lowered again", lambda: _shown(a) == ("1", "1"), 10.0)
            assert set(watch.lowered_at()) == {OTHER_NODE_SHARE}

            watch.hold({})  # the drain is over: the count is kubelet's
            _write_back(a, FULL)
            time.sleep(2.0)
            assert _shown(a) == (FULL, FULL)
            assert watch.lowered_at() == {}
        finally:
            stop.set()
            _write_back(a, FULL)  # restores the count, and its event ends the watch the thread is in
            if thread.is_alive():
                thread.join(70.0)
