//! What Istio does with a `WasmPlugin` (extensions.istio.io/v1alpha1) before Envoy runs it,
//! ported from istio/istio at tag 1.28.10 (the files below read the same from 1.24.6 to 1.30.3
//! for everything ported here), so the tests load the filter the way a cluster does:
//!
//! 1. istiod turns the WasmPlugin into an Envoy Wasm filter config
//!    (pilot/pkg/model/extensions.go `buildPluginConfig`): name `<namespace>.<name>`,
//!    `root_id` = `pluginName`, `configuration` = `pluginConfig` as JSON in a StringValue, a
//!    remote code source whose `sha256` is the WasmPlugin's `sha256`, `failure_policy` from
//!    `failStrategy` (Istio ≥ 1.25), V8.
//! 2. pilot-agent fetches the module (pkg/wasm/convert.go → cache.go `getOrFetch` →
//!    imagefetcher.go `PrepareFetch`) and rewrites the source to the local file:
//!    - the expected checksum is `sha256` if set, else the digest in `url: …@sha256:` (cache.go
//!      `getEntry`); for `oci://` it is compared with **the image manifest's digest**
//!      (`img.Digest()`), never the module's;
//!    - the module comes out of the image in one of three shapes, tried in this order: Docker
//!      manifest → last layer `…rootfs.diff.tar.gzip` with `plugin.wasm`; OCI "compat" → last
//!      layer `…layer.v1.tar+gzip` with `plugin.wasm`; OCI "oci" variant → exactly two layers,
//!      one `application/vnd.module.wasm.content.layer.v1+wasm` (raw module);
//!    - the bytes must start with the Wasm magic and version 1 (cache.go `isValidWasmBinary`).
//!
//! An index (multi-platform image) resolves to its linux/amd64 manifest, as
//! go-containerregistry's `remote.Descriptor.Image()` does by default; the digest compared is
//! then that manifest's. HTTP(S) URLs are not ported (the tests pin OCI images).

use std::io::Read;

use anyhow::{bail, ensure, Context, Result};
use holdfast_image::filter::{is_wasm_module, PLUGIN_FILE, WASM_CONTENT_LAYER};
use holdfast_image::layout::{
    Index, Manifest, DOCKER_LAYER_GZIP, DOCKER_MANIFEST, DOCKER_MANIFEST_LIST, OCI_INDEX,
    OCI_LAYER_GZIP,
};
use holdfast_image::registry::{ImageRef, Registry};
use serde_json::{json, Value};

/// pilot's `features.MaxWasmBinarySizeBytes` default (256 MiB).
const MAX_WASM_BYTES: u64 = 256 << 20;

/// A module as pilot-agent fetched it.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub module: Vec<u8>,
    /// The digest pilot-agent compared (`img.Digest()`): the image manifest's.
    pub manifest_digest: String,
    /// Which extraction succeeded: `docker`, `compat` or `oci`.
    pub variant: &'static str,
}

/// The fields of a WasmPlugin's spec that decide what is fetched and how it runs.
#[derive(Debug, Clone)]
pub struct WasmPluginSpec {
    pub namespace: String,
    pub name: String,
    pub url: String,
    pub sha256: Option<String>,
    pub plugin_name: Option<String>,
    pub plugin_config: Option<Value>,
    pub fail_strategy: Option<String>,
}

impl WasmPluginSpec {
    /// From a rendered WasmPlugin object.
    pub fn from_object(v: &Value) -> Result<WasmPluginSpec> {
        let s = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_string);
        Ok(WasmPluginSpec {
            namespace: s("/metadata/namespace").unwrap_or_else(|| "default".into()),
            name: s("/metadata/name").context("a WasmPlugin needs metadata.name")?,
            url: s("/spec/url").context("a WasmPlugin needs spec.url")?,
            sha256: s("/spec/sha256"),
            plugin_name: s("/spec/pluginName"),
            plugin_config: v.pointer("/spec/pluginConfig").cloned(),
            fail_strategy: s("/spec/failStrategy"),
        })
    }

    /// The checksum pilot-agent expects: `sha256`, else the URL's `@sha256:` digest
    /// (cache.go `getEntry`), as hex; `None` when neither pins it.
    pub fn expected_checksum(&self) -> Option<String> {
        if let Some(s) = self
            .sha256
            .as_deref()
            .filter(|s| !s.is_empty() && *s != "nil")
        {
            return Some(s.to_string());
        }
        let (_, digest) = self.url.split_once('@')?;
        digest.strip_prefix("sha256:").map(str::to_string)
    }

    /// The Envoy network filter istiod builds for it, with pilot-agent's rewrite of the code
    /// to the fetched module's local file.
    pub fn envoy_filter(&self, module_path: &std::path::Path) -> Value {
        let mut config = json!({
            "name": format!("{}.{}", self.namespace, self.name),
            "root_id": self.plugin_name.clone().unwrap_or_default(),
            "vm_config": {
                "runtime": "envoy.wasm.runtime.v8",
                "code": { "local": { "filename": module_path.display().to_string() } },
            },
        });
        if let Some(c) = self
            .plugin_config
            .as_ref()
            .filter(|c| c.as_object().is_some_and(|m| !m.is_empty()))
        {
            config["configuration"] = json!({
                "@type": "type.googleapis.com/google.protobuf.StringValue",
                "value": c.to_string(),
            });
        }
        match self.fail_strategy.as_deref() {
            Some("FAIL_OPEN") => config["failure_policy"] = json!("FAIL_OPEN"),
            Some("FAIL_RELOAD") => config["failure_policy"] = json!("FAIL_RELOAD"),
            Some("FAIL_CLOSE") => config["failure_policy"] = json!("FAIL_CLOSED"),
            _ => {}
        }
        json!({
            "name": "envoy.filters.network.wasm",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm",
                "config": config,
            }
        })
    }
}

/// cache.go `getOrFetch` for an `oci://` URL on a loopback registry.
pub fn fetch(spec: &WasmPluginSpec) -> Result<Fetched> {
    let Some(rest) = spec.url.strip_prefix("oci://") else {
        bail!("{}: only oci:// URLs are ported here", spec.url);
    };
    let reference = ImageRef::parse(rest)?;
    let expected = spec.expected_checksum();
    let (digest, binary) = prepare_fetch(&reference)?;
    if let Some(want) = &expected {
        ensure!(
            *want == digest,
            "module downloaded from {} has checksum {digest}, which does not match: {want}",
            spec.url
        );
    }
    let (module, variant) = binary()?;
    ensure!(
        is_wasm_module(&module),
        "fetched Wasm binary from {} is invalid",
        spec.url
    );
    Ok(Fetched {
        module,
        manifest_digest: format!("sha256:{digest}"),
        variant,
    })
}

type BinaryFetcher = Box<dyn FnOnce() -> Result<(Vec<u8>, &'static str)>>;

/// imagefetcher.go `PrepareFetch`: the manifest's digest (hex), and the module's extraction.
pub fn prepare_fetch(reference: &ImageRef) -> Result<(String, BinaryFetcher)> {
    let client = Registry::new(&reference.registry)?;
    let repo = reference.repository.clone();
    let mut m = client
        .manifest(&repo, reference.reference())
        .with_context(|| format!("could not fetch manifest: {reference}"))?;
    let is_index = |m: &holdfast_image::registry::FetchedManifest| {
        m.media_type == OCI_INDEX
            || m.media_type == DOCKER_MANIFEST_LIST
            || serde_json::from_slice::<Value>(&m.bytes)
                .ok()
                .is_some_and(|v| v.get("manifests").is_some())
    };
    if is_index(&m) {
        let index: Index =
            serde_json::from_slice(&m.bytes).context("could not fetch image: not an index")?;
        let child = index
            .manifests
            .iter()
            .find(|d| {
                d.platform.as_ref().is_some_and(|p| {
                    p.get("os").and_then(Value::as_str) == Some("linux")
                        && p.get("architecture").and_then(Value::as_str) == Some("amd64")
                })
            })
            .context("could not fetch image: no linux/amd64 manifest in the index")?;
        m = client.manifest(&repo, &child.digest)?;
    }
    let digest = m.digest.trim_start_matches("sha256:").to_string();
    let bytes = m.bytes.clone();
    let fetcher: BinaryFetcher = Box::new(move || {
        let manifest: Manifest =
            serde_json::from_slice(&bytes).context("could not retrieve manifest")?;
        let layer = |i: usize| client.blob(&repo, &manifest.layers[i].digest, MAX_WASM_BYTES);
        if manifest.media_type.as_deref() == Some(DOCKER_MANIFEST) {
            let last = manifest
                .layers
                .len()
                .checked_sub(1)
                .context("number of layers must be greater than zero")?;
            ensure!(
                manifest.layers[last].media_type == DOCKER_LAYER_GZIP,
                "invalid media type {} (expect {DOCKER_LAYER_GZIP})",
                manifest.layers[last].media_type
            );
            return Ok((extract_plugin_wasm(&layer(last)?)?, "docker"));
        }
        let compat = (|| -> Result<Vec<u8>> {
            let last = manifest
                .layers
                .len()
                .checked_sub(1)
                .context("number of layers must be greater than zero")?;
            ensure!(
                manifest.layers[last].media_type == OCI_LAYER_GZIP,
                "invalid media type {} (expect {OCI_LAYER_GZIP})",
                manifest.layers[last].media_type
            );
            extract_plugin_wasm(&layer(last)?)
        })();
        let compat_err = match compat {
            Ok(m) => return Ok((m, "compat")),
            Err(e) => e,
        };
        let oci = (|| -> Result<Vec<u8>> {
            ensure!(
                manifest.layers.len() == 2,
                "number of layers must be 2 but got {}",
                manifest.layers.len()
            );
            let i = manifest
                .layers
                .iter()
                .position(|l| l.media_type == WASM_CONTENT_LAYER)
                .with_context(|| {
                    format!("could not find the layer of type {WASM_CONTENT_LAYER}")
                })?;
            layer(i).map_err(Into::into)
        })();
        match oci {
            Ok(m) => Ok((m, "oci")),
            Err(oci_err) => bail!(
                "the given image is in invalid format as an OCI image: could not parse as compat variant: {compat_err:#}; could not parse as oci variant: {oci_err:#}"
            ),
        }
    });
    Ok((digest, fetcher))
}

/// imagefetcher.go `extractWasmPluginBinary`: gunzip, untar, the first entry named
/// `plugin.wasm` (at any depth).
pub fn extract_plugin_wasm(gz: &[u8]) -> Result<Vec<u8>> {
    let reader = flate2::read::GzDecoder::new(gz).take(MAX_WASM_BYTES);
    let mut archive = tar::Archive::new(reader);
    for entry in archive
        .entries()
        .context("failed to parse layer as tar.gz")?
    {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        if path.file_name().and_then(|n| n.to_str()) == Some(PLUGIN_FILE) {
            let mut out = Vec::new();
            entry
                .read_to_end(&mut out)
                .with_context(|| format!("failed to read {PLUGIN_FILE}"))?;
            return Ok(out);
        }
    }
    bail!("{PLUGIN_FILE} not found in the archive")
}
