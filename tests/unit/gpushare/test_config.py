from __future__ import annotations

import pytest

from gpushare.config import Config, effective_config, load_config, parse_duration_s, with_overrides
from gpushare.errors import ConfigError


def test_defaults_are_the_designs() -> None:
    cfg = load_config()
    assert cfg.share_specs == (2, 3, 4, 5)
    assert cfg.dev_share_specs == (2, 4, 8, 16)
    assert cfg.idle_window_s == 600
    assert cfg.shadow_idle_timeout_s == 600
    assert cfg.max_block_ms == 3000
    assert cfg.warm_shadows == 0
    assert cfg.nri.plugin_name == "gpushare" and cfg.nri.plugin_index == "10"
    assert "FAKE_VISIBLE_DEVICES" in cfg.visibility_env


def test_file_values_parse() -> None:
    cfg = load_config(text="version: v1\nshareSpecs: [2, 8]\nidleWindow: 90s\nnri:\n  pluginIndex: 11\n")
    assert cfg.share_specs == (2, 8)
    assert cfg.idle_window_s == 90
    assert cfg.nri.plugin_index == "11"


def test_every_problem_is_listed_with_key_and_value() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(text="shareSpec: [2]\nmaxBlockMs: 0\nidleWindow: soon\nnri: {sockt: /x}\nversion: v9\n")
    problems = err.value.problems
    assert "shareSpec: unknown key; did you mean shareSpecs?" in problems
    assert any(p.startswith("maxBlockMs: must be between 1 and 60000") and "(got 0)" in p for p in problems)
    assert any(p.startswith("idleWindow:") and "'soon'" in p for p in problems)
    assert "nri.sockt: unknown key; did you mean nri.socket?" in problems
    assert any(p.startswith("version:") for p in problems)
    assert len(problems) == 5


@pytest.mark.parametrize(
    "text",
    [
        "shareSpecs: [1]",
        "shareSpecs: []",
        "shareSpecs: [2, 2]",
        "realResources: [gpushare/share-gpu-2]",
        "visibilityEnv: [lower]",
        "warmShadows: -1",
        "idleThresholdPct: 101",
        "netlinkProtocol: 40",
        "nri: 3",
        "[1, 2]",
        "shareSpecs: [true]",
        "warmShadows: 1.5",
    ],
)
def test_bad_values_are_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        load_config(text=text)


def test_unreadable_file_names_the_path(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config("/nonexistent/gpushare.yaml")


def test_node_name_from_env_and_flag_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-a")
    cfg = load_config()
    assert cfg.node_name == "node-a"
    assert with_overrides(cfg, node_name="node-b", warm_shadows=None).node_name == "node-b"


@pytest.mark.parametrize(("text", "seconds"), [("10m", 600), ("30s", 30), ("500ms", 0.5), ("1h", 3600), (7, 7)])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration_s(text) == seconds


def test_effective_config_round_trips_names() -> None:
    doc = effective_config(Config())
    assert doc["shadowIdleTimeout"] == 600 and doc["nri"]["pluginIndex"] == "10"


def test_spot_cgroup_root_defaults_to_the_host_mount_and_must_be_absolute() -> None:
    assert load_config().spot.cgroup_root == "/sys/fs/cgroup"
    assert load_config(text="spot:\n  cgroupRoot: /host/sys/fs/cgroup\n").spot.cgroup_root == "/host/sys/fs/cgroup"
    with pytest.raises(ConfigError) as err:
        load_config(text="spot:\n  cgroupRoot: sys/fs/cgroup\n")
    assert err.value.problems == [
        "spot.cgroupRoot: must be an absolute path, e.g. /sys/fs/cgroup (got 'sys/fs/cgroup')"
    ]


def test_the_endpoint_is_closed_to_anonymous_clients_by_default_and_bounded() -> None:
    cfg = load_config()
    assert (cfg.metrics.access, cfg.metrics.max_connections) == ("rbac", 32)
    cfg = load_config(text="metrics: {access: open, maxConnections: 64}")
    assert (cfg.metrics.access, cfg.metrics.max_connections) == ("open", 64)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("metrics: {access: anonymous}", "metrics.access: must be rbac (clients off the node show a bearer token"),
        ("metrics: {access: true}", "metrics.access: must be a string"),
        ("metrics: {maxConnections: 4}", "metrics.maxConnections: must be between 8 and 1024 (got 4)"),
        ("metrics: {maxConnections: 5000}", "metrics.maxConnections: must be between 8 and 1024 (got 5000)"),
    ],
)
def test_a_bad_endpoint_setting_is_refused_naming_the_key(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(text=text)
    assert any(p.startswith(problem) for p in err.value.problems), err.value.problems


def test_tls_on_the_endpoint_names_pem_files_as_the_exporter_toolkit_does() -> None:
    assert not load_config().metrics.tls.enabled  # plain HTTP unless a certificate is named
    text = "metrics: {tls: {certFile: /tls/tls.crt, keyFile: /tls/tls.key, clientCAFile: /tls/ca.crt}}"
    tls = load_config(text=text).metrics.tls
    assert tls.enabled and (tls.cert_file, tls.key_file, tls.client_ca_file) == (
        "/tls/tls.crt",
        "/tls/tls.key",
        "/tls/ca.crt",
    )
    assert effective_config(load_config(text=text))["metrics"]["tls"]["clientCAFile"] == "/tls/ca.crt"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("metrics: {tls: {certFile: /tls/tls.crt}}", "metrics.tls.keyFile: required with metrics.tls.certFile"),
        ("metrics: {tls: {keyFile: /tls/tls.key}}", "metrics.tls.certFile: required with metrics.tls.keyFile"),
        ("metrics: {tls: {clientCAFile: /tls/ca.crt}}", "metrics.tls.clientCAFile: needs metrics.tls.certFile"),
        ("metrics: {tls: {certFile: tls.crt, keyFile: /k}}", "metrics.tls.certFile: must be an absolute path"),
        ("metrics: {tls: {clientCaFile: /tls/ca.crt}}", "metrics.tls.clientCaFile: unknown key; did you mean"),
    ],
)
def test_tls_settings_that_cannot_work_are_refused_naming_the_key(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(text=text)
    assert [p for p in err.value.problems if p.startswith(problem)], err.value.problems
    assert len(err.value.problems) == 1, err.value.problems


def test_the_gpu_part_directories_default_to_nvidias_and_containerds_and_must_be_absolute() -> None:
    cfg = load_config(text="version: v1\n")
    assert cfg.cdi_spec_dirs == ("/etc/cdi", "/var/run/cdi")
    assert cfg.device_list_dirs == ("/var/run/nvidia-container-devices", "/run/nvidia-container-devices")
    assert load_config(text="version: v1\ncdiSpecDirs: [/opt/cdi]\n").cdi_spec_dirs == ("/opt/cdi",)
    for text, key in (
        ("cdiSpecDirs: [etc/cdi]", "cdiSpecDirs"),
        ("deviceListDirs: [/]", "deviceListDirs"),
        ("cdiSpecDirs: /etc/cdi", "cdiSpecDirs"),
    ):
        with pytest.raises(ConfigError, match=key):
            load_config(text=f"version: v1\n{text}\n")
