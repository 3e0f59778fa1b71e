#!/usr/bin/env bash
# Build the pinned `helm` from the Go module proxy, cached per version (like hack/control-plane).
#
# Why: the chart tests (helm lint, helm template, the chart-driven e2e run) need helm, and release
# downloads (get.helm.sh, GitHub) are not reachable from CI; only Go and the module proxy are.
#
# Usage: hack/helm/build.sh    build if needed; the LAST line of stdout is the helm binary's path
#
# Environment:
#   GPUSLICE_CACHE_DIR   cache root (default: $HOME/.cache/gpuslice)
#
# `go install pkg@version` builds with the module's own go.mod and go.sum (checked against the Go
# checksum database), so the result is the released source. The version string that release
# builds get from ldflags is set the same way (helm's Makefile: -X .../internal/version.version).
set -euo pipefail

HELM_VERSION=v3.19.0
# The Kubernetes minor helm v3.19 is built against (its k8s.io modules are v0.34): release builds
# stamp it so `helm template` and `helm lint` assume a current cluster, not the source default 1.20.
K8S_MAJOR=1
K8S_MINOR=34
CACHE_ROOT=${GPUSLICE_CACHE_DIR:-$HOME/.cache/gpuslice}/helm
DEST=$CACHE_ROOT/helm-$HELM_VERSION
BIN=$DEST/bin/helm

log() { echo "helm/build.sh: $*" >&2; }

ok() {
    [[ -x $BIN ]] && [[ $("$BIN" version --template '{{.Version}}' 2>/dev/null) == "$HELM_VERSION" ]] &&
        "$BIN" template --help >/dev/null 2>&1 && [[ -f $DEST/k8s-$K8S_MAJOR.$K8S_MINOR ]]
}

if ! ok; then
    command -v go >/dev/null || { log "error: go not found in PATH"; exit 1; }
    mkdir -p "$CACHE_ROOT"
    exec 9>"$CACHE_ROOT/.lock"
    command -v flock >/dev/null && flock 9
    if ! ok; then
        log "building helm $HELM_VERSION from the Go module proxy (a few minutes, once)"
        tmp=$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")
        trap 'rm -rf "$tmp"' EXIT
        GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 GOBIN="$tmp/bin" \
            go install -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
                -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$K8S_MAJOR \
                -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$K8S_MINOR \
                -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$K8S_MAJOR \
                -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$K8S_MINOR" \
            "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
        rm -rf "$DEST"
        mkdir -p "$DEST"
        mv "$tmp/bin" "$DEST/bin"
        touch "$DEST/k8s-$K8S_MAJOR.$K8S_MINOR"
        ok || { log "error: built helm does not report $HELM_VERSION"; exit 1; }
    fi
fi
echo "$BIN"
