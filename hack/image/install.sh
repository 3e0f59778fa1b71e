#!/usr/bin/env bash
# Install the Debian packages hack/image/build.sh builds images with, when any is missing (needs root
# and apt): buildah (the OCI image builder; it runs each Containerfile RUN step with
# `--isolation chroot`, so it needs no container runtime or systemd), mmdebstrap (assembles the
# Python base image from Debian bookworm's packages, since no registry is reachable) and util-linux's
# unshare (each buildah call runs in a private mount namespace). Prints nothing and changes nothing
# when all are present.
set -euo pipefail
missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v unshare >/dev/null || missing+=(util-linux)
# shellcheck source=../lib/apt-install.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/apt-install.sh"
apt_install_missing "${missing[@]}"
