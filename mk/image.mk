# Container images without a registry or a container engine: `make image` builds the agent image
# (Debian bookworm from mmdebstrap + the project's wheel and its PyPI dependencies) as an OCI
# archive under $(GPUSHARE_CACHE)/image, prints its size and build time, and imports it into a
# running containerd: $(CONTAINERD_ADDRESS) if set, else the test cluster's or the demo's when up.
# `make image-kmod` builds the kmod init container's image the same way. See docs/install.md.
IMAGE_MAX_MIB ?= 200
IMAGE_ARGS ?=
# Sockets of the clusters this repository brings up (mk/kube.mk, mk/demo.mk) that exist now.
IMAGE_LOCAL_CONTAINERD = $(wildcard $(CLUSTER_ROOT)/containerd/cd.sock $(DEMO_ROOT)/containerd/cd.sock)
IMAGE_IMPORT = $(if $(CONTAINERD_ADDRESS),--containerd-socket $(CONTAINERD_ADDRESS),\
	$(foreach s,$(IMAGE_LOCAL_CONTAINERD),--containerd-socket $(s) --only-if-running))

.PHONY: image image-kmod image-deps
image-deps:
	@if command -v mmdebstrap >/dev/null; then \
		echo "image-deps: $$(mmdebstrap --version) already installed"; \
	else \
		echo "image-deps: installing mmdebstrap from bookworm"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap; \
	fi

image: venv image-deps
	$(PY) hack/image/build.py agent --max-mib $(IMAGE_MAX_MIB) $(IMAGE_IMPORT) $(IMAGE_ARGS)

image-kmod: venv image-deps
	$(PY) hack/image/build.py kmod $(IMAGE_IMPORT) $(IMAGE_ARGS)

# The e2e, spot and doctor tiers install the agent from its image, so a fresh machine needs the builder.
DEPS += image-deps
