//! The one place where a pod's outcomes are recorded: each call updates the status board row,
//! the metrics, the Kubernetes Event and the log line together, so an outcome can never reach
//! one of them and skip the others (the shape of ztunnel's `Recorder`).

use std::time::SystemTime;

use crate::api::{
    DrainOutcome, DrainReport, HoldOutcome, HoldRecord, JobOutcome, JobReport, Phase, PodStatus,
    SidecarMode,
};
use crate::config::format_duration;
use crate::lifecycle::machine::Outcome;
use crate::pod::PodKey;
use crate::report::board::StatusBoard;
use crate::report::events::{PodEvents, Reason};
use crate::report::metrics::Metrics;

/// Records one pod's outcomes. Cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    pub key: PodKey,
    pub board: StatusBoard,
    pub metrics: Metrics,
    pub events: PodEvents,
}

impl Recorder {
    /// The pod's first row (`problems`: invalid annotations, for `last_error`).
    pub fn start(&self, problems: Option<String>, mode: SidecarMode) {
        for p in problems.iter() {
            tracing::warn!("{p}");
        }
        self.board.put(PodStatus {
            namespace: self.key.namespace.clone(),
            name: self.key.name.clone(),
            uid: self.key.uid.clone(),
            phase: Phase::WaitingForNetns,
            mode: Some(mode),
            tracked_since: SystemTime::now(),
            hold: None,
            drain: None,
            job: None,
            last_error: problems,
            skipped_reason: None,
        });
    }

    /// A pod that has the proxy container but is left alone, and why: a row in phase `skipped`
    /// and one info line (the caller calls this once per pod).
    pub fn skipped(board: &StatusBoard, key: &PodKey, reason: &str) {
        tracing::info!(pod = %key, uid = %key.uid, %reason, "pod has the proxy container but is not tracked");
        board.put(PodStatus {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            uid: key.uid.clone(),
            phase: Phase::Skipped,
            mode: None,
            tracked_since: SystemTime::now(),
            hold: None,
            drain: None,
            job: None,
            last_error: None,
            skipped_reason: Some(reason.to_string()),
        });
    }

    pub fn phase(&self, phase: Phase) {
        tracing::debug!(phase = phase.as_str(), "phase");
        self.row(|row| row.phase = phase);
    }

    /// A problem worth the operator's attention: the log and the row's `last_error`.
    pub fn problem(&self, message: String) {
        tracing::warn!("{message}");
        self.row(|row| row.last_error = Some(message));
    }

    /// The held counts so far (cosmetic, while holding).
    pub fn hold_progress(&self, packets: u64, connections: u64) {
        self.row(|row| {
            let h = row.hold.get_or_insert_with(HoldRecord::default);
            h.packets_held = packets;
            h.connections_held = connections;
        });
    }

    pub fn outcome(&self, outcome: &Outcome) {
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
        self.metrics.pods_failed_open.inc();
        let note = format!("failed open, left alone from now on: {why}");
        tracing::warn!("{note}");
        self.events
            .emit(&self.key, Reason::FailedOpen, note.clone());
        self.row(|row| {
            row.phase = Phase::Skipped;
            row.skipped_reason = Some(note.clone());
            row.last_error = Some(note);
        });
    }

    fn hold_started(&self, adopted: bool, late: bool) {
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
            HoldOutcome::PodDeleted | HoldOutcome::Failed => None,
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
        // One update, so a reader never sees the outcome without its consequences.
        self.row(|row| {
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
                     alive; the proxy was quit",
                    report.app_processes_left
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
            .or_else(|| report.errors.last().cloned());
        self.row(|row| {
            row.drain = Some(report.clone());
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
        let problem = report.errors.last().cloned();
        self.row(|row| {
            row.job = Some(report.clone());
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

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
