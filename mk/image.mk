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

# arm64 on this amd64 builder, by emulation (docs/install.md, "arm64"): qemu-user-static runs arm64's
# binaries through binfmt_misc, for mmdebstrap's maintainer scripts and for the gcc that compiles the
# wheel's cffi extension; binutils-aarch64-linux-gnu strips the arm64 shared objects as `strip` does ours.
.PHONY: image-arm64 image-deps-arm64
image-deps-arm64: image-deps
	@if ! { command -v qemu-aarch64-static && command -v arch-test && command -v aarch64-linux-gnu-strip; } >/dev/null; then \
		echo "image-deps-arm64: installing qemu-user-static, binfmt-support, arch-test, binutils-aarch64-linux-gnu"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			qemu-user-static binfmt-support arch-test binutils-aarch64-linux-gnu; \
	fi
	@test -e /proc/sys/fs/binfmt_misc/register || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
	@test -e /proc/sys/fs/binfmt_misc/qemu-aarch64 || update-binfmts --enable qemu-aarch64
	@arch-test arm64 >/dev/null || { echo "image-deps-arm64: arm64 binaries do not run here: $$(arch-test arm64)"; exit 1; }

# Not part of `make test`: the emulated build takes minutes (docs/install.md). The build checks
# the archive it writes: arm64 in the config and the index, and every ELF file aarch64.
image-arm64: venv image-deps-arm64
	$(PY) hack/image/build.py agent --arch arm64 $(IMAGE_ARGS)
