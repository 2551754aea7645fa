#!/usr/bin/env bash
# Install the real peers of the NRI integration tier (docs/testing-containerd.md):
#   - runc 1.1.5 and busybox-static from bookworm (system packages; the images are built from busybox)
#   - containerd 1.7.24 unpacked from the trixie .deb into $GPUSHARE_CACHE (never installed: its
#     dependencies would upgrade base packages)
#   - containerd 2.x (CONTAINERD2_VERSION) built with Go from github.com/containerd/containerd/v2,
#     plus a Go NRI device-injector plugin on the same upstream nri stub, for the benchmark
# Idempotent: each step checks its result first and says what it does. The Go step is skipped with a
# message (not an error) when Go or the module proxy is missing; the 2.x tests then skip with a reason.
#
#   hack/containerd/install.sh            # everything
#   hack/containerd/install.sh base       # runc, busybox, containerd 1.7.24 only
#   hack/containerd/install.sh go         # containerd 2.x and the Go plugin only
set -euo pipefail

CACHE="${GPUSHARE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpushare}"
CD1_VERSION="1.7.24~ds1-6+deb13u1"
CD2_VERSION="${CONTAINERD2_VERSION:-v2.4.2}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT_17="$CACHE/containerd/1.7.24"
ROOT_2="$CACHE/containerd/$CD2_VERSION"
APT_DIR="$CACHE/apt-trixie"

say() { echo "containerd-install: $*"; }
need_root() { [[ $(id -u) == 0 ]] || { say "must run as root (apt-get, and containerd itself)"; exit 1; }; }

apt_updated=0
bookworm_install() {  # $1 = package, installed from bookworm only (never trixie)
    if dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; then
        say "$1 already installed ($(dpkg-query -W -f='${Version}' "$1"))"
        return
    fi
    if [[ $apt_updated == 0 ]]; then say "apt-get update"; apt-get update -qq; apt_updated=1; fi
    say "installing $1 from bookworm"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm --no-install-recommends "$1"
}

install_base() {
    need_root
    bookworm_install runc
    bookworm_install busybox-static
    if [[ -x "$ROOT_17/usr/bin/containerd" && -x "$ROOT_17/usr/bin/containerd-shim-runc-v2" ]]; then
        say "containerd 1.7.24 already unpacked in $ROOT_17"
        return
    fi
    # A private apt state for trixie: its own sources list, lists and archive cache, so the machine's
    # apt configuration and package lists are left exactly as they are.
    mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/archives/partial" "$APT_DIR/debs"
    cat >"$APT_DIR/sources.list" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main
SRC
    local opts=(-o "Dir::Etc::SourceList=$APT_DIR/sources.list" -o "Dir::Etc::SourceParts=-"
        -o "Dir::State::Lists=$APT_DIR/lists" -o "Dir::Cache::Archives=$APT_DIR/archives"
        -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache=" -o "APT::Default-Release=" -o "APT::Sandbox::User=root")
    say "apt-get update (private trixie sources in $APT_DIR)"
    apt-get "${opts[@]}" update -qq
    say "downloading containerd=$CD1_VERSION from trixie"
    (cd "$APT_DIR/debs" && apt-get "${opts[@]}" download "containerd=$CD1_VERSION")
    rm -rf "$ROOT_17.tmp" && mkdir -p "$ROOT_17.tmp"
    dpkg-deb -x "$APT_DIR"/debs/containerd_*.deb "$ROOT_17.tmp"
    rm -rf "$ROOT_17" && mv "$ROOT_17.tmp" "$ROOT_17"
    say "unpacked: $("$ROOT_17/usr/bin/containerd" --version)"
}

install_go() {
    if ! command -v go >/dev/null; then
        say "SKIP containerd $CD2_VERSION: no Go toolchain on PATH (install Go >= 1.26 and rerun $0 go)"
        return 0
    fi
    local bin="$ROOT_2/bin"
    # The stamp names the inputs: a changed plugin source or build script rebuilds.
    local inputs
    inputs="$CD2_VERSION $(cat "$HERE/nri-device-injector/main.go" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"
    if [[ -x "$bin/containerd" && -x "$bin/ctr" && -x "$bin/containerd-shim-runc-v2" && -x "$bin/nri-device-injector" \
        && "$(cat "$bin/.inputs" 2>/dev/null)" == "$inputs" ]]; then
        say "containerd $CD2_VERSION already built in $bin"
        ln -sfn "$CD2_VERSION" "$CACHE/containerd/2.x"
        return 0
    fi
    # A throwaway module in the cache requiring the upstream module; only our own main.go is copied in.
    local src="$ROOT_2/src"
    mkdir -p "$src/cmd/nri-device-injector" "$bin"
    cp "$HERE/nri-device-injector/main.go" "$src/cmd/nri-device-injector/main.go"
    if [[ ! -f "$src/go.mod" ]]; then
        (cd "$src" && go mod init gpushare.local/containerd-build >/dev/null 2>&1)
    fi
    say "resolving github.com/containerd/containerd/v2@$CD2_VERSION through $(go env GOPROXY)"
    local mod=github.com/containerd/containerd/v2
    if ! (cd "$src" && go get "$mod/cmd/containerd@$CD2_VERSION" "$mod/cmd/ctr@$CD2_VERSION" \
        "$mod/cmd/containerd-shim-runc-v2@$CD2_VERSION"); then
        say "SKIP containerd $CD2_VERSION: the Go module proxy did not serve it (see the error above)"
        return 0
    fi
    local start=$SECONDS
    local ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$CD2_VERSION"
    say "building containerd, ctr, containerd-shim-runc-v2, nri-device-injector (nice, -trimpath, CGO off)"
    (cd "$src" && CGO_ENABLED=0 nice -n 10 go build -mod=mod -trimpath -tags no_btrfs -ldflags "$ldflags" -o "$bin/" \
        "$mod/cmd/containerd" "$mod/cmd/ctr" "$mod/cmd/containerd-shim-runc-v2" \
        ./cmd/nri-device-injector)
    echo "$inputs" >"$bin/.inputs"
    ln -sfn "$CD2_VERSION" "$CACHE/containerd/2.x"
    say "built in $((SECONDS - start)) s: $("$bin/containerd" --version)"
}

case "${1:-all}" in
base) install_base ;;
go) install_go ;;
all) install_base; install_go ;;
*) echo "usage: $0 [all|base|go]" >&2; exit 2 ;;
esac
