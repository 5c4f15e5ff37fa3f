//! The drain of a pod being deleted: drain Envoy's inbound side at once (the call
//! [`super::envoy_version`] picks, as pilot-agent sends it; nothing that touches outbound),
//! follow the app's processes and what is in flight, and quit Envoy when
//! [`super::decide::drain_next`] says so — the app gone and nothing in flight, the deadline, or
//! Envoy gone by itself. This executor only samples and performs; every rule is in `decide.rs`.

use std::time::{Duration, SystemTime};

use tokio::sync::watch;
// tokio's clock throughout, so paused-time tests drive the deadlines.
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::admin::{Drainer, ProxyAdmin};
use super::app_exit::{AppSnapshot, AppTracker, PodProcessSource};
use super::plan::{self, DrainPlan};
use super::step::DrainState;
use super::Started;
use super::{decide, envoy_version, DrainCtx, DrainOutcome, DrainReport, DrainStep, QuitReason};
use crate::pod::{Deletion, PodView, SidecarMode, DEFAULT_GRACE};

/// Envoy's admin call that undoes `/healthcheck/fail` (`decide::restore_health`).
pub const HEALTHCHECK_OK_PATH: &str = "/healthcheck/ok";

/// Drains a pod being deleted: see the module docs. Call once the pod has a
/// `deletionTimestamp`; returns when the proxy was quit (or is gone), the pod is gone, or the
/// agent stops. Never panics, never exceeds the deadline by more than one admin timeout plus
/// `quit_confirm`.
pub async fn drain<A: ProxyAdmin, S: PodProcessSource>(ctx: DrainCtx<'_, A, S>) -> DrainReport {
    let t0 = Instant::now();
    let started_at = SystemTime::now();
    let Started {
        mut d,
        mut app,
        mut view,
        stop,
        settings,
    } = ctx.start(t0, started_at);
    let initial = view.borrow_and_update().clone();
    let deletion = deletion_or_now(initial.as_ref(), started_at);
    let mut deadline = Deadline::new(deletion, started_at, t0);
    let mut report = DrainReport {
        deadline_at: deadline.plan.deadline,
        deadline_meaning: deadline.plan.meaning,
        ..DrainReport::new(DrainOutcome::AppDone, started_at)
    };
    let Some(mut current) = initial else {
        report.outcome = DrainOutcome::PodGone;
        return report;
    };
    tracing::info!(
        grace_s = deletion.grace.as_secs(),
        remaining_ms = deadline.remaining.as_millis() as u64,
        deadline_meaning = ?deadline.plan.meaning,
        "pod deleted: draining inbound, watching the app"
    );

    // Grab the app's processes first (the kubelet is sending SIGTERM right now), then drain.
    let mut snapshot = app.refresh(&current).await;
    let kind = decide::drain_kind(&current);
    let kubelet_ordered = kind == decide::DrainKind::KubeletOrdered;
    let Some(deadline_passed) = d
        .drain_inbound(&mut report, &current, kubelet_ordered, deadline.at, &stop)
        .await
    else {
        return d.finish(report, DrainOutcome::AgentStopping, &app);
    };

    // The loop only looks, asks and sleeps; what it saw goes to the step (`step.rs`), which
    // keeps the counters, the told-once flags and the back-offs, and says what follows.
    let native = current.mode == SidecarMode::Native;
    let texts = current.profile.texts();
    let mut state = DrainState::new(settings, texts, kubelet_ordered, native, t0, Instant::now());
    if deadline_passed {
        state.deadline_passed();
        d.deadline_passed(&snapshot, kubelet_ordered, deadline.remaining);
    }
    loop {
        let now = Instant::now();
        for step in state.round(&snapshot, app.last_exit(), now) {
            d.tell(step);
        }
        // Sample the counts: regularly while the app runs (idle history), every round once it
        // is gone (past the deadline too: only an idle judgement quits the proxy then).
        if state.sample_due(now) {
            d.sample_and_take(&mut state, &mut report, &current, kind, now)
                .await;
        }

        let proxy_gone = d.envoy_gone();
        if proxy_gone && !state.gone() {
            // Envoy has exited. Before blaming the drain duration, look at the app once more:
            // it may have exited at the same moment.
            snapshot = app.refresh(&current).await;
            state.looked_again(&snapshot, app.last_exit(), Instant::now());
        }
        let decision = state.decide(proxy_gone, &snapshot, current.profile.texts().own_end);
        if let Some(why) = decision.unreadable {
            tracing::warn!("{why}");
            d.errors.push(why);
        }
        let app_gone = state.app_gone();
        let remaining = deadline.remaining;
        if decision.next != decide::DrainNext::Wait {
            let seen = (&snapshot, app_gone, remaining, &current, &app);
            return d.conclude(report, decision.next, seen).await;
        }
        if let Some(why) = decision.unseen {
            d.errors.push(why);
        }

        let wait = state.wait(Instant::now());
        let next_deadline = (!state.past_deadline()).then_some(deadline.at);
        let rescan = match news(&stop, next_deadline, &mut view, &mut app, wait).await {
            News::AgentStopping => return d.finish(report, DrainOutcome::AgentStopping, &app),
            News::Deadline => {
                state.deadline_passed();
                d.deadline_passed(&snapshot, kubelet_ordered, deadline.remaining);
                false
            }
            News::Pod(Some(v)) => {
                // A shortened grace period moves the kill, and so the deadline, earlier.
                if let Some(del) = v.deletion {
                    deadline.follow(del, &mut report);
                }
                current = *v;
                true
            }
            News::Pod(None) => {
                let decide::DrainNext::End(end) = state.pod_removed() else {
                    unreachable!("decide::drain_next ends every drain whose pod is removed")
                };
                return d.end(report, end, &snapshot, app_gone, remaining, &current, &app);
            }
            News::AppExited => true,
            News::Slept => state.rescan_due(Instant::now()),
        };
        // Re-scan on news (an exit, a status change) and regularly for forked processes; not on
        // every count sample.
        if rescan {
            state.rescanned(Instant::now());
            snapshot = app.refresh(&current).await;
        }
    }
}

/// The pod's deletion as its view says, or (a drain started without one) now with the default
/// grace period.
fn deletion_or_now(view: Option<&PodView>, now: SystemTime) -> Deletion {
    match view.and_then(|v| v.deletion) {
        Some(d) => d,
        None => {
            tracing::warn!("drain started for a pod without a deletionTimestamp; assuming deletion now with the default grace period");
            Deletion {
                timestamp: plan::timestamp(now),
                grace: DEFAULT_GRACE,
            }
        }
    }
}

/// The drain's deadline: its plan ([`DrainPlan`]), the time it left when last planned, and the
/// moment on tokio's clock.
struct Deadline {
    plan: DrainPlan,
    remaining: Duration,
    at: Instant,
}

impl Deadline {
    /// The deadline of `deletion`, first seen at `started_at` (`t0` on tokio's clock).
    fn new(deletion: Deletion, started_at: SystemTime, t0: Instant) -> Deadline {
        let plan = DrainPlan::new(deletion, started_at);
        let remaining = plan.remaining(started_at);
        Deadline {
            plan,
            remaining,
            at: t0 + remaining,
        }
    }

    /// A shortened grace period (`deletion`, from a pod update) moves the kill, and so the
    /// drain's deadline, earlier: the plan and the report follow.
    fn follow(&mut self, deletion: Deletion, report: &mut DrainReport) {
        let now = SystemTime::now();
        let Some(next) = self.plan.shortened(deletion, now) else {
            return;
        };
        self.plan = next;
        self.remaining = self.plan.remaining(now);
        self.at = Instant::now() + self.remaining;
        report.deadline_at = self.plan.deadline;
        report.deadline_meaning = self.plan.meaning;
        tracing::info!(
            remaining_ms = self.remaining.as_millis() as u64,
            "the pod's grace period was shortened: the drain's deadline follows"
        );
    }
}

/// What a round saw, for its conclusion: the app's snapshot, when the app was seen gone, the
/// time the deadline left, the pod's view, the app's tracker.
type RoundSeen<'a, S> = (
    &'a AppSnapshot,
    Option<Instant>,
    Duration,
    &'a PodView,
    &'a AppTracker<S>,
);

/// What ended a wait of the drain's loop.
enum News {
    AgentStopping,
    Deadline,
    /// The pod's object changed (`None`: it was removed).
    Pod(Option<Box<PodView>>),
    /// App processes exited.
    AppExited,
    /// `wait` passed with no news.
    Slept,
}

/// Waits for news, at most `wait`: the agent stopping, the `deadline` (`None`: passed already),
/// a change of the pod's `view`, an exit of the `app`'s processes, in that order when several
/// are ready.
async fn news<S: PodProcessSource>(
    stop: &CancellationToken,
    deadline: Option<Instant>,
    view: &mut watch::Receiver<Option<PodView>>,
    app: &mut AppTracker<S>,
    wait: Duration,
) -> News {
    tokio::select! {
        biased;
        _ = stop.cancelled() => News::AgentStopping,
        _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => News::Deadline,
        changed = view.changed() => match (changed, view.borrow_and_update().clone()) {
            (Ok(()), Some(v)) => News::Pod(Some(Box::new(v))),
            _ => News::Pod(None),
        },
        (pid, _) = app.next_exit() => {
            // Issue 29: the exits of a group killed at once (2,000 processes at the end of
            // a grace period) are taken together and cost one rescan, not one each.
            let more = app.take_ready_exits();
            tracing::debug!(pid, more, "app process exited");
            News::AppExited
        }
        _ = tokio::time::sleep(wait) => News::Slept,
    }
}

/// Sends the mesh's agent the SIGTERM that ends its fixed wait ([`decide::sigterm_after_quit`]),
/// recording what happened on the report.
async fn end_the_meshs_agent<S: PodProcessSource>(
    report: &mut DrainReport,
    view: &PodView,
    processes: &S,
) {
    let Some(proxy_id) = view.proxy_container().and_then(|c| c.id.clone()) else {
        return;
    };
    match processes.terminate_main(&proxy_id).await {
        Ok(pid) => {
            report.agent_signalled = true;
            tracing::info!(pid, "Envoy is gone: SIGTERM to the mesh's agent, which waits a fixed drain time otherwise");
        }
        Err(why) => {
            tracing::warn!("{why}");
            report.errors.push(why);
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

impl<A: ProxyAdmin> Drainer<'_, A> {
    /// Drains Envoy's inbound side at once (the call `envoy_version.rs` picks for this Envoy),
    /// unless the mesh's preStop did (`kubelet_ordered`) or the `deadline` has passed already
    /// (an agent restarted late in a drain: the decision is the deadline's). Whether the
    /// deadline has passed; `None`: the agent stops.
    async fn drain_inbound(
        &mut self,
        report: &mut DrainReport,
        current: &PodView,
        kubelet_ordered: bool,
        deadline: Instant,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Option<bool> {
        if kubelet_ordered {
            tracing::info!(
                "native sidecar with its mesh's preStop drain ({}): the kubelet ends the proxy after the app; measuring only",
                current.profile.texts().prestop_drain
            );
        }
        let mut deadline_passed = false;
        let inbound = tokio::select! {
            biased;
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep_until(deadline) => {
                deadline_passed = true;
                (false, None, None)
            }
            // The mesh's preStop drained inbound already (Istio's `/drain`, kuma-dp's SIGUSR2).
            _ = std::future::ready(()), if kubelet_ordered => (false, None, None),
            r = async {
                // Which call drains inbound depends on the Envoy (envoy_version.rs); one
                // request, and a failure only means "as for a current Envoy".
                let version = self.envoy_version().await;
                let call = envoy_version::inbound_drain(version, current.profile.texts());
                (self.post_retrying(call.path).await, version, call.advice)
            } => r,
        };
        let (drained, version, advice) = inbound;
        report.inbound_drained = drained;
        report.envoy_version = version.map(|v| v.to_string());
        if !deadline_passed && !kubelet_ordered {
            self.tell(DrainStep::InboundDrained {
                drained,
                envoy_version: report.envoy_version.clone(),
            });
        }
        if let Some(advice) = advice {
            tracing::warn!("{advice}");
            add_advice(report, advice);
        }
        Some(deadline_passed)
    }

    /// Samples Envoy's counts (the round began at `now`) and gives the step what came back.
    async fn sample_and_take(
        &mut self,
        state: &mut DrainState,
        report: &mut DrainReport,
        current: &PodView,
        kind: decide::DrainKind,
        now: Instant,
    ) {
        match self.sample(state.gone()).await {
            Ok(sample) => {
                self.take_sample(state, report, current, kind, &sample)
                    .await
            }
            Err(()) => state.sample_failed(now, Instant::now(), self.refusals > 0),
        }
    }

    /// A sample answered: the report's counts, the step's judgement (its advice and the
    /// kernel's flushing, once each), and Envoy's health check restored where the mesh's agent
    /// failed it and the drain may undo that.
    async fn take_sample(
        &mut self,
        state: &mut DrainState,
        report: &mut DrainReport,
        current: &PodView,
        kind: decide::DrainKind,
        sample: &super::in_flight::DrainSample,
    ) {
        report.filter_present = Some(sample.filter.is_some());
        // The filter's counts, else the capture listeners' (Consul).
        report.last_counts = sample.counts();
        report.last_traffic_bytes = sample.traffic.exposed.then_some(sample.traffic.total);
        let sampled = state.sampled(Instant::now(), sample);
        if let Some(advice) = sampled.advice {
            tracing::warn!("{advice}");
            add_advice(report, advice);
        }
        // The gauge in the sample follows `/healthcheck/fail` (and `/ok`) only at Envoy's next
        // stats flush; `/ready` says it at once. Asked only of a mesh that fails it, in a drain
        // that may undo it.
        let health_check_failed =
            if current.profile.fails_health_check_on_sigterm && kind == decide::DrainKind::Full {
                self.health_check_failed_now().await
            } else {
                sample.health_check_failed
            };
        if decide::restore_health(
            current.profile.fails_health_check_on_sigterm,
            kind,
            health_check_failed,
        ) {
            let restored = self.post_retrying(HEALTHCHECK_OK_PATH).await;
            report.health_checks_restored += u32::from(restored);
            tracing::info!(
                restored,
                "the mesh's agent failed Envoy's health check (outbound would be drain-closed): restored it"
            );
        }
        if let Some(step) = sampled.flushing {
            self.tell(step);
        }
    }

    /// Ends the drain as a round's decision (`next`, not `Wait`) says, by what the round saw:
    /// the app's snapshot, when it was seen gone, the time the deadline left, the pod's view.
    async fn conclude<S: PodProcessSource>(
        self,
        report: DrainReport,
        next: decide::DrainNext,
        seen: RoundSeen<'_, S>,
    ) -> DrainReport {
        let (snapshot, app_gone, remaining, current, app) = seen;
        match next {
            decide::DrainNext::End(end) => {
                self.end(report, end, snapshot, app_gone, remaining, current, app)
            }
            decide::DrainNext::Quit(reason) => {
                self.app_done_quit(report, reason, app_gone, current, app)
                    .await
            }
            decide::DrainNext::Wait => unreachable!("a drain that waits is not concluded"),
        }
    }

    /// Records when the app was seen gone.
    fn app_gone(&self, mut report: DrainReport, app_gone: Option<Instant>) -> DrainReport {
        if let Some(at) = app_gone {
            report.app_gone_at = Some(self.wall(at));
        }
        report
    }

    /// Ends the drain as `decide::drain_next` said, without a quit: records what the outcome
    /// needs (the advice, the proxy's exit) and finishes.
    #[allow(clippy::too_many_arguments)]
    fn end<S: PodProcessSource>(
        mut self,
        report: DrainReport,
        end: decide::DrainEnd,
        snapshot: &super::app_exit::AppSnapshot,
        app_gone: Option<Instant>,
        remaining: Duration,
        view: &PodView,
        app: &AppTracker<S>,
    ) -> DrainReport {
        let mut report = self.app_gone(report, app_gone);
        match end.outcome {
            DrainOutcome::AppDone | DrainOutcome::KubeletOrdered if end.app_unknown => {
                self.errors.push(
                    "the proxy exited on its own; whether the app had finished is unknown \
                     (its processes are not visible)"
                        .to_string(),
                );
            }
            DrainOutcome::KubeletOrdered if !self.envoy_gone() => {
                self.errors.push(
                    "the pod object was removed before the proxy's exit was seen: the app → \
                     proxy exit lag is an upper bound"
                        .to_string(),
                );
            }
            DrainOutcome::SidecarLost => {
                let advice = crate::mesh::proxy_died_advice(&view.profile, snapshot.live);
                tracing::warn!("{advice}");
                add_advice(&mut report, advice);
            }
            DrainOutcome::ProxyGoneEarly => {
                // What to change depends on how pilot-agent ends Envoy for this pod
                // (`EXIT_ON_ZERO_ACTIVE_CONNECTIONS` or not): the pod's own advice.
                let advice = format!(
                    "{} ({} app process(es) still ran; the pod's grace period is {}s)",
                    crate::pod::drain_advice(view),
                    snapshot.live,
                    view.deletion.map_or(0, |d| d.grace.as_secs()),
                );
                tracing::warn!("{advice}");
                add_advice(&mut report, advice);
            }
            DrainOutcome::Deadline if self.envoy_gone() => {
                self.errors.push(format!(
                    "the proxy ended past the drain deadline ({} after the deletion was seen) \
                     with {} app process(es) still running: the grace period's end (the \
                     kubelet's kill, or the mesh's own drain), as without holdfast",
                    crate::config::format_duration(remaining),
                    snapshot.live
                ));
            }
            DrainOutcome::Deadline => {
                self.errors.push(format!(
                    "the drain deadline came ({} after the deletion was seen) with the proxy still \
                     running; the kubelet ends it at the grace period's end",
                    crate::config::format_duration(remaining)
                ));
            }
            _ => {}
        }
        if matches!(
            end.outcome,
            DrainOutcome::AppDone | DrainOutcome::KubeletOrdered
        ) && self.envoy_gone()
        {
            tracing::info!("the proxy has already exited");
        }
        if end.proxy_exit_seen {
            report.proxy_exit_seen_at = Some(self.wall(Instant::now()));
        }
        self.finish(report, end.outcome, app)
    }

    /// The app is gone and nothing is in flight: quit the proxy (and end the mesh's agent's
    /// fixed wait where it has one, [`decide::sigterm_after_quit`]).
    async fn app_done_quit<S: PodProcessSource>(
        mut self,
        report: DrainReport,
        reason: QuitReason,
        app_gone: Option<Instant>,
        current: &PodView,
        app: &AppTracker<S>,
    ) -> DrainReport {
        let mut report = self.app_gone(report, app_gone);
        (report.quit_sent_at, report.proxy_exit_seen_at) = self.quit(reason).await;
        report.quit_reason = Some(reason);
        if decide::sigterm_after_quit(
            current.profile.sigterm_after_quit,
            report.proxy_exit_seen_at.is_some(),
        ) {
            end_the_meshs_agent(&mut report, current, app.source()).await;
        }
        tracing::info!(reason = ?reason, "app gone and nothing in flight: proxy quit");
        self.finish(report, DrainOutcome::AppDone, app)
    }

    /// The deadline came with the drain still waiting (the app running, or traffic in flight):
    /// said once; the proxy is left running ([`decide::drain_next`]). Not said in a
    /// kubelet-ordered drain, which the deadline ends.
    fn deadline_passed(
        &mut self,
        snapshot: &AppSnapshot,
        kubelet_ordered: bool,
        remaining: Duration,
    ) {
        if kubelet_ordered {
            return;
        }
        let why = format!(
            "the drain deadline came ({} after the deletion was seen) with {} app process(es) \
             alive{}: the proxy is left running for them, to the app's exit (then quit as usual) \
             or the kubelet's kill at the grace period's end, as without holdfast",
            crate::config::format_duration(remaining),
            snapshot.live,
            if snapshot.live == 0 {
                " and traffic in flight"
            } else {
                ""
            },
        );
        tracing::warn!("{why}");
        self.errors.push(why);
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
