//! One meshed pod's lifecycle, from the agent's side.
//!
//! 1. **Wait for the network namespace**: poll the pod's processes (the sandbox comes first,
//!    before any container) until one exists.
//! 2. **Startup hold**: unless the proxy is already ready (agent restart), bind the pod's NFQUEUE,
//!    add the hold rule, and hold the app's new connections until the proxy is ready, the hold
//!    deadline passes, or the pod is deleted; then release every held connection.
//! 3. **Until the pod goes**: follow its updates (drain and Job completion build on this).
//!
//! Every log line carries the pod's `namespace/name`. Nothing here can fail the agent: every
//! error ends in releasing (fail open) and is recorded on the status board.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use super::drain::{self, DrainCtx, DrainOutcome, JobOutcome, PodProcsSource};
use super::pod_procs::NetnsLookup;
use super::readiness::{Readiness, ReadinessProbe};
use super::Shared;
use crate::envoy_admin::AdminClient;
use crate::events::Reason;
use crate::hold::{HoldConfig, HoldQueue};
use crate::metrics::Metrics;
use crate::netns::PodNetns;
use crate::pod::{PodKey, PodView};
use crate::status::{HoldOutcome, HoldRecord, Phase, PodStatus};

/// How often a pod without processes is looked for.
const NETNS_POLL: Duration = Duration::from_millis(5);
/// How long a gone pod's row stays on the status board.
const GONE_ROW_RETENTION: Duration = Duration::from_secs(300);
/// How often the held counts are copied to the status board.
const STATUS_EVERY: Duration = Duration::from_millis(250);

/// Why a wait ended without the thing waited for.
enum Interrupted {
    /// The pod is gone from the source (or no longer tracked).
    PodGone,
    /// The pod got a deletionTimestamp.
    Deleting,
    /// The agent is stopping.
    AgentStopping,
}

pub(crate) struct PodTask {
    shared: Arc<Shared>,
    view: watch::Receiver<Option<PodView>>,
    key: PodKey,
    /// The pod had no process when first looked for: its netns is new to this agent.
    fresh_netns: bool,
}

impl PodTask {
    pub(crate) fn new(shared: Arc<Shared>, view: watch::Receiver<Option<PodView>>) -> Self {
        let key = view
            .borrow()
            .as_ref()
            .map(|v| v.key.clone())
            .expect("a pod task starts with a pod");
        Self {
            shared,
            view,
            key,
            fresh_netns: false,
        }
    }

    pub(crate) async fn run(mut self) {
        let problems = self
            .current()
            .map(|v| v.overrides.problems.join("; "))
            .filter(|p| !p.is_empty());
        self.shared.board.put(PodStatus {
            namespace: self.key.namespace.clone(),
            name: self.key.name.clone(),
            uid: self.key.uid.clone(),
            phase: Phase::WaitingForNetns,
            tracked_since: SystemTime::now(),
            hold: None,
            drain: None,
            job: None,
            last_error: problems,
        });

        let result = self.lifecycle().await;
        match result {
            Interrupted::AgentStopping => {}
            Interrupted::PodGone | Interrupted::Deleting => {
                tracing::info!(pod = %self.key, "pod gone; no longer tracked");
                // Keep the finished row a while, so `holdfast status` still shows how the pod's
                // drain went after it is gone.
                self.shared
                    .board
                    .update(&self.key.namespace, &self.key.name, |row| {
                        if row.uid == self.key.uid {
                            row.phase = Phase::Done;
                        }
                    });
                let board = self.shared.board.clone();
                let key = self.key.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(GONE_ROW_RETENTION).await;
                    board.remove_if_uid(&key.namespace, &key.name, &key.uid);
                });
            }
        }
    }

    async fn lifecycle(&mut self) -> Interrupted {
        let (pid, netns) = match self.wait_for_netns().await {
            Ok(found) => found,
            Err(why) => return why,
        };
        tracing::info!(pod = %self.key, pid, netns = ?netns.id(), "found the pod's network namespace");
        let admin_addr = self.current().map_or(self.shared.config.proxy.admin, |v| {
            v.admin_addr(&self.shared.config.proxy)
        });
        let admin = match netns.try_clone() {
            Ok(ns) => {
                let t = self.shared.config.drain.admin_timeout;
                AdminClient::in_netns(ns, admin_addr)
                    .with_timeouts(t, t)
                    .with_error_metric(self.shared.metrics.admin_errors.clone())
            }
            Err(e) => {
                self.record_error(format!(
                    "cannot keep a handle on the pod's network namespace: {e}"
                ));
                return self.follow_until_gone().await;
            }
        };
        match self.startup(&netns).await {
            Ok(()) => {}
            // Deleted before its proxy was ever ready: there is no traffic to drain, and the
            // kubelet stops the containers anyway.
            Err(Interrupted::Deleting) => return self.follow_until_gone().await,
            Err(why) => return why,
        }
        self.set_phase(Phase::Ready);

        let job = drain::finish_job(self.drain_ctx(&admin)).await;
        match job.outcome {
            JobOutcome::AgentStopping => return Interrupted::AgentStopping,
            JobOutcome::PodGone => return Interrupted::PodGone,
            JobOutcome::Deleting => return self.drain(&admin).await,
            JobOutcome::NotAJob => {}
            JobOutcome::Completed | JobOutcome::ProxyAlreadyGone => {
                let m = &self.shared.metrics;
                m.jobs
                    .get_or_create(&Metrics::outcome(job.outcome.as_str()))
                    .inc();
                m.drain_errors.inc_by(job.error_count as u64);
                tracing::info!(pod = %self.key, outcome = ?job.outcome, quit_ms = job.app_finished_to_quit.map(|d| d.as_millis() as u64), "job finished; proxy stopped");
                self.shared
                    .board
                    .update(&self.key.namespace, &self.key.name, |row| {
                        row.phase = Phase::Done;
                        row.job = Some(job);
                    });
                // The proxy is gone: nothing to drain when the finished pod is deleted.
                return self.follow_until_gone().await;
            }
        }
        loop {
            if matches!(self.interruption(), Some(Interrupted::Deleting)) {
                return self.drain(&admin).await;
            }
            if let Err(why) = self.next_update().await {
                return why;
            }
        }
    }

    async fn follow_until_gone(&mut self) -> Interrupted {
        loop {
            if let Err(why) = self.next_update().await {
                return why;
            }
        }
    }

    fn drain_ctx<'a>(
        &'a self,
        admin: &'a AdminClient,
    ) -> DrainCtx<'a, AdminClient, PodProcsSource> {
        DrainCtx {
            key: &self.key,
            admin,
            processes: PodProcsSource::new(self.shared.procs.clone(), self.key.uid.clone()),
            view: self.view.clone(),
            stop: self.shared.stop.clone(),
            settings: &self.shared.config.drain,
        }
    }

    /// The drain on deletion; the row stays (phase `done`) until the pod is gone.
    async fn drain(&mut self, admin: &AdminClient) -> Interrupted {
        self.set_phase(Phase::Draining);
        let report = drain::drain(self.drain_ctx(admin)).await;
        let outcome = report.outcome;
        tracing::info!(
            pod = %self.key,
            outcome = ?outcome,
            elapsed_ms = report.elapsed.as_millis() as u64,
            app_gone_to_quit_ms = report.app_gone_to_quit.map(|d| d.as_millis() as u64),
            "drain finished"
        );
        let problem = report
            .advice
            .clone()
            .or_else(|| report.errors.last().cloned());
        self.shared
            .board
            .update(&self.key.namespace, &self.key.name, |row| {
                row.phase = Phase::Done;
                row.drain = Some(report);
                if problem.is_some() {
                    row.last_error = problem;
                }
            });
        match outcome {
            DrainOutcome::AgentStopping => Interrupted::AgentStopping,
            DrainOutcome::PodGone => Interrupted::PodGone,
            _ => self.follow_until_gone().await,
        }
    }

    /// The current view of the pod (`None` once it is gone).
    fn current(&self) -> Option<PodView> {
        self.view.borrow().clone()
    }

    /// Waits for the next change of the pod; errs when it is gone or the agent stops.
    async fn next_update(&mut self) -> Result<(), Interrupted> {
        tokio::select! {
            _ = self.shared.stop.cancelled() => Err(Interrupted::AgentStopping),
            changed = self.view.changed() => match changed {
                Ok(()) if self.view.borrow().is_some() => Ok(()),
                _ => Err(Interrupted::PodGone),
            },
        }
    }

    fn interruption(&self) -> Option<Interrupted> {
        if self.shared.stop.is_cancelled() {
            return Some(Interrupted::AgentStopping);
        }
        match &*self.view.borrow() {
            None => Some(Interrupted::PodGone),
            Some(v) if v.deletion.is_some() => Some(Interrupted::Deleting),
            Some(_) => None,
        }
    }

    /// The pod's first process and its netns. Sets `fresh_netns` when the namespace did not
    /// exist yet when the wait began (so no earlier agent can have left rules in it).
    async fn wait_for_netns(&mut self) -> Result<(i32, PodNetns), Interrupted> {
        let mut warned = false;
        let mut first_poll = true;
        loop {
            if let Some(why) = self.interruption() {
                return Err(why);
            }
            let lookup = self.shared.procs.find_netns(&self.key.uid).await;
            if first_poll {
                first_poll = false;
                self.fresh_netns = matches!(lookup, NetnsLookup::NotYet);
            }
            match lookup {
                NetnsLookup::Found { pid, netns } => return Ok((pid, netns)),
                NetnsLookup::NotYet => {}
                NetnsLookup::Refused(why) if !warned => {
                    warned = true;
                    self.record_error(format!("cannot use the pod's network namespace yet: {why}"));
                }
                NetnsLookup::Refused(_) => {}
            }
            tokio::select! {
                _ = tokio::time::sleep(NETNS_POLL) => {}
                _ = self.shared.stop.cancelled() => return Err(Interrupted::AgentStopping),
                _ = self.view.changed() => {}
            }
        }
    }

    /// The startup hold. Returns `Ok` once the pod needs no hold (anymore).
    async fn startup(&mut self, netns: &PodNetns) -> Result<(), Interrupted> {
        let cfg = &self.shared.config;
        let Some(view) = self.current() else {
            return Err(Interrupted::PodGone);
        };
        let hold_cfg = HoldConfig::for_pod(cfg, &view);
        let probe = match ReadinessProbe::new(
            netns,
            view.admin_addr(&cfg.proxy),
            &cfg.proxy,
            &cfg.hold,
            &self.shared.metrics,
        ) {
            Ok(p) => p,
            Err(e) => {
                self.record_error(format!("cannot reach the pod's network namespace: {e}"));
                return Ok(());
            }
        };

        // Agent restart, or a pod found late: a ready proxy needs no hold, and a rule left by a
        // previous agent goes.
        if probe.check().await == Readiness::Ready {
            match blocking(netns, hold_cfg.clone(), |ns, c| {
                HoldQueue::remove_leftover(&ns, &c)
            })
            .await
            {
                Ok(true) => {
                    tracing::info!(pod = %self.key, "proxy already ready; removed a hold rule left by a previous agent")
                }
                Ok(false) => tracing::info!(pod = %self.key, "proxy already ready; no hold needed"),
                Err(e) => self.record_error(format!("removing a leftover hold rule failed: {e}")),
            }
            return Ok(());
        }

        let hold_timeout = self
            .current()
            .map_or(cfg.hold.timeout, |v| v.overrides.hold_timeout);
        let started = Instant::now();
        let fresh = self.fresh_netns;
        let (queue, adopted) = match blocking(netns, hold_cfg.clone(), move |ns, c| {
            if fresh {
                HoldQueue::start_fresh(&ns, &c).map(|q| (q, false))
            } else {
                HoldQueue::start_or_adopt(&ns, &c)
            }
        })
        .await
        {
            Ok(q) => q,
            Err(e) => {
                // Fail open: without a hold the pod behaves as without the agent.
                tracing::error!(pod = %self.key, error = %e, "could not set up the startup hold; the pod starts without it");
                let _ =
                    blocking(netns, hold_cfg, |ns, c| HoldQueue::remove_leftover(&ns, &c)).await;
                self.hold_failed();
                self.record_error(format!("startup hold failed: {e}"));
                return Ok(());
            }
        };
        self.shared.metrics.holds_started.inc();
        let late = !adopted && self.app_running().await;
        if late {
            tracing::warn!(pod = %self.key, "the app was already running when the hold went in; its earliest connections may have been refused");
        }
        tracing::info!(pod = %self.key, adopted, timeout = ?hold_timeout, "holding the app's new connections until the proxy is ready");
        self.shared
            .board
            .update(&self.key.namespace, &self.key.name, |row| {
                row.phase = Phase::Holding;
                row.hold = Some(HoldRecord {
                    started_at: Some(SystemTime::now()),
                    adopted,
                    ..HoldRecord::default()
                });
            });

        let deadline = tokio::time::Instant::from_std(started + hold_timeout);
        let mut poll = tokio::time::interval(cfg.hold.ready_poll);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_status = Instant::now();
        let (outcome, ready_at) = loop {
            tokio::select! {
                _ = poll.tick() => {
                    if probe.check().await == Readiness::Ready {
                        break (HoldOutcome::Ready, Some(Instant::now()));
                    }
                    if last_status.elapsed() >= STATUS_EVERY {
                        last_status = Instant::now();
                        let held = queue.held();
                        self.record_hold(|h| {
                            h.packets_held = held.packets;
                            h.connections_held = held.connections;
                        });
                    }
                }
                _ = tokio::time::sleep_until(deadline) => break (HoldOutcome::Deadline, None),
                _ = self.shared.stop.cancelled() => {
                    // Leave the rule: the next agent adopts it (see `agent::run`).
                    let held = queue.held();
                    tracing::info!(pod = %self.key, held = held.connections, "agent stopping; leaving the hold for the next agent");
                    drop(queue);
                    self.shared.metrics.holds_released.get_or_create(&Metrics::outcome(HoldOutcome::AgentStopped.as_str())).inc();
                    self.record_hold(|h| h.outcome = Some(HoldOutcome::AgentStopped));
                    return Err(Interrupted::AgentStopping);
                }
                _ = self.view.changed() => {
                    if matches!(self.interruption(), Some(Interrupted::PodGone | Interrupted::Deleting)) {
                        break (HoldOutcome::PodDeleted, None);
                    }
                }
            }
        };

        let release_started = Instant::now();
        let report = tokio::task::spawn_blocking(move || queue.release()).await;
        match report {
            Ok(Ok(report)) => {
                // Held connections go at the accept verdict; the rule removal follows it.
                let ready_to_release =
                    ready_at.map(|t| release_started.duration_since(t) + report.verdict_after);
                tracing::info!(
                    pod = %self.key,
                    outcome = outcome.as_str(),
                    connections = report.stats.connections,
                    packets = report.stats.packets,
                    late_packets = report.late_packets,
                    left_waiting = report.left_waiting,
                    held_for_ms = started.elapsed().as_millis() as u64,
                    ready_to_release_us = ready_to_release.map(|d| d.as_micros() as u64),
                    "hold released"
                );
                let m = &self.shared.metrics;
                m.holds_released
                    .get_or_create(&Metrics::outcome(outcome.as_str()))
                    .inc();
                m.held_connections.inc_by(report.stats.connections);
                m.hold_duration.observe(started.elapsed().as_secs_f64());
                if let Some(d) = ready_to_release {
                    m.hold_release_latency.observe(d.as_secs_f64());
                }
                let deadline_note = (outcome == HoldOutcome::Deadline).then(|| {
                    format!(
                        "hold deadline ({}) passed before the proxy was ready; connections released to a proxy that may refuse them",
                        crate::config::format_duration(hold_timeout)
                    )
                });
                match outcome {
                    HoldOutcome::Ready => self.shared.events.emit(
                        &self.key,
                        Reason::HoldReleased,
                        format!(
                            "held {} connection(s) for {} ms until the proxy was ready; released {:.1} ms after it was",
                            report.stats.connections,
                            started.elapsed().as_millis(),
                            ready_to_release.map_or(0.0, |d| d.as_secs_f64() * 1e3),
                        ),
                    ),
                    HoldOutcome::Deadline => self.shared.events.emit(
                        &self.key,
                        Reason::HoldDeadline,
                        deadline_note.clone().unwrap_or_default(),
                    ),
                    _ => {}
                }
                // One update, so a reader never sees the outcome without its consequences.
                self.shared
                    .board
                    .update(&self.key.namespace, &self.key.name, |row| {
                        let h = row.hold.get_or_insert_with(HoldRecord::default);
                        h.packets_held = report.stats.packets;
                        h.connections_held = report.stats.connections;
                        h.released_at = Some(SystemTime::now());
                        h.ready_to_release_ms = ready_to_release.map(|d| d.as_secs_f64() * 1e3);
                        h.outcome = Some(outcome);
                        if outcome != HoldOutcome::PodDeleted {
                            row.phase = Phase::Ready;
                        }
                        if deadline_note.is_some() {
                            row.last_error = deadline_note;
                        }
                    });
            }
            Ok(Err(e)) => {
                tracing::error!(pod = %self.key, error = %e, "releasing the hold failed; removing the rule");
                let _ = ready_at;
                let _ =
                    blocking(netns, hold_cfg, |ns, c| HoldQueue::remove_leftover(&ns, &c)).await;
                self.hold_failed();
                self.record_error(format!("releasing the hold failed: {e}"));
            }
            Err(e) => {
                tracing::error!(pod = %self.key, error = %e, "release task failed; removing the rule");
                let _ =
                    blocking(netns, hold_cfg, |ns, c| HoldQueue::remove_leftover(&ns, &c)).await;
                self.hold_failed();
            }
        }
        match outcome {
            HoldOutcome::PodDeleted => Err(self.interruption().unwrap_or(Interrupted::PodGone)),
            _ => Ok(()),
        }
    }

    /// Whether a process of an app container (not the sandbox, not the proxy) exists now.
    async fn app_running(&self) -> bool {
        let Some(view) = self.current() else {
            return false;
        };
        let app_ids: Vec<String> = view.app_containers().filter_map(|c| c.id.clone()).collect();
        let procs = self.shared.procs.of_pod(&self.key.uid).await;
        procs.iter().any(|p| {
            p.container_id
                .as_ref()
                .is_some_and(|id| app_ids.iter().any(|a| a == id))
        })
    }

    fn hold_failed(&self) {
        self.shared
            .metrics
            .holds_released
            .get_or_create(&Metrics::outcome(HoldOutcome::Failed.as_str()))
            .inc();
        self.record_hold(|h| h.outcome = Some(HoldOutcome::Failed));
    }

    fn set_phase(&self, phase: Phase) {
        self.shared
            .board
            .update(&self.key.namespace, &self.key.name, |row| row.phase = phase);
    }

    fn record_hold(&self, f: impl FnOnce(&mut HoldRecord)) {
        self.shared
            .board
            .update(&self.key.namespace, &self.key.name, |row| {
                f(row.hold.get_or_insert_with(HoldRecord::default))
            });
    }

    fn record_error(&self, message: String) {
        tracing::warn!(pod = %self.key, "{message}");
        self.shared
            .board
            .update(&self.key.namespace, &self.key.name, |row| {
                row.last_error = Some(message)
            });
    }
}

/// Runs blocking hold work (iptables, netlink) off the async runtime.
async fn blocking<T: Send + 'static>(
    netns: &PodNetns,
    cfg: HoldConfig,
    f: impl FnOnce(PodNetns, HoldConfig) -> crate::hold::Result<T> + Send + 'static,
) -> Result<T, String> {
    let ns = netns.try_clone().map_err(|e| e.to_string())?;
    tokio::task::spawn_blocking(move || f(ns, cfg).map_err(|e| e.to_string()))
        .await
        .map_err(|e| e.to_string())?
}
