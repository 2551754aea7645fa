"""Read an exporter's Prometheus text (HTTP with a timeout, or a file) and parse it into devices.

The only I/O of the metrics path; everything after the bytes arrive is the adapters'
decision code. Every failure to *read* the source is a ``MetricsError`` naming the source
and what to check; a bad *line* is never an error (it is counted in the result).

A file source (a path, or ``file:///path``) is the fake-metrics path tests use: a test
rewrites a file in the exporter's own format and the agent reads it through the same
adapters as a live scrape (``docs/metrics.md``).

A ``k8s://pods/...`` source (``gpumetrics.discovery``) is the node's exporter pod, found through
the API by a lister the agent hands in (``controller/io/exporter_pods.py``): ``ExporterPodFinder``
keeps the pod it found until a read of it fails, then lists again, at once the first time (an
upgrade replaced the pod) and backing off while nothing readable turns up.
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumetrics import AUTO, ParseResult, parse_metrics
from gpumetrics.discovery import (
    ExporterEndpoint,
    PodSource,
    is_pod_source,
    parse_pod_source,
    pick_endpoint,
    relist_delay_s,
)
from gpumetrics.errors import MetricsError
from gpushare.config import MetricsConfig
from gpushare.log import kv

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MAX_SCRAPE_BYTES",
    "ExporterPodFinder",
    "PodLister",
    "Scraper",
    "is_http",
    "read_source",
]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 2.0
# A node exporter's page is tens of KiB; a body this large is a misconfigured source.
MAX_SCRAPE_BYTES = 64 * 1024 * 1024
_ACCEPT = "text/plain;version=0.0.4;q=1.0, */*;q=0.1"
_USER_AGENT = "gpushare-metrics/1"
_CHUNK = 256 * 1024


def is_http(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def _file_path(source: str) -> Path:
    if source.startswith("file://"):
        parsed = urllib.parse.urlparse(source)
        if parsed.netloc not in ("", "localhost"):
            raise MetricsError(f"gpushare: metrics source {source!r}: a file URL must name a local path (file:///...)")
        return Path(urllib.parse.unquote(parsed.path))
    return Path(source)


def _decode(body: bytes, source: str) -> str:
    if len(body) > MAX_SCRAPE_BYTES:
        raise MetricsError(
            f"gpushare: metrics source {source} returned more than {MAX_SCRAPE_BYTES} bytes; "
            "is it really a GPU exporter's /metrics?"
        )
    # The format is UTF-8; a stray byte must cost one bad line, not the scrape.
    return body.decode("utf-8", errors="replace")


def _read_http(url: str, timeout_s: float) -> str:
    request = urllib.request.Request(url, headers={"Accept": _ACCEPT, "User-Agent": _USER_AGENT})
    try:
        deadline = time.monotonic() + timeout_s
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            # The socket timeout bounds each read, not the whole body: a server dripping bytes
            # must not hold the scrape past its deadline.
            chunks: list[bytes] = []
            size = 0
            while size <= MAX_SCRAPE_BYTES:
                chunk = response.read1(_CHUNK)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"body not complete after {timeout_s:g}s ({size} bytes read)")
            body = b"".join(chunks)
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the response's socket; the chained error would keep it open
        raise MetricsError(
            f"gpushare: scraping {url} failed: HTTP {exc.code} {exc.reason}; check the exporter's path (/metrics)"
        ) from exc
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise MetricsError(
            f"gpushare: scraping {url} failed within {timeout_s:g}s: {reason}; "
            "is the exporter running and reachable from this node?"
        ) from exc
    return _decode(body, url)


def _read_file(source: str) -> str:
    path = _file_path(source)
    try:
        with path.open("rb") as handle:
            body = handle.read(MAX_SCRAPE_BYTES + 1)
    except OSError as exc:
        raise MetricsError(f"gpushare: cannot read metrics file {str(path)!r}: {exc.strerror or exc}") from exc
    return _decode(body, str(path))


def read_source(source: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """The text at ``source``: an ``http(s)://`` URL (GET, ``timeout_s``), a ``file://`` URL or a path."""
    if not source:
        raise MetricsError("gpushare: no metrics source configured (metrics.source); spot lending stays off")
    if timeout_s <= 0:
        raise MetricsError(f"gpushare: scrape timeout must be positive, got {timeout_s}")
    if is_http(source):
        return _read_http(source, timeout_s)
    if is_pod_source(source):
        parse_pod_source(source)  # a malformed source is named as such first
        raise MetricsError(
            f"gpushare: metrics source {source!r} is a pod found through the API: only the agent reads it; "
            "here, give the pod's URL (the agent's /status shows it as spot_runtime.metrics.endpoint)"
        )
    if "://" in source and not source.startswith("file://"):
        scheme = source.split("://", 1)[0]
        raise MetricsError(
            f"gpushare: metrics source {source!r}: scheme {scheme!r} unsupported; "
            "use http(s)://, k8s://pods/, file:// or a path"
        )
    return _read_file(source)


# (source, this node's name) -> the pods the API lists in the source's namespace with its label
# selector on that node; MetricsError when the list fails (refused, API unreachable).
PodLister = Callable[[PodSource, str], Sequence[Mapping[str, Any]]]


class ExporterPodFinder:
    """The node's exporter pod for a ``k8s://pods/...`` source, and reading it.

    A pod found is kept while reads of it work: no API call per scrape. A failed read lists
    again at once (the pod may have been replaced by an upgrade) and reads the new pod in the
    same scrape; lists that still give nothing readable back off (``relist_delay_s``) and the
    last refusal is repeated meanwhile, word for word, so the watcher logs it once.
    """

    def __init__(
        self,
        spec: PodSource,
        node: str,
        list_pods: PodLister,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec
        self.node = node
        self._list_pods = list_pods
        self._monotonic = monotonic
        self.endpoint: ExporterEndpoint | None = None
        self._announced: ExporterEndpoint | None = None
        self._lists_unread = 0  # lists since the last read that worked
        self._next_list_at = 0.0
        self._refusal: MetricsError | None = None

    def _find(self) -> ExporterEndpoint | None:
        """List and pick; None while backing off from a list that gave nothing readable."""
        now = self._monotonic()
        if now < self._next_list_at:
            return None
        self._lists_unread += 1
        self._next_list_at = now + relist_delay_s(self._lists_unread)
        try:
            endpoint = pick_endpoint(self.spec, self.node, self._list_pods(self.spec, self.node))
        except MetricsError as exc:
            self.endpoint = None
            self._refusal = exc
            raise
        self._refusal = None
        self.endpoint = endpoint
        if endpoint != self._announced:
            log.info(
                "metrics: exporter pod found",
                extra=kv(pod=endpoint.key, node=self.node, url=endpoint.url, source=self.spec.source),
            )
            self._announced = endpoint
        return endpoint

    def _read(self, endpoint: ExporterEndpoint, timeout_s: float) -> str:
        try:
            text = _read_http(endpoint.url, timeout_s)
        except MetricsError as exc:
            raise MetricsError(
                f"{exc} (exporter pod {endpoint.key}, found by metrics.source {self.spec.source}; the agent "
                "reads it from the node's network: a pod IP must route there, or run the exporter with hostNetwork)"
            ) from exc
        self._lists_unread = 0
        self._next_list_at = 0.0
        return text

    def read(self, timeout_s: float) -> str:
        """The exporter's page; ``MetricsError`` naming the pod, or what was looked for."""
        endpoint = self.endpoint or self._find()
        if endpoint is None:
            if self._refusal is not None:
                raise self._refusal
            raise MetricsError(f"gpushare: metrics source {self.spec.source}: {self.spec.looked_for(self.node)}")
        try:
            return self._read(endpoint, timeout_s)
        except MetricsError:
            fresh = self._find()
            if fresh is None or fresh == endpoint:
                raise
        return self._read(fresh, timeout_s)


@dataclass
class Scraper:
    """One metrics source and how to read it; call ``read()`` once per scrape.

    The only state kept between scrapes is the last degradation message, so a source that
    keeps sending the same bad lines logs one WARNING, not one every interval.
    """

    source: str
    vendor: str = AUTO
    timeout_s: float = DEFAULT_TIMEOUT_S
    prefix: str | None = None
    finder: ExporterPodFinder | None = None  # a k8s://pods/ source, read through the API
    _last_degraded: str | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_config(cls, cfg: MetricsConfig, *, node: str = "", list_pods: PodLister | None = None) -> Scraper:
        """``list_pods``: how a ``k8s://pods/`` source lists pods (the agent's API client); without it
        such a source is refused at each read. A malformed one raises ``MetricsError`` here."""
        finder = None
        if is_pod_source(cfg.source):
            spec = parse_pod_source(cfg.source)
            if list_pods is not None:
                finder = ExporterPodFinder(spec, node, list_pods)
        return cls(source=cfg.source, vendor=cfg.vendor, timeout_s=cfg.scrape_timeout_s, finder=finder)

    @property
    def endpoint(self) -> str:
        """Where the last read went: the source itself, or the URL of the pod a ``k8s://`` source found."""
        if self.finder is None:
            return self.source
        found = self.finder.endpoint
        return found.url if found is not None else ""

    def read(self) -> ParseResult:
        """Fetch and parse once. ``MetricsError`` if the source cannot be read or the vendor is unknown."""
        finder = self.finder
        text = finder.read(self.timeout_s) if finder is not None else read_source(self.source, self.timeout_s)
        result = parse_metrics(text, vendor=self.vendor, prefix=self.prefix)
        fields = kv(
            source=self.endpoint or self.source,
            vendors=",".join(result.vendors) or "none",
            devices=len(result.devices),
            samples=result.samples,
            bad_lines=result.bad_lines,
        )
        degraded = "; ".join(
            [*result.warnings, *([f"{result.bad_lines} bad line(s) skipped"] if result.bad_lines else [])]
        )
        if degraded and degraded != self._last_degraded:
            log.warning("scrape degraded: %s", degraded, extra=fields)
        else:
            log.debug("scrape", extra=fields)
        self._last_degraded = degraded or None
        return result
