"""A k8s://pods/ source read end to end: real HTTP exporters on 127.0.0.1 stand in for the pods a
lister returns, so the finder's list, pick, read, re-list and back-off run over real sockets."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from controller.core.detectors import IdleDetector
from controller.spot.utilization import UtilizationWatcher
from gpumetrics.discovery import GPU_OPERATOR_SOURCE, PodSource, parse_pod_source
from gpumetrics.errors import MetricsError
from gpumetrics.fake_exporter import FakeGpu, render_dcgm
from gpumetrics.scrape import ExporterPodFinder, Scraper
from gpushare.config import MetricsConfig
from tests.unit.gpumetrics.test_discovery import NODE, exporter_pod

SPEC = parse_pod_source(GPU_OPERATOR_SOURCE)


class Page:
    """One exporter's /metrics on 127.0.0.1 (a thread, joined at the end)."""

    def __init__(self, text: str) -> None:
        self.text = text
        page = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                body = page.text.encode() if self.path == "/metrics" else b"not found\n"
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = False
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.start()

    def close(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(10)


@pytest.fixture
def pages() -> Iterator[list[Page]]:
    made: list[Page] = []
    yield made
    for page in made:
        page.close()


def serve(pages: list[Page], util: float) -> Page:
    page = Page(render_dcgm([FakeGpu("GPU-a", util)]))
    pages.append(page)
    return page


def pod_at(name: str, page_or_port: Page | int, *, ip: str = "127.0.0.1") -> dict[str, Any]:
    port = page_or_port.port if isinstance(page_or_port, Page) else page_or_port
    return exporter_pod(name, ip=ip, ports=[{"name": "metrics", "containerPort": port}])


@dataclass
class Api:
    """What the apiserver would list for the source on this node; ``refuse`` plays an RBAC denial."""

    pods: list[dict[str, Any]] = field(default_factory=list)
    refuse: str = ""
    calls: list[tuple[str, str, str]] = field(default_factory=list)

    def __call__(self, spec: PodSource, node: str) -> Sequence[dict[str, Any]]:
        self.calls.append((spec.namespace, spec.label_selector, node))
        if self.refuse:
            raise MetricsError(self.refuse)
        return list(self.pods)


def finder(api: Api, clock: list[float]) -> ExporterPodFinder:
    return ExporterPodFinder(SPEC, NODE, api, monotonic=lambda: clock[0])


def util_of(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL")).rsplit(" ", 1)[1]


def test_the_pod_found_is_kept_while_its_reads_work(pages: list[Page]) -> None:
    api, clock = Api([pod_at("exporter-a", serve(pages, 10.0))]), [0.0]
    f = finder(api, clock)
    for _ in range(5):
        assert util_of(f.read(2.0)) == "10"
        clock[0] += 5
    assert api.calls == [("gpu-operator", "app=nvidia-dcgm-exporter", NODE)]  # one list, then none


def test_a_replaced_exporter_is_found_and_read_in_the_same_scrape(
    pages: list[Page], caplog: pytest.LogCaptureFixture
) -> None:
    old = serve(pages, 10.0)
    api, clock = Api([pod_at("exporter-old", old)]), [0.0]
    f = finder(api, clock)
    caplog.set_level(logging.INFO, logger="gpumetrics.scrape")
    assert util_of(f.read(2.0)) == "10"
    old.close()  # an upgrade: the old pod is gone, its replacement serves elsewhere
    api.pods = [pod_at("exporter-new", serve(pages, 70.0))]
    clock[0] += 5
    assert util_of(f.read(2.0)) == "70"
    assert f.endpoint is not None and f.endpoint.pod == "exporter-new" and len(api.calls) == 2
    found = [r for r in caplog.records if r.getMessage() == "metrics: exporter pod found"]
    assert [r.__dict__["kv"]["pod"] for r in found] == ["gpu-operator/exporter-old", "gpu-operator/exporter-new"]


def test_no_exporter_on_the_node_is_one_repeated_refusal_and_lists_back_off(pages: list[Page]) -> None:
    api, clock = Api([]), [0.0]
    f = finder(api, clock)
    messages = []
    for _ in range(6):  # 6 scrapes, 0.5 s apart: only the first lists, the rest repeat its refusal
        with pytest.raises(MetricsError) as err:
            f.read(2.0)
        messages.append(str(err.value))
        clock[0] += 0.5
    assert len(api.calls) == 2 and len(set(messages)) == 1  # the second list came after 2 s
    assert "looked for a pod labelled app=nvidia-dcgm-exporter in namespace gpu-operator on node" in messages[0]
    api.pods = [pod_at("exporter-late", serve(pages, 0.0))]
    clock[0] += 4.0  # the next list is due 4 s after the second
    assert util_of(f.read(2.0)) == "0" and len(api.calls) == 3


def test_an_unreachable_pod_is_named_with_the_network_hint_and_not_listed_every_scrape(pages: list[Page]) -> None:
    closed = serve(pages, 0.0)
    port = closed.port
    closed.close()  # the pod is listed Ready but nothing answers at its address (pod network not routed)
    api, clock = Api([pod_at("exporter-a", port)]), [0.0]
    f = finder(api, clock)
    errors = []
    for _ in range(4):
        with pytest.raises(MetricsError) as err:
            f.read(0.5)
        errors.append(str(err.value))
        clock[0] += 0.5
    assert f"http://127.0.0.1:{port}/metrics" in errors[0] and "exporter pod gpu-operator/exporter-a" in errors[0]
    assert "a pod IP must route there, or run the exporter with hostNetwork" in errors[0]
    assert len(set(errors)) == 1
    # The read that failed came right after the list that found the pod: no second list before
    # the back-off's 2 s, and the pod stays the one to read.
    assert len(api.calls) == 1 and f.endpoint is not None
    clock[0] = 2.0
    with pytest.raises(MetricsError):
        f.read(0.5)
    assert len(api.calls) == 2


def test_an_rbac_refusal_is_the_error_and_is_retried_after_the_back_off() -> None:
    api, clock = Api(refuse='gpushare: cannot list pods: pods is forbidden: User "x" cannot list'), [0.0]
    f = finder(api, clock)
    for _ in range(3):
        with pytest.raises(MetricsError, match="forbidden"):
            f.read(1.0)
    assert len(api.calls) == 1 and f.endpoint is None
    clock[0] += 2.0
    with pytest.raises(MetricsError, match="forbidden"):
        f.read(1.0)
    assert len(api.calls) == 2


def test_the_scraper_reports_where_it_reads(pages: list[Page]) -> None:
    page = serve(pages, 30.0)
    api = Api([pod_at("exporter-a", page)])
    cfg = MetricsConfig(source=GPU_OPERATOR_SOURCE, vendor="nvidia")
    scraper = Scraper.from_config(cfg, node=NODE, list_pods=api)
    assert scraper.endpoint == ""  # nothing found yet
    result = scraper.read()
    assert [d.utilization_pct for d in result.devices] == [30.0]
    assert scraper.endpoint == f"http://127.0.0.1:{page.port}/metrics"
    assert Scraper.from_config(MetricsConfig(source="/x/dcgm.prom")).endpoint == "/x/dcgm.prom"


def test_without_an_api_client_a_pod_source_is_refused_at_each_read() -> None:
    scraper = Scraper.from_config(MetricsConfig(source=GPU_OPERATOR_SOURCE))
    with pytest.raises(MetricsError, match="is a pod found through the API: only the agent reads it"):
        scraper.read()
    with pytest.raises(MetricsError, match="port is required"):
        Scraper.from_config(MetricsConfig(source="k8s://pods/gpu-operator?labelSelector=a=b"))


def test_the_watcher_logs_a_missing_exporter_once_not_every_scrape(caplog: pytest.LogCaptureFixture) -> None:
    api, clock, wall = Api([]), [0.0], [1000.0]
    scraper = Scraper(GPU_OPERATOR_SOURCE, finder=ExporterPodFinder(SPEC, NODE, api, monotonic=lambda: clock[0]))
    watcher = UtilizationWatcher(
        scraper,
        IdleDetector(window_s=10.0, threshold_pct=0.0, max_gap_s=5.0),
        interval_s=1.0,
        is_process_level=False,
        clock=lambda: wall[0],
    )
    caplog.set_level(logging.WARNING, logger="controller.spot.utilization")
    for _ in range(20):
        watcher.scrape_once()
        clock[0] += 1.0
        wall[0] += 1.0
    unreadable = [r for r in caplog.records if r.getMessage().startswith("spot: metrics unreadable")]
    assert len(unreadable) == 1 and "no Running and Ready pod" in watcher.last_error
    assert 1 < len(api.calls) <= 5  # listed again with back-off (0, 2, 6, 14 s), never every scrape
