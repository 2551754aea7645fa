"""Where a lent GPU's device nodes come from: the vendor plugin's ``Allocate``, and kubelet's holder.

Both are asked by the NRI plugin inside CreateContainer of a spot borrower (design §8), after
kubelet has confirmed the borrower holds ``spot-<id>`` for exactly those IDs:

- ``VendorAllocateResolver`` (the ``nri_plugin.DeviceResolver``) calls the vendor device
  plugin's own ``Allocate`` for exactly the lent IDs, over its socket in kubelet's device-plugin
  directory, as kubelet would for a container given just those IDs, and turns the answer into
  a bundle: each ``DeviceSpec`` with the numbers of its host node, the visibility variables of
  ``visibilityEnv``, its mounts (NVIDIA's device lists), its CDI names and ``cdi.k8s.io/``
  annotations, and what those names stand for in the node's CDI specs; an answer with nothing
  left is no answer.
- ``KubeletHolders`` (the ``nri_plugin.HolderOracle``) says which container kubelet allocated a
  real ID to, from PodResources ``List``; the NRI plugin then copies only the nodes the vendor's
  rule (``nri_plugin.device_rules``) says are that GPU's.

Which socket is the vendor's: the one ``--spot-from RESOURCE=SOCKET`` names, else the first
socket of the device-plugin directory (by name; kubelet's own and gpushare's are skipped) that
answers ``Allocate`` for the requested IDs (never a ``ListAndWatch``: docs/nvidia.md). Only
kubelet and root can create sockets there. The
choice is cached per resource and made again when its socket stops answering.

Everything runs on the NRI handler's deadline: every RPC has ``timeout_s``, the search of the
directory stops after ``search_budget_s``, and answers are cached for ``ttl_s`` (device numbers
do not change while the driver is loaded). Any failure is logged and answered with None, so the
holder's nodes can still serve.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import grpc

from deviceplugins._pb import api_pb2, api_pb2_grpc
from deviceplugins.server import KUBELET_SOCKET_NAME, dial
from gpushare import keys
from gpushare.cdi import CdiEdits, CdiRegistry, Mount
from gpushare.log import kv
from nri_plugin.model import Bundle, DeviceNode
from nri_plugin.oracle import Holder

log = logging.getLogger(__name__)

# With hostPID, pid 1's root is the node's root: a vendor's host paths are resolved there first.
HOST_ROOT = "/proc/1/root"
_OUR_SOCKET_PREFIX = "gpushare-"


class VendorAllocateResolver:
    """``resolve(resource, ids)``: the vendor plugin's own bundle for exactly those IDs, or None."""

    def __init__(
        self,
        plugin_dir: str,
        *,
        visibility_env: Iterable[str],
        cdi_registry: Callable[[], CdiRegistry] = CdiRegistry,
        sockets: Mapping[str, str] | None = None,
        host_root: str = HOST_ROOT,
        timeout_s: float = 0.3,
        search_budget_s: float = 0.6,
        ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plugin_dir = plugin_dir
        self._visibility_env = frozenset(visibility_env)
        self._cdi_registry = cdi_registry
        self._named = dict(sockets or {})
        self._host_root = host_root.rstrip("/")
        self._timeout_s = timeout_s
        self._search_budget_s = search_budget_s
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._found: dict[str, str] = {}  # resource -> socket found by its device list
        self._answers: dict[tuple[str, tuple[str, ...]], tuple[float, Bundle]] = {}

    def resolve(self, resource: str, real_ids: tuple[str, ...]) -> Bundle | None:
        key = (resource, tuple(real_ids))
        with self._lock:
            cached = self._answers.get(key)
        if cached is not None and self._clock() - cached[0] <= self._ttl_s:
            return cached[1]
        found = self._ask(resource, real_ids)
        if found is None:
            return None
        bundle = self._bundle(resource, found)
        if bundle is not None:
            with self._lock:
                self._answers[key] = (self._clock(), bundle)
        return bundle

    def socket_for(self, resource: str, real_ids: Iterable[str]) -> str | None:
        """The vendor's socket: named by ``--spot-from``, else the one that answers ``Allocate`` (cached)."""
        return self._named.get(resource) or (
            self._found.get(resource) if self._ask(resource, tuple(real_ids)) else None
        )

    def _ask(self, resource: str, real_ids: tuple[str, ...]) -> api_pb2.ContainerAllocateResponse | None:
        """The vendor's Allocate answer for exactly ``real_ids``: from the named or found socket, else from
        the first socket of the directory that answers it (another vendor's plugin refuses IDs it does
        not have). Never ListAndWatch: NVIDIA's plugin hands each health change to one stream only, and
        a stream of ours could take it from kubelet's (docs/nvidia.md); Allocate is unary."""
        with self._lock:
            known = self._named.get(resource) or self._found.get(resource)
        if known is not None:
            try:
                return self._allocate(known, real_ids)
            except (grpc.RpcError, OSError) as exc:
                log.warning(
                    "vendor Allocate failed", extra=kv(resource=resource, socket=known, reason=_rpc_reason(exc))
                )
                with self._lock:
                    self._found.pop(resource, None)  # search again next time: the plugin may have moved
                return None
        deadline = self._clock() + self._search_budget_s
        for path in self._candidate_sockets():
            if self._clock() > deadline:
                log.warning("vendor socket search ran out of time", extra=kv(resource=resource, dir=self.plugin_dir))
                return None
            try:
                answer = self._allocate(path, real_ids)
            except (grpc.RpcError, OSError):
                continue
            with self._lock:
                self._found[resource] = path
            log.info("vendor device plugin found", extra=kv(resource=resource, socket=path))
            return answer
        log.info("no vendor device plugin answers for these IDs", extra=kv(resource=resource, ids=",".join(real_ids)))
        return None

    def _candidate_sockets(self) -> list[str]:
        try:
            names = sorted(os.listdir(self.plugin_dir))
        except OSError:
            return []
        return [
            os.path.join(self.plugin_dir, n)
            for n in names
            if n.endswith(".sock") and n != KUBELET_SOCKET_NAME and not n.startswith(_OUR_SOCKET_PREFIX)
        ]

    def _allocate(self, socket_path: str, real_ids: tuple[str, ...]) -> api_pb2.ContainerAllocateResponse:
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(real_ids))]
        )
        with dial(socket_path) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            response: api_pb2.AllocateResponse = stub.Allocate(request, timeout=self._timeout_s)
        if len(response.container_responses) != 1:
            raise OSError(f"answered {len(response.container_responses)} container responses for one request")
        answer: api_pb2.ContainerAllocateResponse = response.container_responses[0]
        return answer

    def _bundle(self, resource: str, answer: api_pb2.ContainerAllocateResponse) -> Bundle | None:
        """The answer as kubelet would give it to CRI, and what its CDI names stand for.

        The names' edits are read from the node's CDI specs, so a runtime that cannot take names
        in an adjustment (containerd 1.7) still gets the GPU; one that can gets the names instead
        (``nri_plugin.decide.for_runtime``). A name the specs do not know, or a node the host
        lacks, gives no bundle: a partial answer would lend part of a GPU."""
        devices = []
        for spec in answer.devices:
            node = self._node(spec.container_path, spec.host_path)
            if node is None:
                log.warning(
                    "vendor device node not found on this node",
                    extra=kv(resource=resource, host_path=spec.host_path, tried=self._host_root or "/"),
                )
                return None
            devices.append(node)
        env = tuple(sorted((k, v) for k, v in answer.envs.items() if k in self._visibility_env))
        cdi = tuple(sorted((k, v) for k, v in answer.annotations.items() if k.startswith(keys.CDI_ANNOTATION_PREFIX)))
        # CRI's bind mount of a device plugin's mount, as containerd writes it into the spec.
        mounts = tuple(
            Mount(m.container_path, m.host_path, "bind", ("rbind", "rprivate", "ro" if m.read_only else "rw"))
            for m in answer.mounts
        )
        bundle = Bundle(tuple(devices), env, cdi, mounts, (), tuple(d.name for d in answer.cdi_devices))
        names = bundle.cdi_names()
        if names:
            edits = self._cdi_registry().edits_of(names)
            if edits is None:
                log.warning("vendor CDI devices unknown to this node's CDI specs", extra=kv(names=",".join(names)))
                return None
            expanded = self._edits_bundle(resource, edits)
            if expanded is None:
                return None
            bundle = bundle.merged(expanded)
        return None if bundle.is_empty else bundle

    def _edits_bundle(self, resource: str, edits: CdiEdits) -> Bundle | None:
        devices = []
        for n in edits.device_nodes:
            node = self._node(n.path, n.host_path)
            if node is None:
                log.warning(
                    "CDI device node not found on this node", extra=kv(resource=resource, host_path=n.host_path)
                )
                return None
            devices.append(node)
        return Bundle(
            devices=tuple(devices),
            env=tuple((e.partition("=")[0], e.partition("=")[2]) for e in edits.env),
            mounts=edits.mounts,
            hooks=edits.hooks,
        )

    def _node(self, container_path: str, host_path: str) -> DeviceNode | None:
        for path in (self._host_root + host_path, host_path) if self._host_root else (host_path,):
            try:
                st = os.stat(path)
            except OSError:
                continue
            kind = "c" if stat.S_ISCHR(st.st_mode) else "b" if stat.S_ISBLK(st.st_mode) else "?"
            return DeviceNode(
                container_path,
                kind,
                os.major(st.st_rdev),
                os.minor(st.st_rdev),
                stat.S_IMODE(st.st_mode),
                st.st_uid,
                st.st_gid,
            )
        return None


class KubeletHolders:
    """``holder_of(resource, id)`` from kubelet's PodResources ``List`` (cached for ``ttl_s``).

    ``lister`` is the agent's ``PodResourcesClient``; its errors (``OracleUnavailable``) pass up.
    """

    def __init__(self, lister: Any, *, ttl_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._lister = lister
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._index: Mapping[tuple[str, str], Holder] = {}

    def holder_of(self, resource: str, real_id: str) -> Holder | None:
        with self._lock:
            fresh = self._clock() - self._at <= self._ttl_s
            hit = self._index.get((resource, real_id))
        if hit is not None and fresh:
            return hit
        index = _index_holders(self._lister.list())  # a miss always asks kubelet again
        with self._lock:
            self._index, self._at = index, self._clock()
        return index.get((resource, real_id))


def _index_holders(pods: Iterable[Any]) -> dict[tuple[str, str], Holder]:
    out: dict[tuple[str, str], Holder] = {}
    for pod in pods:
        for ctr in pod.containers:
            by_resource: dict[str, set[str]] = {}
            for dev in ctr.devices:
                by_resource.setdefault(dev.resource_name, set()).update(dev.device_ids)
            for resource, ids in by_resource.items():
                holder = Holder(pod.namespace, pod.name, ctr.name, frozenset(ids))
                for device_id in ids:
                    out[(resource, device_id)] = holder
    return out


def _rpc_reason(exc: BaseException) -> str:
    if isinstance(exc, grpc.Call):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc)


__all__ = ["HOST_ROOT", "KubeletHolders", "VendorAllocateResolver"]
