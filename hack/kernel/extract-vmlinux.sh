#!/usr/bin/env bash
# Print the uncompressed ELF vmlinux inside a bzImage (QEMU boots it through PVH, which is
# faster than the bzImage's own decompressor under TCG). Tries each compressor's magic at
# every offset where it appears until one yields an ELF file.
set -euo pipefail
img="$1"
tmp="$(mktemp -d /tmp/gs-vmlx-XXXX)"; trap 'rm -rf "$tmp"' EXIT
try() {  # $1 = magic as printf escapes, $2.. = decompress command reading stdin
  local magic="$1"; shift
  local off
  for off in $(LC_ALL=C grep -abo "$(printf "$magic")" "$img" 2>/dev/null | cut -d: -f1); do
    tail -c +"$((off + 1))" "$img" | "$@" > "$tmp/out" 2>/dev/null || true
    if [ "$(head -c 4 "$tmp/out" | od -An -tx1 | tr -d ' \n')" = "7f454c46" ]; then
      cat "$tmp/out"; return 0
    fi
  done
  return 1
}
try '\375\067\172\130\132\000' xz -dc && exit 0
try '\050\265\057\375' zstd -dc && exit 0
try '\037\213\010' gzip -dc && exit 0
try '\002\041\114\030' lz4 -dc && exit 0
echo "extract-vmlinux: no known compressed ELF inside $img" >&2
exit 1
