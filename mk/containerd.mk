# containerd tier: runc + busybox (bookworm), containerd 1.7.24 (trixie .deb, unpacked) and
# containerd 2.x built with Go, all cached under $(GPUSHARE_CACHE). See docs/testing-containerd.md.
.PHONY: containerd-deps
containerd-deps:
	hack/containerd/install.sh all

DEPS += containerd-deps
