//! Simulated node for holdfast's end-to-end tests, benchmarks and demo.

pub mod envoy;
