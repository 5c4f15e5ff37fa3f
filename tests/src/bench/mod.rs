//! Benchmark sections that run on the simulated node (the `filter` section lives in the
//! `holdfast-bench` binary itself). Each section prints its table and returns; none fails on a
//! figure.

pub mod drain;
pub mod fanout;
pub mod hold;
pub mod lifecycle;
pub mod meshes;
pub mod scale;
pub mod scale_observer;

use anyhow::{Context as _, Result};

use crate::agent::AgentProcess;
use crate::sim::pod_object::CState;
use crate::sim::report::AppEvent;
use crate::sim::{AppReport, NodeOptions, Phase, PodSpec, PodView, SimNode};

/// Starts the real agent on `node` (only that node's pods directory: it holds only its pods).
pub fn start_agent(node: &SimNode) -> Result<AgentProcess> {
    AgentProcess::start(
        node.node_name(),
        node.pods_dir(),
        &node.work_dir().join("agent.log"),
        &[],
    )
}

/// One variant of a side-by-side run: each gets a simulated node of its own.
pub trait Side: Copy + PartialEq {
    /// The variant whose node the agent runs on.
    const HOLDFAST: Self;
    /// Its row in the tables.
    fn label(self) -> &'static str;
    /// Its simulated node's name (namespaces `hf-<it>-<pod>`).
    fn node_name(self) -> &'static str;
}

/// Builds one node per variant with `pods(variant)` on it, starts the agent on
/// [`Side::HOLDFAST`]'s node (it watches only that node's pods directory, so it acts only on
/// holdfast's pods), then starts every node's pods: the variants run side by side, at once.
pub fn side_by_side<V: Side>(
    variants: &[V],
    opts: &NodeOptions,
    mut pods: impl FnMut(V) -> Vec<PodSpec>,
) -> Result<(Vec<(V, SimNode)>, AgentProcess)> {
    let mut nodes = Vec::new();
    for &v in variants {
        let mut node = SimNode::with_options(v.node_name(), opts.clone())
            .with_context(|| format!("building the {} node", v.label()))?;
        for spec in pods(v) {
            node.add_pod(spec)?;
        }
        nodes.push((v, node));
    }
    let agent = {
        let (_, node) = nodes
            .iter()
            .find(|(v, _)| *v == V::HOLDFAST)
            .context("no holdfast node")?;
        start_agent(node)?
    };
    for (_, node) in &mut nodes {
        node.start_pods()?;
    }
    Ok((nodes, agent))
}

/// When the pod started, as the benchmarks count it: its init container's end (µs).
pub fn pod_start_us(view: &PodView) -> Option<u64> {
    view.init.as_ref().and_then(|c| match &c.state {
        CState::Terminated(t) => u64::try_from(t.finished_at.as_microsecond()).ok(),
        _ => None,
    })
}

/// From an app's report: when it first started and when its first boot call succeeded (µs).
pub fn boot_times(report: &AppReport) -> (Option<u64>, Option<u64>) {
    let (mut start, mut first_ok) = (None, None);
    for e in &report.events {
        match e {
            AppEvent::Start { at_ms, at_us, .. } => {
                start = start.or(Some(at_us.unwrap_or(at_ms * 1000)));
            }
            AppEvent::Call {
                at_ms,
                at_us,
                phase: Phase::Startup,
                ok: true,
                ..
            } => {
                first_ok = first_ok.or(Some(at_us.unwrap_or(at_ms * 1000)));
            }
            _ => {}
        }
    }
    (start, first_ok)
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
