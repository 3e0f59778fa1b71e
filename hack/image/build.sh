#!/usr/bin/env bash
# Build the container images real nodes run, as OCI archives, cached by a hash of their inputs; the
# LAST line of stdout is the directory holding them:
#
#   gpuslice-image.oci.tar        the repository's Dockerfile, unchanged, built FROM a Python base
#                                 assembled here from Debian bookworm's packages; named
#                                 ghcr.io/gpuslice/gpuslice:<Chart.yaml appVersion> (the chart's default)
#   kube-scheduler-image.oci.tar  the control plane's Go-built kube-scheduler (hack/control-plane) at
#                                 /usr/local/bin/kube-scheduler, named registry.k8s.io/kube-scheduler:
#                                 <K8S_VERSION>, standing in for the upstream image
#   images.json                   per image: reference, archive, digest, layers, sizes, config user
#                                 (dev/src/gpuslice_dev/imagearchive.py)
#
# A node imports them with `ctr -n k8s.io images import FILE`, after which pods name them as a pull
# would have left them (imagePullPolicy IfNotPresent or Never).
#
# Why built this way: no registry is reachable from the test machine, so no base image can be
# pulled. The Python base (python3.11, python3.11-venv, python-is-python3, ca-certificates) is
# assembled by mmdebstrap from Debian's archive and cached on its own (it changes only with its
# recipe below); the images are built by Debian's buildah with `--isolation chroot` (no container
# runtime, no systemd, cgroupfs; root here lacks CAP_SYS_RESOURCE, which chroot isolation never
# needs), storage under the cache dir (https://github.com/containers/buildah/blob/main/docs/buildah-build.1.md).
# pip inside the Dockerfile's RUN steps downloads from PyPI; this machine's CA bundle is bind-mounted
# over the base's for those steps only (a TLS-inspecting egress proxy needs it), never into a layer.
#
# Needs root, buildah, mmdebstrap and unshare (hack/image/install.sh) when something must be built;
# a cached result is printed without any of them.
#
# Environment:
#   GPUSLICE_CACHE_DIR               cache root (default $HOME/.cache/gpuslice); this uses .../image
#   GPUSLICE_CONTROL_PLANE_BIN       a prebuilt control-plane bin dir (else hack/control-plane/build.sh)
#   GPUSLICE_DEBIAN_MIRROR           Debian archive (default http://deb.debian.org/debian)
#   GPUSLICE_DEBIAN_SECURITY_MIRROR  security archive (default http://deb.debian.org/debian-security)
#   GPUSLICE_BUILDAH_DRIVER          storage driver: overlay (default) or vfs
#   GPUSLICE_PYTHON                  Python 3.11+ for images.json (default the repo's .venv, else python3)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=../control-plane/versions.env
source "$REPO/hack/control-plane/versions.env"
: "${K8S_VERSION:?versions.env must set K8S_VERSION}"

CACHE_ROOT=${GPUSLICE_CACHE_DIR:-$HOME/.cache/gpuslice}/image
MIRROR=${GPUSLICE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${GPUSLICE_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
DRIVER=${GPUSLICE_BUILDAH_DRIVER:-overlay}
PYTHON=${GPUSLICE_PYTHON:-}
if [[ -z $PYTHON ]]; then
    if [[ -x $REPO/.venv/bin/python ]]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python3; fi
fi

SUITE=bookworm
BASE_PACKAGES=python3.11,python3.11-venv,python-is-python3,ca-certificates
BASE_REF=localhost/gpuslice/python-base:$SUITE-3.11
APP_REPO=ghcr.io/gpuslice/gpuslice
SCHEDULER_REF=registry.k8s.io/kube-scheduler:$K8S_VERSION
HOST_CA=/etc/ssl/certs/ca-certificates.crt
KEEP_OUTPUTS=3   # newest image directories kept; a test may still be reading an older one

BUILDAH_DIR=$CACHE_ROOT/buildah
POLICY=$BUILDAH_DIR/policy.json

log() { echo "image/build.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }
sum12() { sha256sum | cut -c1-12; }

case $CACHE_ROOT/ in
    /var/lib/*) die "GPUSLICE_CACHE_DIR must not be under /var/lib (buildah runs with /var/lib hidden)" ;;
esac

# --------------------------------------------------------------------------------------- buildah
# buildah's configuration, all under the cache dir: storage (graphroot/runroot), no registries to
# search (every image here is local), and a policy accepting local images (nothing is pulled from a
# registry, so there is no signature to check).
setup_buildah() {
    mkdir -p "$BUILDAH_DIR/tmp"
    cat >"$BUILDAH_DIR/storage.conf" <<EOF
[storage]
driver = "$DRIVER"
graphroot = "$BUILDAH_DIR/storage-$DRIVER"
runroot = "$BUILDAH_DIR/run-$DRIVER"
EOF
    echo 'unqualified-search-registries = []' >"$BUILDAH_DIR/registries.conf"
    echo '{"default": [{"type": "insecureAcceptAnything"}]}' >"$POLICY"
    export CONTAINERS_STORAGE_CONF=$BUILDAH_DIR/storage.conf
    export CONTAINERS_REGISTRIES_CONF=$BUILDAH_DIR/registries.conf
    export BUILDAH_ISOLATION=chroot BUILDAH_FORMAT=oci
}

# bh ARGS...: buildah, in a private mount namespace whose /var/lib is an empty tmpfs. containers/image
# keeps root's blob-info cache at the fixed path /var/lib/containers/cache, which no flag or
# setting moves; this drops it with the namespace instead of leaving it on the machine.
bh() {
    TMPDIR=$BUILDAH_DIR/tmp unshare --mount --propagation private -- \
        sh -c 'mount -t tmpfs -o mode=0755,size=16m buildah-var-lib /var/lib && exec "$@"' \
        bh buildah --cgroup-manager cgroupfs "$@"
}

# --------------------------------------------------------------------------------------- the base
# assemble_base DIR: Debian bookworm's minbase plus Python 3.11 as a root filesystem tar in DIR, with
# no documentation, man pages, locales or apt lists (dpkg never unpacks them), then the image.
# merged-usr: the debootstrap way, without the usrmerge package (and the perl it pulls in).
assemble_base() {
    local dir=$1 c
    mmdebstrap --mode=root --variant=minbase --include="$BASE_PACKAGES" \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --aptopt='APT::Install-Recommends "false"' --aptopt='Acquire::Languages "none"' \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        "$SUITE" "$dir/rootfs.tar" \
        "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
        "deb $SECURITY_MIRROR $SUITE-security main" >&2
    c=$(bh from --signature-policy "$POLICY" scratch)
    bh add "$c" "$dir/rootfs.tar" / >&2
    rm -f "$dir/rootfs.tar"
    bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
        --cmd '["python3"]' --label org.opencontainers.image.title=python-base \
        --label "org.opencontainers.image.description=Debian $SUITE minbase with $BASE_PACKAGES" "$c" >&2
    bh commit --quiet --rm --signature-policy "$POLICY" --iidfile "$dir/id" "$c" "$BASE_REF" >&2
    bh push --quiet --signature-policy "$POLICY" "$BASE_REF" "oci-archive:$dir/python-base.oci.tar:$BASE_REF" >&2
}

# ensure_base_in_storage: the cached base under BASE_REF in buildah's storage (reloaded from its
# archive when the storage was emptied or holds another base).
ensure_base_in_storage() {
    local want have
    want=$(<"$BASE_DIR/id")
    have=$(bh inspect --type image --format '{{.FromImageID}}' "$BASE_REF" 2>/dev/null || true)
    [[ sha256:$have == "$want" || $have == "$want" ]] && return 0
    log "loading the base into buildah's storage"
    bh pull --quiet --signature-policy "$POLICY" "oci-archive:$BASE_DIR/python-base.oci.tar" >&2
    bh tag "${want#sha256:}" "$BASE_REF" >&2
}

# ------------------------------------------------------------------------------ kube-scheduler
# build_scheduler DIR: the kube-scheduler image. buildah from scratch rather than
# dev/src/gpuslice_dev/ociimage.py: the same builder and archive format as the gpuslice image
# (gzip layers, labels and config set by `buildah config`), and no Python package needed here. The
# upstream image is a distroless static base plus the binary; this keeps what kube-scheduler can use
# of that: /tmp, /etc/passwd and /etc/group (root, nonroot 65532). No user is set, as upstream.
build_scheduler() {
    local dir=$1 root c
    root=$dir/rootfs
    mkdir -p "$root/usr/local/bin" "$root/tmp" "$root/etc"
    chmod 1777 "$root/tmp"
    install -m 0755 "$SCHEDULER_BIN" "$root/usr/local/bin/kube-scheduler"
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
        >"$root/etc/passwd"
    printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
    chmod 0644 "$root/etc/passwd" "$root/etc/group"
    c=$(bh from --signature-policy "$POLICY" scratch)
    bh copy "$c" "$root" / >&2
    rm -rf "$root"
    bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --entrypoint '["/usr/local/bin/kube-scheduler"]' \
        --label org.opencontainers.image.title=kube-scheduler \
        --label "org.opencontainers.image.version=$K8S_VERSION" \
        --label "org.opencontainers.image.description=kube-scheduler $K8S_VERSION built from k8s.io/kubernetes by hack/control-plane/build.sh" \
        "$c" >&2
    bh commit --quiet --rm --signature-policy "$POLICY" "$c" "$SCHEDULER_REF" >&2
    bh push --quiet --signature-policy "$POLICY" "$SCHEDULER_REF" \
        "oci-archive:$dir/kube-scheduler-image.oci.tar:$SCHEDULER_REF" >&2
    bh rmi "$SCHEDULER_REF" >&2
}

# ------------------------------------------------------------------------------------- gpuslice
# stage_context DIR: what the Dockerfile may copy (.dockerignore's allowlist: pyproject.toml,
# README.md, requirements.lock, src/ without bytecode or egg-info), plus the Dockerfile itself.
stage_context() {
    local dir=$1
    mkdir -p "$dir"
    (
        cd "$REPO"
        find Dockerfile .dockerignore pyproject.toml README.md requirements.lock src \
            \( -name __pycache__ -o -name '*.egg-info' \) -prune -o -type f ! -name '*.pyc' -print0 |
            xargs -0 cp --parents -t "$dir"
    )
}

# tree_hash DIR: the hash of every file's path and content under DIR.
tree_hash() {
    (cd "$1" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sum12
}

build_app() {
    local dir=$1 context=$2 mounts=()
    if [[ -r $HOST_CA ]]; then mounts=(--volume "$HOST_CA:$HOST_CA:ro"); fi
    bh bud --pull=never --layers=false --signature-policy "$POLICY" "${mounts[@]}" \
        --build-arg "PYTHON_IMAGE=$BASE_REF" --build-arg "VERSION=$PY_VERSION" \
        --iidfile "$dir/gpuslice.id" -t "$APP_REF" -f "$context/Dockerfile" "$context" >&2
    bh push --quiet --signature-policy "$POLICY" "$APP_REF" "oci-archive:$dir/gpuslice-image.oci.tar:$APP_REF" >&2
    rm -f "$dir/gpuslice.id"
    bh rmi "$APP_REF" >&2
    bh rmi --prune >&2 || true   # the builder stage's unnamed image
}

outputs_ok() {
    [[ -s $1/images.json && -s $1/gpuslice-image.oci.tar && -s $1/kube-scheduler-image.oci.tar ]]
}

# prune: older bases and scheduler images, and all but the newest image directories.
prune() {
    local d
    for d in "$CACHE_ROOT"/python-base-* "$CACHE_ROOT"/kube-scheduler-*; do
        if [[ -d $d && $d != "$BASE_DIR" && $d != "$SCHEDULER_DIR" ]]; then rm -rf "$d"; fi
    done
    # shellcheck disable=SC2012  # names are ours: images-<version>-<hex>
    ls -1dt "$CACHE_ROOT"/images-* 2>/dev/null | tail -n +$((KEEP_OUTPUTS + 1)) | while read -r d; do
        if [[ $d != "$OUT" ]]; then rm -rf "$d"; fi
    done
}

# -------------------------------------------------------------------------------------- main
mkdir -p "$CACHE_ROOT"
tmp=$(mktemp -d "$CACHE_ROOT/.tmp-XXXXXX")
# shellcheck disable=SC2064  # expand now: the trap must remove this very directory
trap "rm -rf '$tmp'" EXIT

APP_VERSION=$(sed -n 's/^appVersion:[[:space:]]*"\{0,1\}\([^"[:space:]]*\)"\{0,1\}[[:space:]]*$/\1/p' \
    "$REPO/charts/gpuslice/Chart.yaml")
PY_VERSION=$("$PYTHON" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
    "$REPO/pyproject.toml")
[[ -n $APP_VERSION ]] || die "no appVersion in charts/gpuslice/Chart.yaml"
[[ $APP_VERSION == "$PY_VERSION" ]] ||
    die "Chart.yaml appVersion $APP_VERSION is not pyproject.toml's version $PY_VERSION (the image tag would lie)"
APP_REF=$APP_REPO:$APP_VERSION

SCHEDULER_BIN=${GPUSLICE_CONTROL_PLANE_BIN:-$(bash "$REPO/hack/control-plane/build.sh" | tail -1)}/kube-scheduler
[[ -x $SCHEDULER_BIN ]] || die "no kube-scheduler at $SCHEDULER_BIN"
[[ $("$SCHEDULER_BIN" --version) == "Kubernetes $K8S_VERSION" ]] || die "$SCHEDULER_BIN is not $K8S_VERSION"

BASE_KEY=$(printf '%s\n' "$SUITE" "$BASE_PACKAGES" "$BASE_REF" "$(declare -f assemble_base)" | sum12)
BASE_DIR=$CACHE_ROOT/python-base-$SUITE-3.11-$BASE_KEY
SCHEDULER_KEY=$({ sha256sum <"$SCHEDULER_BIN"; printf '%s\n' "$SCHEDULER_REF" "$(declare -f build_scheduler)"; } | sum12)
SCHEDULER_DIR=$CACHE_ROOT/kube-scheduler-$K8S_VERSION-$SCHEDULER_KEY
stage_context "$tmp/context"
KEY=$({ printf '%s\n' "$(tree_hash "$tmp/context")" "$BASE_KEY" "$SCHEDULER_KEY" "$APP_REF" "$PY_VERSION"; cat "$0"; } | sum12)
OUT=$CACHE_ROOT/images-$APP_VERSION-$KEY

if ! outputs_ok "$OUT"; then
    if command -v flock >/dev/null; then
        exec 9>"$CACHE_ROOT/.build.lock"
        flock -n 9 || { log "waiting for another build (lock $CACHE_ROOT/.build.lock)"; flock 9; }
    fi
fi
if ! outputs_ok "$OUT"; then
    [[ $(id -u) == 0 ]] || die "building the images needs root (mmdebstrap, buildah); $OUT is not cached"
    for tool in buildah mmdebstrap unshare; do
        command -v "$tool" >/dev/null || die "$tool not found (hack/image/install.sh installs it)"
    done
    setup_buildah
    bh rm --all >/dev/null || true   # working containers an interrupted build left behind
    if [[ ! -s $BASE_DIR/python-base.oci.tar ]]; then
        start=$SECONDS
        log "assembling the Python base from Debian $SUITE ($BASE_PACKAGES)"
        mkdir "$tmp/base"
        assemble_base "$tmp/base"
        rm -rf "$BASE_DIR"
        mv -T "$tmp/base" "$BASE_DIR"
        log "base assembled in $((SECONDS - start)) s"
    fi
    ensure_base_in_storage
    if [[ ! -s $SCHEDULER_DIR/kube-scheduler-image.oci.tar ]]; then
        start=$SECONDS
        mkdir "$tmp/scheduler"
        build_scheduler "$tmp/scheduler"
        rm -rf "$SCHEDULER_DIR"
        mv -T "$tmp/scheduler" "$SCHEDULER_DIR"
        log "kube-scheduler image built in $((SECONDS - start)) s"
    fi
    start=$SECONDS
    mkdir "$tmp/out"
    build_app "$tmp/out" "$tmp/context"
    log "gpuslice image built in $((SECONDS - start)) s"
    ln "$SCHEDULER_DIR/kube-scheduler-image.oci.tar" "$tmp/out/" 2>/dev/null ||
        cp "$SCHEDULER_DIR/kube-scheduler-image.oci.tar" "$tmp/out/"
    PYTHONPATH=$REPO/dev/src "$PYTHON" -m gpuslice_dev.imagearchive "$tmp/out/images.json" \
        "gpuslice=$tmp/out/gpuslice-image.oci.tar" "kube-scheduler=$tmp/out/kube-scheduler-image.oci.tar"
    rm -rf "$OUT"
    mv -T "$tmp/out" "$OUT"
    prune
fi
echo "$OUT"
