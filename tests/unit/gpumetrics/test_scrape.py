"""The scraper against a real HTTP server on 127.0.0.1 (in a thread, joined at the end) and real files."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpumetrics import parse_metrics
from gpumetrics.errors import MetricsError
from gpumetrics.scrape import Scraper, read_source
from gpushare.config import MetricsConfig
from tests.unit.gpumetrics.expected import EXPECTED, fixture_text, invoke_cli


class Exporter:
    """A fake *exporter* (the GPU is what we fake; HTTP is real): routes -> behaviour."""

    def __init__(self) -> None:
        self.body = fixture_text("nvidia.prom").encode()
        self.release = threading.Event()  # set at teardown so slow handlers finish
        self.requests: list[dict[str, str]] = []
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass  # keep test output clean

            def do_GET(self) -> None:
                exporter.requests.append(dict(self.headers))
                if self.path == "/metrics":
                    self._send(200, exporter.body)
                elif self.path == "/latin1":
                    self._send(200, b'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",modelName="\xff"} 5\n\xfe\xff 1\n')
                elif self.path == "/slow":
                    exporter.release.wait(10)
                    self._send(200, exporter.body)
                elif self.path == "/drip":
                    self.send_response(200)
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    for _ in range(100):
                        if exporter.release.wait(0.05):
                            return
                        self.wfile.write(b"# x\n")
                        self.wfile.flush()
                else:
                    self._send(404, b"not found\n")

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # Handler threads are joined by server_close(), so nothing outlives the test.
        self.server.daemon_threads = False
        self.server.block_on_close = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, name="gpushare-metrics-httpd"
        )

    def url(self, path: str) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}{path}"


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    exp = Exporter()
    exp.thread.start()
    try:
        yield exp
    finally:
        exp.release.set()
        exp.server.shutdown()
        exp.server.server_close()
        exp.thread.join(timeout=10)
        assert not exp.thread.is_alive()


def test_http_scrape_gives_the_same_devices_as_the_file(exporter: Exporter) -> None:
    result = Scraper(exporter.url("/metrics")).read()
    assert result == parse_metrics(fixture_text("nvidia.prom"))
    assert [d.device_id for d in result.devices] == [e.device_id for e in EXPECTED["nvidia.prom"][1]]
    assert "text/plain" in exporter.requests[0]["Accept"]


def test_http_error_status_is_a_metrics_error(exporter: Exporter) -> None:
    with pytest.raises(MetricsError, match=r"HTTP 404.*/metrics"):
        read_source(exporter.url("/nope"))


def test_refused_connection_is_a_metrics_error_naming_the_url() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = server.server_address[1]
    server.server_close()  # the port is now closed
    url = f"http://127.0.0.1:{port}/metrics"
    with pytest.raises(MetricsError, match=r"scraping http://127\.0\.0\.1:\d+/metrics failed.*exporter running"):
        read_source(url, timeout_s=2)


def test_a_server_that_does_not_answer_times_out(exporter: Exporter) -> None:
    started = time.monotonic()
    with pytest.raises(MetricsError, match=r"within 0\.3s"):
        read_source(exporter.url("/slow"), timeout_s=0.3)
    assert time.monotonic() - started < 3


def test_a_server_dripping_bytes_cannot_hold_the_scrape_past_its_deadline(exporter: Exporter) -> None:
    started = time.monotonic()
    with pytest.raises(MetricsError, match="body not complete"):
        read_source(exporter.url("/drip"), timeout_s=0.5)
    assert time.monotonic() - started < 3


def test_invalid_utf8_costs_a_line_not_the_scrape(exporter: Exporter) -> None:
    result = Scraper(exporter.url("/latin1")).read()
    assert result.bad_lines == 1
    (device,) = result.devices
    assert device.utilization_pct == 5.0 and device.model == "\ufffd"


def test_file_path_and_file_url(tmp_path: Path) -> None:
    path = tmp_path / "amd.prom"
    path.write_text(fixture_text("amd.prom"))
    assert read_source(str(path)) == fixture_text("amd.prom")
    assert read_source(path.as_uri()) == fixture_text("amd.prom")
    assert Scraper(str(path), vendor="amd").read().vendors == ("amd",)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("", "no metrics source configured"),
        ("/nonexistent/gs-metrics.prom", "cannot read metrics file '/nonexistent/gs-metrics.prom'"),
        ("ftp://host/metrics", "scheme 'ftp' unsupported"),
        ("file://otherhost/x.prom", "must name a local path"),
    ],
)
def test_unreadable_sources_are_metrics_errors(source: str, message: str) -> None:
    with pytest.raises(MetricsError, match=message):
        read_source(source)


def test_timeout_must_be_positive() -> None:
    with pytest.raises(MetricsError, match="timeout must be positive"):
        read_source("/x", timeout_s=0)


def test_from_config_uses_the_metrics_section(tmp_path: Path) -> None:
    cfg = MetricsConfig(source=str(tmp_path / "x.prom"), vendor="hygon", scrape_timeout_s=1.5)
    scraper = Scraper.from_config(cfg)
    assert (scraper.source, scraper.vendor, scraper.timeout_s) == (cfg.source, "hygon", 1.5)


def test_the_same_degradation_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "x.prom"
    path.write_text('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="G"} 1\nbroken\n')
    scraper = Scraper(str(path))
    with caplog.at_level(logging.DEBUG, logger="gpumetrics.scrape"):
        for _ in range(3):
            scraper.read()
        path.write_text('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="G"} 1\nbroken\nbroken too\n')
        scraper.read()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["scrape degraded: 1 bad line(s) skipped", "scrape degraded: 2 bad line(s) skipped"]


def test_cli_scrape_against_the_live_server(exporter: Exporter) -> None:
    result = invoke_cli(["metrics", "scrape", exporter.url("/metrics"), "--timeout", "2s"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [d["utilization_pct"] for d in doc] == [87.0, 0.0]
    failed = invoke_cli(["metrics", "scrape", exporter.url("/gone")])
    assert failed.exit_code == 1 and "HTTP 404" in failed.stderr
