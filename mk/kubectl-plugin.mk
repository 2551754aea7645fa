# `kubectl gpushare` (docs/kubectl-gpushare.md) is tested once as a person sees it, in a terminal that
# tmux drives (tests/integration/e2e/test_kubectl_plugin.py): a fresh machine needs tmux.
.PHONY: tmux-deps
tmux-deps:
	@if command -v tmux >/dev/null; then \
		echo "tmux-deps: $$(tmux -V) already installed"; \
	else \
		echo "tmux-deps: installing tmux from bookworm"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends tmux; \
	fi

DEPS += tmux-deps
