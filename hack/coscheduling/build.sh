#!/usr/bin/env bash
# Build kube-scheduler with the scheduler-plugins out-of-tree plugins (Coscheduling among them)
# from the Go module proxy, cached per version, like hack/control-plane/build.sh.
#
# Why: gang-scheduling tests run the PodGroup-based Coscheduling plugin of
# kubernetes-sigs/scheduler-plugins next to gpuslice's extender. Its `cmd/scheduler` registers the
# plugins with the in-tree scheduler framework (app.NewSchedulerCommand(app.WithPlugin(...))), so it
# is a whole kube-scheduler; it is built from the module proxy because no release download is
# reachable from CI.
#
# Usage:
#   hack/coscheduling/build.sh          build if needed; the LAST line of stdout is the bin dir
#   hack/coscheduling/build.sh --regen  rewrite scheduler/go.mod (+go.sum) from versions.env (needs
#                                       the module proxy), then build
#
# Environment:
#   GPUSLICE_CACHE_DIR   cache root (default: $HOME/.cache/gpuslice)
#   GPUSLICE_BUILD_JOBS  `go build -p` (default: 2)
#
# Kubernetes version: the control plane's pin (hack/control-plane/versions.env), not the patch
# release scheduler-plugins' go.mod names. scheduler-plugins v0.34.7 requires k8s.io/kubernetes
# v1.34.7, but the module proxy does not serve every staging module at v0.34.7 (cluster-bootstrap,
# cri-api, kubectl, ... are refused), and `replace` needs all of them; the wrapper module replaces
# k8s.io/kubernetes and every staging module with the control plane's version instead (same minor,
# checked by --regen), so this scheduler is the same Kubernetes as the stock one. A cold build (Go
# module and build caches already holding the control plane's) took 11 min on 2 cores.
#
# Output: $GPUSLICE_CACHE_DIR/coscheduling/scheduler-plugins-$SCHEDULER_PLUGINS_VERSION-k8s-$K8S_VERSION/
# bin/kube-scheduler-coscheduling. `--version` prints "Kubernetes $K8S_VERSION": upstream's Makefile
# stamps gitVersion with its own tag (v0.34.x), which would make the binary claim Kubernetes 0.34 to
# the component-base version machinery; the Kubernetes version is what the binary really is.
# Built in a temporary directory and renamed into place; concurrent callers serialise on a lock
# file when flock(1) exists.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$HERE/versions.env"
# shellcheck source=../control-plane/versions.env
source "$HERE/../control-plane/versions.env"
# shellcheck source=../control-plane/k8s-ldflags.sh
source "$HERE/../control-plane/k8s-ldflags.sh"
: "${SCHEDULER_PLUGINS_VERSION:?versions.env must set SCHEDULER_PLUGINS_VERSION}"
: "${K8S_VERSION:?hack/control-plane/versions.env must set K8S_VERSION}"

MOD=$HERE/scheduler
PKG=sigs.k8s.io/scheduler-plugins/cmd/scheduler
CACHE_ROOT=${GPUSLICE_CACHE_DIR:-$HOME/.cache/gpuslice}/coscheduling
NAME=scheduler-plugins-${SCHEDULER_PLUGINS_VERSION}-k8s-${K8S_VERSION}
DEST=$CACHE_ROOT/$NAME
BIN=$DEST/bin
EXE=kube-scheduler-coscheduling
JOBS=${GPUSLICE_BUILD_JOBS:-2}

log() { echo "coscheduling/build.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

# The wrapper module lives in the repo; never let a go.work or the caller's GOFLAGS change it.
export GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0

binaries_ok() {
    local out
    [[ -x $BIN/$EXE ]] || return 1
    out=$("$BIN/$EXE" --version 2>/dev/null) && [[ $out == "Kubernetes $K8S_VERSION" ]] || return 1
}

# mod_file PATH@VERSION: path of that module's go.mod in the module cache (downloads it).
mod_file() {
    go mod download -json "$1" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p'
}

regen() {
    command -v go >/dev/null || die "go not found in PATH"
    log "regenerating the wrapper module for sigs.k8s.io/scheduler-plugins $SCHEDULER_PLUGINS_VERSION"
    (
        cd "$MOD"
        export GOFLAGS="-mod=mod -buildvcs=false"
        local spmod want k8smod staging m
        spmod=$(mod_file "sigs.k8s.io/scheduler-plugins@$SCHEDULER_PLUGINS_VERSION")
        [[ -s $spmod ]] || die "cannot download sigs.k8s.io/scheduler-plugins@$SCHEDULER_PLUGINS_VERSION"
        # The Kubernetes release scheduler-plugins requires (its require block) must be the
        # control plane's minor; the patch is replaced by the control plane's (header).
        want=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v1\./ {print $2; exit}' "$spmod")
        [[ ${want%.*} == "${K8S_VERSION%.*}" ]] ||
            die "scheduler-plugins $SCHEDULER_PLUGINS_VERSION requires k8s.io/kubernetes $want, control plane is $K8S_VERSION: pick the scheduler-plugins release of that minor"
        k8smod=$(mod_file "k8s.io/kubernetes@$K8S_VERSION")
        [[ -s $k8smod ]] || die "cannot download k8s.io/kubernetes@$K8S_VERSION"
        staging=v0.${K8S_VERSION#v1.}
        rm -f go.mod go.sum
        go mod init gpuslice.local/hack/coscheduling/scheduler 2>/dev/null
        go mod edit -go="$(awk '$1 == "go" {print $2; exit}' "$spmod")"
        # replace only works in the main module, so the staging block scheduler-plugins carries
        # must be repeated here; derived from k8s.io/kubernetes' own go.mod as in
        # hack/control-plane/build.sh.
        {
            awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$k8smod"
            awk '$1 ~ /^k8s\.io\// && $2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$k8smod"
        } | sort -u | while read -r m; do
            go mod edit -replace="$m=$m@$staging"
        done
        go mod edit -replace="k8s.io/kubernetes=k8s.io/kubernetes@$K8S_VERSION"
        go get -tool "$PKG@$SCHEDULER_PLUGINS_VERSION"
        go mod tidy
    )
    log "regenerated; commit hack/coscheduling/scheduler/go.{mod,sum}"
}

check_pins() {
    grep -Eq "^[[:space:]]*(require[[:space:]]+)?sigs\.k8s\.io/scheduler-plugins $SCHEDULER_PLUGINS_VERSION( |$)" "$MOD/go.mod" ||
        die "scheduler/go.mod does not require sigs.k8s.io/scheduler-plugins $SCHEDULER_PLUGINS_VERSION (versions.env changed?); run $0 --regen"
    grep -Eq "^[[:space:]]*(replace[[:space:]]+)?k8s\.io/kubernetes => k8s\.io/kubernetes $K8S_VERSION( |$)" "$MOD/go.mod" ||
        die "scheduler/go.mod does not pin k8s.io/kubernetes to $K8S_VERSION (control plane bumped?); run $0 --regen"
}

build() {
    command -v go >/dev/null || die "go not found in PATH (need Go >= the wrapper module's go line)"
    check_pins
    local tmp start ldf
    start=$SECONDS
    tmp=$(mktemp -d "$CACHE_ROOT/.tmp-$NAME-XXXXXX")
    # shellcheck disable=SC2064  # expand now: the trap must remove this very directory
    trap "rm -rf '$tmp'" EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    log "building $NAME with $(go version | cut -d' ' -f3) (-p $JOBS); a cold build takes ~10-15 min on 2 cores"
    ldf=$(k8s_ldflags "$MOD" "$K8S_VERSION")
    mkdir -p "$tmp/bin"
    (cd "$MOD" && go build -p "$JOBS" -trimpath -ldflags "$ldf" -o "$tmp/bin/$EXE" "$PKG")

    local old_bin=$BIN
    BIN=$tmp/bin
    binaries_ok || die "freshly built $EXE does not report Kubernetes $K8S_VERSION"
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
