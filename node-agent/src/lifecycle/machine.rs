//! One pod's lifecycle as a pure state machine: `step(state, input, now) -> (state, effects)`.
//!
//! No I/O, no runtime: the driver ([`super::driver`]) turns the outside world into [`Input`]s
//! (pod updates, netns lookups, readiness observations, results of the hold and of the drain and
//! Job executors, timers, the agent stopping) and performs the [`Effect`]s. Every decision about
//! *what happens next* to a pod — hold or not, when a hold ends and why, when a drain or a Job
//! watch starts, which outcome is recorded, which phase the row shows — is made here, so every
//! case is a table row in `machine_tests.rs`. The shape is ztunnel's in-pod state manager
//! (`process_msg`): messages in, commands out.

use std::time::{Duration, Instant};

use crate::api::{DrainOutcome, HoldOutcome, JobOutcome, Phase};
use crate::effects::netns::NetnsId;

pub use super::facts::{netns_poll_after, pass_through, PodFacts, RestartPolicy};
pub use super::messages::{Effect, Input, Now, Outcome, Released, Seen, Timer};

#[derive(Debug, Clone, PartialEq)]
pub enum Stage {
    /// No process of the pod yet. `waiting_since`: the last pod update (backoff base).
    WaitingForNetns {
        waiting_since: Instant,
        looked: bool,
        refused_noted: bool,
    },
    /// The netns is known; one readiness observation decides whether to hold.
    Checking {
        netns: NetnsId,
        fresh: bool,
    },
    SettingUpHold {
        netns: NetnsId,
    },
    Holding {
        netns: NetnsId,
        started: Instant,
        pass_through: bool,
    },
    Releasing {
        netns: NetnsId,
        outcome: HoldOutcome,
        started: Instant,
    },
    /// The proxy is ready (or the hold failed open); following the pod.
    Running {
        netns: NetnsId,
        proxy_id: Option<String>,
    },
    JobWatch {
        netns: NetnsId,
    },
    Draining {
        netns: NetnsId,
    },
    /// Nothing more to do for this pod until it goes (deleted before ready, Job done, drain
    /// done).
    Finished,
    /// The task has ended.
    Exited,
}

/// How often a holding pod is checked once its proxy's ports listen (`Seen::Up`).
///
/// Between "the capture ports listen" and "fully ready" Envoy starts its workers and each
/// worker configures the filter: milliseconds on an idle node. A check there is one `/stats`
/// request on the kept-alive admin connection, so checking every millisecond in that window
/// costs little and makes the release follow readiness within about a millisecond, where the
/// `ready_poll` cadence (5 ms) alone would add up to 5 ms. Before the ports listen the check
/// is a `sock_diag` dump, at `ready_poll`.
pub const LIVE_WINDOW_POLL: Duration = Duration::from_millis(1);

/// When to check again after `seen`: fast in the window after the ports listen.
pub fn next_check_after(seen: Seen, ready_poll: Duration) -> Duration {
    match seen {
        Seen::Up => ready_poll.min(LIVE_WINDOW_POLL),
        Seen::Down | Seen::Ready => ready_poll,
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub stage: Stage,
    /// The latest facts (`None`: the pod is gone).
    pub pod: Option<PodFacts>,
    /// The readiness poll interval.
    pub ready_poll: Duration,
    /// The agent is stopping.
    pub stopping: bool,
    /// The first netns lookup found nothing: the netns is new to this agent.
    pub fresh: Option<bool>,
}

impl State {
    pub fn new(pod: PodFacts, ready_poll: Duration, now: Now) -> (State, Vec<Effect>) {
        if pod.finished() {
            // A completed pod (an agent restarted after its Job finished): nothing to wait for.
            let state = State {
                stage: Stage::Finished,
                pod: Some(pod),
                ready_poll,
                stopping: false,
                fresh: None,
            };
            return (state, vec![Effect::SetPhase(Phase::Done)]);
        }
        let state = State {
            stage: Stage::WaitingForNetns {
                waiting_since: now.mono,
                looked: false,
                refused_noted: false,
            },
            pod: Some(pod),
            ready_poll,
            stopping: false,
            fresh: None,
        };
        (
            state,
            vec![
                Effect::SetPhase(Phase::WaitingForNetns),
                Effect::LookForNetns,
            ],
        )
    }

    fn deleting(&self) -> bool {
        self.pod.as_ref().is_none_or(|p| p.deletion.is_some())
    }

    /// Whether the driver should watch the proxy container's processes for an exit (answer:
    /// `ProxyGone`): only while the proxy is ready and the pod runs on (`Running`), never during
    /// a drain or a Job watch, where the agent itself ends Envoy. A watch costs one pidfd per
    /// process and no polling.
    pub fn watches_proxy(&self) -> bool {
        matches!(self.stage, Stage::Running { .. }) && !self.stopping && !self.deleting()
    }
}

/// One transition.
pub fn step(mut s: State, input: Input, now: Now) -> (State, Vec<Effect>) {
    let mut fx = Vec::new();
    if s.stage == Stage::Exited {
        return (s, fx);
    }
    // Facts first: every stage sees the latest pod.
    let previous = match &input {
        Input::Pod(p) => Some(std::mem::replace(&mut s.pod, p.clone())),
        Input::AgentStop => {
            s.stopping = true;
            None
        }
        _ => None,
    };
    let stage = std::mem::replace(&mut s.stage, Stage::Exited);
    s.stage = match (stage, input) {
        // The agent stops: holds stay for the successor; executors end themselves (they watch
        // the same stop signal) and report; everything else just ends.
        (Stage::Holding { started, .. }, Input::AgentStop) => {
            fx.push(Effect::LeaveHoldForSuccessor);
            fx.push(Effect::Record(Outcome::HoldEnded {
                outcome: HoldOutcome::AgentStopped,
                released: None,
                held_for: now.mono.saturating_duration_since(started),
                timeout: s.pod.as_ref().map_or(Duration::ZERO, |p| p.hold_timeout),
            }));
            exit(&mut fx)
        }
        (st @ (Stage::JobWatch { .. } | Stage::Draining { .. }), Input::AgentStop) => st,
        (st @ (Stage::SettingUpHold { .. } | Stage::Releasing { .. }), Input::AgentStop) => st,
        (_, Input::AgentStop) => exit(&mut fx),

        // --- waiting for the netns ---------------------------------------------------------
        (
            Stage::WaitingForNetns {
                refused_noted,
                looked,
                ..
            },
            Input::Pod(Some(p)),
        ) => {
            if p.finished() {
                // A completed pod (its sandbox may be gone): nothing to wait for.
                fx.push(Effect::SetPhase(Phase::Done));
                Stage::Finished
            } else {
                if looked {
                    fx.push(Effect::LookForNetns);
                }
                Stage::WaitingForNetns {
                    waiting_since: now.mono,
                    looked: false,
                    refused_noted,
                }
            }
        }
        (Stage::WaitingForNetns { .. } | Stage::Checking { .. }, Input::Pod(None)) => {
            done_and_exit(&mut fx)
        }
        (
            Stage::WaitingForNetns {
                waiting_since,
                refused_noted,
                ..
            },
            Input::NetnsNotYet,
        ) => {
            s.fresh.get_or_insert(true);
            fx.push(Effect::Schedule(
                Timer::NetnsPoll,
                now.mono + netns_poll_after(now.mono.saturating_duration_since(waiting_since)),
            ));
            Stage::WaitingForNetns {
                waiting_since,
                looked: true,
                refused_noted,
            }
        }
        (
            Stage::WaitingForNetns {
                waiting_since,
                refused_noted,
                ..
            },
            Input::NetnsRefused(why),
        ) => {
            s.fresh.get_or_insert(false);
            if !refused_noted {
                fx.push(Effect::Problem(format!(
                    "cannot use the pod's network namespace yet: {why}"
                )));
            }
            fx.push(Effect::Schedule(
                Timer::NetnsPoll,
                now.mono + netns_poll_after(now.mono.saturating_duration_since(waiting_since)),
            ));
            Stage::WaitingForNetns {
                waiting_since,
                looked: true,
                refused_noted: true,
            }
        }
        (st @ Stage::WaitingForNetns { looked: true, .. }, Input::Timer(Timer::NetnsPoll)) => {
            fx.push(Effect::LookForNetns);
            match st {
                Stage::WaitingForNetns {
                    waiting_since,
                    refused_noted,
                    ..
                } => Stage::WaitingForNetns {
                    waiting_since,
                    looked: false,
                    refused_noted,
                },
                other => other,
            }
        }
        (Stage::WaitingForNetns { .. }, Input::NetnsFound { netns }) => {
            let fresh = *s.fresh.get_or_insert(false);
            fx.push(Effect::CheckReadiness);
            Stage::Checking { netns, fresh }
        }

        // --- deciding whether to hold ------------------------------------------------------
        (Stage::Checking { netns, fresh }, Input::Readiness(seen)) => {
            let pod = s.pod.clone();
            match (seen, pod) {
                (_, None) => done_and_exit(&mut fx),
                (Seen::Ready, Some(p)) => {
                    // Agent restart, or a pod found late: a ready proxy needs no hold.
                    fx.push(Effect::RemoveLeftoverHold);
                    enter_running(&mut fx, netns, &p)
                }
                (_, Some(p)) if p.finished() => {
                    fx.push(Effect::RemoveLeftoverHold);
                    fx.push(Effect::SetPhase(Phase::Done));
                    Stage::Finished
                }
                // Deleted, and Envoy up but not ready: it is draining (a previous agent began
                // the drain, or pilot-agent did) — adopt the drain. Envoy down: it never came
                // up, nothing to drain.
                (Seen::Up, Some(p)) if p.deletion.is_some() => {
                    fx.push(Effect::RemoveLeftoverHold);
                    start_drain(&mut fx, netns)
                }
                (Seen::Down, Some(p)) if p.deletion.is_some() => {
                    fx.push(Effect::RemoveLeftoverHold);
                    fx.push(Effect::SetPhase(Phase::Done));
                    Stage::Finished
                }
                (_, Some(_)) => {
                    fx.push(Effect::InstallHold { fresh });
                    Stage::SettingUpHold { netns }
                }
            }
        }
        // A pod update while checking: keep the check going.
        (st @ Stage::Checking { .. }, Input::Pod(Some(_))) => st,

        // --- the hold ----------------------------------------------------------------------
        (Stage::SettingUpHold { netns }, Input::HoldSetUp { adopted, late }) => {
            let timeout = s.pod.as_ref().map_or(Duration::ZERO, |p| p.hold_timeout);
            fx.push(Effect::Record(Outcome::HoldStarted { adopted, late }));
            fx.push(Effect::SetPhase(Phase::Holding));
            let pass = s.pod.as_ref().is_some_and(pass_through);
            if pass {
                fx.push(Effect::SetPassThrough(true));
            }
            if s.stopping {
                fx.push(Effect::LeaveHoldForSuccessor);
                fx.push(Effect::Record(Outcome::HoldEnded {
                    outcome: HoldOutcome::AgentStopped,
                    released: None,
                    held_for: Duration::ZERO,
                    timeout,
                }));
                exit(&mut fx)
            } else if s.deleting() {
                release(&mut fx, netns, HoldOutcome::PodDeleted, now.mono, None)
            } else {
                fx.push(Effect::Schedule(Timer::HoldDeadline, now.mono + timeout));
                fx.push(Effect::CheckReadiness);
                Stage::Holding {
                    netns,
                    started: now.mono,
                    pass_through: pass,
                }
            }
        }
        (Stage::SettingUpHold { netns }, Input::HoldFailed(why)) => {
            // Fail open: without a hold the pod behaves as without the agent.
            fx.push(Effect::RemoveLeftoverHold);
            fx.push(Effect::Record(Outcome::HoldEnded {
                outcome: HoldOutcome::Failed,
                released: None,
                held_for: Duration::ZERO,
                timeout: s.pod.as_ref().map_or(Duration::ZERO, |p| p.hold_timeout),
            }));
            fx.push(Effect::Problem(format!("startup hold failed: {why}")));
            after_hold(&mut fx, &s, netns)
        }
        (st @ Stage::SettingUpHold { .. }, _) => st,
        (
            Stage::Holding {
                netns,
                started,
                pass_through: was,
            },
            Input::Readiness(seen),
        ) => {
            if seen == Seen::Ready {
                release(&mut fx, netns, HoldOutcome::Ready, started, Some(now.mono))
            } else {
                fx.push(Effect::Schedule(
                    Timer::ReadinessPoll,
                    now.mono + next_check_after(seen, s.ready_poll),
                ));
                Stage::Holding {
                    netns,
                    started,
                    pass_through: was,
                }
            }
        }
        (st @ Stage::Holding { .. }, Input::Timer(Timer::ReadinessPoll)) => {
            fx.push(Effect::CheckReadiness);
            st
        }
        (Stage::Holding { netns, started, .. }, Input::Timer(Timer::HoldDeadline)) => {
            release(&mut fx, netns, HoldOutcome::Deadline, started, None)
        }
        (
            Stage::Holding {
                netns,
                started,
                pass_through: was,
            },
            Input::Pod(p),
        ) => match p {
            Some(p) if p.deletion.is_none() => {
                let pass = pass_through(&p);
                if pass != was {
                    fx.push(Effect::SetPassThrough(pass));
                }
                Stage::Holding {
                    netns,
                    started,
                    pass_through: pass,
                }
            }
            _ => release(&mut fx, netns, HoldOutcome::PodDeleted, started, None),
        },
        (
            Stage::Releasing {
                netns,
                outcome,
                started,
            },
            Input::HoldReleased(released),
        ) => {
            fx.push(Effect::Record(Outcome::HoldEnded {
                outcome,
                released: Some(released),
                held_for: now.mono.saturating_duration_since(started),
                timeout: s.pod.as_ref().map_or(Duration::ZERO, |p| p.hold_timeout),
            }));
            after_hold(&mut fx, &s, netns)
        }
        (Stage::Releasing { netns, .. }, Input::ReleaseFailed(why)) => {
            fx.push(Effect::RemoveLeftoverHold);
            fx.push(Effect::Record(Outcome::HoldEnded {
                outcome: HoldOutcome::Failed,
                released: None,
                held_for: Duration::ZERO,
                timeout: s.pod.as_ref().map_or(Duration::ZERO, |p| p.hold_timeout),
            }));
            fx.push(Effect::Problem(format!("releasing the hold failed: {why}")));
            after_hold(&mut fx, &s, netns)
        }
        (st @ Stage::Releasing { .. }, _) => st,

        // --- running: the proxy is ready ---------------------------------------------------
        (Stage::Running { netns, proxy_id }, Input::Pod(p)) => match p {
            None => done_and_exit(&mut fx),
            Some(p) if p.deletion.is_some() => start_drain(&mut fx, netns),
            Some(p) if p.finished() => {
                fx.push(Effect::SetPhase(Phase::Done));
                Stage::Finished
            }
            Some(p) => {
                let now_id = p.running_proxy().map(str::to_string);
                let restarted = proxy_id.is_some() && now_id.as_ref() != proxy_id.as_ref();
                if restarted && p.app_may_run() {
                    // The proxy container restarted (OOM-kill...) while the app runs: hold the
                    // app's new connections again until the new Envoy is ready. The sandbox
                    // (and so the netns) may be new as well: look again.
                    fx.push(Effect::SetPhase(Phase::WaitingForNetns));
                    fx.push(Effect::LookForNetns);
                    s.fresh = Some(false);
                    Stage::WaitingForNetns {
                        waiting_since: now.mono,
                        looked: false,
                        refused_noted: false,
                    }
                } else {
                    Stage::Running {
                        netns,
                        proxy_id: now_id.or(proxy_id),
                    }
                }
            }
        },
        // A proxy process exited while the app runs (OOM-kill): the kubelet restarts the proxy
        // container after its back-off, and the Pod status says so only with the kubelet's
        // lag (PLEG relist, status sync). Check at once; Envoy gone (`Down`) re-installs the
        // hold in the same netns, released by the normal path when the new Envoy is ready.
        // Envoy still ready (some other process of the container exited): back to `Running`.
        (Stage::Running { netns, proxy_id }, Input::ProxyGone) => match &s.pod {
            Some(p) if p.deletion.is_none() && p.app_may_run() && !s.stopping => {
                s.fresh = Some(false);
                fx.push(Effect::CheckReadiness);
                Stage::Checking {
                    netns,
                    fresh: false,
                }
            }
            _ => Stage::Running { netns, proxy_id },
        },
        // The netns changed under the same uid (sandbox recreated): start over in the new one.
        (Stage::Running { netns, .. }, Input::NetnsFound { netns: new }) if new != netns => {
            s.fresh = Some(true);
            fx.push(Effect::CheckReadiness);
            Stage::Checking {
                netns: new,
                fresh: true,
            }
        }

        // --- executors ---------------------------------------------------------------------
        (Stage::JobWatch { netns }, Input::JobFinished(report)) => match report.outcome {
            JobOutcome::Completed | JobOutcome::ProxyAlreadyGone => {
                fx.push(Effect::Record(Outcome::Job(report)));
                fx.push(Effect::SetPhase(Phase::Done));
                if s.stopping {
                    exit(&mut fx)
                } else {
                    Stage::Finished
                }
            }
            _ if s.stopping => exit(&mut fx),
            JobOutcome::NotAJob => Stage::Running {
                netns,
                proxy_id: s
                    .pod
                    .as_ref()
                    .and_then(|p| p.running_proxy().map(str::to_string)),
            },
            JobOutcome::Deleting => start_drain(&mut fx, netns),
            JobOutcome::PodGone => done_and_exit(&mut fx),
            JobOutcome::AgentStopping => exit(&mut fx),
        },
        (st @ Stage::Draining { .. }, Input::QuitStarted) => {
            fx.push(Effect::SetPhase(Phase::Quitting));
            st
        }
        (st @ Stage::JobWatch { .. }, Input::QuitStarted) => {
            fx.push(Effect::SetPhase(Phase::Quitting));
            st
        }
        (Stage::Draining { .. }, Input::DrainFinished(report)) => {
            let outcome = report.outcome;
            fx.push(Effect::Record(Outcome::Drain(report)));
            fx.push(Effect::SetPhase(Phase::Done));
            match outcome {
                DrainOutcome::AgentStopping | DrainOutcome::PodGone => exit(&mut fx),
                _ if s.pod.is_none() || s.stopping => exit(&mut fx),
                _ => Stage::Finished,
            }
        }
        // The executors follow the pod themselves and report.
        (st @ (Stage::JobWatch { .. } | Stage::Draining { .. }), _) => st,

        (Stage::Finished, Input::Pod(None)) => done_and_exit(&mut fx),
        (st, _) => st,
    };
    let _ = previous;
    (s, fx)
}

fn exit(fx: &mut Vec<Effect>) -> Stage {
    fx.push(Effect::Exit);
    Stage::Exited
}

fn done_and_exit(fx: &mut Vec<Effect>) -> Stage {
    fx.push(Effect::SetPhase(Phase::Done));
    exit(fx)
}

fn release(
    fx: &mut Vec<Effect>,
    netns: NetnsId,
    outcome: HoldOutcome,
    started: Instant,
    ready_at: Option<Instant>,
) -> Stage {
    fx.push(Effect::ReleaseHold { ready_at });
    Stage::Releasing {
        netns,
        outcome,
        started,
    }
}

fn start_drain(fx: &mut Vec<Effect>, netns: NetnsId) -> Stage {
    fx.push(Effect::SetPhase(Phase::Draining));
    fx.push(Effect::StartDrain);
    Stage::Draining { netns }
}

/// After the hold (released or failed open): a pod deleted meanwhile needs no drain (its proxy
/// was never ready, so no traffic reached it); otherwise the proxy is ready.
fn after_hold(fx: &mut Vec<Effect>, s: &State, netns: NetnsId) -> Stage {
    match &s.pod {
        None => done_and_exit(fx),
        Some(_) if s.stopping => exit(fx),
        Some(p) if p.deletion.is_some() => {
            fx.push(Effect::SetPhase(Phase::Done));
            Stage::Finished
        }
        Some(p) => {
            let p = p.clone();
            enter_running(fx, netns, &p)
        }
    }
}

/// The proxy is ready: drain at once if the pod is being deleted (an adopted drain), watch a
/// Job's app, or follow the pod.
fn enter_running(fx: &mut Vec<Effect>, netns: NetnsId, p: &PodFacts) -> Stage {
    if p.deletion.is_some() {
        return start_drain(fx, netns);
    }
    fx.push(Effect::SetPhase(Phase::Ready));
    if p.is_job() {
        fx.push(Effect::StartJobWatch);
        Stage::JobWatch { netns }
    } else {
        Stage::Running {
            netns,
            proxy_id: p.running_proxy().map(str::to_string),
        }
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
