"""The rules more than one part evaluates, each written once (design §2, §3, §6, §8).

Two parts that each spell a rule drift apart: one tightens it and the other keeps letting
through what the first refuses. So a rule that the NRI plugin, the device plugins, the agent
or the command line all need lives here, as a plain function over plain values, and every
caller asks it. Pure: no I/O, no clock; callers pass what they observed.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from enum import StrEnum
from typing import Final

from gpushare import installation, keys

# -- resources (design §2) ----------------------------------------------------------------------------------

# The share specs a configuration may serve: one slot is at least 1/64 of a GPU, and a GPU split in
# one is not shared. Device IDs of a shadow's slots are numbered within it (ids.virtual_ids_of).
MIN_SHARE_SPEC: Final = 2
MAX_SHARE_SPEC: Final = 64


def is_share_spec(n: int) -> bool:
    """Whether N may be served: ``gpushare/share-gpu-N`` with ``MIN_SHARE_SPEC <= N <= MAX_SHARE_SPEC``."""
    return MIN_SHARE_SPEC <= n <= MAX_SHARE_SPEC


def is_gpushare_resource(name: str) -> bool:
    """A resource gpushare advertises (``gpushare/...``): shares and spot, never a vendor's GPU."""
    return name.startswith(keys.RESOURCE_PREFIX)


def is_device_resource(name: str) -> bool:
    """An extended resource a device plugin may advertise, ours or a vendor's: ``<domain>/<name>``.

    cpu, memory, ephemeral-storage and hugepages-* carry no slash; ``kubernetes.io/`` and its
    subdomains are Kubernetes' own, never devices.
    """
    return "/" in name and "kubernetes.io/" not in name


def is_vendor_resource(name: str) -> bool:
    """A vendor's device resource such as ``nvidia.com/gpu``: a device resource that is not ours."""
    return is_device_resource(name) and not is_gpushare_resource(name)


# -- the mixes of GPU requests a pod may not make (design §8; docs/security.md) ------------------------------

# One container's ask: its name and every resource named in its limits or requests, as the pod
# spells them. Presence counts, not the quantity: the admission policy reads it so, and a pod
# refused there must be refused here too.
ContainerAsk = tuple[str, Sequence[str]]

_SHARE_PREFIXES = (keys.RESOURCE_SHARE_GPU_PREFIX, keys.RESOURCE_SHARE_DEV_GPU_PREFIX)


def refused_mix(
    pod: str,
    containers: Sequence[ContainerAsk],
    annotations: Mapping[str, str],
    real_resources: Collection[str],
    init_containers: Collection[str] = (),
) -> str | None:
    """Why gpushare refuses this pod's mix of GPU requests, in the admission policy's own words;
    None when it may run.

    ``pod``: ``<namespace>/<name>`` for the message; ``containers``: the app containers, then the
    init containers (they hold their devices for the pod's life too); ``real_resources``: the
    configuration's vendor resources; ``init_containers``: the names of the init containers that
    are not sidecars (no ``restartPolicy: Always``). The node enforces what the policy ``gpushare-pods`` refuses
    at creation, because the policy may be off or only warn: a sharer's shadows, a borrower's
    reclaim and a whole GPU's tenant each assume a pod is exactly one of them.
    """
    asked = [r for _, resources in containers for r in resources]
    shares = [r for r in asked if r.startswith(_SHARE_PREFIXES)]
    asks_spot = keys.RESOURCE_SPOT_GPU in asked
    reals = [r for r in asked if r in real_resources]
    if asks_spot and shares:
        return (
            f"gpushare: pod {pod} asks for {keys.RESOURCE_SPOT_GPU} and {shares[0]}; a borrower is killed whole when "
            "the owner of the lent GPU returns, a sharer must keep its slot: run the spot work and the shared work "
            "as separate pods"
        )
    other = next((r for r in shares if r != shares[0]), None)
    if other is not None:
        return (
            f"gpushare: pod {pod} asks for {shares[0]} and {other}; all the slots of a pod come from shadows of one "
            f"kind and spec: ask every container for the same {keys.RESOURCE_SHARE_GPU_PREFIX}N, or the same "
            f"{keys.RESOURCE_SHARE_DEV_GPU_PREFIX}N"
        )
    if shares and reals:
        return (
            f"gpushare: pod {pod} asks for {shares[0]} and {reals[0]}; a sharer is evicted whole when its shadow "
            "goes, and a container given both would see only one of them in its visibility variables: run the "
            "shared and the whole-GPU work as separate pods"
        )
    if asks_spot and reals:
        return (
            f"gpushare: pod {pod} asks for {keys.RESOURCE_SPOT_GPU} and {reals[0]}; a borrower is killed whole when "
            "the owner of the lent GPU returns, so its own GPU would go with it: run the spot work and the "
            "whole-GPU work as separate pods"
        )
    prefix = keys.POD_ANNOTATION_DEVICES_FROM_PREFIX
    targets = {k[len(prefix) :] for k in annotations if k.startswith(prefix)}
    for name, resources in containers:
        if name in targets and any(is_gpushare_resource(r) or r in real_resources for r in resources):
            return (
                f'gpushare: pod {pod}: container "{name}" is named by the annotation {prefix}{name} and also asks '
                "for a GPU resource; a Docker-in-Docker target gets its GPU from its source container only: "
                f'remove the resource from "{name}" or the annotation'
            )
    # kubelet's PodResources lists app containers and sidecars only, and the NRI plugin gives a
    # container a shadow's or a lent GPU only when kubelet confirms the allocation.
    for name, resources in containers:
        ours = next((r for r in resources if is_gpushare_resource(r)), None)
        if name in init_containers and ours is not None:
            return (
                f'gpushare: pod {pod}: init container "{name}" asks for {ours}; kubelet does not report the devices '
                "of init containers that are not sidecars, so gpushare cannot confirm them and the container would "
                f'never start: ask for it in an app container, or make "{name}" a sidecar (restartPolicy: Always)'
            )
    return None


# -- names ----------------------------------------------------------------------------------------------------

# RFC 1123 label, as Kubernetes checks namespace and container names: what a pod annotation may name.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def is_dns_label(value: str) -> bool:
    """A lower-case RFC 1123 label of at most 63 characters (namespaces, container names)."""
    return _DNS_LABEL.fullmatch(value) is not None


# -- shadow pods (design §3, §8) ------------------------------------------------------------------------------

# The label selector of every shadow: with the namespace it names all of them and nothing else.
SHADOW_SELECTOR: Final = f"{keys.LABEL_ROLE}={keys.ROLE_SHADOW}"
# Pods no node has yet that wait for the scheduler: the leader's demand and drain hold read these.
PENDING_UNBOUND_SELECTOR: Final = "spec.nodeName=,status.phase=Pending"


def on_node_selector(node: str) -> str:
    """The field selector of the pods bound to ``node``."""
    return f"spec.nodeName={node}"


def is_shadow(namespace: str, labels: Mapping[str, str]) -> bool:
    """A gpushare shadow: labelled a shadow *and* in the shadows' namespace.

    The label alone is not enough: any tenant can put it on a pod of its own namespace, while only
    the agent creates pods in its own namespace (``gpushare.installation``). Whatever trusts a pod as a shadow (the NRI
    plugin's cross-pod source, the agent's model, the operator's view) asks this.
    """
    return namespace == installation.namespace() and labels.get(keys.LABEL_ROLE) == keys.ROLE_SHADOW


# -- spot (design §6) ---------------------------------------------------------------------------------------------


def may_borrow(*, device_healthy: bool, lent_to_this_pod: bool, reclaimed: bool) -> bool:
    """Whether a borrower may be given a lent GPU now.

    Never a pod the agent reclaimed (killed for a returning, leaving or no longer lendable owner),
    whatever happened since. Otherwise while the GPU's ``spot-<id>`` device is Healthy (its owner is
    away: kubelet may give it to a newcomer), or while the last pass saw it lent to this very pod (a
    borrower's container restarting while the device is closed to newcomers). The device plugin's
    Allocate knows no pod, so it asks with ``lent_to_this_pod=False``; the NRI plugin knows it.
    """
    if reclaimed:
        return False
    return device_healthy or lent_to_this_pod


class ReturnSignal(StrEnum):
    """How an owner's return can be seen; spot lends nothing it could not take back in time."""

    KERNEL_MODULE = "kernel module + utilization"  # gpukmod holds the owner's first GPU ioctl
    UTILIZATION = "utilization alone (gpukmod not loaded)"  # within a scrape interval
    NONE = "no return signal (gpukmod not loaded, metrics do not attribute GPU use to pods): nothing is lent"


def return_signal(*, kmod_watches: bool, metrics_name_users: bool) -> ReturnSignal:
    """How an owner's return is seen: the kernel module watching it, or metrics that name who uses
    each GPU (process-level attribution), or not at all. ``kmod_watches`` is the module being loaded
    and, for one owner, its pid namespace known."""
    if kmod_watches:
        return ReturnSignal.KERNEL_MODULE
    if metrics_name_users:
        return ReturnSignal.UTILIZATION
    return ReturnSignal.NONE


__all__ = [
    "MAX_SHARE_SPEC",
    "MIN_SHARE_SPEC",
    "PENDING_UNBOUND_SELECTOR",
    "SHADOW_SELECTOR",
    "ContainerAsk",
    "ReturnSignal",
    "is_device_resource",
    "is_dns_label",
    "is_gpushare_resource",
    "is_shadow",
    "is_share_spec",
    "is_vendor_resource",
    "may_borrow",
    "on_node_selector",
    "refused_mix",
    "return_signal",
]
