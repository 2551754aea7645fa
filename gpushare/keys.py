"""Every resource name, label and annotation key of the gpushare contract, once.

Each constant names the section of the design (docs/design.md) that defines it.
Nothing else in the code base spells these strings.
"""

from __future__ import annotations

from typing import Final

DOMAIN: Final = "gpushare.k8s.io"
RESOURCE_PREFIX: Final = "gpushare/"

# §2 resources. The share-spec N is appended: "gpushare/share-gpu-4".
RESOURCE_SHARE_GPU_PREFIX: Final = "gpushare/share-gpu-"
RESOURCE_SHARE_DEV_GPU_PREFIX: Final = "gpushare/share-dev-gpu-"
RESOURCE_SPOT_GPU: Final = "gpushare/spot-gpu"

# §3 shadow pods.
# Where a plain `kubectl apply -f manifests/` installs gpushare; Helm installs it into the release
# namespace, which the agent's config names (gpushare.installation).
DEFAULT_NAMESPACE: Final = "gpushare-system"
SHADOW_CONTAINER: Final = "main"
LABEL_ROLE: Final = f"{DOMAIN}/role"
ROLE_SHADOW: Final = "shadow"
LABEL_SHARE_SPEC: Final = f"{DOMAIN}/share-spec"
LABEL_SHARE_KIND: Final = f"{DOMAIN}/share-kind"
KIND_SHARE: Final = "share"
KIND_SHARE_DEV: Final = "share-dev"
# §3 mapping records, written by the node agent (the truth stays in PodResources, design §9):
# on a shadow, JSON {"<ns>/<sharer>/<container>": ["<virtual id>", ...]} listing its users;
ANNOTATION_SHADOW_USERS: Final = f"{DOMAIN}/shadow-users"
# on a sharer, JSON {"<shadow ns>/<shadow name>": "<shadow uid>"}: the shadow(s) it depends on.
ANNOTATION_SHADOW_OWNER: Final = f"{DOMAIN}/shadow-owner"
# Taking an idle shadow out of service (docs/scale.md, "Shadow removal order"): the leader writes a
# token in ANNOTATION_SHADOW_DRAINING and stops counting the shadow's slots; the node agent publishes
# the lower share capacity, withdraws the shadow's virtual devices and answers with the same token in
# ANNOTATION_SHADOW_DRAINED; only then does the leader delete the shadow.
ANNOTATION_SHADOW_DRAINING: Final = f"{DOMAIN}/draining"
ANNOTATION_SHADOW_DRAINED: Final = f"{DOMAIN}/drained"
# §3 pools: a sharer may name the real resource of its pool (default: the first of realResources).
ANNOTATION_POOL_RESOURCE: Final = f"{DOMAIN}/pool-resource"
# On the installation's namespace, set by the operator before `helm uninstall`: "evict" has the
# uninstall hook evict the pods that still use gpushare instead of refusing (docs/install.md).
ANNOTATION_UNINSTALL: Final = f"{DOMAIN}/uninstall"
UNINSTALL_EVICT: Final = "evict"

# §4 container annotations (emitted by our device plugins, read by the NRI plugin).
ANNOTATION_DEVICES_FROM: Final = f"{DOMAIN}/container-devices-from"
ANNOTATION_DEVICES_IDS: Final = f"{DOMAIN}/container-devices-ids"
# §4 pod annotation for same-pod injection (Docker-in-Docker): "<prefix>.<target>: <source>".
POD_ANNOTATION_DEVICES_FROM_PREFIX: Final = f"{DOMAIN}/container-devices-from."

# §6 spot: owners opt in with this label on the pod or its namespace.
LABEL_LENDABLE: Final = f"{DOMAIN}/lendable"

# §5 CDI device annotations that travel with a bundle (containerd's CDI annotation prefix).
CDI_ANNOTATION_PREFIX: Final = "cdi.k8s.io/"

# §11 DRA nodes: the driver's name, the domain of its device attributes and CDI vendor.
DRA_DRIVER: Final = DOMAIN
# The whole-GPU DeviceClass, and the name Kubernetes gives every class as an extended resource
# (deviceclass.resource.kubernetes.io/<class>): what an owner of a whole DRA GPU holds, as
# gpushare's spot logic reads it from PodResources.
DRA_CLASS_GPU: Final = f"gpu.{DOMAIN}"
RESOURCE_DRA_GPU: Final = f"deviceclass.resource.kubernetes.io/{DRA_CLASS_GPU}"
# Taints on a spot device (docs/dra.md, "Lending"): no new borrower while the owner is active;
# borrowers evicted and their claims deallocated after a reclaim.
TAINT_OWNER_ACTIVE: Final = f"{DOMAIN}/owner-active"
TAINT_RECLAIMED: Final = f"{DOMAIN}/reclaimed"

# Lease held by the agent that reconciles cluster-wide shadow demand (§1).
LEASE_NAME: Final = "gpushare-controller"


def share_resource(kind: str, spec: int) -> str:
    """Return the extended-resource name of one share spec, e.g. ``gpushare/share-gpu-4``."""
    if kind == KIND_SHARE:
        return f"{RESOURCE_SHARE_GPU_PREFIX}{spec}"
    if kind == KIND_SHARE_DEV:
        return f"{RESOURCE_SHARE_DEV_GPU_PREFIX}{spec}"
    raise ValueError(f"unknown share kind {kind!r}; expected {KIND_SHARE!r} or {KIND_SHARE_DEV!r}")


def parse_share_resource(resource: str) -> tuple[str, int] | None:
    """Return ``(kind, N)`` for a share resource name, or None for any other name."""
    # The dev prefix is checked first: "gpushare/share-gpu-" is not a prefix of it, but keep
    # the order obvious should the names ever change.
    for prefix, kind in ((RESOURCE_SHARE_DEV_GPU_PREFIX, KIND_SHARE_DEV), (RESOURCE_SHARE_GPU_PREFIX, KIND_SHARE)):
        if resource.startswith(prefix):
            tail = resource[len(prefix) :]
            # isascii: str.isdigit() also accepts "²", which int() refuses.
            if tail.isascii() and tail.isdigit() and not tail.startswith("0"):
                return kind, int(tail)
            return None
    return None
