#!/usr/bin/env bash
# Build gpukmod.ko against one cached kernel's headers, out of the source tree:
#   hack/kernel/build-module.sh RELEASE OUTDIR [VERSION]
# The sources are copied to OUTDIR first, so concurrent builds (and the read-only 9p view
# the guest gets) never see half-written objects in the repo.
set -euo pipefail
rel="$1"; out="$2"; version="${3:-}"
here="$(cd "$(dirname "$0")/../.." && pwd)"
CACHE="${GPUSHARE_CACHE:-/root/.cache/gpushare}/kernel"
kdir="$CACHE/$rel/root/usr/src/linux-headers-$rel"
[ -d "$kdir" ] || { echo "build-module: no headers for $rel in $kdir; run make kernels" >&2; exit 2; }
mkdir -p "$out"
cp "$here"/gpukmod/kmod/{gpukmod.c,Kbuild,Makefile,VERSION} "$out/"
args=(KDIR="$kdir")
[ -n "$version" ] && args+=(GPUKMOD_VERSION="$version")
make -s -C "$out" "${args[@]}" >"$out/build.log" 2>&1 || { cat "$out/build.log" >&2; exit 1; }
# Warnings are errors here too: a kernel module that warns is one that breaks next release.
if grep -E 'warning:' "$out/build.log" | grep -v 'Skipping BTF generation' | grep -q .; then
  cat "$out/build.log" >&2; echo "build-module: warnings above" >&2; exit 1
fi
test -f "$out/gpukmod.ko"
