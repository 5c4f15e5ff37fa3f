//! Benchmark sections that run on the simulated node (the `filter` section lives in the
//! `holdfast-bench` binary itself). Each section prints its table and returns; none fails on a
//! figure.

pub mod drain;
pub mod hold;
pub mod lifecycle;
pub mod scale;
pub mod scale_observer;

use anyhow::Result;

use crate::agent::AgentProcess;
use crate::sim::SimNode;

/// Starts the real agent on `node` (only that node's pods directory: it holds only its pods).
pub fn start_agent(node: &SimNode) -> Result<AgentProcess> {
    AgentProcess::start(
        node.node_name(),
        node.pods_dir(),
        &node.work_dir().join("agent.log"),
        &[],
    )
}

/// Nearest-rank percentile (`p` in 0..=1) of unsorted samples; `None` when there are none.
pub fn percentile(v: &[f64], p: f64) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i.min(v.len().saturating_sub(1))).copied()
}

/// A goal cell: `yes`, or a bold `no`.
pub fn yes_no(b: bool) -> String {
    if b { "yes" } else { "**no**" }.into()
}

/// The 1-minute load average, to show how busy the machine was.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}
