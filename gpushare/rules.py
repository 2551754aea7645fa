"""The rules more than one part evaluates, each written once (design §2, §3, §6, §8).

Two parts that each spell a rule drift apart: one tightens it and the other keeps letting
through what the first refuses. So a rule that the NRI plugin, the device plugins, the agent
or the command line all need lives here, as a plain function over plain values, and every
caller asks it. Pure: no I/O, no clock; callers pass what they observed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Final

from gpushare import keys

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
    the agent creates pods in ``gpushare-system``. Whatever trusts a pod as a shadow (the NRI
    plugin's cross-pod source, the agent's model, the operator's view) asks this.
    """
    return namespace == keys.SHADOW_NAMESPACE and labels.get(keys.LABEL_ROLE) == keys.ROLE_SHADOW


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
    "ReturnSignal",
    "is_device_resource",
    "is_dns_label",
    "is_gpushare_resource",
    "is_shadow",
    "is_share_spec",
    "is_vendor_resource",
    "may_borrow",
    "on_node_selector",
    "return_signal",
]
