# Helm, built from its Go module (no release download) into $(GPUSHARE_CACHE)/helm, and the chart in
# manifests/chart: the one source of manifests/*.yaml, which `make manifests` renders from it and
# tests/unit/test_manifests_rendered.py checks. See docs/install.md.
HELM_VERSION ?= $(shell cat hack/image/helm-version)
HELM_BIN = $(GPUSHARE_CACHE)/helm/$(HELM_VERSION)/bin/helm

.PHONY: helm helm-lint manifests
helm:
	@HELM_VERSION=$(HELM_VERSION) hack/image/install-helm.sh >/dev/null

helm-lint: helm
	$(HELM_BIN) lint --strict manifests/chart

manifests: helm venv
	HELM=$(HELM_BIN) $(PY) hack/image/render_manifests.py

DEPS += helm

# The chart's values.schema.json and README.md, generated from values.yaml and its comments
# (hack/chart_docs.py; tests/unit/test_chart_docs.py checks they are current).
.PHONY: chart-docs
chart-docs: venv
	$(PY) hack/chart_docs.py
