"""What a container is to a GPU: the roles /metrics attributes and ``kubectl gpushare who`` shows."""

from __future__ import annotations

ROLE_OWNER = "owner"  # kubelet gave it the real GPU (it may lend it)
ROLE_SHADOW = "shadow"  # a shadow pod holding the GPU for its sharers
ROLE_SHARER = "sharer"  # a share of a shadow's GPU
ROLE_DIND = "dind"  # another container of the pod, given the GPU by the DinD injection
ROLE_BORROWER = "borrower"  # a spot pod on an idle owner's GPU
ROLES = (ROLE_OWNER, ROLE_SHADOW, ROLE_SHARER, ROLE_DIND, ROLE_BORROWER)

__all__ = ["ROLES", "ROLE_BORROWER", "ROLE_DIND", "ROLE_OWNER", "ROLE_SHADOW", "ROLE_SHARER"]
