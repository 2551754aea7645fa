"""The agent's /metrics text, written by prometheus_client from one registry per agent."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from controller.metrics.exposition import AgentMetrics, PassCollector, render_text
from controller.report import Eviction, ShadowStatus, SharerStatus, TickReport
from controller.spot.counters import SpotCounters

REPORT = TickReport(
    at=1796230000.25,
    took_ms=2.5,
    is_leader=True,
    advertised={"gpushare/share-gpu-4": 8},
    healthy={"gpushare/share-gpu-4": 8},
    registered={"gpushare/share-gpu-4": True},
    allocated={"gpushare/share-gpu-4": 3},
    shadows=(
        ShadowStatus("gpushare-system/s0", "u0", "Running", "n1", "gpushare/share-gpu-4", ("g0",), (), ""),
        ShadowStatus("gpushare-system/s1", "u1", "Running", "n1", "gpushare/share-gpu-4", ("g1",), (), ""),
        ShadowStatus("gpushare-system/s2", "u2", "Pending", "", "gpushare/share-gpu-4", (), (), "no GPU"),
    ),
    sharers=(SharerStatus("default/web", "Running", "n1", "gpushare/share-gpu-4", 1, ("gpushare-system/s0",)),),
    evictions=(Eviction(1.0, "default/a", "ShadowGone", "m"),),
    evictions_total={"ShadowGone": 1},
    pod_input_errors_total={"metadata.annotations": 2},
)


def agent_text(report: TickReport = REPORT, *, nri_connected: bool | None = True) -> str:
    metrics = AgentMetrics(lambda: report, nri_connected=lambda: nri_connected)
    metrics.observe_nri_decision("inject", 0.0004)
    metrics.observe_nri_decision("refuse", 0.02)
    metrics.count_nri_refusal("lend-ended")
    return metrics.render().decode()


def test_metrics_text_names_every_family_with_exact_numbers() -> None:
    lines = set(agent_text().splitlines())
    assert 'gpushare_devices_advertised{resource="gpushare/share-gpu-4"} 8.0' in lines
    assert 'gpushare_devices_healthy{resource="gpushare/share-gpu-4"} 8.0' in lines
    assert 'gpushare_plugin_registered{resource="gpushare/share-gpu-4"} 1.0' in lines
    assert 'gpushare_allocations{resource="gpushare/share-gpu-4"} 3.0' in lines
    assert 'gpushare_shadows{phase="Pending"} 1.0' in lines and 'gpushare_shadows{phase="Running"} 2.0' in lines
    assert 'gpushare_sharers{phase="Running"} 1.0' in lines
    assert 'gpushare_evictions_total{reason="ShadowGone"} 1.0' in lines
    assert 'gpushare_pod_input_errors_total{field="metadata.annotations"} 2.0' in lines
    # The library writes large floats as Go does: 1796230000.25 exactly, in exponent form.
    assert "gpushare_reconcile_last_pass_timestamp_seconds 1.79623000025e+09" in lines
    assert float("1.79623000025e+09") == 1796230000.25
    assert "gpushare_reconcile_pass_seconds 0.0025" in lines
    assert "gpushare_nri_connected 1.0" in lines and "gpushare_leader 1.0" in lines
    assert 'gpushare_nri_handler_seconds_bucket{decision="inject",le="0.0005"} 1.0' in lines
    assert 'gpushare_nri_handler_seconds_bucket{decision="inject",le="0.001"} 1.0' in lines
    assert 'gpushare_nri_handler_seconds_bucket{decision="refuse",le="0.01"} 0.0' in lines
    assert 'gpushare_nri_handler_seconds_bucket{decision="refuse",le="0.025"} 1.0' in lines
    assert 'gpushare_nri_handler_seconds_bucket{decision="refuse",le="+Inf"} 1.0' in lines
    assert 'gpushare_nri_handler_seconds_count{decision="refuse"} 1.0' in lines
    assert 'gpushare_nri_handler_seconds_sum{decision="refuse"} 0.02' in lines
    assert "# TYPE gpushare_evictions_total counter" in lines
    assert "# TYPE gpushare_nri_handler_seconds histogram" in lines
    # Every refusal reason is written from the start, so a first refusal is an increase.
    assert 'gpushare_nri_refusals_total{reason="lend-ended"} 1.0' in lines
    assert 'gpushare_nri_refusals_total{reason="forged"} 0.0' in lines


def test_the_text_parses_back_to_the_same_families_and_has_no_created_series() -> None:
    text = agent_text()
    assert "_created" not in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) == {
        "gpushare_devices_advertised",
        "gpushare_devices_healthy",
        "gpushare_plugin_registered",
        "gpushare_allocations",
        "gpushare_shadows",
        "gpushare_sharers",
        "gpushare_evictions",
        "gpushare_pod_input_errors",
        "gpushare_leader",
        "gpushare_reconcile_last_pass_timestamp_seconds",
        "gpushare_reconcile_pass_seconds",
        "gpushare_nri_connected",
        "gpushare_nri_handler_seconds",
        "gpushare_nri_refusals",
        "gpushare_gpu_user",
        "gpushare_shadow_slots",
        "gpushare_shadow_slots_used",
        "gpushare_shadow_sharers",
    }
    (stamp,) = families["gpushare_reconcile_last_pass_timestamp_seconds"].samples
    assert stamp.value == 1796230000.25


def test_label_values_are_escaped() -> None:
    text = render_text(PassCollector(lambda: TickReport(evictions_total={'we"ird\\reason': 2}), lambda: None))
    assert 'gpushare_evictions_total{reason="we\\"ird\\\\reason"} 2.0' in text.splitlines()
    assert "gpushare_nri_connected" not in text


def test_an_agent_without_nri_has_no_connection_series_but_keeps_the_histogram() -> None:
    text = AgentMetrics(TickReport).render().decode()
    assert "gpushare_nri_connected" not in text
    assert "# TYPE gpushare_nri_handler_seconds histogram" in text.splitlines()


def test_spot_counters_join_the_agents_registry() -> None:
    counters = SpotCounters(kmod_available=lambda: False)
    counters.kills["OwnerBack"] += 1
    counters.observe_return(0.03)
    text = AgentMetrics(TickReport, collectors=[counters]).render().decode()
    lines = set(text.splitlines())
    assert 'gpushare_spot_kills_total{reason="OwnerBack"} 1.0' in lines
    assert 'gpushare_spot_return_seconds_bucket{le="0.025"} 0.0' in lines
    assert 'gpushare_spot_return_seconds_bucket{le="0.05"} 1.0' in lines
    assert 'gpushare_spot_return_seconds_bucket{le="3.0"} 1.0' in lines
    assert "gpushare_spot_return_seconds_count 1.0" in lines and "gpushare_spot_return_seconds_sum 0.03" in lines
    assert "gpushare_spot_kmod_available 0.0" in lines
    assert "_created" not in text
    assert counters.total == 1


def test_kmod_availability_is_read_at_scrape_time() -> None:
    available = [False]
    counters = SpotCounters(kmod_available=lambda: available[0])
    assert "gpushare_spot_kmod_available 0.0" in render_text(counters).splitlines()
    available[0] = True
    assert "gpushare_spot_kmod_available 1.0" in render_text(counters).splitlines()
