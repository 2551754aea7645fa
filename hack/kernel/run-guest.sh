#!/usr/bin/env bash
# Boot one cached kernel under QEMU (TCG: /dev/kvm on this machine kind cannot boot Debian
# kernels) with the host's / read-only over 9p, run SCRIPT (a host path) inside, and exit
# with the script's exit code. The console goes to stdout.
#   [GS_GUEST_OUT=DIR] hack/kernel/run-guest.sh [--cgroup2] RELEASE SCRIPT [TIMEOUT_S]
# --cgroup2 boots with every v1 controller off (cgroup_no_v1=all) and has /init mount the
# unified hierarchy at /sys/fs/cgroup, the way a systemd-era node is set up; without it the
# guest has no cgroup mount at all.
set -euo pipefail
cmdline="console=ttyS0 panic=-1 oops=panic loglevel=4"
if [ "${1:-}" = "--cgroup2" ]; then cmdline+=" cgroup_no_v1=all gs.cgroup=v2"; shift; fi
rel="$1"; script="$2"; timeout_s="${3:-600}"
here="$(cd "$(dirname "$0")" && pwd)"
CACHE="${GPUSHARE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpushare}/kernel"
vmlinux="$CACHE/$rel/vmlinux"
[ -f "$vmlinux" ] || { echo "run-guest: $vmlinux missing; run make kernels" >&2; exit 2; }
initrd="$CACHE/$rel/initramfs.cpio.gz"
if [ ! -f "$initrd" ] || [ "$here/initramfs.sh" -nt "$initrd" ]; then
  tmp="$(mktemp "$initrd.XXXX")"  # private name: two checkouts may boot the same kernel at once
  bash "$here/initramfs.sh" "$rel" "$tmp" || { rm -f "$tmp"; echo "run-guest: initramfs build failed" >&2; exit 2; }
  mv "$tmp" "$initrd"
fi
extra=()
if [ -n "${GS_GUEST_OUT:-}" ]; then  # a writable host folder, at /run/gs-out in the guest
  extra+=(-virtfs "local,path=$GS_GUEST_OUT,mount_tag=gsout,security_model=none")
fi
log="$(mktemp /tmp/gs-console-XXXX.log)"; trap 'rm -f "$log"' EXIT
# One vCPU: with several, TCG occasionally trips over the kernel's own int3-based text
# patching while booting a busy host (an "Oops: int3" in early boot, before any test code),
# and a second vCPU buys nothing on this 2-core machine kind.
timeout --foreground -k 5 "$timeout_s" qemu-system-x86_64 -accel tcg -cpu max -smp 1 -m 1536 \
  -nodefaults -no-reboot -display none -serial stdio \
  -kernel "$vmlinux" -initrd "$initrd" \
  -append "$cmdline gs.script=$script" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap "${extra[@]}" \
  | tee "$log" || true
rc="$(sed -n 's/^GS-EXIT=\([0-9]*\).*/\1/p' "$log" | tr -d '\r' | tail -1)"
[ -n "$rc" ] || { echo "run-guest: the guest did not report an exit code (crash or timeout)" >&2; exit 98; }
exit "$rc"
