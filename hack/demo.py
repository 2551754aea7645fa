"""`make demo`: a one-node cluster with 2 fake GPUs, gpushare installed with helm, and a walk-through.

    python hack/demo.py up   [--root /tmp/gs-demo] [--vendor fake|nvidia]  # cluster + GPUs + agent, walk-through
    python hack/demo.py down [--root /tmp/gs-demo]                         # agent, GPUs and cluster gone

``--vendor nvidia`` (`make demo VENDOR=nvidia`) runs NVIDIA's own stack instead of gpushare's fake
vendor: NVIDIA's device plugin in the cdi-cri strategy on fakenvidia's driver root, containerd
resolving the CDI names (hack/nvidia/demo_stack.py); the walk-through then shows the DinD sidecar
and each sharer with the GPU's node and the driver's libraries, as the exclusive container has them.

The cluster lives in ROOT (``python -m localcluster``). gpushare is installed as an operator
installs it (docs/install.md): the image `make image` builds, imported into the node's
containerd, and `helm install` of manifests/chart; the agent is the DaemonSet's pod. The fake
vendor plugin is a DaemonSet too (tests/charts/fake-gpus). The host directories they use (state,
fake device nodes, values files, kept logs) are in ROOT-agent. ``GPUSHARE_AGENT_MODE=process``
runs both as host processes instead (pid files in ROOT-agent). Everything is left running after
`up` so you can explore with the printed KUBECONFIG line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hack.nvidia.demo_stack import NvidiaStack  # noqa: E402
from localcluster.agent import FAKE_RESOURCE, GPUSHARE, AgentSettings, agent_mode  # noqa: E402
from localcluster.cluster import Cluster  # noqa: E402
from localcluster.deploy import fake_gpus  # noqa: E402
from localcluster.errors import ClusterError  # noqa: E402
from localcluster.layout import Binaries  # noqa: E402
from localcluster.paths import cache_dir  # noqa: E402
from localcluster.pods import pod_manifest  # noqa: E402
from tests.harness.worlds.agent_pod import node_agent  # noqa: E402

IN_POD = ["-n", "gpushare-system", "ds/gpushare-agent", "--"]
POD_CONFIG = "/etc/gpushare/config.yaml"
BOLD, DIM, RESET = ("\033[1m", "\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "", "")


def say(text: str) -> None:
    print(f"\n{BOLD}==> {text}{RESET}", flush=True)


def show(cmd: list[str], text: str) -> None:
    print(f"{DIM}$ {' '.join(cmd)}{RESET}")
    print(text.rstrip(), flush=True)


NVIDIA_RESOURCE = "nvidia.com/gpu"
# What shows a container's GPU part: its GPU's device node, and the driver's library CDI mounted.
NVIDIA_PROBE = "ls /dev | grep -E '^nvidia[0-9]+$'; ls /usr/lib/x86_64-linux-gnu | grep '^libcuda'"


class Demo:
    def __init__(self, root: Path, vendor: str = "fake") -> None:
        self.root = root
        self.vendor = vendor
        self.resource = NVIDIA_RESOURCE if vendor == "nvidia" else FAKE_RESOURCE
        self.side = Path(f"{root}-agent")
        self.kubeconfig = root / "kubeconfig"
        # The kubectl built with the cluster (same version), not whatever the machine has on PATH.
        self.kubectl_bin = str(Binaries.find(cache_dir()).kubectl)

    # -- helpers -------------------------------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        argv = [self.kubectl_bin, f"--kubeconfig={self.kubeconfig}", *args]
        res = subprocess.run(argv, capture_output=True, text=True, input=input, timeout=120, check=False)
        if check and res.returncode != 0:
            raise SystemExit(f"demo: kubectl {' '.join(args)} failed: {res.stderr.strip()}")
        return res.stdout

    def apply(self, doc: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(doc))

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        args = ["get", "pods", "-n", namespace, "-o", "json"] + (["-l", selector] if selector else [])
        items: list[dict[str, Any]] = json.loads(self.kubectl(*args))["items"]
        return items

    def wait(self, what: str, ok: Any, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ok():
            if time.monotonic() > deadline:
                raise SystemExit(f"demo: timed out waiting for {what}; see `kubectl get pods -A` and {self.side}")
            time.sleep(0.5)

    def stop(self, name: str) -> None:
        pid_file = self.side / f"{name}.pid"
        with contextlib.suppress(FileNotFoundError, ValueError):
            pid = int(pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            if "gpushare" in cmdline:  # only a process we started (the PID may have been reused)
                os.kill(pid, signal.SIGTERM)
                for _ in range(100):
                    if not Path(f"/proc/{pid}").exists():
                        break
                    time.sleep(0.1)
                else:
                    os.kill(pid, signal.SIGKILL)
        pid_file.unlink(missing_ok=True)

    # -- up / down -----------------------------------------------------------------------------
    def up(self) -> None:
        if os.geteuid() != 0:
            raise SystemExit("demo: needs root (kubelet, containerd, device nodes); run `sudo make demo`")
        if (self.root / "cluster.json").exists() or self.side.exists():
            say(f"a previous demo is still in {self.root}; removing it first")
            self.down()
        say("bringing up a one-node Kubernetes cluster (kubelet + containerd with NRI)")
        out = subprocess.run(
            [sys.executable, "-m", "localcluster", "up", "--root", str(self.root)],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise SystemExit(f"demo: cluster up failed:\n{out.stderr}{out.stdout}")
        print(out.stdout.strip())
        self.side.mkdir(parents=True, exist_ok=True)
        try:
            config = self.install(Cluster.from_state(json.loads((self.root / "cluster.json").read_text())))
        except ClusterError as exc:
            raise SystemExit(f"demo: {exc}\n(the cluster stays up; `make demo-down` removes it)") from exc

        self.dind()
        self.sharing()
        say("gpushare status")
        if config == POD_CONFIG:
            argv = ["exec", *IN_POD, "gpushare", "status", "--config", POD_CONFIG]
            show(["kubectl", *argv], self.kubectl(*argv, check=False))
        else:
            argv = [GPUSHARE, "status", "--config", config]
            show(argv, subprocess.run(argv, capture_output=True, text=True, check=False).stdout)
        say("the cluster stays up; explore it with:")
        print(f"export KUBECONFIG={self.kubeconfig}")
        print(f"{self.kubectl_bin} get pods -A -o wide")
        if config == POD_CONFIG:
            print(f"{self.kubectl_bin} exec {' '.join(IN_POD)} gpushare status --config {POD_CONFIG}")
        print(f"{GPUSHARE} status --config {self.side / 'agent.yaml'}")
        print("and remove everything with: make demo-down")

    def install(self, cluster: Cluster) -> str:
        """The GPUs and the agent; the config path `gpushare status` takes where it runs."""
        mode = agent_mode()
        pods = mode == "pod"
        config: dict[str, Any] = {}
        gpus: Any = None
        if self.vendor == "nvidia":
            say(
                "starting NVIDIA's stack on a fake driver root: 2 GPUs, nvidia-ctk's CDI spec, NVIDIA's device "
                "plugin v0.17.4 (--device-list-strategy=cdi-cri, a host process)"
            )
            stack = NvidiaStack(cluster, self.side)
            stack.start()
            # The NVIDIA GPUs are the default pool, and the agent reads the CDI spec containerd resolves.
            config = {"realResources": [NVIDIA_RESOURCE], "cdiSpecDirs": [str(stack.cdi_dir)]}
        else:
            how = "a DaemonSet, helm chart tests/charts/fake-gpus" if pods else "a host process"
            say(f"starting the fake vendor device plugin: 2 GPUs as {FAKE_RESOURCE} ({how})")
            gpus = fake_gpus(cluster, self.side, mode=mode)
            gpus.start()
        self.wait(
            f"2 GPUs of {self.resource} in node allocatable", lambda: self.allocatable().get(self.resource) == "2", 60
        )
        agent = node_agent(cluster, self.side, AgentSettings(idle_s=60, args=(), config=config), mode=mode)
        if pods:
            say("installing gpushare: the image from `make image` into the node's containerd, then helm install")
        else:
            say("starting the gpushare agent as a host process (loop + device plugins + NRI plugin + /metrics)")
        agent.start()
        agent.wait_healthy(120)
        self.wait("the agent's share-gpu-4 plugin", lambda: "gpushare/share-gpu-4" in self.allocatable(), 60)
        timings: dict[str, float] = getattr(agent, "timings", {})
        if pods:
            print(", ".join(f"{what}: {took:.1f} s" for what, took in timings.items()))
            show(["kubectl", "get", "pods", "-A", "-o", "wide"], self.kubectl("get", "pods", "-A", "-o", "wide"))
            return POD_CONFIG
        for name, process in (("agent", agent), ("fake-gpus", gpus)):
            if process is not None:
                (self.side / f"{name}.pid").write_text(str(getattr(process, "pid", "")))
        print(f"agent log: {self.side / 'agent.log'}   metrics: http://127.0.0.1:{agent.port}/metrics")
        return str(agent.config_path)

    def allocatable(self) -> dict[str, str]:
        node = json.loads(self.kubectl("get", "node", "127.0.0.1", "-o", "json", check=False) or "{}")
        alloc: dict[str, str] = (node.get("status") or {}).get("allocatable") or {}
        return alloc

    def dind(self) -> None:
        say("a Docker-in-Docker dev pod: 'main' asks for a GPU, the 'dind' sidecar gets the same one")
        pod = pod_manifest(
            "dind-dev",
            resources={self.resource: "1"},
            containers=["main", "dind"],
            annotations={"gpushare.k8s.io/container-devices-from.dind": "main"},
        )
        print("pod annotation  gpushare.k8s.io/container-devices-from.dind: main")
        self.apply(pod)
        self.wait("dind-dev Running", lambda: self._phase("default", "dind-dev") == "Running")
        script = NVIDIA_PROBE if self.vendor == "nvidia" else "ls /dev | grep fakegpu; env | grep FAKE"
        for c in ("main", "dind"):
            argv = ["exec", "dind-dev", "-c", c, "--", "sh", "-c", script]
            show(["kubectl", *argv[:-1], repr(script)], self.kubectl(*argv))

    def sharing(self) -> None:
        say("8 replicas asking gpushare/share-gpu-4: the agent creates 2 shadow pods, 4 sharers each")
        # The GPU the DinD pod holds is needed by the second shadow: free it first.
        self.kubectl("delete", "pod", "dind-dev", "--wait=true")
        dep = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "inference", "namespace": "default"},
            "spec": {
                "replicas": 8,
                "selector": {"matchLabels": {"app": "inference"}},
                "template": {
                    "metadata": {"labels": {"app": "inference"}},
                    "spec": pod_manifest("x", resources={"gpushare/share-gpu-4": "1"}, containers=["server"])["spec"],
                },
            },
        }
        self.apply(dep)

        def all_running() -> bool:
            pods = self.pods("default", "app=inference")
            return len(pods) == 8 and all(p["status"].get("phase") == "Running" for p in pods)

        self.wait("8 inference replicas Running", all_running, 180)
        show(
            ["kubectl", "get", "pods", "-n", "gpushare-system"],
            self.kubectl("get", "pods", "-n", "gpushare-system", "-o", "wide"),
        )
        lines = []
        for p in sorted(self.pods("default", "app=inference"), key=lambda p: p["metadata"]["name"]):
            name = p["metadata"]["name"]
            owner = json.loads((p["metadata"].get("annotations") or {}).get("gpushare.k8s.io/shadow-owner", "{}"))
            probe = NVIDIA_PROBE if self.vendor == "nvidia" else "echo $FAKE_VISIBLE_DEVICES"
            seen = " ".join(self.kubectl("exec", name, "--", "sh", "-c", probe).split())
            lines.append(f"{name:32} shadow={','.join(owner) or '(recording…)':48} sees {seen}")
        show(["(each replica's shadow and the GPU it sees)"], "\n".join(lines))

    def _phase(self, ns: str, name: str) -> str:
        out = self.kubectl("get", "pod", "-n", ns, name, "-o", "jsonpath={.status.phase}", check=False)
        return out.strip()

    def down(self) -> None:
        # Host processes of GPUSHARE_AGENT_MODE=process; the pods go with the cluster.
        self.stop("agent")
        self.stop("fake-gpus")
        NvidiaStack.stop(self.side)
        subprocess.run([sys.executable, "-m", "localcluster", "down", "--root", str(self.root)], cwd=REPO, check=False)
        shutil.rmtree(self.side, ignore_errors=True)
        print(f"demo removed ({self.root}, {self.side})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--root", default="/tmp/gs-demo", type=Path)
    parser.add_argument("--vendor", default="fake", choices=["fake", "nvidia"], help="whose GPUs (default: fake)")
    args = parser.parse_args()
    demo = Demo(args.root, args.vendor)
    demo.up() if args.action == "up" else demo.down()


if __name__ == "__main__":
    main()
