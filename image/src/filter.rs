//! The filter's image, in the Wasm image format Istio's agent fetches for a WasmPlugin
//! `url: oci://…` (istio/istio pkg/wasm/imagefetcher.go, checked at tags 1.24.6 to 1.30.3,
//! which read it the same way; the format is solo-io/wasm `spec/spec-compat.md` and `spec.md`).
//! pilot-agent accepts three shapes:
//!
//! - Docker image (manifest `application/vnd.docker.distribution.manifest.v2+json`): the last
//!   layer must be `application/vnd.docker.image.rootfs.diff.tar.gzip` holding `plugin.wasm`
//!   (`extractDockerImage`) — what `docker build` of a `FROM scratch` + `COPY plugin.wasm`
//!   Dockerfile pushes;
//! - **compat** OCI image: the last layer `application/vnd.oci.image.layer.v1.tar+gzip` holding
//!   `plugin.wasm` (`extractOCIStandardImage`). **This is the image holdfast ships** (
//!   [`Variant::Compat`]): a plain OCI image any registry stores and any tool copies;
//! - **oci** artifact: exactly two layers, one of them `application/vnd.module.wasm.content.layer.v1+wasm`
//!   holding the raw module (`extractOCIArtifactImage`). Built here too ([`Variant::OciArtifact`])
//!   so the tests exercise that branch of the fetcher as well.
//!
//! Whatever the variant, the digest a WasmPlugin pins (`sha256:` or `url: …@sha256:`) is the
//! image **manifest's** digest: `getOrFetch` in pkg/wasm/cache.go compares it with
//! `img.Digest()`, never with the module's own sha256.

use serde_json::json;

use crate::layer::LayerBuilder;
use crate::layout::{image_config, BuiltImage, ManifestLayer, OciLayout, OCI_CONFIG};
use crate::Error;

/// The file name pilot-agent looks for in a compat image's layer.
pub const PLUGIN_FILE: &str = "plugin.wasm";
/// The raw-module layer of the oci variant.
pub const WASM_CONTENT_LAYER: &str = "application/vnd.module.wasm.content.layer.v1+wasm";
/// The runtime-config layer of the oci variant (solo-io/wasm spec).
pub const WASM_CONFIG_LAYER: &str = "application/vnd.module.wasm.config.v1+json";

/// Which of pilot-agent's accepted shapes to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// One gzip tar layer with `plugin.wasm` (shipped).
    Compat,
    /// Two layers: the raw module and its runtime config.
    OciArtifact,
}

/// `\0asm` and binary version 1: what pilot-agent's `isValidWasmBinary` checks.
pub fn is_wasm_module(data: &[u8]) -> bool {
    data.len() >= 8 && data[..4] == *b"\0asm" && data[4..8] == [1, 0, 0, 0]
}

/// Builds the filter image for `module` (the `.wasm` file's bytes) into the layout at `out`.
pub fn build(
    module: &[u8],
    variant: Variant,
    version: &str,
    root_id: &str,
    epoch: u64,
    out: &std::path::Path,
    tag: &str,
) -> Result<BuiltImage, Error> {
    if !is_wasm_module(module) {
        return Err(Error::Input(
            "the filter module is not a WebAssembly binary (no \\0asm v1 header): build it with `just filter`"
                .into(),
        ));
    }
    let labels = json!({
        "org.opencontainers.image.title": "holdfast-filter",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.licenses": "Apache-2.0",
    });
    let layout = OciLayout::create(out)?;
    match variant {
        Variant::Compat => {
            let mut l = LayerBuilder::new();
            l.file(PLUGIN_FILE, module.to_vec(), 0o644)?;
            let layer = l.build(epoch)?;
            let config = image_config("wasm", epoch, json!({ "Labels": labels }), &[&layer])?;
            layout.write_image(tag, OCI_CONFIG, &config, &[ManifestLayer::gzip(&layer)])
        }
        Variant::OciArtifact => {
            // The runtime config the solo-io spec describes (the ABI named by the module's own
            // `proxy_abi_version_*` export, proxy-wasm-rust-sdk 0.2); pilot-agent reads only
            // the module.
            let runtime = serde_json::to_vec(&json!({
                "type": "envoy_proxy",
                "abiVersions": ["proxy_abi_version_0_2_1"],
                "rootIds": [root_id],
            }))
            .map_err(|e| Error::Input(e.to_string()))?;
            let config = serde_json::to_vec(&json!({
                "architecture": "wasm",
                "os": "linux",
                "created": crate::layout::rfc3339(epoch),
                "config": { "Labels": labels },
                "rootfs": { "type": "layers", "diff_ids": [
                    crate::layout::sha256_digest(module),
                    crate::layout::sha256_digest(&runtime),
                ]},
            }))
            .map_err(|e| Error::Input(e.to_string()))?;
            layout.write_image(
                tag,
                OCI_CONFIG,
                &config,
                &[
                    ManifestLayer {
                        media_type: WASM_CONTENT_LAYER,
                        blob: module,
                        uncompressed_size: module.len() as u64,
                    },
                    ManifestLayer {
                        media_type: WASM_CONFIG_LAYER,
                        blob: &runtime,
                        uncompressed_size: runtime.len() as u64,
                    },
                ],
            )
        }
    }
}
