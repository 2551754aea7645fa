"""`gpushare doctor`'s view of the host: containerd, its config, cgroups, kubelet's config, the kernel module.

Everything is read from ``/proc``, ``/sys`` and files; no host tool (systemctl, crictl) is
needed, so the same code runs on the host and inside the agent pod (``kubectl exec``). A
host process's files are read through ``/proc/<pid>/root`` (the agent pod has ``hostPID``
and is privileged), so a config file that is not mounted into the pod is still found. The
running containerd and kubelet are told apart from others on the same machine by what the
gpushare config names: the containerd whose NRI ``socket_path`` is ``nri.socket``, the
kubelet whose ``--root-dir`` holds ``kubelet.devicePluginDir``.

Nothing here raises for a fact it cannot read: the fact records why (``*_error``) or is
``None``, and ``cli.doctor.diagnosis`` decides what that means.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from cli.doctor.diagnosis import CgroupFact, ContainerdFact, KmodFact, parse_version
from gpukmod.module import build_blocker, default_kernel_dir, load_blocker, read_kernel_facts, source_version

PROC = Path("/proc")
DEFAULT_CONTAINERD_CONFIG = "/etc/containerd/config.toml"
DEFAULT_NRI_SOCKET = "/var/run/nri/nri.sock"
DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"
NRI_PLUGIN = "io.containerd.nri.v1.nri"
_CRI_RUNTIME = {2: ("io.containerd.grpc.v1.cri", "containerd"), 3: ("io.containerd.cri.v1.runtime", "containerd")}
_MAX_LINKS = 16
_OCTAL = re.compile(r"\\([0-7]{3})")  # mountinfo writes space, tab, newline and backslash as \ooo


# --- processes -------------------------------------------------------------------------------------------


def pids_named(comm: str, proc: Path = PROC) -> list[int]:
    """Processes whose command name is exactly ``comm`` (``containerd``, not ``containerd-shim``)."""
    out = []
    for entry in proc.iterdir() if proc.is_dir() else []:
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == comm:
                    out.append(int(entry.name))
            except OSError:
                continue  # gone, or not ours to read
    return sorted(out)


def cmdline(pid: int, proc: Path = PROC) -> list[str]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The value of ``--name X``, ``--name=X`` (last one wins, as Go's flag package does)."""
    value = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(name + "="):
                value = arg[len(name) + 1 :]
    return value


def in_root_of(pid: int, path: str, proc: Path = PROC) -> Path:
    """``path`` as process ``pid`` sees it: through its root, which is the host's for a host process."""
    return proc / str(pid) / "root" / path.lstrip("/")


def binary_version(pid: int, proc: Path = PROC, timeout_s: float = 5.0) -> str | None:
    """What the process's own binary says to ``--version`` (run through ``/proc/<pid>/exe``)."""
    try:
        res = subprocess.run(
            [str(proc / str(pid) / "exe"), "--version"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (res.stdout.strip() or None) if res.returncode == 0 else None


# --- containerd --------------------------------------------------------------------------------------------


def _table(doc: Mapping[str, Any], *keys: str) -> Mapping[str, Any]:
    for key in keys:
        value = doc.get(key) if isinstance(doc, Mapping) else None
        if not isinstance(value, Mapping):
            return {}
        doc = value
    return doc


def containerd_settings(doc: Mapping[str, Any], major: int | None) -> tuple[bool | None, str, bool]:
    """(NRI disabled, NRI socket_path, SystemdCgroup of the default runtime) from a parsed config.

    Defaults are containerd's own: NRI is off in 1.x and on from 2.0; the socket is
    ``/var/run/nri/nri.sock``; runc uses cgroupfs. ``major`` None (unknown version) leaves an
    unset ``disable`` unknown.
    """
    nri = _table(doc, "plugins", NRI_PLUGIN)
    disable = nri.get("disable")
    if not isinstance(disable, bool):
        disable = None if major is None else major < 2
    socket = nri.get("socket_path")
    schema = doc.get("version")
    plugin, section = _CRI_RUNTIME.get(schema if isinstance(schema, int) else 2, _CRI_RUNTIME[2])
    runtime_cfg = _table(doc, "plugins", plugin, section)
    name = runtime_cfg.get("default_runtime_name")
    systemd = _table(runtime_cfg, "runtimes", name if isinstance(name, str) else "runc", "options").get("SystemdCgroup")
    return (
        disable,
        socket if isinstance(socket, str) and socket else DEFAULT_NRI_SOCKET,
        systemd if isinstance(systemd, bool) else False,
    )


NVIDIA_RUNTIME_CONFIG = "/etc/nvidia-container-runtime/config.toml"


def default_runtime_binary(doc: Mapping[str, Any]) -> str:
    """The default runtime handler's ``options.BinaryName`` ("" when it runs containerd's runc)."""
    schema = doc.get("version")
    plugin, section = _CRI_RUNTIME.get(schema if isinstance(schema, int) else 2, _CRI_RUNTIME[2])
    runtime_cfg = _table(doc, "plugins", plugin, section)
    name = runtime_cfg.get("default_runtime_name")
    binary = _table(runtime_cfg, "runtimes", name if isinstance(name, str) else "runc", "options").get("BinaryName")
    return binary if isinstance(binary, str) else ""


def nvidia_runtime_settings(pid: int, proc: Path = PROC) -> tuple[str | None, bool | None]:
    """``nvidia-container-runtime.mode`` and ``accept-nvidia-visible-devices-envvar-when-unprivileged``
    of NVIDIA's runtime config as containerd's root sees it (None: unset or unreadable)."""
    try:
        doc = tomllib.loads(in_root_of(pid, NVIDIA_RUNTIME_CONFIG, proc).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None, None
    mode = _table(doc, "nvidia-container-runtime").get("mode")
    envvar = doc.get("accept-nvidia-visible-devices-envvar-when-unprivileged")
    return (mode if isinstance(mode, str) else None), (envvar if isinstance(envvar, bool) else None)


def _same_path(a: str, b: str) -> bool:
    return os.path.normpath(a) == os.path.normpath(b)


def merge_imported(doc: dict[str, Any], imported: dict[str, Any]) -> dict[str, Any]:
    """containerd's merge of an ``imports`` file: its keys win, and a plugin's table is replaced whole."""
    out = {**doc, **{k: v for k, v in imported.items() if k != "plugins"}}
    plugins, base = imported.get("plugins"), doc.get("plugins")
    if isinstance(plugins, Mapping):
        out["plugins"] = {**(base if isinstance(base, Mapping) else {}), **plugins}
    return out


def _read_containerd(pid: int, proc: Path) -> tuple[str, dict[str, Any] | None, str | None]:
    """The config file containerd runs with, and the files its ``imports`` pull in (one level, in order)."""
    path = flag_value(cmdline(pid, proc), "--config", "-c") or DEFAULT_CONTAINERD_CONFIG
    try:
        doc = tomllib.loads(in_root_of(pid, path, proc).read_text())
    except FileNotFoundError:
        return path, {}, None  # no file: containerd runs on its defaults
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return path, None, f"{path}: {exc}"
    imports = doc.get("imports")
    for pattern in imports if isinstance(imports, list) else []:
        if not isinstance(pattern, str):
            continue
        full = pattern if pattern.startswith("/") else os.path.join(os.path.dirname(path), pattern)
        root = in_root_of(pid, "/", proc)
        for found in sorted(root.glob(full.lstrip("/"))):
            try:
                doc = merge_imported(doc, tomllib.loads(found.read_text()))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
                return path, None, f"/{found.relative_to(root)} (imported by {path}): {exc}"
    return path, doc, None


def probe_containerd(nri_socket: str, proc: Path = PROC) -> ContainerdFact:
    """The containerd whose config names ``nri_socket``; the others are listed for the report.

    A containerd whose config cannot be read is taken to be ours when it is the only one.
    """
    pids = pids_named("containerd", proc)
    others: list[str] = []
    for pid in pids:
        path, doc, error = _read_containerd(pid, proc)
        if doc is None:
            if len(pids) == 1:
                return ContainerdFact(pid, path, error, binary_version(pid, proc))
            others.append(f"pid {pid} (config {path} unreadable)")
            continue
        socket = containerd_settings(doc, None)[1]
        if not _same_path(socket, nri_socket):
            others.append(f"pid {pid} (config {path}, NRI socket {socket})")
            continue
        version = binary_version(pid, proc)
        parsed = parse_version(version)
        disabled, _, systemd = containerd_settings(doc, parsed[0] if parsed else None)
        binary = default_runtime_binary(doc)
        mode, envvar = nvidia_runtime_settings(pid, proc) if "nvidia-container-runtime" in binary else (None, None)
        return ContainerdFact(pid, path, None, version, disabled, socket, systemd, tuple(others), binary, mode, envvar)
    return ContainerdFact(others=tuple(others))


# --- cgroups and kubelet's config ----------------------------------------------------------------------------


def parse_mountinfo(text: str) -> list[tuple[str, str]]:
    """(mount point, filesystem type) per line of ``/proc/<pid>/mountinfo``; malformed lines are skipped."""
    out = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if not sep or len(fields) < 5 or not tail.split():
            continue
        out.append((_OCTAL.sub(lambda m: chr(int(m.group(1), 8)), fields[4]), tail.split()[0]))
    return out


def cgroup_version(mounts: list[tuple[str, str]], root: str) -> str | None:
    """v2 (cgroup2 at ``root``), hybrid (v1 hierarchies plus ``root``/unified), v1, or None (neither)."""
    root = os.path.normpath(root)
    at_root = [fs for point, fs in mounts if point == root]
    if at_root and at_root[-1] == "cgroup2":
        return "v2"
    below = {point: fs for point, fs in mounts if point.startswith(root + "/")}
    if not any(fs == "cgroup" for fs in below.values()):
        return None
    return "hybrid" if below.get(root + "/unified") == "cgroup2" else "v1"


def kubelet_settings(doc: object, argv: Sequence[str]) -> tuple[str, str]:
    """(cgroupDriver, cgroupRoot) from kubelet's config file, overridden by its flags; kubelet's defaults."""
    cfg = doc if isinstance(doc, Mapping) else {}
    driver = cfg.get("cgroupDriver") if isinstance(cfg.get("cgroupDriver"), str) else "cgroupfs"
    root = cfg.get("cgroupRoot") if isinstance(cfg.get("cgroupRoot"), str) else "/"
    return flag_value(argv, "--cgroup-driver") or str(driver), flag_value(argv, "--cgroup-root") or str(root) or "/"


def _kubelet_for(plugin_dir: str, proc: Path) -> tuple[int, list[str]] | None:
    for pid in pids_named("kubelet", proc):
        argv = cmdline(pid, proc)
        root = flag_value(argv, "--root-dir") or DEFAULT_KUBELET_ROOT
        if _same_path(os.path.join(root, "device-plugins"), plugin_dir):
            return pid, argv
    return None


def probe_cgroup(root: str, plugin_dir: str, proc: Path = PROC) -> CgroupFact:
    """The cgroup version at ``root`` and the driver kubelet's own config names (the kubelet of ``plugin_dir``)."""
    try:
        mounts = parse_mountinfo((proc / "self" / "mountinfo").read_text())
    except OSError:
        mounts = []
    driver = config = error = None
    found = _kubelet_for(plugin_dir, proc)
    if found is None:
        error = f"no running kubelet has its device-plugin directory at {plugin_dir}"
    else:
        pid, argv = found
        config = flag_value(argv, "--config")
        try:
            doc = yaml.safe_load(in_root_of(pid, config, proc).read_text()) if config else {}
            driver = kubelet_settings(doc, argv)[0]
        except (OSError, yaml.YAMLError) as exc:
            error = f"{config}: {exc}"
    return CgroupFact(root, cgroup_version(mounts, root), driver, config, error)


# --- the kernel module ---------------------------------------------------------------------------------------


def resolve_in_root(root: Path, path: str) -> Path:
    """``path`` resolved inside ``root``: absolute symlinks on the way restart at ``root``, not at ``/``.

    ``/lib/modules/<release>/build`` links to ``/usr/src/...``; seen through ``/proc/1/root`` from
    the agent pod, the link must land in the host's ``/usr/src``, not the pod's.
    """
    parts = [p for p in path.split("/") if p]
    current = root
    links = 0
    while parts:
        part = parts.pop(0)
        if part in (".", ".."):
            current = current.parent if part == ".." and current != root else current
            continue
        candidate = current / part
        if candidate.is_symlink() and links < _MAX_LINKS:
            links += 1
            target = os.readlink(candidate)
            parts = [p for p in target.split("/") if p] + parts
            current = root if target.startswith("/") else current
            continue
        current = candidate
    return current


def probe_kmod(proc: Path = PROC) -> KmodFact:
    """Loaded version, and why it could not be built or loaded here (headers looked up on the host)."""
    kdir = default_kernel_dir()
    # In the agent pod /lib/modules is not mounted: look at the host's, when its root is ours to read.
    with contextlib.suppress(OSError):
        on_host = resolve_in_root(proc / "1" / "root", str(kdir))
        if not (kdir / "Makefile").exists() and (on_host / "Makefile").exists():
            kdir = on_host
    # The doctor's own capabilities say nothing about the init container's (privileged): leave them out.
    facts = dataclasses.replace(read_kernel_facts(kdir), cap_eff=None)
    return KmodFact(facts.release, facts.loaded, source_version(), load_blocker(facts), build_blocker(facts))


__all__ = [
    "cgroup_version",
    "containerd_settings",
    "flag_value",
    "kubelet_settings",
    "merge_imported",
    "parse_mountinfo",
    "probe_cgroup",
    "probe_containerd",
    "probe_kmod",
    "resolve_in_root",
]
