"""Offline checks of manifests/: they parse, and what they say agrees with the code.

The server-side dry run against the real API server is in the cluster tier.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpushare import keys
from gpushare.config import load_config

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
CHART = MANIFESTS / "chart"
PROMETHEUS = MANIFESTS / "prometheus"  # Prometheus's own rule and test files, not Kubernetes objects


def _docs() -> list[dict[str, Any]]:
    """Every object of the plain manifests and examples; the chart's Go templates are not YAML yet."""
    docs: list[dict[str, Any]] = []
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        if CHART not in path.parents and PROMETHEUS not in path.parents:
            docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def test_every_manifest_parses_and_has_kind() -> None:
    docs = _docs()
    assert len(docs) >= 12
    assert all("kind" in d and "apiVersion" in d for d in docs)


def test_configmap_holds_a_valid_config() -> None:
    (cm,) = [d for d in _docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpushare-config"]
    cfg = load_config(text=cm["data"]["config.yaml"])
    assert cfg.real_resources == ("nvidia.com/gpu",)


def test_namespace_and_annotations_match_the_contract() -> None:
    docs = _docs()
    namespaces = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    assert keys.DEFAULT_NAMESPACE in namespaces
    (dind,) = [d for d in docs if d["kind"] == "Pod" and d["metadata"]["name"] == "dind-dev"]
    assert keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "dind" in dind["metadata"]["annotations"]
    (devbox,) = [d for d in docs if d["kind"] == "Pod" and d["metadata"]["name"] == "devbox-alice"]
    assert devbox["metadata"]["labels"][keys.LABEL_LENDABLE] == "true"


def test_rbac_grants_no_wildcards() -> None:
    for d in _docs():
        if d["kind"] in ("ClusterRole", "Role"):
            for rule in d["rules"]:
                names = rule.get("resources", []) + rule.get("nonResourceURLs", [])
                assert names and "*" not in rule["verbs"] and not any("*" in n for n in names), rule
