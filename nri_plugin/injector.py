"""``Injector``: the plugin object the ``Stub`` drives, one method per NRI event it handles.

It keeps ``BundleCache`` current (Synchronize, CreateContainer, RemoveContainer,
RemovePodSandbox) and, at CreateContainer, runs the pure decision code. The only I/O a handler
may do is asking what the controller injected (``nri_plugin.oracle``: the allocation, and for
spot the lend state, the vendor's bundle and kubelet's holder) for a cross-pod instruction, each
a cached lookup or bounded by a short timeout. Every decision logs one INFO line:
``decision=inject|refuse pod=ns/name container=c source=... devices=N took_ms=...``.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from gpushare import keys, rules
from gpushare.config import Config
from gpushare.errors import REFUSED_LEND_ENDED, REFUSED_MIX, REFUSED_UNCONFIRMED, InstructionRefused
from gpushare.log import kv
from nri_plugin import convert
from nri_plugin._pb import nri_pb2
from nri_plugin.bundles import BundleCache
from nri_plugin.decide import (
    Decision,
    RealIds,
    confirmed_real_ids,
    decide,
    find_instruction,
    for_runtime,
    is_cross_pod,
)
from nri_plugin.errors import OracleUnavailable
from nri_plugin.gpu_parts import NodeGpuParts
from nri_plugin.model import Bundle, ContainerInfo, PodInfo
from nri_plugin.oracle import AllocationOracle, DeviceResolver, Holder, HolderOracle, LendState, PodRules

log = logging.getLogger(__name__)

OnDecision = Callable[[str, PodInfo, ContainerInfo, "Decision | None", float], None]


def takes_cdi_devices(runtime_name: str, runtime_version: str) -> bool:
    """Whether the runtime applies an adjustment's CDI device names: containerd from 2.0 (NRI
    v0.8). containerd 1.7 (NRI v0.6.1) drops the field unread, and an unknown runtime gets the
    edits themselves, which every NRI version applies."""
    if runtime_name != "containerd":
        return False
    major = runtime_version.removeprefix("v").split(".", 1)[0]
    return major.isdigit() and int(major) >= 2


class Injector:
    """Device sync at CreateContainer (design §5). Thread-safe; handlers are short."""

    def __init__(
        self,
        config: Config,
        *,
        oracle: AllocationOracle | None = None,
        resolver: DeviceResolver | None = None,
        holders: HolderOracle | None = None,
        lend_state: LendState | None = None,
        pod_rules: PodRules | None = None,
        cache: BundleCache | None = None,
        gpu_parts: NodeGpuParts | None = None,
        on_decision: OnDecision | None = None,
        on_refusal: Callable[[str], None] | None = None,
        on_shadow_started: Callable[[str, str, int, str], None] | None = None,
        on_shadow_created: Callable[[str, str], None] | None = None,
        keep_timings: int = 100_000,
    ) -> None:
        self.gpu_parts = gpu_parts if gpu_parts is not None else NodeGpuParts.from_config(config)
        self._device_list_dirs = config.device_list_dirs
        self.cache = cache if cache is not None else BundleCache(self.gpu_parts.rule)
        # Whether the runtime applies CDI names in an adjustment; learnt at Configure.
        self.takes_cdi_devices = False
        self._oracle = oracle
        self._resolver = resolver
        self._holders = holders
        self._lend_state = lend_state
        self._pod_rules = pod_rules
        self._on_decision = on_decision
        self._on_refusal = on_refusal  # gets the refusal's reason word (gpushare.errors.REFUSAL_REASONS)
        # Gets ("ns/name", container ID, pid, pod uid) of each shadow's main container once it runs: whether
        # the container stack really gave it its GPU can only be seen in the running container (docs/nvidia.md).
        self._on_shadow_started = on_shadow_started
        # Gets ("ns/name", pod uid) once a shadow's main container is in the cache: from then on a
        # sharer's container can take its GPU from it, so its slots may be offered.
        self._on_shadow_created = on_shadow_created
        self._timings_ms: collections.deque[float] = collections.deque(maxlen=keep_timings)

    # --- NRI events (the Stub derives the subscription mask from these method names) ---

    def configure(self, req: nri_pb2.ConfigureRequest) -> None:
        self.takes_cdi_devices = takes_cdi_devices(req.runtime_name, req.runtime_version)
        log.info(
            "nri: runtime",
            extra=kv(runtime=req.runtime_name, version=req.runtime_version, cdi_adjustments=self.takes_cdi_devices),
        )

    def synchronize(self, pods: Iterable[nri_pb2.PodSandbox], containers: Iterable[nri_pb2.Container]) -> None:
        pods, containers = list(pods), list(containers)
        self.cache.replace_all((convert.pod_info(p) for p in pods), (convert.container_info(c) for c in containers))
        view = self.cache.view
        log.info("nri: synchronized", extra=kv(pods=len(view.pods), containers=len(view.containers)))
        by_id = {p.id: p for p in pods}
        for c in containers:
            if c.pod_sandbox_id in by_id:
                self._note_shadow_created(by_id[c.pod_sandbox_id], c)
            # Only a running one: a stopped container's pid may be another process's by now.
            if c.pod_sandbox_id in by_id and c.state == nri_pb2.CONTAINER_RUNNING:
                self._note_shadow_start(by_id[c.pod_sandbox_id], c)

    def post_start_container(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> None:
        self._note_shadow_start(pod, container)

    def create_container(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> nri_pb2.ContainerAdjustment:
        start = time.perf_counter()
        start_cpu = time.thread_time()
        pod_info = convert.pod_info(pod)
        info = convert.container_info(container)
        try:
            decision = self._decide(pod_info, info)
        except InstructionRefused as exc:
            took_ms = (time.perf_counter() - start) * 1000.0
            cpu_ms = (time.thread_time() - start_cpu) * 1000.0
            self._timings_ms.append(took_ms)
            log.info(
                "decision",
                extra=kv(
                    decision="refuse",
                    pod=pod_info.ref,
                    container=info.name,
                    refused=exc.reason,
                    reason=str(exc),
                    took_ms=round(took_ms, 3),
                    cpu_ms=round(cpu_ms, 3),
                ),
            )
            if self._on_decision is not None:
                self._on_decision("refuse", pod_info, info, None, took_ms)
            if self._on_refusal is not None:
                self._on_refusal(exc.reason)
            raise
        added = (
            for_runtime(decision.adjustment, self.gpu_parts.registry, takes_cdi_devices=self.takes_cdi_devices)
            if decision is not None
            else Bundle()
        )
        # Remember the container as it will be created, so it can itself be a source (chains).
        # A container we gave devices to is a recipient: it may be a same-pod source, never a holder.
        self.cache.add(pod_info, convert.with_adjustment(info, added), recipient=decision is not None)
        self._note_shadow_created(pod, container)
        took_ms = (time.perf_counter() - start) * 1000.0
        cpu_ms = (time.thread_time() - start_cpu) * 1000.0
        self._timings_ms.append(took_ms)
        if decision is not None:
            log.info(
                "decision",
                extra=kv(
                    decision="inject",
                    pod=pod_info.ref,
                    container=info.name,
                    source=decision.source,
                    devices=len(added.devices),
                    env=len(added.env),
                    mounts=len(added.mounts),
                    hooks=len(added.hooks),
                    cdi_devices=len(added.cdi_devices),
                    skipped=len(decision.skipped),
                    took_ms=round(took_ms, 3),
                    cpu_ms=round(cpu_ms, 3),
                ),
            )
            if self._on_decision is not None:
                self._on_decision("inject", pod_info, info, decision, took_ms)
        else:
            log.debug("no instruction", extra=kv(pod=pod_info.ref, container=info.name))
        return convert.adjustment(added)

    def remove_container(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> None:
        self.cache.remove_container(container.id)

    def remove_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        self.cache.remove_pod(pod.id)

    # --- helpers ---

    def _note_shadow_created(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> None:
        if (
            self._on_shadow_created is not None
            and container.name == keys.SHADOW_CONTAINER
            and rules.is_shadow(pod.namespace, dict(pod.labels))
        ):
            self._on_shadow_created(f"{pod.namespace}/{pod.name}", pod.uid)

    def _note_shadow_start(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> None:
        if (
            self._on_shadow_started is not None
            and container.pid > 0
            and container.name == keys.SHADOW_CONTAINER
            and rules.is_shadow(pod.namespace, dict(pod.labels))
        ):
            self._on_shadow_started(f"{pod.namespace}/{pod.name}", container.id, container.pid, pod.uid)

    def handler_times_ms(self) -> list[float]:
        """Durations of CreateContainer handlers so far (benchmarks report p50/p99)."""
        return list(self._timings_ms)

    def _decide(self, pod: PodInfo, info: ContainerInfo) -> Decision | None:
        instruction = find_instruction(pod, info)
        self._check_pod(pod, info, needed=instruction is not None)
        if instruction is None:
            return None
        view = self.cache.view
        allocated: Mapping[str, frozenset[str]] | None = None
        if is_cross_pod(instruction) and self._oracle is not None:
            try:
                allocated = self._oracle.allocated_ids(pod.namespace, pod.name, info.name)
            except OracleUnavailable as exc:
                raise InstructionRefused(
                    f"gpushare: cannot confirm the allocation of container {info.name!r} of {pod.ref}: {exc}; "
                    "cross-pod instruction refused (design §8)",
                    reason=REFUSED_UNCONFIRMED,
                ) from exc
        if (
            isinstance(instruction, RealIds)
            and allocated is not None
            and confirmed_real_ids(instruction.spec, allocated)
        ):
            resolved, holders, lends = self._spot_inputs(instruction, pod)
            return decide(
                instruction,
                pod,
                info,
                view,
                allocated=allocated,
                resolved=resolved,
                holders=holders,
                lends=lends,
                device_list_dirs=self._device_list_dirs,
            )
        return decide(instruction, pod, info, view, allocated=allocated)

    def _check_pod(self, pod: PodInfo, info: ContainerInfo, *, needed: bool) -> None:
        """Refuse every container of a pod whose mix of GPU requests gpushare refuses.

        The admission policy refuses such a pod at creation, but it may be off, only warn, or
        younger than the pod: the node is the guarantee. A pod the agent has not read yet (or
        cannot read) is refused only when this container has an instruction to act on, so a
        lagging cache never stops containers that get nothing from gpushare.
        """
        if self._pod_rules is None:
            return
        try:
            why = self._pod_rules.refusal(pod.namespace, pod.name, pod.uid)
        except OracleUnavailable as exc:
            if not needed:
                return
            raise InstructionRefused(
                f"gpushare: cannot check the GPU requests of {pod.ref} ({exc}); container {info.name!r} is "
                "refused until the agent has read the pod, and kubelet retries it (design §8)",
                reason=REFUSED_MIX,
            ) from exc
        if why is not None:
            raise InstructionRefused(f"{why} (container {info.name!r} refused on the node)", reason=REFUSED_MIX)

    def _spot_inputs(
        self, instruction: RealIds, pod: PodInfo
    ) -> tuple[dict[str, Bundle], dict[str, Holder], dict[str, str | None] | None]:
        """For a confirmed spot instruction: whether each lend is active, the vendor's bundles, and
        kubelet's holder of every ID the vendor did not resolve. Only now, so a forged instruction
        never makes us call the vendor plugin."""
        spec = instruction.spec
        try:
            lends = None
            if self._lend_state is not None:
                lends = {
                    rid: self._lend_state.lend_ended(rid, pod.namespace, pod.name, pod.uid)
                    for _, ids in spec.by_resource
                    for rid in ids
                }
            resolved: dict[str, Bundle] = {}
            holders: dict[str, Holder] = {}
            if lends is None or any(why is not None for why in lends.values()):
                return resolved, holders, lends
            for resource, ids in spec.by_resource:
                bundle = self._resolve(resource, ids)
                if bundle is not None:
                    resolved[resource] = bundle
                elif self._holders is not None:
                    for rid in ids:
                        holder = self._holders.holder_of(resource, rid)
                        if holder is not None:
                            holders[rid] = holder
        except OracleUnavailable as exc:
            raise InstructionRefused(
                f"gpushare: cannot confirm the spot lend of {pod.ref} or where its GPU is: {exc}; refused (design §8)",
                reason=REFUSED_LEND_ENDED,
            ) from exc
        return resolved, holders, lends

    def _resolve(self, resource: str, ids: tuple[str, ...]) -> Bundle | None:
        if self._resolver is None:
            return None
        try:
            return self._resolver.resolve(resource, ids)
        except OracleUnavailable as exc:  # the holder's nodes may still serve
            log.warning("vendor allocate unavailable", extra=kv(resource=resource, reason=str(exc)))
            return None
