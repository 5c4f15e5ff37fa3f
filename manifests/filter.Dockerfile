# The filter as an OCI image in Istio's Wasm image format ("compat" variant): one layer holding
# plugin.wasm. Build from the workspace root after `just filter`:
#   docker build -f manifests/filter.Dockerfile -t ghcr.io/holdfast-mesh/holdfast-filter:0.1.0 .
FROM scratch
COPY target/holdfast_filter.wasm ./plugin.wasm
