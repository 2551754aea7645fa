# `kubectl gpushare` (docs/kubectl-gpushare.md) is tested once as a person sees it, in a terminal that
# tmux drives (tests/integration/e2e/test_kubectl_plugin.py), TAB included: kubectl's bash completion
# script needs the bash-completion package, as kubectl's own install guide says. A fresh machine has
# neither.
.PHONY: tmux-deps
tmux-deps:
	@if command -v tmux >/dev/null && [ -f /usr/share/bash-completion/bash_completion ]; then \
		echo "tmux-deps: $$(tmux -V) and bash-completion already installed"; \
	else \
		echo "tmux-deps: installing tmux and bash-completion from bookworm"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			tmux bash-completion; \
	fi

DEPS += tmux-deps

# `kubectl gpushare` for operators' machines, apart from the agent (docs/kubectl-gpushare.md): the
# pure-Python wheel `kubectl-gpushare`, and per platform a zipapp, its krew archive and the krew
# manifest, all in build/kubectl-dist. pip downloads the plugin's dependencies from PyPI for each
# platform and CPython. KUBECTL_DIST_ARGS passes more, e.g. --base-url (where the archives will be
# published, which the manifest names), --homepage, --platform linux/amd64, --python 3.12.
KUBECTL_DIST_ARGS ?=
.PHONY: kubectl-plugin-dist
kubectl-plugin-dist: venv
	$(PY) hack/kubectl_dist.py $(KUBECTL_DIST_ARGS)
