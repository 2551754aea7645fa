"""The GPU part of a container's OCI spec, as plain data that two containers can be compared by.

A sharer, borrower or DinD target should get exactly what an exclusive pod holding the same GPU
gets. What a container gets is decided late: containerd resolves CDI devices, NRI plugins adjust
the spec, and a runtime such as ``nvidia-container-runtime`` rewrites it once more just before
runc reads it. So the spec read here is runc's own, the ``config.json`` in the container's bundle
(``<containerd state>/io.containerd.runtime.v2.task/<namespace>/<id>/config.json``, the same place
in containerd 1.7 and 2.x), read after CreateContainer returned; CRI's verbose status shows the
spec before the runtime's rewrite and would miss what the runtime added.

The part is:

- ``devices``: every ``linux.devices`` entry (path, type, major, minor): a plain container has none
  in its spec (runc adds its defaults itself);
- ``device_rules``: the *allow* rules of ``linux.resources.devices`` (cgroup v1 on this host; runc
  turns the same rules into an eBPF program on v2); every container also has a deny-all rule, which
  is not part of anything's GPU;
- ``mounts``: those whose source is under the driver root, and the device-list mounts under
  ``/var/run/nvidia-container-devices`` (the device plugin's ``volume-mounts`` strategy);
- ``env``: ``NVIDIA_*`` and ``CUDA_*`` variables;
- ``hooks``: every hook of every stage, path and arguments, in the spec's order within a stage
  (runc runs them in that order, and a ``create-symlinks`` before ``update-ldcache`` matters).

What legitimately differs between two containers holding the same GPU is replaced by a placeholder
before anything is compared: the container's ID and bundle directory, and the caller's own
``aliases`` (the driver root, the toolkit's directory), which also keeps the printed diff short and
stable across runs. Mount options are a set (their order means nothing to a bind mount); mounts,
devices, rules and env are sorted; hooks keep their order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Where the device plugin's volume-mounts strategy lists a container's GPUs, and its alias.
DEVICE_LIST_DIRS = ("/var/run/nvidia-container-devices", "/run/nvidia-container-devices")
ENV_PREFIXES = ("NVIDIA_", "CUDA_")
# OCI's hook stages in the order runc reaches them.
HOOK_STAGES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
TASK_DIR = "io.containerd.runtime.v2.task"


@dataclass(frozen=True, order=True)
class Device:
    path: str
    type: str
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.path} ({self.type} {self.major}:{self.minor})"


@dataclass(frozen=True, order=True)
class DeviceRule:
    """An allow rule of the device cgroup; ``None`` major or minor is the wildcard ``*``."""

    type: str
    major: int | None
    minor: int | None
    access: str

    def __str__(self) -> str:
        def num(n: int | None) -> str:
            return "*" if n is None else str(n)

        return f"allow {self.type or 'a'} {num(self.major)}:{num(self.minor)} {self.access}"


@dataclass(frozen=True, order=True)
class Mount:
    destination: str
    source: str
    type: str
    options: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.destination} <- {self.source} ({','.join(self.options)})"


@dataclass(frozen=True)
class Hook:
    stage: str
    path: str
    args: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.stage}: {self.path} {' '.join(self.args[1:])}".rstrip()


@dataclass(frozen=True)
class GpuPart:
    devices: tuple[Device, ...] = ()
    device_rules: tuple[DeviceRule, ...] = ()
    mounts: tuple[Mount, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    hooks: tuple[Hook, ...] = ()

    def env_value(self, name: str) -> str | None:
        return dict(self.env).get(name)

    def device_paths(self) -> list[str]:
        return [d.path for d in self.devices]

    def mount_destinations(self) -> list[str]:
        return [m.destination for m in self.mounts]

    def hook_commands(self) -> list[str]:
        """Each hook as ``<stage> <subcommand>`` (``createContainer update-ldcache``): what it does."""
        return [f"{h.stage} {h.args[1] if len(h.args) > 1 else Path(h.path).name}" for h in self.hooks]

    def is_empty(self) -> bool:
        return self == GpuPart()

    def lines(self) -> list[str]:
        """The part, one item a line, for a report."""
        out = [f"device {d}" for d in self.devices]
        out += [f"rule {r}" for r in self.device_rules]
        out += [f"mount {m}" for m in self.mounts]
        out += [f"env {k}={v}" for k, v in self.env]
        out += [f"hook {h}" for h in self.hooks]
        return out or ["(nothing)"]


def bundle_spec_path(state_dir: Path, container_id: str, namespace: str = "k8s.io") -> Path:
    """Where containerd's runc shim keeps a created container's ``config.json`` (1.7 and 2.x alike)."""
    return state_dir / TASK_DIR / namespace / container_id / "config.json"


def read_bundle_part(
    state_dir: Path,
    container_id: str,
    *,
    driver_root: str,
    aliases: Mapping[str, str] | None = None,
    namespace: str = "k8s.io",
) -> GpuPart:
    """The GPU part of a created container, read from runc's own ``config.json``."""
    path = bundle_spec_path(state_dir, container_id, namespace)
    spec = json.loads(path.read_text())
    placeholders = {str(path.parent): "<bundle>", container_id: "<container-id>", **(aliases or {})}
    return gpu_part(spec, driver_root=driver_root, placeholders=placeholders)


def gpu_part(spec: Mapping[str, Any], *, driver_root: str, placeholders: Mapping[str, str] | None = None) -> GpuPart:
    """The GPU part of an OCI runtime spec; each key of ``placeholders`` found in a string becomes its value."""
    subst = _Substitute(placeholders or {})
    linux: Mapping[str, Any] = spec.get("linux") or {}
    devices = sorted(
        Device(subst(d["path"]), d.get("type", ""), int(d.get("major", 0)), int(d.get("minor", 0)))
        for d in linux.get("devices") or []
    )
    rules = sorted_rules(
        DeviceRule(r.get("type", "a"), r.get("major"), r.get("minor"), r.get("access", ""))
        for r in (linux.get("resources") or {}).get("devices") or []
        if r.get("allow")
    )
    mounts = sorted(
        Mount(
            subst(m.get("destination", "")),
            subst(m.get("source", "")),
            m.get("type", ""),
            tuple(sorted(m.get("options") or [])),
        )
        for m in spec.get("mounts") or []
        if _is_gpu_mount(m, driver_root)
    )
    env = sorted(
        (name, subst(value))
        for name, _, value in (e.partition("=") for e in (spec.get("process") or {}).get("env") or [])
        if name.startswith(ENV_PREFIXES)
    )
    hooks_spec: Mapping[str, Any] = spec.get("hooks") or {}
    unknown = sorted(set(hooks_spec) - set(HOOK_STAGES))
    if unknown:
        raise ValueError(f"OCI spec has hooks of stages {unknown} that are not OCI's {list(HOOK_STAGES)}")
    hooks = [
        Hook(stage, subst(h["path"]), tuple(subst(a) for a in h.get("args") or []))
        for stage in HOOK_STAGES
        for h in hooks_spec.get(stage) or []
    ]
    return GpuPart(tuple(devices), rules, tuple(mounts), tuple(env), tuple(hooks))


def sorted_rules(rules: Iterable[DeviceRule]) -> tuple[DeviceRule, ...]:
    """Rules in a part's order (a wildcard before any number)."""
    return tuple(sorted(rules, key=lambda r: (r.type, _sortable(r.major), _sortable(r.minor), r.access)))


def diff(expected: GpuPart, actual: GpuPart) -> list[str]:
    """What ``actual`` lacks (``-``), has beyond ``expected`` (``+``), or has otherwise (``~``); [] if equal."""
    out = _set_diff("device", expected.devices, actual.devices)
    out += _set_diff("rule", expected.device_rules, actual.device_rules)
    out += _set_diff("mount", expected.mounts, actual.mounts)
    want_env, got_env = dict(expected.env), dict(actual.env)
    for name in sorted(want_env.keys() | got_env.keys()):
        if name not in got_env:
            out.append(f"- env {name}={want_env[name]}")
        elif name not in want_env:
            out.append(f"+ env {name}={got_env[name]}")
        elif want_env[name] != got_env[name]:
            out.append(f"~ env {name}={got_env[name]} (expected {want_env[name]})")
    for stage in HOOK_STAGES:
        want = [h for h in expected.hooks if h.stage == stage]
        got = [h for h in actual.hooks if h.stage == stage]
        missing, extra = _multiset_minus(want, got), _multiset_minus(got, want)
        out += [f"- hook {h}" for h in missing] + [f"+ hook {h}" for h in extra]
        if not missing and not extra and want != got:
            out.append(f"~ hooks {stage}: the same hooks in another order")
    return out


def _set_diff(kind: str, expected: Iterable[object], actual: Iterable[object]) -> list[str]:
    want, got = list(expected), list(actual)
    return [f"- {kind} {x}" for x in want if x not in got] + [f"+ {kind} {x}" for x in got if x not in want]


def _multiset_minus(a: list[Hook], b: list[Hook]) -> list[Hook]:
    rest = list(b)
    out = []
    for x in a:
        if x in rest:
            rest.remove(x)
        else:
            out.append(x)
    return out


def _sortable(n: int | None) -> int:
    return -1 if n is None else n


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/")
    return path == root or path.startswith(root + "/")


def _is_gpu_mount(mount: Mapping[str, Any], driver_root: str) -> bool:
    destination = mount.get("destination", "")
    return _under(mount.get("source", ""), driver_root) or any(_under(destination, d) for d in DEVICE_LIST_DIRS)


class _Substitute:
    """Replaces each placeholder key in a string, longest first (a bundle path holds the container ID)."""

    def __init__(self, placeholders: Mapping[str, str]) -> None:
        self._pairs = sorted(((k, v) for k, v in placeholders.items() if k), key=lambda kv: -len(kv[0]))

    def __call__(self, text: str) -> str:
        for literal, placeholder in self._pairs:
            text = text.replace(literal, placeholder)
        return text
