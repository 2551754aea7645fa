# One-node Kubernetes: kube-* and kubectl v1.34.4 built with Go from k8s.io/kubernetes,
# etcd from trixie, containerd 2.x from containerd-deps; all cached under $(GPUSHARE_CACHE).
# See docs/cluster.md.
KUBE_VERSION ?= v1.34.4
CLUSTER_ROOT ?= /tmp/gs-kube

.PHONY: kube-deps cluster-up cluster-down
kube-deps: containerd-deps
	KUBE_VERSION=$(KUBE_VERSION) hack/kube/build.sh
	hack/kube/install-etcd.sh

# Prints `export KUBECONFIG=...` (and # comments) on stdout, install chatter on stderr, so
# `eval "$$(make -s cluster-up)"` sets it in the calling shell.
cluster-up: venv
	$(MAKE) -s kube-deps >&2
	GPUSHARE_KUBE_VERSION=$(KUBE_VERSION) $(PY) -m localcluster up --root $(CLUSTER_ROOT)

cluster-down: venv
	GPUSHARE_KUBE_VERSION=$(KUBE_VERSION) $(PY) -m localcluster down --root $(CLUSTER_ROOT)

DEPS += kube-deps
