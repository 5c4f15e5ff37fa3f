//! The drain's and the Job quit's decisions, as pure functions of what was observed: the
//! executors in this module gather observations (processes, the filter's counts, admin
//! refusals) and act; *what* they do next is decided here, so each rule is a table row.

use crate::api::{FinishedBy, QuitReason};
use crate::pod::PodView;

use super::app_exit::AppSnapshot;
use super::in_flight::InFlight;

/// What a drain does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainNext {
    /// Keep watching.
    Wait,
    /// The app is done and nothing is in flight (or that cannot be known): quit the proxy.
    Quit(QuitReason),
    /// Envoy exited by itself with the app (or with no app process visible): the drain is
    /// done (outcome `app-done`); `app_unknown` when the app's end was not seen.
    ProxyExited { app_unknown: bool },
    /// Envoy exited while app processes still ran: the mesh's drain duration is too short.
    ProxyGoneEarly,
}

/// What was observed at one point of a drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainSeen {
    /// The app ran and is gone ([`AppSnapshot::gone_for_drain`]).
    pub app_gone: bool,
    /// App processes alive.
    pub app_live: usize,
    /// Enough consecutive refused admin connections: Envoy has exited.
    pub proxy_gone: bool,
    /// The latest in-flight judgement (`None`: the last sample failed).
    pub judgement: Option<InFlight>,
    /// Failed samples since the app went reached the allowed attempts.
    pub stats_exhausted: bool,
}

pub fn drain_next(seen: DrainSeen) -> DrainNext {
    if seen.proxy_gone {
        return if seen.app_gone || seen.app_live == 0 {
            DrainNext::ProxyExited {
                app_unknown: !seen.app_gone,
            }
        } else {
            DrainNext::ProxyGoneEarly
        };
    }
    if !seen.app_gone {
        return DrainNext::Wait;
    }
    match seen.judgement {
        Some(InFlight::Idle(why)) => DrainNext::Quit(QuitReason::Idle(why)),
        Some(InFlight::NoFilter) => DrainNext::Quit(QuitReason::NoFilter),
        Some(InFlight::Busy { .. }) => DrainNext::Wait,
        None if seen.stats_exhausted => DrainNext::Quit(QuitReason::StatsUnavailable),
        None => DrainNext::Wait,
    }
}

/// Whether a Job's app finished for good, and by which signal. The kubelet's statuses say so
/// with exit codes (`Never`, or `OnFailure` with 0); procfs is faster but only says "exited",
/// which is enough only when the kubelet never restarts (`Never`). Either way every app
/// container must have run: a container still waiting is never finished.
pub fn job_finished(view: &PodView, snapshot: &AppSnapshot) -> Option<FinishedBy> {
    if view.apps_finished_for_good() {
        Some(FinishedBy::Status)
    } else if view.restart_policy == "Never" && snapshot.all_exited() {
        Some(FinishedBy::Procfs)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::IdleReason;

    #[test]
    fn drain_decisions() {
        let idle = Some(InFlight::Idle(IdleReason::NoOutboundConnections));
        let busy = Some(InFlight::Busy {
            outbound_active: Some(1),
        });
        let seen = |app_gone, app_live, proxy_gone, judgement, stats_exhausted| DrainSeen {
            app_gone,
            app_live,
            proxy_gone,
            judgement,
            stats_exhausted,
        };
        for (s, want) in [
            // The app runs: wait, whatever the counts say.
            (seen(false, 1, false, idle, false), DrainNext::Wait),
            // An app that never ran has 0 live processes but is not gone: wait.
            (seen(false, 0, false, idle, true), DrainNext::Wait),
            (
                seen(true, 0, false, idle, false),
                DrainNext::Quit(QuitReason::Idle(IdleReason::NoOutboundConnections)),
            ),
            (seen(true, 0, false, busy, false), DrainNext::Wait),
            (
                seen(true, 0, false, Some(InFlight::NoFilter), false),
                DrainNext::Quit(QuitReason::NoFilter),
            ),
            (seen(true, 0, false, None, false), DrainNext::Wait),
            (
                seen(true, 0, false, None, true),
                DrainNext::Quit(QuitReason::StatsUnavailable),
            ),
            (
                seen(true, 0, true, None, false),
                DrainNext::ProxyExited { app_unknown: false },
            ),
            (
                seen(false, 0, true, None, false),
                DrainNext::ProxyExited { app_unknown: true },
            ),
            (seen(false, 2, true, busy, false), DrainNext::ProxyGoneEarly),
        ] {
            assert_eq!(drain_next(s), want, "{s:?}");
        }
    }
}
