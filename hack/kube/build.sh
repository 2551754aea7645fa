#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kubectl (or only the
# commands $KUBE_COMMANDS names) from the module k8s.io/kubernetes, cached under
# $GPUSHARE_CACHE/kube/<version>/bin.
#
# k8s.io/kubernetes is not meant to be a dependency: its go.mod requires every staging module
# (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and replaces them with ./staging/src/...,
# which Go ignores outside the main module. So a throwaway main module in the cache requires
# one release and replaces each staging module with the matching published release
# (k8s.io/api v0.34.4 for v1.34.4). The list of staging modules is read from that release's
# own go.mod, so a new version needs no edit here.
#
# Idempotent: a complete bin/ with a stamp is reused. Safe on a fresh Debian 12 with Go on PATH.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.34.4}"
CACHE="${GPUSHARE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpushare}"
DEST="$CACHE/kube/$KUBE_VERSION"
BIN="$DEST/bin"
STAMP="$BIN/.complete"
read -r -a CMDS <<<"${KUBE_COMMANDS:-kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl}"

cached=1
for c in "${CMDS[@]}"; do [[ -x "$BIN/$c" ]] || cached=0; done
if [[ -f "$STAMP" && $cached == 1 ]]; then
    echo "kube $KUBE_VERSION: ${CMDS[*]} cached in $BIN"
    exit 0
fi

command -v go >/dev/null || { echo "go is required (Go >= 1.24 on PATH)" >&2; exit 1; }

MOD="$DEST/mod"
mkdir -p "$MOD" "$BIN"
cd "$MOD"

# The staging release tag is v0.<minor>.<patch> for kubernetes v1.<minor>.<patch>.
STAGING_VERSION="v0.${KUBE_VERSION#v1.}"

GOFLAGS=-mod=mod go mod download "k8s.io/kubernetes@$KUBE_VERSION"
UPSTREAM_MOD="$(GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
    sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')"
[[ -f "$UPSTREAM_MOD" ]] || { echo "cannot find go.mod of k8s.io/kubernetes@$KUBE_VERSION" >&2; exit 1; }
mapfile -t STAGING < <(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$UPSTREAM_MOD")
[[ ${#STAGING[@]} -gt 0 ]] || { echo "no staging replaces found in $UPSTREAM_MOD" >&2; exit 1; }

GO_LINE="$(awk '$1 == "go" {print $2; exit}' "$UPSTREAM_MOD")"
{
    echo "module gpushare.local/kubebuild"
    echo
    echo "go $GO_LINE"
    echo
    # Same runtime defaults the release itself is built with.
    grep -E '^godebug ' "$UPSTREAM_MOD" || true
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    echo "replace ("
    for m in "${STAGING[@]}"; do
        echo "	$m => $m $STAGING_VERSION"
    done
    echo ")"
} >go.mod

# A blank import per command keeps `go mod tidy` from dropping what `go build` needs.
{
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for c in "${CMDS[@]}"; do
        echo "	_ \"k8s.io/kubernetes/cmd/$c\""
    done
    echo ")"
} >tools.go

echo "kube $KUBE_VERSION: resolving modules (${#STAGING[@]} staging modules at $STAGING_VERSION)"
GOFLAGS=-mod=mod go mod tidy -e
echo "kube $KUBE_VERSION: building ${CMDS[*]}"
start=$(date +%s)
pkgs=()
for c in "${CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
# One invocation for all commands: shared packages compile once. nice: the machine is shared.
# The version stamp is what `kubectl version` and the Node object report (v0.0.0 otherwise).
minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
V=k8s.io/component-base/version
LDFLAGS="-s -w -X $V.gitVersion=$KUBE_VERSION -X $V.gitMajor=1 -X $V.gitMinor=$minor"
LDFLAGS+=" -X $V.gitTreeState=clean -X $V.buildDate=$(date -u +%FT%TZ)"
CGO_ENABLED=0 GOFLAGS=-mod=mod nice -n 10 go build -trimpath -ldflags "$LDFLAGS" -o "$BIN/" "${pkgs[@]}"
end=$(date +%s)
for c in "${CMDS[@]}"; do [[ -x "$BIN/$c" ]] || { echo "missing $BIN/$c" >&2; exit 1; }; done
echo "$KUBE_VERSION (${CMDS[*]}) built in $((end - start)) s on $(date -u +%FT%TZ)" >"$STAMP"
cat "$STAMP"
