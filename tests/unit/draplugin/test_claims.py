"""Preparing a claim: the plan, every refusal, and the checkpoint that outlives the process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from draplugin.claims import (
    ClaimRef,
    ClaimRefused,
    NodeView,
    claim_spec,
    claim_spec_file,
    parse_quantity,
    plan_claim,
)
from draplugin.inventory import Gpu
from draplugin.pool import PoolShape, devices_of
from draplugin.state import CheckpointError, PreparedClaims

DRIVER = "gpushare.k8s.io"
POOL = "node-a"
GPUS = [Gpu(i, (f"example.com/gpu=fakegpu{i}",), (f"/dev/fakegpu{i}",)) for i in range(2)]
DEVICES = devices_of(GPUS, PoolShape())


def _claim(uid: str, *results: dict[str, Any], allocated: bool = True) -> dict[str, Any]:
    claim: dict[str, Any] = {"metadata": {"uid": uid, "namespace": "t", "name": f"c-{uid}"}, "status": {}}
    if allocated:
        claim["status"]["allocation"] = {"devices": {"results": list(results)}}
    return claim


def _result(device: str, **extra: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": POOL, "device": device, **extra}


def _ref(uid: str) -> ClaimRef:
    return ClaimRef("t", f"c-{uid}", uid)


def _plan(claim: dict[str, Any], uid: str, held: dict[str, str] | None = None) -> Any:
    return plan_claim(claim, _ref(uid), NodeView(DRIVER, POOL, DEVICES, held or {}))


def test_share_slot_names_the_vendor_gpu_and_the_claims_own_device() -> None:
    plan = _plan(_claim("u1", _result("gpu-1-share4-2")), "u1")
    (d,) = plan.devices
    assert d.cdi_ids == ("example.com/gpu=fakegpu1", f"k8s.{DRIVER}/claim=u1-gpu-1-share4-2")
    assert (d.kind, d.gpu, d.milli, d.request) == ("share", "gpu-1", 250, "gpu")
    spec = claim_spec(DRIVER, plan)
    assert spec["kind"] == f"k8s.{DRIVER}/claim"
    assert spec["devices"][0]["containerEdits"]["env"] == [
        "GPUSHARE_GPU=gpu-1",
        "GPUSHARE_SHARE_KIND=share",
        "GPUSHARE_GPU_MILLI=250",
    ]


def test_exact_claim_gets_its_consumed_milli_and_share_id() -> None:
    claim = _claim("u2", _result("gpu-0-exact", consumedCapacity={"milli": "810"}, shareID="s-1", request="r/sub"))
    (d,) = _plan(claim, "u2", held={"gpu-0-exact": "other"}).devices
    assert (d.milli, d.share_id, d.request) == (810, "s-1", "r")


def test_results_of_other_drivers_are_not_ours() -> None:
    claim = _claim("u3", {"request": "x", "driver": "gpu.nvidia.com", "pool": POOL, "device": "gpu-0"})
    assert _plan(claim, "u3").devices == ()


@pytest.mark.parametrize(
    ("claim", "held", "reason"),
    [
        (_claim("other", _result("gpu-0")), {}, "has UID other, kubelet asked for u4"),
        (_claim("u4", allocated=False), {}, "is not allocated"),
        (_claim("u4", {**_result("gpu-0"), "pool": "node-b"}), {}, "from pool 'node-b', not this node's"),
        (_claim("u4", _result("gpu-9")), {}, "'gpu-9', which this node does not publish"),
        (_claim("u4", _result("gpu-0-spot")), {"gpu-0-spot": "u5"}, "which claim u5 holds on this node"),
        (_claim("u4", _result("gpu-0-exact", consumedCapacity={"milli": "lots"})), {}, "unreadable consumedCapacity"),
    ],
)
def test_refusals_name_the_problem(claim: dict[str, Any], held: dict[str, str], reason: str) -> None:
    with pytest.raises(ClaimRefused, match=reason):
        _plan(claim, "u4", held)


@pytest.mark.parametrize(
    ("text", "value"), [("250", 250), ("1k", 1000), ("500m", 0.5), ("2Gi", 2 << 30), ("1e3", 1000)]
)
def test_quantities(text: str, value: float) -> None:
    assert parse_quantity(text) == pytest.approx(value)


def test_checkpoint_survives_a_restart_and_specs_follow_it(tmp_path: Path) -> None:
    data, cdi = tmp_path / "plugin", tmp_path / "cdi"
    state = PreparedClaims(data, cdi, DRIVER)
    a = _plan(_claim("ua", _result("gpu-0")), "ua")
    b = _plan(_claim("ub", _result("gpu-1-exact", consumedCapacity={"milli": "100"})), "ub")
    state.add(a)
    state.add(b)
    assert state.add(_plan(_claim("ua", _result("gpu-1")), "ua")) == a  # idempotent: the first plan stays
    spec_b = cdi / claim_spec_file(DRIVER, "ub")
    assert json.loads(spec_b.read_text())["devices"][0]["name"] == "ub-gpu-1-exact"
    (cdi / claim_spec_file(DRIVER, "orphan")).write_text("{}")
    spec_b.unlink()  # /var/run/cdi is a tmpfs: a reboot empties it

    again = PreparedClaims(data, cdi, DRIVER)
    assert again.snapshot() == {"ua": a, "ub": b}
    assert again.held() == {"gpu-0": "ua"}
    assert sorted(p.name for p in cdi.iterdir()) == sorted(claim_spec_file(DRIVER, u) for u in ("ua", "ub"))
    assert again.remove("ua") and not again.remove("ua")
    assert sorted(PreparedClaims(data, cdi, DRIVER).snapshot()) == ["ub"]


def test_a_refusing_check_writes_nothing(tmp_path: Path) -> None:
    state = PreparedClaims(tmp_path / "p", tmp_path / "c", DRIVER)

    def refuse(held: object) -> None:
        raise ClaimRefused("taken")

    with pytest.raises(ClaimRefused):
        state.add(_plan(_claim("ux", _result("gpu-0")), "ux"), check=refuse)
    assert state.snapshot() == {} and list((tmp_path / "c").iterdir()) == []
    assert not (tmp_path / "p" / "checkpoint.json").exists()


def test_an_unreadable_checkpoint_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "checkpoint.json").write_text('{"version": 9, "claims": {}}')
    with pytest.raises(CheckpointError, match=r"checkpoint\.json: version 9"):
        PreparedClaims(tmp_path / "p", tmp_path / "c", DRIVER)


def test_a_blocked_spot_device_is_refused_with_the_reason() -> None:
    claim = _claim("u6", _result("gpu-0-spot"))
    with pytest.raises(ClaimRefused, match="owner of gpu-0 is using it"):
        plan_claim(
            claim, _ref("u6"), NodeView(DRIVER, POOL, DEVICES, blocked={"gpu-0-spot": "the owner of gpu-0 is using it"})
        )
