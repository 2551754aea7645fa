"""`gpushare doctor`'s verdicts, table-driven: one healthy node, then one fact changed per row."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from cli.doctor.diagnosis import (
    AgentFact,
    CgroupFact,
    Check,
    ContainerdFact,
    ExporterFact,
    KmodFact,
    KubeletFact,
    NodeFacts,
    NriFact,
    SocketFact,
    Status,
    diagnose,
    exit_code,
    parse_version,
)

NRI = "/var/run/nri/nri.sock"
DP = "/var/lib/kubelet/device-plugins/"
PR = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU = "nvidia.com/gpu"


def healthy() -> NodeFacts:
    return NodeFacts(
        containerd=ContainerdFact(1, "/etc/containerd/config.toml", None, "containerd v2.4.2", False, NRI, False),
        nri=NriFact(SocketFact(NRI, "ok"), "containerd", "v2.4.2"),
        cgroup=CgroupFact(
            "/sys/fs/cgroup", "v2", "cgroupfs", spot_layout="cgroup v2, pods under ...", layout_driver="cgroupfs"
        ),
        kubelet=KubeletFact(
            DP,
            True,
            SocketFact(DP + "kubelet.sock", "ok"),
            (SocketFact(DP + "nvidia-gpu.sock", "ok"),),
            SocketFact(PR, "ok"),
            pods=3,
            devices={GPU: 8},
            api_allocatable={GPU: 8},
        ),
        real_resources=(GPU,),
        exporter=ExporterFact("http://127.0.0.1:9400/metrics", False, 8, "nvidia"),
        kmod=KmodFact("6.1.0-50-amd64", "0.2.0", "0.2.0", None, None),
        agent=AgentFact("0.0.0.0:9487", 200, spot=True, spot_mode="kernel module + utilization"),
    )


def with_(facts: NodeFacts, **changes: Any) -> NodeFacts:
    """``containerd__nri_disabled=True`` replaces one field of one fact."""
    out = facts
    for key, value in changes.items():
        part, _, attr = key.partition("__")
        out = dataclasses.replace(
            out, **{part: dataclasses.replace(getattr(out, part), **{attr: value}) if attr else value}
        )
    return out


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_a_healthy_node_passes_every_check() -> None:
    checks = diagnose(healthy(), NRI)
    assert [c.name for c in checks] == [
        "containerd",
        "nri-config",
        "nri-socket",
        "cgroup",
        "device-plugins",
        "pod-resources",
        f"vendor {GPU}",
        "exporter",
        "kmod",
        "spot-returns",
        "agent",
    ]
    assert all(c.status is Status.OK for c in checks), [c for c in checks if c.status is not Status.OK]
    assert exit_code(checks) == 0
    assert "containerd v2.4.2 (from NRI handshake)" in by_name(checks)["containerd"].summary


# (name, changes to the healthy node, check, status, words in summary or hint)
CASES: list[tuple[str, dict[str, Any], str, Status, tuple[str, ...]]] = [
    (
        "no containerd serves the socket",
        {
            "containerd": ContainerdFact(others=("pid 7 (config /c.toml, NRI socket /other.sock)",)),
            "nri__runtime_version": None,
        },
        "containerd",
        Status.FAIL,
        ("no running containerd is configured with the NRI socket", "/other.sock", "socket_path"),
    ),
    ("containerd too old", {"nri__runtime_version": "v1.6.20"}, "containerd", Status.FAIL, ("1.7 or later",)),
    ("version from the binary", {"nri__runtime_version": None}, "containerd", Status.OK, ("from its binary",)),
    ("unknown version", {"nri__runtime_version": None, "containerd__version": None}, "containerd", Status.WARN, ()),
    ("containerd 1.7 is enough", {"nri__runtime_version": "1.7.24~ds1"}, "containerd", Status.OK, ("1.7.24",)),
    (
        "NRI off in the config",
        {"containerd__nri_disabled": True},
        "nri-config",
        Status.FAIL,
        ("NRI is disabled in /etc/containerd/config.toml", "disable = false", "restart containerd"),
    ),
    (
        "config unreadable",
        {"containerd__config_error": "/etc/containerd/config.toml: bad TOML"},
        "nri-config",
        Status.WARN,
        ("cannot read containerd's config",),
    ),
    (
        "NRI socket missing",
        {"nri": NriFact(SocketFact(NRI, "missing"))},
        "nri-socket",
        Status.FAIL,
        (f"NRI socket {NRI} does not exist", "nri.socket"),
    ),
    (
        "NRI socket refuses",
        {"nri": NriFact(SocketFact(NRI, "refused", "Connection refused"))},
        "nri-socket",
        Status.FAIL,
        ("refuses connections (Connection refused)",),
    ),
    (
        "NRI handshake fails",
        {"nri": NriFact(SocketFact(NRI, "ok"), error="timed out")},
        "nri-socket",
        Status.FAIL,
        ("handshake failed: timed out",),
    ),
    (
        "spot finds no pod cgroups",
        {"cgroup__spot_blocked": "no kubepods cgroup under /sys/fs/cgroup", "cgroup__spot_layout": None},
        "cgroup",
        Status.FAIL,
        ("nothing is lent", "no kubepods cgroup", "spot.cgroupRoot"),
    ),
    (
        "drivers disagree",
        {"containerd__systemd_cgroup": True},
        "cgroup",
        Status.WARN,
        ("containerd's runc uses systemd", "SystemdCgroup"),
    ),
    (
        "no device-plugin dir",
        {"kubelet__plugin_dir_exists": False},
        "device-plugins",
        Status.FAIL,
        (f"{DP} does not exist", "kubelet.devicePluginDir"),
    ),
    (
        "kubelet.sock missing",
        {"kubelet__registration": SocketFact(DP + "kubelet.sock", "missing")},
        "device-plugins",
        Status.FAIL,
        ("kubelet.sock does not exist", "--root-dir"),
    ),
    (
        "no PodResources socket",
        {"kubelet__pod_resources": SocketFact(PR, "missing")},
        "pod-resources",
        Status.FAIL,
        (f"PodResources socket {PR} does not exist", "kubelet.podResourcesSocket", "cross-pod"),
    ),
    (
        "PodResources List fails",
        {"kubelet__list_error": "UNAVAILABLE"},
        "pod-resources",
        Status.FAIL,
        ("List failed: UNAVAILABLE",),
    ),
    (
        "no vendor plugin",
        {"kubelet__vendor_sockets": (), "kubelet__devices": {}, "kubelet__api_allocatable": {GPU: 0}},
        f"vendor {GPU}",
        Status.FAIL,
        ("no vendor device plugin", "install and start NVIDIA's k8s-device-plugin"),
    ),
    (
        "vendor plugin died, kubelet still lists its devices",
        {"kubelet__vendor_sockets": (SocketFact(DP + "nvidia-gpu.sock", "refused", "Connection refused"),)},
        f"vendor {GPU}",
        Status.FAIL,
        ("no vendor device plugin socket answers", "is down"),
    ),
    (
        "devices all unhealthy",
        {"kubelet__api_allocatable": {GPU: 0}},
        f"vendor {GPU}",
        Status.FAIL,
        ("allocatable is 0",),
    ),
    (
        "plugin serves another resource",
        {"kubelet__devices": {"amd.com/gpu": 4}, "kubelet__api_allocatable": None},
        f"vendor {GPU}",
        Status.FAIL,
        ("serve other resources", "realResources"),
    ),
    ("no exporter configured", {"exporter__source": ""}, "exporter", Status.FAIL, ("metrics.source is empty",)),
    (
        "exporter unreachable",
        {"exporter__error": "connection refused", "exporter__devices": None},
        "exporter",
        Status.FAIL,
        ("cannot read http://127.0.0.1:9400/metrics: connection refused",),
    ),
    ("exporter without devices", {"exporter__devices": 0}, "exporter", Status.FAIL, ("metrics.vendor",)),
    (
        "another module version loaded",
        {"kmod__loaded": "0.1.0"},
        "kmod",
        Status.WARN,
        ("gpukmod 0.1.0 loaded; this gpushare ships 0.2.0", "gpushare kmod install"),
    ),
    (
        "no headers",
        {
            "kmod__loaded": None,
            "kmod__build_blocker": "no kernel headers for the running kernel",
            "exporter__process_level": True,
        },
        "kmod",
        Status.WARN,
        ("cannot be: no kernel headers", "utilization alone", "install the headers"),
    ),
    (
        "Secure Boot",
        {"kmod__loaded": None, "kmod__load_blocker": "kernel lockdown is 'integrity'", "exporter__process_level": True},
        "kmod",
        Status.WARN,
        ("lockdown", "utilization alone"),
    ),
    (
        "module not loaded but buildable",
        {"kmod__loaded": None, "exporter__process_level": True},
        "kmod",
        Status.WARN,
        ("can be built", "gpushare kmod install"),
    ),
    (
        "utilization alone",
        {"kmod__loaded": None, "exporter__process_level": True},
        "spot-returns",
        Status.WARN,
        ("utilization alone", "scrape interval"),
    ),
    (
        "no return signal at all",
        {"kmod__loaded": None},
        "spot-returns",
        Status.FAIL,
        ("no return signal", "nothing is lent", "--no-spot"),
    ),
    (
        "agent down",
        {"agent": AgentFact("0.0.0.0:9487", error="Connection refused")},
        "agent",
        Status.FAIL,
        ("no agent answers on 0.0.0.0:9487 (Connection refused)", "DaemonSet"),
    ),
    ("agent stuck", {"agent__healthz": 503}, "agent", Status.FAIL, ("answers 503", "USR1")),
]


@pytest.mark.parametrize(("changes", "name", "status", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_fault_is_named_with_a_fix(
    changes: dict[str, Any], name: str, status: Status, words: tuple[str, ...]
) -> None:
    checks = diagnose(with_(healthy(), **changes), NRI)
    check = by_name(checks)[name]
    assert check.status is status, check
    text = f"{check.summary} {check.hint}"
    for word in words:
        assert word in text, (word, check)
    if status is not Status.OK:
        assert check.hint or status is Status.WARN, check
    assert exit_code(checks) == (1 if any(c.status is Status.FAIL for c in checks) else 0)


# With spot off, what only spot needs may warn but never fails the node.
SPOT_ONLY: list[tuple[str, dict[str, Any], str, Status]] = [
    ("no exporter", {"exporter__source": ""}, "exporter", Status.OK),
    ("exporter down", {"exporter__error": "refused", "exporter__devices": None}, "exporter", Status.WARN),
    ("no pod cgroups", {"cgroup__spot_blocked": "no kubepods cgroup"}, "cgroup", Status.WARN),
    ("no module, no headers", {"kmod__loaded": None, "kmod__build_blocker": "no headers"}, "kmod", Status.OK),
    ("no return signal", {"kmod__loaded": None}, "spot-returns", Status.OK),
]


@pytest.mark.parametrize(("changes", "name", "status"), [c[1:] for c in SPOT_ONLY], ids=[c[0] for c in SPOT_ONLY])
def test_spot_off_turns_spot_problems_into_warnings(changes: dict[str, Any], name: str, status: Status) -> None:
    checks = diagnose(with_(healthy(), spot=False, **changes), NRI)
    assert by_name(checks)[name].status is status
    assert exit_code(checks) == 0


def test_with_spot_on_the_same_problems_fail() -> None:
    for _, changes, name, _ in SPOT_ONLY[1:3]:
        checks = diagnose(with_(healthy(), **changes), NRI)
        assert by_name(checks)[name].status is Status.FAIL
        assert exit_code(checks) == 1


def test_one_served_resource_of_several_is_enough() -> None:
    facts = with_(healthy(), real_resources=(GPU, "amd.com/gpu", "huawei.com/npu"))
    checks = by_name(diagnose(facts, NRI))
    assert checks[f"vendor {GPU}"].status is Status.OK
    others = checks["vendor others"]
    assert others.status is Status.WARN
    assert others.summary == f"not on this node: amd.com/gpu, huawei.com/npu (it serves {GPU})"
    assert "vendor amd.com/gpu" not in checks
    # Plugins that serve none of them: one failure, naming them all.
    alone = by_name(diagnose(with_(facts, kubelet__devices={}, kubelet__api_allocatable=None), NRI))
    vendor = [c for name, c in alone.items() if name.startswith("vendor")]
    assert [c.name for c in vendor] == ["vendor"] and vendor[0].status is Status.FAIL
    assert "no devices of " + ", ".join(facts.real_resources) in vendor[0].summary
    # No plugin at all: one failure, whose fix names each vendor's own plugin.
    bare = with_(facts, kubelet__devices={}, kubelet__api_allocatable=None, kubelet__vendor_sockets=())
    vendor = [c for name, c in by_name(diagnose(bare, NRI)).items() if name.startswith("vendor")]
    assert [c.name for c in vendor] == ["vendor"] and vendor[0].status is Status.FAIL
    assert "none of " + ", ".join(facts.real_resources) in vendor[0].summary
    assert "AMD's ROCm k8s-device-plugin for amd.com/gpu" in vendor[0].hint
    assert "Huawei's Ascend device plugin for huawei.com/npu" in vendor[0].hint


def test_api_allocatable_stands_in_for_kubelet_when_it_cannot_list() -> None:
    facts = with_(healthy(), kubelet__devices=None, kubelet__devices_error="UNIMPLEMENTED")
    check = by_name(diagnose(facts, NRI))[f"vendor {GPU}"]
    assert check.status is Status.OK and "8 devices" in check.summary


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("v2.4.2", (2, 4, 2)),
        ("containerd github.com/containerd/containerd/v2 v2.4.2 abc", (2, 4, 2)),
        ("1.7.24~ds1", (1, 7, 24)),
        ("2.0", (2, 0, 0)),
        ("", None),
        (None, None),
        ("dev", None),
    ],
)
def test_parse_version(text: str | None, version: tuple[int, int, int] | None) -> None:
    assert parse_version(text) == version
