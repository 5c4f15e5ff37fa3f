//! The agent's Prometheus metrics (served at `/metrics` on the status API). Every name starts
//! with `holdfast_`; every metric has help text. Pod tasks record into `Metrics`; the phase
//! gauge is computed from the status board at scrape time, so it can never drift.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::api::{Mesh, SidecarMode};
use crate::report::board::{Phase, StatusBoard};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OutcomeLabel {
    pub(crate) outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindLabel {
    pub(crate) kind: String,
}

/// A lifecycle stage and an input it ignored (`lifecycle::machine::Stage::name`,
/// `lifecycle::messages::Input::name`: both fixed sets, so the series are bounded).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct IgnoredLabel {
    pub(crate) stage: String,
    pub(crate) input: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PhaseLabel {
    pub(crate) phase: PhaseValue,
    /// `classic`, `native`, or `none` (a skipped pod: holdfast acts in no mode).
    pub(crate) mode: String,
    /// `istio`, `kuma`, `consul` (the mesh profile the pod is followed with), or `none` (a
    /// skipped pod). 6 tracked phases × 2 modes × 3 meshes + 1: 37 series per agent.
    pub(crate) mesh: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum PhaseValue {
    waiting_for_netns,
    holding,
    ready,
    draining,
    quitting,
    done,
    skipped,
}

impl From<Phase> for PhaseValue {
    fn from(p: Phase) -> Self {
        match p {
            Phase::WaitingForNetns => PhaseValue::waiting_for_netns,
            Phase::Holding => PhaseValue::holding,
            Phase::Ready => PhaseValue::ready,
            Phase::Draining => PhaseValue::draining,
            Phase::Quitting => PhaseValue::quitting,
            Phase::Done => PhaseValue::done,
            Phase::Skipped => PhaseValue::skipped,
        }
    }
}

/// Everything the agent counts. Cheap to clone (shared state).
#[derive(Clone)]
pub(crate) struct Metrics {
    pub(crate) holds_started: Counter,
    pub(crate) holds_released: Family<OutcomeLabel, Counter>,
    pub(crate) held_connections: Counter,
    pub(crate) hold_duration: Histogram,
    pub(crate) hold_release_latency: Histogram,
    pub(crate) drains: Family<OutcomeLabel, Counter>,
    pub(crate) drain_duration: Histogram,
    pub(crate) drain_exit_lag: Histogram,
    pub(crate) drain_errors: Counter,
    pub(crate) jobs: Family<OutcomeLabel, Counter>,
    pub(crate) admin_errors: Family<KindLabel, Counter>,
    /// Pods failed open (left alone) because they broke one of the agent's bounds.
    pub(crate) pods_failed_open: Counter,
    /// Inputs a pod's lifecycle stage had nothing to do with (`Effect::Ignored`).
    pub(crate) inputs_ignored: Family<IgnoredLabel, Counter>,
    /// Status API connections closed at accept at a connection limit (the server counts them).
    pub(crate) status_api_rejected: Counter,
    /// Pod tasks that panicked (an agent bug); each is restarted (`agent::Pods`).
    pub(crate) pod_task_panics: Counter,
    /// 1 while `/readyz` answers 200 (the first pod list is loaded), else 0: set at scrape
    /// time, so an alert can tell "runs but acts on no pod" from "down".
    pub(crate) ready: Gauge,
    /// Pod source entries rejected or ignored now: set at scrape time from the list `/status`
    /// serves (`source::SourceProblems`, passed to the status API; no process-global count).
    pub(crate) source_problems: Gauge,
    /// The startup taint's removal (effects/node_taint.rs): pending until the node is seen
    /// free of it, and the refused tries.
    pub(crate) startup_taint: crate::effects::node_taint::TaintMetrics,
    pods_by_phase: Family<PhaseLabel, Gauge>,
}

fn seconds_buckets() -> Histogram {
    // 1 ms .. ~65 s
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

impl Metrics {
    /// Creates the metrics and registers them (with help text) in `registry`.
    pub(crate) fn new(registry: &mut Registry) -> Self {
        let histogram = seconds_buckets;
        let m = Metrics {
            holds_started: Counter::default(),
            holds_released: Family::default(),
            held_connections: Counter::default(),
            hold_duration: histogram(),
            hold_release_latency: histogram(),
            drains: Family::default(),
            drain_duration: histogram(),
            drain_exit_lag: histogram(),
            drain_errors: Counter::default(),
            jobs: Family::default(),
            admin_errors: Family::default(),
            pods_failed_open: Counter::default(),
            inputs_ignored: Family::default(),
            status_api_rejected: Counter::default(),
            pod_task_panics: Counter::default(),
            ready: Gauge::default(),
            source_problems: Gauge::default(),
            startup_taint: Default::default(),
            pods_by_phase: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("holdfast");
        r.register(
            "holds_started",
            "Startup holds put in place (or adopted)",
            m.holds_started.clone(),
        );
        r.register(
            "holds_released",
            "Startup holds ended, by outcome (ready, deadline, pod-deleted, agent-stopped, failed, sandbox-gone)",
            m.holds_released.clone(),
        );
        r.register(
            "held_connections",
            "Connections held until their proxy was ready",
            m.held_connections.clone(),
        );
        r.register_with_unit(
            "hold_duration",
            "Time from a hold's start to its release",
            prometheus_client::registry::Unit::Seconds,
            m.hold_duration.clone(),
        );
        r.register_with_unit(
            "hold_release_latency",
            "Time from seeing the proxy ready to the verdict that let the held connections go",
            prometheus_client::registry::Unit::Seconds,
            m.hold_release_latency.clone(),
        );
        r.register(
            "drains",
            "Drains on pod deletion, by outcome (app-done, deadline, proxy-gone-early, pod-gone, agent-stopping, not-started, kubelet-ordered, sidecar-lost)",
            m.drains.clone(),
        );
        r.register_with_unit(
            "drain_duration",
            "Time from the pod's deletion seen to the drain's end",
            prometheus_client::registry::Unit::Seconds,
            m.drain_duration.clone(),
        );
        r.register_with_unit(
            "drain_exit_lag",
            "Time from the app's last process exit to the proxy's exit",
            prometheus_client::registry::Unit::Seconds,
            m.drain_exit_lag.clone(),
        );
        r.register(
            "drain_errors",
            "Problems during drains and Job completions (admin API errors, unreadable stats...)",
            m.drain_errors.clone(),
        );
        r.register(
            "jobs",
            "Finished Jobs whose proxy the agent stopped, by outcome (completed, proxy-already-gone, proxy-not-stopped, not-started)",
            m.jobs.clone(),
        );
        r.register(
            "pods",
            "Pods on the board by phase, sidecar mode (classic, native) and mesh (the name of the mesh profile the pod is followed with); mode and mesh none for skipped pods",
            m.pods_by_phase.clone(),
        );
        r.register(
            "pod_task_panics",
            "Pod tasks that panicked (an agent bug: please report it); each pod's lifecycle is restarted, adopting its hold or drain",
            m.pod_task_panics.clone(),
        );
        r.register(
            "status_api_rejected_connections",
            "Status API connections closed at accept because a connection limit was reached",
            m.status_api_rejected.clone(),
        );
        r.register(
            "admin_errors",
            "Failed Envoy admin API requests, by kind (connect, timeout, http, malformed, too-large, io)",
            m.admin_errors.clone(),
        );
        r.register(
            "pods_failed_open",
            "Pods left alone because they broke one of the agent's bounds (an oversized admin answer, netlink messages not from the kernel on the hold's queue, ...): their hold released as without the agent",
            m.pods_failed_open.clone(),
        );
        r.register(
            "inputs_ignored",
            "Inputs a pod's lifecycle stage had nothing to do with (a pod update an executor follows itself, a stray timer, an answer for another stage), by stage and input; the input's facts are kept",
            m.inputs_ignored.clone(),
        );
        r.register(
            "source_problems",
            "Pod source entries rejected or ignored now (bad files, symlink loops, duplicate uids); listed on /status",
            m.source_problems.clone(),
        );
        r.register(
            "ready",
            "1 when the agent is ready (/readyz answers 200: its first pod list is loaded), else 0",
            m.ready.clone(),
        );
        r.register(
            "startup_taint_pending",
            "1 while the agent has not yet seen its node free of its startup taint holdfast.io/agent-not-ready (removing it, or retrying after the API server refused), else 0",
            m.startup_taint.pending.clone(),
        );
        r.register(
            "startup_taint_removal_failures",
            "Refused tries to remove the startup taint from the agent's node (each retried: 1 s, doubling, then every 60 s)",
            m.startup_taint.failures.clone(),
        );
        for k in ["connect", "timeout", "http", "malformed", "too-large", "io"] {
            let _ = m.admin_errors.get_or_create(&KindLabel { kind: k.into() });
        }
        // Every known outcome exists from the start (at 0), so rates and alerts never see an
        // absent series.
        for o in [
            "ready",
            "deadline",
            "pod-deleted",
            "agent-stopped",
            "failed",
            "sandbox-gone",
        ] {
            let _ = m.holds_released.get_or_create(&Metrics::outcome(o));
        }
        for o in [
            "app-done",
            "deadline",
            "proxy-gone-early",
            "pod-gone",
            "agent-stopping",
            "not-started",
            "kubelet-ordered",
            "sidecar-lost",
        ] {
            let _ = m.drains.get_or_create(&Metrics::outcome(o));
        }
        for o in [
            "completed",
            "proxy-already-gone",
            "proxy-not-stopped",
            "not-started",
        ] {
            let _ = m.jobs.get_or_create(&Metrics::outcome(o));
        }
        m
    }

    /// Refreshes the per-phase gauge from the board (called at scrape time).
    pub(crate) fn observe_board(&self, board: &StatusBoard) {
        let phases = [
            Phase::WaitingForNetns,
            Phase::Holding,
            Phase::Ready,
            Phase::Draining,
            Phase::Quitting,
            Phase::Done,
            Phase::Skipped,
        ];
        let modes = ["classic", "native", "none"];
        let meshes = Mesh::ALL;
        // [phase][mode][mesh]; a skipped pod counts under mode and mesh `none` (index 3).
        let mut counts = [[[0i64; 4]; 3]; 7];
        for row in board.snapshot() {
            let (m, mesh) = match (row.phase, row.mode) {
                (Phase::Skipped, _) | (_, None) => (2, 3),
                (_, Some(mode)) => (
                    match mode {
                        SidecarMode::Classic => 0,
                        SidecarMode::Native => 1,
                    },
                    meshes
                        .iter()
                        .position(|x| Some(*x) == row.mesh)
                        .unwrap_or(0),
                ),
            };
            if let Some(i) = phases.iter().position(|p| *p == row.phase) {
                counts[i][m][mesh] += 1;
            }
        }
        for (p, per_mode) in phases.iter().zip(counts) {
            for (mode, per_mesh) in modes.iter().zip(per_mode) {
                // Skipped pods have no mode and no mesh; tracked ones always do: no always-0
                // series.
                if (*p == Phase::Skipped) != (*mode == "none") {
                    continue;
                }
                for (j, n) in per_mesh.iter().enumerate() {
                    let mesh = match meshes.get(j) {
                        Some(m) if *mode != "none" => m.as_str(),
                        None if *mode == "none" => "none",
                        _ => continue,
                    };
                    self.pods_by_phase
                        .get_or_create(&PhaseLabel {
                            phase: (*p).into(),
                            mode: (*mode).to_string(),
                            mesh: mesh.to_string(),
                        })
                        .set(*n);
                }
            }
        }
    }

    /// Counts an input the lifecycle stage `stage` ignored.
    pub(crate) fn input_ignored(&self, stage: &str, input: &str) {
        self.inputs_ignored
            .get_or_create(&IgnoredLabel {
                stage: stage.to_string(),
                input: input.to_string(),
            })
            .inc();
    }

    pub(crate) fn outcome(s: &str) -> OutcomeLabel {
        OutcomeLabel {
            outcome: s.to_string(),
        }
    }
}

/// The registry and metrics together, as the status API serves them.
#[derive(Clone)]
pub struct MetricsHandle {
    pub(crate) registry: Arc<Registry>,
    pub(crate) metrics: Metrics,
}

impl MetricsHandle {
    /// The agent's metrics, its own resources read under this process's `/proc`.
    pub fn new() -> Self {
        Self::with_proc_root(std::path::Path::new("/proc"))
    }

    /// The agent's metrics, its own resources read under `proc_root` (`--proc-root`).
    pub(crate) fn with_proc_root(proc_root: &std::path::Path) -> Self {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        crate::report::process_metrics::register(&mut registry, proc_root);
        Self {
            registry: Arc::new(registry),
            metrics,
        }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self, board: &StatusBoard) -> String {
        self.metrics.observe_board(board);
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

impl Default for MetricsHandle {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each tracked pod counts under its mesh; a skipped one under `none`; a pod gone brings
    /// its series back to 0 (the series stays).
    #[test]
    fn pods_are_counted_by_mesh() {
        let h = MetricsHandle::new();
        let board = StatusBoard::default();
        let row = |name: &str, phase, mode, mesh| crate::api::PodStatus {
            namespace: "ns".into(),
            name: name.into(),
            uid: name.into(),
            phase,
            mode,
            mesh,
            tracked_since: std::time::SystemTime::now(),
            hold: None,
            drain: None,
            job: None,
            last_error: None,
            skipped_reason: None,
            timeline: None,
        };
        board.put(row(
            "a",
            Phase::Holding,
            Some(SidecarMode::Classic),
            Some(Mesh::Kuma),
        ));
        board.put(row(
            "b",
            Phase::Ready,
            Some(SidecarMode::Native),
            Some(Mesh::Consul),
        ));
        board.put(row("c", Phase::Skipped, None, None));
        let text = h.encode(&board);
        for line in [
            "holdfast_pods{phase=\"holding\",mode=\"classic\",mesh=\"kuma\"} 1",
            "holdfast_pods{phase=\"holding\",mode=\"classic\",mesh=\"istio\"} 0",
            "holdfast_pods{phase=\"ready\",mode=\"native\",mesh=\"consul\"} 1",
            "holdfast_pods{phase=\"skipped\",mode=\"none\",mesh=\"none\"} 1",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        assert_eq!(text.matches("holdfast_pods{").count(), 37, "{text}");
        let text = h.encode(&StatusBoard::default());
        assert!(text.contains("holdfast_pods{phase=\"holding\",mode=\"classic\",mesh=\"kuma\"} 0"));
    }

    #[test]
    fn every_metric_is_prefixed_and_documented() {
        let h = MetricsHandle::new();
        h.metrics.holds_started.inc();
        h.metrics
            .holds_released
            .get_or_create(&Metrics::outcome("ready"))
            .inc();
        h.metrics.hold_release_latency.observe(0.002);
        h.metrics.ready.set(1);
        let text = h.encode(&StatusBoard::default());
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            assert!(line.starts_with("holdfast_"), "{line}");
        }
        for name in [
            "holdfast_holds_started",
            "holdfast_holds_released",
            "holdfast_held_connections",
            "holdfast_hold_duration_seconds",
            "holdfast_hold_release_latency_seconds",
            "holdfast_drains",
            "holdfast_drain_duration_seconds",
            "holdfast_drain_exit_lag_seconds",
            "holdfast_drain_errors",
            "holdfast_jobs",
            "holdfast_pods",
            "holdfast_admin_errors",
            "holdfast_pods_failed_open",
            "holdfast_ready",
            "holdfast_process_cpu_seconds",
            "holdfast_process_open_fds",
            "holdfast_source_problems",
            "holdfast_status_api_rejected_connections",
            "holdfast_startup_taint_pending",
            "holdfast_startup_taint_removal_failures",
        ] {
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{name} has no help:\n{text}"
            );
        }
        assert!(
            text.contains("holdfast_holds_released_total{outcome=\"ready\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("holdfast_pods{phase=\"holding\",mode=\"classic\",mesh=\"istio\"} 0"),
            "{text}"
        );
        assert!(text.contains("\nholdfast_ready 1\n"), "{text}");
        h.metrics.ready.set(0);
        assert!(h
            .encode(&StatusBoard::default())
            .contains("\nholdfast_ready 0\n"));
    }
}
