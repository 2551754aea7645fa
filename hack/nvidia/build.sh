#!/usr/bin/env bash
# Build NVIDIA's own user space from their Go modules into $GPUSHARE_CACHE/nvidia (docs/fakenvidia.md):
#   k8s-device-plugin/<version>/bin/nvidia-device-plugin
#   container-toolkit/<version>/bin/nvidia-ctk, nvidia-container-runtime, nvidia-cdi-hook,
#                                   nvidia-container-runtime-hook
# The tests run them unmodified against fakenvidia's mock NVML and fake driver root.
#
# Sources come as Go modules through the configured module proxy (`go install <pkg>@<version>`):
# the tagged module's own go.mod is the main module, so every dependency is the version NVIDIA
# released with. The device plugin's module vendors its dependencies, but module zips leave vendor/
# out, so they are fetched through the proxy too, pinned by the module's go.sum.
#
# Both need cgo: go-nvml dlopens libnvidia-ml.so.1 and calls NVML through C stubs whose symbols are
# resolved only at run time, hence the same external link flags as NVIDIA's Makefiles
# (--unresolved-symbols=ignore-in-object-files); a plain `go build` fails to link. The version is
# stamped into internal/info as their Makefiles do (the plugin's with its v, the toolkit's without),
# so `--version` says what NVIDIA's release binaries say, less the git commit a module zip lacks.
#
# nvidia-container-runtime-hook is built because the runtime's legacy mode puts it into the OCI spec
# as a prestart hook; legacy mode also needs nvidia-container-cli (libnvidia-container, C, not a Go
# module) and is not built here. The runtime's default mode in 1.20 is jit-cdi, which needs only
# nvidia-cdi-hook (and the runtime itself); `cdi` mode the same.
#
# Idempotent: a bin/ whose stamp names the same inputs (version, commands, flags) is reused; a build
# goes into a temporary dir moved into place at the end, so an interrupted one leaves nothing half-made.
#
#   hack/nvidia/build.sh [all|device-plugin|toolkit]
set -euo pipefail

DEVICE_PLUGIN_VERSION="${NVIDIA_DEVICE_PLUGIN_VERSION:-v0.17.4}"
TOOLKIT_VERSION="${NVIDIA_CTK_VERSION:-v1.20.2}"
CACHE="${GPUSHARE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpushare}"

say() { echo "nvidia-build: $*" >&2; }
die() { say "error: $*"; exit 1; }

# build NAME MODULE VERSION STAMPED_VERSION DEST EXTLDFLAGS CMD...
build() {
    local name="$1" module="$2" version="$3" stamped="$4" dest="$5" extldflags="$6"
    shift 6
    local cmds=("$@")
    local bin="$dest/bin" stamp="$dest/bin/.complete"
    local ldflags="-s -w '-extldflags=$extldflags' -X $module/internal/info.version=$stamped"
    local inputs="$module@$version ${cmds[*]} $ldflags"
    if [[ -f "$stamp" && "$(head -n1 "$stamp")" == "$inputs" ]]; then
        local c ok=1
        for c in "${cmds[@]}"; do [[ -x "$bin/$c" ]] || ok=0; done
        if [[ $ok == 1 ]]; then
            say "$name $version: cached in $bin"
            return 0
        fi
    fi
    command -v go >/dev/null || die "go is required on PATH to build $name $version (Go >= 1.26 for the toolkit 1.20)"
    command -v "$(go env CC)" >/dev/null || die "a C compiler ($(go env CC)) is required: $name is built with cgo"

    mkdir -p "$dest"
    local tmp
    tmp="$(mktemp -d "$dest/.build.XXXXXX")"
    # shellcheck disable=SC2064 # expand now: tmp is local to this call
    trap "rm -rf '$tmp'" EXIT
    local pkgs=() c
    for c in "${cmds[@]}"; do pkgs+=("$module/cmd/$c@$version"); done
    say "$name $version: building ${cmds[*]} through $(go env GOPROXY) (nice, -trimpath, cgo)"
    local start=$SECONDS
    # One `go install` for all commands of a module: the packages they share compile once.
    # -Wno-deprecated-declarations: go-nvml's cgo stubs call every NVML function, the ones nvml.h
    # marks deprecated too; each would print a warning into `make deps`, and none matters here.
    if ! GOBIN="$tmp" CGO_ENABLED=1 CGO_CFLAGS="$(go env CGO_CFLAGS) -Wno-deprecated-declarations" nice -n 10 \
        go install -trimpath -ldflags "$ldflags" "${pkgs[@]}"; then
        die "$name $version: go install failed (see above); the module proxy must serve $module@$version and its dependencies"
    fi
    for c in "${cmds[@]}"; do [[ -x "$tmp/$c" ]] || die "$name $version: go install made no $c"; done
    local seconds=$((SECONDS - start))
    rm -rf "$bin"
    mkdir -p "$bin"
    for c in "${cmds[@]}"; do mv "$tmp/$c" "$bin/$c"; done
    { echo "$inputs"; echo "built in $seconds s on $(date -u +%FT%TZ) with $(go env GOVERSION)"; } >"$stamp"
    rm -rf "$tmp"
    trap - EXIT
    say "$name $version: built in $seconds s into $bin"
}

device_plugin() {
    build k8s-device-plugin github.com/NVIDIA/k8s-device-plugin "$DEVICE_PLUGIN_VERSION" "$DEVICE_PLUGIN_VERSION" \
        "$CACHE/nvidia/k8s-device-plugin/$DEVICE_PLUGIN_VERSION" \
        "-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files" \
        nvidia-device-plugin
    "$CACHE/nvidia/k8s-device-plugin/$DEVICE_PLUGIN_VERSION/bin/nvidia-device-plugin" --version | head -n1 >&2
}

toolkit() {
    build nvidia-container-toolkit github.com/NVIDIA/nvidia-container-toolkit "$TOOLKIT_VERSION" "${TOOLKIT_VERSION#v}" \
        "$CACHE/nvidia/container-toolkit/$TOOLKIT_VERSION" \
        "-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files -Wl,-z,lazy" \
        nvidia-ctk nvidia-container-runtime nvidia-cdi-hook nvidia-container-runtime-hook
    "$CACHE/nvidia/container-toolkit/$TOOLKIT_VERSION/bin/nvidia-ctk" --version | head -n1 >&2
}

case "${1:-all}" in
device-plugin) device_plugin ;;
toolkit) toolkit ;;
all) device_plugin; toolkit ;;
*) echo "usage: $0 [all|device-plugin|toolkit]" >&2; exit 2 ;;
esac
