"""How kubelet names a pod's cgroup, and reading the cgroup lines the kernel reports for a process.

Pure string work, no I/O, so the naming rules are tested on recorded inputs. kubelet puts a
pod's cgroup at one of three places under its ``kubepods`` cgroup, by QoS class:

    driver     guaranteed                       burstable / besteffort
    cgroupfs   kubepods/pod<uid>                kubepods/<qos>/pod<uid>
    systemd    kubepods.slice/                  kubepods.slice/kubepods-<qos>.slice/
                 kubepods-pod<uid_>.slice         kubepods-<qos>-pod<uid_>.slice

where ``<uid_>`` is the pod UID with ``-`` written ``_`` (``-`` separates systemd slice levels).
With a kubelet ``cgroupRoot`` other than ``/`` the tree sits below it (cgroupfs:
``<root>/kubepods``; systemd: ``<root>.slice/<root>-kubepods.slice/<root>-kubepods-...``). The
runtime puts each container (the sandbox's pause process included) one level below the pod:
``<container id>`` (cgroupfs) or ``<runtime>-<container id>.scope`` (systemd).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from podcgroups.errors import ProcessError


class CgroupVersion(StrEnum):
    V1 = "v1"  # one hierarchy per controller under /sys/fs/cgroup/<name>
    V2 = "v2"  # the unified hierarchy mounted at /sys/fs/cgroup


class CgroupDriver(StrEnum):
    CGROUPFS = "cgroupfs"  # plain directories: kubepods/besteffort/pod<uid>
    SYSTEMD = "systemd"  # systemd units: kubepods.slice/.../kubepods-besteffort-pod<uid_>.slice


QOS_CLASSES = ("besteffort", "burstable")  # the QoS classes with a cgroup level of their own
GUARANTEED = "guaranteed"  # pods of this class sit directly under kubepods
_UID = re.compile(r"[0-9A-Za-z][0-9A-Za-z-]*")  # API UIDs are UUIDs; static pods' are hex hashes
_SYSTEMD_POD = re.compile(
    r"(?P<prefix>[0-9A-Za-z_.-]*kubepods)(?:-(?P<qos>besteffort|burstable))?-pod(?P<uid>[0-9A-Za-z_]+)\.slice"
)
_CGROUPFS_PARENTS = {"kubepods", *QOS_CLASSES, ".."}  # ".." where the reader's cgroup namespace hides the rest


def check_pod_uid(pod_uid: str) -> str:
    """The UID, or ``ValueError`` naming it: it becomes a path component, so no ``/`` and no ``..``."""
    if not _UID.fullmatch(pod_uid):
        raise ValueError(f"gpushare: {pod_uid!r} is not a pod UID (letters, digits and '-' expected)")
    return pod_uid


def systemd_uid(pod_uid: str) -> str:
    """The UID as systemd slice names spell it (``-`` is the slice level separator there)."""
    return pod_uid.replace("-", "_")


def pod_dir_candidates(kubepods_name: str, driver: CgroupDriver, pod_uid: str) -> list[str]:
    """Where a pod's cgroup may be, relative to kubelet's ``kubepods`` cgroup, one path per QoS class.

    ``kubepods_name`` is that cgroup's own name (``kubepods``, ``kubepods.slice`` or
    ``<root>-kubepods.slice``); systemd repeats it as the prefix of every level below.
    """
    uid = check_pod_uid(pod_uid)
    if driver is CgroupDriver.CGROUPFS:
        return [*(f"{qos}/pod{uid}" for qos in QOS_CLASSES), f"pod{uid}"]
    prefix = kubepods_name.removesuffix(".slice")
    u = systemd_uid(uid)
    return [*(f"{prefix}-{qos}.slice/{prefix}-{qos}-pod{u}.slice" for qos in QOS_CLASSES), f"{prefix}-pod{u}.slice"]


def is_kubepods_name(name: str) -> CgroupDriver | None:
    """The driver whose kubelet names its top pod cgroup ``name``, or None for any other cgroup."""
    if name == "kubepods":
        return CgroupDriver.CGROUPFS
    if name == "kubepods.slice" or (name.endswith("-kubepods.slice") and "/" not in name):
        return CgroupDriver.SYSTEMD
    return None


@dataclass(frozen=True)
class PodPath:
    """What a cgroup path says about the pod it belongs to."""

    pod_uid: str
    qos: str  # "guaranteed", "burstable", "besteffort", or "" where the path does not show it
    driver: CgroupDriver
    pod_path: str  # the path up to and including the pod's own cgroup
    container_id: str | None  # the container's ID when the path goes below the pod's cgroup


def _container_id(name: str, driver: CgroupDriver) -> str:
    # systemd: "<runtime>-<id>.scope" (cri-containerd-, crio-, docker-); cgroupfs: the ID itself.
    if driver is CgroupDriver.SYSTEMD or name.endswith(".scope"):
        return name.removesuffix(".scope").rsplit("-", 1)[-1]
    return name


def parse_pod_path(path: str) -> PodPath | None:
    """The pod a cgroup path is in, or None when it is no pod's (a system service, the root, ``/``).

    Works on paths relative to a cgroup namespace too (``/../../kubepods-besteffort-pod<u>.slice/...``,
    what an agent in a private cgroup namespace reads for another pod's process): systemd pod
    slices name themselves; a cgroupfs ``pod<uid>`` counts only under ``kubepods``, a QoS level or ``..``.
    """
    parts = path.split("/")
    for i, name in enumerate(parts):
        found = _pod_level(name, parts[i - 1] if i else "")
        if found is None:
            continue
        uid, qos, driver = found
        child = parts[i + 1] if i + 1 < len(parts) and parts[i + 1] else None
        container = _container_id(child, driver) if child is not None else None
        return PodPath(uid, qos, driver, "/".join(parts[: i + 1]) or "/", container)
    return None


def _pod_level(name: str, parent: str) -> tuple[str, str, CgroupDriver] | None:
    m = _SYSTEMD_POD.fullmatch(name)
    if m is not None:
        return m["uid"].replace("_", "-"), m["qos"] or GUARANTEED, CgroupDriver.SYSTEMD
    if name.startswith("pod") and _UID.fullmatch(name[3:]) and parent in _CGROUPFS_PARENTS:
        qos = parent if parent in QOS_CLASSES else (GUARANTEED if parent == "kubepods" else "")
        return name[3:], qos, CgroupDriver.CGROUPFS
    return None


@dataclass(frozen=True)
class ProcCgroup:
    """``/proc/<pid>/cgroup`` read: the path in each v1 hierarchy and in the unified one."""

    v1: Mapping[str, str]  # hierarchy name as mounted ("freezer", "cpu,cpuacct", "systemd") -> path
    unified: str | None  # the "0::" line's path; None on a v1-only host

    def path_in(self, version: CgroupVersion, hierarchy: str) -> str | None:
        """The path in the hierarchy a layout uses: the unified one for v2, else the named v1 one."""
        return self.unified if version is CgroupVersion.V2 else self.v1.get(hierarchy)


def parse_proc_cgroup(text: str) -> ProcCgroup:
    """Lines ``<id>:<controllers>:<path>``; v1 hierarchies keyed by their mount directory's name.

    Raises ``ProcessError`` naming the first line that is not of that form.
    """
    v1: dict[str, str] = {}
    unified: str | None = None
    for n, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        fields = line.split(":", 2)
        if len(fields) != 3 or not fields[0].isdigit() or not fields[2].startswith("/"):
            raise ProcessError(f"gpushare: /proc/<pid>/cgroup line {n} is not '<id>:<controllers>:/<path>': {line!r}")
        hierarchy_id, controllers, path = fields
        if hierarchy_id == "0" and not controllers:
            unified = path
        elif controllers:
            # "name=systemd" is mounted as "systemd"; "cpu,cpuacct" keeps its comma name.
            v1[controllers.removeprefix("name=")] = path
            for c in controllers.split(","):
                v1.setdefault(c.removeprefix("name="), path)
        else:
            raise ProcessError(f"gpushare: /proc/<pid>/cgroup line {n} names no controller: {line!r}")
    return ProcCgroup(v1, unified)


__all__ = [
    "GUARANTEED",
    "QOS_CLASSES",
    "CgroupDriver",
    "CgroupVersion",
    "PodPath",
    "ProcCgroup",
    "check_pod_uid",
    "is_kubepods_name",
    "parse_pod_path",
    "parse_proc_cgroup",
    "pod_dir_candidates",
    "systemd_uid",
]
