#!/usr/bin/env bash
# Build helm from its Go module into $GPUSHARE_CACHE/helm/<version>/bin/helm (no release download:
# only the Go module proxy is reachable). The chart in manifests/chart/ is linted and rendered with it.
# Idempotent: a present binary that reports the wanted version is kept.
#
#   hack/image/install-helm.sh            # prints the binary's path on the last line
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-$(cat "$(dirname "${BASH_SOURCE[0]}")/helm-version")}"
CACHE="${GPUSHARE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpushare}"
BIN="$CACHE/helm/$HELM_VERSION/bin"

say() { echo "helm-install: $*" >&2; }

if [[ -x "$BIN/helm" && "$("$BIN/helm" version --template '{{.Version}}' 2>/dev/null)" == "$HELM_VERSION" ]]; then
    say "helm $HELM_VERSION already built in $BIN"
    echo "$BIN/helm"
    exit 0
fi
command -v go >/dev/null || { say "go is required (Go >= 1.24 on PATH)"; exit 1; }
mkdir -p "$BIN"
start=$SECONDS
say "building helm.sh/helm/v4/cmd/helm@$HELM_VERSION (nice, -trimpath, CGO off; about 3 min on 2 cores)"
# GOBIN into a temporary dir, moved into place at the end: an interrupted build leaves no half binary.
tmp="$(mktemp -d "$BIN/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
# The release build stamps its version the same way; without it `helm version` says only "v4.3".
ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
GOBIN="$tmp" CGO_ENABLED=0 nice -n 10 go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
mv "$tmp/helm" "$BIN/helm"
say "built in $((SECONDS - start)) s: $("$BIN/helm" version --short)"
echo "$BIN/helm"
