"""Injector: the BundleCache follows the lifecycle events, and decisions use the oracle."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest

from gpushare import keys
from gpushare.codecs import encode_devices_from, encode_devices_ids
from gpushare.config import load_config
from gpushare.errors import InstructionRefused
from nri_plugin import Injector, OracleUnavailable
from nri_plugin._pb import nri_pb2
from nri_plugin.model import Bundle, DeviceNode
from nri_plugin.oracle import Holder

DIND = {keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "dind": "main"}


def _pod(pid: str, name: str = "", ns: str = "team", labels: Mapping[str, str] | None = None, **ann: str):  # type: ignore[no-untyped-def]
    return nri_pb2.PodSandbox(id=pid, name=name or pid, namespace=ns, labels=labels or {}, annotations=ann)


def _ctr(cid: str, name: str, pid: str, *, dev: bool = True, **ann: str) -> nri_pb2.Container:
    c = nri_pb2.Container(id=cid, pod_sandbox_id=pid, name=name, annotations=ann)
    if dev:
        c.env.append("FAKE_VISIBLE_DEVICES=fake0")
        c.linux.devices.add(path="/dev/fakegpu0", type="c", major=10, minor=229)
    return c


class Oracle:
    def __init__(self, answer: Mapping[str, frozenset[str]] | None) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str, str]] = []

    def allocated_ids(self, namespace: str, pod: str, container: str) -> Mapping[str, frozenset[str]]:
        self.asked.append((namespace, pod, container))
        if self.answer is None:
            raise OracleUnavailable("kubelet pod-resources socket /x unreachable")
        return self.answer


def test_synchronize_then_remove_events_keep_the_index() -> None:
    inj = Injector(load_config(None))
    inj.synchronize([_pod("p1", **DIND)], [_ctr("c1", "main", "p1")])
    adj = inj.create_container(_pod("p1", **DIND), _ctr("c2", "dind", "p1", dev=False))
    assert [d.path for d in adj.linux.devices] == ["/dev/fakegpu0"]
    assert [(e.key, e.value) for e in adj.env] == [("FAKE_VISIBLE_DEVICES", "fake0")]
    inj.remove_container(_pod("p1"), _ctr("c1", "main", "p1"))
    with pytest.raises(InstructionRefused, match="not created yet"):
        inj.create_container(_pod("p1", **DIND), _ctr("c3", "dind", "p1", dev=False))
    inj.remove_pod_sandbox(_pod("p1"))
    assert inj.cache.view.pods == {} and inj.cache.view.containers == {}


def test_a_target_becomes_a_source_with_what_it_was_given() -> None:
    inj = Injector(load_config(None))
    pod = _pod("p1", **DIND, **{keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "inner": "dind"})
    inj.create_container(pod, _ctr("c1", "main", "p1"))
    inj.create_container(pod, _ctr("c2", "dind", "p1", dev=False))
    adj = inj.create_container(pod, _ctr("c3", "inner", "p1", dev=False))
    assert [d.path for d in adj.linux.devices] == ["/dev/fakegpu0"]


def _shadow_setup(inj: Injector) -> None:
    shadow = _pod("sp", "shadow-a", "gpushare-system", labels={keys.LABEL_ROLE: keys.ROLE_SHADOW})
    inj.create_container(shadow, _ctr("cs", "main", "sp"))


ANN = {keys.ANNOTATION_DEVICES_FROM: encode_devices_from("gpushare-system", "shadow-a", ["gpushare-system/shadow-a-0"])}


def test_cross_pod_uses_the_oracle_and_logs_one_line(caplog: pytest.LogCaptureFixture) -> None:
    oracle = Oracle({"gpushare/share-gpu-2": frozenset({"gpushare-system/shadow-a-0"})})
    seen: list[str] = []
    inj = Injector(load_config(None), oracle=oracle, on_decision=lambda d, *_: seen.append(d))
    _shadow_setup(inj)
    with caplog.at_level(logging.INFO, logger="nri_plugin.injector"):
        adj = inj.create_container(_pod("tp", "tenant"), _ctr("ct", "app", "tp", dev=False, **ANN))
    assert [d.path for d in adj.linux.devices] == ["/dev/fakegpu0"]
    assert oracle.asked == [("team", "tenant", "app")]
    assert seen == ["inject"]
    (record,) = [r for r in caplog.records if r.getMessage() == "decision"]
    fields = record.kv  # type: ignore[attr-defined]
    assert fields["decision"] == "inject" and fields["pod"] == "team/tenant" and fields["devices"] == 1
    assert fields["source"] == "gpushare-system/shadow-a/main" and fields["took_ms"] >= 0
    assert len(inj.handler_times_ms()) == 2


@pytest.mark.parametrize(
    ("oracle", "needle"),
    [(None, "no PodResources API is configured"), (Oracle(None), "cannot confirm the allocation")],
)
def test_cross_pod_without_a_working_oracle_is_refused(oracle: Oracle | None, needle: str) -> None:
    inj = Injector(load_config(None), oracle=oracle)
    _shadow_setup(inj)
    with pytest.raises(InstructionRefused, match=needle):
        inj.create_container(_pod("tp", "tenant"), _ctr("ct", "app", "tp", dev=False, **ANN))
    # A refused container is not remembered as a source.
    assert "ct" not in inj.cache.view.containers


# --- spot: the lend state, the vendor's answer, kubelet's holder -----------------------------------

SPOT_ANN = {keys.ANNOTATION_DEVICES_IDS: encode_devices_ids({"example.com/gpu": ["fakegpu1"]})}
SPOT_OK = {keys.RESOURCE_SPOT_GPU: frozenset({"spot-fakegpu1"})}
OWNER_HOLDS = Holder("team", "owner", "main", frozenset({"fakegpu0", "fakegpu1"}))


class Spot:
    """The agent's side as the injector sees it: lends, the vendor plugin, kubelet's holders."""

    def __init__(self, *, ended: str | None = None, vendor: Bundle | None = None, lend_error: bool = False) -> None:
        self.ended = ended
        self.vendor = vendor
        self.lend_error = lend_error
        self.resolved: list[tuple[str, tuple[str, ...]]] = []
        self.lends: list[tuple[str, str, str, str]] = []

    def lend_ended(self, real_id: str, namespace: str, pod: str, uid: str) -> str | None:
        self.lends.append((real_id, namespace, pod, uid))
        if self.lend_error:
            raise OracleUnavailable("the agent has not planned spot yet")
        return self.ended

    def resolve(self, resource: str, real_ids: tuple[str, ...]) -> Bundle | None:
        self.resolved.append((resource, real_ids))
        return self.vendor

    def holder_of(self, resource: str, real_id: str) -> Holder | None:
        return OWNER_HOLDS if real_id in OWNER_HOLDS.ids else None


def _two_gpu_owner(inj: Injector) -> None:
    owner = nri_pb2.Container(id="co", pod_sandbox_id="op", name="main")
    owner.env.append("FAKE_VISIBLE_DEVICES=fakegpu0,fakegpu1")
    for i, path in enumerate(("/dev/fakegpu0", "/dev/fakegpu1", "/dev/kmsg")):
        owner.linux.devices.add(path=path, type="c", major=10 if i < 2 else 1, minor=229 if i < 2 else 11)
    inj.create_container(_pod("op", "owner"), owner)


def _spot_injector(spot: Spot, answer: Mapping[str, frozenset[str]] | None = SPOT_OK) -> Injector:
    inj = Injector(load_config(None), oracle=Oracle(answer), resolver=spot, holders=spot, lend_state=spot)
    _two_gpu_owner(inj)
    return inj


def _borrow(inj: Injector) -> nri_pb2.ContainerAdjustment:
    return inj.create_container(_pod("bp", "job", "spot"), _ctr("cb", "job", "bp", dev=False, **SPOT_ANN))


def test_one_gpu_of_a_two_gpu_owner_from_kubelets_holder() -> None:
    spot = Spot()
    adj = _borrow(_spot_injector(spot))
    assert [d.path for d in adj.linux.devices] == ["/dev/fakegpu1"]  # not fakegpu0, never /dev/kmsg
    assert [(e.key, e.value) for e in adj.env] == [("FAKE_VISIBLE_DEVICES", "fakegpu1")]
    assert spot.resolved == [("example.com/gpu", ("fakegpu1",))] and spot.lends == [("fakegpu1", "spot", "job", "")]


def test_the_vendor_answer_is_used_when_there_is_one() -> None:
    vendor = Bundle((DeviceNode("/dev/fakegpu1", "c", 10, 229),), (("FAKE_VISIBLE_DEVICES", "fakegpu1"),))
    adj = _borrow(_spot_injector(Spot(vendor=vendor)))
    assert [d.path for d in adj.linux.devices] == ["/dev/fakegpu1"]


@pytest.mark.parametrize(
    ("spot", "answer", "needle", "asks_vendor"),
    [
        (Spot(ended="the pod was reclaimed"), SPOT_OK, "lend of GPU fakegpu1 to pod spot/job ended: the pod", False),
        (Spot(lend_error=True), SPOT_OK, "cannot confirm the spot lend of spot/job", False),
        # A forged instruction (kubelet gave this container no such spot device): the vendor is never asked.
        (Spot(), {}, "PodResources does not confirm", False),
    ],
)
def test_spot_refusals(spot: Spot, answer: Mapping[str, frozenset[str]], needle: str, asks_vendor: bool) -> None:
    inj = _spot_injector(spot, answer)
    with pytest.raises(InstructionRefused, match=needle):
        _borrow(inj)
    assert bool(spot.resolved) is asks_vendor


def test_without_a_lend_state_spot_is_refused() -> None:
    spot = Spot()
    inj = Injector(load_config(None), oracle=Oracle(SPOT_OK), resolver=spot, holders=spot)
    _two_gpu_owner(inj)
    with pytest.raises(InstructionRefused, match="no lend state"):
        _borrow(inj)


# --- the pod's mix of requests, from the agent's pod cache ------------------------------------------

REFUSED = "gpushare: pod team/tenant asks for gpushare/share-gpu-2 and gpushare/share-gpu-4; all the slots"


class Rules:
    """``PodRules``: ``None`` answers "not known yet"; a string is the refusal."""

    def __init__(self, answers: Mapping[str, str | None] | None) -> None:
        self.answers = answers
        self.asked: list[tuple[str, str, str]] = []

    def refusal(self, namespace: str, name: str, uid: str) -> str | None:
        self.asked.append((namespace, name, uid))
        if self.answers is None or f"{namespace}/{name}" not in self.answers:
            raise OracleUnavailable("the agent's watch of this node's pods has not seen it yet")
        return self.answers[f"{namespace}/{name}"]


def _rules_injector(rules: Rules) -> Injector:
    oracle = Oracle({"gpushare/share-gpu-2": frozenset({"gpushare-system/shadow-a-0"})})
    inj = Injector(load_config(None), oracle=oracle, pod_rules=rules)
    return inj


def test_every_container_of_a_refused_pod_is_refused_in_the_policys_words() -> None:
    refused: list[str] = []
    rules = Rules({"team/tenant": REFUSED, "gpushare-system/shadow-a": None})
    inj = Injector(
        load_config(None),
        oracle=Oracle({"gpushare/share-gpu-2": frozenset({"gpushare-system/shadow-a-0"})}),
        pod_rules=rules,
        on_refusal=refused.append,
    )
    _shadow_setup(inj)
    pod = _pod("tp", "tenant")
    pod.uid = "u-1"
    # The sharer's container, and one that gpushare gives nothing (it holds the vendor's GPU itself).
    for ctr in (_ctr("ct", "app", "tp", dev=False, **ANN), _ctr("cv", "train", "tp")):
        with pytest.raises(InstructionRefused) as err:
            inj.create_container(pod, ctr)
        assert str(err.value).startswith(REFUSED) and "refused on the node" in str(err.value)
    assert refused == ["mix", "mix"] and ("team", "tenant", "u-1") in rules.asked
    assert "ct" not in inj.cache.view.containers and "cv" not in inj.cache.view.containers


def test_a_pod_not_read_yet_is_refused_only_where_gpushare_would_act() -> None:
    inj = _rules_injector(Rules({"gpushare-system/shadow-a": None}))
    _shadow_setup(inj)
    # Nothing to inject: a lagging cache must not stop it.
    inj.create_container(_pod("op", "other"), _ctr("co", "main", "op"))
    with pytest.raises(InstructionRefused, match="cannot check the GPU requests of team/tenant"):
        inj.create_container(_pod("tp", "tenant"), _ctr("ct", "app", "tp", dev=False, **ANN))
    inj2 = _rules_injector(Rules({"gpushare-system/shadow-a": None, "team/tenant": None}))
    _shadow_setup(inj2)
    adj = inj2.create_container(_pod("tp", "tenant"), _ctr("ct", "app", "tp", dev=False, **ANN))
    assert [d.path for d in adj.linux.devices] == ["/dev/fakegpu0"]
