"""The unit of shadow demand: pool x kind x N (design §3), one object per key in a snapshot.

Pure module: stdlib and ``gpushare`` only (docs/architecture.md).
"""

from __future__ import annotations

from typing import NamedTuple

from gpushare import keys


class Pool(NamedTuple):
    """Where a shadow's GPU comes from: a real resource, refined by a node-selector label set.

    A sharer's pool is the real resource named by its ``pool-resource`` annotation (default:
    the first of ``realResources``) plus its own nodeSelector; a shadow's pool is the real
    resource it requests plus its nodeSelector. A shadow created for a pool carries that
    nodeSelector, so its sharers can follow it to the same nodes (docs/controller.md).
    """

    resource: str
    node_selector: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        if not self.node_selector:
            return self.resource
        return self.resource + "{" + ",".join(f"{k}={v}" for k, v in self.node_selector) + "}"


class ShareKey(NamedTuple):
    """The unit of shadow demand: pool x kind x N (design §3).

    A tuple, like ``Pool``: the leader's pass groups every shadow and sharer by key, and a
    tuple hashes and compares in C, where a dataclass's ``__hash__`` is a Python call. Both
    order, hash and compare as their fields; like any tuple, each also equals a plain tuple
    of the same fields.
    """

    pool: Pool
    kind: str
    spec: int

    @property
    def resource(self) -> str:
        return keys.share_resource(self.kind, self.spec)

    def __str__(self) -> str:
        return f"{self.pool}/{self.resource}"


# One ShareKey per pool x kind x N in a snapshot: the leader's pass groups thousands of pods by
# key, and a dict finds an identical key without comparing fields.
ShareKeys = dict[tuple[str, tuple[tuple[str, str], ...], str, int], ShareKey]


def share_key(
    resource: str, selector: tuple[tuple[str, str], ...], kind: str, spec: int, known: ShareKeys | None
) -> ShareKey:
    if known is None:
        return ShareKey(Pool(resource, selector), kind, spec)
    fields = (resource, selector, kind, spec)
    key = known.get(fields)
    if key is None:
        key = known[fields] = ShareKey(Pool(resource, selector), kind, spec)
    return key


__all__ = ["Pool", "ShareKey", "ShareKeys", "share_key"]
