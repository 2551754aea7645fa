# NVIDIA's own user space, built from their Go modules (no release download: only the Go module proxy
# is reachable) into $(GPUSHARE_CACHE)/nvidia/<project>/<version>/bin: k8s-device-plugin's
# nvidia-device-plugin and the Container Toolkit's nvidia-ctk, nvidia-container-runtime,
# nvidia-cdi-hook and nvidia-container-runtime-hook. The nvidia tier runs them unmodified against
# fakenvidia's mock NVML and driver root (docs/fakenvidia.md). Cached by a stamp naming version,
# commands and flags; both need cgo (a C compiler), as go-nvml does.
NVIDIA_DEVICE_PLUGIN_VERSION ?= v0.17.4
NVIDIA_CTK_VERSION ?= v1.20.2

.PHONY: nvidia-deps
nvidia-deps:
	NVIDIA_DEVICE_PLUGIN_VERSION=$(NVIDIA_DEVICE_PLUGIN_VERSION) NVIDIA_CTK_VERSION=$(NVIDIA_CTK_VERSION) \
		hack/nvidia/build.sh all

DEPS += nvidia-deps
