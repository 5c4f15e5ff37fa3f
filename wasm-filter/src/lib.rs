//! holdfast's proxy-wasm network filter: counts connections per direction and tells readers the
//! counts are live, on every worker.
//!
//! Loaded into a sidecar Envoy as an `envoy.filters.network.wasm` filter (root id `holdfast`) on
//! its listeners. Every connection is counted under its listener's direction (inbound, outbound,
//! or `unknown` for a listener without `traffic_direction`), taken from the plugin configuration
//! (`direction`) or else read once per plugin instance from the property
//! `xds.listener_direction`. Per direction it keeps these Envoy stats (served by the admin API as
//! `wasmcustom.<name>`):
//!
//! - `holdfast.<dir>.cx_active` (gauge): connections open now;
//! - `holdfast.<dir>.cx_total` (counter): connections seen;
//! - `holdfast.workers_ready` (gauge): how many Envoy worker threads have the filter configured;
//!   equal to Envoy's `server.concurrency` when every worker counts connections;
//! - `holdfast.loaded` (gauge): 1 once any copy accepted the configuration (compatibility).
//!
//! It counts no bytes: Envoy's own `downstream_cx_{rx,tx}_bytes_total` do, per listener, and a
//! callback per data chunk would cost a VM entry each (docs/filter-stats.md, "Telling idle from
//! in-flight"). The filter never blocks, delays or changes traffic, and fails open: a failed
//! hostcall is logged once and then ignored.
//!
//! # Layout
//! - [`config`]: the optional JSON plugin configuration, parsed and validated once;
//! - [`direction`]: decoding the listener direction property;
//! - [`stats`]: stat names, and the per-connection ledger that counts each connection exactly once;
//! - [`workers`]: the bookkeeping behind `workers_ready`;
//! - `glue` (wasm32 only): the proxy-wasm ABI written out — the exports Envoy calls (only those
//!   the counting needs) and every hostcall; the only `unsafe` code.
//!
//! Everything except `glue` is plain Rust, tested natively with `cargo test -p holdfast-filter`.

// The ABI glue needs `unsafe` for its imports, the allocator and `_initialize`: each block is
// allowed where it stands, with its reason. The native build has none and forbids it outright.
#![cfg_attr(not(target_arch = "wasm32"), forbid(unsafe_code))]
#![cfg_attr(target_arch = "wasm32", deny(unsafe_code))]

pub mod config;
pub mod direction;
pub mod stats;
pub mod workers;

#[cfg(target_arch = "wasm32")]
mod glue;
