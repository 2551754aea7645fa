"""A real Prometheus for the tests: its binaries in the build cache, a server on 127.0.0.1, a fake exporter.

- ``install()`` (``make prometheus``, ``python -m localcluster.prometheus install``): Debian's
  ``prometheus`` package, fetched with ``apt-get download`` and unpacked with ``dpkg-deb -x`` into
  ``$GPUSHARE_CACHE/prometheus/<version>/bin``: the two binaries only, so nothing is installed
  system-wide and no daemon is started. Idempotent.
- ``PrometheusServer``: ``prometheus`` on a free loopback port with a temporary data directory,
  the rule files it is given and one static scrape job per target, scraping every second;
  ``query()``, ``rules()`` and ``alerts()`` ask its HTTP API; ``reconfigure()`` gives it other
  targets (a config reload), as when a scrape config changes or goes.
- ``chart_configmap_file()``: one file of a ConfigMap of the chart as ``helm template`` renders it
  with the given values (the rules and the dashboard carry ``prometheus.jobLabel``).
- ``ExporterServer``: an HTTP server on a free loopback port that serves whatever text the test
  last set, as a vendor exporter serves its page (``text/plain; version=0.0.4``).

The e2e tier starts both in a session fixture (tests/integration/e2e/conftest.py); the
dashboard's queries are meant to run against the same server.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster.errors import ClusterError, ClusterUnavailable
from localcluster.helm import helm_binary
from localcluster.host import free_port
from localcluster.paths import REPO, cache_dir

RULE_FILES = (REPO / "manifests" / "prometheus" / "gpushare.rules.yaml",)
# The e2e tier installs the chart with prometheus.jobLabel set to this, the job a PodMonitor
# gpushare-agent in gpushare-system gets by default, and scrapes the agent under it: the rules and
# the dashboard must follow the value, not the default gpushare-agent the shipped files name.
AGENT_JOB = "gpushare-system/gpushare-agent"
CHART_JOB_VALUES = {"prometheus": {"jobLabel": AGENT_JOB}}
EXPORTER_JOB = "gpu-exporter"
BINARIES = ("prometheus", "promtool")
INSTALL_HINT = "run `make prometheus` (Debian's prometheus package unpacked into the build cache)"


def _installs() -> list[Path]:
    root = cache_dir() / "prometheus"
    return sorted(d / "bin" for d in root.glob("*") if all((d / "bin" / n).is_file() for n in BINARIES))


def binary(name: str) -> Path:
    """``prometheus`` or ``promtool`` from the cache; ClusterUnavailable names the install command."""
    installs = _installs()
    if not installs:
        raise ClusterUnavailable(f"no {name} under {cache_dir() / 'prometheus'}: {INSTALL_HINT}")
    return installs[-1] / name


def _candidate_version() -> str | None:
    out = subprocess.run(["apt-cache", "policy", "prometheus"], capture_output=True, text=True, check=True, timeout=60)
    for line in out.stdout.splitlines():
        key, _, value = line.strip().partition(":")
        if key == "Candidate" and value.strip() not in ("", "(none)"):
            return value.strip()
    return None


def _package_version() -> str:
    """The version apt would install; a fresh machine's empty package lists are filled first."""
    version = _candidate_version()
    if version is None:
        subprocess.run(["apt-get", "update", "-qq"], check=True, timeout=600, capture_output=True)
        version = _candidate_version()
    if version is None:
        raise ClusterError("apt has no candidate for the prometheus package (Debian 12 has 2.42 in main)")
    return version


def install() -> Path:
    """Unpack Debian's prometheus package's two binaries into the cache; returns their directory."""
    if _installs():
        return _installs()[-1]
    version = _package_version()
    dest = cache_dir() / "prometheus" / version.replace("+", "_").replace("~", "_")
    with tempfile.TemporaryDirectory(prefix="gs-prometheus-") as tmp:
        subprocess.run(
            ["apt-get", "download", f"prometheus={version}"], cwd=tmp, check=True, timeout=600, capture_output=True
        )
        (deb,) = Path(tmp).glob("prometheus_*.deb")
        unpacked = Path(tmp) / "root"
        subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True, timeout=300)
        staging = dest.parent / f".{dest.name}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "bin").mkdir(parents=True)
        for name in BINARIES:
            shutil.copy2(unpacked / "usr" / "bin" / name, staging / "bin" / name)
        # Moved into place last: an interrupted install leaves no half-filled directory behind.
        staging.rename(dest)
    return dest / "bin"


class ExporterServer:
    """Serves ``text`` at ``/metrics`` on 127.0.0.1 (thread gpushare-test-exporter); ``close()`` stops it."""

    def __init__(self, text: str = "") -> None:
        self.text = text
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = server.text.encode()
                self.send_response(200 if self.path.split("?", 1)[0] == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.port = int(self._http.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self._thread = threading.Thread(target=self._http.serve_forever, name="gpushare-test-exporter", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._http.shutdown()
        self._thread.join(5.0)
        self._http.server_close()


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float


class PrometheusServer:
    """``prometheus`` scraping ``targets`` (job name -> host:port) every second with ``rule_files``."""

    def __init__(self, targets: Mapping[str, Iterable[str]], rule_files: Iterable[Path] = RULE_FILES) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gs-prometheus-", dir="/tmp"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.rule_files = [str(p) for p in rule_files]
        self._write_config(targets)
        self.log_path = self.root / "prometheus.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def _write_config(self, targets: Mapping[str, Iterable[str]]) -> None:
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": self.rule_files,
            "scrape_configs": [
                # honor_labels: the agent's namespace/pod/container name the GPU's user, as the docs ask.
                {"job_name": job, "honor_labels": True, "static_configs": [{"targets": list(addrs)}]}
                for job, addrs in targets.items()
            ],
        }
        self.targets = {job: list(addrs) for job, addrs in targets.items()}
        tmp = self.root / "prometheus.yml.tmp"
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
        os.replace(tmp, self.root / "prometheus.yml")  # a reload never reads half a file

    def reconfigure(self, targets: Mapping[str, Iterable[str]], timeout_s: float = 30.0) -> None:
        """Scrape ``targets`` instead (SIGHUP: Prometheus reads its config again). A target dropped
        from a job that stays (an empty list keeps the job) has its series marked stale within an interval; a
        job removed altogether leaves its series to the 5-minute lookback, as Prometheus does."""
        if self._proc is None or self._proc.poll() is not None:
            raise ClusterError("prometheus is not running")
        self._write_config(targets)
        self._proc.send_signal(signal.SIGHUP)
        wanted = {job: sorted(addrs) for job, addrs in self.targets.items() if addrs}

        def applied() -> bool:
            pools: dict[str, list[str]] = {}
            for t in self.api("targets")["activeTargets"]:
                pools.setdefault(t["scrapePool"], []).append(t["labels"]["instance"])
            return {job: sorted(addrs) for job, addrs in pools.items()} == wanted

        self.wait("the new scrape config applied", applied, timeout_s)

    def start(self, timeout_s: float = 60.0) -> None:
        argv = [
            str(binary("prometheus")),
            f"--config.file={self.root / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.root / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1h",
        ]
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.wait("ready", self._ready, timeout_s)

    def _ready(self) -> bool:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
            return bool(resp.status == 200)
        return False

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait(self, what: str, ok: Callable[[], bool], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ok():
            if self._proc is not None and self._proc.poll() is not None:
                raise ClusterError(f"prometheus exited {self._proc.returncode}:\n{self.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus: timed out after {timeout_s}s waiting for {what}")
            time.sleep(0.5)

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            doc = json.loads(resp.read())
        if doc.get("status") != "success":
            raise ClusterError(f"prometheus {path} {params}: {doc}")
        return doc["data"]

    def query(self, expr: str) -> list[Sample]:
        """An instant query's vector (a scalar reads as one sample without labels)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [Sample({}, float(data["result"][1]))]
        return [Sample(r["metric"], float(r["value"][1])) for r in data["result"]]

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule as the rules API gives it (name, query, health, lastError, state...)."""
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]

    def alerts(self) -> list[dict[str, Any]]:
        """The active alerts (pending or firing), each with its labels and state."""
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return alerts

    def targets_up(self) -> dict[str, str]:
        """scrape URL -> health ("up", "down", "unknown")."""
        return {t["scrapeUrl"]: t["health"] for t in self.api("targets")["activeTargets"]}

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        shutil.rmtree(self.root, ignore_errors=True)


def chart_configmap_file(template: str, configmap: str, key: str, values: Mapping[str, Any]) -> str:
    """``key`` of the ConfigMap ``configmap`` in manifests/chart/templates/``template``, rendered by
    ``helm template`` with ``values`` over the defaults (e.g. ``CHART_JOB_VALUES``)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="gs-values-") as fh:
        yaml.safe_dump(dict(values), fh)
        fh.flush()
        argv = [str(helm_binary()), "template", "gpushare", str(REPO / "manifests" / "chart")]
        argv += ["--values", fh.name, "--show-only", f"templates/{template}"]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if res.returncode != 0:
        raise ClusterError(f"helm template of {template} failed: {res.stderr.strip()}")
    for doc in yaml.safe_load_all(res.stdout):
        if doc and doc.get("kind") == "ConfigMap" and doc["metadata"]["name"] == configmap:
            return str(doc["data"][key])
    raise ClusterError(f"{template} rendered no ConfigMap {configmap}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Debian's prometheus and promtool in the build cache")
    p.add_argument("command", choices=["install", "where"])
    args = p.parse_args(argv)
    try:
        where = install() if args.command == "install" else binary("promtool").parent
    except (ClusterError, subprocess.CalledProcessError) as exc:
        print(f"prometheus: {exc}", file=sys.stderr)
        return 1
    print(where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
