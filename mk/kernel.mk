# gpukmod QEMU tier: Debian's 6.1 and 6.12 (IBT) kernels + headers, unpacked under
# $(GPUSHARE_CACHE)/kernel, plus qemu-system-x86, busybox-static, kmod and dwarves on the host.
# See docs/gpukmod.md. The cffi helper is built by `pip install -e .` (setup.py cffi_modules);
# kmod-native rebuilds it in place when its C source changes.
.PHONY: kernels kmod-native kmod-test
kernels:
	hack/kernel/fetch.sh

build/.gpukmod-native: cffi_build/gpukmod_helper.c cffi_build/gpukmod_helper.h cffi_build/build_native.py | venv
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -c 'import gpukmod._native_c'
	mkdir -p build && touch $@

kmod-native: build/.gpukmod-native

# Only the kernel tier: both kernels under QEMU (about 2 min each under TCG), and the 6.12
# kernel again on cgroup v2 only, where runc containers are killed by spot (about 1 min).
kmod-test: kernels kmod-native
	$(PY) -m pytest tests/unit/gpukmod tests/integration/kernel -q $(PYTEST_ARGS)

DEPS += kernels kmod-native
