//! The pod's start, before any hold: waiting for its network namespace (backing off while
//! none of its processes is there), then one readiness look that decides whether to hold.
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
        Stage::WaitingForNetns {
            waiting_since,
            looked,
            refused,
        } => waiting_for_netns(s, waiting_since, looked, refused, input, now, fx),
        Stage::Checking {
            netns,
            fresh,
            rehold,
        } => checking(s, netns, fresh, rehold, input, fx),
        // Not this part's stages (`machine::step` routes them to `holding` and `afterwards`).
        st @ (Stage::SettingUpHold { .. }
        | Stage::Holding { .. }
        | Stage::Releasing { .. }
        | Stage::Running { .. }
        | Stage::JobWatch { .. }
        | Stage::Draining { .. }
        | Stage::Finished
        | Stage::Exited) => ignored(fx, st, &input),
    }
}

/// No process of the pod yet: follow its updates, look for its netns, back off while none is
/// usable.
fn waiting_for_netns(
    s: &mut State,
    waiting_since: Instant,
    looked: bool,
    refused: Refused,
    input: Input,
    now: Now,
    fx: &mut Vec<Effect>,
) -> Stage {
    let this_stage = Stage::WaitingForNetns {
        waiting_since,
        looked,
        refused,
    };
    match input {
        Input::Pod(Some(p)) => {
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
                    refused,
                }
            }
        }
        Input::Pod(None) => done_and_exit(fx),
        Input::NetnsNotYet => {
            s.fresh.get_or_insert(true);
            look_again(fx, now, waiting_since, refused)
        }
        Input::NetnsRefused(why) => {
            s.fresh.get_or_insert(false);
            let refused = refused_again(refused, &why, now, fx);
            look_again(fx, now, waiting_since, refused)
        }
        Input::Timer(Timer::NetnsPoll) if looked => {
            fx.push(Effect::LookForNetns);
            Stage::WaitingForNetns {
                waiting_since,
                looked: false,
                refused,
            }
        }
        Input::NetnsFound { netns } => netns_found(s, netns, fx),
        // --- ignored here, each by name --------------------------------------------------
        // A poll due while a look is out (the look's answer schedules the next), and answers
        // of stages the pod is not in.
        input @ (Input::Timer(_)
        | Input::Readiness(_)
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

/// The pod's processes showed a netns the agent must not use, once more. A refusal is often
/// a moment of the runtime (runc's `runc init` is in the pod's cgroup before it joins the
/// pod's netns): the row shows it only if it lasts.
fn refused_again(refused: Refused, why: &str, now: Now, fx: &mut Vec<Effect>) -> Refused {
    match refused {
        Refused::Never => Refused::Since(now.mono),
        Refused::Since(first)
            if now.mono.saturating_duration_since(first) >= REFUSAL_NOTED_AFTER =>
        {
            fx.push(Effect::Problem(format!(
                "cannot use the pod's network namespace yet: {why}"
            )));
            Refused::Noted
        }
        other => other,
    }
}

/// The pod's netns found: is it a new one (a recreated sandbox), then one readiness look.
fn netns_found(s: &mut State, netns: NetnsId, fx: &mut Vec<Effect>) -> Stage {
    let mut fresh = *s.fresh.get_or_insert(false);
    match s.last_netns.replace(netns) {
        Some(last) if last != netns => {
            // A new netns under the same uid: the sandbox was recreated, and the
            // new netns has nothing of a previous agent's to adopt.
            fresh = true;
            fx.push(Effect::Step(
                StepKind::NetnsFound,
                Some("a new network namespace: the pod's sandbox was recreated".into()),
            ));
        }
        _ => fx.push(Effect::Step(StepKind::NetnsFound, None)),
    }
    fx.push(Effect::CheckReadiness);
    // A proxy restart seen in the Pod status (before, or without, its process's exit)
    // is held like one seen on the pidfd: a native sidecar's too. In a new netns it is
    // the new sandbox's first start (for a native sidecar the kubelet's to order).
    let rehold = std::mem::take(&mut s.proxy_restarted) && !fresh;
    Stage::Checking {
        netns,
        fresh,
        rehold,
    }
}

/// The netns is known: one readiness observation decides whether to hold.
fn checking(
    s: &State,
    netns: NetnsId,
    fresh: bool,
    rehold: bool,
    input: Input,
    fx: &mut Vec<Effect>,
) -> Stage {
    let this_stage = Stage::Checking {
        netns,
        fresh,
        rehold,
    };
    match input {
        Input::Pod(None) => done_and_exit(fx),
        Input::Readiness(seen) => decide_hold(s, netns, fresh, rehold, seen, fx),
        // --- ignored here, each by name --------------------------------------------------
        // A pod update while checking: keep the check going (its answer reads the kept facts).
        input @ (Input::Pod(Some(_))
        | Input::NetnsNotYet
        | Input::NetnsFound { .. }
        | Input::NetnsRefused(_)
        | Input::Timer(_)
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

/// The readiness look while checking: hold, or not (and why not).
fn decide_hold(
    s: &State,
    netns: NetnsId,
    fresh: bool,
    rehold: bool,
    seen: Seen,
    fx: &mut Vec<Effect>,
) -> Stage {
    let pod = s.pod.clone();
    match (seen, pod) {
        (_, None) => done_and_exit(fx),
        (Seen::Ready, Some(p)) => {
            // Agent restart, or a pod found late: a ready proxy needs no hold.
            fx.push(Effect::RemoveLeftoverHold);
            enter_running(fx, netns, &p)
        }
        (_, Some(p)) if p.finished() => {
            fx.push(Effect::RemoveLeftoverHold);
            fx.push(Effect::SetPhase(Phase::Done));
            Stage::Finished
        }
        // Deleted, and Envoy's admin port answers: it is draining (a previous agent
        // began the drain, or pilot-agent did) — adopt the drain, whatever its
        // listeners say. `Starting` (admin up, a capture port closed) is also what a
        // drain looks like once Envoy's `--drain-time-s` has closed the inbound
        // listener: read as "never came up", the pod was marked done and Envoy lived
        // until pilot-agent's drain ran out (issue 28). An Envoy still starting is
        // drained as well: the drain quits it once the app is gone and nothing is in
        // flight, never later than pilot-agent would. Envoy down: nothing to drain.
        (Seen::Up | Seen::Live | Seen::Starting, Some(p)) if p.deletion.is_some() => {
            fx.push(Effect::RemoveLeftoverHold);
            start_drain(fx, netns)
        }
        (Seen::Down, Some(p)) if p.deletion.is_some() => {
            fx.push(Effect::RemoveLeftoverHold);
            fx.push(Effect::SetPhase(Phase::Done));
            Stage::Finished
        }
        // A native sidecar's first start is the kubelet's to order: it starts the app
        // only once the proxy's startup probe passed. Nothing to hold; follow the pod
        // (its proxy's restarts are held: `rehold`). Without a startup probe (Istio's
        // `values.global.proxy.startupProbe.enabled=false`) the kubelet starts the app
        // as soon as the sidecar's container has started (pkg/kubelet/kuberuntime
        // `computeInitContainerActions`: a restartable init container without a
        // startup probe counts as started once it runs): held like a classic start.
        (_, Some(p)) if p.native() && p.proxy_startup_probe && !rehold => {
            fx.push(Effect::RemoveLeftoverHold);
            enter_running(fx, netns, &p)
        }
        (_, Some(_)) => {
            fx.push(Effect::InstallHold { fresh, rehold });
            Stage::SettingUpHold { netns, rehold }
        }
    }
}

/// Nothing usable yet: look again after the backoff since the last pod update.
fn look_again(fx: &mut Vec<Effect>, now: Now, waiting_since: Instant, refused: Refused) -> Stage {
    fx.push(Effect::Schedule(
        Timer::NetnsPoll,
        now.mono + netns_poll_after(now.mono.saturating_duration_since(waiting_since)),
    ));
    Stage::WaitingForNetns {
        waiting_since,
        looked: true,
        refused,
    }
}
