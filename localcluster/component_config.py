"""What each cluster component is told: argv lists, kubeconfigs and kubelet's config file.

Pure functions over ``layout.Binaries``, ``Layout`` and ``Ports``; nothing here starts a process.
Why some flags look the way they do:

- kubelet hard-codes its device-plugin directory to /var/lib/kubelet/device-plugins/. kubelet runs
  in a mount namespace of its own where /var/lib and /var/log are private tmpfs and that path is a
  bind mount of ``<root>/kubelet/device-plugins``; the system paths are never touched. Its root dir
  is a shared bind mount (``Cluster`` makes it), so the volumes kubelet mounts there are seen by
  containerd outside.
- cgroups here are v1: kubelet v1.34 runs on them with ``failCgroupV1: false``; all pod cgroups
  live under ``/<root name>`` in every hierarchy and are removed on teardown.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from localcluster.layout import NODE_NAME, Binaries, Layout, Ports
from localcluster.paths import REPO

SERVICE_CIDR = "10.96.0.0/24"
# The user the agent's pod authenticates as (the chart's ServiceAccount). The apiserver audits
# this user's requests only, so tests can compare what the agent really calls with its RBAC.
AGENT_USER = "system:serviceaccount:gpushare-system:gpushare-agent"
# containerd reports NetworkReady only with a CNI config. The plugin gives each pod's own network
# namespace an address and lo, and adds nothing to the host's: no packet leaves a pod.
CNI_PLUGIN = REPO / "hack" / "kube" / "cni" / "gs-netns"
CNI_CONFLIST = {"cniVersion": "1.0.0", "name": "gpushare-pods", "plugins": [{"type": "gs-netns"}]}


def kubeconfig_doc(server: str, pki: Path, user: str) -> dict[str, Any]:
    """A kubeconfig that authenticates with the client certificate ``<pki>/<user>.crt``."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "gpushare", "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")}}],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki / f"{user}.crt"),
                    "client-key": str(pki / f"{user}.key"),
                },
            }
        ],
        "contexts": [{"name": "gpushare", "context": {"cluster": "gpushare", "user": user}}],
        "current-context": "gpushare",
    }


def etcd_args(binaries: Binaries, layout: Layout, ports: Ports) -> list[str]:
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(binaries.etcd),
        "--name=gpushare",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=gpushare={peer}",
        # A throwaway test store: fsync buys nothing and costs seconds on a shared disk.
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def audit_policy_doc() -> dict[str, Any]:
    """Metadata (verb, resource, namespace, user; no bodies) of the agent's requests, nothing else.

    One line per request at ResponseComplete (a watch also logs when its response starts), so the
    log stays small enough to keep for a whole test session.
    """
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            {"level": "Metadata", "users": [AGENT_USER]},
            {"level": "None"},
        ],
    }


def apiserver_args(binaries: Binaries, layout: Layout, ports: Ports, *, audit: bool = False) -> list[str]:
    """``audit``: log the agent's requests to ``layout.audit_log`` (the policy file must exist)."""
    pki = layout.pki
    audit_flags = [
        f"--audit-policy-file={layout.audit_policy}",
        f"--audit-log-path={layout.audit_log}",
        # Written before the response is sent, so a test reads every call that already returned.
        "--audit-log-mode=blocking",
    ]
    return [
        str(binaries.kube_apiserver),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--cert-dir={pki}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        "--kubelet-preferred-address-types=InternalIP",
        "--allow-privileged=true",
        # The "kubernetes" Endpoints would carry 127.0.0.1, which the API refuses (loopback).
        "--endpoint-reconciler-type=none",
        "--profiling=false",
        *(audit_flags if audit else []),
    ]


def controller_manager_args(binaries: Binaries, layout: Layout) -> list[str]:
    pki = layout.pki
    return [
        str(binaries.kube_controller_manager),
        f"--kubeconfig={layout.kubeconfig_for('controller-manager')}",
        "--bind-address=127.0.0.1",
        "--secure-port=0",  # nothing scrapes it; one port fewer
        "--leader-elect=false",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--use-service-account-credentials=false",
        "--profiling=false",
    ]


def scheduler_args(binaries: Binaries, layout: Layout, ports: Ports, config: Path | None = None) -> list[str]:
    """The scheduler serves /metrics and /configz on loopback to anyone, as a cluster lets Prometheus
    scrape it: the scale benchmark reads its attempts, its client's rate-limiter wait and that
    client's QPS and burst from there. ``config``: a KubeSchedulerConfiguration file
    (``scheduler_config_doc``), which then holds the client and leader-election settings."""
    argv = [
        str(binaries.kube_scheduler),
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.scheduler}",
        f"--cert-dir={layout.root / 'scheduler-serving'}",
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics,/configz",
        "--profiling=false",
    ]
    if config is not None:
        return [*argv, f"--config={config}"]
    return [*argv, f"--kubeconfig={layout.kubeconfig_for('scheduler')}", "--leader-elect=false"]


def scheduler_config_doc(layout: Layout, settings: Mapping[str, Any]) -> dict[str, Any]:
    """A KubeSchedulerConfiguration: ``settings`` (profiles, percentageOfNodesToScore, the client's
    qps and burst) over what the flags set without one. With ``--config`` the scheduler ignores
    ``--kubeconfig`` and ``--leader-elect``, so they are written here."""
    client = {"kubeconfig": str(layout.kubeconfig_for("scheduler")), **(settings.get("clientConnection") or {})}
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        **settings,
        "clientConnection": client,
        "leaderElection": {"leaderElect": False},
    }


def kubelet_config_doc(layout: Layout, ports: Ports, cri_socket: Path) -> dict[str, Any]:
    """The static KubeletConfiguration. Relaxed eviction: a shared test machine is always "full"."""
    pki = layout.pki
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports.kubelet_healthz,
        "tlsCertFile": str(pki / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(pki / "kubelet-serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{cri_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": layout.cgroup_root,
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "failCgroupV1": False,
        "failSwapOn": False,
        # CAP_SYS_RESOURCE is missing here: lowering kubelet's own oom_score_adj would fail.
        "oomScoreAdj": 0,
        "registerNode": True,
        "podLogsDir": str(layout.pod_logs),
        "staticPodPath": "",
        "resolvConf": "/etc/resolv.conf",
        "clusterDomain": "cluster.local",
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "evictionPressureTransitionPeriod": "10s",
        # Faster status updates: tests wait on capacity and readiness changes.
        "nodeStatusUpdateFrequency": "4s",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "20s",
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
        "maxPods": 110,
    }


def kubelet_args(binaries: Binaries, layout: Layout) -> list[str]:
    """kubelet inside its own mount namespace (see the module docstring for why)."""
    # $1 = private device-plugin dir; the rest is kubelet's argv. /var/lib and /var/log become
    # private tmpfs in this namespace only, so kubelet's hard-coded system paths land in them.
    script = (
        "set -e; "
        'mount --make-private "$(findmnt -n -o TARGET -T /var/lib)"; '
        'mount --make-private "$(findmnt -n -o TARGET -T /var/log)"; '
        "mount -t tmpfs -o mode=0755,size=16m gs-kubelet-varlib /var/lib; "
        "mount -t tmpfs -o mode=0755,size=16m gs-kubelet-varlog /var/log; "
        "mkdir -p /var/lib/kubelet/device-plugins; "
        'mount --bind "$1" /var/lib/kubelet/device-plugins; '
        'shift; exec "$@"'
    )
    return [
        "unshare",
        "--mount",
        "--propagation",
        "unchanged",
        "--",
        "/bin/sh",
        "-c",
        script,
        "gs-kubelet-ns",
        str(layout.device_plugin_dir),
        str(binaries.kubelet),
        f"--config={layout.kubelet_config}",
        f"--kubeconfig={layout.kubeconfig_for('kubelet')}",
        f"--root-dir={layout.kubelet_root}",
        f"--cert-dir={layout.kubelet_root / 'pki'}",
        f"--hostname-override={NODE_NAME}",
        "--v=1",
    ]


def node_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
