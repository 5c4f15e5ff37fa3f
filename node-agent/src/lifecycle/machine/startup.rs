//! The pod's start, before any hold: waiting for its network namespace (backing off while
//! none of its processes is there), then one readiness look that decides whether to hold.

use super::*;

pub(super) fn step(
    s: &mut State,
    stage: Stage,
    input: Input,
    now: Now,
    fx: &mut Vec<Effect>,
) -> Stage {
    match (stage, input) {
        // --- waiting for the netns ---------------------------------------------------------
        (
            Stage::WaitingForNetns {
                refused, looked, ..
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
                    refused,
                }
            }
        }
        (Stage::WaitingForNetns { .. } | Stage::Checking { .. }, Input::Pod(None)) => {
            done_and_exit(fx)
        }
        (
            Stage::WaitingForNetns {
                waiting_since,
                refused,
                ..
            },
            Input::NetnsNotYet,
        ) => {
            s.fresh.get_or_insert(true);
            look_again(fx, now, waiting_since, refused)
        }
        (
            Stage::WaitingForNetns {
                waiting_since,
                refused,
                ..
            },
            Input::NetnsRefused(why),
        ) => {
            s.fresh.get_or_insert(false);
            // A refusal is often a moment of the runtime (runc's `runc init` is in the pod's
            // cgroup before it joins the pod's netns): the row shows it only if it lasts.
            let refused = match refused {
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
            };
            look_again(fx, now, waiting_since, refused)
        }
        (st @ Stage::WaitingForNetns { looked: true, .. }, Input::Timer(Timer::NetnsPoll)) => {
            fx.push(Effect::LookForNetns);
            match st {
                Stage::WaitingForNetns {
                    waiting_since,
                    refused,
                    ..
                } => Stage::WaitingForNetns {
                    waiting_since,
                    looked: false,
                    refused,
                },
                other => other,
            }
        }
        (Stage::WaitingForNetns { .. }, Input::NetnsFound { netns }) => {
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

        // --- deciding whether to hold ------------------------------------------------------
        (
            Stage::Checking {
                netns,
                fresh,
                rehold,
            },
            Input::Readiness(seen),
        ) => {
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

        // --- ignored here, each by name --------------------------------------------------
        // A poll due while a look is out (the look's answer schedules the next), and answers
        // of stages the pod is not in.
        (
            st @ Stage::WaitingForNetns { .. },
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
            | Input::ProxyGone),
        ) => ignored(fx, st, &input),
        // A pod update while checking: keep the check going (its answer reads the kept facts).
        (
            st @ Stage::Checking { .. },
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
            | Input::ProxyGone),
        ) => ignored(fx, st, &input),
        // Answered for every stage in `machine::step`, before the stage's part is asked.
        (
            st @ (Stage::WaitingForNetns { .. } | Stage::Checking { .. }),
            input @ (Input::OverBound(_)
            | Input::ChildOverBound { .. }
            | Input::HoldBroken(_)
            | Input::CannotLook(_)
            | Input::ExecutorNotStarted(_)
            | Input::AgentStop),
        ) => ignored(fx, st, &input),
        // Not this part's stages (`machine::step` routes them to `holding` and `afterwards`).
        (
            st @ (Stage::SettingUpHold { .. }
            | Stage::Holding { .. }
            | Stage::Releasing { .. }
            | Stage::Running { .. }
            | Stage::JobWatch { .. }
            | Stage::Draining { .. }
            | Stage::Finished
            | Stage::Exited),
            input,
        ) => ignored(fx, st, &input),
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
