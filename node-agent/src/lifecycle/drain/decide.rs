//! The drain's and the Job quit's decisions, as pure functions of what was observed: the
//! executors (`deletion.rs`, `job.rs`) gather observations (processes, the filter's counts and
//! Envoy's byte counters, admin refusals, the clock) and act; *what* they do next is decided
//! here, so each rule is a table row. Both share the rule for "the app is done: may the proxy
//! go?" ([`quit_when_idle`]) and the pace of their samples ([`settle_wait`]); when the app is
//! done at all is [`crate::pod::app_end()`].

use std::time::Duration;

use crate::api::{DrainOutcome, FinishedBy, QuitReason};
use crate::backoff::Backoff;
use crate::config::DrainSettings;
use crate::pod::{AppEnd, PodView};

use super::app_exit::AppSnapshot;
use super::in_flight::InFlight;

/// Once the app is done, whether what is in flight lets the proxy go, and why: nothing in flight
/// in either direction (by the filter's counts or Envoy's byte counters, [`InFlight::Idle`]), or
/// the counts cannot be read (`stats_exhausted`: as many failed samples as allowed attempts).
/// `None`: keep waiting — also when nothing can be seen ([`InFlight::Unseen`]: no filter and no
/// byte counters), since a response may still be on its way out; pilot-agent's own drain then
/// ends Envoy, as without holdfast.
pub(crate) fn quit_when_idle(
    judgement: Option<InFlight>,
    stats_exhausted: bool,
) -> Option<QuitReason> {
    match judgement {
        Some(InFlight::Idle(why)) => Some(QuitReason::Idle(why)),
        Some(InFlight::Unseen | InFlight::Busy { .. } | InFlight::Sending { .. }) => None,
        None if stats_exhausted => Some(QuitReason::StatsUnavailable),
        None => None,
    }
}

/// How a pod's drain goes: the full drain (drain inbound at once, quit Envoy when the app is
/// done and nothing is in flight), or, for a native sidecar with Istio's preStop drain, the
/// kubelet's own order — pilot-agent drained at the deletion and exits at its SIGTERM, which
/// the kubelet sends once every regular container has exited, ~50 ms after the app — where
/// holdfast only measures and reports (and says so loudly if the proxy goes first). A native
/// sidecar without that preStop (the mesh's `global.proxy.lifecycle`) drains only after its
/// SIGTERM, for `terminationDrainDuration`: the full drain ends it on evidence instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DrainKind {
    Full,
    KubeletOrdered,
}

pub(crate) fn drain_kind(view: &PodView) -> DrainKind {
    if view.mode == crate::pod::SidecarMode::Native && view.prestop_drain {
        DrainKind::KubeletOrdered
    } else {
        DrainKind::Full
    }
}

/// Whether the drain undoes a failed health check (`POST /healthcheck/ok`): the pod's mesh
/// fails it on SIGTERM (kuma-dp: `/healthcheck/fail`, then a fixed `drainTime` of 30 s), which
/// makes Envoy put `Connection: close` on every outbound HTTP/1 response and GOAWAY on HTTP/2
/// while the app may still call out (Kuma sets no listener `drain_type`: kumahq/kuma has no
/// `MODIFY_ONLY` anywhere). Envoy asks `server_.healthCheckFailed()` anew at every
/// `DrainManagerImpl::drainClose` (source/server/drain_manager_impl.cc), so `/healthcheck/ok`
/// ends that for every connection from then on. Inbound stays drained: the agent's own `drain_listeners
/// ?inboundonly&graceful` keeps its listeners draining, and kuma-dp's readiness (9902, which the
/// kubelet probes) says terminating whatever Envoy's health says. Not in a kubelet-ordered drain
/// (the app is gone by the proxy's SIGTERM there).
pub(crate) fn restore_health(
    mesh_fails_health_check: bool,
    kind: DrainKind,
    health_check_failed: bool,
) -> bool {
    mesh_fails_health_check && kind == DrainKind::Full && health_check_failed
}

/// Whether the drain, having quit Envoy, also sends the mesh's agent a SIGTERM: its agent waits
/// a fixed drain time after its first SIGTERM whatever Envoy does (kuma-dp), and Envoy's exit was
/// seen (the quit did its work; a second SIGTERM before it would make kuma-dp kill Envoy).
pub(crate) fn sigterm_after_quit(mesh_waits_after_sigterm: bool, proxy_exit_seen: bool) -> bool {
    mesh_waits_after_sigterm && proxy_exit_seen
}

/// What a drain does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DrainNext {
    /// Keep watching.
    Wait,
    /// The app is done and nothing is in flight: quit the proxy (outcome `app-done`).
    Quit(QuitReason),
    /// The drain ends now, the proxy left as it is (gone, or the kubelet's to end).
    End(DrainEnd),
}

/// How a drain that ends without a quit ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DrainEnd {
    pub(crate) outcome: DrainOutcome,
    /// Envoy exited but the app's end was not seen (its processes are not visible).
    pub(crate) app_unknown: bool,
    /// The proxy's exit is seen now: the report dates it (a kubelet-ordered end, a sidecar
    /// lost). A classic Envoy that exited by itself is dated by nobody: its exit was not what
    /// the drain waited for.
    pub(crate) proxy_exit_seen: bool,
}

/// What was observed at one point of a drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DrainSeen {
    /// The app ran and is gone ([`AppSnapshot::gone_for_drain`]).
    pub(crate) app_gone: bool,
    /// App processes alive.
    pub(crate) app_live: usize,
    /// Envoy has exited (`Drainer::envoy_gone` in `admin.rs`).
    pub(crate) proxy_gone: bool,
    /// The latest in-flight judgement (`None`: the last sample failed).
    pub(crate) judgement: Option<InFlight>,
    /// Failed samples since the app went reached the allowed attempts.
    pub(crate) stats_exhausted: bool,
    /// The drain's deadline (the kubelet's kill time minus the margin) has passed.
    pub(crate) deadline_passed: bool,
    /// The kubelet ends the proxy ([`DrainKind::KubeletOrdered`]): never quit it.
    pub(crate) kubelet_ordered: bool,
    /// A native sidecar (the kubelet does not restart it during termination).
    pub(crate) native: bool,
    /// The pod object was removed from the source.
    pub(crate) pod_removed: bool,
}

pub(crate) fn drain_next(seen: DrainSeen) -> DrainNext {
    let end = |outcome, app_unknown, proxy_exit_seen| {
        DrainNext::End(DrainEnd {
            outcome,
            app_unknown,
            proxy_exit_seen,
        })
    };
    if seen.pod_removed {
        // The kubelet removes the pod object only once every container has stopped, the proxy
        // last: in a kubelet-ordered drain that is the end it was watching for, seen late.
        return if seen.kubelet_ordered {
            end(DrainOutcome::KubeletOrdered, false, true)
        } else if seen.deadline_passed {
            // Past the deadline the proxy was left to the kill; the pod's removal is that
            // kill seen before the proxy's refusals were.
            end(DrainOutcome::Deadline, false, false)
        } else {
            end(DrainOutcome::PodGone, false, false)
        };
    }
    if seen.proxy_gone && seen.deadline_passed && !seen.kubelet_ordered {
        // Past the deadline the proxy was left running (below): its end now is the grace
        // period's (the kubelet's kill, or the mesh's own drain), as without holdfast.
        return end(DrainOutcome::Deadline, false, false);
    }
    if seen.proxy_gone {
        return if seen.app_gone || seen.app_live == 0 {
            let outcome = if seen.kubelet_ordered {
                DrainOutcome::KubeletOrdered
            } else {
                DrainOutcome::AppDone
            };
            end(outcome, !seen.app_gone, seen.kubelet_ordered)
        } else if seen.native {
            end(DrainOutcome::SidecarLost, false, true)
        } else {
            end(DrainOutcome::ProxyGoneEarly, false, false)
        };
    }
    if seen.deadline_passed && seen.kubelet_ordered {
        // The kubelet's to end in a kubelet-ordered drain: it kills the proxy at the grace
        // period's end; holdfast never quits it.
        return end(DrainOutcome::Deadline, false, false);
    }
    // Past the deadline too, the proxy is quit only on evidence (the app gone, nothing in
    // flight): while the app runs or traffic is in flight it is left running, to the app's
    // exit (then quit as usual) or the kubelet's kill, as without holdfast. The deadline is the
    // kill time the API server's `deletionTimestamp` implies, but the kubelet counts the grace
    // period from when *it* sees the deletion: on the real cluster a `--grace-period=3`
    // deletion reached the app's SIGTERM ~0.5 s late under load, and a quit at the deadline
    // refused the app's last calls while Envoy would have served them to the real kill.
    if !seen.app_gone || seen.kubelet_ordered {
        return DrainNext::Wait;
    }
    match quit_when_idle(seen.judgement, seen.stats_exhausted) {
        // Counts that cannot be read say nothing of a response still on its way out: a pod's
        // drain waits for Istio's own end (pilot-agent's drain) or the deadline, as without
        // holdfast. (A finished Job's wait quits: without holdfast it would never complete.)
        Some(QuitReason::StatsUnavailable) => DrainNext::Wait,
        Some(reason) => DrainNext::Quit(reason),
        None => DrainNext::Wait,
    }
}

/// What a Job watch does next, once its app has finished for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobNext {
    Wait,
    /// Quit the proxy, so the pod completes.
    Quit(QuitReason),
    /// Envoy has exited already (outcome `proxy-already-gone`).
    ProxyAlreadyGone,
}

/// What was observed at one point of a finished Job's wait for in-flight traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JobSeen {
    /// Enough consecutive refused admin connections: Envoy has exited.
    pub(crate) proxy_gone: bool,
    /// The latest in-flight judgement (`None`: the last sample failed).
    pub(crate) judgement: Option<InFlight>,
    /// Failed samples reached the allowed attempts.
    pub(crate) stats_exhausted: bool,
    /// The bounded wait for in-flight traffic (`job_in_flight_wait`) is over.
    pub(crate) out_of_time: bool,
}

pub(crate) fn job_next(seen: JobSeen) -> JobNext {
    if seen.proxy_gone {
        return JobNext::ProxyAlreadyGone;
    }
    match quit_when_idle(seen.judgement, seen.stats_exhausted) {
        Some(reason) => JobNext::Quit(reason),
        None if seen.out_of_time => JobNext::Quit(QuitReason::OutOfTime),
        None => JobNext::Wait,
    }
}

/// Whether a Job's app finished for good, and by which signal: the kubelet's statuses say so
/// with exit codes ([`PodView::apps_finished_for_good`]); procfs is faster but only says
/// "exited", which is for good only when the kubelet never restarts (`Never`) —
/// [`crate::pod::app_end()`] decides both. Either way every app container must have run.
pub(crate) fn job_finished(view: &PodView, snapshot: &AppSnapshot) -> Option<FinishedBy> {
    if view.apps_finished_for_good() {
        Some(FinishedBy::Status)
    } else if snapshot.live == 0
        && snapshot.end(view.restart_policy, |name| view.container_restart(name)) == AppEnd::ForGood
    {
        Some(FinishedBy::Procfs)
    } else {
        None
    }
}

/// Longest pause between two periodic rescans of the app's processes ([`rescan_every`]).
pub(crate) const RESCAN_EVERY_MAX: Duration = Duration::from_secs(1);

/// The pause before the next periodic rescan of the app's processes, after `rescans` of them:
/// `rescan_every`, doubling with each rescan up to [`RESCAN_EVERY_MAX`]. Rescans only look for
/// processes the app forked since the last one: exits come by pidfd at once, and every exit
/// rescans (so the app's last exit still finds a process forked meanwhile, and the drain does
/// not end on it); a slower pace costs no correctness. What it saves: a pod with thousands of
/// processes (issue 29: 2,000) costs each rescan a read of its `cgroup.procs`, and at a rescan
/// every 100 ms under the DaemonSet's 0.2-core quota that pushed an honest pod's hold after
/// its app's first connect.
pub(crate) fn rescan_every(settings: &DrainSettings, rescans: u32) -> Duration {
    Backoff::doubling(settings.rescan_every, RESCAN_EVERY_MAX).after(rescans)
}

/// Longest pause between two samples while the app still runs.
pub(crate) const SAMPLE_EVERY_MAX: Duration = Duration::from_secs(1);

/// The pause between two samples while the app still runs, `running_for` into the drain:
/// `stats_every` for the first 10 s, then doubling every 10 s up to [`SAMPLE_EVERY_MAX`], so a
/// drain that lasts the whole of a long grace period asks Envoy a few times less often. These
/// samples only give the judge its history; the app's exit is seen at once (pidfd), and from
/// then on samples come every `settle_poll` ([`settle_wait`]), so the back-off never lets Envoy
/// outlive the app by more than the idle window and a few polls.
pub(crate) fn sample_every(settings: &DrainSettings, running_for: Duration) -> Duration {
    let tens = u32::try_from(running_for.as_secs() / 10).unwrap_or(u32::MAX);
    Backoff::doubling(settings.stats_every, SAMPLE_EVERY_MAX).after(tens)
}

/// The pause after `failures` failed samples in a row while the app still runs:
/// [`sample_every`] doubled per failure, up to 16 times it. Those samples only give the judge
/// its history, and a failed one (an answer over the cap, a timeout; a refusal is confirmed
/// sooner by the caller) gives none. Issue 29: a pod's "Envoy" answering every sample with
/// 1 MB was read up to the 64 KiB cap every 100 ms for as long as the app ran.
pub(crate) fn sample_every_after_failures(
    settings: &DrainSettings,
    running_for: Duration,
    failures: u32,
) -> Duration {
    let base = sample_every(settings, running_for);
    Backoff::doubling(base, base.saturating_mul(16)).after(failures)
}

/// The pause before the `samples`-th sample while waiting for in-flight traffic to settle:
/// `settle_poll` for the first ten (the usual case settles within milliseconds), then doubling
/// every ten samples up to `stats_every`, so a long wait does not poll Envoy every 5 ms.
pub(crate) fn settle_wait(settings: &DrainSettings, samples: u32) -> Duration {
    Backoff::doubling(settings.settle_poll, settings.stats_every).after(samples / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mesh-dependent rules, as table rows: (mesh fails the health check on SIGTERM, drain
    /// kind, health check failed now) → restore; (mesh waits after SIGTERM, Envoy's exit seen)
    /// → SIGTERM its agent.
    #[test]
    fn mesh_dependent_drain_rules() {
        for (mesh, kind, failed, restore) in [
            (true, DrainKind::Full, true, true),
            (true, DrainKind::Full, false, false),
            (true, DrainKind::KubeletOrdered, true, false),
            (false, DrainKind::Full, true, false),
        ] {
            assert_eq!(
                restore_health(mesh, kind, failed),
                restore,
                "{mesh} {kind:?} {failed}"
            );
        }
        for (waits, exit_seen, signal) in [
            (true, true, true),
            // Envoy not seen gone: a SIGTERM now would make kuma-dp kill it mid-response.
            (true, false, false),
            (false, true, false),
        ] {
            assert_eq!(
                sigterm_after_quit(waits, exit_seen),
                signal,
                "{waits} {exit_seen}"
            );
        }
    }
    use crate::api::IdleReason;

    fn seen(
        app_gone: bool,
        app_live: usize,
        proxy_gone: bool,
        judgement: Option<InFlight>,
        stats_exhausted: bool,
    ) -> DrainSeen {
        DrainSeen {
            app_gone,
            app_live,
            proxy_gone,
            judgement,
            stats_exhausted,
            deadline_passed: false,
            kubelet_ordered: false,
            native: false,
            pod_removed: false,
        }
    }

    fn end(outcome: DrainOutcome, app_unknown: bool, proxy_exit_seen: bool) -> DrainNext {
        DrainNext::End(DrainEnd {
            outcome,
            app_unknown,
            proxy_exit_seen,
        })
    }

    #[test]
    fn drain_decisions() {
        let idle = Some(InFlight::Idle(IdleReason::NoConnections));
        let busy = Some(InFlight::Busy {
            connections: Some(1),
        });
        for (s, want) in [
            // The app runs: wait, whatever the counts say.
            (seen(false, 1, false, idle, false), DrainNext::Wait),
            // An app that never ran has 0 live processes but is not gone: wait.
            (seen(false, 0, false, idle, true), DrainNext::Wait),
            (
                seen(true, 0, false, idle, false),
                DrainNext::Quit(QuitReason::Idle(IdleReason::NoConnections)),
            ),
            (seen(true, 0, false, busy, false), DrainNext::Wait),
            // Nothing can be seen (no filter, no byte counters): a response may still be on its
            // way out, so never quit; pilot-agent's drain or the deadline ends Envoy.
            (
                seen(true, 0, false, Some(InFlight::Unseen), false),
                DrainNext::Wait,
            ),
            (seen(true, 0, false, None, false), DrainNext::Wait),
            // Counts that cannot be read: never a blind quit (a response may be in flight).
            (seen(true, 0, false, None, true), DrainNext::Wait),
            (
                seen(true, 0, true, None, false),
                end(DrainOutcome::AppDone, false, false),
            ),
            (
                seen(false, 0, true, None, false),
                end(DrainOutcome::AppDone, true, false),
            ),
            (
                seen(false, 2, true, busy, false),
                end(DrainOutcome::ProxyGoneEarly, false, false),
            ),
        ] {
            assert_eq!(drain_next(s), want, "{s:?}");
        }
        // Past the deadline the proxy is never quit while the app runs or traffic is in
        // flight (the kubelet may kill later than the deadline says); the app's exit and an
        // idle judgement still quit it; Envoy gone then is the grace period's end.
        let late = |s: DrainSeen| DrainSeen {
            deadline_passed: true,
            ..s
        };
        assert_eq!(
            drain_next(late(seen(false, 1, false, busy, false))),
            DrainNext::Wait
        );
        assert_eq!(
            drain_next(late(seen(true, 0, false, busy, false))),
            DrainNext::Wait
        );
        assert_eq!(
            drain_next(late(seen(true, 0, false, idle, false))),
            DrainNext::Quit(QuitReason::Idle(IdleReason::NoConnections))
        );
        assert_eq!(
            drain_next(late(seen(false, 2, true, None, false))),
            end(DrainOutcome::Deadline, false, false)
        );
    }

    /// Every way a drain ends without its own quit is a row here, not a branch of the
    /// executor: the outcome, whether the app's end is unknown, whether the proxy's exit is
    /// dated now.
    #[test]
    fn how_a_drain_ends_without_a_quit() {
        let with = |f: &dyn Fn(&mut DrainSeen)| {
            let mut s = seen(false, 1, false, None, false);
            f(&mut s);
            drain_next(s)
        };
        for (what, next, want) in [
            (
                "classic pod object removed",
                with(&|s| s.pod_removed = true),
                end(DrainOutcome::PodGone, false, false),
            ),
            (
                "classic pod object removed past the deadline: the kill, seen by the removal",
                with(&|s| {
                    s.pod_removed = true;
                    s.deadline_passed = true;
                }),
                end(DrainOutcome::Deadline, false, false),
            ),
            (
                "kubelet-ordered pod object removed: its end, seen late",
                with(&|s| {
                    s.pod_removed = true;
                    s.kubelet_ordered = true;
                    s.native = true;
                }),
                end(DrainOutcome::KubeletOrdered, false, true),
            ),
            (
                "kubelet-ordered deadline: left to the kubelet, no quit",
                with(&|s| {
                    s.deadline_passed = true;
                    s.kubelet_ordered = true;
                    s.native = true;
                }),
                end(DrainOutcome::Deadline, false, false),
            ),
            (
                "native sidecar gone while the app runs: lost",
                with(&|s| {
                    s.proxy_gone = true;
                    s.app_live = 2;
                    s.native = true;
                }),
                end(DrainOutcome::SidecarLost, false, true),
            ),
            (
                "native, kubelet-ordered, gone while the app runs: lost",
                with(&|s| {
                    s.proxy_gone = true;
                    s.app_live = 2;
                    s.native = true;
                    s.kubelet_ordered = true;
                }),
                end(DrainOutcome::SidecarLost, false, true),
            ),
            (
                "kubelet-ordered exit after the app",
                with(&|s| {
                    s.proxy_gone = true;
                    s.app_gone = true;
                    s.app_live = 0;
                    s.kubelet_ordered = true;
                    s.native = true;
                }),
                end(DrainOutcome::KubeletOrdered, false, true),
            ),
            (
                "classic deadline, the app running: left running, no quit",
                with(&|s| s.deadline_passed = true),
                DrainNext::Wait,
            ),
            (
                "classic, past the deadline, the proxy gone with the app running: the kill",
                with(&|s| {
                    s.deadline_passed = true;
                    s.proxy_gone = true;
                    s.app_live = 2;
                }),
                end(DrainOutcome::Deadline, false, false),
            ),
        ] {
            assert_eq!(next, want, "{what}");
        }
    }

    /// The kubelet ends a native sidecar with Istio's preStop: holdfast never quits it, it
    /// waits for the proxy's exit — after the app's (done), or before it (the sidecar lost).
    #[test]
    fn a_kubelet_ordered_drain_only_watches() {
        let idle = Some(InFlight::Idle(IdleReason::NoConnections));
        let seen = |app_gone, app_live, proxy_gone| DrainSeen {
            app_gone,
            app_live,
            proxy_gone,
            judgement: idle,
            stats_exhausted: true,
            deadline_passed: false,
            kubelet_ordered: true,
            native: true,
            pod_removed: false,
        };
        assert_eq!(drain_next(seen(true, 0, false)), DrainNext::Wait);
        assert_eq!(drain_next(seen(false, 1, false)), DrainNext::Wait);
        assert_eq!(
            drain_next(seen(true, 0, true)),
            end(DrainOutcome::KubeletOrdered, false, true)
        );
        assert_eq!(
            drain_next(seen(false, 2, true)),
            end(DrainOutcome::SidecarLost, false, true)
        );
    }

    #[test]
    fn job_decisions() {
        let idle = Some(InFlight::Idle(IdleReason::NoConnections));
        let busy = Some(InFlight::Busy {
            connections: Some(1),
        });
        let seen = |proxy_gone, judgement, stats_exhausted, out_of_time| JobSeen {
            proxy_gone,
            judgement,
            stats_exhausted,
            out_of_time,
        };
        for (s, want) in [
            (
                seen(false, idle, false, false),
                JobNext::Quit(QuitReason::Idle(IdleReason::NoConnections)),
            ),
            // Nothing can be seen: wait for the bounded wait's end, as for busy.
            (
                seen(false, Some(InFlight::Unseen), false, false),
                JobNext::Wait,
            ),
            (
                seen(false, Some(InFlight::Unseen), false, true),
                JobNext::Quit(QuitReason::OutOfTime),
            ),
            (seen(false, busy, false, false), JobNext::Wait),
            (
                seen(false, busy, false, true),
                JobNext::Quit(QuitReason::OutOfTime),
            ),
            (seen(false, None, false, false), JobNext::Wait),
            (
                seen(false, None, true, false),
                JobNext::Quit(QuitReason::StatsUnavailable),
            ),
            (seen(true, None, false, false), JobNext::ProxyAlreadyGone),
            (seen(true, idle, false, true), JobNext::ProxyAlreadyGone),
        ] {
            assert_eq!(job_next(s), want, "{s:?}");
        }
    }

    #[test]
    fn failed_samples_back_off_while_the_app_runs() {
        let s = DrainSettings::default();
        let at = |failures| sample_every_after_failures(&s, Duration::ZERO, failures);
        assert_eq!(at(0), s.stats_every);
        assert_eq!(at(1), s.stats_every * 2);
        assert_eq!(at(4), s.stats_every * 16);
        assert_eq!(at(u32::MAX), s.stats_every * 16);
    }

    #[test]
    fn rescans_back_off_but_stay_bounded() {
        let s = DrainSettings::default();
        assert_eq!(rescan_every(&s, 0), s.rescan_every);
        assert_eq!(rescan_every(&s, 1), s.rescan_every * 2);
        assert_eq!(rescan_every(&s, 3), s.rescan_every * 8);
        assert_eq!(rescan_every(&s, 4), RESCAN_EVERY_MAX.max(s.rescan_every));
        assert_eq!(
            rescan_every(&s, u32::MAX),
            RESCAN_EVERY_MAX.max(s.rescan_every)
        );
        // A setting above the bound is kept, never shortened.
        let slow = DrainSettings {
            rescan_every: Duration::from_secs(3),
            ..DrainSettings::default()
        };
        assert_eq!(rescan_every(&slow, 5), Duration::from_secs(3));
    }

    #[test]
    fn samples_back_off_while_the_app_runs_but_stay_bounded() {
        let s = DrainSettings::default();
        let at = |secs| sample_every(&s, Duration::from_secs(secs));
        assert_eq!(at(0), s.stats_every);
        assert_eq!(at(9), s.stats_every);
        assert_eq!(at(10), s.stats_every * 2);
        assert_eq!(at(25), s.stats_every * 4);
        assert_eq!(at(3600), SAMPLE_EVERY_MAX.max(s.stats_every));
        assert_eq!(at(u64::MAX / 2), SAMPLE_EVERY_MAX.max(s.stats_every));
        // A setting above the bound is kept, never shortened.
        let slow = DrainSettings {
            stats_every: Duration::from_secs(3),
            ..DrainSettings::default()
        };
        assert_eq!(
            sample_every(&slow, Duration::from_secs(100)),
            Duration::from_secs(3)
        );
    }

    /// The drain and the Job share the rule for "the app is done: may the proxy go?".
    /// The drain and the Job quit share the idle rule; they differ only on unreadable counts (a
    /// drain waits for the deadline, a finished Job quits: without holdfast it never completes).
    #[test]
    fn drain_and_job_quit_for_the_same_reasons() {
        let judgements = [
            Some(InFlight::Idle(IdleReason::NoConnections)),
            Some(InFlight::Idle(IdleReason::NoBytesMoved {
                idle_for: Duration::from_millis(100),
            })),
            Some(InFlight::Unseen),
            Some(InFlight::Busy {
                connections: Some(2),
            }),
            None,
        ];
        for judgement in judgements {
            for stats_exhausted in [false, true] {
                let drain = drain_next(seen(true, 0, false, judgement, stats_exhausted));
                let job = job_next(JobSeen {
                    proxy_gone: false,
                    judgement,
                    stats_exhausted,
                    out_of_time: false,
                });
                let as_drain = match job {
                    JobNext::Quit(QuitReason::StatsUnavailable) => DrainNext::Wait,
                    JobNext::Quit(r) => DrainNext::Quit(r),
                    _ => DrainNext::Wait,
                };
                assert_eq!(drain, as_drain, "{judgement:?} {stats_exhausted}");
            }
        }
    }
}
