"""Pod manifests of the e2e tests, the spot environment, the benchmarks and the demo: host-network
busybox pods (the locally built image, never pulled) that sleep until TERM."""

from __future__ import annotations

from typing import Any

from localcluster.images import BUSYBOX_IMAGE


def pod_manifest(
    name: str,
    *,
    namespace: str = "default",
    resources: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    containers: list[str] | None = None,
    labels: dict[str, str] | None = None,
    each: dict[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A host-network busybox pod that sleeps until TERM (busybox as PID 1 ignores TERM otherwise).

    ``resources`` are the first container's limits; ``each`` names every container with its own."""
    names = list(each) if each is not None else containers or ["app"]
    limits = each if each is not None else {names[0]: resources or {}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": annotations or {},
            "labels": {"gpushare-e2e": "1", **(labels or {})},
        },
        "spec": {
            "hostNetwork": True,
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": c,
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
                    **({"resources": {"limits": dict(limits[c])}} if limits.get(c) else {}),
                }
                for c in names
            ],
        },
    }


def sharer(name: str, n: int = 4, namespace: str = "default", **kw: Any) -> dict[str, Any]:
    return pod_manifest(name, namespace=namespace, resources={f"gpushare/share-gpu-{n}": "1"}, **kw)
