#!/usr/bin/env bash
# Build the guest's initramfs for one cached kernel: busybox-static, the modules that
# 9p-over-virtio needs (decompressed: busybox insmod reads plain .ko), and an /init that
# mounts the host's / read-only over 9p and runs the script named by gs.script= inside it.
#   hack/kernel/initramfs.sh RELEASE OUT.cpio.gz
set -euo pipefail
rel="$1"; out="$2"
CACHE="${GPUSHARE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpushare}/kernel"
root="$CACHE/$rel/root"
stage="$(mktemp -d /tmp/gs-irfs-XXXX)"; trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,proc,sys,dev,host,modules}
cp /bin/busybox "$stage/bin/busybox"
: > "$stage/modules/order"
for mod in virtio_pci 9pnet_virtio 9p; do
  modprobe -d "$root" -S "$rel" --show-depends "$mod" | awk '$1 == "insmod" {print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
  name="$(basename "$ko")"; name="${name%.xz}"; name="${name%.zst}"
  case "$ko" in
    *.xz) xz -dc "$ko" > "$stage/modules/$name" ;;
    *.zst) zstd -qdc "$ko" > "$stage/modules/$name" ;;
    *) cp "$ko" "$stage/modules/$name" ;;
  esac
  echo "$name" >> "$stage/modules/order"
done
cat > "$stage/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules/order); do insmod "/modules/$m" || echo "gs-init: insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /host \
  || mount -t 9p -o trans=virtio,version=9p2000.L,ro hostroot /host \
  || { echo "gs-init: cannot mount the host root over 9p"; echo GS-EXIT=99; poweroff -f; }
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -t devtmpfs dev /host/dev
mount -t tmpfs -o mode=1777 tmpfs /host/run
mount -t tracefs tracefs /host/sys/kernel/tracing 2>/dev/null || true
# run-guest.sh --cgroup2: the unified hierarchy where every tool looks for it.
case " $(cat /proc/cmdline) " in
  *" gs.cgroup=v2 "*) mount -t cgroup2 cgroup2 /host/sys/fs/cgroup \
    || { echo "gs-init: cannot mount cgroup2"; echo GS-EXIT=99; poweroff -f; } ;;
esac
# Optional writable share for results (run-guest.sh adds it when GS_GUEST_OUT is set).
mkdir -p /host/run/gs-out && mount -t 9p -o trans=virtio,version=9p2000.L gsout /host/run/gs-out 2>/dev/null || true
script="$(sed -n 's/.*gs\.script=\([^ ]*\).*/\1/p' /proc/cmdline)"
echo "GS-BOOTED"  # the host retries a boot that dies before this line (not our code's fault)
chroot /host /bin/sh "$script"
echo "GS-EXIT=$?"
poweroff -f
INIT
chmod +x "$stage/init"
(cd "$stage" && find . | busybox cpio -o -H newc 2>/dev/null) | gzip -1 > "$out"
