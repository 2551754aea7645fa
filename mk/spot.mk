# Spot: the demo's spot act on its own one-node cluster (~1 min, root): a lendable dev
# pod goes idle, a spot job takes its GPU, the owner returns, the job is killed and deleted, and
# `gpushare status` says why. `make demo` runs it after its own walk-through. Needs kube-deps, and
# the image and helm: the agent and the fake GPUs are installed as in `make demo`.
.PHONY: demo-spot
demo-spot: venv
	$(MAKE) -s kube-deps image helm >&2
	$(PY) hack/demo_spot.py
