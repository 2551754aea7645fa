# The fake NVIDIA driver (fakenvidia/, docs/fakenvidia.md): the mock libnvidia-ml.so.1 and the stub
# driver libraries and tools, compiled with the system cc into build/fakenvidia/, one directory per
# hash of their sources, so this is a no-op until the C changes. The tests build it on demand too.
.PHONY: fakenvidia
fakenvidia: venv
	@$(PY) -m fakenvidia build >/dev/null

DEPS += fakenvidia
