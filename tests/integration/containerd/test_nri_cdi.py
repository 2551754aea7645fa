"""Design §5: a bundle carries the source's CDI device annotations, not only its device nodes.

A vendor device plugin may hand out a GPU as a CDI device (`cdi.k8s.io/<name>: <vendor>/<class>=<id>`
container annotation). containerd resolves it from the instance's private CDI spec dir before NRI
sees the spec, so the source arrives with the node and the annotation; `dind` must get both, plus
the visibility variable, and never unrelated env.
"""

from __future__ import annotations

import json

from localcluster.containerd import Containerd
from localcluster.cri import CriClient
from tests.harness.devices import FakeDevice
from tests.harness.plugin_process import PluginProcess
from tests.integration.containerd.common import GPU_PATH, VISIBLE, expected_node, probe, same_pod_annotation

CDI_KIND = "gpushare.test/gpu"
CDI_KEY = "cdi.k8s.io/gpushare-test"


def _write_cdi_spec(containerd: Containerd, dev: FakeDevice) -> None:
    spec = {
        "cdiVersion": "0.5.0",
        "kind": CDI_KIND,
        "devices": [
            {
                "name": "0",
                "containerEdits": {
                    "deviceNodes": [
                        {
                            "path": GPU_PATH,
                            "hostPath": str(dev.path),
                            "type": "c",
                            "major": dev.major,
                            "minor": dev.minor,
                            "permissions": "rw",
                        }
                    ],
                    "env": [f"{VISIBLE}=cdi-0"],
                },
            }
        ],
    }
    (containerd.paths.cdi_dir / "gpushare-test.json").write_text(json.dumps(spec))


def test_cdi_source_bundle_travels(
    containerd: Containerd, cri: CriClient, plugin: PluginProcess, fake_gpu: FakeDevice
) -> None:
    _write_cdi_spec(containerd, fake_gpu)
    pod = cri.run_pod("dind-cdi", annotations=same_pod_annotation("dind", "main"))
    main = cri.run_container(pod, "main", annotations={CDI_KEY: f"{CDI_KIND}=0"}, envs={"UNRELATED": "1"})
    assert probe(cri, main, fake_gpu).node == expected_node(fake_gpu)  # containerd resolved the CDI device

    dind = cri.run_container(pod, "dind")
    seen = probe(cri, dind, fake_gpu)
    assert seen.node == expected_node(fake_gpu) and seen.can_open and seen.cgroup_allows
    assert seen.visible_env == "cdi-0"
    spec = cri.runtime_spec(dind)
    assert spec["annotations"].get(CDI_KEY) == f"{CDI_KIND}=0"
    assert not [e for e in spec["process"]["env"] if e.startswith("UNRELATED=")]
    cri.remove_pod(pod.id)
