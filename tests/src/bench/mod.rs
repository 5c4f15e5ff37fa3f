//! Benchmark sections that run on the simulated node (the `filter` section lives in the
//! `holdfast-bench` binary itself). Each section prints its table and returns; none fails on a
//! figure.

pub mod drain;
pub mod hold;
