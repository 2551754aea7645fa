# One-node Kubernetes: kube-* and kubectl built with Go from k8s.io/kubernetes, etcd from trixie,
# containerd 2.x from containerd-deps; all cached under $(GPUSHARE_CACHE). Every cluster runs the
# newest supported release; the oldest supported kubelet is built too, for the tier whose node
# runs it against the newest control plane (docs/compatibility.md). See docs/cluster.md.
KUBE_VERSION ?= v1.37.2
KUBE_OLDEST_KUBELET ?= v1.34.4
CLUSTER_ROOT ?= /tmp/gs-kube

.PHONY: kube-deps cluster-up cluster-down
kube-deps: containerd-deps
	KUBE_VERSION=$(KUBE_VERSION) hack/kube/build.sh
	KUBE_VERSION=$(KUBE_OLDEST_KUBELET) KUBE_COMMANDS=kubelet hack/kube/build.sh
	hack/kube/install-etcd.sh

# Prints `export KUBECONFIG=...` (and # comments) on stdout, install chatter on stderr, so
# `eval "$$(make -s cluster-up)"` sets it in the calling shell.
cluster-up: venv
	$(MAKE) -s kube-deps >&2
	GPUSHARE_KUBE_VERSION=$(KUBE_VERSION) $(PY) -m localcluster up --root $(CLUSTER_ROOT)

cluster-down: venv
	GPUSHARE_KUBE_VERSION=$(KUBE_VERSION) $(PY) -m localcluster down --root $(CLUSTER_ROOT)

DEPS += kube-deps
