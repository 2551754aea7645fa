# `make demo`: one-node cluster + 2 fake GPUs + the gpushare agent as a host process, and a
# walk-through (DinD, 8 share-gpu-4 replicas on 2 shadows, gpushare status). Leaves it running;
# `make demo-down` removes everything. Installs what it needs through the same steps as `make deps`.
DEMO_ROOT ?= /tmp/gs-demo

.PHONY: demo demo-down
demo: venv
	$(MAKE) -s kube-deps >&2
	$(PY) hack/demo.py up --root $(DEMO_ROOT)
	$(MAKE) -s demo-spot

demo-down: venv
	$(PY) hack/demo.py down --root $(DEMO_ROOT)
