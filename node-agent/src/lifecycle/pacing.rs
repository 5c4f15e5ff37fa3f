//! The pace of one pod's readiness checks, and the node-wide window that bounds the fast ones:
//! the driver asks `Pacing::pace` when a check the machine wants at some moment is made.
//! Moved out of `driver.rs` (issue 40 item 4), unchanged.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::machine::{self, Seen};

/// The node-wide pace of fast readiness checks: with `n` pods between "Envoy starts" and
/// "ready" at once, each is checked every `n × FAST_CHECK_SHARE`, at most every millisecond
/// and at least every [`FAST_SPACING_MAX`]: about 2,000 checks a second on the node in all up
/// to 40 such pods; beyond 40 the spacing stays at 20 ms, so the node total grows again (5,500
/// a second with 110 in the window). One or two pods starting are checked every millisecond;
/// 110 at once every 20 ms each — when that many Envoys start on one node their
/// admin answers take tens to hundreds of milliseconds anyway (the scale benchmark: 40–200 ms
/// p50 at 110 pods), and checking each every 5 ms, as before the window existed, was about
/// half of the agent's CPU during such a burst.
pub(crate) const FAST_CHECK_SHARE: Duration = Duration::from_micros(500);

/// The longest spacing of a pod's checks in the fast window (see [`FAST_CHECK_SHARE`]).
pub(crate) const FAST_SPACING_MAX: Duration = Duration::from_millis(20);

/// How long one pod's fast window may last: an Envoy that is not ready this long after it
/// started (waiting for istiod, a crash loop) is checked at `ready_poll` from then on, so a pod
/// costs at most ~10,000 fast checks per start however long it waits.
pub(crate) const FAST_WINDOW_LIMIT: Duration = Duration::from_secs(10);

/// The longest stretch of fast checks while Envoy's capture ports listen but it is not LIVE
/// (`Seen::Up`): each such check is an admin request, and an Envoy that listens but stays not
/// LIVE for a second is waiting for something (istiod, a crash loop) that milliseconds will not
/// change. Ports to LIVE is 0.0 ms p50 on an idle node (the scale benchmark's observer).
pub(crate) const UP_FAST_LIMIT: Duration = Duration::from_secs(1);

/// Once the fast window is over (or the proxy has not started for [`FAST_WINDOW_LIMIT`]), a
/// holding pod's checks back off: doubling from `ready_poll` up to this. An Envoy that is not
/// ready after ten seconds is then checked once a second: ~0.1 ms of the agent's CPU a second
/// per such pod (one `sock_diag` lookup, or one capped admin request), instead of 200 checks a
/// second for as long as the pod holds (up to `--max-hold-timeout`). A pod whose proxy starts
/// running by its status is checked at once again (see `Driver::follow_view`).
pub(crate) const READY_POLL_MAX: Duration = Duration::from_secs(1);

/// The next spacing of a backed-off pod's checks: `ready_poll` first, then doubling, at most
/// [`READY_POLL_MAX`] (or `ready_poll` when that is longer).
pub(crate) fn backed_off(previous: Option<Duration>, ready_poll: Duration) -> Duration {
    crate::backoff::Backoff::doubling(ready_poll, READY_POLL_MAX).next(previous)
}

/// The spacing of one pod's fast checks with `in_window` pods (itself included) in the window.
pub(crate) fn fast_check_spacing(in_window: u32) -> Duration {
    (FAST_CHECK_SHARE * in_window).min(FAST_SPACING_MAX)
}

/// Counts the pods in their fast readiness window; a pod is counted while it holds a
/// [`FastSlot`].
#[derive(Debug, Clone, Default)]
pub(crate) struct FastWindow(Arc<AtomicU32>);

impl FastWindow {
    pub(crate) fn enter(&self) -> FastSlot {
        self.0.fetch_add(1, Ordering::Relaxed);
        FastSlot(self.0.clone())
    }

    pub(crate) fn pods(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
}

/// One pod's place in the [`FastWindow`], given back on drop.
#[derive(Debug)]
pub(crate) struct FastSlot(Arc<AtomicU32>);

impl Drop for FastSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One pod's readiness-check pacing: where it is in the fast window and the back-off.
#[derive(Debug, Default)]
pub(crate) struct Pacing {
    /// Held while the machine asks for fast readiness checks (see [`FAST_CHECK_SHARE`]).
    fast_slot: Option<FastSlot>,
    /// Since when the machine has asked for fast checks (see [`FAST_WINDOW_LIMIT`]).
    fast_since: Option<Instant>,
    /// Since when the pod's proxy is being checked (the hold's first check, or the proxy
    /// container seen starting), for the backoff ([`READY_POLL_MAX`]).
    checking_since: Option<Instant>,
    /// Since when checks see Envoy up but not LIVE ([`UP_FAST_LIMIT`]).
    up_since: Option<Instant>,
    /// The current backed-off spacing of checks.
    backoff: Option<Duration>,
}

impl Pacing {
    /// Forgets the pacing of readiness checks (the machine stopped checking, or the proxy
    /// container started: a new stretch of checks begins).
    pub(crate) fn reset(&mut self) {
        *self = Pacing::default();
    }

    /// Whether the pod's proxy is being checked (a stretch of checks has begun).
    pub(crate) fn checking(&self) -> bool {
        self.checking_since.is_some()
    }

    /// A check saw `seen` at `now`: Envoy up but not LIVE starts (or keeps) its clock.
    pub(crate) fn seen(&mut self, seen: Seen, now: Instant) {
        if matches!(seen, Seen::Up | Seen::Live) {
            self.up_since.get_or_insert(now);
        } else {
            self.up_since = None;
        }
    }

    /// When a readiness check the machine wants at `at` is made (`now`; `ready_poll`: the
    /// machine's poll; `window`: the node's fast window):
    /// - fast (the machine asks within `LIVE_WINDOW_POLL`: Envoy starting): the pod enters the
    ///   node's fast window and the check is spaced by how many pods are in it, for at most
    ///   [`FAST_WINDOW_LIMIT`] (and [`UP_FAST_LIMIT`] of Envoy up but not LIVE);
    /// - otherwise at the machine's `ready_poll` for the first [`FAST_WINDOW_LIMIT`] of checks;
    /// - after either, backing off (doubling from `ready_poll`) to [`READY_POLL_MAX`].
    pub(crate) fn pace(
        &mut self,
        at: Instant,
        now: Instant,
        ready_poll: Duration,
        window: &FastWindow,
    ) -> Instant {
        let since = *self.checking_since.get_or_insert(now);
        let asked_fast = at.saturating_duration_since(now) <= machine::LIVE_WINDOW_POLL;
        if asked_fast {
            let fast_since = *self.fast_since.get_or_insert(now);
            let up_too_long = self
                .up_since
                .is_some_and(|t| now.saturating_duration_since(t) >= UP_FAST_LIMIT);
            if now.saturating_duration_since(fast_since) < FAST_WINDOW_LIMIT && !up_too_long {
                self.backoff = None;
                self.fast_slot.get_or_insert_with(|| window.enter());
                return at.max(now + fast_check_spacing(window.pods()));
            }
        } else {
            self.fast_since = None;
            if now.saturating_duration_since(since) < FAST_WINDOW_LIMIT {
                self.fast_slot = None;
                return at;
            }
        }
        self.fast_slot = None;
        let spacing = backed_off(self.backoff, ready_poll);
        self.backoff = Some(spacing);
        at.max(now + spacing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After the fast window a never-ready Envoy is checked ever less often, down to once a
    /// second: 5, 10, 20 ... 640 ms, then 1 s for as long as the hold lasts — at most ~600
    /// checks over a 10-minute hold instead of 120,000 at `ready_poll`.
    #[test]
    fn checks_back_off_to_once_a_second() {
        let poll = Duration::from_millis(5);
        let mut spacing = None;
        let mut seen = Vec::new();
        for _ in 0..12 {
            let s = backed_off(spacing, poll);
            seen.push(s.as_millis());
            spacing = Some(s);
        }
        assert_eq!(
            seen,
            [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000, 1000]
        );
        // A ready_poll above the ceiling is kept as asked.
        assert_eq!(
            backed_off(None, Duration::from_secs(2)),
            Duration::from_secs(2)
        );
        assert_eq!(
            backed_off(Some(Duration::from_secs(2)), Duration::from_secs(2)),
            Duration::from_secs(2)
        );
        // Over a 10-minute hold: the checks after the 10 s window.
        let (mut t, mut n, mut s) = (Duration::ZERO, 0, None);
        while t < Duration::from_secs(590) {
            let next = backed_off(s, poll);
            t += next;
            n += 1;
            s = Some(next);
        }
        assert!(n < 600, "{n} checks");
    }

    #[test]
    fn fast_checks_are_paced_node_wide() {
        // Alone or with another: every millisecond (the machine asks for no less).
        assert_eq!(fast_check_spacing(1), Duration::from_micros(500));
        assert_eq!(fast_check_spacing(2), Duration::from_millis(1));
        // More at once: ~2,000 checks a second on the node in all, up to 40 pods...
        assert_eq!(fast_check_spacing(10), Duration::from_millis(5));
        assert_eq!(fast_check_spacing(40), FAST_SPACING_MAX);
        // ... then a spacing of 20 ms per pod (110 pods: 5,500 checks a second).
        assert_eq!(fast_check_spacing(110), FAST_SPACING_MAX);

        let window = FastWindow::default();
        let a = window.enter();
        let b = window.enter();
        assert_eq!(window.pods(), 2);
        drop(a);
        assert_eq!(window.pods(), 1);
        drop(b);
        assert_eq!(window.pods(), 0);
    }
}
