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


def test_a_node_can_have_any_shape_and_a_dra_node_no_gpu_resource() -> None:
    node = node_manifest("sim-0001", gpus=2, cpu="16000m", memory="122880Mi")
    assert node["status"]["allocatable"] == {
        "cpu": "16000m",
        "memory": "122880Mi",
        "pods": "110",
        "example.com/gpu": "2",
    }
    dra = node_manifest("sim-0002", gpus=8, resource=None)
    assert "example.com/gpu" not in dra["status"]["capacity"]


def test_the_scheduler_runs_from_a_config_file_or_from_its_flags() -> None:
    from pathlib import Path  # noqa: PLC0415

    from localcluster.component_config import scheduler_args  # noqa: PLC0415
    from localcluster.layout import Binaries, Layout, Ports  # noqa: PLC0415

    binaries = Binaries(
        *(Path(f"/bin/{n}") for n in ("apiserver", "cm", "kube-scheduler", "kubelet", "kubectl", "etcd"))
    )
    layout, ports = Layout(Path("/r")), Ports(1, 2, 3, 4, 5, 6)
    flags = scheduler_args(binaries, layout, ports)
    assert "--leader-elect=false" in flags and any(a.startswith("--kubeconfig=") for a in flags)
    configured = scheduler_args(binaries, layout, ports, Path("/r/kube-scheduler.yaml"))
    # With --config the scheduler ignores --kubeconfig and --leader-elect: neither may be given.
    assert configured[-1] == "--config=/r/kube-scheduler.yaml"
    assert not any(a.startswith(("--kubeconfig", "--leader-elect")) for a in configured)
