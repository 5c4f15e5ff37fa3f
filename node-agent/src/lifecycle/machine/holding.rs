//! The startup hold: set up, held until the proxy is ready (or the deadline, or the pod's
//! deletion), released; failures fail open.
//!
//! `step` hands each stage to its own function; each names every input it ignores.

use super::*;

pub(super) fn step(
    s: &mut State,
    stage: Stage,
    input: Input,
    now: Now,
    fx: &mut Vec<Effect>,
) -> Stage {
    match stage {
        Stage::SettingUpHold { netns, rehold } => setting_up_hold(s, netns, rehold, input, now, fx),
        Stage::Holding {
            netns,
            started,
            pass_through,
        } => holding(s, netns, started, pass_through, input, now, fx),
        Stage::Releasing {
            netns,
            outcome,
            started,
        } => releasing(s, netns, outcome, started, input, now, fx),
        // Not this part's stages (`machine::step` routes them to `startup` and `afterwards`).
        st @ (Stage::WaitingForNetns { .. }
        | Stage::Checking { .. }
        | Stage::Running { .. }
        | Stage::JobWatch { .. }
        | Stage::Draining { .. }
        | Stage::Finished
        | Stage::Exited) => ignored(fx, st, &input),
    }
}

/// The hold is being installed: its answer (in, failed, or the netns gone) decides.
fn setting_up_hold(
    s: &mut State,
    netns: NetnsId,
    rehold: bool,
    input: Input,
    now: Now,
    fx: &mut Vec<Effect>,
) -> Stage {
    let this_stage = Stage::SettingUpHold { netns, rehold };
    match input {
        Input::HoldSetUp {
            adopted,
            app_running,
            age,
        } => {
            // Late: a fresh hold (not adopted, not after the proxy's exit, where the app runs
            // by design) that went in after the app had started: its first connections may
            // have gone before the hold.
            let late = !adopted && !rehold && app_running;
            hold_set_up(s, netns, adopted, late, age, now, fx)
        }
        Input::HoldFailed(why) => fail_open(s, fx, netns, format!("startup hold failed: {why}")),
        // The netns has no process of the pod left (the sandbox died before the hold went
        // in): nothing installed; wait for the pod's next netns.
        Input::NetnsGone => look_again_for_netns(
            s,
            fx,
            now,
            StepKind::ProxyGone,
            "the pod's network namespace has no process left: its sandbox is being recreated",
        ),
        // The driver answers `InstallHold` before it reads anything else (its answers are fed
        // first), so no other input reaches this stage but the agent stopping and a broken
        // bound (both in `machine::step`); a pod update's facts are kept in `s.pod` and read
        // at `HoldSetUp` (a deletion releases at once).
        input @ (Input::Pod(_)
        | Input::NetnsNotYet
        | Input::NetnsFound { .. }
        | Input::NetnsRefused(_)
        | Input::Readiness(_)
        | Input::HoldReleased(_)
        | Input::ReleaseFailed(_)
        | Input::QuitStarted
        | Input::JobFinished(_)
        | Input::DrainFinished(_)
        | Input::Timer(_)
        | Input::ProxyGone) => ignored(fx, this_stage, &input),
        input @ (answered_for_every_stage!()) => ignored(fx, this_stage, &input),
    }
}

/// The hold is in: held until the proxy is ready or the deadline — unless the agent stops,
/// the pod was failed open or is being deleted meanwhile.
fn hold_set_up(
    s: &State,
    netns: NetnsId,
    adopted: bool,
    late: bool,
    age: Duration,
    now: Now,
    fx: &mut Vec<Effect>,
) -> Stage {
    let timeout = s.pod.as_ref().map_or(Duration::ZERO, |p| p.hold_timeout);
    // An adopted hold began before this agent: its deadline counts from its start.
    let started = now.mono.checked_sub(age).unwrap_or(now.mono);
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
        fx.push(Effect::Schedule(Timer::HoldDeadline, started + timeout));
        fx.push(Effect::CheckReadiness);
        Stage::Holding {
            netns,
            started,
            pass_through: pass,
        }
    }
}

/// The hold is in force: released when the proxy is ready, at the deadline, when the pod is
/// deleted or its sandbox goes.
fn holding(
    s: &mut State,
    netns: NetnsId,
    started: Instant,
    was: bool,
    input: Input,
    now: Now,
    fx: &mut Vec<Effect>,
) -> Stage {
    let this_stage = Stage::Holding {
        netns,
        started,
        pass_through: was,
    };
    match input {
        Input::Readiness(seen) => {
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
                this_stage
            }
        }
        Input::Timer(Timer::ReadinessPoll) => {
            fx.push(Effect::CheckReadiness);
            this_stage
        }
        Input::Timer(Timer::HoldDeadline) => {
            release(fx, netns, HoldOutcome::Deadline, started, None)
        }
        Input::Pod(Some(p)) if p.deletion.is_none() => held_pod(s, netns, started, was, &p, fx),
        Input::Pod(_) => release(fx, netns, HoldOutcome::PodDeleted, started, None),
        // The look after a restart: the hold's netns is still the pod's, or none is there yet
        // (a moment of the runtime): the hold stands.
        input @ Input::NetnsFound { netns: found } if found == netns => {
            ignored(fx, this_stage, &input)
        }
        input @ Input::NetnsRefused(_) => ignored(fx, this_stage, &input),
        // Another netns, or no process of the pod in any (the sandbox died): the hold is in a
        // dead netns. Release it there and hold in the pod's new one.
        Input::NetnsFound { .. } | Input::NetnsNotYet => {
            release(fx, netns, HoldOutcome::SandboxGone, started, None)
        }
        // --- ignored here, each by name --------------------------------------------------
        // Readiness, its timers, pod updates and the look above are handled; the rest (a
        // stray `ProxyGone` or executor answer) cannot concern a hold.
        input @ (Input::Timer(Timer::NetnsPoll | Timer::ProxyRecheck | Timer::JobWatchRetry)
        | Input::HoldSetUp { .. }
        | Input::NetnsGone
        | Input::HoldFailed(_)
        | Input::HoldReleased(_)
        | Input::ReleaseFailed(_)
        | Input::QuitStarted
        | Input::JobFinished(_)
        | Input::DrainFinished(_)
        | Input::ProxyGone) => ignored(fx, this_stage, &input),
        input @ (answered_for_every_stage!()) => ignored(fx, this_stage, &input),
    }
}

/// A pod update while held, the pod not deleted: the pass-through set as it says, and a
/// look for the netns if its containers restarted.
fn held_pod(
    s: &mut State,
    netns: NetnsId,
    started: Instant,
    was: bool,
    p: &PodFacts,
    fx: &mut Vec<Effect>,
) -> Stage {
    let pass = pass_through(p);
    if pass != was {
        fx.push(Effect::SetPassThrough(pass));
    }
    if std::mem::take(&mut s.containers_restarted) {
        // Containers restarted while held: in the same netns (an in-place restart, the
        // proxy's restart) the hold stands; in a new one (a recreated sandbox) it must move.
        // Look.
        fx.push(Effect::LookForNetns);
    }
    Stage::Holding {
        netns,
        started,
        pass_through: pass,
    }
}

/// The hold is being released: its answer records how it ended, then the pod goes on.
fn releasing(
    s: &mut State,
    netns: NetnsId,
    outcome: HoldOutcome,
    started: Instant,
    input: Input,
    now: Now,
    fx: &mut Vec<Effect>,
) -> Stage {
    let this_stage = Stage::Releasing {
        netns,
        outcome,
        started,
    };
    match input {
        // Released from a dead netns (the sandbox went): hold in the pod's new one.
        Input::HoldReleased(released)
            if outcome == HoldOutcome::SandboxGone && !s.stopping && !s.deleting() =>
        {
            fx.push(Effect::Record(Outcome::HoldEnded {
                outcome: HoldOutcome::SandboxGone,
                released: Some(released),
                held_for: now.mono.saturating_duration_since(started),
                timeout: s.pod.as_ref().map_or(Duration::ZERO, |p| p.hold_timeout),
            }));
            look_again_for_netns(
                s,
                fx,
                now,
                StepKind::ProxyGone,
                "the held network namespace went away: the pod's sandbox was recreated",
            )
        }
        Input::HoldReleased(released) => {
            fx.push(Effect::Record(Outcome::HoldEnded {
                outcome,
                released: Some(released),
                held_for: now.mono.saturating_duration_since(started),
                timeout: s.pod.as_ref().map_or(Duration::ZERO, |p| p.hold_timeout),
            }));
            after_hold(fx, s, netns)
        }
        Input::ReleaseFailed(why) => {
            fail_open(s, fx, netns, format!("releasing the hold failed: {why}"))
        }
        // --- ignored here, each by name --------------------------------------------------
        // As for `SettingUpHold`: the release's answer comes first; pod facts are kept.
        input @ (Input::Pod(_)
        | Input::NetnsNotYet
        | Input::NetnsFound { .. }
        | Input::NetnsRefused(_)
        | Input::Readiness(_)
        | Input::HoldSetUp { .. }
        | Input::NetnsGone
        | Input::HoldFailed(_)
        | Input::QuitStarted
        | Input::JobFinished(_)
        | Input::DrainFinished(_)
        | Input::Timer(_)
        | Input::ProxyGone) => ignored(fx, this_stage, &input),
        input @ (answered_for_every_stage!()) => ignored(fx, this_stage, &input),
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
