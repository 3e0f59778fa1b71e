#!/usr/bin/env bash
# Install the Debian packages a real test node runs on, when any is missing (needs root and apt):
# containerd (1.6, with containerd-shim-runc-v2), runc, the CNI plugins (bridge, host-local,
# loopback, portmap in /usr/lib/cni), busybox-static (the test workload image) and gcc's static
# libc (the pause binary). Prints nothing and changes nothing when all are present.
set -euo pipefail
missing=()
command -v containerd >/dev/null || missing+=(containerd)
command -v containerd-shim-runc-v2 >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback && -x /usr/lib/cni/portmap ]] ||
    missing+=(containernetworking-plugins)
[[ -x /bin/busybox ]] || missing+=(busybox-static)
command -v iptables >/dev/null || missing+=(iptables)
command -v gcc >/dev/null || missing+=(gcc)
[[ -e /usr/lib/x86_64-linux-gnu/libc.a || -e /usr/lib/libc.a ]] || missing+=(libc6-dev)
# shellcheck source=../lib/apt-install.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/apt-install.sh"
apt_install_missing "${missing[@]}"
