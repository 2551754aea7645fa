"""The per-vendor rule table: which of a holder's nodes are a lent GPU's (docs/nri.md). Pure; tables."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from gpushare import errors
from gpushare.errors import InstructionRefused
from nri_plugin.device_rules import RULES, VendorRule, gpu_nodes, rule_for
from nri_plugin.model import DeviceNode


def c(path: str, minor: int = 0) -> DeviceNode:
    return DeviceNode(path, "c", 195, minor)


KMSG, MEM = DeviceNode("/dev/kmsg", "c", 1, 11), DeviceNode("/dev/mem", "c", 1, 1)
NV0, NV1, CTL, UVM = c("/dev/nvidia0", 0), c("/dev/nvidia1", 1), c("/dev/nvidiactl", 255), c("/dev/nvidia-uvm", 254)
UVMT, MODESET, CAPS = c("/dev/nvidia-uvm-tools", 253), c("/dev/nvidia-modeset", 252), c("/dev/nvidia-caps/x", 9)
CARD0, RENDER0, CARD1, KFD = c("/dev/dri/card0"), c("/dev/dri/renderD128"), c("/dev/dri/card1"), c("/dev/kfd")
FAKE = [DeviceNode(f"/dev/fakegpu{i}", "c", 10, 229) for i in range(4)]
PRIVILEGED = (KMSG, MEM, NV0, NV1, CTL, UVM, UVMT, MODESET, CAPS, CARD0, RENDER0, CARD1, KFD, *FAKE)


@pytest.mark.parametrize(
    ("resource", "lent", "allocated", "devices", "want"),
    [
        # NVIDIA: a holder seeing exactly its GPU gives it and the control nodes, nothing else.
        (
            "nvidia.com/gpu",
            ["GPU-a"],
            ["GPU-a"],
            (NV1, CTL, UVM, UVMT, MODESET, CAPS, KMSG),
            (NV1, MODESET, UVM, UVMT, CTL),
        ),
        ("nvidia.com/gpu", ["GPU-a", "GPU-b"], ["GPU-a", "GPU-b"], (NV0, NV1, CTL), (NV0, NV1, CTL)),
        # AMD: a card and a render node per GPU, /dev/kfd shared.
        ("amd.com/gpu", ["0000:03:00.0"], ["0000:03:00.0"], (CARD0, RENDER0, KFD, MEM), (CARD0, RENDER0, KFD)),
        # The fake vendor's IDs name their nodes: one GPU of four, even from a privileged holder.
        ("example.com/gpu", ["fakegpu2"], [f"fakegpu{i}" for i in range(4)], PRIVILEGED, (FAKE[2],)),
        ("example.com/gpu", ["fakegpu3", "fakegpu0"], ["fakegpu0", "fakegpu3"], PRIVILEGED, (FAKE[3], FAKE[0])),
    ],
)
def test_the_rule_picks_only_the_lent_gpus_nodes(
    resource: str, lent: list[str], allocated: list[str], devices: tuple[DeviceNode, ...], want: tuple[DeviceNode, ...]
) -> None:
    assert gpu_nodes(resource, lent, frozenset(allocated), devices, "ns/owner/main") == want


@pytest.mark.parametrize(
    ("resource", "lent", "allocated", "devices", "needle"),
    [
        # A privileged NVIDIA holder sees every GPU: which one is lent is unknown.
        ("nvidia.com/gpu", ["GPU-a"], ["GPU-a"], PRIVILEGED, "cannot tell which of ns/owner/main's 2 NVIDIA"),
        # One GPU of a multi-GPU NVIDIA owner: UUIDs do not name nodes.
        ("nvidia.com/gpu", ["GPU-a"], ["GPU-a", "GPU-b"], (NV0, NV1, CTL), "allocated \\['GPU-a', 'GPU-b'\\]"),
        ("amd.com/gpu", ["x"], ["x"], (CARD0, RENDER0, CARD1, KFD), "3 AMD GPU device nodes"),
        ("example.com/gpu", ["fakegpu1"], ["fakegpu1"], (FAKE[0],), "has no device node /dev/fakegpu1"),
        ("example.com/gpu", ["weird"], ["weird"], tuple(FAKE), "none the fake rule names"),
        ("vendor.example/npu", ["n0"], ["n0"], (NV0,), "no per-vendor device rule covers vendor.example/npu"),
    ],
)
def test_the_rule_refuses_what_it_cannot_tell_apart(
    resource: str, lent: list[str], allocated: list[str], devices: tuple[DeviceNode, ...], needle: str
) -> None:
    with pytest.raises(InstructionRefused, match=needle):
        gpu_nodes(resource, lent, frozenset(allocated), devices, "ns/owner/main")


@pytest.mark.parametrize("rule", RULES, ids=[r.vendor for r in RULES])
def test_no_rule_ever_names_kmsg_mem_or_a_foreign_node(rule: VendorRule) -> None:
    for node in (KMSG, MEM, c("/dev/sda"), c("/dev/nvidia0/../mem"), c("/dev/fakegpu1x"), c("/dev/nvidia")):
        assert not rule.per_gpu.fullmatch(node.path) and node.path not in rule.control, node.path


def test_whatever_is_lent_only_ever_nodes_of_the_rule_come_back() -> None:
    # Every subset of a privileged fake holder: only /dev/fakegpu<i> of the lent IDs, never another device.
    ids = [f"fakegpu{i}" for i in range(4)]
    for n in range(1, 5):
        for lent in itertools.combinations(ids, n):
            got = gpu_nodes("example.com/gpu", lent, frozenset(ids), PRIVILEGED, "h")
            assert [d.path for d in got] == [f"/dev/{i}" for i in lent]


def test_rule_lookup_by_resource() -> None:
    assert rule_for("nvidia.com/gpu") is not None and rule_for("nvidia.com/mig-1g.10gb") is not None
    assert rule_for("amd.com/gpu") is not None and rule_for("example.com/gpu") is not None
    assert rule_for("huawei.com/Ascend910") is None


def test_every_refusal_in_the_plugin_names_a_known_reason() -> None:
    """Each refusal the NRI plugin raises carries one of the fixed reason words operators graph."""
    known = {name for name in dir(errors) if name.startswith("REFUSED_")}
    assert {getattr(errors, n) for n in known} == set(errors.REFUSAL_REASONS)
    sites = 0
    for path in sorted((Path(__file__).resolve().parents[3] / "nri_plugin").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "InstructionRefused":
                sites += 1
                reasons = [kw.value for kw in node.keywords if kw.arg == "reason"]
                assert len(reasons) == 1 and isinstance(reasons[0], ast.Name), f"{path}:{node.lineno}"
                assert reasons[0].id in known, f"{path}:{node.lineno}"
    assert sites >= 20
