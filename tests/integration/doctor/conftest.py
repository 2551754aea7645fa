"""The doctor tier: `gpushare doctor` against the real one-node cluster, healthy and with one fault at a time.

The healthy node is the spot environment (tests/harness/worlds/spot.py): the fake vendor plugin for 2 GPUs
and the agent with spot on, reading the fake exporter's file, both installed with helm as the
DaemonSets an operator runs (``GPUSHARE_AGENT_MODE=process``: host processes). Faults are made
without breaking that node: the doctor's config points at a second, deliberately broken setup (a
private containerd with NRI off, paths where nothing listens), except "no vendor plugin", where
the fake plugin is uninstalled and installed again.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.agent import GPUSHARE
from localcluster.cluster import Cluster
from localcluster.paths import REPO
from tests.harness.cluster_fixture import cluster  # noqa: F401
from tests.harness.worlds.spot import SpotEnv, spot_environment


@dataclass(frozen=True)
class Verdict:
    code: int
    doc: dict[str, Any]
    text: str

    def check(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = next(c for c in self.doc["checks"] if c["name"] == name)
        return found

    def failed(self) -> set[str]:
        return {c["name"] for c in self.doc["checks"] if c["status"] == "fail"}


@dataclass
class Node:
    env: SpotEnv
    tmp: Path

    @property
    def cluster(self) -> Cluster:
        return self.env.cluster

    def config(self, **changes: Any) -> Path:
        """The agent's own config with ``section__key=value`` changes, as a file for the doctor."""
        doc = yaml.safe_load(self.env.agent.config_path.read_text())
        for key, value in changes.items():
            section, _, name = key.partition("__")
            if name:
                doc.setdefault(section, {})[name] = value
            else:
                doc[section] = value
        path = self.tmp / f"doctor-{len(list(self.tmp.iterdir()))}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path

    def doctor(self, config: Path, *args: str) -> Verdict:
        """`gpushare doctor` on the host, once as JSON and once as text (the operator's view)."""
        runs = []
        for output in ("json", "text"):
            argv = [GPUSHARE, "doctor", "--config", str(config), "-o", output, *args]
            env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}
            runs.append(
                subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=REPO, env=env)
            )
        assert runs[0].returncode == runs[1].returncode, runs
        assert runs[0].returncode in (0, 1), runs[0].stderr
        return Verdict(runs[0].returncode, json.loads(runs[0].stdout), runs[1].stdout)


# Package scope (the folder has an __init__.py for it): the agent and the fake plugin are gone
# before later tiers install their own on the same shared cluster.
@pytest.fixture(scope="package")
def node(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:  # noqa: F811
    with spot_environment(cluster) as env:
        env.write_metrics({"fakegpu0": 0.0, "fakegpu1": 0.0})
        yield Node(env, tmp_path_factory.mktemp("doctor"))
