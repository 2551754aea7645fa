#!/usr/bin/env bash
# Fetch the two Debian kernels the QEMU tier boots (docs/gpukmod.md, "Tests"):
#   6.1  bookworm            linux-image-6.1.0-50-amd64           (no IBT)
#   6.12 bookworm-backports  linux-image-6.12.95+deb12-amd64      (CONFIG_X86_KERNEL_IBT=y)
# with their headers, unpacked (never installed: installing pulls initramfs-tools and a
# systemd upgrade) under $GPUSHARE_CACHE/kernel/<release>/root. Also installs the host
# tools: qemu-system-x86, busybox-static, kmod, dwarves (pahole, needed for 6.12 BTF).
# Idempotent: a finished release leaves a .done stamp and is skipped next time.
set -euo pipefail

CACHE="${GPUSHARE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpushare}/kernel"
# release -> "suite image-version kbuild-package"
declare -A KERNELS=(
  [6.1.0-50-amd64]="bookworm 6.1.0-50 linux-kbuild-6.1"
  [6.12.95+deb12-amd64]="bookworm-backports 6.12.95+deb12 linux-kbuild-6.12.95+deb12"
)
RELEASES="${GPUSHARE_KERNELS:-6.1.0-50-amd64 6.12.95+deb12-amd64}"

host_tools() {
  local missing=()
  command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
  [ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx modprobe || missing+=(busybox-static)
  command -v modinfo >/dev/null || missing+=(kmod)
  command -v pahole >/dev/null || missing+=(dwarves)
  command -v gcc >/dev/null || missing+=(gcc)
  command -v make >/dev/null || missing+=(make)
  command -v bc >/dev/null || missing+=(bc)
  dpkg -s libelf-dev >/dev/null 2>&1 || missing+=(libelf-dev)
  command -v xz >/dev/null || missing+=(xz-utils)      # 6.12's modules are .ko.xz
  command -v zstd >/dev/null || missing+=(zstd)         # 6.12's vmlinuz is zstd-compressed
  perl -MTerm::ANSIColor -e1 2>/dev/null || missing+=(perl)  # checkpatch.pl
  command -v unshare >/dev/null || missing+=(util-linux)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "kernel: installing host tools: ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q -t bookworm --no-install-recommends "${missing[@]}"
  fi
}

# A private apt configuration, so the machine's sources are never edited.
APT_DIR="$CACHE/apt"
apt_private() {
  apt-get -q -o Dir::Etc::SourceList="$APT_DIR/sources.list" -o Dir::Etc::SourceParts=- \
    -o Dir::State::Lists="$APT_DIR/lists" -o Dir::Cache="$APT_DIR/cache" \
    -o Debug::NoLocking=1 -o APT::Sandbox::User=root "$@"
}
apt_setup() {
  mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial"
  cat > "$APT_DIR/sources.list" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
SRC
  if [ ! -f "$APT_DIR/lists/.updated" ] || [ -n "$(find "$APT_DIR/lists/.updated" -mmin +1440)" ]; then
    apt_private update
    touch "$APT_DIR/lists/.updated"
  fi
}

fetch_release() {
  local rel="$1"
  local spec="${KERNELS[$rel]:-}"
  [ -n "$spec" ] || { echo "kernel: unknown release $rel (known: ${!KERNELS[*]})" >&2; exit 2; }
  local dir="$CACHE/$rel"
  [ -f "$dir/.done" ] && { echo "kernel: $rel cached in $dir"; return 0; }
  read -r suite ver kbuild <<<"$spec"
  local common="linux-headers-${ver}-common"
  local pkgs=("linux-image-${rel}/${suite}" "linux-headers-${rel}/${suite}" "${common}/${suite}" "${kbuild}/${suite}")
  rm -rf "$dir"; mkdir -p "$dir/debs" "$dir/root"
  (cd "$dir/debs" && apt_private download "${pkgs[@]}")
  for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dir/root"; done
  local build="$dir/root/usr/src/linux-headers-$rel"
  # The headers' Makefile includes the common tree by absolute path; point it into the cache.
  sed -i "s#/usr/src/#$dir/root/usr/src/#g" "$build/Makefile"
  # The image package's vmlinuz is a bzImage; QEMU's PVH boot wants the uncompressed ELF.
  bash "$(dirname "$0")/extract-vmlinux.sh" "$dir/root/boot/vmlinuz-$rel" > "$dir/vmlinux"
  # modules.dep is made at install time, which we skip; the initramfs needs it.
  depmod -b "$dir/root" "$rel"
  touch "$dir/.done"
  echo "kernel: $rel ready in $dir"
}

# checkpatch.pl is not packaged on its own: take it (and the two data files it reads) out of
# Debian's linux-source-6.1 tarball, so `make test` can hold the module to kernel style.
fetch_checkpatch() {
  local dir="$CACHE/checkpatch"
  [ -f "$dir/.done" ] && return 0
  rm -rf "$dir"; mkdir -p "$dir/debs"
  (cd "$dir/debs" && apt_private download linux-source-6.1/bookworm-security)
  dpkg-deb --fsys-tarfile "$dir"/debs/linux-source-6.1_*.deb \
    | tar -xO ./usr/src/linux-source-6.1.tar.xz \
    | tar -xJ -C "$dir" --strip-components=1 linux-source-6.1/scripts/checkpatch.pl \
        linux-source-6.1/scripts/spelling.txt linux-source-6.1/scripts/const_structs.checkpatch
  rm -rf "$dir/debs"
  touch "$dir/.done"
  echo "kernel: checkpatch.pl ready in $dir/scripts"
}

host_tools
apt_setup
for rel in $RELEASES; do fetch_release "$rel"; done
fetch_checkpatch
