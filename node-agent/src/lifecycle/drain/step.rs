//! The drain's bookkeeping as a sans-IO step, the way the pod machine is one: [`DrainState`]
//! takes each observation of a drain's watch loop — the app's processes looked at, a sample of
//! Envoy's counts (or its failure), the proxy's exit, a wake-up — and says what follows: the
//! steps and errors for the row, whether a sample is due, the decision of
//! [`decide::drain_next`], and how long to sleep. It owns what the loop of
//! [`super::drain`] kept in mutable locals: the told-once flags, the sample and rescan counters
//! and their back-offs, the in-flight judge and which judgement counts.
//!
//! No I/O and no clock: every call gets `now`. `deletion.rs` asks Envoy, looks at the
//! processes, sleeps and performs; the tests below drive the step directly, without sleeping.

use std::time::Duration;

use tokio::time::Instant;

use super::app_exit::{AppContainer, AppSnapshot};
use super::decide::{self, DrainNext, DrainSeen};
use super::in_flight::{DrainSample, InFlight, InFlightJudge, UnexposedBytes};
use super::{DrainSettings, DrainStep};

/// A drain's state between two observations.
#[derive(Debug)]
pub(super) struct DrainState {
    settings: DrainSettings,
    /// When the drain started (the samples' back-off counts from it).
    t0: Instant,
    kubelet_ordered: bool,
    native: bool,
    judge: InFlightJudge,
    unexposed: UnexposedBytes,
    /// The latest judgement (`None`: the last sample failed, or none yet).
    judgement: Option<InFlight>,
    next_stats: Instant,
    failed_samples_while_gone: u32,
    failed_samples_while_running: u32,
    unseen_warned: bool,
    unreadable_told: bool,
    flushing_told: bool,
    /// When the app was seen gone (its last exit, when known).
    app_gone: Option<Instant>,
    /// The app was gone at the start of this round (what the round's sample, judgement and
    /// wait go by; the proxy's exit may show the app gone later in the round).
    gone_this_round: bool,
    samples_since_gone: u32,
    rescans: u32,
    next_rescan: Instant,
    /// App containers whose end was told (once each).
    exits_told: Vec<String>,
    deadline_passed: bool,
    /// What the last decision saw (a removed pod is decided from it).
    last_seen: Option<DrainSeen>,
}

/// What a sample that answered says for the row, in the order the loop tells it.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Sampled {
    /// The judgement of this sample.
    pub(crate) judgement: Option<InFlight>,
    /// Advice for the report (told once: the counts that could tell idle from busy are not
    /// there).
    pub(crate) advice: Option<String>,
    /// The kernel still sends what the app wrote (told once, after the app is gone).
    pub(crate) flushing: Option<DrainStep>,
}

/// The decision of one round.
#[derive(Debug, PartialEq)]
pub(super) struct Decision {
    pub(crate) next: DrainNext,
    /// The app is gone and Envoy's counts cannot be read (said once per drain, logged as a
    /// warning too).
    pub(crate) unreadable: Option<String>,
    /// An app container runs by its status but none of its processes is visible (said once
    /// per drain, when the drain waits).
    pub(crate) unseen: Option<String>,
}

impl DrainState {
    pub(super) fn new(
        settings: &DrainSettings,
        texts: &'static crate::mesh::MeshTexts,
        kubelet_ordered: bool,
        native: bool,
        t0: Instant,
        now: Instant,
    ) -> DrainState {
        DrainState {
            settings: settings.clone(),
            t0,
            kubelet_ordered,
            native,
            judge: InFlightJudge::new(settings.idle_window),
            unexposed: UnexposedBytes::new(texts),
            judgement: None,
            next_stats: now,
            failed_samples_while_gone: 0,
            failed_samples_while_running: 0,
            unseen_warned: false,
            unreadable_told: false,
            flushing_told: false,
            app_gone: None,
            gone_this_round: false,
            samples_since_gone: 0,
            rescans: 0,
            next_rescan: now + decide::rescan_every(settings, 0),
            exits_told: Vec::new(),
            deadline_passed: false,
            last_seen: None,
        }
    }

    /// The deadline came (it may have before the loop: an agent restarted late in a drain).
    pub(super) fn deadline_passed(&mut self) {
        self.deadline_passed = true;
    }

    /// Whether the deadline has passed.
    pub(super) fn past_deadline(&self) -> bool {
        self.deadline_passed
    }

    /// When the app was seen gone.
    pub(super) fn app_gone(&self) -> Option<Instant> {
        self.app_gone
    }

    /// The app was gone at this round's start.
    pub(super) fn gone(&self) -> bool {
        self.gone_this_round
    }

    /// A round begins with the app as `snapshot` shows it (`last_exit`: the app's last process
    /// exit seen): each container's end and the app's end, once each, for the timeline.
    pub(super) fn round(
        &mut self,
        snapshot: &AppSnapshot,
        last_exit: Option<Instant>,
        now: Instant,
    ) -> Vec<DrainStep> {
        let mut steps = Vec::new();
        for (name, c) in &snapshot.containers {
            let exit_code = match c {
                AppContainer::Exited => None,
                AppContainer::Terminated { exit_code } => Some(*exit_code),
                _ => continue,
            };
            if self.exits_told.iter().any(|t| t == name) {
                continue;
            }
            self.exits_told.push(name.clone());
            steps.push(DrainStep::AppContainerExited {
                container: name.clone(),
                exit_code,
            });
        }
        if snapshot.gone_for_drain() && self.app_gone.is_none() {
            self.app_gone = Some(last_exit.unwrap_or(now));
            steps.push(DrainStep::AppGone);
        }
        self.gone_this_round = self.app_gone.is_some();
        if self.gone_this_round {
            self.samples_since_gone += 1;
        }
        steps
    }

    /// Whether to sample Envoy's counts now: regularly while the app runs (the judge's
    /// history), every round once it is gone — past the deadline too, where only an idle
    /// judgement quits the proxy ([`decide::drain_next`]). A sample taken is spaced from the
    /// next.
    pub(super) fn sample_due(&mut self, now: Instant) -> bool {
        if !(self.gone_this_round || now >= self.next_stats) {
            return false;
        }
        self.next_stats = now + decide::sample_every(&self.settings, now.duration_since(self.t0));
        true
    }

    /// A sample answered at `now`: judged; the advice and the kernel's flushing, once each.
    pub(super) fn sampled(&mut self, now: Instant, sample: &DrainSample) -> Sampled {
        self.failed_samples_while_running = 0;
        let now = now.into_std();
        let j = self.judge.observe(now, sample);
        let gone = self.gone_this_round;
        // The advice is for a drain held after the app's exit: the connections the app keeps
        // while it runs must not use up the once-only notice (it was said, and dropped, then).
        let advice = if gone && !self.kubelet_ordered {
            self.unexposed
                .notice(now, sample, j, self.settings.idle_window)
        } else {
            None
        };
        let flushing = match (j, gone, self.flushing_told) {
            (InFlight::Sending { bytes }, true, false) => {
                self.flushing_told = true;
                Some(DrainStep::KernelFlushing { bytes })
            }
            _ => None,
        };
        self.judgement = Some(j);
        Sampled {
            judgement: Some(j),
            advice,
            flushing,
        }
    }

    /// A sample failed (`round_now`: the round's start; `now`: after the failure; `refused`:
    /// Envoy refused connections, so it may have exited). While the app runs, failures space
    /// the next sample further; once it is gone they count towards "stats exhausted"; a
    /// refusal is confirmed soon rather than at the next regular sample.
    pub(super) fn sample_failed(&mut self, round_now: Instant, now: Instant, refused: bool) {
        self.judgement = None;
        if self.gone_this_round {
            self.failed_samples_while_gone += 1;
        } else {
            self.failed_samples_while_running = self.failed_samples_while_running.saturating_add(1);
            self.next_stats = now
                + decide::sample_every_after_failures(
                    &self.settings,
                    round_now.duration_since(self.t0),
                    self.failed_samples_while_running,
                );
        }
        if refused {
            self.next_stats = now + self.settings.retry_backoff;
        }
    }

    /// Envoy has exited and the app was not gone at the round's start: the second look at the
    /// app (`snapshot`, taken after the exit) may show it gone at the same moment.
    pub(super) fn looked_again(
        &mut self,
        snapshot: &AppSnapshot,
        last_exit: Option<Instant>,
        now: Instant,
    ) {
        if !self.gone_this_round && snapshot.gone_for_drain() {
            self.app_gone = Some(last_exit.unwrap_or(now));
        }
    }

    /// The decision of this round, from what it saw (`proxy_gone`: Envoy has exited; `app`:
    /// the latest look at the app; `own_end`: how the mesh's proxy ends without holdfast, for
    /// the error said when its counts cannot be read).
    pub(super) fn decide(
        &mut self,
        proxy_gone: bool,
        app: &AppSnapshot,
        own_end: &str,
    ) -> Decision {
        let seen = DrainSeen {
            app_gone: self.app_gone.is_some(),
            app_live: app.live,
            proxy_gone,
            judgement: if self.gone_this_round {
                self.judgement
            } else {
                None
            },
            stats_exhausted: self.failed_samples_while_gone >= self.settings.admin_attempts,
            deadline_passed: self.deadline_passed,
            kubelet_ordered: self.kubelet_ordered,
            native: self.native,
            pod_removed: false,
        };
        self.last_seen = Some(seen);
        let mut unreadable = None;
        if seen.app_gone && seen.stats_exhausted && !seen.proxy_gone && !self.unreadable_told {
            self.unreadable_told = true;
            unreadable = Some(format!(
                "the app is gone but Envoy's counts could not be read {} times: nothing says the \
                 last response was sent, so the drain waits for {own_end} or the deadline, as \
                 without holdfast",
                self.failed_samples_while_gone
            ));
        }
        let mut unseen = None;
        let next = decide::drain_next(seen);
        if next == DrainNext::Wait
            && !self.gone_this_round
            && !self.unseen_warned
            && app
                .containers
                .iter()
                .any(|(_, c)| *c == AppContainer::Unseen)
        {
            self.unseen_warned = true;
            unseen = Some(
                "an app container runs by its status but none of the pod's processes is visible \
                 by container id: the drain cannot see the app exit and waits for the status or \
                 the deadline (does the agent run with hostPID and the right --proc-root?)"
                    .to_string(),
            );
        }
        Decision {
            next,
            unreadable,
            unseen,
        }
    }

    /// The decision when the pod object is removed (after a round's decision said wait): an
    /// end, by what the round saw.
    pub(super) fn pod_removed(&self) -> DrainNext {
        decide::drain_next(DrainSeen {
            pod_removed: true,
            ..self.last_seen.unwrap_or(DrainSeen {
                app_gone: self.app_gone.is_some(),
                app_live: 0,
                proxy_gone: false,
                judgement: None,
                stats_exhausted: false,
                deadline_passed: self.deadline_passed,
                kubelet_ordered: self.kubelet_ordered,
                native: self.native,
                pod_removed: true,
            })
        })
    }

    /// How long to sleep after a round that waits, unless news comes first: once the app is
    /// gone only the counts are awaited (every `settle_poll` at first, backing off towards
    /// `stats_every`); before, until the next sample or rescan.
    pub(super) fn wait(&self, now: Instant) -> Duration {
        if self.gone_this_round {
            decide::settle_wait(&self.settings, self.samples_since_gone)
        } else {
            self.next_stats
                .min(self.next_rescan)
                .saturating_duration_since(now)
        }
    }

    /// Whether a sleep that ended at `now` is due a periodic rescan of the app's processes.
    pub(super) fn rescan_due(&self, now: Instant) -> bool {
        now >= self.next_rescan
    }

    /// The app's processes were rescanned at `now` (news, or the periodic rescan): the next
    /// periodic one backs off.
    pub(super) fn rescanned(&mut self, now: Instant) {
        self.rescans = self.rescans.saturating_add(1);
        self.next_rescan = now + decide::rescan_every(&self.settings, self.rescans);
    }
}

/// A finished Job's bounded wait for in-flight traffic before its proxy is quit, as a step:
/// each sample (or its failure) in, the decision of [`decide::job_next`] and the next sleep
/// out. `job.rs` keeps the I/O.
#[derive(Debug)]
pub(super) struct JobSettle {
    settings: DrainSettings,
    /// The wait is over at this moment.
    until: Instant,
    judge: InFlightJudge,
    unexposed: UnexposedBytes,
    failed: u32,
    samples: u32,
    flushing_told: bool,
}

impl JobSettle {
    /// The wait starts `now`, for at most `job_in_flight_wait`.
    pub(super) fn new(
        settings: &DrainSettings,
        texts: &'static crate::mesh::MeshTexts,
        now: Instant,
    ) -> JobSettle {
        JobSettle {
            settings: settings.clone(),
            until: now + settings.job_in_flight_wait,
            judge: InFlightJudge::new(settings.idle_window),
            unexposed: UnexposedBytes::new(texts),
            failed: 0,
            samples: 0,
            flushing_told: false,
        }
    }

    /// A sample answered at `now`: judged; the kernel's flushing and the advice, once each.
    pub(super) fn sampled(&mut self, now: Instant, sample: &DrainSample) -> Sampled {
        self.samples += 1;
        let now = now.into_std();
        let j = self.judge.observe(now, sample);
        let flushing = match (j, self.flushing_told) {
            (InFlight::Sending { bytes }, false) => {
                self.flushing_told = true;
                Some(DrainStep::KernelFlushing { bytes })
            }
            _ => None,
        };
        let advice = self
            .unexposed
            .notice(now, sample, j, self.settings.idle_window);
        Sampled {
            judgement: Some(j),
            advice,
            flushing,
        }
    }

    /// A sample failed.
    pub(super) fn sample_failed(&mut self) {
        self.samples += 1;
        self.failed += 1;
    }

    /// What follows the latest sample (`judgement`: its judgement, `None` when it failed),
    /// at `now`, with Envoy gone or not.
    pub(super) fn decide(
        &self,
        proxy_gone: bool,
        judgement: Option<InFlight>,
        now: Instant,
    ) -> decide::JobNext {
        decide::job_next(decide::JobSeen {
            proxy_gone,
            judgement,
            stats_exhausted: self.failed >= self.settings.admin_attempts,
            out_of_time: now >= self.until,
        })
    }

    /// The sleep before the next sample.
    pub(super) fn wait(&self) -> Duration {
        decide::settle_wait(&self.settings, self.samples)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{DrainOutcome, QuitReason};
    use crate::lifecycle::drain::in_flight::TrafficBytes;

    const MS: Duration = Duration::from_millis(1);

    fn settings() -> DrainSettings {
        DrainSettings::default()
    }

    fn texts() -> &'static crate::mesh::MeshTexts {
        crate::mesh::texts_of(crate::api::Mesh::Istio)
    }

    fn running() -> AppSnapshot {
        AppSnapshot {
            live: 1,
            containers: vec![("app".into(), AppContainer::Live { pids: 1 })],
        }
    }

    fn exited() -> AppSnapshot {
        AppSnapshot {
            live: 0,
            containers: vec![("app".into(), AppContainer::Terminated { exit_code: 0 })],
        }
    }

    /// A sample with these byte counters (exposed), nothing buffered or queued, no filter.
    fn sample(total: u64) -> DrainSample {
        DrainSample {
            filter: None,
            traffic: TrafficBytes {
                total,
                counters: 2,
                buffered: 0,
                exposed: true,
            },
            send_queued: None,
            health_check_failed: false,
            listener_counts: None,
        }
    }

    /// The app runs, then exits: its container's end and the app's end are told once each;
    /// samples come at the regular pace while it runs and every round once it is gone; the
    /// drain quits once the counts stood still for the idle window.
    #[test]
    fn a_drain_runs_from_the_app_running_to_the_quit() {
        let s = settings();
        let t0 = Instant::now();
        let mut d = DrainState::new(&s, texts(), false, false, t0, t0);
        assert_eq!(d.round(&running(), None, t0), []);
        assert!(d.sample_due(t0), "the first sample at once");
        assert!(!d.sample_due(t0 + MS), "then at the regular pace");
        assert_eq!(d.sampled(t0, &sample(10)).flushing, None);
        let decision = d.decide(false, &running(), "x");
        assert_eq!(decision.next, DrainNext::Wait, "{decision:?}");
        assert_eq!(d.wait(t0), s.stats_every.min(s.rescan_every));

        let t1 = t0 + MS;
        let steps = d.round(&exited(), Some(t1 - MS), t1);
        assert_eq!(
            steps,
            [
                DrainStep::AppContainerExited {
                    container: "app".into(),
                    exit_code: Some(0)
                },
                DrainStep::AppGone
            ]
        );
        assert_eq!(d.app_gone(), Some(t1 - MS), "dated by the last exit");
        assert_eq!(d.round(&exited(), None, t1), [], "told once");
        assert!(d.sample_due(t1), "every round once the app is gone");
        d.sampled(t1, &sample(10));
        assert_eq!(d.decide(false, &exited(), "x").next, DrainNext::Wait);
        assert_eq!(d.wait(t1), s.settle_poll);

        let t2 = t1 + s.idle_window;
        d.round(&exited(), None, t2);
        assert!(d.sample_due(t2));
        d.sampled(t2, &sample(10));
        let next = d.decide(false, &exited(), "x").next;
        assert!(
            matches!(next, DrainNext::Quit(QuitReason::Idle(_))),
            "{next:?}"
        );
    }

    /// Failed samples while the app runs space the next one out (a refusal is confirmed
    /// soon); once the app is gone they count, and at the allowed attempts the drain says once
    /// that the counts cannot be read and waits for the proxy's own end.
    #[test]
    fn failed_samples_back_off_then_count() {
        let s = settings();
        let t0 = Instant::now();
        let mut d = DrainState::new(&s, texts(), false, false, t0, t0);
        d.round(&running(), None, t0);
        assert!(d.sample_due(t0));
        d.sample_failed(t0, t0, false);
        let spaced = decide::sample_every_after_failures(&s, Duration::ZERO, 1);
        assert!(spaced > s.stats_every);
        assert!(!d.sample_due(t0 + spaced - MS));
        assert!(d.sample_due(t0 + spaced));
        d.sample_failed(t0 + spaced, t0 + spaced, true);
        assert!(
            d.sample_due(t0 + spaced + s.retry_backoff),
            "a refusal: soon"
        );

        let mut t = t0 + Duration::from_secs(1);
        d.round(&exited(), None, t);
        for i in 1..=s.admin_attempts {
            assert!(d.sample_due(t));
            d.sample_failed(t, t, false);
            let decision = d.decide(false, &exited(), "the proxy's own end");
            assert_eq!(decision.next, DrainNext::Wait);
            if i < s.admin_attempts {
                assert_eq!(decision.unreadable, None);
            } else {
                let said = decision.unreadable.expect("said at the allowed attempts");
                assert!(said.contains("the proxy's own end"), "{said}");
            }
            t += MS;
            d.round(&exited(), None, t);
        }
        assert!(d.sample_due(t));
        d.sample_failed(t, t, false);
        assert_eq!(
            d.decide(false, &exited(), "x").unreadable,
            None,
            "said once"
        );
    }

    /// Past the deadline the running app keeps its proxy, and the proxy's exit is the grace
    /// period's end; before it, the proxy's exit with the app still running is an early exit,
    /// unless a second look shows the app gone too.
    #[test]
    fn the_deadline_and_the_proxys_exit_decide() {
        let s = settings();
        let t0 = Instant::now();
        let mut d = DrainState::new(&s, texts(), false, false, t0, t0);
        d.round(&running(), None, t0);
        d.deadline_passed();
        assert_eq!(
            d.decide(false, &running(), "x").next,
            DrainNext::Wait,
            "past the deadline the running app keeps its proxy"
        );
        let DrainNext::End(end) = d.decide(true, &running(), "x").next else {
            panic!("the proxy's exit past the deadline ends the drain");
        };
        assert_eq!(
            end.outcome,
            DrainOutcome::Deadline,
            "the grace period's end"
        );

        let mut d = DrainState::new(&s, texts(), false, false, t0, t0);
        d.round(&running(), None, t0);
        let DrainNext::End(end) = d.decide(true, &running(), "x").next else {
            panic!("the proxy's exit ends the drain");
        };
        assert_eq!(end.outcome, DrainOutcome::ProxyGoneEarly);

        let mut d = DrainState::new(&s, texts(), false, false, t0, t0);
        d.round(&running(), None, t0);
        d.looked_again(&exited(), Some(t0), t0 + MS);
        assert_eq!(d.app_gone(), Some(t0));
        let DrainNext::End(end) = d.decide(true, &exited(), "x").next else {
            panic!("the proxy's exit ends the drain");
        };
        assert_eq!(end.outcome, DrainOutcome::AppDone);
    }

    /// A sample with the filter's counts, `outbound` connections open and none other, and these
    /// byte counters (exposed).
    fn with_filter(outbound: u64, total: u64) -> DrainSample {
        let dir = |active| crate::api::DirectionCounts {
            cx_active: Some(active),
        };
        DrainSample {
            filter: Some(crate::api::FilterCounts {
                inbound: dir(0),
                outbound: dir(outbound),
                unknown: dir(0),
            }),
            ..sample(total)
        }
    }

    /// The real cluster's case: the kubelet counts the grace period from when it sees the
    /// deletion, which may be later than `deletionTimestamp` says, so the app can still be
    /// calling out — and then exit — past the drain's deadline. No quit at the deadline while
    /// it runs with a connection open; its exit then quits the proxy as any other drain's does,
    /// once nothing is in flight. (Was a paused-time test against real processes in
    /// `drain/tests.rs`, `an_app_that_exits_past_the_deadline_still_gets_its_quit`.)
    #[test]
    fn an_app_that_exits_past_the_deadline_still_gets_its_quit() {
        let s = settings();
        let t0 = Instant::now();
        let mut d = DrainState::new(&s, texts(), false, false, t0, t0);
        d.round(&running(), None, t0);
        assert!(d.sample_due(t0));
        d.sampled(t0, &with_filter(1, 10));
        assert_eq!(d.decide(false, &running(), "x").next, DrainNext::Wait);

        // Grace 1 s: the deadline, 900 ms in.
        let deadline = t0 + Duration::from_millis(900);
        d.deadline_passed();
        d.round(&running(), None, deadline);
        assert!(d.sample_due(deadline));
        d.sampled(deadline, &with_filter(1, 10));
        assert_eq!(
            d.decide(false, &running(), "x").next,
            DrainNext::Wait,
            "no quit at the deadline while the app runs"
        );

        // 1.3 s in, its connection closed, the app exits.
        let exit = t0 + Duration::from_millis(1300);
        let steps = d.round(&exited(), Some(exit), exit);
        assert!(steps.contains(&DrainStep::AppGone), "{steps:?}");
        assert!(d.sample_due(exit), "sampled past the deadline too");
        d.sampled(exit, &with_filter(0, 10));
        let next = d.decide(false, &exited(), "x").next;
        assert!(
            matches!(next, DrainNext::Quit(QuitReason::Idle(_))),
            "{next:?}"
        );
    }

    /// The kernel still holds bytes the app wrote: Envoy's counts say idle, yet the quit waits
    /// until the send queues are empty, and the row says why once — only once the app is gone
    /// (while it runs the drain is not waiting on that).
    #[test]
    fn the_kernels_flushing_holds_the_quit_and_is_told_once_after_the_exit() {
        let s = settings();
        let queued = |q| DrainSample {
            send_queued: Some(q),
            ..sample(10)
        };
        let t0 = Instant::now();
        let mut d = DrainState::new(&s, texts(), false, false, t0, t0);
        d.round(&running(), None, t0);
        assert_eq!(d.sampled(t0, &queued(400_000)).flushing, None);
        let t1 = t0 + s.idle_window;
        d.round(&running(), None, t1);
        let ran = d.sampled(t1, &queued(400_000));
        assert_eq!(ran.judgement, Some(InFlight::Sending { bytes: 400_000 }));
        assert_eq!(ran.flushing, None, "not told while the app runs");

        let t2 = t1 + MS;
        d.round(&exited(), None, t2);
        assert_eq!(
            d.sampled(t2, &queued(400_000)).flushing,
            Some(DrainStep::KernelFlushing { bytes: 400_000 })
        );
        assert_eq!(d.decide(false, &exited(), "x").next, DrainNext::Wait);
        let t3 = t2 + s.idle_window;
        d.round(&exited(), None, t3);
        assert_eq!(d.sampled(t3, &queued(1)).flushing, None, "told once");
        assert_eq!(d.decide(false, &exited(), "x").next, DrainNext::Wait);

        let t4 = t3 + MS;
        d.round(&exited(), None, t4);
        d.sampled(t4, &queued(0));
        let next = d.decide(false, &exited(), "x").next;
        assert!(
            matches!(next, DrainNext::Quit(QuitReason::Idle(_))),
            "{next:?}"
        );
    }

    /// Without Envoy's byte counters an open connection after the app's exit holds the drain,
    /// and the advice (said once) is for that drain: a connection the app held open while it
    /// ran, as apps do, must not use it up before the exit. It did: the advice was noticed
    /// while the app ran and dropped there, so the drain it later held went unexplained.
    #[test]
    fn unexposed_bytes_advice_is_kept_for_the_drain_after_the_exit() {
        let s = settings();
        let unexposed = |outbound| {
            let mut sample = with_filter(outbound, 0);
            sample.traffic.exposed = false;
            sample
        };
        for kubelet_ordered in [false, true] {
            let t0 = Instant::now();
            let mut d = DrainState::new(&s, texts(), kubelet_ordered, kubelet_ordered, t0, t0);
            // The app runs with its connection open for three windows: nothing said.
            let mut t = t0;
            for _ in 0..4 {
                d.round(&running(), None, t);
                assert_eq!(d.sampled(t, &unexposed(1)).advice, None);
                t += s.idle_window;
            }
            // It exits; the connection stays open: said once it held the drain a window.
            d.round(&exited(), None, t);
            assert_eq!(d.sampled(t, &unexposed(1)).advice, None, "not at once");
            t += s.idle_window;
            d.round(&exited(), None, t);
            let advice = d.sampled(t, &unexposed(1)).advice;
            if kubelet_ordered {
                // The kubelet ends that proxy: nothing to advise.
                assert_eq!(advice, None);
                continue;
            }
            let advice = advice.expect("the drain the connection held is explained");
            assert!(advice.contains("proxyStatsMatcher"), "{advice}");
            t += MS;
            d.round(&exited(), None, t);
            assert_eq!(d.sampled(t, &unexposed(1)).advice, None, "said once");
        }
    }

    /// A finished Job's wait: samples every `settle_poll`, quits once the counts stood still
    /// for the idle window, or at the bounded wait's end, or when the counts cannot be read;
    /// an Envoy gone is gone.
    #[test]
    fn a_jobs_wait_quits_when_idle_or_out_of_time() {
        let s = settings();
        let t0 = Instant::now();
        let mut w = JobSettle::new(&s, texts(), t0);
        let j = w.sampled(t0, &sample(10)).judgement;
        assert_eq!(w.decide(false, j, t0), decide::JobNext::Wait);
        assert_eq!(w.wait(), s.settle_poll);
        let j = w.sampled(t0 + s.idle_window, &sample(10)).judgement;
        assert!(matches!(
            w.decide(false, j, t0 + s.idle_window),
            decide::JobNext::Quit(QuitReason::Idle(_))
        ));
        assert_eq!(w.decide(true, j, t0), decide::JobNext::ProxyAlreadyGone);

        let mut w = JobSettle::new(&s, texts(), t0);
        let mut bytes = 0;
        let mut t = t0;
        loop {
            bytes += 1;
            let j = w.sampled(t, &sample(bytes)).judgement;
            match w.decide(false, j, t) {
                decide::JobNext::Wait => t += w.wait(),
                next => {
                    assert_eq!(next, decide::JobNext::Quit(QuitReason::OutOfTime));
                    break;
                }
            }
        }
        assert!(t >= t0 + s.job_in_flight_wait);

        let mut w = JobSettle::new(&s, texts(), t0);
        for _ in 1..s.admin_attempts {
            w.sample_failed();
            assert_eq!(w.decide(false, None, t0), decide::JobNext::Wait);
        }
        w.sample_failed();
        assert_eq!(
            w.decide(false, None, t0),
            decide::JobNext::Quit(QuitReason::StatsUnavailable)
        );
    }

    /// An app container running by its status with no process visible is said once, while
    /// the app has not gone; the periodic rescans back off.
    #[test]
    fn an_unseen_app_is_said_once_and_rescans_back_off() {
        let s = settings();
        let t0 = Instant::now();
        let mut d = DrainState::new(&s, texts(), false, false, t0, t0);
        let unseen = AppSnapshot {
            live: 0,
            containers: vec![("app".into(), AppContainer::Unseen)],
        };
        d.round(&unseen, None, t0);
        assert!(d.decide(false, &unseen, "x").unseen.is_some());
        d.round(&unseen, None, t0);
        assert_eq!(d.decide(false, &unseen, "x").unseen, None, "said once");

        assert!(!d.rescan_due(t0));
        let first = t0 + s.rescan_every;
        assert!(d.rescan_due(first));
        d.rescanned(first);
        assert!(!d.rescan_due(first + s.rescan_every));
        assert!(d.rescan_due(first + decide::rescan_every(&s, 1)));
    }
}
