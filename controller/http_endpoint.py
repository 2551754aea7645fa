"""The agent's HTTP endpoint: ``/metrics`` (Prometheus text), ``/healthz``, ``/status`` (loopback only).

Everything served is read from immutable values (the loop's last ``TickReport``, counters
behind a lock): a scrape never waits for the loop, and the loop never waits for a scrape.
The exposition format is written by hand (a dozen series) rather than through
``prometheus_client``, so the agent carries no extra runtime dependency.

    gpushare_devices_advertised{resource}     devices each plugin advertises now
    gpushare_devices_healthy{resource}        of which Healthy
    gpushare_plugin_registered{resource}      1 when kubelet accepted the registration
    gpushare_allocations{resource}            device IDs kubelet reports allocated (PodResources)
    gpushare_shadows{phase}                   shadow pods the agent sees
    gpushare_sharers{phase}                   sharer pods the agent sees
    gpushare_evictions_total{reason}          pods evicted since start
    gpushare_nri_connected                    1 while the NRI plugin is registered with containerd
    gpushare_nri_handler_seconds              CreateContainer handler latency (histogram, by decision)
    gpushare_reconcile_last_pass_timestamp_seconds, gpushare_reconcile_pass_seconds, gpushare_leader
"""

from __future__ import annotations

import collections
import http.server
import ipaddress
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from controller.loop import TickReport
from gpushare.log import kv

log = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class LatencyHistogram:
    """A Prometheus histogram by one label (NRI decision: inject / refuse); thread-safe."""

    def __init__(self, buckets: Iterable[float] = LATENCY_BUCKETS_S) -> None:
        self.buckets = tuple(sorted(buckets))
        self._lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}
        self._sums: dict[str, float] = collections.defaultdict(float)
        self._totals: collections.Counter[str] = collections.Counter()

    def observe(self, label: str, seconds: float) -> None:
        with self._lock:
            counts = self._counts.setdefault(label, [0] * len(self.buckets))
            for i, bound in enumerate(self.buckets):
                if seconds <= bound:
                    counts[i] += 1
            self._sums[label] += seconds
            self._totals[label] += 1

    def samples(self) -> list[tuple[str, Mapping[str, str], float]]:
        out: list[tuple[str, Mapping[str, str], float]] = []
        with self._lock:
            for label in sorted(self._counts):
                for bound, n in zip(self.buckets, self._counts[label], strict=True):
                    out.append(("_bucket", {"decision": label, "le": repr(bound)}, n))
                out.append(("_bucket", {"decision": label, "le": "+Inf"}, self._totals[label]))
                out.append(("_sum", {"decision": label}, self._sums[label]))
                out.append(("_count", {"decision": label}, self._totals[label]))
        return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _line(name: str, labels: Mapping[str, str], value: float) -> str:
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    number = str(int(value)) if float(value).is_integer() else repr(float(value))
    return f"{name}{{{body}}} {number}" if body else f"{name} {number}"


def render_metrics(report: TickReport, *, nri_connected: bool | None, nri_latency: LatencyHistogram | None) -> str:
    """Prometheus text exposition (version 0.0.4) of one report; pure."""
    out: list[str] = []

    def family(name: str, kind: str, help_: str, samples: Iterable[tuple[Mapping[str, str], float]]) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(_line(name, labels, v) for labels, v in samples)

    family(
        "gpushare_devices_advertised",
        "gauge",
        "Devices each gpushare device plugin advertises to kubelet.",
        (({"resource": r}, n) for r, n in sorted(report.advertised.items())),
    )
    family(
        "gpushare_devices_healthy",
        "gauge",
        "Advertised devices that are Healthy.",
        (({"resource": r}, n) for r, n in sorted(report.healthy.items())),
    )
    family(
        "gpushare_plugin_registered",
        "gauge",
        "1 when kubelet accepted the plugin's registration.",
        (({"resource": r}, float(ok)) for r, ok in sorted(report.registered.items())),
    )
    family(
        "gpushare_allocations",
        "gauge",
        "Device IDs kubelet reports allocated on this node (pod-resources), per resource.",
        (({"resource": r}, n) for r, n in sorted(report.allocated.items())),
    )
    shadows = collections.Counter(s.phase for s in report.shadows)
    family(
        "gpushare_shadows",
        "gauge",
        "Shadow pods seen by this agent, by phase.",
        (({"phase": p}, n) for p, n in sorted(shadows.items())),
    )
    sharers = collections.Counter(s.phase for s in report.sharers)
    family(
        "gpushare_sharers",
        "gauge",
        "Sharer pods seen by this agent, by phase.",
        (({"phase": p}, n) for p, n in sorted(sharers.items())),
    )
    family(
        "gpushare_evictions_total",
        "counter",
        "Pods evicted by this agent since it started, by reason.",
        (({"reason": r}, n) for r, n in sorted(report.evictions_total.items())),
    )
    family(
        "gpushare_leader", "gauge", "1 while this agent holds the gpushare-controller Lease.", [({}, report.is_leader)]
    )
    family(
        "gpushare_reconcile_last_pass_timestamp_seconds",
        "gauge",
        "Wall-clock time of the last reconcile pass.",
        [({}, report.at)],
    )
    family(
        "gpushare_reconcile_pass_seconds",
        "gauge",
        "How long the last reconcile pass took.",
        [({}, report.took_ms / 1e3)],
    )
    if nri_connected is not None:
        family(
            "gpushare_nri_connected",
            "gauge",
            "1 while the NRI plugin is registered with containerd.",
            [({}, nri_connected)],
        )
    if nri_latency is not None:
        name = "gpushare_nri_handler_seconds"
        out.append(f"# HELP {name} CreateContainer handler latency, by decision (inject or refuse).")
        out.append(f"# TYPE {name} histogram")
        out.extend(_line(name + suffix, labels, v) for suffix, labels, v in nri_latency.samples())
    return "\n".join(out) + "\n"


def is_healthy(report: TickReport, now: float, max_age_s: float) -> tuple[bool, str]:
    """``/healthz``: the loop passed recently and without a failing pass."""
    if report.at == 0.0:
        return False, "no reconcile pass yet"
    age = now - report.at
    if age > max_age_s:
        return False, f"last reconcile pass {age:.0f}s ago (limit {max_age_s:.0f}s)"
    return True, f"ok: last pass {age:.1f}s ago"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Endpoint:
    """``ThreadingHTTPServer`` in one thread (``gpushare-agent-http``); ``close()`` stops it."""

    def __init__(
        self,
        listen: str,
        *,
        report: Callable[[], TickReport],
        status: Callable[[], dict[str, Any]],
        nri_connected: Callable[[], bool | None] = lambda: None,
        nri_latency: LatencyHistogram | None = None,
        max_age_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        extra_metrics: Callable[[], list[str]] = list,  # more exposition lines (spot's, controller/spot/runtime.py)
    ) -> None:
        host, _, port = listen.rpartition(":")

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = 5.0  # a client that stalls mid-request is dropped (style.md: every wait bounded)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    text = render_metrics(report(), nri_connected=nri_connected(), nri_latency=nri_latency)
                    body = (text + "".join(line + "\n" for line in extra_metrics())).encode()
                    self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")
                elif path == "/healthz":
                    ok, why = is_healthy(report(), clock(), max_age_s)
                    self._send(200 if ok else 503, (why + "\n").encode(), "text/plain")
                elif path == "/status":
                    # Pod names and mappings: only for the node itself (gpushare status), never the network.
                    if not _is_loopback(self.client_address[0]):
                        self._send(403, b"gpushare: /status is served to loopback clients only\n", "text/plain")
                        return
                    self._send(200, json.dumps(status(), default=str).encode(), "application/json")
                else:
                    self._send(404, b"gpushare: /metrics, /healthz or /status\n", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("http " + format, *args)

        self._server = http.server.ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
        self._server.daemon_threads = True
        addr = self._server.server_address
        self.address = f"{addr[0]!s}:{addr[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="gpushare-agent-http"
        )

    def start(self) -> None:
        self._thread.start()
        log.info("metrics endpoint listening", extra=kv(address=self.address))

    def close(self, timeout_s: float = 5.0) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout_s)
        self._server.server_close()


__all__ = ["LATENCY_BUCKETS_S", "Endpoint", "LatencyHistogram", "is_healthy", "render_metrics"]
