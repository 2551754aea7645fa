"""`gpushare doctor`'s diagnosis: the facts about a node, and what each means as ok / warn / fail and one fix.

The probes (``cli.doctor.host_probe``, ``cli.doctor.socket_probe`` and the command) read the host
into the plain facts below. Each field is what a probe found, or ``None`` where it could not
tell; probes never raise, they record why (``*_error``), so one unreadable thing costs one
check, not the whole report. ``diagnose`` turns the facts into one ``Check`` per concern, in
the order an operator fixes them (the runtime first, the agent last). A check fails only when
a feature that is turned on cannot work; the same problem under a feature that is off is a warning. Sharing and
Docker-in-Docker are always on (they need NRI, the kubelet sockets and a vendor plugin); spot
is on unless the agent runs with ``--no-spot`` (it also needs an exporter, pod cgroups and a
way to see owners return).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from cli.doctor.nvidia_modes import nvidia_verdict, runtime_mode_of
from gpushare.rules import ReturnSignal, return_signal

# -- the facts, as plain data: what a probe found, or None where it could not tell -----------------------


@dataclass(frozen=True)
class SocketFact:
    """A Unix socket as found: ``state`` is ok (accepted a connection), missing, not-socket or refused."""

    path: str
    state: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    def describe(self) -> str:
        what = {"ok": "answers", "missing": "does not exist", "not-socket": "is not a socket"}.get(self.state)
        return f"{self.path} {what or 'refuses connections'}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class ContainerdFact:
    """The containerd whose config names our NRI socket (``pid`` None: no running containerd does)."""

    pid: int | None = None
    config_path: str | None = None
    config_error: str | None = None
    version: str | None = None  # from its binary, e.g. "2.4.2"
    nri_disabled: bool | None = None  # [plugins."io.containerd.nri.v1.nri"] disable, default applied
    nri_socket: str | None = None  # its socket_path, default applied
    systemd_cgroup: bool | None = None  # the default runtime's SystemdCgroup
    others: tuple[str, ...] = ()  # other containerd processes: "pid N (config C, NRI socket S)"
    # The default runtime's binary (options.BinaryName; "" for containerd's own runc) and, when it is
    # NVIDIA's runtime, the mode its config.toml sets (None: unset or unreadable).
    runtime_binary: str = ""
    nvidia_runtime_mode: str | None = None
    # Its accept-nvidia-visible-devices-envvar-when-unprivileged (False: the hardened mode).
    nvidia_envvar_when_unprivileged: bool | None = None


@dataclass(frozen=True)
class NvidiaPluginFact:
    """NVIDIA's device plugin as found in kubelet's directory: the strategy its Allocate answers in."""

    socket: str
    strategy: str | None  # None: an answer in none of the four strategies
    error: str | None = None
    # The plugin lists replicas ("<uuid>::<n>"): it shares its GPUs itself (time-slicing or MPS).
    replicas: bool = False


@dataclass(frozen=True)
class NriFact:
    """The NRI socket and a real handshake on it (register, Configure, Synchronize, disconnect)."""

    socket: SocketFact
    runtime: str | None = None
    runtime_version: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class CgroupFact:
    root: str  # spot.cgroupRoot
    version: str | None  # v1, v2, hybrid (from the mount table); None: no cgroup filesystem there
    kubelet_driver: str | None = None  # cgroupDriver from kubelet's config (or flag)
    kubelet_config: str | None = None
    kubelet_error: str | None = None
    # What spot itself finds under the root (podcgroups.cgroups.detect_layout): where pods are
    # and the driver their names show, or why it finds none (then nothing is lent).
    spot_layout: str | None = None
    layout_driver: str | None = None
    spot_blocked: str | None = None


@dataclass(frozen=True)
class KubeletFact:
    plugin_dir: str
    plugin_dir_exists: bool
    registration: SocketFact  # kubelet.sock
    vendor_sockets: tuple[SocketFact, ...]  # every other socket but gpushare's own
    pod_resources: SocketFact
    pods: int | None = None  # pods PodResources List returned
    list_error: str | None = None
    devices: Mapping[str, int] | None = None  # GetAllocatableResources: resource -> device count
    devices_error: str | None = None
    device_ids: Mapping[str, tuple[str, ...]] | None = None  # the same, by ID
    api_allocatable: Mapping[str, int] | None = None  # the node's allocatable, when the API answered
    api_error: str | None = None


@dataclass(frozen=True)
class ExporterFact:
    source: str  # metrics.source; "" when unset
    process_level: bool  # metrics.processLevel
    devices: int | None = None
    vendor: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class KmodFact:
    release: str
    loaded: str | None
    package_version: str
    load_blocker: str | None  # why no unsigned module loads here (gpukmod.module.load_blocker)
    build_blocker: str | None  # why it cannot be built here (no headers)


@dataclass(frozen=True)
class AgentFact:
    listen: str
    healthz: int | None = None  # HTTP status of /healthz
    error: str | None = None
    spot: bool | None = None  # whether the running agent lends GPUs (/status has spot_runtime); None: unknown
    spot_mode: str | None = None  # /status spot_runtime.mode: how the running agent sees returns


@dataclass(frozen=True)
class NodeFacts:
    containerd: ContainerdFact
    nri: NriFact
    cgroup: CgroupFact
    kubelet: KubeletFact
    real_resources: tuple[str, ...]
    exporter: ExporterFact
    kmod: KmodFact
    agent: AgentFact
    spot: bool = True  # the agent lends GPUs (not --no-spot)
    nvidia: NvidiaPluginFact | None = None  # None: no NVIDIA device plugin on this node


_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """``"v2.4.2"``, ``"1.7.24~ds1"`` -> (2, 4, 2), (1, 7, 24); ``None`` when no version is in it."""
    m = _VERSION.search(text or "")
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    """One concern: what was found (``summary``) and, unless ok, the one thing to do (``hint``)."""

    name: str
    status: Status
    summary: str
    hint: str = ""


NRI_SECTION = '[plugins."io.containerd.nri.v1.nri"]'
_MIN_NRI = (1, 7)


def _spot_level(spot: bool) -> Status:
    return Status.FAIL if spot else Status.WARN


def check_containerd(c: ContainerdFact, nri: NriFact, nri_socket: str) -> Check:
    version_text = nri.runtime_version or c.version
    source = "NRI handshake" if nri.runtime_version else "its binary"
    if c.pid is None and not nri.runtime_version:
        found = f"; running: {'; '.join(c.others)}" if c.others else ""
        return Check(
            "containerd",
            Status.FAIL,
            f"no running containerd is configured with the NRI socket {nri_socket}{found}",
            "start containerd, or set nri.socket in the gpushare config to the socket_path in containerd's "
            f"{NRI_SECTION} section",
        )
    version = parse_version(version_text)
    where = f" (pid {c.pid}, config {c.config_path})" if c.pid is not None else ""
    if version is None:
        return Check(
            "containerd", Status.WARN, f"containerd of unknown version{where}", "gpushare needs containerd 1.7 or later"
        )
    summary = f"containerd {version_text} (from {source}){where}"
    if version[:2] < _MIN_NRI:
        return Check("containerd", Status.FAIL, summary, "NRI needs containerd 1.7 or later: upgrade containerd")
    return Check("containerd", Status.OK, summary)


def check_nri_config(c: ContainerdFact, nri_socket: str) -> Check:
    if c.pid is None:
        return Check("nri-config", Status.WARN, "no containerd config names this socket; see the containerd check")
    if c.config_error:
        return Check(
            "nri-config",
            Status.WARN,
            f"cannot read containerd's config: {c.config_error}",
            "the nri-socket check below decides whether NRI works",
        )
    if c.nri_disabled:
        return Check(
            "nri-config",
            Status.FAIL,
            f"NRI is disabled in {c.config_path} (containerd 1.7 turns it off unless told otherwise)",
            f"set disable = false under {NRI_SECTION} in {c.config_path} and restart containerd (docs/nri.md)",
        )
    return Check("nri-config", Status.OK, f"NRI enabled in {c.config_path}, socket_path {c.nri_socket}")


def check_nri_socket(nri: NriFact) -> Check:
    s = nri.socket
    if not s.ok:
        hint = (
            "containerd creates the NRI socket only with NRI enabled: fix nri-config, or point nri.socket at "
            "containerd's socket_path (and mount its directory into the agent pod)"
        )
        return Check("nri-socket", Status.FAIL, f"NRI socket {s.describe()}", hint)
    if nri.error:
        return Check(
            "nri-socket",
            Status.FAIL,
            f"NRI socket {s.path} accepts connections but the handshake failed: {nri.error}",
            "see containerd's log for the NRI plugin registration",
        )
    return Check("nri-socket", Status.OK, f"NRI socket {s.path}: handshake with {nri.runtime} {nri.runtime_version}")


def check_cgroup(cg: CgroupFact, c: ContainerdFact, spot: bool) -> Check:
    kubelet = f", kubelet cgroupDriver {cg.kubelet_driver}" if cg.kubelet_driver else ""
    desc = f"cgroup {cg.version or 'filesystem not found'} at {cg.root}{kubelet}"
    if cg.spot_blocked:
        return Check(
            "cgroup",
            _spot_level(spot),
            f"{desc}; spot finds no pod cgroups, so nothing is lent: {cg.spot_blocked}",
            "point spot.cgroupRoot at the host's cgroup mount that holds kubelet's kubepods cgroups",
        )
    driver = cg.kubelet_driver or cg.layout_driver
    runtime = None if c.systemd_cgroup is None else ("systemd" if c.systemd_cgroup else "cgroupfs")
    if driver and runtime and driver != runtime:
        return Check(
            "cgroup",
            Status.WARN,
            f"{desc}, but containerd's runc uses {runtime} (SystemdCgroup = {str(c.systemd_cgroup).lower()})",
            "make kubelet's cgroupDriver and containerd's SystemdCgroup agree, or pods fail to start",
        )
    return Check("cgroup", Status.OK, f"{desc}; spot: {cg.spot_layout or 'not looked at'}")


def check_device_plugin_dir(k: KubeletFact) -> Check:
    if not k.plugin_dir_exists:
        return Check(
            "device-plugins",
            Status.FAIL,
            f"the device-plugin directory {k.plugin_dir} does not exist",
            "set kubelet.devicePluginDir to kubelet's <root-dir>/device-plugins/ (and mount it into the agent pod)",
        )
    if not k.registration.ok:
        return Check(
            "device-plugins",
            Status.FAIL,
            f"kubelet's registration socket {k.registration.describe()}",
            "is kubelet running with this --root-dir? gpushare's device plugins register through it",
        )
    return Check("device-plugins", Status.OK, f"{k.registration.path} answers")


def check_pod_resources(k: KubeletFact) -> Check:
    hint = (
        "set kubelet.podResourcesSocket to kubelet's <root-dir>/pod-resources/kubelet.sock (and mount its "
        "directory); without it every cross-pod instruction is refused"
    )
    if not k.pod_resources.ok:
        return Check("pod-resources", Status.FAIL, f"PodResources socket {k.pod_resources.describe()}", hint)
    if k.list_error:
        return Check("pod-resources", Status.FAIL, f"PodResources List failed: {k.list_error}", "see kubelet's log")
    return Check("pod-resources", Status.OK, f"PodResources {k.pod_resources.path}: List answered ({k.pods} pods)")


# Whose device plugin advertises each vendor resource gpushare knows, for the fix a check names.
VENDOR_PLUGINS = {
    "nvidia.com/gpu": "NVIDIA's k8s-device-plugin (or the GPU Operator)",
    "amd.com/gpu": "AMD's ROCm k8s-device-plugin",
    "huawei.com/npu": "Huawei's Ascend device plugin",
    "hygon.com/dcu": "Hygon's DCU device plugin",
    "cambricon.com/mlu": "Cambricon's MLU device plugin",
    "enflame.com/gcu": "Enflame's GCU device plugin",
    "iluvatar.ai/gpu": "Iluvatar CoreX's device plugin",
    "metax-tech.com/gpu": "MetaX's GPU device plugin",
    "mthreads.com/vgpu": "Moore Threads' device plugin",
    "kunlunxin.com/xpu": "Kunlunxin's XPU device plugin",
}
_NO_PLUGIN = "no vendor device plugin"
_OTHER_RESOURCES = "no devices of"


def plugin_of(resource: str) -> str:
    return VENDOR_PLUGINS.get(resource, f"the vendor device plugin that advertises {resource}")


def _vendor_check(k: KubeletFact, resource: str, live: list[str]) -> Check:
    name = f"vendor {resource}"
    devices = (k.devices or {}).get(resource) if k.devices is not None else None
    api = (k.api_allocatable or {}).get(resource, 0) if k.api_allocatable is not None else None
    count = devices if devices is not None else api
    sockets = ", ".join(live) or "none"
    seen = "" if api is None else f"; node allocatable {api}"
    if count and live and api != 0:
        return Check(name, Status.OK, f"{count} devices (kubelet){seen}; vendor plugin sockets: {sockets}")
    if count and api == 0:
        return Check(
            name,
            Status.FAIL,
            f"kubelet lists {count} devices but the node's allocatable is 0 (all unhealthy)",
            "see the vendor plugin's log",
        )
    if count:
        return Check(
            name,
            Status.FAIL,
            f"kubelet lists {count} devices but no vendor device plugin socket answers in {k.plugin_dir}",
            "the vendor device plugin is down: check its pod (kubelet drops its devices a few minutes later)",
        )
    if live:
        return Check(
            name,
            Status.FAIL,
            f"{_OTHER_RESOURCES} {resource} on this node; plugin sockets {sockets} serve other resources",
            "set realResources in the gpushare config to the resource your vendor plugin advertises",
        )
    unknown = " (kubelet's device list unavailable)" if count is None else ""
    return Check(
        name,
        Status.FAIL,
        f"{_NO_PLUGIN}: no socket answers in {k.plugin_dir} and kubelet lists no {resource}{unknown}",
        f"install and start {plugin_of(resource)} on this node",
    )


def check_vendor_plugins(k: KubeletFact, resources: tuple[str, ...]) -> list[Check]:
    """One check per configured real resource this node has or should have; with several (a mixed
    fleet), one served is enough and the others are one line, not one failure each."""
    live = [s.path.rsplit("/", 1)[-1] for s in k.vendor_sockets if s.ok]
    checks = [_vendor_check(k, r, live) for r in resources]
    if len(checks) < 2:
        return checks
    served = [c for c in checks if c.status is Status.OK]
    if served:
        absent = [r for r, c in zip(resources, checks, strict=True) if c.status is not Status.OK]
        if absent:
            note = f"not on this node: {', '.join(absent)} (it serves {', '.join(c.name[7:] for c in served)})"
            served.append(Check("vendor others", Status.WARN, note))
        return served
    # Nothing served: a resource with a finding of its own keeps it; the rest are one failure,
    # since this node's vendor is unknown: plugins serving other resources, or none at all (then
    # the fix names each vendor's plugin).
    own = [c for c in checks if not c.summary.startswith((_NO_PLUGIN, _OTHER_RESOURCES))]
    elsewhere = [r for r, c in zip(resources, checks, strict=True) if c.summary.startswith(_OTHER_RESOURCES)]
    missing = [r for r, c in zip(resources, checks, strict=True) if c.summary.startswith(_NO_PLUGIN)]
    if elsewhere:
        own.append(
            Check(
                "vendor",
                Status.FAIL,
                f"{_OTHER_RESOURCES} {', '.join(elsewhere)} on this node; plugin sockets {', '.join(live)} "
                "serve other resources",
                "set realResources in the gpushare config to the resource your vendor plugin advertises",
            )
        )
    elif missing:
        own.append(
            Check(
                "vendor",
                Status.FAIL,
                f"{_NO_PLUGIN}: no socket answers in {k.plugin_dir} and kubelet lists none of {', '.join(missing)}",
                "install and start this node's vendor plugin: "
                + "; ".join(f"{plugin_of(r)} for {r}" for r in missing)
                + "; or set realResources to the resource yours advertises",
            )
        )
    return own


def check_exporter(e: ExporterFact, spot: bool) -> Check:
    level = _spot_level(spot)
    if not e.source:
        if not spot:
            return Check("exporter", Status.OK, "metrics.source not set (spot is off)")
        return Check(
            "exporter",
            level,
            "metrics.source is empty: spot has no utilization to find idle GPUs",
            "set metrics.source to the node's GPU exporter, e.g. dcgm-exporter's http://127.0.0.1:9400/metrics",
        )
    if e.error:
        return Check("exporter", level, f"cannot read {e.source}: {e.error}", "is the exporter running on this node?")
    if not e.devices:
        return Check(
            "exporter",
            level,
            f"{e.source} answered, but no GPU device was recognised in it",
            "set metrics.vendor to the exporter's vendor (`gpushare metrics vendors`)",
        )
    attribution = "GPU processes" if e.process_level else "the pod each GPU is allocated to"
    return Check("exporter", Status.OK, f"{e.source}: {e.devices} devices ({e.vendor}); labels name {attribution}")


def check_kmod(k: KmodFact, spot: bool) -> Check:
    if k.loaded is not None:
        if k.loaded != k.package_version:
            return Check(
                "kmod",
                Status.WARN,
                f"gpukmod {k.loaded} loaded; this gpushare ships {k.package_version}",
                "run `gpushare kmod install` (the kmod init container does) to replace it",
            )
        return Check("kmod", Status.OK, f"gpukmod {k.loaded} loaded")
    level = Status.WARN if spot else Status.OK
    without = "spot sees owners return by utilization alone" if spot else "unused while spot is off"
    reason = k.load_blocker or k.build_blocker
    if reason is not None:
        hint = "install the headers, then `gpushare kmod install`" if reason is k.build_blocker else ""
        return Check("kmod", level, f"gpukmod not loaded and cannot be: {reason}; {without}", hint if spot else "")
    return Check(
        "kmod",
        level,
        f"gpukmod not loaded; the headers for {k.release} are present, so it can be built; {without}",
        "run `gpushare kmod install` (the kmod init container does)" if spot else "",
    )


def check_spot_returns(f: NodeFacts) -> Check:
    """How the agent will see an owner come back: the module, utilization alone, or not at all."""
    if not f.spot:
        return Check("spot-returns", Status.OK, "spot is off (agent --no-spot)")
    agent = f" (the agent reports: {f.agent.spot_mode})" if f.agent.spot_mode else ""
    signal = return_signal(kmod_watches=f.kmod.loaded is not None, metrics_name_users=f.exporter.process_level)
    if signal is ReturnSignal.KERNEL_MODULE:
        return Check("spot-returns", Status.OK, f"the kernel module holds a returning owner's first GPU call{agent}")
    if signal is ReturnSignal.UTILIZATION:
        return Check(
            "spot-returns",
            Status.WARN,
            f"utilization alone: a returning owner waits up to a scrape interval for its GPU{agent}",
            "load gpukmod (`gpushare kmod install`) for returns within milliseconds",
        )
    return Check(
        "spot-returns",
        Status.FAIL,
        "no return signal: gpukmod is not loaded and metrics.processLevel is false (the exporter names the pod "
        f"a GPU is allocated to, not who uses it), so nothing is lent{agent}",
        "load gpukmod (`gpushare kmod install`), or use an exporter that lists GPU processes with "
        "metrics.processLevel: true, or run the agent with --no-spot",
    )


def check_agent(a: AgentFact) -> Check:
    if a.healthz == 200:
        return Check("agent", Status.OK, f"/healthz on {a.listen} answers 200")
    if a.healthz is not None:
        return Check(
            "agent",
            Status.FAIL,
            f"/healthz on {a.listen} answers {a.healthz}: the reconcile loop has stopped passing",
            "see the agent's log; `kill -USR1 <pid>` writes every thread's stack to it",
        )
    return Check(
        "agent",
        Status.FAIL,
        f"no agent answers on {a.listen} ({a.error or 'no answer'})",
        "start the agent (the gpushare-agent DaemonSet, or `gpushare agent`); metrics.listen must match",
    )


def check_nvidia(n: NvidiaPluginFact, c: ContainerdFact) -> Check:
    """Whether sharing, lending and DinD work in this node's NVIDIA mode (docs/nvidia.md's table)."""
    name = "nvidia stack"
    if n.error is not None or n.strategy is None:
        return Check(
            name,
            Status.WARN,
            f"NVIDIA's device plugin at {n.socket}: {n.error or 'its Allocate answer is in no known strategy'}",
            "see docs/nvidia.md for the modes gpushare is measured on",
        )
    version = parse_version(c.version)
    if version is None:
        return Check(name, Status.WARN, f"strategy {n.strategy}, containerd version unknown", "")
    runtime = runtime_mode_of(c.runtime_binary, c.nvidia_runtime_mode, c.nvidia_envvar_when_unprivileged)
    verdict = nvidia_verdict(n.strategy, runtime, version[0])
    summary = f"strategy {n.strategy}, {runtime}, containerd {c.version}: {verdict.how}"
    if verdict.note:
        summary += f"; {verdict.note}"
    if not verdict.works:
        return Check(
            name, Status.FAIL, summary + "; CUDA cannot start in an exclusive pod, a sharer or a borrower", verdict.fix
        )
    if n.replicas:
        return Check(
            name,
            Status.WARN,
            summary + "; the plugin shares each GPU itself (time-slicing or MPS replicas): a shadow holds one replica, "
            "which share-gpu-N splits again, and spot lends no replica",
            "turn the device plugin's sharing off on nodes where gpushare shares and lends (docs/nvidia.md)",
        )
    if verdict.same is None:
        return Check(name, Status.WARN, summary, verdict.fix)
    return Check(name, Status.OK, summary)


def diagnose(f: NodeFacts, nri_socket: str) -> list[Check]:
    """Every check, in the order an operator fixes them: runtime, cgroups, kubelet, vendor, spot, agent."""
    return [
        check_containerd(f.containerd, f.nri, nri_socket),
        check_nri_config(f.containerd, nri_socket),
        check_nri_socket(f.nri),
        check_cgroup(f.cgroup, f.containerd, f.spot),
        check_device_plugin_dir(f.kubelet),
        check_pod_resources(f.kubelet),
        *check_vendor_plugins(f.kubelet, f.real_resources),
        *([check_nvidia(f.nvidia, f.containerd)] if f.nvidia is not None else []),
        check_exporter(f.exporter, f.spot),
        check_kmod(f.kmod, f.spot),
        check_spot_returns(f),
        check_agent(f.agent),
    ]


def exit_code(checks: list[Check]) -> int:
    """0 only when every feature that is on can be served: no check failed (warnings are fine)."""
    return 1 if any(c.status is Status.FAIL for c in checks) else 0


__all__ = ["Check", "Status", "diagnose", "exit_code"]
