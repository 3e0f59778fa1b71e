#!/usr/bin/env bash
# Build what a real test node runs that no Debian package ships: kubelet and kube-proxy (same pinned
# Kubernetes version and wrapper module as the control plane, hack/control-plane/k8s), the
# sandbox's pause binary (pause.c, static), and kube-controller-manager, which a cluster with real
# nodes needs for its workload controllers (Deployments, DaemonSets, disruption budgets, endpoint
# slices, service accounts). Cached per version like the control plane; the LAST line of stdout is
# the bin dir holding `kubelet`, `kube-proxy`, `kube-controller-manager` and `pause`.
#
# Environment: GPUSLICE_CACHE_DIR (default $HOME/.cache/gpuslice), GPUSLICE_BUILD_JOBS (default 2).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CP=$HERE/../control-plane
# shellcheck source=../control-plane/versions.env
source "$CP/versions.env"
# shellcheck source=../control-plane/k8s-ldflags.sh
source "$CP/k8s-ldflags.sh"
: "${K8S_VERSION:?versions.env must set K8S_VERSION}"

CACHE_ROOT=${GPUSLICE_CACHE_DIR:-$HOME/.cache/gpuslice}/node
PAUSE_SUM=$(sha256sum "$HERE/pause.c" | cut -c1-12)
NAME=node-${K8S_VERSION}-pause-${PAUSE_SUM}
DEST=$CACHE_ROOT/$NAME
BIN=$DEST/bin
JOBS=${GPUSLICE_BUILD_JOBS:-2}

log() { echo "node/build.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

export GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0

binaries_ok() {
    local out
    local b
    [[ -x $BIN/pause ]] || return 1
    for b in kubelet kube-proxy kube-controller-manager; do
        [[ -x $BIN/$b ]] || return 1
        out=$("$BIN/$b" --version 2>/dev/null) && [[ $out == "Kubernetes $K8S_VERSION" ]] || return 1
    done
}

build() {
    command -v go >/dev/null || die "go not found in PATH"
    command -v gcc >/dev/null || die "gcc not found (hack/node/install.sh installs it)"
    grep -q "k8s.io/kubernetes/cmd/kube-controller-manager" "$CP/k8s/go.mod" ||
        die "hack/control-plane/k8s/go.mod lacks the node tools; run hack/control-plane/build.sh --regen"
    local tmp start ldf
    start=$SECONDS
    tmp=$(mktemp -d "$CACHE_ROOT/.tmp-$NAME-XXXXXX")
    # shellcheck disable=SC2064  # expand now: the trap must remove this very directory
    trap "rm -rf '$tmp'" EXIT
    log "building $NAME with $(go version | cut -d' ' -f3) (-p $JOBS)"
    ldf=$(k8s_ldflags "$CP/k8s" "$K8S_VERSION")
    mkdir -p "$tmp/bin"
    (cd "$CP/k8s" && go build -p "$JOBS" -trimpath -ldflags "$ldf" -o "$tmp/bin/" \
        k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kube-controller-manager)
    gcc -static -Os -s -o "$tmp/bin/pause" "$HERE/pause.c"
    local old_bin=$BIN
    BIN=$tmp/bin
    binaries_ok || die "freshly built binaries do not report $K8S_VERSION"
    BIN=$old_bin
    mkdir -p "$DEST"
    if [[ -e $BIN ]]; then mv -T "$BIN" "$tmp/stale-bin"; fi
    mv -T "$tmp/bin" "$BIN"
    log "build time: $((SECONDS - start)) s"
}

mkdir -p "$CACHE_ROOT"
if ! binaries_ok; then
    if command -v flock >/dev/null; then
        exec 9>"$CACHE_ROOT/.$NAME.lock"
        flock -n 9 || { log "waiting for another build (lock $CACHE_ROOT/.$NAME.lock)"; flock 9; }
    fi
    binaries_ok || build
fi
echo "$BIN"
