"""Hostile tenants cannot break, blind or steer a reconcile pass (hypothesis).

A tenant writes every field of its own pods (docs/security.md): annotations and labels,
the product's own keys among them, env, containers, resources, nodeSelector, grace periods.
Here arbitrary such pods, in tenants' namespaces, join a fixed well-formed cluster: a shadow
and its sharer, a sharer waiting for a shadow, a lent GPU and its borrower, a GPU nobody
lends. One real pass (``ReconcileLoop.tick`` with in-memory peers: the same decision code,
applier and report the agent runs) must complete with no part failing, and everything it
does about the well-formed pods and the node's devices must be exactly what it does
without the hostile pods.
"""

from __future__ import annotations

import functools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare import keys
from tests.unit.controller.loop_pods import pod, shadow
from tests.unit.controller.test_loop import _lendable_owner, _spot, make_loop

SHARE4 = "gpushare/share-gpu-4"
WELL_FORMED = [
    shadow("s", node="n1", phase="Running"),
    pod("a", node="n1", phase="Running", limits={SHARE4: "1"}),
    pod("wait", limits={SHARE4: "4"}),  # more than s has free: the leader creates a shadow
    _lendable_owner(),  # team/owner, idle since 0 on g0: lent
    pod("plain", ns="team", node="n1", phase="Running", limits={"example.com/gpu": "1"}),
    pod("job", ns="spot", node="n1", phase="Running", limits={keys.RESOURCE_SPOT_GPU: "1"}),
]
WELL_KEYS = frozenset(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in WELL_FORMED)
ROWS = [
    ("gpushare-system", "s", "main", "example.com/gpu", ["g9"]),
    ("default", "a", "main", SHARE4, ["gpushare-system/s-0"]),
    ("team", "owner", "main", "example.com/gpu", ["g0"]),
    ("team", "plain", "main", "example.com/gpu", ["g1"]),
    ("spot", "job", "main", keys.RESOURCE_SPOT_GPU, ["spot-g0"]),
]
REAL_IDS = {"example.com/gpu": ("g0", "g1", "g9")}

# Digits str.isdigit() accepts: superscript two, Arabic-Indic three, fullwidth one, Roman eight, Tamil five, bold nine.
UNICODE_DIGITS = ["²", "٣", "\uff11", "Ⅷ", "௫", "\U0001d7d7"]
PRODUCT_KEYS = sorted(v for v in vars(keys).values() if isinstance(v, str) and v.startswith(keys.DOMAIN + "/"))
NASTY = [
    "",
    "true",
    "shadow",
    "share",
    "share-dev",
    "4",
    "0",
    "-1",
    "9" * 5000,  # int() refuses more than 4300 digits
    str(2**64),
    "[" * 5000 + "]" * 5000,  # json.loads: RecursionError
    '{"a":' * 3000 + "1" + "}" * 3000,
    "x" * 300_000,
    "{}",
    "[]",
    "null",
    '{"gpushare-system/s":"forged-uid"}',
    '{"gpushare-system/s":"uid-s"}',
    '{"gpushare-system/s":7}',
    '{"gpushare-system/shadow-share-4-0000000' + "9" * 60 + '":"u"}',
    '{"example.com/gpu":["g0"]}',
    '{"gpushare-system/s/main":{"*":["gpushare-system/s-0"]}}',
    "example.com/gpu",
    "nvidia.com/gpu",
    "g0",
    "spot-g0",
    "gpushare-system/s-0",
    "_/_/main",
    "main",
    "\x00\n\t\u202e",
    "\ud800",  # a lone surrogate: str.encode() refuses it
    *UNICODE_DIGITS,
    *("shadow-share-4-" + d for d in UNICODE_DIGITS),
]
value = st.one_of(st.sampled_from(NASTY), st.text(max_size=12))
key = st.one_of(
    st.sampled_from(PRODUCT_KEYS),
    st.sampled_from([keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + c for c in ("main", "c0", "c1", "²")]),
    st.sampled_from(["cdi.k8s.io/gpu", "app", "NVIDIA_VISIBLE_DEVICES"]),
    st.text(max_size=8),
)
quantity = st.one_of(
    st.sampled_from(["1", "4", "5", "0", "1.5", "", " 2 ", "1e3", "9" * 5000, str(2**63), *UNICODE_DIGITS]),
    st.integers(-5, 2**70),
)
resource = st.sampled_from(
    [
        SHARE4,
        "gpushare/share-gpu-7",
        "gpushare/share-dev-gpu-2",
        "gpushare/share-gpu-²",
        "gpushare/share-gpu-" + "9" * 70,
        keys.RESOURCE_SPOT_GPU,
        "example.com/gpu",
        "nvidia.com/gpu",
        "cpu",
    ]
)
visibility = st.sampled_from(["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "X"])
garbage = st.one_of(st.none(), st.integers(), st.text(max_size=4), st.lists(st.integers(), max_size=2))


@st.composite
def container(draw: st.DrawFn, name: str) -> dict[str, Any]:
    requests = draw(st.dictionaries(resource, quantity, max_size=2))
    restart = draw(st.sampled_from([None, "Always", "OnFailure"]))
    return {
        "name": name,
        "image": "busybox",
        "env": [{"name": n, "value": v} for n, v in draw(st.lists(st.tuples(visibility, value), max_size=2))],
        "resources": {draw(st.sampled_from(["requests", "limits"])): requests},
        **({"restartPolicy": restart} if restart else {}),
    }


@st.composite
def hostile_pod(draw: st.DrawFn, index: int) -> Any:
    """A pod in a tenant's namespace with any values the tenant could write (and, rarely, worse)."""
    names = [f"c{i}" for i in range(draw(st.integers(1, 3)))]
    spec: dict[str, Any] = {
        "nodeName": draw(st.sampled_from(["", "n1", "n2"])),
        "containers": [draw(container(n)) for n in names],
        "initContainers": [draw(container("init"))] if draw(st.booleans()) else [],
        "ephemeralContainers": [{"name": "debug", "image": "busybox"}] if draw(st.booleans()) else [],
        "nodeSelector": draw(st.none() | st.dictionaries(st.sampled_from(["gpu", "zone", ""]), value, max_size=2)),
        "terminationGracePeriodSeconds": draw(st.sampled_from([0, 30, 2**62])),
    }
    raw = {
        "metadata": {
            "namespace": draw(st.sampled_from(["evil", "evil-2", "default-not"])),
            "name": f"h{index}",
            "uid": f"uid-h{index}",
            "resourceVersion": draw(st.sampled_from(["1", "9" * 5000, "x"])),
            "labels": draw(st.dictionaries(key, value, max_size=3)),
            "annotations": draw(st.dictionaries(key, value, max_size=4)),
        },
        "spec": spec,
        "status": {"phase": draw(st.sampled_from(["Pending", "Running", "Failed"]))},
    }
    # Rarely, a field of the wrong type altogether (only a broken API server would send it).
    if draw(st.integers(0, 9)) == 0:
        where = draw(st.sampled_from([("metadata", "labels"), ("metadata", "annotations"), ("spec", "containers")]))
        raw[where[0]][where[1]] = draw(garbage)
    return raw


@functools.cache
def _well_formed_only() -> tuple[Any, ...]:
    return _run([])


def _run(hostile: list[Any]) -> tuple[Any, ...]:
    """One pass over the well-formed pods plus ``hostile``; what it did that concerns the well-formed."""
    spot_calls: list[Any] = []
    loop, client, plugins = make_loop([*WELL_FORMED, *hostile], ROWS, spot=_spot(spot_calls, idle_since=0.0))
    health: list[tuple[str, bool]] = []
    plugins.real_devices = lambda: dict(REAL_IDS)  # type: ignore[method-assign]
    plugins.set_spot_health = lambda rid, ok: health.append((rid, ok))  # type: ignore[method-assign]
    report = loop.tick()
    assert report.error == "", report.error  # no part of the pass failed
    calls = tuple(c for c in client.calls if c[0] != "create" and (c[0] == "node-event" or c[1] in WELL_KEYS))
    return calls, tuple(plugins.set), tuple(health), tuple(map(repr, spot_calls)), _well_formed_report(report)


def _well_formed_report(report: Any) -> Any:
    sharers = tuple(s for s in report.sharers if s.pod in WELL_KEYS)
    # A hostile pod whose mix of requests the node refuses is evicted itself: that concerns nobody else.
    evictions = tuple(e for e in report.evictions if e.pod in WELL_KEYS)
    return report.shadows, sharers, report.spot, report.is_leader, evictions


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(st.integers(1, 4).flatmap(lambda n: st.tuples(*(hostile_pod(i) for i in range(n)))))
def test_hostile_pods_change_nothing_for_anyone_else(hostile: tuple[Any, ...]) -> None:
    assert _run(list(hostile)) == _well_formed_only()


def test_the_well_formed_cluster_is_worth_protecting() -> None:
    """The baseline does what each hostile run is compared against: records, lending, demand."""
    calls, pushed, health, _, (_, sharers, spot, leader, _) = _well_formed_only()
    assert ("annotate", "default/a", (keys.ANNOTATION_SHADOW_OWNER,)) in calls
    assert ("annotate", "gpushare-system/s", (keys.ANNOTATION_SHADOW_USERS,)) in calls
    assert dict(pushed)[SHARE4] == tuple(f"gpushare-system/s-{i}" for i in range(4))
    assert ("g0", True) in health and ("g1", False) in health
    assert {g.real_id: str(g.state) for g in spot} == {"g0": "stolen", "g1": "busy", "g9": "busy"}
    assert leader and [s.pod for s in sharers] == ["default/a", "default/wait"]
