#!/usr/bin/env bash
# Unpack etcd from Debian trixie's etcd-server package into $GPUSHARE_CACHE/etcd/<version>/.
#
# Bookworm's etcd (3.4) is older than kube-apiserver 1.34 supports; trixie's 3.5 Go binary
# runs on bookworm's libc. The machine's apt configuration is not touched: a private sources
# list and private apt state directories are used, and the package is unpacked, not installed.
set -euo pipefail

CACHE="${GPUSHARE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpushare}"
APT="$CACHE/apt-trixie-kube"
OUT="$CACHE/etcd"

# The harness also needs openssl (certificates), iproute2 (pod netns) and util-linux (nsenter,
# unshare, mount). Debian images ship them; a minimal one may not.
missing=()
command -v openssl >/dev/null || missing+=(openssl)
command -v ip >/dev/null || missing+=(iproute2)
command -v nsenter >/dev/null || missing+=(util-linux)
if [ ${#missing[@]} -gt 0 ]; then
    echo "kube-deps: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm --no-install-recommends "${missing[@]}"
fi

if compgen -G "$OUT/*/usr/bin/etcd" >/dev/null; then
    echo "etcd: cached in $(dirname "$(compgen -G "$OUT/*/usr/bin/etcd" | head -1)")"
    exit 0
fi

mkdir -p "$APT/lists/partial" "$APT/archives/partial" "$APT/dl" "$OUT"
cat >"$APT/sources.list" <<'EOF'
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main
EOF
opts=(
    -o "Dir::Etc::SourceList=$APT/sources.list" -o "Dir::Etc::SourceParts=-"
    -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache::Archives=$APT/archives"
    -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
    -o "APT::Default-Release=trixie" -o "APT::Sandbox::User=root"
)
apt-get "${opts[@]}" update -qq
cd "$APT/dl"
rm -f etcd-server_*.deb
apt-get "${opts[@]}" download etcd-server
deb="$(ls etcd-server_*.deb)"
version="$(dpkg-deb -f "$deb" Version)"
dest="$OUT/$version"
rm -rf "$dest.tmp"
dpkg-deb -x "$deb" "$dest.tmp"
"$dest.tmp/usr/bin/etcd" --version >/dev/null
mv "$dest.tmp" "$dest"
echo "etcd: $version unpacked in $dest"
