"""Raw pod dicts as the loop's caches hold them (camelCase API JSON), for the loop's tests.

Shared by the loop, report and cluster-view tests; not a test module itself.
"""

from __future__ import annotations

from typing import Any

from gpushare.config import load_config

CFG = load_config(text="version: v1\nnodeName: n1\nrealResources: [example.com/gpu]\n")

UNSCHED = [{"type": "PodScheduled", "status": "False", "message": "0/1 nodes: Insufficient example.com/gpu"}]


def pod(
    name: str,
    *,
    ns: str = "default",
    rv: str = "1",
    node: str = "",
    phase: str = "Pending",
    limits: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    conditions: list[dict[str, str]] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": name, "uid": f"uid-{name}", "resourceVersion": rv}
        | {"labels": labels or {}, "annotations": annotations or {}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {"limits": limits or {}}}]},
        "status": {"phase": phase, "conditions": conditions or []},
    }


def shadow(name: str, **kw: Any) -> dict[str, Any]:
    labels = {"gpushare.k8s.io/role": "shadow", "gpushare.k8s.io/share-spec": "4"}
    labels["gpushare.k8s.io/share-kind"] = "share"
    return pod(name, ns="gpushare-system", labels=labels, limits={"example.com/gpu": "1"}, **kw)
