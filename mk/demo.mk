# `make demo`: one-node cluster + 2 fake GPUs + gpushare installed as an operator installs it (the
# image from `make image` imported into the node's containerd, `helm install` of manifests/chart:
# the agent is the DaemonSet's pod), and a walk-through (DinD, 8 share-gpu-4 replicas on 2
# shadows, gpushare status). Leaves it running; `make demo-down` removes everything. Installs
# what it needs through the same steps as `make deps`; GPUSHARE_AGENT_MODE=process runs the agent
# and the fake GPUs as host processes instead. `make demo VENDOR=nvidia` runs NVIDIA's device plugin
# and container toolkit on fakenvidia's driver root instead of the fake vendor (docs/nvidia.md); the
# spot walk-through stays with the fake vendor's demo.
DEMO_ROOT ?= /tmp/gs-demo
VENDOR ?= fake

.PHONY: demo demo-down
demo: venv
	$(MAKE) -s kube-deps image helm >&2
ifeq ($(VENDOR),nvidia)
	$(MAKE) -s nvidia-deps fakenvidia >&2
	$(PY) hack/demo.py up --root $(DEMO_ROOT) --vendor nvidia
else
	$(PY) hack/demo.py up --root $(DEMO_ROOT)
	$(MAKE) -s demo-spot
endif

demo-down: venv
	$(PY) hack/demo.py down --root $(DEMO_ROOT)
