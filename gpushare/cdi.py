"""The node's CDI specs as plain data: which edits a CDI device makes to a container.

gpushare never resolves a GPU the vendor's way itself when the runtime can: on containerd 2.x an
NRI adjustment names CDI devices and containerd applies their edits. It needs the specs for two
other things: telling which of a source container's mounts, hooks and variables are its GPU's
(containerd applied them from these specs before NRI showed us the container, and a tenant's
volume must never travel to another pod), and, where the runtime cannot take CDI names in an
adjustment (containerd 1.7), knowing what those names stand for.

A spec (CDI ``SPEC.md``): ``kind`` (``vendor/class``), spec-wide ``containerEdits`` that every
device of the spec gets, and ``devices``, each with a ``name`` and its own ``containerEdits``
(``env`` as ``K=V``, ``deviceNodes``, ``mounts``, ``hooks``). A device's qualified name is
``kind=name``.

Parsing is pure; ``read_spec_dirs`` reads the files. A malformed spec is skipped with its reason,
as containerd and the toolkit skip it: one bad file must not hide the others.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

SPEC_SUFFIXES = (".json", ".yaml", ".yml")
# Larger specs are not CDI specs; the cap keeps a stray file from costing the agent memory.
MAX_SPEC_BYTES = 4 << 20
# OCI's hook stages, in the order a runtime reaches them; a CDI hookName is one of them.
HOOK_STAGES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
_T = TypeVar("_T")


@dataclass(frozen=True)
class CdiDeviceNode:
    path: str  # in the container
    host_path: str
    type: str = ""
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    uid: int | None = None
    gid: int | None = None


@dataclass(frozen=True)
class Mount:
    """A mount as OCI names it (a CDI spec's ``containerPath`` is the destination, ``hostPath`` the
    source), one type for a spec's mount and a container's, so that the two compare equal."""

    destination: str
    source: str
    type: str = ""
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class Hook:
    """An OCI hook with its stage, as a CDI spec names it and as NRI carries it (one type for both,
    so a container's hook and a spec's compare equal)."""

    stage: str  # OCI's name: createRuntime, createContainer, ...
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None

    @property
    def key(self) -> tuple[str, str, tuple[str, ...]]:
        """What makes two hooks the same hook."""
        return (self.stage, self.path, self.args)


@dataclass(frozen=True)
class CdiEdits:
    env: tuple[str, ...] = ()  # "K=V"
    device_nodes: tuple[CdiDeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()

    def plus(self, other: CdiEdits) -> CdiEdits:
        """Both edits, in order, each entry once."""
        return CdiEdits(
            _once(self.env + other.env),
            _once(self.device_nodes + other.device_nodes),
            _once(self.mounts + other.mounts),
            _once(self.hooks + other.hooks),
        )

    @property
    def env_names(self) -> frozenset[str]:
        return frozenset(e.partition("=")[0] for e in self.env)


def _once(items: tuple[_T, ...]) -> tuple[_T, ...]:
    return tuple(dict.fromkeys(items))


class CdiSpecError(ValueError):
    """A spec file that is not a valid CDI spec; the message names the file and the problem."""


@dataclass(frozen=True)
class CdiRegistry:
    """Every device of the node's CDI specs, by qualified name, with the edits it makes."""

    devices: Mapping[str, CdiEdits] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()  # "path: why" for each spec file that was not loaded

    def edits_of(self, names: Iterable[str]) -> CdiEdits | None:
        """The edits of all ``names`` together, or None when any of them is unknown here."""
        total = CdiEdits()
        for name in names:
            edits = self.devices.get(name)
            if edits is None:
                return None
            total = total.plus(edits)
        return total

    def knows(self, names: Iterable[str]) -> bool:
        return all(n in self.devices for n in names)

    @property
    def all_edits(self) -> CdiEdits:
        """What any device of the node could have given a container."""
        return self.edits_of(self.devices) or CdiEdits()


def parse_annotation_value(value: str) -> tuple[str, ...]:
    """A ``cdi.k8s.io/`` annotation's value: comma-separated qualified device names."""
    return tuple(n.strip() for n in value.split(",") if n.strip())


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CdiSpecError(f"{where} is not a list of strings")
    return tuple(value)


def _int(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise CdiSpecError(f"{where} is not an integer")
    return value


def _str(entry: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> str:
    value = entry.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise CdiSpecError(f"{where}.{key} is missing or not a string")
    return value


def _entries(edits: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
    value = edits.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise CdiSpecError(f"{where}.{key} is not a list of objects")
    return value


def parse_edits(edits: Any, where: str) -> CdiEdits:
    if edits is None:
        return CdiEdits()
    if not isinstance(edits, dict):
        raise CdiSpecError(f"{where} is not an object")
    nodes = []
    for i, n in enumerate(_entries(edits, "deviceNodes", where)):
        at = f"{where}.deviceNodes[{i}]"
        path = _str(n, "path", at, required=True)
        nodes.append(
            CdiDeviceNode(
                path=path,
                host_path=_str(n, "hostPath", at) or path,
                type=_str(n, "type", at),
                major=_int(n.get("major"), f"{at}.major"),
                minor=_int(n.get("minor"), f"{at}.minor"),
                file_mode=_int(n.get("fileMode"), f"{at}.fileMode"),
                uid=_int(n.get("uid"), f"{at}.uid"),
                gid=_int(n.get("gid"), f"{at}.gid"),
            )
        )
    mounts = []
    for i, m in enumerate(_entries(edits, "mounts", where)):
        at = f"{where}.mounts[{i}]"
        mounts.append(
            Mount(
                destination=_str(m, "containerPath", at, required=True),
                source=_str(m, "hostPath", at, required=True),
                type=_str(m, "type", at),
                options=_strings(m.get("options"), f"{at}.options"),
            )
        )
    hooks = []
    for i, h in enumerate(_entries(edits, "hooks", where)):
        at = f"{where}.hooks[{i}]"
        if h.get("hookName") not in HOOK_STAGES:
            raise CdiSpecError(
                f"{at}.hookName {h.get('hookName')!r} is not an OCI hook stage ({', '.join(HOOK_STAGES)})"
            )
        hooks.append(
            Hook(
                stage=_str(h, "hookName", at, required=True),
                path=_str(h, "path", at, required=True),
                args=_strings(h.get("args"), f"{at}.args"),
                env=_strings(h.get("env"), f"{at}.env"),
                timeout=_int(h.get("timeout"), f"{at}.timeout"),
            )
        )
    env = _strings(edits.get("env"), f"{where}.env")
    if any("=" not in e for e in env):
        raise CdiSpecError(f"{where}.env has an entry without '='")
    return CdiEdits(env, tuple(nodes), tuple(mounts), tuple(hooks))


def parse_spec(data: Any, where: str) -> dict[str, CdiEdits]:
    """One spec → {qualified name: the device's edits plus the spec-wide edits}."""
    if not isinstance(data, dict):
        raise CdiSpecError(f"{where}: not a CDI spec (no top-level object)")
    kind = data.get("kind")
    if not isinstance(kind, str) or kind.count("/") != 1 or "=" in kind:
        raise CdiSpecError(f"{where}: kind {kind!r} is not 'vendor/class'")
    common = parse_edits(data.get("containerEdits"), f"{where}: containerEdits")
    devices = data.get("devices")
    if not isinstance(devices, list) or not devices:
        raise CdiSpecError(f"{where}: a CDI spec needs at least one device")
    out: dict[str, CdiEdits] = {}
    for i, device in enumerate(devices):
        if not isinstance(device, dict):
            raise CdiSpecError(f"{where}: devices[{i}] is not an object")
        name = _str(device, "name", f"{where}: devices[{i}]", required=True)
        edits = parse_edits(device.get("containerEdits"), f"{where}: device {name}")
        out[f"{kind}={name}"] = common.plus(edits)
    return out


def read_spec_dirs(dirs: Iterable[str]) -> CdiRegistry:
    """Every spec file in ``dirs``; a later directory's device of the same name wins, as in CDI."""
    devices: dict[str, CdiEdits] = {}
    skipped: list[str] = []
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            continue
        except OSError as exc:
            skipped.append(f"{directory}: {exc.strerror or exc}")
            continue
        for name in names:
            path = Path(directory, name)
            if not name.endswith(SPEC_SUFFIXES) or not path.is_file():
                continue
            try:
                if path.stat().st_size > MAX_SPEC_BYTES:
                    raise CdiSpecError(f"{path}: larger than {MAX_SPEC_BYTES} bytes")
                text = path.read_text()
                data = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
                devices.update(parse_spec(data, str(path)))
            except (OSError, ValueError, yaml.YAMLError) as exc:
                skipped.append(f"{path}: {exc}")
    return CdiRegistry(devices, tuple(skipped))


def dirs_signature(dirs: Iterable[str]) -> tuple[tuple[str, int, int], ...]:
    """What changes when a spec is written, replaced or removed: each file's name, mtime and size."""
    out: list[tuple[str, int, int]] = []
    for directory in dirs:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.name.endswith(SPEC_SUFFIXES):
                try:
                    st = entry.stat()
                except OSError:
                    continue
                out.append((entry.path, st.st_mtime_ns, st.st_size))
    return tuple(out)
