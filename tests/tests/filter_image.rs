//! The filter as a cluster gets it: its image built as `just image` builds it (from the same
//! `target/holdfast_filter.wasm`), pushed to a registry on loopback (Debian's docker-registry),
//! the install pinned to it with the kustomize edit `just image` prints, and fetched **the way
//! pilot-agent fetches a WasmPlugin's module** (holdfast_tests::istio_wasm, ported from
//! istio/istio pkg/wasm): by the digest in the rendered WasmPlugin's `url`, checked against the
//! image manifest's digest. The module fetched is then loaded into real Envoy with the filter
//! config istiod builds from each rendered WasmPlugin, and counts connections in its stats.
//!
//! Also: both of pilot-agent's OCI shapes (compat and oci) extract the same module; a `sha256`
//! holding the module's own digest (what the docs used to advise) is refused exactly as
//! pilot-agent refuses it; the images are reproducible.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use holdfast_image::filter::{self, Variant};
use holdfast_image::layout::{sha256_digest, OciLayout};
use holdfast_image::pin::Pins;
use holdfast_image::registry::{ImageRef, LocalRegistry};
use holdfast_tests::echo::EchoServer;
use holdfast_tests::envoy::{self, bootstrap, static_cluster, Envoy, EnvoyOptions};
use holdfast_tests::istio_wasm::{self, WasmPluginSpec};
use holdfast_tests::kustomize;
use serde_json::json;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn skip_or_fail(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{why} (CI is set: not skipping)");
    }
    eprintln!("SKIP: {why}");
}

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(label: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("hf-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch dir");
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Setup {
    module: Vec<u8>,
    scratch: Scratch,
    registry: LocalRegistry,
}

fn setup(label: &str) -> Option<Setup> {
    let wasm = match envoy::filter_wasm() {
        Ok(w) => w,
        Err(e) => {
            skip_or_fail(&format!("needs the filter (`just filter`): {e}"));
            return None;
        }
    };
    let module = std::fs::read(&wasm).expect("reading the filter module");
    let scratch = Scratch::new(label);
    let registry = match LocalRegistry::start(&scratch.0.join("registry"), 0) {
        Ok(r) => r,
        Err(e) => {
            skip_or_fail(&format!(
                "needs Debian's docker-registry (`just setup`): {e}"
            ));
            return None;
        }
    };
    Some(Setup {
        module,
        scratch,
        registry,
    })
}

/// Builds the filter image `variant` into a layout and pushes it as `repo:VERSION`; returns the
/// reference pinned to the manifest digest.
fn push(s: &Setup, variant: Variant, repo: &str) -> ImageRef {
    let dir = s.scratch.0.join(repo.replace('/', "_"));
    let built = filter::build(&s.module, variant, VERSION, "holdfast", 0, &dir, VERSION)
        .expect("building the filter image");
    let client = s.registry.client().expect("client");
    let digest = client
        .push(
            &OciLayout::open(&dir).expect("layout"),
            VERSION,
            repo,
            VERSION,
        )
        .expect("pushing");
    assert_eq!(
        digest, built.digest,
        "the registry keeps the manifest as built"
    );
    ImageRef::parse(&format!("{}/{repo}:{VERSION}", s.registry.host()))
        .expect("reference")
        .at_digest(&digest)
}

/// The WasmPlugins of `manifests/` rendered through the overlay that pins the filter to `filter`.
fn rendered_wasmplugins(s: &Setup, filter: &ImageRef) -> Vec<WasmPluginSpec> {
    let pins = Pins::new(None, Some(filter.clone())).expect("pins");
    let dir = std::path::absolute(s.scratch.0.join("overlay")).expect("absolute");
    std::fs::create_dir_all(&dir).expect("overlay dir");
    let base = holdfast_image::release::relative(&dir, &envoy::workspace_root().join("manifests"));
    std::fs::write(
        dir.join("kustomization.yaml"),
        pins.overlay(&base.to_string_lossy()),
    )
    .expect("writing the overlay");
    let rendered = kustomize::render(Path::new("/"), dir.strip_prefix("/").expect("absolute"))
        .expect("rendering the overlay");
    let plugins: Vec<WasmPluginSpec> = rendered
        .objects
        .iter()
        .filter(|o| o.kind() == "WasmPlugin")
        .map(|o| WasmPluginSpec::from_object(&o.value).expect("a WasmPlugin"))
        .collect();
    assert_eq!(plugins.len(), 2, "one WasmPlugin per direction");
    plugins
}

#[test]
fn filter_images_are_reproducible() {
    let Some(s) = setup("filterrepro") else {
        return;
    };
    for variant in [Variant::Compat, Variant::OciArtifact] {
        let a = filter::build(
            &s.module,
            variant,
            VERSION,
            "holdfast",
            0,
            &s.scratch.0.join("a"),
            VERSION,
        )
        .expect("build a");
        let b = filter::build(
            &s.module,
            variant,
            VERSION,
            "holdfast",
            0,
            &s.scratch.0.join("b"),
            VERSION,
        )
        .expect("build b");
        assert_eq!(a.digest, b.digest, "{variant:?}: same inputs, same digest");
        assert_eq!(a.manifest, b.manifest);
        let c = filter::build(
            &s.module,
            variant,
            VERSION,
            "holdfast",
            1,
            &s.scratch.0.join("c"),
            VERSION,
        )
        .expect("build c");
        assert_ne!(a.digest, c.digest, "{variant:?}: the epoch is an input");
    }
    let mut not_wasm = s.module.clone();
    not_wasm[0] = b'x';
    let err = filter::build(
        &not_wasm,
        Variant::Compat,
        VERSION,
        "holdfast",
        0,
        &s.scratch.0.join("d"),
        VERSION,
    )
    .expect_err("not a module")
    .to_string();
    assert!(err.contains("just filter"), "{err}");
}

/// The shipped (compat) image, pinned by the printed kustomize edit, fetched as pilot-agent
/// fetches it, loaded in Envoy as istiod configures it: both directions count connections.
#[test]
fn pinned_wasmplugins_fetch_the_module_by_digest_and_it_counts_in_envoy() {
    let Some(s) = setup("filterfetch") else {
        return;
    };
    let pinned = push(&s, Variant::Compat, "holdfast/filter");
    let plugins = rendered_wasmplugins(&s, &pinned);
    let module_path = s.scratch.0.join("fetched.wasm");
    for p in &plugins {
        assert_eq!(
            p.url,
            format!("oci://{pinned}"),
            "{}: the url the edit pins",
            p.name
        );
        assert_eq!(
            p.expected_checksum().as_deref(),
            pinned
                .digest
                .as_deref()
                .map(|d| d.trim_start_matches("sha256:")),
            "pilot-agent expects the manifest digest from the url"
        );
        let fetched = istio_wasm::fetch(p).expect("pilot-agent's fetch");
        assert_eq!(fetched.variant, "compat");
        assert_eq!(
            Some(fetched.manifest_digest.as_str()),
            pinned.digest.as_deref()
        );
        assert!(
            fetched.module == s.module,
            "{}: the fetched module is the built one",
            p.name
        );
        std::fs::write(&module_path, &fetched.module).expect("writing the fetched module");
        assert_eq!(
            p.plugin_name.as_deref(),
            Some("holdfast"),
            "root id: pluginName"
        );
    }

    // Envoy, with each WasmPlugin's filter as istiod builds it, on the listener side it
    // matches (SERVER: inbound, CLIENT: outbound), tcp_proxy to an echo server.
    let echo = EchoServer::start().expect("echo");
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let listener = |p: &WasmPluginSpec, direction: &str| {
        json!({
            "name": p.name,
            "traffic_direction": direction,
            "address": {"socket_address": {"address": any.ip().to_string(), "port_value": 0}},
            "filter_chains": [{"filters": [
                p.envoy_filter(&module_path),
                {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    "stat_prefix": p.name, "cluster": "echo"}}
            ]}]
        })
    };
    let inbound = plugins
        .iter()
        .find(|p| p.name == "holdfast-inbound")
        .expect("inbound");
    let outbound = plugins
        .iter()
        .find(|p| p.name == "holdfast-outbound")
        .expect("outbound");
    let bs = bootstrap(
        vec![listener(inbound, "INBOUND"), listener(outbound, "OUTBOUND")],
        vec![static_cluster("echo", echo.addr())],
    );
    let opts = EnvoyOptions {
        concurrency: 2,
        label: "filter-image".into(),
        ..EnvoyOptions::default()
    };
    let envoy = Envoy::start_value(&bs, &opts).expect("Envoy with the fetched module");
    envoy
        .admin()
        .wait_holdfast_stat("workers_ready", 2, Duration::from_secs(10))
        .expect("the filter is configured on every worker");
    for (name, dir) in [
        ("holdfast-inbound", "inbound"),
        ("holdfast-outbound", "outbound"),
    ] {
        let addr = envoy.listener_addr(name).expect("listener");
        let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        c.write_all(b"ping").expect("write");
        let mut buf = [0u8; 4];
        c.read_exact(&mut buf).expect("echo");
        envoy
            .admin()
            .wait_holdfast_stat(&format!("{dir}.cx_total"), 1, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{name}: the fetched filter counts {dir}: {e}"));
    }
    drop(envoy);
    drop(echo);
}

/// pilot-agent compares `sha256` with the image manifest's digest: the module's own sha256 (the
/// docs' old advice) is refused, with its message; the manifest digest is accepted; and so is
/// the oci variant, whose module layer pilot-agent reads raw.
#[test]
fn sha256_is_the_manifest_digest_and_both_oci_shapes_extract() {
    let Some(s) = setup("filtersha") else {
        return;
    };
    let pinned = push(&s, Variant::Compat, "holdfast/filter");
    let by_tag = format!("oci://{}/holdfast/filter:{VERSION}", s.registry.host());
    let spec = |url: &str, sha256: Option<String>| WasmPluginSpec {
        namespace: "istio-system".into(),
        name: "holdfast-inbound".into(),
        url: url.to_string(),
        sha256,
        plugin_name: Some("holdfast".into()),
        plugin_config: None,
        fail_strategy: Some("FAIL_OPEN".into()),
    };
    let module_sha = sha256_digest(&s.module)
        .trim_start_matches("sha256:")
        .to_string();
    let err = istio_wasm::fetch(&spec(&by_tag, Some(module_sha.clone())))
        .expect_err("the module's own digest is not what pilot-agent compares")
        .to_string();
    assert!(
        err.contains("which does not match") && err.contains(&module_sha),
        "{err}"
    );
    let manifest_hex = pinned
        .digest
        .as_deref()
        .expect("digest")
        .trim_start_matches("sha256:")
        .to_string();
    let ok = istio_wasm::fetch(&spec(&by_tag, Some(manifest_hex.clone())))
        .expect("sha256 = the manifest digest");
    assert!(ok.module == s.module);
    // By tag with no sha256: fetched, unpinned.
    assert!(istio_wasm::fetch(&spec(&by_tag, None)).is_ok());
    // A digest in the url that is not this image's: the registry has no such manifest.
    let wrong = format!(
        "oci://{}/holdfast/filter@sha256:{}",
        s.registry.host(),
        "0".repeat(64)
    );
    assert!(istio_wasm::fetch(&spec(&wrong, None)).is_err());

    let oci = push(&s, Variant::OciArtifact, "holdfast/filter-oci");
    let fetched = istio_wasm::fetch(&spec(&format!("oci://{oci}"), None)).expect("oci variant");
    assert_eq!(fetched.variant, "oci");
    assert!(fetched.module == s.module);
    assert_ne!(oci.digest, pinned.digest, "another image, another digest");
}
