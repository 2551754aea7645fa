"""Demand the scheduler will never place makes no shadow; init containers and sidecars asking slots.

On the live node (real scheduler, kubelet and the agent as the DaemonSet's pod, two fake GPUs):

- a sharer that also asks for more CPU than the node has is answered by the scheduler with
  ``Insufficient cpu`` beside the share resource: no shadow would place it, so from that answer
  on the leader makes none and keeps none, and no GPU is held for it;
- slots asked in a sidecar (an init container with ``restartPolicy: Always``) are served beside
  the app container's, from one shadow. Slots asked in a plain init container are a refused mix
  (the admission policy refuses them; without it, test_node_guard.py).
"""

from __future__ import annotations

import json
import time
from typing import Any

from gpushare import keys
from localcluster.pods import sharer
from tests.integration.e2e.conftest import Env

SHARE4 = keys.share_resource(keys.KIND_SHARE, 4)


def _scheduler_answered(e: Env, name: str) -> str:
    pod = e.cluster.pod(name, "default") or {}
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message", ""))
    return ""


def _phase(e: Env, name: str) -> str:
    return str(((e.cluster.pod(name, "default") or {}).get("status") or {}).get("phase", ""))


def _watch_shadows(e: Env, seconds: float) -> int:
    """The most shadows alive at once over ``seconds``, read every 0.3 s."""
    most = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        most = max(most, len([s for s in e.shadows() if not s["metadata"].get("deletionTimestamp")]))
        time.sleep(0.3)
    return most


def test_a_sharer_short_of_cpu_everywhere_gets_no_shadow(e2e: Env) -> None:
    greedy = sharer("greedy")
    greedy["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "10000", SHARE4: "1"}
    e2e.apply(greedy)
    e2e.wait("the scheduler's answer", lambda: "Insufficient cpu" in _scheduler_answered(e2e, "greedy"), 30)
    # The leader may have made a shadow before it saw the scheduler's answer (its pending watch
    # may lag behind); once it has, the sharer asks for none, so an empty one idles out like any
    # other, and none is made again.
    e2e.wait("the leader holding greedy back", lambda: "default/greedy" in e2e.agent.status()["blocked"], 60)
    e2e.wait("no shadow left", lambda: not e2e.shadows(), 30)
    passes = e2e.agent.status()["passes"]
    most = _watch_shadows(e2e, 8.0)
    assert e2e.agent.status()["passes"] >= passes + 3, "the agent did not reconcile meanwhile"
    assert most == 0, (
        f"{most} shadow(s) made for a pod no shadow can place: {_scheduler_answered(e2e, 'greedy')}; "
        f"shadows now {[s['metadata'] for s in e2e.shadows()]}; {e2e.diagnosis()}"
    )


def _staged(*, sidecar: bool) -> dict[str, Any]:
    pod: dict[str, Any] = sharer("staged")
    pod["spec"]["containers"][0]["resources"] = {"limits": {SHARE4: "2"}}
    init = dict(pod["spec"]["containers"][0], name="helper")
    if sidecar:
        init["restartPolicy"] = "Always"
    else:
        init["command"] = ["sh", "-c", "true"]
    init["resources"] = {"limits": {SHARE4: "2"}}
    pod["spec"]["initContainers"] = [init]
    return pod


def test_a_sidecars_slots_are_served_beside_the_app_containers(e2e: Env) -> None:
    e2e.apply(_staged(sidecar=True))
    try:
        e2e.wait("the sharer running", lambda: _phase(e2e, "staged") == "Running", 60)
    except AssertionError as exc:
        described = e2e.cluster.kubectl("describe", "pod", "staged", "-n", "default", check=False).stdout
        raise AssertionError(f"{described[-4000:]}\n{exc}") from None
    # 2 + 2 slots of one shadow of 4: any other shadow made while the pod was on its way idles out.
    e2e.wait("one shadow left", lambda: len(e2e.shadows()) == 1, 30)
    owner = ((e2e.cluster.pod("staged", "default") or {})["metadata"].get("annotations") or {}).get(
        keys.ANNOTATION_SHADOW_OWNER, "{}"
    )
    assert len(json.loads(owner)) == 1, owner
