# Sourced by the install scripts: apt_install_missing PKG... installs the Debian packages named
# (already found missing by the caller) with apt, as root; nothing when the list is empty.
apt_install_missing() {
    (($# == 0)) && return 0
    if [[ $(id -u) != 0 ]]; then
        echo "install.sh: need root to install: $*" >&2
        return 1
    fi
    echo "install.sh: installing $*" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >&2
}
