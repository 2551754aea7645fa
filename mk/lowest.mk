# The lowest-versions lane (hack/lowest_deps.py): a fresh virtualenv under
# $(GPUSHARE_CACHE)/lowest-deps with every direct dependency at exactly its declared floor, the
# project's wheel built at its build floors, and the unit and property tiers run there. `make test`
# runs it as the lowest_deps tier; this target runs it alone and prints each step's time.
.PHONY: test-lowest
test-lowest: venv
	$(PY) hack/lowest_deps.py
