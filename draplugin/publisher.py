"""Keeps the node's ResourceSlices equal to what the node publishes (``pool.build_pool``).

The pool is named after the node; each slice carries the label ``gpushare.k8s.io/slice-index``
(its place in the pool) and an annotation with the hash of its spec, so a reconcile compares
hashes instead of objects the API server has defaulted. Any difference rewrites the whole pool
under the next ``pool.generation`` (consumers use only the newest generation and check
``resourceSliceCount``), updating slices in place, creating missing ones and deleting extras.

kubelet deletes a node's slices when it starts and a driver's slices 30 s after losing it; a
watch on the node's slices of this driver notices deletions and edits and reconciles at once.
A periodic resync covers a missed event. Every slice has the Node as its controller owner, so
the node's deletion takes its slices with it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, cast

import kubernetes

from draplugin.pool import PoolSpec
from gpushare import keys
from gpushare.log import kv

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
VERSION = "v1"
PLURAL = "resourceslices"
LABEL_INDEX = f"{keys.DOMAIN}/slice-index"
ANNOTATION_HASH = f"{keys.DOMAIN}/slice-hash"
_TIMEOUT_S = 10


def spec_hash(spec: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]


class SlicePublisher:
    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        *,
        driver: str,
        node: str,
        desired: Callable[[], PoolSpec],
        resync_s: float = 30.0,
    ) -> None:
        self._custom = kubernetes.client.CustomObjectsApi(api)
        self._core = kubernetes.client.CoreV1Api(api)
        self.driver = driver
        self.node = node
        self._desired = desired
        self._resync_s = resync_s
        self._dirty = threading.Event()
        self._owner: dict[str, Any] | None = None
        self.generation = 0
        self._hashes: frozenset[str] = frozenset()
        self.writes = 0  # slices created, updated or deleted, for tests and /metrics

    @property
    def field_selector(self) -> str:
        return f"spec.nodeName={self.node},spec.driver={self.driver}"

    def poke(self) -> None:
        """Reconcile now (the desired pool changed: a taint, a GPU)."""
        self._dirty.set()

    def _existing(self) -> list[dict[str, Any]]:
        listed = cast(
            dict[str, Any],
            self._custom.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, field_selector=self.field_selector, _request_timeout=_TIMEOUT_S
            ),
        )
        return list(listed.get("items", []))

    def _owner_ref(self) -> list[dict[str, Any]]:
        if self._owner is None:
            node: dict[str, Any] = self._core.api_client.sanitize_for_serialization(
                self._core.read_node(self.node, _request_timeout=_TIMEOUT_S)
            )
            self._owner = {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node,
                "uid": node["metadata"]["uid"],
                "controller": True,
            }
        return [self._owner]

    def reconcile(self) -> bool:
        """Make the API match; True when something was written."""
        pool = self._desired()
        existing = self._existing()
        hashes = [spec_hash(s) for s in pool.slices]
        self._hashes = frozenset(hashes)
        by_index: dict[int, dict[str, Any]] = {}
        extra: list[dict[str, Any]] = []
        for item in existing:
            raw = (item["metadata"].get("labels") or {}).get(LABEL_INDEX, "")
            index = int(raw) if raw.isdigit() else -1
            if 0 <= index < len(pool.slices) and index not in by_index:
                by_index[index] = item
            else:
                extra.append(item)
        generations = {int(i["spec"]["pool"].get("generation", 0)) for i in existing}
        in_sync = (not existing and not pool.slices) or (
            not extra
            and len(by_index) == len(pool.slices)
            and len(generations) == 1
            and all(
                (by_index[i]["metadata"].get("annotations") or {}).get(ANNOTATION_HASH) == hashes[i]
                and by_index[i]["spec"]["pool"].get("resourceSliceCount") == len(pool.slices)
                and by_index[i]["spec"]["pool"].get("name") == pool.name
                for i in by_index
            )
        )
        if in_sync:
            self.generation = generations.pop()
            return False
        generation = max(generations | {self.generation}) + 1
        owner = self._owner_ref()
        for i, spec in enumerate(pool.slices):
            body_spec = {
                **spec,
                "pool": {"name": pool.name, "generation": generation, "resourceSliceCount": len(pool.slices)},
            }
            current = by_index.get(i)
            if current is None:
                body = {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "ResourceSlice",
                    "metadata": {
                        "generateName": f"{self.node}-{self.driver}-",
                        "labels": {LABEL_INDEX: str(i)},
                        "annotations": {ANNOTATION_HASH: hashes[i]},
                        "ownerReferences": owner,
                    },
                    "spec": body_spec,
                }
                self._custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body, _request_timeout=_TIMEOUT_S)
            else:
                meta = current["metadata"]
                body = {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "ResourceSlice",
                    "metadata": {
                        "name": meta["name"],
                        "resourceVersion": meta["resourceVersion"],
                        "labels": {**(meta.get("labels") or {}), LABEL_INDEX: str(i)},
                        "annotations": {**(meta.get("annotations") or {}), ANNOTATION_HASH: hashes[i]},
                        "ownerReferences": meta.get("ownerReferences") or owner,
                    },
                    "spec": body_spec,
                }
                self._custom.replace_cluster_custom_object(
                    GROUP, VERSION, PLURAL, meta["name"], body, _request_timeout=_TIMEOUT_S
                )
            self.writes += 1
        for item in extra:
            try:
                self._custom.delete_cluster_custom_object(
                    GROUP, VERSION, PLURAL, item["metadata"]["name"], _request_timeout=_TIMEOUT_S
                )
            except kubernetes.client.ApiException as exc:
                if exc.status != 404:
                    raise
            self.writes += 1
        self.generation = generation
        log.info("published %s", kv(node=self.node, slices=len(pool.slices), generation=generation, removed=len(extra)))
        return True

    def _watch(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                stream = kubernetes.watch.Watch().stream(  # type: ignore[no-untyped-call]
                    self._custom.list_cluster_custom_object,
                    GROUP,
                    VERSION,
                    PLURAL,
                    field_selector=self.field_selector,
                    timeout_seconds=int(self._resync_s),
                )
                for event in stream:
                    if stop.is_set():
                        return
                    obj = event.get("object") or {}
                    if event.get("type") == "DELETED" or self._foreign(obj):
                        self._dirty.set()
            except Exception as exc:  # the watch restarts; the resync still runs
                log.warning("slice watch ended %s", kv(reason=repr(exc)))
                stop.wait(1.0)

    def _foreign(self, obj: Mapping[str, Any]) -> bool:
        """A slice event that is not our last write: someone else's edit, or an older generation."""
        meta = obj.get("metadata") or {}
        pool = (obj.get("spec") or {}).get("pool") or {}
        written = (meta.get("annotations") or {}).get(ANNOTATION_HASH)
        return written not in self._hashes or pool.get("generation") != self.generation

    def run(self, stop: threading.Event) -> None:
        watcher = threading.Thread(target=self._watch, args=(stop,), name="dra-slice-watch", daemon=True)
        watcher.start()
        while not stop.is_set():
            self._dirty.clear()
            try:
                self.reconcile()
            except Exception as exc:  # retried on the next event or resync
                log.warning("publishing failed %s", kv(node=self.node, reason=repr(exc)))
                stop.wait(1.0)
                continue
            self._dirty.wait(self._resync_s)
