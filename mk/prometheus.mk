# Prometheus and promtool: Debian's prometheus package, downloaded with apt-get and unpacked into
# $(GPUSHARE_CACHE)/prometheus/<version>/bin (no system install, no daemon). promtool checks and
# unit-tests manifests/prometheus/ in the unit tier; the e2e tier runs a real Prometheus against the
# agent (localcluster/prometheus.py, docs/observability.md).
.PHONY: prometheus
prometheus: venv
	@$(PY) -m localcluster.prometheus install >/dev/null

DEPS += prometheus
