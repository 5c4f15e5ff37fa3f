//! Simulated node for holdfast's end-to-end tests, benchmarks and demo.

pub mod echo;
pub mod envoy;
pub mod sim;
