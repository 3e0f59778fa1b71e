#!/usr/bin/env bash
# Build etcd, kube-apiserver and kube-scheduler from the Go module proxy, cached per version.
#
# Why: gpuslice's integration/e2e tests run a real control plane as plain processes, and no
# package manager ships these binaries; release downloads (dl.k8s.io, GitHub) are not reachable
# from CI. Only a Go toolchain and the module proxy are needed.
#
# Usage:
#   hack/control-plane/build.sh          build if needed; the LAST line of stdout is the bin dir
#   hack/control-plane/build.sh --regen  rewrite k8s/go.mod and etcd/go.mod (+go.sum) from
#                                        versions.env (needs the module proxy), then build
#
# Environment:
#   GPUSLICE_CACHE_DIR   cache root (default: $HOME/.cache/gpuslice)
#   GPUSLICE_BUILD_JOBS  `go build -p` (default: 2; linking kube-apiserver needs ~2-3 GiB per job)
#
# Output: $GPUSLICE_CACHE_DIR/control-plane/k8s-$K8S_VERSION-etcd-$ETCD_VERSION/bin/{etcd,
# kube-apiserver,kube-scheduler}. The binaries are built in a temporary directory next to it and
# renamed into place at the end, so an interrupted build never leaves a half-filled bin dir.
# Concurrent callers (e.g. pytest-xdist workers) serialise on a lock file when flock(1) exists.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$HERE/versions.env"
# shellcheck source=k8s-ldflags.sh
source "$HERE/k8s-ldflags.sh"
: "${K8S_VERSION:?versions.env must set K8S_VERSION}" "${ETCD_VERSION:?versions.env must set ETCD_VERSION}"

CACHE_ROOT=${GPUSLICE_CACHE_DIR:-$HOME/.cache/gpuslice}/control-plane
NAME=k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}
DEST=$CACHE_ROOT/$NAME
BIN=$DEST/bin
JOBS=${GPUSLICE_BUILD_JOBS:-2}

STAGING_VERSION=v0.${K8S_VERSION#v1.}   # published tag of every staging module (v1.34.4 -> v0.34.4)

log() { echo "build.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

# The wrapper modules live in the repo; never let a go.work or the caller's GOFLAGS change them.
export GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0

# binaries_ok: all three present and reporting the pinned versions.
binaries_ok() {
    local out
    [[ -x $BIN/etcd && -x $BIN/kube-apiserver && -x $BIN/kube-scheduler ]] || return 1
    out=$("$BIN/kube-apiserver" --version 2>/dev/null) && [[ $out == "Kubernetes $K8S_VERSION" ]] || return 1
    out=$("$BIN/kube-scheduler" --version 2>/dev/null) && [[ $out == "Kubernetes $K8S_VERSION" ]] || return 1
    out=$("$BIN/etcd" --version 2>/dev/null) && [[ $out == *"etcd Version: ${ETCD_VERSION#v}"* ]] || return 1
}

# mod_file PATH@VERSION: path of that module's go.mod in the module cache (downloads it).
mod_file() {
    go mod download -json "$1" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p'
}

# go_directive GOMOD: the `go` line of a go.mod.
go_directive() { awk '$1 == "go" {print $2; exit}' "$1"; }

regen() {
    command -v go >/dev/null || die "go not found in PATH"
    local gomod m
    log "regenerating wrapper modules for kubernetes $K8S_VERSION, etcd $ETCD_VERSION"
    (
        cd "$HERE/k8s"
        export GOFLAGS="-mod=mod -buildvcs=false"
        gomod=$(mod_file "k8s.io/kubernetes@$K8S_VERSION")
        [[ -s $gomod ]] || die "cannot download k8s.io/kubernetes@$K8S_VERSION"
        rm -f go.mod go.sum
        go mod init gpuslice.local/hack/control-plane/k8s 2>/dev/null
        go mod edit -go="$(go_directive "$gomod")"
        # Every staging module: required at v0.0.0 and/or replaced by ./staging/src/... upstream.
        {
            awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$gomod"
            awk '$1 ~ /^k8s\.io\// && $2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$gomod"
        } | sort -u | while read -r m; do
            go mod edit -replace="$m=$m@$STAGING_VERSION"
        done
        # kubelet, kube-proxy and kube-controller-manager share the module (hack/node/build.sh
        # builds them for the real-node tiers)
        go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" \
            "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" "k8s.io/kubernetes/cmd/kubelet@$K8S_VERSION" \
            "k8s.io/kubernetes/cmd/kube-proxy@$K8S_VERSION" \
            "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION"
        go mod tidy
    )
    (
        cd "$HERE/etcd"
        export GOFLAGS="-mod=mod -buildvcs=false"
        gomod=$(mod_file "go.etcd.io/etcd/server/v3@$ETCD_VERSION")
        [[ -s $gomod ]] || die "cannot download go.etcd.io/etcd/server/v3@$ETCD_VERSION"
        rm -f go.mod go.sum
        go mod init gpuslice.local/hack/control-plane/etcd 2>/dev/null
        go mod edit -go="$(go_directive "$gomod")"
        go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
        go mod tidy
    )
    log "regenerated; commit hack/control-plane/{k8s,etcd}/go.{mod,sum}"
}

check_pins() {
    grep -Eq "^[[:space:]]*(require[[:space:]]+)?k8s\.io/kubernetes $K8S_VERSION( |$)" "$HERE/k8s/go.mod" ||
        die "k8s/go.mod does not require k8s.io/kubernetes $K8S_VERSION (versions.env changed?); run $0 --regen"
    grep -Eq "^[[:space:]]*(require[[:space:]]+)?go\.etcd\.io/etcd/server/v3 $ETCD_VERSION( |$)" "$HERE/etcd/go.mod" ||
        die "etcd/go.mod does not require go.etcd.io/etcd/server/v3 $ETCD_VERSION (versions.env changed?); run $0 --regen"
}

build() {
    command -v go >/dev/null || die "go not found in PATH (need Go >= the wrapper modules' go lines)"
    check_pins
    local tmp start ldf_k8s ldf_etcd
    start=$SECONDS
    tmp=$(mktemp -d "$CACHE_ROOT/.tmp-$NAME-XXXXXX")
    # shellcheck disable=SC2064  # expand now: the trap must remove this very directory
    trap "rm -rf '$tmp'" EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    log "building $NAME with $(go version | cut -d' ' -f3) (-p $JOBS); a cold build (empty GOCACHE) takes ~5-20 min on 2 cores"

    ldf_k8s=$(k8s_ldflags "$HERE/k8s" "$K8S_VERSION")
    ldf_etcd="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION"

    mkdir -p "$tmp/bin"
    (cd "$HERE/etcd" && go build -p "$JOBS" -trimpath -ldflags "$ldf_etcd" \
        -o "$tmp/bin/etcd" go.etcd.io/etcd/server/v3)
    log "etcd built after $((SECONDS - start)) s"
    (cd "$HERE/k8s" && go build -p "$JOBS" -trimpath -ldflags "$ldf_k8s" \
        -o "$tmp/bin/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler)

    # Verify before publishing; then swap the whole bin dir in with one rename.
    local old_bin=$BIN
    BIN=$tmp/bin
    binaries_ok || die "freshly built binaries do not report $K8S_VERSION / $ETCD_VERSION"
    BIN=$old_bin
    mkdir -p "$DEST"
    if [[ -e $BIN ]]; then mv -T "$BIN" "$tmp/stale-bin"; fi
    mv -T "$tmp/bin" "$BIN"
    log "build time: $((SECONDS - start)) s"
}

mkdir -p "$CACHE_ROOT"
if [[ ${1:-} == --regen ]]; then
    regen
elif [[ $# -gt 0 ]]; then
    die "unknown argument: $1 (usage: $0 [--regen])"
fi

if ! binaries_ok; then
    if command -v flock >/dev/null; then
        exec 9>"$CACHE_ROOT/.$NAME.lock"
        flock -n 9 || { log "waiting for another build (lock $CACHE_ROOT/.$NAME.lock)"; flock 9; }
    fi
    # Another process may have finished the build while we waited for the lock.
    binaries_ok || build
fi
echo "$BIN"
