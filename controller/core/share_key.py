"""The unit of shadow demand: pool x kind x N (design §3), one object per key in a snapshot.

Pure module: stdlib and ``gpushare`` only (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpushare import keys


@dataclass(frozen=True, order=True, slots=True)
class Pool:
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


@dataclass(frozen=True, order=True, slots=True)
class ShareKey:
    """The unit of shadow demand: pool x kind x N (design §3)."""

    pool: Pool
    kind: str
    spec: int

    def __hash__(self) -> int:
        # The leader's pass groups every shadow and sharer by key: one hash of plain values
        # instead of the generated one's hash of the Pool, which calls Pool's own in turn.
        return hash((self.pool.resource, self.pool.node_selector, self.kind, self.spec))

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
