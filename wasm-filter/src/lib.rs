//! holdfast's proxy-wasm network filter: counts connections per direction and tells readers the
//! counts are live.
//!
//! Loaded into a sidecar Envoy as an `envoy.filters.network.wasm` filter (root id `holdfast`) on
//! its listeners. For every connection it reads the listener's direction (property
//! `xds.listener_direction`: INBOUND, OUTBOUND, or none = `unknown`) once, and keeps, per
//! direction, these Envoy stats (served by the admin API as `wasmcustom.<name>`):
//!
//! - `holdfast.<dir>.cx_active` (gauge): connections open now;
//! - `holdfast.<dir>.cx_total` (counter): connections seen;
//! - `holdfast.<dir>.bytes_total` (counter): bytes moved through connections, both ways. A reader
//!   that sees it unchanged over a window knows no connection had traffic in flight: idle
//!   keep-alive connections count in `cx_active` but do not move it;
//! - `holdfast.loaded` (gauge): 1 once the configuration is accepted.
//!
//! The filter never blocks, delays or changes traffic, and fails open: a failed hostcall is
//! logged once and then ignored.
//!
//! # Layout
//! - [`config`]: the optional JSON plugin configuration, parsed and validated once;
//! - [`direction`]: decoding the listener direction property;
//! - [`stats`]: stat names, and the per-connection ledger that counts each connection exactly once;
//! - `glue` (wasm32 only): the proxy-wasm root and stream contexts, the only code with hostcalls.
//!
//! Everything except `glue` is plain Rust, tested natively with `cargo test -p holdfast-filter`.

// `proxy_wasm::main!` expands to the module's `#[no_mangle]` entry point and an `unsafe` call
// to the WASI constructors, so the wasm build can only deny (and allow in that one macro);
// the native build has no such code and forbids unsafe outright.
#![cfg_attr(not(target_arch = "wasm32"), forbid(unsafe_code))]
#![cfg_attr(target_arch = "wasm32", deny(unsafe_code))]

pub mod config;
pub mod direction;
pub mod stats;

#[cfg(target_arch = "wasm32")]
mod glue;
