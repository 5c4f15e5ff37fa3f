# The holdfast node agent image (manifests/agent/daemonset.yaml runs it).
#   docker build -t ghcr.io/holdfast-mesh/holdfast:0.1.0 .
# The filter has its own image: manifests/filter.Dockerfile.

# rust-toolchain.toml pins 1.95.0 (and the wasm target, which rustup fetches on first use).
FROM rust:1.95 AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release -p holdfast --locked \
 && cp target/release/holdfast /usr/local/bin/holdfast

# bookworm's `iptables` is iptables-nft (nf_tables backend) by default, the backend the agent
# writes its hold rules with; it also brings iptables-restore.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/holdfast /usr/local/bin/holdfast
ENTRYPOINT ["/usr/local/bin/holdfast"]
CMD ["--help"]
