//! Simulated node for holdfast's end-to-end tests, benchmarks and demo.

pub mod agent;
pub mod bench;
pub mod bench_opts;
pub mod cluster;
pub mod cri;
pub mod echo;
pub mod envoy;
pub mod helm;
pub mod hostile;
pub mod istio_wasm;
pub mod kustomize;
pub mod monitoring;
pub mod pod_security;
pub mod resource_quota;
pub mod schema;
pub mod sim;
pub mod soak;
