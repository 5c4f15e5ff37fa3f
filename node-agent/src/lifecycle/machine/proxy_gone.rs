//! The pace of re-checks after the proxy was seen going (`Input::ProxyGone`): one at once, then
//! spaced by a back-off, and at most [`PROXY_GONE_BUDGET`] in [`PROXY_GONE_WINDOW`] per pod; a
//! pod past its budget is failed open and left alone, as a broken bound is (issue 29).
//!
//! Why: each re-check is a readiness look and a leftover-rule removal (two `iptables -S` and
//! a restore) in the pod's netns, and what makes the proxy "go" is the pod's: its own
//! pilot-agent may fork children that exit (only the proxy's own processes are watched, see
//! `effects::procfs::proxy_procs`, so exec sessions and probes do not count). A real OOM-kill
//! of a ready Envoy is re-checked at once as before; the kubelet restarts a crash-looping
//! container at 10 s doubling to 5 min (`MaxContainerBackOff`, pkg/kubelet/kubelet.go), so an
//! honest proxy never comes near the budget's pace.

use super::*;

/// The spacing kept after a re-check when the next proxy-gone comes: doubles from this.
pub(crate) const PROXY_GONE_SPACING_MIN: Duration = Duration::from_secs(1);
/// The longest spacing (the kubelet's own longest restart back-off, `MaxContainerBackOff`).
pub(crate) const PROXY_GONE_SPACING_MAX: Duration = Duration::from_secs(300);
/// After this long without a proxy-gone the spacing starts over at the minimum, as the
/// kubelet's restart back-off does (client-go `util/flowcontrol/backoff.go`: an entry not
/// updated for `2 * maxDuration` has expired; 2 × 5 min).
pub(crate) const PROXY_GONE_QUIET: Duration = Duration::from_secs(600);
/// Re-checks a pod may cause in one [`PROXY_GONE_WINDOW`]; the next fails it open.
pub(crate) const PROXY_GONE_BUDGET: u32 = 10;
/// The budget's window, from its first re-check.
pub(crate) const PROXY_GONE_WINDOW: Duration = Duration::from_secs(3600);

/// One pod's record of proxy-gone re-checks (part of the machine's [`State`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyGonePace {
    /// The last re-check, and the spacing the next one keeps from it.
    last: Option<Instant>,
    spacing: Duration,
    /// The budget's window: when it began, and the re-checks in it.
    window_start: Option<Instant>,
    in_window: u32,
    /// A proxy-gone came within the spacing: its re-check waits for `Timer::ProxyRecheck`, and
    /// the proxy is not watched meanwhile (its next exits would only repeat the news).
    pub(crate) deferred: bool,
}

/// What to do with a proxy-gone now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pace {
    /// Re-check now (counted).
    Now,
    /// Re-check at this moment, not before.
    At(Instant),
    /// The budget is spent: fail the pod open (the reason).
    OverBudget(String),
}

impl ProxyGonePace {
    /// Whether a re-check may be made `now`, counting it if so.
    pub(crate) fn take(&mut self, now: Instant) -> Pace {
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) >= PROXY_GONE_QUIET)
        {
            self.last = None;
        }
        if let Some(last) = self.last {
            let at = last + self.spacing;
            if now < at {
                return Pace::At(at);
            }
        }
        if self
            .window_start
            .is_none_or(|t| now.saturating_duration_since(t) >= PROXY_GONE_WINDOW)
        {
            self.window_start = Some(now);
            self.in_window = 0;
        }
        if self.in_window >= PROXY_GONE_BUDGET {
            return Pace::OverBudget(format!(
                "the proxy was seen going {} times within {} (at most {PROXY_GONE_BUDGET} \
                 re-checks per {}): the pod's proxy processes keep exiting; left alone, as \
                 without holdfast",
                self.in_window + 1,
                crate::config::format_duration(
                    self.window_start
                        .map_or(Duration::ZERO, |t| now.saturating_duration_since(t))
                ),
                crate::config::format_duration(PROXY_GONE_WINDOW),
            ));
        }
        self.in_window += 1;
        self.spacing =
            crate::backoff::Backoff::doubling(PROXY_GONE_SPACING_MIN, PROXY_GONE_SPACING_MAX)
                .next(self.last.map(|_| self.spacing));
        self.last = Some(now);
        Pace::Now
    }
}

/// A proxy-gone (or its deferred re-check) while `Running`: re-check at once, later, or fail
/// the pod open past its budget.
pub(super) fn proxy_gone(
    s: &mut State,
    fx: &mut Vec<Effect>,
    now: Now,
    netns: NetnsId,
    proxy_id: Option<String>,
    p: &PodFacts,
) -> Stage {
    match s.proxy_gone.take(now.mono) {
        Pace::At(at) => {
            if !s.proxy_gone.deferred {
                s.proxy_gone.deferred = true;
                fx.push(Effect::Schedule(Timer::ProxyRecheck, at));
            }
            Stage::Running { netns, proxy_id }
        }
        Pace::OverBudget(why) => {
            s.left_alone = true;
            fx.push(Effect::Record(Outcome::FailedOpen { why }));
            Stage::Finished
        }
        Pace::Now => {
            if p.native() {
                fx.push(Effect::Problem(
                    "the native sidecar's proxy exited while the app runs: the kubelet \
                     restarts it, at once after a first crash and after its CrashLoopBackOff \
                     back-off (10 s, doubling to 5 min) after the next ones, and marks the pod \
                     not Ready meanwhile; the app's new connections are held until the \
                     restarted Envoy is ready (at most the hold deadline)"
                        .to_string(),
                ));
            }
            proxy_starts_over(
                s,
                fx,
                StepKind::ProxyGone,
                "a process of the ready proxy exited while the app runs",
            );
            s.fresh = Some(false);
            fx.push(Effect::CheckReadiness);
            Stage::Checking {
                netns,
                fresh: false,
                rehold: true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first proxy-gone is re-checked at once; the next ones keep a doubling spacing from
    /// 1 s to 5 min; a quiet 10 minutes starts the spacing over; past ten re-checks in an hour
    /// the pod is over its budget; a new hour gives a new budget.
    #[test]
    fn rechecks_back_off_and_are_budgeted() {
        let t0 = Instant::now();
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let mut pace = ProxyGonePace::default();
        assert_eq!(pace.take(t0), Pace::Now);
        // 100 ms later (a child forked and exited): 1 s after the first.
        assert_eq!(pace.take(t0 + Duration::from_millis(100)), Pace::At(s(1)));
        assert_eq!(pace.take(s(1)), Pace::Now);
        assert_eq!(pace.take(s(2)), Pace::At(s(3)), "then 2 s");
        assert_eq!(pace.take(s(3)), Pace::Now);
        assert_eq!(pace.take(s(4)), Pace::At(s(7)), "then 4 s");

        // As fast as it is allowed: the spacings double to 5 min, and the 11th re-check within
        // the hour is over the budget.
        let mut pace = ProxyGonePace::default();
        let mut t = t0;
        let mut times = Vec::new();
        loop {
            match pace.take(t) {
                Pace::Now => times.push(t.duration_since(t0).as_secs()),
                Pace::At(at) => t = at,
                Pace::OverBudget(why) => {
                    assert!(why.contains("11 times"), "{why}");
                    break;
                }
            }
        }
        assert_eq!(times, [0, 1, 3, 7, 15, 31, 63, 127, 255, 511]);
        assert_eq!(t.duration_since(t0).as_secs(), 811, "300 s after the tenth");

        // A quiet 10 minutes: at once again, spacing from 1 s.
        let mut pace = ProxyGonePace::default();
        for at in [0, 1, 3] {
            assert_eq!(pace.take(s(at)), Pace::Now);
        }
        assert_eq!(pace.take(s(603)), Pace::Now);
        assert_eq!(pace.take(s(603)), Pace::At(s(604)));

        // Ten re-checks spread over more than an hour never reach the budget.
        let mut pace = ProxyGonePace::default();
        for i in 0..30 {
            assert_eq!(pace.take(s(i * 700)), Pace::Now, "re-check {i}");
        }
    }
}
