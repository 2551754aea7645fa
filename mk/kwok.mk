# kwok, built from its Go module (no release download: only the Go module proxy is reachable) into
# $(GPUSHARE_CACHE)/kwok/<version>/bin/kwok. The scale tier and bench/cluster_scale.py run it against a
# localcluster as the controller of simulated nodes (localcluster/kwok.py, docs/scale.md).
# A present binary that reports the wanted version is kept; GOBIN is a temporary dir moved into
# place at the end, so an interrupted build leaves no half binary.
KWOK_VERSION ?= v0.8.0
KWOK_BIN = $(GPUSHARE_CACHE)/kwok/$(KWOK_VERSION)/bin/kwok

.PHONY: kwok
kwok:
	@if [[ -x "$(KWOK_BIN)" ]] && "$(KWOK_BIN)" --version 2>/dev/null | grep -q "version $(KWOK_VERSION) "; then \
		echo "kwok $(KWOK_VERSION) already built in $(KWOK_BIN)" >&2; \
	else \
		command -v go >/dev/null || { echo "kwok: go is required (Go >= 1.24 on PATH)" >&2; exit 1; }; \
		mkdir -p "$(dir $(KWOK_BIN))"; \
		tmp="$$(mktemp -d "$(dir $(KWOK_BIN)).build.XXXXXX")"; trap 'rm -rf "$$tmp"' EXIT; \
		echo "kwok: building sigs.k8s.io/kwok/cmd/kwok@$(KWOK_VERSION) (nice, -trimpath, CGO off; about 3 min on 2 cores)" >&2; \
		GOBIN="$$tmp" CGO_ENABLED=0 nice -n 10 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$(KWOK_VERSION)"; \
		mv "$$tmp/kwok" "$(KWOK_BIN)"; \
		"$(KWOK_BIN)" --version >&2; \
	fi

DEPS += kwok
