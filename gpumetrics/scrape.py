"""Read an exporter's Prometheus text (HTTP with a timeout, or a file) and parse it into devices.

The only I/O of the metrics path; everything after the bytes arrive is the adapters'
decision code. Every failure to *read* the source is a ``MetricsError`` naming the source
and what to check; a bad *line* is never an error (it is counted in the result).

A file source (a path, or ``file:///path``) is the fake-metrics path tests use: a test
rewrites a file in the exporter's own format and the agent reads it through the same
adapters as a live scrape (``docs/metrics.md``).
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from gpumetrics import AUTO, ParseResult, parse_metrics
from gpumetrics.errors import MetricsError
from gpushare.config import MetricsConfig
from gpushare.log import kv

__all__ = ["DEFAULT_TIMEOUT_S", "MAX_SCRAPE_BYTES", "Scraper", "is_http", "read_source"]

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
    if "://" in source and not source.startswith("file://"):
        scheme = source.split("://", 1)[0]
        raise MetricsError(
            f"gpushare: metrics source {source!r}: scheme {scheme!r} unsupported; use http(s)://, file:// or a path"
        )
    return _read_file(source)


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
    _last_degraded: str | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_config(cls, cfg: MetricsConfig) -> Scraper:
        return cls(source=cfg.source, vendor=cfg.vendor, timeout_s=cfg.scrape_timeout_s)

    def read(self) -> ParseResult:
        """Fetch and parse once. ``MetricsError`` if the source cannot be read or the vendor is unknown."""
        text = read_source(self.source, self.timeout_s)
        result = parse_metrics(text, vendor=self.vendor, prefix=self.prefix)
        fields = kv(
            source=self.source,
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
