//! When a drain must end: the pure deadline arithmetic, unit-tested without a clock.
//!
//! The kubelet SIGKILLs a deleted pod's containers when its grace period runs out. The drain
//! must quit Envoy a little before that (a *margin*), so the pod ends cleanly rather than by
//! SIGKILL, even when the app never exits.
//!
//! # When does the kubelet kill?
//!
//! Two conventions for `metadata.deletionTimestamp` meet here:
//!
//! - **Kubernetes API server**: on a graceful delete it sets `deletionTimestamp` to *request time
//!   plus the grace period* (and `deletionGracePeriodSeconds` to the grace). The kubelet starts
//!   its grace timer when it sees the deletion, a moment after the request, so it kills at about
//!   `deletionTimestamp`. Seen by a prompt watcher, the timestamp lies about one grace period in
//!   the **future**.
//! - **Request-time writers** (hand-written pod files, simple simulators): `deletionTimestamp` is
//!   the moment of the delete request, so the kill comes at `deletionTimestamp + grace`. Seen by a
//!   prompt watcher, the timestamp is **now or in the past**.
//!
//! `DrainPlan` tells them apart by that: a timestamp still in the future when the deletion is
//! first observed is the kill time itself; one that is not is the request time.
//!
//! The API server writes `deletionTimestamp` in whole seconds (`metav1.Time` is RFC 3339
//! without a fraction), rounded down: the kill comes up to a second after it. Taken as is, that
//! second would be cut from the app's shutdown. So a whole-second kill time is refined with the
//! moment the deletion was observed: `observed + grace`, kept within `[stamp, stamp + 1 s)`. A
//! prompt watcher sees the deletion about when the kubelet does, so that is close to the
//! kubelet's own timer; a late one is held to the second the stamp allows. The
//! misjudgements this leaves are on the safe side: a node clock more than a grace period ahead of
//! the API server, or an agent that first sees the deletion only after the kill time passed, read
//! the timestamp as a request time and put the deadline later — the kubelet's SIGKILL then
//! comes first, as it would without the agent.

use std::time::{Duration, SystemTime};

use k8s_openapi::jiff::Timestamp;

pub use crate::api::TimestampMeaning;
use crate::pod::Deletion;

/// Longest margin kept before the kill.
pub(crate) const MAX_MARGIN: Duration = Duration::from_secs(1);
/// Share of the grace period kept as margin when that is less than [`MAX_MARGIN`].
const MARGIN_DIVISOR: u32 = 10;
/// Remaining times are capped here, so a huge grace period cannot overflow a timer (a year is
/// forever for a drain).
pub(crate) const MAX_REMAINING: Duration = Duration::from_secs(365 * 24 * 3600);

/// The deadline of one pod's drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DrainPlan {
    /// When the kubelet is expected to SIGKILL the pod's containers (`None`: beyond what
    /// `SystemTime` can represent, i.e. never in practice).
    pub(crate) kill_at: Option<SystemTime>,
    /// Kept between the drain's deadline and the kill.
    pub(crate) margin: Duration,
    /// The drain's deadline: `kill_at - margin`.
    pub(crate) deadline: Option<SystemTime>,
    /// How the timestamp was read.
    pub(crate) meaning: TimestampMeaning,
}

impl DrainPlan {
    /// Plans the drain of a pod whose deletion was first observed at `observed`.
    pub(crate) fn new(deletion: Deletion, observed: SystemTime) -> DrainPlan {
        let stamp = system_time(deletion.timestamp);
        let (meaning, kill_at) = if stamp > observed {
            (
                TimestampMeaning::KillTime,
                Some(refine_whole_second(stamp, deletion, observed)),
            )
        } else {
            (
                TimestampMeaning::RequestTime,
                stamp.checked_add(deletion.grace),
            )
        };
        let margin = margin_for(deletion.grace);
        // `kill_at - margin` cannot underflow for any real date; if it did, the deadline is "at once".
        let deadline = kill_at.map(|k| k.checked_sub(margin).unwrap_or(SystemTime::UNIX_EPOCH));
        DrainPlan {
            kill_at,
            margin,
            deadline,
            meaning,
        }
    }

    /// The plan of `deletion`, observed at `observed`, when it moves the deadline earlier than
    /// this plan's: a `kubectl delete --grace-period=5` after a longer one. The API server only
    /// ever shortens a pending deletion's grace period, moving `deletionTimestamp` back by the
    /// difference (kubernetes/kubernetes
    /// staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go `BeforeDelete`: "only a shorter
    /// grace period may be provided by a user"; the new timestamp is the old minus the old
    /// `deletionGracePeriodSeconds` plus the new), and the kubelet then kills sooner. `None`:
    /// the same deadline or a later one (never followed: the kubelet does not wait longer).
    pub(crate) fn shortened(&self, deletion: Deletion, observed: SystemTime) -> Option<DrainPlan> {
        let next = DrainPlan::new(deletion, observed);
        match (self.deadline, next.deadline) {
            (None, Some(_)) => Some(next),
            (Some(now), Some(then)) if then < now => Some(next),
            _ => None,
        }
    }

    /// Time left until the deadline at `now`: zero once it passed, at most [`MAX_REMAINING`].
    pub(crate) fn remaining(&self, now: SystemTime) -> Duration {
        match self.deadline {
            None => MAX_REMAINING,
            Some(d) => d
                .duration_since(now)
                .unwrap_or(Duration::ZERO)
                .min(MAX_REMAINING),
        }
    }
}

/// The kill time of a whole-second, future `deletionTimestamp` (see the module docs): the API
/// server rounded `request + grace` down to the second, so the kill lies in
/// `[stamp, stamp + 1 s)`; within that, `observed + grace` says where.
fn refine_whole_second(stamp: SystemTime, deletion: Deletion, observed: SystemTime) -> SystemTime {
    if deletion.timestamp.subsec_nanosecond() != 0 {
        // A precise stamp (not the API server's rounding): take it as it is.
        return stamp;
    }
    let Some(estimate) = observed.checked_add(deletion.grace) else {
        return stamp;
    };
    // Just short of the next second: a stamp of 10:00:05 means a kill before 10:00:06.
    let latest = stamp
        .checked_add(Duration::from_secs(1) - Duration::from_millis(1))
        .unwrap_or(stamp);
    estimate.clamp(stamp, latest)
}

/// A jiff timestamp as a `SystemTime` (jiff's own conversion; jiff's range, years
/// -9999..=9999, fits `SystemTime` on Linux).
pub(crate) fn system_time(ts: Timestamp) -> SystemTime {
    SystemTime::from(ts)
}

/// A `SystemTime` as a jiff timestamp (jiff's own conversion), saturating at jiff's range.
pub fn timestamp(t: SystemTime) -> Timestamp {
    Timestamp::try_from(t).unwrap_or(if t < SystemTime::UNIX_EPOCH {
        Timestamp::MIN
    } else {
        Timestamp::MAX
    })
}

/// The margin for a grace period: 10 % of it, at most [`MAX_MARGIN`]. Zero grace, zero margin.
pub(crate) fn margin_for(grace: Duration) -> Duration {
    (grace / MARGIN_DIVISOR).min(MAX_MARGIN)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_shortened_grace_period_moves_the_deadline_earlier() {
        use super::*;
        // Deleted at 10:00:00 with 30 s (stamp 10:00:30, seen at once); then
        // `kubectl delete --grace-period=5` at 10:00:02: the API server moves the stamp to
        // 10:00:30 - 30 s + 5 s = 10:00:05 and the grace to 5 s.
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let first = Deletion {
            timestamp: timestamp(t0 + Duration::from_secs(30)),
            grace: Duration::from_secs(30),
        };
        let plan = DrainPlan::new(first, t0);
        let shorter = Deletion {
            timestamp: timestamp(t0 + Duration::from_secs(5)),
            grace: Duration::from_secs(5),
        };
        let next = plan
            .shortened(shorter, t0 + Duration::from_secs(2))
            .expect("followed");
        assert_eq!(next.meaning, TimestampMeaning::KillTime);
        let deadline = next.deadline.expect("deadline");
        assert!(
            // The whole-second stamp says the kill is in [10:00:05, 10:00:06); minus the margin.
            deadline < t0 + Duration::from_secs(6) && deadline >= t0 + Duration::from_secs(4),
            "{deadline:?}"
        );
        // The same deletion seen again, or a longer grace (the API server refuses it): kept.
        assert_eq!(plan.shortened(first, t0 + Duration::from_secs(3)), None);
        let longer = Deletion {
            timestamp: timestamp(t0 + Duration::from_secs(60)),
            grace: Duration::from_secs(60),
        };
        assert_eq!(plan.shortened(longer, t0 + Duration::from_secs(3)), None);
    }

    use super::*;

    fn at(secs: i64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).expect("positive"))
    }

    fn deletion(stamp_secs: i64, grace_secs: u64) -> Deletion {
        Deletion {
            timestamp: Timestamp::from_second(stamp_secs).expect("valid timestamp"),
            grace: Duration::from_secs(grace_secs),
        }
    }

    const T0: i64 = 1_800_000_000;

    #[test]
    fn margin_is_ten_percent_capped_at_one_second() {
        assert_eq!(margin_for(Duration::ZERO), Duration::ZERO);
        assert_eq!(
            margin_for(Duration::from_secs(2)),
            Duration::from_millis(200)
        );
        assert_eq!(margin_for(Duration::from_secs(10)), Duration::from_secs(1));
        assert_eq!(margin_for(Duration::from_secs(30)), Duration::from_secs(1));
        assert_eq!(margin_for(Duration::MAX), Duration::from_secs(1));
    }

    #[test]
    fn request_time_stamp_adds_the_grace_period() {
        // Observed 100 ms after a request-time stamp: kill at stamp + 30 s, deadline 1 s before.
        let observed = at(T0) + Duration::from_millis(100);
        let plan = DrainPlan::new(deletion(T0, 30), observed);
        assert_eq!(plan.meaning, TimestampMeaning::RequestTime);
        assert_eq!(plan.kill_at, Some(at(T0 + 30)));
        assert_eq!(plan.deadline, Some(at(T0 + 29)));
        assert_eq!(plan.remaining(observed), Duration::from_millis(28_900));
    }

    #[test]
    fn future_stamp_is_the_kill_time() {
        // API-server convention: the stamp is request + grace and lies in the future. Request
        // at T0 + 0.0: the stamp is exact, observed 50 ms later the estimate is T0 + 30.05.
        let observed = at(T0) + Duration::from_millis(50);
        let plan = DrainPlan::new(deletion(T0 + 30, 30), observed);
        assert_eq!(plan.meaning, TimestampMeaning::KillTime);
        assert_eq!(plan.kill_at, Some(at(T0 + 30) + Duration::from_millis(50)));
        assert_eq!(plan.deadline, Some(at(T0 + 29) + Duration::from_millis(50)));
        assert_eq!(plan.remaining(observed), Duration::from_millis(29_000));
    }

    #[test]
    fn whole_second_stamp_is_refined_by_the_observation() {
        // Request at T0 + 0.7 s: the API server writes T0 + 30 (rounded down); the kubelet
        // kills at about T0 + 30.7. Observed 20 ms after the request.
        let observed = at(T0) + Duration::from_millis(720);
        let plan = DrainPlan::new(deletion(T0 + 30, 30), observed);
        assert_eq!(plan.kill_at, Some(at(T0 + 30) + Duration::from_millis(720)));
        assert_eq!(plan.remaining(observed), Duration::from_secs(29));
        // An agent that sees it late is held to the second the stamp allows.
        let late = at(T0) + Duration::from_millis(2_500);
        let plan = DrainPlan::new(deletion(T0 + 30, 30), late);
        assert_eq!(plan.kill_at, Some(at(T0 + 30) + Duration::from_millis(999)));
        // And an estimate before the stamp (a clock behind) is raised to it.
        let early = DrainPlan::new(deletion(T0 + 30, 10), at(T0));
        assert_eq!(early.kill_at, Some(at(T0 + 30)));
    }

    #[test]
    fn precise_future_stamp_is_taken_as_is() {
        let stamp = Timestamp::from_nanosecond(i128::from(T0 + 30) * 1_000_000_000 + 250_000_000)
            .expect("valid");
        let d = Deletion {
            timestamp: stamp,
            grace: Duration::from_secs(30),
        };
        let plan = DrainPlan::new(d, at(T0) + Duration::from_millis(900));
        assert_eq!(plan.kill_at, Some(at(T0 + 30) + Duration::from_millis(250)));
    }

    #[test]
    fn short_grace_keeps_a_tenth() {
        let plan = DrainPlan::new(deletion(T0, 2), at(T0));
        assert_eq!(plan.margin, Duration::from_millis(200));
        assert_eq!(plan.remaining(at(T0)), Duration::from_millis(1_800));
    }

    #[test]
    fn zero_grace_means_at_once() {
        let plan = DrainPlan::new(deletion(T0, 0), at(T0));
        assert_eq!(plan.margin, Duration::ZERO);
        assert_eq!(plan.deadline, Some(at(T0)));
        assert_eq!(plan.remaining(at(T0)), Duration::ZERO);
    }

    #[test]
    fn past_deadline_leaves_nothing() {
        // An agent that restarts mid-drain: the deadline has passed; never a negative duration.
        let plan = DrainPlan::new(deletion(T0, 5), at(T0 + 60));
        assert_eq!(plan.remaining(at(T0 + 60)), Duration::ZERO);
        // Deadline at T0 + 5 s - 500 ms.
        assert_eq!(plan.remaining(at(T0 + 5)), Duration::ZERO);
        assert_eq!(plan.remaining(at(T0 + 4)), Duration::from_millis(500));
    }

    #[test]
    fn huge_grace_does_not_overflow() {
        let plan = DrainPlan::new(deletion(T0, u64::MAX), at(T0));
        assert_eq!(plan.kill_at, None);
        assert_eq!(plan.deadline, None);
        assert_eq!(plan.remaining(at(T0)), MAX_REMAINING);
        // Large but representable: capped.
        let plan = DrainPlan::new(deletion(T0, 10 * 365 * 24 * 3600), at(T0));
        assert!(plan.kill_at.is_some());
        assert_eq!(plan.remaining(at(T0)), MAX_REMAINING);
    }

    #[test]
    fn timestamp_conversions_round_trip() {
        for t in [
            at(T0),
            at(T0) + Duration::from_nanos(123_456_789),
            SystemTime::UNIX_EPOCH,
        ] {
            assert_eq!(system_time(timestamp(t)), t);
        }
        let before = SystemTime::UNIX_EPOCH - Duration::from_millis(1500);
        assert_eq!(system_time(timestamp(before)), before);
        let ts: Timestamp = "2026-11-22T10:00:00.25Z".parse().expect("valid");
        assert_eq!(
            system_time(ts)
                .duration_since(SystemTime::UNIX_EPOCH)
                .expect("after epoch"),
            Duration::from_millis(1_795_341_600_250)
        );
    }

    #[test]
    fn stamp_before_the_epoch_is_handled() {
        let plan = DrainPlan::new(deletion(-10, 0), at(T0));
        assert_eq!(plan.meaning, TimestampMeaning::RequestTime);
        assert_eq!(plan.remaining(at(T0)), Duration::ZERO);
    }
}
