"""What this configuration serves, and the Warning a sharer asking for anything else gets.

A share key is served when its kind and N are in ``shareSpecs`` / ``devShareSpecs`` and its
pool resource is in ``realResources``. A sharer of any other key gets no shadow and a Warning
that says which setting it missed: from the leader while it waits unscheduled, and from its
node's agent once the scheduler has placed it anyway. The scheduler knows no pools, so a
sharer naming a pool nobody serves is placed on a free slot of its share resource like any
other, often before the leader's pass sees it pending.
Pure module: stdlib and controller.core only.
"""

from __future__ import annotations

from collections.abc import Iterable

from controller.core.actions import Action, RecordEvent
from controller.core.model import ShareKey, SharePod
from gpushare import keys
from gpushare.config import Config

REASON_UNKNOWN_SPEC = "UnknownShareSpec"
REASON_UNKNOWN_POOL = "UnknownPoolResource"


def configured_specs(cfg: Config) -> set[tuple[str, int]]:
    """(kind, N) of every share resource the agents offer."""
    return {(keys.KIND_SHARE, n) for n in cfg.share_specs} | {(keys.KIND_SHARE_DEV, n) for n in cfg.dev_share_specs}


def is_served(key: ShareKey, configured: set[tuple[str, int]], cfg: Config) -> bool:
    """``configured``: ``configured_specs(cfg)``, computed once per pass by the caller."""
    return (key.kind, key.spec) in configured and key.pool.resource in cfg.real_resources


def refuse_unserved(key: ShareKey, sharers: Iterable[SharePod], cfg: Config) -> list[Action]:
    """A Warning for each of ``sharers`` (all of the unserved ``key``) instead of a shadow."""
    if key.pool.resource not in cfg.real_resources:
        reason = REASON_UNKNOWN_POOL
        why = (
            f"gpushare: pool resource {key.pool.resource!r:.80} (annotation {keys.ANNOTATION_POOL_RESOURCE}) is not "
            f"one of realResources {list(cfg.real_resources)}; no shadow will be created for it"
        )
    else:
        reason = REASON_UNKNOWN_SPEC
        why = (
            f"gpushare: {key.resource} is not served here (shareSpecs {list(cfg.share_specs)}, devShareSpecs "
            f"{list(cfg.dev_share_specs)}); no shadow will be created for it"
        )
    return [RecordEvent(p.ref, reason, why, "Warning") for p in sharers]


def refuse_unserved_bound(sharers_here: Iterable[SharePod], cfg: Config) -> list[Action]:
    """The node's part: the Warning for each unfinished sharer on the node whose key is not served."""
    configured = configured_specs(cfg)
    unserved: dict[ShareKey, list[SharePod]] = {}
    for sharer in sharers_here:
        if not sharer.facts.is_terminal and not is_served(sharer.key, configured, cfg):
            unserved.setdefault(sharer.key, []).append(sharer)
    return [a for key, pods in sorted(unserved.items()) for a in refuse_unserved(key, pods, cfg)]


__all__ = [
    "REASON_UNKNOWN_POOL",
    "REASON_UNKNOWN_SPEC",
    "configured_specs",
    "is_served",
    "refuse_unserved",
    "refuse_unserved_bound",
]
