//! The end of a pod's proxy: the drain when the pod is deleted, and the quit when a Job's app
//! has finished.
//!
//! - [`drain`]: on deletion, drain Envoy's inbound listeners at once, as pilot-agent does, and
//!   nothing that touches outbound ([`envoy_version`] says why and what each Envoy version does
//!   with the call), watch the app's processes exit ([`app_exit`]) and what is in flight (the
//!   filter's connection counts, Envoy's byte counters: [`in_flight`]), and
//!   `POST /quitquitquit` as soon as the app is gone and nothing is in flight — or at the
//!   deadline ([`plan`]) derived from the grace period.
//! - [`finish_job`]: for a pod that is not being deleted, quit the proxy once every app
//!   container has exited for good (`restartPolicy: Never`, or `OnFailure` with exit code 0),
//!   so the pod completes.
//!
//! Both are bounded: every admin call has a timeout and a bounded number of attempts, the drain
//! ends by its deadline, and both return promptly when the agent stops or the pod goes. They
//! never fail: what went wrong is in the report.
//!
//! Generic over [`ProxyAdmin`] (implemented for [`AdminClient`]) and [`PodProcessSource`]
//! (implemented by [`PodProcsSource`]), so the logic is tested with real processes and a fake
//! admin API, and against a real Envoy in `node-agent/tests/drain_parts.rs`.

pub mod app_exit;
pub mod decide;
pub mod envoy_version;
pub mod in_flight;
pub mod plan;

use std::future::Future;
use std::time::{Duration, SystemTime};

// tokio's clock throughout, so paused-time tests drive the deadlines.
use tokio::time::Instant;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use app_exit::{
    AppContainer, AppTracker, ExitWatcher, PodProcessSource, PodProcsSource, Watch,
};
pub use in_flight::{
    DrainSample, InFlight, InFlightJudge, TrafficBytes, DEFAULT_STAT_PREFIX, UNEXPOSED_BYTES_ADVICE,
};
pub use plan::DrainPlan;

// The wire types live in `crate::api`; re-exported here so callers keep their paths.
pub use crate::api::time::{ms, opt_ms};
pub use crate::api::{
    DrainOutcome, DrainReport, FilterCounts, FinishedBy, IdleReason, JobOutcome, JobReport,
    QuitReason, TimestampMeaning,
};
pub use crate::config::DrainSettings;

use crate::effects::envoy_admin::AdminClient;
use crate::pod::{Deletion, PodKey, PodView, DEFAULT_GRACE};

/// Envoy admin paths the drain uses (the inbound drain's is decided in [`envoy_version`]).
pub use envoy_version::DRAIN_INBOUND_PATH;
pub const SERVER_INFO_PATH: &str = "/server_info";
pub const QUIT_PATH: &str = "/quitquitquit";

/// Most errors kept in a report (the count is kept in full).
const MAX_ERRORS_KEPT: usize = 10;

// ---------------------------------------------------------------------------------------------
// The admin API, as the drain needs it
// ---------------------------------------------------------------------------------------------

/// A failed admin request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminFailure {
    /// The connection was refused (nothing listens: Envoy has exited).
    pub refused: bool,
    pub message: String,
}

impl std::fmt::Display for AdminFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<crate::effects::envoy_admin::Error> for AdminFailure {
    fn from(e: crate::effects::envoy_admin::Error) -> Self {
        // Only a refused connection means "nothing listens". Other connect failures (entering
        // the netns failed, no thread could be spawned) say nothing about Envoy. The client
        // keeps the cause as text only (the netns connector turns it into a string), so look
        // for ECONNREFUSED's rendering.
        let refused = match &e {
            crate::effects::envoy_admin::Error::Connect { reason, .. } => is_refusal(reason),
            _ => false,
        };
        AdminFailure {
            refused,
            message: e.to_string(),
        }
    }
}

/// True when an error text is a refused connection (`io::Error`'s rendering of ECONNREFUSED).
fn is_refusal(reason: &str) -> bool {
    reason.contains("Connection refused")
        || reason.contains(&format!("(os error {})", libc::ECONNREFUSED))
}

/// What the drain asks of a pod's Envoy admin API.
pub trait ProxyAdmin: Send + Sync {
    /// `POST path`; any 2xx is success.
    fn admin_post(&self, path: &str) -> impl Future<Output = Result<(), AdminFailure>> + Send;
    /// One sample: the filter's counts under `prefix` and Envoy's downstream byte counters,
    /// in one `/stats` request.
    fn drain_sample(
        &self,
        prefix: &str,
    ) -> impl Future<Output = Result<DrainSample, AdminFailure>> + Send;
    /// Any answer from the admin API (`GET /ready`, whatever the state).
    fn probe(&self) -> impl Future<Output = Result<(), AdminFailure>> + Send;
    /// The body of `GET /server_info` (JSON; its `version` decides the inbound drain call).
    fn server_info(&self) -> impl Future<Output = Result<Vec<u8>, AdminFailure>> + Send;
}

impl ProxyAdmin for AdminClient {
    async fn admin_post(&self, path: &str) -> Result<(), AdminFailure> {
        self.post(path)
            .await
            .map(|_| ())
            .map_err(AdminFailure::from)
    }

    async fn drain_sample(&self, prefix: &str) -> Result<DrainSample, AdminFailure> {
        let stats = self
            .stats_with(Some(&in_flight::sample_regex(prefix)), true)
            .await?;
        Ok(DrainSample::from_stats(
            prefix,
            stats.values.iter().map(|(k, v)| (k.as_str(), *v)),
        ))
    }

    async fn probe(&self) -> Result<(), AdminFailure> {
        self.ready().await.map(|_| ()).map_err(AdminFailure::from)
    }

    async fn server_info(&self) -> Result<Vec<u8>, AdminFailure> {
        let response = self.request("GET", SERVER_INFO_PATH).await?;
        if response.status != 200 {
            return Err(AdminFailure {
                refused: false,
                message: format!(
                    "Envoy admin: GET {SERVER_INFO_PATH} answered HTTP {}",
                    response.status
                ),
            });
        }
        Ok(response.body)
    }
}

/// Collected errors, bounded.
#[derive(Debug, Default)]
struct Errors {
    kept: Vec<String>,
    count: usize,
}

impl Errors {
    fn push(&mut self, message: String) {
        tracing::warn!("{message}");
        self.count += 1;
        if self.kept.len() < MAX_ERRORS_KEPT {
            self.kept.push(message);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The drain
// ---------------------------------------------------------------------------------------------

/// What [`drain`] and [`finish_job`] work with.
pub struct DrainCtx<'a, A, S> {
    pub key: &'a PodKey,
    /// The pod's Envoy admin API (an [`AdminClient`] made in the pod's netns).
    pub admin: &'a A,
    /// The pod's processes (a [`PodProcsSource`]).
    pub processes: S,
    /// The latest view of the pod; `None` once it is gone.
    pub view: watch::Receiver<Option<PodView>>,
    /// Cancelled when the agent stops.
    pub stop: CancellationToken,
    pub settings: &'a DrainSettings,
    /// Told when `/quitquitquit` is about to be sent (the row shows `quitting` meanwhile).
    pub quit_started: Option<tokio::sync::mpsc::UnboundedSender<()>>,
}

/// The pause before the `samples`-th sample while waiting for in-flight traffic to settle:
/// `settle_poll` for the first ten (the usual case settles within milliseconds), then doubling
/// every ten samples up to `stats_every`, so a long wait does not poll Envoy every 5 ms.
fn settle_wait(settings: &DrainSettings, samples: u32) -> Duration {
    let factor = 1u32 << (samples / 10).min(8);
    settings
        .settle_poll
        .saturating_mul(factor)
        .min(settings.stats_every.max(settings.settle_poll))
}

/// Drains a pod being deleted: see the module docs. Call once the pod has a
/// `deletionTimestamp`; returns when the proxy was quit (or is gone), the pod is gone, or the
/// agent stops. Never panics, never exceeds the deadline by more than one admin timeout plus
/// `quit_confirm`.
pub async fn drain<A: ProxyAdmin, S: PodProcessSource>(ctx: DrainCtx<'_, A, S>) -> DrainReport {
    let DrainCtx {
        key,
        admin,
        processes,
        mut view,
        stop,
        settings,
        quit_started,
    } = ctx;
    let t0 = Instant::now();
    let started_at = SystemTime::now();
    let initial = view.borrow_and_update().clone();
    let deletion = match initial.as_ref().and_then(|v| v.deletion) {
        Some(d) => d,
        None => {
            tracing::warn!("drain started for a pod without a deletionTimestamp; assuming deletion now with the default grace period");
            Deletion {
                timestamp: plan::timestamp(started_at),
                grace: DEFAULT_GRACE,
            }
        }
    };
    let plan = DrainPlan::new(deletion, started_at);
    let remaining = plan.remaining(started_at);
    let deadline = t0 + remaining;
    let mut d = Drainer::new(admin, settings, quit_started, t0, started_at);
    let mut report = DrainReport {
        deadline_at: plan.deadline,
        deadline_meaning: plan.meaning,
        ..DrainReport::new(DrainOutcome::AppDone, started_at)
    };
    let Some(mut current) = initial else {
        report.outcome = DrainOutcome::PodGone;
        return report;
    };
    tracing::info!(
        grace_s = deletion.grace.as_secs(),
        remaining_ms = remaining.as_millis() as u64,
        deadline_meaning = ?plan.meaning,
        "pod deleted: draining inbound, watching the app"
    );

    // Grab the app's processes first (the kubelet is sending SIGTERM right now), then drain.
    let mut app = AppTracker::new(key, processes);
    let mut snapshot = app.refresh(&current).await;
    let inbound = tokio::select! {
        biased;
        _ = stop.cancelled() => return d.finish(report, DrainOutcome::AgentStopping, &app),
        // A deadline already passed (an agent restarted late in a drain) skips straight to quit.
        _ = tokio::time::sleep_until(deadline) => {
            return d.deadline_quit(report, &app, snapshot.live, None, remaining).await;
        }
        r = async {
            // Which call drains inbound depends on the Envoy (envoy_version.rs); one request,
            // and a failure only means "as for a current Envoy".
            let version = d.envoy_version().await;
            let call = envoy_version::inbound_drain(version);
            (d.post_retrying(call.path).await, version, call.advice)
        } => r,
    };
    let (drained, version, advice) = inbound;
    report.inbound_drained = drained;
    report.envoy_version = version.map(|v| v.to_string());
    if let Some(advice) = advice {
        tracing::warn!("{advice}");
        add_advice(&mut report, advice);
    }

    let mut judge = InFlightJudge::new(settings.idle_window);
    let mut unexposed = UnexposedBytes::default();
    let mut judgement: Option<InFlight> = None;
    let mut next_stats = Instant::now();
    let mut failed_samples_while_gone = 0u32;
    let mut unseen_warned = false;
    let mut app_gone: Option<Instant> = None;
    let mut samples_since_gone = 0u32;
    let mut next_rescan = Instant::now() + settings.rescan_every;
    loop {
        let now = Instant::now();
        if snapshot.gone_for_drain() {
            app_gone.get_or_insert_with(|| app.last_exit().unwrap_or(now));
        }
        let gone = app_gone.is_some();
        if gone {
            samples_since_gone += 1;
        }

        // Sample the counts: regularly while the app runs (idle history), every settle_poll
        // once it is gone.
        if gone || now >= next_stats {
            next_stats = now + settings.stats_every;
            match d.sample().await {
                Ok(sample) => {
                    report.filter_present = Some(sample.filter.is_some());
                    report.last_counts = sample.filter;
                    report.last_traffic_bytes =
                        sample.traffic.exposed.then_some(sample.traffic.total);
                    let now = Instant::now();
                    let j = judge.observe(now.into_std(), &sample);
                    if gone && unexposed.notice(now, &sample, j, settings.idle_window) {
                        tracing::warn!("{UNEXPOSED_BYTES_ADVICE}");
                        add_advice(&mut report, UNEXPOSED_BYTES_ADVICE.to_string());
                    }
                    judgement = Some(j);
                }
                Err(()) => {
                    judgement = None;
                    if gone {
                        failed_samples_while_gone += 1;
                    }
                    if d.refusals > 0 {
                        // Envoy may have exited: confirm soon rather than at the next regular
                        // sample.
                        next_stats = Instant::now() + settings.retry_backoff;
                    }
                }
            }
        }

        let proxy_gone = d.refusals >= settings.refusals_for_gone;
        if proxy_gone {
            // Envoy has exited. Before blaming the drain duration, look at the app once more:
            // it may have exited at the same moment.
            if !gone {
                snapshot = app.refresh(&current).await;
                if snapshot.gone_for_drain() {
                    app_gone = Some(app.last_exit().unwrap_or_else(Instant::now));
                }
            }
        }
        let next = decide::drain_next(decide::DrainSeen {
            app_gone: app_gone.is_some(),
            app_live: snapshot.live,
            proxy_gone,
            judgement: if gone { judgement } else { None },
            stats_exhausted: failed_samples_while_gone >= settings.admin_attempts,
        });
        match next {
            decide::DrainNext::Wait => {}
            decide::DrainNext::ProxyExited { app_unknown } => {
                if app_unknown {
                    d.errors.push(
                        "the proxy exited on its own; whether the app had finished is unknown \
                         (its processes are not visible)"
                            .to_string(),
                    );
                }
                tracing::info!("the proxy has already exited");
                let report = d.app_gone(report, app_gone);
                return d.finish(report, DrainOutcome::AppDone, &app);
            }
            decide::DrainNext::ProxyGoneEarly => {
                let advice = format!(
                    "Envoy exited while {} app process(es) of the pod still ran: the mesh's drain \
                     duration is shorter than the app's shutdown. Set terminationDrainDuration \
                     (meshConfig.defaultConfig.terminationDrainDuration, or the \
                     proxy.istio.io/config annotation) to the pod's grace period ({}s) so holdfast \
                     can end the proxy when the app is done.",
                    snapshot.live,
                    deletion.grace.as_secs()
                );
                tracing::warn!("{advice}");
                add_advice(&mut report, advice);
                return d.finish(report, DrainOutcome::ProxyGoneEarly, &app);
            }
            decide::DrainNext::Quit(reason) => {
                report = d.app_gone(report, app_gone);
                (report.quit_sent_at, report.proxy_exit_seen_at) = d.quit().await;
                report.quit_reason = Some(reason);
                tracing::info!(reason = ?reason, "app gone and nothing in flight: proxy quit");
                return d.finish(report, DrainOutcome::AppDone, &app);
            }
        }

        if !gone
            && !unseen_warned
            && snapshot
                .containers
                .iter()
                .any(|(_, c)| *c == AppContainer::Unseen)
        {
            unseen_warned = true;
            d.errors.push(
                "an app container runs by its status but none of the pod's processes is visible \
                 by container id: the drain cannot see the app exit and waits for the status or \
                 the deadline (does the agent run with hostPID and the right --proc-root?)"
                    .to_string(),
            );
        }

        // Once the app is gone only the counts are awaited: sample every settle_poll at first
        // (the usual case settles within milliseconds), then back off towards stats_every.
        let now = Instant::now();
        let wait = if gone {
            settle_wait(settings, samples_since_gone)
        } else {
            next_stats.min(next_rescan).saturating_duration_since(now)
        };
        let rescan = tokio::select! {
            biased;
            _ = stop.cancelled() => return d.finish(report, DrainOutcome::AgentStopping, &app),
            _ = tokio::time::sleep_until(deadline) => {
                return d.deadline_quit(report, &app, snapshot.live, app_gone, remaining).await;
            }
            changed = view.changed() => {
                match (changed, view.borrow_and_update().clone()) {
                    (Ok(()), Some(v)) => current = v,
                    _ => return d.finish(report, DrainOutcome::PodGone, &app),
                }
                true
            }
            (pid, _) = app.next_exit() => {
                tracing::debug!(pid, "app process exited");
                true
            }
            _ = tokio::time::sleep(wait) => Instant::now() >= next_rescan,
        };
        // Re-scan on news (an exit, a status change) and regularly for forked processes; not on
        // every count sample.
        if rescan {
            next_rescan = Instant::now() + settings.rescan_every;
            snapshot = app.refresh(&current).await;
        }
    }
}

/// Adds `advice` to the report's, after any already there (each is one sentence or more).
fn add_advice(report: &mut DrainReport, advice: String) {
    report.advice = Some(match report.advice.take() {
        Some(before) => format!("{before}. {advice}"),
        None => advice,
    });
}

/// Notices a drain (or Job quit) that has waited a whole idle window only because Envoy keeps
/// no byte counters: an outbound connection stays open, and the bytes, which could have said it
/// is idle, are not there. Not at the first such sample: the app's own connections close a few
/// milliseconds after its exit, and that wait costs nothing.
#[derive(Debug, Default)]
struct UnexposedBytes {
    since: Option<Instant>,
    said: bool,
}

impl UnexposedBytes {
    /// True once, the first time it has mattered for `window`.
    fn notice(
        &mut self,
        now: Instant,
        sample: &DrainSample,
        judgement: InFlight,
        window: Duration,
    ) -> bool {
        let waits = !sample.traffic.exposed
            && matches!(judgement, InFlight::Busy { outbound_active: Some(n) } if n > 0);
        if !waits {
            self.since = None;
            return false;
        }
        let since = *self.since.get_or_insert(now);
        if self.said || now.saturating_duration_since(since) < window {
            return false;
        }
        self.said = true;
        true
    }
}

/// The admin side of a drain or a Job quit.
struct Drainer<'a, A> {
    admin: &'a A,
    settings: &'a DrainSettings,
    errors: Errors,
    /// Consecutive refused connections.
    refusals: u32,
    /// Start of the drain or Job watch, monotonic and wall-clock, to put instants in reports.
    t0: Instant,
    t0_wall: SystemTime,
    quit_started: Option<tokio::sync::mpsc::UnboundedSender<()>>,
}

impl<'a, A> Drainer<'a, A> {
    fn new(
        admin: &'a A,
        settings: &'a DrainSettings,
        quit_started: Option<tokio::sync::mpsc::UnboundedSender<()>>,
        t0: Instant,
        t0_wall: SystemTime,
    ) -> Self {
        Drainer {
            admin,
            settings,
            errors: Errors::default(),
            refusals: 0,
            t0,
            t0_wall,
            quit_started,
        }
    }
}

impl<A: ProxyAdmin> Drainer<'_, A> {
    /// Wall-clock time of a monotonic instant.
    fn wall(&self, at: Instant) -> SystemTime {
        match at.checked_duration_since(self.t0) {
            Some(after) => self.t0_wall + after,
            None => self
                .t0_wall
                .checked_sub(self.t0.duration_since(at))
                .unwrap_or(self.t0_wall),
        }
    }

    /// Records when the app was seen gone.
    fn app_gone(&self, mut report: DrainReport, app_gone: Option<Instant>) -> DrainReport {
        if let Some(at) = app_gone {
            report.app_gone_at = Some(self.wall(at));
        }
        report
    }

    /// One admin call under the drain's own timeout; tracks refusals.
    async fn call<T>(
        &mut self,
        what: &str,
        f: impl Future<Output = Result<T, AdminFailure>>,
    ) -> Result<T, AdminFailure> {
        let result = match tokio::time::timeout(self.settings.admin_timeout, f).await {
            Ok(r) => r,
            Err(_) => Err(AdminFailure {
                refused: false,
                message: format!(
                    "Envoy admin: {what} timed out after {}",
                    crate::config::format_duration(self.settings.admin_timeout)
                ),
            }),
        };
        match &result {
            Ok(_) => self.refusals = 0,
            Err(f) if f.refused => self.refusals += 1,
            Err(_) => {}
        }
        result
    }

    /// `POST path`, retried up to `admin_attempts` times; stops early once Envoy is known gone.
    async fn post_retrying(&mut self, path: &str) -> bool {
        let attempts = self.settings.admin_attempts.max(1);
        for attempt in 1..=attempts {
            let admin = self.admin;
            match self.call(path, admin.admin_post(path)).await {
                Ok(()) => {
                    tracing::debug!(path, attempt, "admin POST ok");
                    return true;
                }
                Err(e) => {
                    if self.refusals >= self.settings.refusals_for_gone {
                        // Nothing listens: Envoy has exited. Not an error in itself; the drain
                        // judges it (proxy gone early, or gone with the app).
                        tracing::debug!(path, error = %e, "admin refused; Envoy has exited");
                        return false;
                    }
                    if attempt == attempts {
                        self.errors.push(format!(
                            "POST {path} failed after {attempt} attempt(s): {e}"
                        ));
                        return false;
                    }
                    tracing::debug!(path, attempt, error = %e, "admin POST failed; retrying");
                    tokio::time::sleep(self.settings.retry_backoff).await;
                }
            }
        }
        false
    }

    /// The deadline came: quit the proxy whatever the app and the counts say.
    async fn deadline_quit<S: PodProcessSource>(
        mut self,
        report: DrainReport,
        app: &AppTracker<S>,
        live: usize,
        app_gone: Option<Instant>,
        remaining: Duration,
    ) -> DrainReport {
        self.errors.push(format!(
            "drain deadline reached ({} after the deletion was seen) with {live} app \
                 process(es) alive{}; quitting the proxy",
            crate::config::format_duration(remaining),
            if app_gone.is_some() {
                " and traffic in flight"
            } else {
                ""
            },
        ));
        let mut report = self.app_gone(report, app_gone);
        (report.quit_sent_at, report.proxy_exit_seen_at) = self.quit().await;
        report.quit_reason = Some(QuitReason::OutOfTime);
        self.finish(report, DrainOutcome::Deadline, app)
    }

    /// The Envoy version from `/server_info`, once per drain; `None` when it cannot be read or
    /// parsed (logged, not an error of the drain: the call for a current Envoy follows).
    async fn envoy_version(&mut self) -> Option<envoy_version::EnvoyVersion> {
        let admin = self.admin;
        match self.call("GET /server_info", admin.server_info()).await {
            Ok(body) => {
                let version = envoy_version::EnvoyVersion::from_server_info(&body);
                if version.is_none() {
                    tracing::debug!(
                        "no Envoy version in /server_info; draining as for a current Envoy"
                    );
                }
                version
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot read /server_info; draining as for a current Envoy");
                None
            }
        }
    }

    /// One sample of the counts. `Err(())` when it failed (already recorded).
    async fn sample(&mut self) -> Result<DrainSample, ()> {
        let admin = self.admin;
        let prefix = self.settings.stat_prefix.as_str();
        match self.call("GET /stats", admin.drain_sample(prefix)).await {
            Ok(c) => Ok(c),
            Err(e) if e.refused => {
                tracing::debug!(error = %e, "admin refused the connection");
                Err(())
            }
            Err(e) => {
                self.errors
                    .push(format!("reading the proxy's counts failed: {e}"));
                Err(())
            }
        }
    }

    /// `POST /quitquitquit`, then watches the admin API go away (bounded by `quit_confirm`).
    /// Returns when the quit was sent and when the proxy was seen gone.
    async fn quit(&mut self) -> (Option<SystemTime>, Option<SystemTime>) {
        if let Some(tx) = &self.quit_started {
            let _ = tx.send(());
        }
        let attempts = self.settings.admin_attempts.max(1);
        let mut sent = None;
        for attempt in 1..=attempts {
            let before = Instant::now();
            let admin = self.admin;
            match self.call(QUIT_PATH, admin.admin_post(QUIT_PATH)).await {
                Ok(()) => {
                    sent = Some(before);
                    break;
                }
                Err(e) if e.refused => {
                    // Nothing listens: Envoy has exited already (on its own, or an earlier
                    // attempt worked and its answer was lost).
                    if sent.is_none() {
                        tracing::info!("the proxy had already exited when asked to quit");
                    }
                    return (sent.map(|s| self.wall(s)), Some(self.wall(Instant::now())));
                }
                Err(e) => {
                    // Envoy may exit before it finishes answering: retry only while it still
                    // answers.
                    sent = Some(before);
                    if attempt == attempts {
                        self.errors.push(format!("POST {QUIT_PATH}: {e}"));
                    } else {
                        tracing::debug!(error = %e, "quit request failed; checking whether the proxy exits");
                        if let Some(gone) = self
                            .wait_gone(self.settings.retry_backoff.max(Duration::from_millis(50)))
                            .await
                        {
                            return (sent.map(|s| self.wall(s)), Some(self.wall(gone)));
                        }
                    }
                }
            }
        }
        let sent_at = sent.map(|s| self.wall(s));
        match self.wait_gone(self.settings.quit_confirm).await {
            Some(gone) => (sent_at, Some(self.wall(gone))),
            None => {
                self.errors.push(format!(
                    "the proxy still answered {} after /quitquitquit",
                    crate::config::format_duration(self.settings.quit_confirm)
                ));
                (sent_at, None)
            }
        }
    }

    /// Polls the admin API until it refuses connections; returns when, or `None` after `limit`.
    async fn wait_gone(&mut self, limit: Duration) -> Option<Instant> {
        let until = Instant::now() + limit;
        let poll = self.settings.settle_poll.max(Duration::from_millis(1));
        while Instant::now() < until {
            let admin = self.admin;
            if let Err(e) = self.call("GET /ready", admin.probe()).await {
                if e.refused {
                    return Some(Instant::now());
                }
            }
            tokio::time::sleep(poll).await;
        }
        None
    }

    fn finish<S: PodProcessSource>(
        self,
        mut report: DrainReport,
        outcome: DrainOutcome,
        app: &AppTracker<S>,
    ) -> DrainReport {
        report.outcome = outcome;
        report.elapsed = self.t0.elapsed();
        report.app_processes_seen = app.processes_seen();
        report.app_processes_left = app.live();
        let since = |t: Option<SystemTime>| {
            report
                .app_gone_at
                .zip(t)
                .and_then(|(gone, t)| t.duration_since(gone).ok())
        };
        report.app_gone_to_quit = since(report.quit_sent_at);
        report.app_gone_to_proxy_exit = since(report.proxy_exit_seen_at);
        report.errors = self.errors.kept;
        report.error_count = self.errors.count;
        report
    }
}

// ---------------------------------------------------------------------------------------------
// Jobs
// ---------------------------------------------------------------------------------------------

/// Quits the proxy of a Job-like pod once its app has finished for good, so the pod completes.
/// Call after the startup hold for a pod that is not being deleted; returns at once with
/// [`JobOutcome::NotAJob`] for `restartPolicy: Always`, with [`JobOutcome::Deleting`] when a
/// deletion starts (call [`drain`] then), and otherwise when the proxy was quit, the pod is gone
/// or the agent stops.
pub async fn finish_job<A: ProxyAdmin, S: PodProcessSource>(ctx: DrainCtx<'_, A, S>) -> JobReport {
    let DrainCtx {
        key,
        admin,
        processes,
        mut view,
        stop,
        settings,
        quit_started,
    } = ctx;
    let mut d = Drainer::new(
        admin,
        settings,
        quit_started,
        Instant::now(),
        SystemTime::now(),
    );
    let mut report = JobReport::new(JobOutcome::NotAJob);
    let finish = |mut report: JobReport, outcome: JobOutcome, d: Drainer<'_, A>| {
        report.outcome = outcome;
        report.app_finished_to_quit = report
            .app_finished_at
            .zip(report.quit_sent_at)
            .and_then(|(a, q)| q.duration_since(a).ok());
        report.errors = d.errors.kept;
        report.error_count = d.errors.count;
        if !matches!(outcome, JobOutcome::NotAJob) {
            tracing::debug!(
                outcome = outcome.as_str(),
                finished_by = ?report.finished_by,
                app_finished_to_quit_ms = report.app_finished_to_quit.map(|d| d.as_secs_f64() * 1e3),
                "job watch finished"
            );
        }
        report
    };

    let mut app = AppTracker::new(key, processes);
    let mut current = match view.borrow_and_update().clone() {
        Some(v) => v,
        None => return finish(report, JobOutcome::PodGone, d),
    };
    if !matches!(current.restart_policy.as_str(), "Never" | "OnFailure") {
        return finish(report, JobOutcome::NotAJob, d);
    }
    tracing::debug!(restart_policy = %current.restart_policy, "watching for the job's app to finish");

    let finished_at = loop {
        if current.deletion.is_some() {
            return finish(report, JobOutcome::Deleting, d);
        }
        let snapshot = app.refresh(&current).await;
        if let Some(by) = decide::job_finished(&current, &snapshot) {
            report.finished_by = Some(by);
            break app.last_exit().unwrap_or_else(Instant::now);
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return finish(report, JobOutcome::AgentStopping, d),
            changed = view.changed() => match (changed, view.borrow_and_update().clone()) {
                (Ok(()), Some(v)) => current = v,
                _ => return finish(report, JobOutcome::PodGone, d),
            },
            (pid, _) = app.next_exit() => tracing::debug!(pid, "job process exited"),
            _ = tokio::time::sleep(settings.job_rescan_every) => {}
        }
    };
    report.app_finished_at = Some(d.wall(finished_at));
    tracing::info!(by = ?report.finished_by, "the job's app finished for good; quitting its proxy once nothing is in flight");

    // Wait (bounded) for in-flight traffic to settle, then quit.
    let mut judge = InFlightJudge::new(settings.idle_window);
    let until = Instant::now() + settings.job_in_flight_wait;
    let mut failed = 0u32;
    let mut samples = 0u32;
    let mut unexposed = UnexposedBytes::default();
    let reason = loop {
        samples += 1;
        match d.sample().await {
            Ok(sample) => match judge.observe(Instant::now().into_std(), &sample) {
                InFlight::Idle(why) => break QuitReason::Idle(why),
                InFlight::NoFilter => break QuitReason::NoFilter,
                busy @ InFlight::Busy { .. } => {
                    if unexposed.notice(Instant::now(), &sample, busy, settings.idle_window) {
                        tracing::warn!("{UNEXPOSED_BYTES_ADVICE}");
                        d.errors.push(UNEXPOSED_BYTES_ADVICE.to_string());
                    }
                }
            },
            Err(()) => {
                failed += 1;
                if d.refusals >= settings.refusals_for_gone {
                    tracing::info!("the job's proxy has already exited");
                    return finish(report, JobOutcome::ProxyAlreadyGone, d);
                }
                if failed >= settings.admin_attempts {
                    break QuitReason::StatsUnavailable;
                }
            }
        }
        if Instant::now() >= until {
            d.errors.push(format!(
                "traffic still in flight {} after the job finished; quitting the proxy anyway",
                crate::config::format_duration(settings.job_in_flight_wait)
            ));
            break QuitReason::OutOfTime;
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return finish(report, JobOutcome::AgentStopping, d),
            changed = view.changed() => match (changed, view.borrow_and_update().clone()) {
                (Ok(()), Some(v)) if v.deletion.is_some() => return finish(report, JobOutcome::Deleting, d),
                (Ok(()), Some(_)) => {}
                _ => return finish(report, JobOutcome::PodGone, d),
            },
            _ = tokio::time::sleep(settle_wait(settings, samples)) => {}
        }
    };
    let (sent, exited) = d.quit().await;
    report.quit_sent_at = sent;
    report.proxy_exit_seen_at = exited;
    report.quit_reason = Some(reason);
    let outcome = if sent.is_none() && exited.is_some() {
        JobOutcome::ProxyAlreadyGone
    } else {
        JobOutcome::Completed
    };
    finish(report, outcome, d)
}

#[cfg(test)]
mod tests;
