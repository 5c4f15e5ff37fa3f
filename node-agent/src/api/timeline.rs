//! A pod's timeline on its status row: the steps of its lifecycle as the agent saw them, each
//! with its wall-clock time, bounded per pod (a long-lived pod whose proxy restarts a hundred
//! times keeps the latest [`MAX_STEPS`] and counts the rest).
//!
//! Written only by the recorder (`lifecycle::record`), fed by the lifecycle machine's step
//! effects and the drain and Job executors' steps; read by `holdfast status POD` and `--json`.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::time::rfc3339;

/// Steps kept per pod; older ones are dropped (and counted in [`Timeline::dropped`]).
pub const MAX_STEPS: usize = 40;

/// The longest detail kept on a step (characters); longer is cut with `…`. The details are the
/// agent's own sentences (an error may quote what a pod's Envoy answered): bounded like
/// everything a pod can make the agent keep.
pub const MAX_DETAIL_CHARS: usize = 300;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepKind {
    /// The agent started tracking the pod.
    FirstSeen,
    /// The pod has the proxy container but the agent leaves it alone (the detail says why).
    Skipped,
    /// A process of the pod showed its network namespace (a new one: the sandbox was recreated).
    NetnsFound,
    /// The startup hold rule went in (or was adopted from the previous agent).
    HoldIn,
    /// The app's first connection was held.
    FirstConnectionHeld,
    /// The pod's status shows the proxy container running.
    ProxyRunning,
    /// Envoy's admin port listens (Envoy runs, its capture ports do not listen yet).
    EnvoyStarted,
    /// Envoy's capture ports listen.
    EnvoyListening,
    /// Envoy is LIVE with its workers started (the filter not yet ready on every worker).
    EnvoyLive,
    /// The proxy is ready: LIVE, workers started, the filter ready on every worker.
    ProxyReady,
    /// The hold ended (the detail: its outcome and why).
    HoldReleased,
    /// The pod broke one of the agent's bounds and is left alone.
    FailedOpen,
    /// A problem worth the operator's attention (the row's `last_error` at that moment).
    Problem,
    /// A process of the ready proxy exited while the app ran (OOM-kill, crash).
    ProxyGone,
    /// The pod's deletion was seen: the drain starts.
    DrainStarted,
    /// Envoy was asked to drain inbound (the detail: whether it did, its version).
    InboundDrained,
    /// An app container's processes are all gone (seen by the agent), or its status says it
    /// terminated.
    AppContainerExited,
    /// Every app process is gone.
    AppGone,
    /// A Job's app finished for good (the detail: seen by status or procfs).
    JobAppFinished,
    /// Envoy's counts said idle but the pod's sockets still held bytes for their peers in the
    /// kernel's send queues: the quit waits for them (the detail: how many). Once per drain or
    /// Job watch.
    KernelFlushing,
    /// `/quitquitquit` is being sent (the detail: why — what the in-flight sample said, or the
    /// deadline).
    Quitting,
    /// The proxy was seen gone.
    ProxyExited,
    /// The drain ended (the detail: its outcome and why).
    DrainFinished,
    /// The Job watch ended (the detail: its outcome).
    JobFinished,
    /// A native sidecar's proxy exited during the pod's termination while the app still ran:
    /// the kubelet does not restart it then (outcome `sidecar-lost`).
    SidecarLost,
    /// A step this holdfast does not know (a newer agent's): shown by its position only, so
    /// an older CLI still reads a newer agent's document.
    #[serde(other)]
    Unknown,
}

impl StepKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::FirstSeen => "first-seen",
            StepKind::Skipped => "skipped",
            StepKind::NetnsFound => "netns-found",
            StepKind::HoldIn => "hold-in",
            StepKind::FirstConnectionHeld => "first-connection-held",
            StepKind::ProxyRunning => "proxy-running",
            StepKind::EnvoyStarted => "envoy-started",
            StepKind::EnvoyListening => "envoy-listening",
            StepKind::EnvoyLive => "envoy-live",
            StepKind::ProxyReady => "proxy-ready",
            StepKind::HoldReleased => "hold-released",
            StepKind::FailedOpen => "failed-open",
            StepKind::Problem => "problem",
            StepKind::ProxyGone => "proxy-gone",
            StepKind::DrainStarted => "drain-started",
            StepKind::InboundDrained => "inbound-drained",
            StepKind::AppContainerExited => "app-container-exited",
            StepKind::AppGone => "app-gone",
            StepKind::JobAppFinished => "job-app-finished",
            StepKind::KernelFlushing => "kernel-flushing",
            StepKind::Quitting => "quitting",
            StepKind::ProxyExited => "proxy-exited",
            StepKind::DrainFinished => "drain-finished",
            StepKind::JobFinished => "job-finished",
            StepKind::SidecarLost => "sidecar-lost",
            StepKind::Unknown => "unknown",
        }
    }
}

/// One step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    #[serde(with = "rfc3339")]
    pub at: SystemTime,
    pub step: StepKind,
    /// What the agent knew about it (an outcome and its reason, a count, a container's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A pod's steps in time order, at most [`MAX_STEPS`], the latest kept.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    pub steps: Vec<Step>,
    /// Older steps dropped to keep the bound.
    #[serde(default)]
    pub dropped: u64,
}

impl Timeline {
    /// Adds a step at `at`, in time order (a step dated by a report may be earlier than the
    /// last one recorded), dropping the oldest beyond [`MAX_STEPS`].
    pub fn push(&mut self, at: SystemTime, step: StepKind, detail: Option<String>) {
        // Cut, then escaped: a detail may quote the pod (what its Envoy said), and must stay
        // one line whatever it holds (crate::api::text).
        let detail = detail.map(|d| {
            let d = if d.chars().count() > MAX_DETAIL_CHARS {
                let mut cut: String = d.chars().take(MAX_DETAIL_CHARS - 1).collect();
                cut.push('…');
                cut
            } else {
                d
            };
            match crate::api::text::escape_controls(&d) {
                std::borrow::Cow::Borrowed(_) => d,
                std::borrow::Cow::Owned(escaped) => escaped,
            }
        });
        let i = self.steps.partition_point(|s| s.at <= at);
        self.steps.insert(i, Step { at, step, detail });
        if self.steps.len() > MAX_STEPS {
            let over = self.steps.len() - MAX_STEPS;
            self.steps.drain(..over);
            self.dropped += over as u64;
        }
    }

    /// Whether a step of `kind` is recorded (among those kept).
    pub fn has(&self, kind: StepKind) -> bool {
        self.steps.iter().any(|s| s.step == kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn t(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_800_000_000_000 + ms)
    }

    #[test]
    fn bounded_latest_kept_and_dropped_counted() {
        let mut tl = Timeline::default();
        for i in 0..(MAX_STEPS as u64 + 25) {
            tl.push(t(i), StepKind::ProxyReady, Some(format!("{i}")));
        }
        assert_eq!(tl.steps.len(), MAX_STEPS);
        assert_eq!(tl.dropped, 25);
        assert_eq!(tl.steps[0].detail.as_deref(), Some("25"));
        assert_eq!(
            tl.steps.last().and_then(|s| s.detail.as_deref()),
            Some(&*format!("{}", MAX_STEPS + 24))
        );
    }

    #[test]
    fn a_step_dated_earlier_goes_in_time_order() {
        let mut tl = Timeline::default();
        tl.push(t(0), StepKind::FirstSeen, None);
        tl.push(t(30), StepKind::DrainFinished, None);
        tl.push(t(20), StepKind::ProxyExited, None);
        tl.push(t(30), StepKind::JobFinished, None);
        let kinds: Vec<_> = tl.steps.iter().map(|s| s.step).collect();
        assert_eq!(
            kinds,
            [
                StepKind::FirstSeen,
                StepKind::ProxyExited,
                StepKind::DrainFinished,
                StepKind::JobFinished
            ]
        );
    }

    #[test]
    fn long_details_are_cut_and_json_round_trips() {
        let mut tl = Timeline::default();
        tl.push(t(5), StepKind::Problem, Some("x".repeat(5000)));
        assert_eq!(
            tl.steps[0].detail.as_ref().map(|d| d.chars().count()),
            Some(MAX_DETAIL_CHARS)
        );
        tl.push(t(6), StepKind::HoldIn, None);
        let v = serde_json::to_value(&tl).expect("json");
        assert_eq!(v["steps"][1]["step"], "hold-in");
        assert!(v["steps"][1].get("detail").is_none());
        assert_eq!(v["steps"][1]["at"], "2027-01-15T08:00:00.006Z");
        let back: Timeline = serde_json::from_value(v).expect("back");
        assert_eq!(back, tl);
        // Every kind's name is its serde name.
        for k in [
            StepKind::FirstSeen,
            StepKind::AppContainerExited,
            StepKind::JobAppFinished,
            StepKind::SidecarLost,
        ] {
            assert_eq!(serde_json::to_value(k).expect("json"), k.as_str());
        }
        // A newer agent's step reads as `unknown`, not as a broken document.
        let newer: Step = serde_json::from_value(serde_json::json!({
            "at": "2027-01-15T08:00:00.006Z", "step": "from-the-future"
        }))
        .expect("an unknown step kind parses");
        assert_eq!(newer.step, StepKind::Unknown);
    }
}
