"""``nri_plugin.PodRules`` over the agent's cache of the pods bound to its node.

At CreateContainer the NRI plugin knows the pod's sandbox (name, uid, annotations) but not what
its containers ask of the device plugins. The API server's pod does, and the agent already
watches every pod bound to its node, so the answer is a dictionary lookup, well inside the
runtime's deadline. The rule itself is ``gpushare.rules.refused_mix`` (through
``controller.core.model.refusal_of``), the one the agent's pass and the admission policy apply.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from controller.core.model import refusal_of
from controller.core.pod_facts import parse_pod
from controller.errors import InvalidObject
from nri_plugin.errors import OracleUnavailable

# "<namespace>/<name>" -> the pod as the node's watch last saw it, or None.
PodLookup = Callable[[str], Mapping[str, Any] | None]


class CachedPodRules:
    """``refusal(namespace, name, uid)`` from the node's pod cache; ``OracleUnavailable`` when the
    cache does not hold that pod (by uid) yet, or the pod cannot be read."""

    def __init__(self, lookup: PodLookup, real_resources: Collection[str]) -> None:
        self._lookup = lookup
        self._real = tuple(real_resources)

    def refusal(self, namespace: str, name: str, uid: str) -> str | None:
        raw = self._lookup(f"{namespace}/{name}")
        if raw is None:
            raise OracleUnavailable("the agent's watch of this node's pods has not seen it yet")
        try:
            facts = parse_pod(raw)
        except InvalidObject as exc:
            raise OracleUnavailable(f"the agent cannot read it: {exc}") from exc
        if uid and facts.ref.uid != uid:
            raise OracleUnavailable("the agent's watch still holds an earlier pod of that name")
        return refusal_of(facts, self._real)


__all__ = ["CachedPodRules", "PodLookup"]
