//! What a drain and a Job quit did, as the `/status` document reports it.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::time::{ms, opt_ms};

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DrainOutcome {
    /// The app exited and nothing was in flight: the proxy was quit (or had just exited).
    AppDone,
    /// The deadline came with the app (or traffic) still there: the proxy was left running to
    /// the grace period's end (the kubelet's kill), as without holdfast — or, in a
    /// kubelet-ordered drain, left to the kubelet at the deadline.
    Deadline,
    /// Envoy exited while the app still ran: the mesh's drain duration is shorter than the
    /// app's shutdown (see [`DrainReport::advice`]).
    ProxyGoneEarly,
    /// The pod vanished from the source (the kubelet finished it) before the drain did.
    PodGone,
    /// The agent is stopping; the next agent drains again.
    AgentStopping,
    /// The drain could not start (no handle on the pod's network namespace): the proxy ends as
    /// without holdfast, by pilot-agent's drain; `errors` says why.
    NotStarted,
    /// A native sidecar with Istio's preStop drain: the kubelet stopped the proxy after the app
    /// (pilot-agent exits at its SIGTERM, sent once the app is gone); holdfast only measured
    /// the lag (`app_gone_to_proxy_exit`).
    KubeletOrdered,
    /// A native sidecar's proxy exited during the pod's termination while the app still ran:
    /// the kubelet does not restart it then (KEP-4438 is not in Kubernetes 1.33–1.35), so the
    /// app had no mesh egress for the rest of its shutdown.
    SidecarLost,
}

impl DrainOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            DrainOutcome::AppDone => "app-done",
            DrainOutcome::Deadline => "deadline",
            DrainOutcome::ProxyGoneEarly => "proxy-gone-early",
            DrainOutcome::PodGone => "pod-gone",
            DrainOutcome::AgentStopping => "agent-stopping",
            DrainOutcome::NotStarted => "not-started",
            DrainOutcome::KubeletOrdered => "kubelet-ordered",
            DrainOutcome::SidecarLost => "sidecar-lost",
        }
    }
}

/// What ended the wait for in-flight traffic when the proxy was quit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum QuitReason {
    /// The filter's counts said nothing is in flight.
    Idle(IdleReason),
    /// The filter was not installed and the app's exit alone decided. Produced by builds before
    /// issue 28 (it could cut a response still being sent); kept so their reports still parse.
    NoFilter,
    /// A finished Job's counts could not be read; the app's exit alone decided (a drain never
    /// quits for this: it waits for the deadline).
    StatsUnavailable,
    /// A finished Job's bounded wait for traffic in flight ran out (a pod's drain never quits
    /// for its deadline: it leaves the proxy to the grace period's end).
    OutOfTime,
}

/// What one drain did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrainReport {
    pub outcome: DrainOutcome,
    #[serde(with = "super::time::rfc3339")]
    pub started_at: SystemTime,
    /// The drain's deadline (`None`: beyond reach).
    #[serde(with = "super::time::rfc3339::option", default)]
    pub deadline_at: Option<SystemTime>,
    pub deadline_meaning: TimestampMeaning,
    /// `POST /drain_listeners?inboundonly&graceful` succeeded.
    pub inbound_drained: bool,
    /// Times the drain undid the mesh's `/healthcheck/fail` (`POST /healthcheck/ok`: Kuma's
    /// kuma-dp fails it on SIGTERM, which would drain-close the app's outbound connections).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub health_checks_restored: u32,
    /// After the quit, the mesh's agent was sent SIGTERM to end its fixed wait (kuma-dp).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub agent_signalled: bool,
    /// The pod's Envoy version, from `/server_info` at the drain's start (`None`: not read).
    #[serde(default)]
    pub envoy_version: Option<String>,
    /// When the app's last process exit was seen (or the app was otherwise seen gone).
    #[serde(with = "super::time::rfc3339::option", default)]
    pub app_gone_at: Option<SystemTime>,
    #[serde(with = "super::time::rfc3339::option", default)]
    pub quit_sent_at: Option<SystemTime>,
    pub quit_reason: Option<QuitReason>,
    /// When the admin API stopped answering after the quit.
    #[serde(with = "super::time::rfc3339::option", default)]
    pub proxy_exit_seen_at: Option<SystemTime>,
    /// From the app gone to the quit sent.
    #[serde(with = "opt_ms", default, rename = "app_gone_to_quit_ms")]
    pub app_gone_to_quit: Option<Duration>,
    /// From the app gone to the admin API gone.
    #[serde(with = "opt_ms", default, rename = "app_gone_to_proxy_exit_ms")]
    pub app_gone_to_proxy_exit: Option<Duration>,
    #[serde(with = "ms", rename = "elapsed_ms")]
    pub elapsed: Duration,
    /// App processes seen during the drain, and alive when it ended.
    pub app_processes_seen: usize,
    pub app_processes_left: usize,
    /// Whether the filter's stats were present (`None`: never read).
    pub filter_present: Option<bool>,
    /// The filter's last counts read.
    pub last_counts: Option<FilterCounts>,
    /// Bytes Envoy had moved for the pod's traffic at the last sample: its own
    /// `downstream_cx_{rx,tx}_bytes_total` counters summed, its admin and Istio's status and
    /// metrics listeners left out. What the idle test watches.
    #[serde(default)]
    pub last_traffic_bytes: Option<u64>,
    /// Admin errors and other problems (at most 10 kept; `error_count` counts all).
    pub errors: Vec<String>,
    pub error_count: usize,
    /// Advice for the operator, when the outcome calls for a configuration change.
    pub advice: Option<String>,
}

/// How a Job watch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobOutcome {
    /// The app finished for good and the proxy was quit: the pod completes.
    Completed,
    /// The app finished for good, but the proxy had already exited.
    ProxyAlreadyGone,
    /// The app finished for good and the proxy was asked to quit, but it still answered
    /// afterwards (`quit_confirm`): the pod does not complete; `errors` says what was seen.
    ProxyNotStopped,
    /// `restartPolicy: Always` (or unknown): the kubelet restarts the app; nothing to do.
    NotAJob,
    /// The pod is being deleted: the drain takes over.
    Deleting,
    /// The pod vanished from the source.
    PodGone,
    /// The agent is stopping.
    AgentStopping,
    /// The Job watch could not start (no handle on the pod's network namespace): the pod runs
    /// as without holdfast; `errors` says why.
    NotStarted,
}

impl JobOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            JobOutcome::Completed => "completed",
            JobOutcome::ProxyAlreadyGone => "proxy-already-gone",
            JobOutcome::ProxyNotStopped => "proxy-not-stopped",
            JobOutcome::NotAJob => "not-a-job",
            JobOutcome::Deleting => "deleting",
            JobOutcome::PodGone => "pod-gone",
            JobOutcome::AgentStopping => "agent-stopping",
            JobOutcome::NotStarted => "not-started",
        }
    }
}

/// Which signal said the app finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FinishedBy {
    /// The kubelet's container statuses.
    Status,
    /// procfs: every app process gone (`restartPolicy: Never` only).
    Procfs,
}

/// What one Job watch did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobReport {
    pub outcome: JobOutcome,
    pub finished_by: Option<FinishedBy>,
    /// When the app's last process exit was seen (or the app was seen finished).
    #[serde(with = "super::time::rfc3339::option", default)]
    pub app_finished_at: Option<SystemTime>,
    #[serde(with = "super::time::rfc3339::option", default)]
    pub quit_sent_at: Option<SystemTime>,
    pub quit_reason: Option<QuitReason>,
    #[serde(with = "super::time::rfc3339::option", default)]
    pub proxy_exit_seen_at: Option<SystemTime>,
    #[serde(with = "opt_ms", default, rename = "app_finished_to_quit_ms")]
    pub app_finished_to_quit: Option<Duration>,
    pub errors: Vec<String>,
    pub error_count: usize,
}

/// One direction's counts; `None` when the stat was garbage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DirectionCounts {
    pub cx_active: Option<u64>,
}

/// The filter's counts in one `/stats` sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FilterCounts {
    pub inbound: DirectionCounts,
    pub outbound: DirectionCounts,
    pub unknown: DirectionCounts,
}

/// Why nothing is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case", tag = "reason")]
pub enum IdleReason {
    /// No outbound connection was open. Produced by builds before issue 28 (it could cut a
    /// response still being sent inbound); kept so their reports still parse.
    NoOutboundConnections,
    /// No connection is open through the proxy in any direction (the filter's counts).
    NoConnections,
    /// Connections may be open, but no byte moved in any direction, and none waits in Envoy's
    /// buffers, for at least this long.
    NoBytesMoved {
        #[serde(rename = "for_ms", with = "ms")]
        idle_for: Duration,
    },
}

/// How `deletionTimestamp` was read (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TimestampMeaning {
    /// The timestamp is when the kubelet kills (API-server convention).
    KillTime,
    /// The timestamp is when deletion was requested; the kill comes one grace period later.
    RequestTime,
}

/// The filter's stat prefix as Envoy's `/stats` shows it (the filter's `holdfast` prefix inside
/// Envoy's `wasmcustom.` namespace for wasm-defined metrics).
pub const DEFAULT_STAT_PREFIX: &str = "wasmcustom.holdfast";

impl DrainReport {
    /// An empty report (nothing done yet) of a drain started at `started_at`.
    pub fn new(outcome: DrainOutcome, started_at: SystemTime) -> DrainReport {
        DrainReport {
            outcome,
            started_at,
            deadline_at: None,
            deadline_meaning: TimestampMeaning::RequestTime,
            inbound_drained: false,
            health_checks_restored: 0,
            agent_signalled: false,
            envoy_version: None,
            app_gone_at: None,
            quit_sent_at: None,
            quit_reason: None,
            proxy_exit_seen_at: None,
            app_gone_to_quit: None,
            app_gone_to_proxy_exit: None,
            elapsed: Duration::ZERO,
            app_processes_seen: 0,
            app_processes_left: 0,
            filter_present: None,
            last_counts: None,
            last_traffic_bytes: None,
            errors: Vec::new(),
            error_count: 0,
            advice: None,
        }
    }
}

impl JobReport {
    /// An empty report (nothing done yet).
    pub fn new(outcome: JobOutcome) -> JobReport {
        JobReport {
            outcome,
            finished_by: None,
            app_finished_at: None,
            quit_sent_at: None,
            quit_reason: None,
            proxy_exit_seen_at: None,
            app_finished_to_quit: None,
            errors: Vec::new(),
            error_count: 0,
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
