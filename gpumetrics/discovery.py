"""The node's own exporter pod, found through the API: the ``k8s://pods/...`` metrics source.

    k8s://pods/<namespace>?labelSelector=<selector>&port=<name or number>[&scheme=http|https][&path=/metrics]

NVIDIA's GPU Operator runs dcgm-exporter as a DaemonSet on the pod network, so nothing listens
on the node's 127.0.0.1:9400, and its Service balances over every node's exporter. The agent
instead lists the pods of ``namespace`` that match ``selector`` on its own node (field selector
``spec.nodeName``) and scrapes the one that is Running and Ready, at its IP and the named (or
numbered) container port. ``GPU_OPERATOR_SOURCE`` is that source for the operator's layout
(docs/nvidia.md, "Next to NVIDIA's GPU Operator").

Decision code: ``parse_pod_source`` reads the source; ``pick_endpoint`` picks the pod and port
from pods the caller listed (the API's own JSON). Every refusal is a ``MetricsError`` that names
what was looked for and on which node; the listing and the scrape are ``gpumetrics.scrape``'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from gpumetrics.errors import MetricsError

__all__ = [
    "GPU_OPERATOR_SOURCE",
    "POD_SOURCE_PREFIX",
    "ExporterEndpoint",
    "PodSource",
    "is_pod_source",
    "parse_pod_source",
    "pick_endpoint",
    "relist_delay_s",
]

POD_SOURCE_PREFIX = "k8s://pods/"
# dcgm-exporter as NVIDIA's GPU Operator deploys it: its DaemonSet's pods are labelled
# app=nvidia-dcgm-exporter and declare container port 9400 named "metrics", in the namespace
# the operator was installed to (gpu-operator in NVIDIA's instructions).
GPU_OPERATOR_SOURCE = "k8s://pods/gpu-operator?labelSelector=app=nvidia-dcgm-exporter&port=metrics"

_KEYS = ("labelSelector", "port", "scheme", "path")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# A container port's name (IANA_SVC_NAME): at most 15 lowercase letters, digits and inner
# hyphens, with at least one letter.
_PORT_NAME = re.compile(r"(?=.*[a-z])[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?")
# Backing off between lists while the exporter stays unreachable or absent: a node whose
# exporter is down lists once a minute at most, not once a scrape.
_RELIST_FIRST_S = 2.0
_RELIST_MAX_S = 60.0


@dataclass(frozen=True)
class PodSource:
    """A parsed ``k8s://pods/...`` source: where the exporter pods are and how to scrape one."""

    source: str  # as configured, for messages
    namespace: str
    label_selector: str
    port: str  # a container port's name, or its number
    scheme: str = "http"
    path: str = "/metrics"

    def looked_for(self, node: str) -> str:
        """What the source asks for, in the words of every message about it."""
        return f"a pod labelled {self.label_selector} in namespace {self.namespace} on node {node}"


@dataclass(frozen=True)
class ExporterEndpoint:
    """The pod chosen and where to scrape it."""

    namespace: str
    pod: str
    uid: str
    ip: str
    port: int
    url: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod}"


def is_pod_source(source: str) -> bool:
    return source.startswith("k8s://")


def _refuse(source: str, why: str) -> MetricsError:
    return MetricsError(
        f"gpushare: metrics source {source!r}: {why}; the form is "
        "k8s://pods/<namespace>?labelSelector=<selector>&port=<name or number>[&scheme=http|https][&path=/metrics]"
    )


def _query(source: str, query: str) -> dict[str, str]:
    """The query's keys and values. Split by hand on the first ``=``: a selector such as
    ``app=nvidia-dcgm-exporter`` may be written unescaped, and ``+`` stays ``+``."""
    out: dict[str, str] = {}
    for part in query.split("&") if query else []:
        key, sep, value = part.partition("=")
        if not sep:
            raise _refuse(source, f"{key!r} has no value")
        if key not in _KEYS:
            raise _refuse(source, f"unknown key {key!r} (known: {', '.join(_KEYS)})")
        if key in out:
            raise _refuse(source, f"{key} is given twice")
        out[key] = unquote(value)
    return out


def _check_port(source: str, port: str) -> None:
    if port.isdigit():
        if not 1 <= int(port) <= 65535:
            raise _refuse(source, f"port {port} is not between 1 and 65535")
    elif not _PORT_NAME.fullmatch(port):
        raise _refuse(source, f"port {port!r} is neither a number nor a container port's name")


def parse_pod_source(source: str) -> PodSource:
    """Read a ``k8s://pods/...`` source; ``MetricsError`` names the first problem."""
    parts = urlsplit(source)
    if parts.scheme != "k8s" or parts.netloc != "pods":
        raise _refuse(source, "a source found through the API starts with k8s://pods/")
    if parts.fragment:
        raise _refuse(source, "a fragment (#...) means nothing here")
    namespace = unquote(parts.path.strip("/"))
    if not _NAMESPACE.fullmatch(namespace):
        raise _refuse(source, f"{namespace!r} is not a namespace name")
    query = _query(source, parts.query)
    selector = query.get("labelSelector", "").strip()
    if not selector:
        raise _refuse(source, "labelSelector is required (the exporter's pods, e.g. app=nvidia-dcgm-exporter)")
    port = query.get("port", "")
    if not port:
        raise _refuse(source, "port is required (the container port's name or number, e.g. metrics)")
    _check_port(source, port)
    scheme = query.get("scheme", "http")
    if scheme not in ("http", "https"):
        raise _refuse(source, f"scheme must be http or https (got {scheme!r})")
    path = query.get("path", "/metrics")
    if not path.startswith("/"):
        raise _refuse(source, f"path must start with / (got {path!r})")
    return PodSource(source, namespace, selector, port, scheme, path)


def _is_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", "?"))


def _state(pod: Mapping[str, Any]) -> str:
    """Why a listed pod is not taken, in a few words (phase, deletion, readiness)."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "terminating"
    phase = str((pod.get("status") or {}).get("phase") or "no phase")
    return "not Ready" if phase == "Running" else phase


def _declared_ports(pod: Mapping[str, Any]) -> list[tuple[str, int]]:
    spec = pod.get("spec") or {}
    out = []
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        for port in container.get("ports") or []:
            if isinstance(port.get("containerPort"), int):
                out.append((str(port.get("name") or ""), int(port["containerPort"])))
    return out


def _port_of(spec: PodSource, pod: Mapping[str, Any], node: str) -> int:
    if spec.port.isdigit():
        # A number is taken as given: declaring a container port is informational in Kubernetes.
        return int(spec.port)
    declared = _declared_ports(pod)
    for name, number in declared:
        if name == spec.port:
            return number
    listed = ", ".join(f"{number}/{name}" if name else str(number) for name, number in declared) or "none"
    raise MetricsError(
        f"gpushare: metrics source {spec.source}: pod {spec.namespace}/{_name(pod)} on node {node} declares no "
        f"container port named {spec.port!r} (its ports: {listed}); set port= to one of them"
    )


def _url(scheme: str, ip: str, port: int, path: str) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"{scheme}://{host}:{port}{path}"


def pick_endpoint(spec: PodSource, node: str, pods: Sequence[Mapping[str, Any]]) -> ExporterEndpoint:
    """The one Running and Ready pod of ``pods`` on ``node``, and its URL; ``MetricsError`` otherwise.

    ``pods`` are the API's pod objects as listed (selector and node already applied by the API
    server; the node is checked again here, so a listing that ignored the field selector cannot
    hand over another node's exporter).
    """
    if not node:
        raise MetricsError(
            f"gpushare: metrics source {spec.source} needs this node's name (nodeName, or NODE_NAME in the DaemonSet)"
        )
    here = [p for p in pods if (p.get("spec") or {}).get("nodeName") == node]
    ready = sorted((p for p in here if _is_ready(p)), key=_name)
    if not ready:
        others = ", ".join(f"{_name(p)} ({_state(p)})" for p in sorted(here, key=_name))
        seen = f"; found only {others}" if others else ""
        raise MetricsError(
            f"gpushare: metrics source {spec.source}: no Running and Ready pod: looked for "
            f"{spec.looked_for(node)}{seen}; is the exporter deployed on this node?"
        )
    if len(ready) > 1:
        names = ", ".join(_name(p) for p in ready)
        raise MetricsError(
            f"gpushare: metrics source {spec.source}: {len(ready)} Running and Ready pods match "
            f"{spec.looked_for(node)} ({names}); narrow labelSelector to one exporter per node"
        )
    pod = ready[0]
    meta = pod.get("metadata") or {}
    ip = str((pod.get("status") or {}).get("podIP") or "")
    if not ip:
        raise MetricsError(
            f"gpushare: metrics source {spec.source}: pod {spec.namespace}/{_name(pod)} on node {node} has no IP yet"
        )
    port = _port_of(spec, pod, node)
    url = _url(spec.scheme, ip, port, spec.path)
    return ExporterEndpoint(spec.namespace, _name(pod), str(meta.get("uid", "")), ip, port, url)


def relist_delay_s(failed_lists: int) -> float:
    """How long to wait before listing again after ``failed_lists`` lists in a row that gave no
    readable exporter: 0 for the first (a replaced pod is found at once), then 2 s doubling to 60 s."""
    if failed_lists <= 0:
        return 0.0
    return min(_RELIST_FIRST_S * 2.0 ** (failed_lists - 1), _RELIST_MAX_S)
