//! The one place where a pod's outcomes are recorded: each call updates the status board row,
//! the metrics, the Kubernetes Event and the log line together, so an outcome can never reach
//! one of them and skip the others (the shape of ztunnel's `Recorder`).
//!
//! The row's timeline (`holdfast status POD`) is written here too, and only here: a step for
//! every outcome recorded (the hold in and released, the drain's and the Job's end, failed
//! open, problems), for the lifecycle machine's step effects ([`Recorder::step`]: netns found,
//! proxy running, each readiness level, the drain started, the proxy gone) and for the drain
//! and Job executors' steps ([`Recorder::drain_step`]: inbound drained, each app container's
//! exit, the app gone, the quit and why).

use std::time::SystemTime;

use crate::api::text::pod_text;
use crate::api::{
    DrainOutcome, DrainReport, FinishedBy, HoldOutcome, HoldRecord, IdleReason, JobOutcome,
    JobReport, Phase, PodStatus, QuitReason, SidecarMode, StepKind, Timeline,
};
use crate::config::format_duration;
use crate::lifecycle::drain::DrainStep;
use crate::lifecycle::machine::Outcome;
use crate::pod::PodKey;
use crate::report::board::StatusBoard;
use crate::report::events::{PodEvents, Reason};
use crate::report::metrics::Metrics;

/// Records one pod's outcomes. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Recorder {
    pub(crate) key: PodKey,
    pub(crate) board: StatusBoard,
    pub(crate) metrics: Metrics,
    pub(crate) events: PodEvents,
}

impl Recorder {
    /// The pod's first row (`problems`: invalid annotations, for `last_error`). A row the same
    /// pod already has (its task restarted after a panic, or it was opted out and in again) is
    /// kept, timeline, hold, drain and `last_error` included: a row lives as long as its pod,
    /// not its task; the new start is a step on it.
    pub(crate) fn start(
        &self,
        problems: Option<String>,
        mode: SidecarMode,
        mesh: crate::api::Mesh,
    ) {
        let problems = problems.map(|p| pod_text(&p));
        for p in problems.iter() {
            tracing::warn!("{p}");
        }
        let now = SystemTime::now();
        let mut kept = false;
        self.row(|row| {
            kept = true;
            let detail = match &problems {
                Some(p) => format!("tracked again (the row is kept); {p}"),
                None => "tracked again (the row is kept)".to_string(),
            };
            push_step(row, now, StepKind::FirstSeen, Some(detail));
            row.phase = Phase::WaitingForNetns;
            row.mode = Some(mode);
            row.mesh = Some(mesh);
            row.skipped_reason = None;
            if problems.is_some() {
                row.last_error = problems.clone();
            }
        });
        if kept {
            return;
        }
        let mut timeline = Timeline::default();
        timeline.push(now, StepKind::FirstSeen, problems.clone());
        self.board.put(PodStatus {
            namespace: self.key.namespace.clone(),
            name: self.key.name.clone(),
            uid: self.key.uid.clone(),
            phase: Phase::WaitingForNetns,
            mode: Some(mode),
            mesh: Some(mesh),
            tracked_since: now,
            hold: None,
            drain: None,
            job: None,
            last_error: problems,
            skipped_reason: None,
            timeline: Some(timeline),
        });
    }

    /// A pod that has the proxy container but is left alone, and why: a row in phase `skipped`
    /// and one info line (the caller calls this once per pod).
    pub(crate) fn skipped(board: &StatusBoard, key: &PodKey, reason: &str) {
        // The reason quotes the pod's own text (a container arg, an annotation).
        let reason = pod_text(reason);
        tracing::info!(pod = %key, uid = %key.uid, %reason, "pod has the proxy container but is not tracked");
        let now = SystemTime::now();
        let mut timeline = Timeline::default();
        timeline.push(now, StepKind::FirstSeen, None);
        timeline.push(now, StepKind::Skipped, Some(reason.to_string()));
        board.put(PodStatus {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            uid: key.uid.clone(),
            phase: Phase::Skipped,
            mode: None,
            mesh: None,
            tracked_since: now,
            hold: None,
            drain: None,
            job: None,
            last_error: None,
            skipped_reason: Some(reason.to_string()),
            timeline: Some(timeline),
        });
    }

    /// The agent leaves a tracked pod alone (its task kept panicking): the pod's row, kept,
    /// turns `skipped` with the reason as a step on its timeline (a fresh `skipped` row if it
    /// has none).
    pub(crate) fn left_alone(board: &StatusBoard, key: &PodKey, reason: &str) {
        tracing::warn!(pod = %key, uid = %key.uid, %reason, "leaving the pod alone");
        let mut kept = false;
        board.update(&key.namespace, &key.name, |row| {
            if row.uid == key.uid {
                kept = true;
                push_step(
                    row,
                    SystemTime::now(),
                    StepKind::Skipped,
                    Some(reason.to_string()),
                );
                row.phase = Phase::Skipped;
                row.skipped_reason = Some(reason.to_string());
            }
        });
        if !kept {
            Recorder::skipped(board, key, reason);
        }
    }

    pub(crate) fn phase(&self, phase: Phase) {
        tracing::debug!(phase = phase.as_str(), "phase");
        self.row(|row| row.phase = phase);
    }

    /// A problem worth the operator's attention: the log, the row's `last_error` and a step.
    pub(crate) fn problem(&self, message: String) {
        // Problems quote what the pod or its Envoy said.
        let message = pod_text(&message);
        tracing::warn!("{message}");
        self.row(|row| {
            push_step(
                row,
                SystemTime::now(),
                StepKind::Problem,
                Some(message.clone()),
            );
            row.last_error = Some(message);
        });
    }

    /// The held counts so far (while holding); the app's first held connection is a step,
    /// dated when its first packet was held.
    pub(crate) fn hold_progress(
        &self,
        packets: u64,
        connections: u64,
        first_held_at: Option<SystemTime>,
    ) {
        self.row(|row| {
            let h = row.hold.get_or_insert_with(HoldRecord::default);
            h.packets_held = packets;
            h.connections_held = connections;
            first_connection_step(row, first_held_at);
        });
    }

    /// A step of the pod's life the lifecycle machine saw (`Effect::Step`), dated now.
    pub(crate) fn step(&self, kind: StepKind, detail: Option<String>) {
        tracing::debug!(step = kind.as_str(), detail = detail.as_deref(), "step");
        self.row(|row| push_step(row, SystemTime::now(), kind, detail));
    }

    /// A step the drain or Job executor told ([`DrainStep`]), dated now.
    pub(crate) fn drain_step(&self, step: &DrainStep) {
        let (kind, detail) = match step {
            DrainStep::InboundDrained {
                drained,
                envoy_version,
            } => (
                StepKind::InboundDrained,
                format!(
                    "{} (Envoy {})",
                    if *drained {
                        "Envoy drains its inbound listeners; outbound untouched"
                    } else {
                        "the inbound drain request failed; the drain goes on"
                    },
                    envoy_version.as_deref().unwrap_or("version unknown")
                ),
            ),
            DrainStep::AppContainerExited {
                container,
                exit_code,
            } => (
                StepKind::AppContainerExited,
                match exit_code {
                    Some(code) => format!("{container} (exit code {code}, by its status)"),
                    None => format!("{container} (its processes are gone)"),
                },
            ),
            DrainStep::AppGone => (
                StepKind::AppGone,
                "every app process is gone; waiting only for what is in flight".into(),
            ),
            DrainStep::JobFinished(by) => (
                StepKind::JobAppFinished,
                match by {
                    FinishedBy::Status => "seen in the pod's status",
                    FinishedBy::Procfs => "seen by procfs: its processes are gone",
                }
                .into(),
            ),
            DrainStep::KernelFlushing { bytes } => (
                StepKind::KernelFlushing,
                format!(
                    "Envoy's counts say idle, but the pod's sockets still hold {bytes} byte(s) \
                     for their peers in the kernel: waiting for them to be sent"
                ),
            ),
            DrainStep::Quitting(reason) => (StepKind::Quitting, quit_reason(*reason)),
        };
        self.step(kind, Some(detail));
    }

    /// An input the pod's stage had nothing to do with (`Effect::Ignored`): logged at trace
    /// and counted in `holdfast_inputs_ignored_total{stage,input}`; the row is not touched.
    pub(crate) fn ignored(&self, stage: &str, input: &str) {
        tracing::trace!(pod = %self.key, stage, input, "input ignored in this stage");
        self.metrics.input_ignored(stage, input);
    }

    pub(crate) fn outcome(&self, outcome: &Outcome) {
        match outcome {
            Outcome::HoldStarted { adopted, late } => self.hold_started(*adopted, *late),
            Outcome::HoldEnded {
                outcome,
                released,
                held_for,
                timeout,
            } => self.hold_ended(*outcome, *released, *held_for, *timeout),
            Outcome::Drain(report) => self.drain(report),
            Outcome::Job(report) => self.job(report),
            Outcome::FailedOpen { why } => self.failed_open(why),
        }
    }

    /// The pod broke a bound and is left alone (its hold released as without the agent): the
    /// row turns `skipped` with the reason, a Warning Event, the counter, one warning.
    fn failed_open(&self, why: &str) {
        let why = pod_text(why);
        self.metrics.pods_failed_open.inc();
        let note = format!("failed open, left alone from now on: {why}");
        tracing::warn!("{note}");
        self.events
            .emit(&self.key, Reason::FailedOpen, note.clone());
        self.row(|row| {
            push_step(
                row,
                SystemTime::now(),
                StepKind::FailedOpen,
                Some(why.to_string()),
            );
            row.phase = Phase::Skipped;
            row.skipped_reason = Some(note.clone());
            row.last_error = Some(note);
        });
    }

    fn hold_started(&self, adopted: bool, late: bool) {
        let step_detail = match (adopted, late) {
            (true, _) => Some("adopted from the previous agent".to_string()),
            (false, true) => Some("late: an app container was already running".to_string()),
            _ => None,
        };
        self.metrics.holds_started.inc();
        tracing::info!(
            adopted,
            "holding the app's new connections until the proxy is ready"
        );
        let late_note = late.then(|| {
            "the app was already running when the hold went in; its earliest connections may \
             have been refused"
                .to_string()
        });
        if let Some(n) = &late_note {
            tracing::warn!("{n}");
        }
        self.row(|row| {
            push_step(row, SystemTime::now(), StepKind::HoldIn, step_detail);
            row.hold = Some(HoldRecord {
                started_at: Some(SystemTime::now()),
                adopted,
                late,
                ..HoldRecord::default()
            });
            if late_note.is_some() {
                row.last_error = late_note;
            }
        });
    }

    fn hold_ended(
        &self,
        outcome: HoldOutcome,
        released: Option<super::machine::Released>,
        held_for: std::time::Duration,
        timeout: std::time::Duration,
    ) {
        let m = &self.metrics;
        m.holds_released
            .get_or_create(&Metrics::outcome(outcome.as_str()))
            .inc();
        if let Some(r) = released {
            m.held_connections.inc_by(r.connections);
            m.hold_duration.observe(held_for.as_secs_f64());
            if let Some(d) = r.ready_to_release {
                m.hold_release_latency.observe(d.as_secs_f64());
            }
        }
        let held_ms = held_for.as_millis();
        let connections = released.map_or(0, |r| r.connections);
        let problem = match outcome {
            HoldOutcome::Ready => {
                self.events.emit(
                    &self.key,
                    Reason::HoldReleased,
                    format!(
                        "held {connections} connection(s) for {held_ms} ms until the proxy was \
                         ready; released {:.1} ms after it was",
                        released
                            .and_then(|r| r.ready_to_release)
                            .map_or(0.0, |d| d.as_secs_f64() * 1e3),
                    ),
                );
                None
            }
            HoldOutcome::Deadline => {
                let note = format!(
                    "hold deadline ({}) passed before the proxy was ready; connections released \
                     to a proxy that may refuse them",
                    format_duration(timeout)
                );
                self.events
                    .emit(&self.key, Reason::HoldDeadline, note.clone());
                Some(note)
            }
            HoldOutcome::AgentStopped => {
                tracing::info!("agent stopping; leaving the hold for the next agent");
                None
            }
            HoldOutcome::PodDeleted | HoldOutcome::Failed | HoldOutcome::SandboxGone => None,
        };
        tracing::info!(
            outcome = outcome.as_str(),
            connections,
            packets = released.map_or(0, |r| r.packets),
            held_for_ms = held_ms as u64,
            ready_to_release_us = released
                .and_then(|r| r.ready_to_release)
                .map(|d| d.as_micros() as u64),
            "hold ended"
        );
        let step_detail = hold_released_detail(outcome, released, held_ms, connections, timeout);
        // One update, so a reader never sees the outcome without its consequences.
        self.row(|row| {
            first_connection_step(row, released.and_then(|r| r.first_held_at));
            push_step(
                row,
                SystemTime::now(),
                StepKind::HoldReleased,
                Some(step_detail),
            );
            let h = row.hold.get_or_insert_with(HoldRecord::default);
            if let Some(r) = released {
                h.packets_held = r.packets;
                h.connections_held = r.connections;
                h.released_at = Some(SystemTime::now());
                h.ready_to_release_ms = r.ready_to_release.map(|d| d.as_secs_f64() * 1e3);
            }
            h.outcome = Some(outcome);
            if problem.is_some() {
                row.last_error = problem;
            }
        });
    }

    fn drain(&self, report: &DrainReport) {
        let m = &self.metrics;
        m.drains
            .get_or_create(&Metrics::outcome(report.outcome.as_str()))
            .inc();
        m.drain_duration.observe(report.elapsed.as_secs_f64());
        if let Some(lag) = report.app_gone_to_proxy_exit {
            m.drain_exit_lag.observe(lag.as_secs_f64());
        }
        m.drain_errors.inc_by(report.error_count as u64);
        let elapsed_ms = report.elapsed.as_millis();
        match report.outcome {
            DrainOutcome::AppDone => self.events.emit(
                &self.key,
                Reason::DrainCompleted,
                format!(
                    "drained in {elapsed_ms} ms; the proxy was quit {} after the app exited",
                    report
                        .app_gone_to_quit
                        .map_or("(unknown)".to_string(), |d| format!(
                            "{:.1} ms",
                            d.as_secs_f64() * 1e3
                        )),
                ),
            ),
            DrainOutcome::Deadline => self.events.emit(
                &self.key,
                Reason::DrainDeadline,
                format!(
                    "the drain deadline came after {elapsed_ms} ms with {} app process(es) \
                     alive; {}",
                    report.app_processes_left,
                    if report.quit_sent_at.is_some() {
                        "the proxy was quit"
                    } else {
                        "the proxy was left to the kubelet, which ends it at the grace period's end"
                    }
                ),
            ),
            DrainOutcome::ProxyGoneEarly => self.events.emit(
                &self.key,
                Reason::ProxyExitedBeforeApp,
                report
                    .advice
                    .clone()
                    .unwrap_or_else(|| "the proxy exited while the app still ran".to_string()),
            ),
            DrainOutcome::NotStarted => self.events.emit(
                &self.key,
                Reason::DrainNotStarted,
                format!(
                    "the drain could not start ({}); the proxy ends as without holdfast",
                    report
                        .errors
                        .first()
                        .map_or("no reason given", String::as_str)
                ),
            ),
            DrainOutcome::SidecarLost => self.events.emit(
                &self.key,
                Reason::SidecarLostDuringTermination,
                report.advice.clone().unwrap_or_else(|| {
                    "the native sidecar exited during termination while the app ran".to_string()
                }),
            ),
            DrainOutcome::PodGone | DrainOutcome::AgentStopping | DrainOutcome::KubeletOrdered => {}
        }
        tracing::info!(
            outcome = report.outcome.as_str(),
            elapsed_ms = elapsed_ms as u64,
            app_gone_to_quit_ms = report.app_gone_to_quit.map(|d| d.as_millis() as u64),
            errors = report.error_count,
            "drain finished"
        );
        let problem = report
            .advice
            .clone()
            .or_else(|| report.errors.last().cloned())
            .map(|p| pod_text(&p));
        let mut kept = report.clone();
        // Errors quote the pod's Envoy (at most 10 of them are kept).
        kept.errors = kept.errors.iter().map(|e| pod_text(e)).collect();
        self.row(|row| {
            drain_end_steps(row, report);
            row.drain = Some(kept);
            if problem.is_some() {
                row.last_error = problem;
            }
        });
    }

    fn job(&self, report: &JobReport) {
        let m = &self.metrics;
        m.jobs
            .get_or_create(&Metrics::outcome(report.outcome.as_str()))
            .inc();
        m.drain_errors.inc_by(report.error_count as u64);
        if report.outcome == JobOutcome::ProxyNotStopped {
            self.events.emit(
                &self.key,
                Reason::JobProxyNotStopped,
                format!(
                    "the job's app finished, but its proxy still ran after the agent asked it to \
                     quit: the pod does not complete ({})",
                    report
                        .errors
                        .last()
                        .map_or("no error recorded", String::as_str)
                ),
            );
        }
        if report.outcome == JobOutcome::Completed {
            self.events.emit(
                &self.key,
                Reason::JobProxyStopped,
                format!(
                    "the job's app finished; its proxy was stopped {} later so the pod completes",
                    report
                        .app_finished_to_quit
                        .map_or("(unknown)".to_string(), |d| format!(
                            "{:.1} ms",
                            d.as_secs_f64() * 1e3
                        )),
                ),
            );
        }
        tracing::info!(
            outcome = report.outcome.as_str(),
            finished_by = ?report.finished_by,
            quit_ms = report.app_finished_to_quit.map(|d| d.as_millis() as u64),
            "job finished; proxy stopped"
        );
        let problem = report.errors.last().map(|p| pod_text(p));
        let mut kept = report.clone();
        kept.errors = kept.errors.iter().map(|e| pod_text(e)).collect();
        self.row(|row| {
            if let Some(at) = report.proxy_exit_seen_at {
                push_step(row, at, StepKind::ProxyExited, None);
            }
            push_step(
                row,
                SystemTime::now(),
                StepKind::JobFinished,
                Some(job_finished(report)),
            );
            row.job = Some(kept);
            if problem.is_some() {
                row.last_error = problem;
            }
        });
    }

    fn row(&self, f: impl FnOnce(&mut PodStatus)) {
        let uid = &self.key.uid;
        self.board
            .update(&self.key.namespace, &self.key.name, |row| {
                if &row.uid == uid {
                    f(row)
                }
            });
    }
}

/// Adds a step to the row's timeline (made on first use: a row put by an older code path).
fn push_step(row: &mut PodStatus, at: SystemTime, kind: StepKind, detail: Option<String>) {
    row.timeline
        .get_or_insert_with(Timeline::default)
        .push(at, kind, detail);
}

/// Records the app's first held connection, at `first_held_at`, once per hold (after the
/// latest `hold-in`).
fn first_connection_step(row: &mut PodStatus, first_held_at: Option<SystemTime>) {
    let Some(at) = first_held_at else { return };
    let recorded = row.timeline.as_ref().is_some_and(|t| {
        t.steps
            .iter()
            .rev()
            .take_while(|s| s.step != StepKind::HoldIn)
            .any(|s| s.step == StepKind::FirstConnectionHeld)
    });
    if !recorded {
        push_step(row, at, StepKind::FirstConnectionHeld, None);
    }
}

/// The hold's end in words: its outcome and why.
fn hold_released_detail(
    outcome: HoldOutcome,
    released: Option<super::machine::Released>,
    held_ms: u128,
    connections: u64,
    timeout: std::time::Duration,
) -> String {
    match outcome {
        HoldOutcome::Ready => {
            format!(
                "ready: held {connections} connection(s) for {held_ms} ms; released {} after the \
             proxy was ready",
                released.and_then(|r| r.ready_to_release).map_or(
                    "(unknown)".to_string(),
                    |d| format!("{:.1} ms", d.as_secs_f64() * 1e3)
                )
            )
        }
        HoldOutcome::Deadline => format!(
            "deadline: {} passed before the proxy was ready; {connections} connection(s) \
             released to a proxy that may refuse them (fail open)",
            format_duration(timeout)
        ),
        HoldOutcome::PodDeleted => "pod-deleted: released, the pod is being deleted".into(),
        HoldOutcome::AgentStopped => {
            "agent-stopped: left in place for the next agent, which adopts it".into()
        }
        HoldOutcome::Failed => "failed: released, as without holdfast".into(),
        HoldOutcome::SandboxGone => {
            "sandbox-gone: the pod's network namespace went away (its sandbox was recreated); \
             held again in the new one"
                .into()
        }
    }
}

/// The drain's last steps: the proxy's exit as seen (a native sidecar lost during the
/// termination is its own step), then the drain's end with its outcome and reason.
fn drain_end_steps(row: &mut PodStatus, report: &DrainReport) {
    if let Some(at) = report.proxy_exit_seen_at {
        let (kind, detail) = match report.outcome {
            DrainOutcome::SidecarLost => (
                StepKind::SidecarLost,
                Some(format!(
                    "the native sidecar exited while {} app process(es) still ran; the kubelet \
                     does not restart it during termination",
                    report.app_processes_left
                )),
            ),
            DrainOutcome::KubeletOrdered => (
                StepKind::ProxyExited,
                Some(format!(
                    "the kubelet ended the native sidecar after the app ({})",
                    row.mesh.map_or("its mesh's preStop drained inbound", |m| {
                        crate::mesh::texts_of(m).prestop_drain
                    })
                )),
            ),
            _ => (
                StepKind::ProxyExited,
                report
                    .app_gone_to_proxy_exit
                    .map(|d| format!("{:.1} ms after the app was gone", d.as_secs_f64() * 1e3)),
            ),
        };
        push_step(row, at, kind, detail);
    }
    push_step(
        row,
        SystemTime::now(),
        StepKind::DrainFinished,
        Some(drain_finished(report)),
    );
}

/// What decided the quit, in words (what the in-flight sample said, or the deadline).
fn quit_reason(reason: QuitReason) -> String {
    match reason {
        QuitReason::Idle(IdleReason::NoOutboundConnections) => {
            "nothing in flight: no outbound connection open".into()
        }
        QuitReason::Idle(IdleReason::NoConnections) => {
            "nothing in flight: no connection open through the proxy in any direction".into()
        }
        QuitReason::Idle(IdleReason::NoBytesMoved { idle_for }) => format!(
            "nothing in flight: connections open but no byte moved (nor buffered) for {} ms",
            idle_for.as_millis()
        ),
        QuitReason::NoFilter => {
            "the holdfast filter is not installed: the app's exit decided".into()
        }
        QuitReason::StatsUnavailable => {
            "the proxy's counts could not be read: the app's exit decided".into()
        }
        QuitReason::OutOfTime => "out of time: the Job's wait for traffic in flight ran out".into(),
    }
}

/// The drain's end in words: its outcome, how long, what the last sample said.
fn drain_finished(r: &DrainReport) -> String {
    let mut out = format!("{} after {} ms", r.outcome.as_str(), r.elapsed.as_millis());
    if let Some(c) = &r.last_counts {
        let n = |x: Option<u64>| x.map_or("?".to_string(), |n| n.to_string());
        out.push_str(&format!(
            "; last sample: {} outbound and {} inbound connection(s) open",
            n(c.outbound.cx_active),
            n(c.inbound.cx_active)
        ));
    }
    if let Some(b) = r.last_traffic_bytes {
        out.push_str(&format!(", {b} bytes through the pod's listeners"));
    }
    if r.outcome == DrainOutcome::Deadline {
        out.push_str(&format!(
            "; {} app process(es) still alive",
            r.app_processes_left
        ));
    }
    if let Some(a) = &r.advice {
        out.push_str(&format!("; {a}"));
    } else if let Some(e) = r.errors.last() {
        out.push_str(&format!("; {e}"));
    }
    out
}

/// The Job watch's end in words.
fn job_finished(r: &JobReport) -> String {
    let mut out = r.outcome.as_str().to_string();
    if let Some(d) = r.app_finished_to_quit {
        out.push_str(&format!(
            ": proxy quit {:.1} ms after the app finished",
            d.as_secs_f64() * 1e3
        ));
    }
    if let Some(e) = r.errors.last() {
        out.push_str(&format!("; {e}"));
    }
    out
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
