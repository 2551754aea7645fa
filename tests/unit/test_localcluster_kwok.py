"""kwok's config and the simulated nodes' manifests (localcluster/kwok.py): what needs no cluster."""

from __future__ import annotations

import yaml

from localcluster.kwok import SIMULATED_LABEL, kwok_config_text, node_manifest, sim_node_names


def test_kwok_manages_only_the_labelled_nodes_and_runs_pods_through_three_stages() -> None:
    config, *stages = yaml.safe_load_all(kwok_config_text())
    assert config["kind"] == "KwokConfiguration"
    assert config["options"]["manageNodesWithLabelSelector"] == f"{SIMULATED_LABEL}=true"
    for key in ("podPlayStageParallelism", "nodePlayStageParallelism", "nodeLeaseParallelism"):
        assert config["options"][key] > 0  # kwok refuses a config file without them
    assert [(s["metadata"]["name"], s["spec"]["resourceRef"]["kind"]) for s in stages] == [
        ("gs-node-ready", "Node"),
        ("gs-pod-running", "Pod"),
        ("gs-pod-gone", "Pod"),
    ]
    assert stages[2]["spec"]["next"] == {"delete": True}


def test_a_simulated_node_offers_eight_fake_gpus_and_carries_the_label() -> None:
    node = node_manifest("sim-0007")
    assert node["metadata"]["labels"][SIMULATED_LABEL] == "true"
    assert node["status"]["capacity"]["example.com/gpu"] == "8" == node["status"]["allocatable"]["example.com/gpu"]
    assert sim_node_names(3) == ["sim-0000", "sim-0001", "sim-0002"]
