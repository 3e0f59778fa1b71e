# shellcheck shell=bash
# k8s_ldflags MODULE_DIR VERSION: the -ldflags that stamp a Kubernetes binary built from the
# wrapper module in MODULE_DIR with VERSION (what `--version` prints), dated by the release's
# commit time from the module proxy instead of `date`, so builds are reproducible.
# Sourced by hack/control-plane/build.sh (apiserver, scheduler) and hack/node/build.sh (kubelet).
k8s_ldflags() {
    local dir=$1 version=$2 minor date p ldf="-s -w"
    minor=${version#v1.}
    minor=${minor%%.*}
    date=$(go -C "$dir" mod download -json "k8s.io/kubernetes@$version" |
        sed -n 's/^[[:space:]]*"Info": "\(.*\)",\{0,1\}$/\1/p' | xargs cat |
        sed -n 's/.*"Time":"\([^"]*\)".*/\1/p')
    [[ -n $date ]] || date=1970-01-01T00:00:00Z
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldf+=" -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
        ldf+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
    done
    echo "$ldf"
}
