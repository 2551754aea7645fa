"""The one configuration file (``version: v1``), read into frozen dataclasses.

Rules: camelCase keys as the design spells them; defaults are the
design's; every value is checked where it is parsed; all problems are collected and
raised as one ``ConfigError`` listing ``key: reason (got X)``; unknown keys are errors
with a did-you-mean. Precedence is flag > file > default; the environment only supplies
``NODE_NAME`` (the DaemonSet injects it).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gpushare import keys, rules
from gpushare.errors import ConfigError
from gpushare.installation import check_namespace

CONFIG_VERSION = "v1"

DEFAULT_VISIBILITY_ENV: tuple[str, ...] = (
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "ASCEND_VISIBLE_DEVICES",
    "ASCEND_RT_VISIBLE_DEVICES",
    "MLU_VISIBLE_DEVICES",
    "TOPS_VISIBLE_DEVICES",
    "ENFLAME_VISIBLE_DEVICES",
    "ILUVATAR_COREX_VISIBLE_DEVICES",
    "METAX_VISIBLE_DEVICES",
    "MTHREADS_VISIBLE_DEVICES",
    "XPU_VISIBLE_DEVICES",
    "DCU_VISIBLE_DEVICES",
    # The fake vendor device plugin (tests and demo on machines without GPUs).
    "FAKE_VISIBLE_DEVICES",
)

DEFAULT_DEVICE_LIST_DIRS: tuple[str, ...] = ("/var/run/nvidia-container-devices", "/run/nvidia-container-devices")
DEFAULT_CDI_SPEC_DIRS: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")

# Who may read /metrics from off the node (docs/security.md, "The agent's endpoint").
METRICS_ACCESS_RBAC = "rbac"
METRICS_ACCESS_OPEN = "open"
METRICS_ACCESS_MODES = (METRICS_ACCESS_RBAC, METRICS_ACCESS_OPEN)
# The endpoint keeps this many of its connections for loopback clients (kubelet's probes, `gpushare
# status`), so the cap must leave room for others beside them.
MIN_MAX_CONNECTIONS = 8
MAX_MAX_CONNECTIONS = 1024

DEFAULT_REAL_RESOURCES: tuple[str, ...] = (
    "nvidia.com/gpu",
    "amd.com/gpu",
    "huawei.com/npu",
    "hygon.com/dcu",
    "cambricon.com/mlu",
    "enflame.com/gcu",
    "iluvatar.ai/gpu",
    "metax-tech.com/gpu",
    "mthreads.com/vgpu",
    "kunlunxin.com/xpu",
)


@dataclass(frozen=True)
class NriConfig:
    socket: str = "/var/run/nri/nri.sock"
    plugin_name: str = "gpushare"
    # design §5: index 10 runs before most vendor plugins' defaults and after 00-09 admin hooks.
    plugin_index: str = "10"


@dataclass(frozen=True)
class KubeletConfig:
    device_plugin_dir: str = "/var/lib/kubelet/device-plugins/"
    # kubelet's --root-dir: DRA plugins serve under <rootDir>/plugins/ and register in
    # <rootDir>/plugins_registry/.
    root_dir: str = "/var/lib/kubelet"
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass(frozen=True)
class MetricsTlsConfig:
    # TLS on the endpoint, in the terms of Prometheus' exporter-toolkit web config (cert_file,
    # key_file, client_ca_file): PEM files, read again when they change, since cert-manager renews
    # a certificate by replacing the Secret's files. No certFile: plain HTTP.
    cert_file: str = ""
    key_file: str = ""
    # Clients off the node must present a certificate this CA signed (mutual TLS), on top of what
    # `access` asks of them. Loopback clients are the node itself and are never asked for one.
    client_ca_file: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file)


@dataclass(frozen=True)
class MetricsConfig:
    # Vendor exporter to scrape for utilization; "" disables (spot then stays Unhealthy).
    source: str = ""
    vendor: str = "auto"
    scrape_interval_s: float = 5.0
    scrape_timeout_s: float = 2.0
    # The source's pod labels name the pods whose *processes* use a GPU (the fake
    # exporter of tests and the demo), not the pod it is allocated to (dcgm-exporter). Only
    # then can utilization alone tell a returning owner from a borrower (docs/spot.md).
    process_level: bool = False
    # Our own /metrics endpoint.
    listen: str = "0.0.0.0:9487"
    # /metrics names tenants' pods: a client off the node must show a bearer token the API server
    # authenticates and allows to get /metrics ("rbac"); "open" serves anyone who reaches `listen`.
    access: str = "rbac"
    # Connections the endpoint serves at once. Each holds a thread and a file descriptor, so the
    # cap keeps slow clients from taking what spot reclaim needs (docs/security.md).
    max_connections: int = 32
    tls: MetricsTlsConfig = field(default_factory=MetricsTlsConfig)


@dataclass(frozen=True)
class SpotConfig:
    # Where the node's cgroup filesystem is mounted (the unified v2 mount, or the directory holding
    # the v1 hierarchies). Spot lends nothing when it finds no pod cgroups there (docs/spot.md).
    cgroup_root: str = "/sys/fs/cgroup"


@dataclass(frozen=True)
class DraConfig:
    # DRA mode (docs/dra.md): the node serves gpushare's devices through its DRA driver instead of
    # device plugins and shadow pods. The chart turns it on per node pool.
    enabled: bool = False
    # The vendor's CDI kind whose devices are the node's GPUs (its spec is in cdiSpecDirs).
    vendor_kind: str = "nvidia.com/gpu"
    # Where the claims' own CDI specs are written: one of containerd's cdi_spec_dirs.
    cdi_root: str = "/var/run/cdi"


@dataclass(frozen=True)
class Config:
    version: str = CONFIG_VERSION
    node_name: str = ""
    # Where the agents, shadows and Lease live: the Helm release's namespace, which the chart writes
    # here. A shadow is trusted only there (gpushare.installation).
    namespace: str = keys.DEFAULT_NAMESPACE
    share_specs: tuple[int, ...] = (2, 3, 4, 5)
    dev_share_specs: tuple[int, ...] = (2, 4, 8, 16)
    real_resources: tuple[str, ...] = DEFAULT_REAL_RESOURCES
    visibility_env: tuple[str, ...] = DEFAULT_VISIBILITY_ENV
    # A vendor that lists a container's GPUs as mounts in a directory (NVIDIA's device plugin in its
    # volume-mounts strategy, read by nvidia-container-runtime): such mounts are the GPU's, and a
    # sharer, borrower or DinD target gets them (docs/nvidia.md).
    device_list_dirs: tuple[str, ...] = DEFAULT_DEVICE_LIST_DIRS
    # Where the node's CDI specs are (containerd's cdi_spec_dirs): what they give a container is
    # the GPU's, never the tenant's, so gpushare carries it (docs/nvidia.md).
    cdi_spec_dirs: tuple[str, ...] = DEFAULT_CDI_SPEC_DIRS
    warm_shadows: int = 0
    # Design §3: shadows need a high PriorityClass (created by the manifests) and an image whose
    # entrypoint sleeps until TERM (the kubelet's pause image does exactly that).
    shadow_priority_class: str = "gpushare-shadow"
    # Off: a shadow never preempts, so one tenant's sharer cannot evict another tenant's pod to
    # make room for its GPU. The PriorityClass must say the same (the API refuses a mismatch).
    shadow_preemption: bool = False
    shadow_image: str = "registry.k8s.io/pause:3.10"
    shadow_idle_timeout_s: float = 600.0
    idle_window_s: float = 600.0
    idle_threshold_pct: float = 0.0
    max_block_ms: int = 3000
    state_dir: str = "/var/lib/gpushare"
    netlink_protocol: int = 31
    nri: NriConfig = field(default_factory=NriConfig)
    kubelet: KubeletConfig = field(default_factory=KubeletConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    spot: SpotConfig = field(default_factory=SpotConfig)
    dra: DraConfig = field(default_factory=DraConfig)


# Keys whose YAML spelling is not the mechanical camelCase of the field (durations carry a unit).
_YAML_NAMES = {
    "shadow_idle_timeout_s": "shadowIdleTimeout",
    "idle_window_s": "idleWindow",
    "scrape_interval_s": "scrapeInterval",
    "scrape_timeout_s": "scrapeTimeout",
}
_DURATION_FIELDS = set(_YAML_NAMES)
# Not a duration: the acronym stays in capitals, as in Kubernetes' own field names (clientCAFile).
_YAML_NAMES["client_ca_file"] = "clientCAFile"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def yaml_name(field_name: str) -> str:
    if field_name in _YAML_NAMES:
        return _YAML_NAMES[field_name]
    head, *rest = field_name.split("_")
    return head + "".join(w.capitalize() for w in rest)


def parse_duration_s(value: object) -> float:
    """``"10m"``, ``"30s"``, ``"500ms"``, ``"1h"`` or a bare number of seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration, not a boolean")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.fullmatch(value)):
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    else:
        raise ValueError('a duration such as "10m", "30s" or "500ms"')
    if seconds < 0:
        raise ValueError("must not be negative")
    return seconds


def _check_specs(values: tuple[int, ...]) -> None:
    if not values:
        raise ValueError("must list at least one share spec")
    if not all(rules.is_share_spec(v) for v in values):
        raise ValueError(f"each share spec must be between {rules.MIN_SHARE_SPEC} and {rules.MAX_SHARE_SPEC}")
    if len(set(values)) != len(values):
        raise ValueError("lists a share spec twice")


def _check_resources(values: tuple[str, ...]) -> None:
    for v in values:
        if not rules.is_vendor_resource(v):
            raise ValueError(f"{v!r} is not a vendor resource name like nvidia.com/gpu")


def _check_env_names(values: tuple[str, ...]) -> None:
    for v in values:
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", v):
            raise ValueError(f"{v!r} is not an environment variable name")


def _check_nonneg(value: float) -> None:
    if value < 0:
        raise ValueError("must not be negative")


def _check_pct(value: float) -> None:
    if not 0 <= value <= 100:
        raise ValueError("must be between 0 and 100")


def _check_protocol(value: int) -> None:
    # Netlink protocol numbers are 0..31 (MAX_LINKS 32); 31 is the design's default.
    if not 0 <= value < 32:
        raise ValueError("must be a netlink protocol number between 0 and 31")


def _check_max_block(value: int) -> None:
    if not 1 <= value <= 60_000:
        raise ValueError("must be between 1 and 60000 milliseconds")


def _check_abs_path(value: str) -> None:
    if not value.startswith("/") or "\0" in value:
        raise ValueError("must be an absolute path, e.g. /sys/fs/cgroup")


def _check_abs_paths(values: tuple[str, ...]) -> None:
    for v in values:
        if not v.startswith("/") or "\0" in v or v.rstrip("/") == "":
            raise ValueError(f"{v!r} is not an absolute directory path other than /")


def _check_cdi_kind(value: str) -> None:
    vendor, sep, cls = value.partition("/")
    if not (
        sep
        and re.fullmatch(r"[a-z0-9][a-z0-9.-]*\.[a-z]+", vendor)
        and re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", cls)
    ):
        raise ValueError(f"{value!r} is not a CDI kind like nvidia.com/gpu (vendor/class)")


def _check_metrics_access(value: str) -> None:
    if value not in METRICS_ACCESS_MODES:
        raise ValueError(
            "must be rbac (clients off the node show a bearer token that a TokenReview authenticates and a "
            "SubjectAccessReview allows to get /metrics) or open (anyone who reaches metrics.listen)"
        )


def _check_max_connections(value: int) -> None:
    if not MIN_MAX_CONNECTIONS <= value <= MAX_MAX_CONNECTIONS:
        raise ValueError(f"must be between {MIN_MAX_CONNECTIONS} and {MAX_MAX_CONNECTIONS}")


def _check_optional_abs_path(value: str) -> None:
    if value and (not value.startswith("/") or "\0" in value):
        raise ValueError("must be an absolute path to a PEM file, or empty")


def _tls_problems(tls: MetricsTlsConfig) -> list[str]:
    """What the TLS keys say together: a certificate needs its key, and a client CA needs TLS."""
    problems = []
    if bool(tls.cert_file) != bool(tls.key_file):
        given, missing = ("certFile", "keyFile") if tls.cert_file else ("keyFile", "certFile")
        problems.append(f"metrics.tls.{missing}: required with metrics.tls.{given} (a certificate and its key)")
    if tls.client_ca_file and not tls.cert_file:
        problems.append("metrics.tls.clientCAFile: needs metrics.tls.certFile and keyFile (a client CA is part of TLS)")
    return problems


def _check_index(value: str) -> None:
    if not re.fullmatch(r"[0-9]{2}", value):
        raise ValueError('must be two digits, e.g. "10"')


_VALIDATORS: dict[str, Callable[[Any], None]] = {
    "namespace": check_namespace,
    "share_specs": _check_specs,
    "dev_share_specs": _check_specs,
    "real_resources": _check_resources,
    "visibility_env": _check_env_names,
    "device_list_dirs": _check_abs_paths,
    "cdi_spec_dirs": _check_abs_paths,
    "warm_shadows": _check_nonneg,
    "idle_threshold_pct": _check_pct,
    "max_block_ms": _check_max_block,
    "netlink_protocol": _check_protocol,
    "plugin_index": _check_index,
    "scrape_interval_s": _check_nonneg,
    "cgroup_root": _check_abs_path,
    "root_dir": _check_abs_path,
    "cdi_root": _check_abs_path,
    "vendor_kind": _check_cdi_kind,
    "access": _check_metrics_access,
    "max_connections": _check_max_connections,
    "cert_file": _check_optional_abs_path,
    "key_file": _check_optional_abs_path,
    "client_ca_file": _check_optional_abs_path,
}

T = TypeVar("T")


def _coerce(name: str, tp: Any, value: object) -> Any:
    """Coerce one YAML value to the field's type or raise ValueError with the reason."""
    if name in _DURATION_FIELDS:
        return parse_duration_s(value)
    origin = typing.get_origin(tp)
    if origin is tuple:
        (item_tp, _) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ValueError("must be a list")
        return tuple(_coerce(name + "[]", item_tp, v) for v in value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError("must be true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("must be an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("must be a number")
        return float(value)
    if tp is str:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)  # YAML reads `pluginIndex: 10` as an int
        if not isinstance(value, str):
            raise ValueError("must be a string")
        return value
    raise TypeError(f"unsupported config field type {tp!r}")  # programming error, not user input


def _build(cls: type[T], data: object, path: str, problems: list[str]) -> T:
    if not isinstance(data, dict):
        problems.append(f"{path or 'the file'}: must be a mapping (got {type(data).__name__})")
        return cls()
    hints = typing.get_type_hints(cls)
    fields = {yaml_name(f.name): f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{path}{key}"
        f = fields.get(key) if isinstance(key, str) else None
        if f is None:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {path}{close[0]}?" if close else ""
            problems.append(f"{where}: unknown key{hint}")
            continue
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            kwargs[f.name] = _build(tp, value, f"{where}.", problems)  # type: ignore[arg-type]
            continue
        try:
            coerced = _coerce(f.name, tp, value)
            if f.name in _VALIDATORS:
                _VALIDATORS[f.name](coerced)
        except ValueError as exc:
            problems.append(f"{where}: {exc} (got {value!r:.80})")
            continue
        kwargs[f.name] = coerced
    return cls(**kwargs)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping.

    PyYAML keeps the last of two equal keys without a word. In a config file that is a silent
    override: the chart writes its keys and ``config.extra`` after them, so a key in both would
    quietly win over the chart's (a shadow image, a share spec). The file is refused instead,
    naming the key and both lines.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base constructor says so
                    break
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping",
                        node.start_mark,
                        f"found the key {key!r} twice (first on line {first.start_mark.line + 1}); "
                        "a key may be given once",
                        key_node.start_mark,
                    )
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def load_config(path: str | os.PathLike[str] | None = None, *, text: str | None = None) -> Config:
    """Read and validate the config; an absent path gives the defaults.

    Raises ``ConfigError`` listing every problem; nothing else is touched.
    """
    source = str(path) if path is not None else "config"
    if text is None and path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError([f"{path}: cannot read ({exc.strerror})"], source) from exc
    data: object = {}
    if text is not None:
        try:
            data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: builds plain data only
        except yaml.YAMLError as exc:
            raise ConfigError([f"not valid YAML: {exc}"], source) from exc
        if data is None:
            data = {}
    problems: list[str] = []
    if isinstance(data, dict):
        version = data.get("version", CONFIG_VERSION)
        if version != CONFIG_VERSION:
            problems.append(f"version: only {CONFIG_VERSION!r} is understood (got {version!r})")
    cfg = _build(Config, data, "", problems)
    if not any(p.startswith("metrics.tls") for p in problems):
        problems.extend(_tls_problems(cfg.metrics.tls))
    if problems:
        raise ConfigError(problems, source)
    if not cfg.node_name and os.environ.get("NODE_NAME"):
        cfg = dataclasses.replace(cfg, node_name=os.environ["NODE_NAME"])
    return cfg


def with_overrides(cfg: Config, **changes: Any) -> Config:
    """Apply command-line flags (highest precedence); ``None`` means "flag not given"."""
    return dataclasses.replace(cfg, **{k: v for k, v in changes.items() if v is not None})


def effective_config(cfg: Config) -> dict[str, Any]:
    """The config as YAML-named plain data, for logging once at start and for `config show`."""

    def convert(obj: Any) -> Any:
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return {yaml_name(f.name): convert(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        if isinstance(obj, tuple):
            return [convert(v) for v in obj]
        return obj

    result: dict[str, Any] = convert(cfg)
    return result


__all__ = [
    "CONFIG_VERSION",
    "METRICS_ACCESS_MODES",
    "METRICS_ACCESS_OPEN",
    "METRICS_ACCESS_RBAC",
    "Config",
    "DraConfig",
    "KubeletConfig",
    "MetricsConfig",
    "MetricsTlsConfig",
    "NriConfig",
    "SpotConfig",
    "effective_config",
    "load_config",
    "parse_duration_s",
    "with_overrides",
]
