//! The startup hold: set up, held until the proxy is ready (or the deadline, or the pod's
//! deletion), released; failures fail open.

use super::*;

pub(super) fn step(
    s: &mut State,
    stage: Stage,
    input: Input,
    now: Now,
    fx: &mut Vec<Effect>,
) -> Stage {
    match (stage, input) {
        // --- the hold ----------------------------------------------------------------------
        (
            Stage::SettingUpHold { netns, rehold },
            Input::HoldSetUp {
                adopted,
                app_running,
            },
        ) => {
            // Late: a fresh hold (not adopted, not after the proxy's exit, where the app runs
            // by design) that went in after the app had started: its first connections may
            // have gone before the hold.
            let late = !adopted && !rehold && app_running;
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
                exit(fx)
            } else if s.left_alone {
                // Failed open while the hold was being set up: released at once.
                release(fx, netns, HoldOutcome::Failed, now.mono, None)
            } else if s.deleting() {
                release(fx, netns, HoldOutcome::PodDeleted, now.mono, None)
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
        (Stage::SettingUpHold { netns, .. }, Input::HoldFailed(why)) => {
            fail_open(s, fx, netns, format!("startup hold failed: {why}"))
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
                release(fx, netns, HoldOutcome::Ready, started, Some(now.mono))
            } else {
                fx.push(Effect::Schedule(
                    Timer::ReadinessPoll,
                    now.mono
                        + next_check_after(
                            seen,
                            s.ready_poll,
                            s.pod.as_ref().is_some_and(PodFacts::proxy_running),
                        ),
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
            release(fx, netns, HoldOutcome::Deadline, started, None)
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
            _ => release(fx, netns, HoldOutcome::PodDeleted, started, None),
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
            after_hold(fx, s, netns)
        }
        (Stage::Releasing { netns, .. }, Input::ReleaseFailed(why)) => {
            fail_open(s, fx, netns, format!("releasing the hold failed: {why}"))
        }
        (st @ Stage::Releasing { .. }, _) => st,
        (st, _) => st,
    }
}

/// The hold could not be set up or released: remove whatever is left of it and go on as
/// without the agent (fail open), saying why on the pod's row.
fn fail_open(s: &State, fx: &mut Vec<Effect>, netns: NetnsId, problem: String) -> Stage {
    fx.push(Effect::RemoveLeftoverHold);
    fx.push(Effect::Record(Outcome::HoldEnded {
        outcome: HoldOutcome::Failed,
        released: None,
        held_for: Duration::ZERO,
        timeout: s.pod.as_ref().map_or(Duration::ZERO, |p| p.hold_timeout),
    }));
    fx.push(Effect::Problem(problem));
    after_hold(fx, s, netns)
}
