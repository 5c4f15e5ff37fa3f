#!/usr/bin/env bash
# Build the real cluster's programs from the Go module proxy, once per version (issue 38).
#
#   scripts/cluster/build.sh            build whatever of versions.env is missing from the cache
#   scripts/cluster/build.sh COMP...    only these (kubernetes etcd containerd runc crictl)
#   scripts/cluster/build.sh --print    print the cache directory of each component (built or not)
#
# Each component lands in $CACHE/<component>-<version>/bin (CACHE: HOLDFAST_CLUSTER_CACHE, default
# /var/cache/holdfast/cluster), written to a .partial directory and renamed when complete, so a build
# killed half-way is redone, never half-used. They are programs the tests run, installed from Go modules as
# any Go tool is: no code of theirs goes into the project. A module here is a throw-away main module that
# `require`s the program's module at the pinned version (tools.go names the commands), tidied and built.
#
# k8s.io/kubernetes needs one `replace` per staging module (its own go.mod replaces them with
# ./staging/src/..., which a dependent module does not inherit): read from the tag's go.mod, each pointed at
# the published v0.<minor>.<patch>.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
CACHE="${HOLDFAST_CLUSTER_CACHE:-/var/cache/holdfast/cluster}"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export GOTOOLCHAIN=local

dir_of() { echo "$CACHE/$1-$2"; }
only=("$@")
wanted() {
    [[ ${#only[@]} -eq 0 ]] && return 0
    local c
    for c in "${only[@]}"; do [[ "$c" == "$1" ]] && return 0; done
    return 1
}

if [[ "${1:-}" == "--print" ]]; then
    for c in kubernetes:$KUBERNETES etcd:$ETCD containerd:$CONTAINERD runc:$RUNC crictl:$CRICTL; do
        echo "${c%%:*}=$(dir_of "${c%%:*}" "${c#*:}")"
    done
    exit 0
fi

command -v go >/dev/null || { echo "build.sh: no 'go' on PATH: the real cluster's programs build from Go modules (Go 1.26)" >&2; exit 1; }
mkdir -p "$CACHE/src"

# build COMPONENT VERSION MODULE MODULE_VERSION "PKG=NAME ..." [extra go.mod lines] -- [go build args...]
build() {
    local comp="$1" ver="$2" mod="$3" modver="$4" pkgs="$5" extra="$6"
    shift 6
    [[ "${1:-}" == "--" ]] && shift
    wanted "$comp" || return 0
    local out lock
    out="$(dir_of "$comp" "$ver")"
    # One build per component at a time (two test runs, or `just cluster up` beside CI): the second waits.
    exec {lock}>"$CACHE/src/$comp.lock"
    flock "$lock"
    if [[ -d "$out/bin" ]]; then
        echo "== $comp $ver: cached in $out"
        exec {lock}>&-
        return 0
    fi
    echo "== $comp $ver: building from $mod@$modver"
    local t0=$SECONDS src="$CACHE/src/$comp-$ver"
    rm -rf "$src" "$out.partial"
    mkdir -p "$src" "$out.partial/bin"
    {
        echo "module holdfast.test/cluster/$comp"
        echo "go 1.26"
        echo "require $mod $modver"
        printf '%s\n' "$extra"
    } >"$src/go.mod"
    {
        echo "//go:build tools"
        echo "package tools"
        echo "import ("
        local p
        for p in $pkgs; do echo "	_ \"${p%%=*}\""; done
        echo ")"
    } >"$src/tools.go"
    (cd "$src" && go mod tidy)
    for p in $pkgs; do
        (cd "$src" && go build -trimpath "$@" -o "$out.partial/bin/${p#*=}" "${p%%=*}")
    done
    echo "$mod@$modver built by scripts/cluster/build.sh in $((SECONDS - t0)) s on $(date -u +%FT%TZ)" >"$out.partial/BUILT"
    mv "$out.partial" "$out"
    echo "== $comp $ver: $((SECONDS - t0)) s"
    exec {lock}>&-
}

t_all=$SECONDS

# Kubernetes: the staging replaces from the tag's own go.mod.
if wanted kubernetes; then
k8s_mod="$(cd "$CACHE/src" && go mod download -json "k8s.io/kubernetes@v$KUBERNETES" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')"
[[ -f "$k8s_mod" ]] || { echo "build.sh: could not download k8s.io/kubernetes@v$KUBERNETES's go.mod" >&2; exit 1; }
staging_ver="v0.${KUBERNETES#*.}"
replaces="$(sed -n 's|^\t\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*$|replace \1 => \1 '"$staging_ver"'|p' "$k8s_mod")"
[[ -n "$replaces" ]] || { echo "build.sh: no staging replaces found in $k8s_mod" >&2; exit 1; }
minor="${KUBERNETES#*.}"; minor="${minor%%.*}"
ld=""
for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ld+=" -X $p.gitVersion=v$KUBERNETES -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    ld+=" -X $p.buildDate=1970-01-01T00:00:00Z"
done
k8s_pkgs=""
for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
    k8s_pkgs+=" k8s.io/kubernetes/cmd/$c=$c"
done
CGO_ENABLED=0 build kubernetes "$KUBERNETES" k8s.io/kubernetes "v$KUBERNETES" "$k8s_pkgs" "$replaces" -- -ldflags "-s -w$ld"
fi

# etcd: go.etcd.io/etcd/server/v3's main.go wraps etcdmain; its sibling modules resolve at their published
# versions (etcd's own replaces point at the same release).
CGO_ENABLED=0 build etcd "$ETCD" go.etcd.io/etcd/server/v3 "v$ETCD" "go.etcd.io/etcd/server/v3=etcd" "" -- \
    -ldflags "-s -w"

# containerd v2, its runc shim and ctr. no_btrfs: the btrfs snapshotter needs cgo headers and is not used.
CGO_ENABLED=0 build containerd "$CONTAINERD" github.com/containerd/containerd/v2 "v$CONTAINERD" \
    "github.com/containerd/containerd/v2/cmd/containerd=containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2=containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr=ctr" \
    "" -- -tags no_btrfs -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=v$CONTAINERD"

# runc with seccomp (cgo + libseccomp-dev, which `just setup` installs).
CGO_ENABLED=1 build runc "$RUNC" github.com/opencontainers/runc "v$RUNC" "github.com/opencontainers/runc=runc" "" -- \
    -tags seccomp -ldflags "-s -w -X main.version=$RUNC"

CGO_ENABLED=0 build crictl "$CRICTL" sigs.k8s.io/cri-tools "v$CRICTL" "sigs.k8s.io/cri-tools/cmd/crictl=crictl" "" -- \
    -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=v$CRICTL"

echo "== all built or cached in $((SECONDS - t_all)) s"
