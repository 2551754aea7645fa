"""A local one-node Kubernetes of real peers, for the integration tests, the benchmarks and the demo.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd 2.x (NRI on) and kubelet,
built from source and cached in ``$GPUSHARE_CACHE``, started on 127.0.0.1 with private ports, one
private root directory, private cgroups and a private mount namespace for kubelet (docs/cluster.md).
Not part of the product: the wheel ships gpushare's own packages only.

    layout, component_config, pki    plain data: where things are, what each program is told
    host, sysctls                    host side effects: processes, mounts, cgroups, ports, sysctls
    cluster, bringup, __main__       ``Cluster``; starting, stopping and reaping clusters; the CLI
    containerd, containerd_config    a private containerd (1.7.24 or 2.x) and its config file
    cri, images, lifecycle           a CRI client, the locally built images, the peers' shared shape
    agent, pods                      the agent's settings and the handle the tests drive; pods
    helm, deploy                     installed as an operator does: image import, helm, the fake
                                     GPUs' DaemonSet
    kwok, prometheus                 simulated nodes' kubelet side; a Prometheus and an exporter

Generic on purpose: it imports nothing of the agent (controller) or the command line (cli), an
import contract in .importlinter says so. The worlds that need the product's internals (the agent
as the DaemonSet's pod, the spot environment, simulated nodes running the agent's node pass, the
scale world) live with the tests, in tests/harness/worlds/.

    .venv/bin/python -m localcluster up     # prints export KUBECONFIG=...
    .venv/bin/python -m localcluster down
"""
