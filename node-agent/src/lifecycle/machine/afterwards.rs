//! After the hold: the proxy is ready and the pod runs (a proxy restart holds again); the Job
//! watch and the drain run as executors and report here.

use super::*;

pub(super) fn step(
    s: &mut State,
    stage: Stage,
    input: Input,
    now: Now,
    fx: &mut Vec<Effect>,
) -> Stage {
    match (stage, input) {
        // --- running: the proxy is ready ---------------------------------------------------
        (Stage::Running { netns, proxy_id }, Input::Pod(p)) => match p {
            None => done_and_exit(fx),
            Some(p) if p.deletion.is_some() => start_drain(fx, netns),
            Some(p) if p.finished() => {
                fx.push(Effect::SetPhase(Phase::Done));
                Stage::Finished
            }
            Some(p) => {
                let now_id = p.running_proxy().map(str::to_string);
                let proxy_went = proxy_id.is_some() && now_id.as_ref() != proxy_id.as_ref();
                if s.containers_restarted && !s.stopping {
                    // A container runs again under a new id (an app or proxy restart, a
                    // recreated sandbox, every container restarted in place): the netns may be
                    // new, and Envoy may not be ready. Look again; Envoy ready is no hold.
                    look_again_for_netns(
                        s,
                        fx,
                        now,
                        StepKind::ProxyGone,
                        "the pod's containers were restarted",
                    )
                } else if proxy_went && p.app_may_run() && !s.stopping {
                    // The proxy container restarted (OOM-kill...) while the app runs: hold the
                    // app's new connections again until the new Envoy is ready. The sandbox
                    // (and so the netns) may be new as well: look again.
                    look_again_for_netns(
                        s,
                        fx,
                        now,
                        StepKind::ProxyGone,
                        "the proxy container restarted while the app runs",
                    )
                } else if proxy_went && p.app_end() == crate::pod::AppEnd::Exited && !s.stopping {
                    // The proxy stopped, and the app too, but the kubelet will run them again
                    // (`restartPolicy: Always`, or a failure under `OnFailure`): a dying sandbox
                    // takes every container with it, and the kubelet's `SyncPod` reports them
                    // exited before it creates the new sandbox (pkg/kubelet/kubelet.go
                    // `SyncPod`: `SetPodStatus`, then the runtime's `SyncPod`, whose
                    // `computePodActions` kills the pod and creates a sandbox with attempt + 1,
                    // a new netns). Look for the netns now, not once the new app runs: the
                    // Pod status shows that only after the app started, and an app calling
                    // out at boot has been refused by then. The proxy's own exit may have
                    // been taken for nothing: on a real runtime the container's main process
                    // (pilot-agent) can go a few milliseconds before Envoy, whose exit then
                    // waits for the proxy-gone pace (`proxy_gone.rs`).
                    look_again_for_netns(
                        s,
                        fx,
                        now,
                        StepKind::ProxyGone,
                        "the proxy and the app stopped; the kubelet runs them again",
                    )
                } else {
                    Stage::Running {
                        netns,
                        proxy_id: now_id.or(proxy_id),
                    }
                }
            }
        },
        // A process of the proxy (pilot-agent or Envoy) exited while the app runs (OOM-kill,
        // or the sandbox dying): the kubelet restarts the proxy container after its back-off
        // (or the whole sandbox), and the Pod status says so only with the kubelet's lag (PLEG
        // relist, status sync). Check at once in the pod's netns (a look first would cost tens
        // of milliseconds, each a refused call): Envoy gone (`Down`) re-installs the hold there,
        // released by the normal path when the new Envoy is ready. The driver then checks a
        // process of the pod is still in that netns: none (the sandbox died) is `NetnsGone`, and
        // the netns is looked up again, so the new sandbox's is found and held. Envoy still
        // ready: back to `Running`. Re-checks are paced and budgeted per pod (`proxy_gone.rs`):
        // what makes them is the pod's.
        (Stage::Running { netns, proxy_id }, Input::ProxyGone) => match s.pod.clone() {
            Some(p) if p.deletion.is_none() && p.app_may_run() && !s.stopping => {
                proxy_gone::proxy_gone(s, fx, now, netns, proxy_id, &p)
            }
            _ => Stage::Running { netns, proxy_id },
        },
        (Stage::Running { netns, proxy_id }, Input::Timer(Timer::ProxyRecheck)) => {
            match s.pod.clone() {
                Some(p) if p.deletion.is_none() && p.app_may_run() && !s.stopping => {
                    proxy_gone::proxy_gone(s, fx, now, netns, proxy_id, &p)
                }
                _ => Stage::Running { netns, proxy_id },
            }
        }
        // A Job watch that could not start, tried again (while the pod still needs one).
        (Stage::Running { netns, proxy_id }, Input::Timer(Timer::JobWatchRetry)) => match &s.pod {
            Some(p) if p.is_job() && !p.native() && p.deletion.is_none() && !s.stopping => {
                fx.push(Effect::StartJobWatch);
                Stage::JobWatch { netns }
            }
            _ => Stage::Running { netns, proxy_id },
        },

        // --- executors ---------------------------------------------------------------------
        (Stage::JobWatch { netns }, Input::JobFinished(report)) => match report.outcome {
            JobOutcome::Completed | JobOutcome::ProxyAlreadyGone | JobOutcome::ProxyNotStopped => {
                fx.push(Effect::Record(Outcome::Job(report)));
                fx.push(Effect::SetPhase(Phase::Done));
                if s.stopping {
                    exit(fx)
                } else {
                    Stage::Finished
                }
            }
            _ if s.stopping => exit(fx),
            JobOutcome::NotAJob | JobOutcome::NotStarted => Stage::Running {
                netns,
                proxy_id: s
                    .pod
                    .as_ref()
                    .and_then(|p| p.running_proxy().map(str::to_string)),
            },
            JobOutcome::Deleting => start_drain(fx, netns),
            JobOutcome::PodGone => done_and_exit(fx),
            JobOutcome::AgentStopping => exit(fx),
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
                DrainOutcome::AgentStopping | DrainOutcome::PodGone => exit(fx),
                _ if s.pod.is_none() || s.stopping => exit(fx),
                _ => Stage::Finished,
            }
        }
        // The executors follow the pod themselves and report.
        (
            st @ (Stage::JobWatch { .. } | Stage::Draining { .. }),
            input @ (Input::Pod(_)
            | Input::NetnsNotYet
            | Input::NetnsFound { .. }
            | Input::NetnsRefused(_)
            | Input::Readiness(_)
            | Input::HoldSetUp { .. }
            | Input::NetnsGone
            | Input::HoldFailed(_)
            | Input::HoldReleased(_)
            | Input::ReleaseFailed(_)
            | Input::Timer(_)
            | Input::ProxyGone),
        ) => ignored(fx, st, &input),
        // The other executor's answer.
        (st @ Stage::JobWatch { .. }, input @ Input::DrainFinished(_))
        | (st @ Stage::Draining { .. }, input @ Input::JobFinished(_)) => ignored(fx, st, &input),

        (Stage::Finished, Input::Pod(None)) => done_and_exit(fx),
        // Finished, and a container runs again under a new id, or every container restarts in
        // place (a Job's pod under a `RestartAllContainers` rule): the kubelet runs the pod
        // again, so the agent follows it again — unless it left the pod alone (a broken bound)
        // or the pod is being deleted.
        (Stage::Finished, Input::Pod(Some(p)))
            if s.containers_restarted && !s.left_alone && !s.stopping && p.deletion.is_none() =>
        {
            look_again_for_netns(
                s,
                fx,
                now,
                StepKind::ProxyGone,
                "the kubelet runs the pod's containers again",
            )
        }
        // Every other input of `Finished` and `Running` changes nothing: `Running` handles
        // every pod update above, `Finished` the ones that matter (the facts are kept).
        (
            st @ Stage::Running { .. },
            input @ (Input::NetnsNotYet
            | Input::NetnsFound { .. }
            | Input::NetnsRefused(_)
            | Input::Readiness(_)
            | Input::HoldSetUp { .. }
            | Input::NetnsGone
            | Input::HoldFailed(_)
            | Input::HoldReleased(_)
            | Input::ReleaseFailed(_)
            | Input::QuitStarted
            | Input::JobFinished(_)
            | Input::DrainFinished(_)
            | Input::Timer(Timer::NetnsPoll | Timer::ReadinessPoll | Timer::HoldDeadline)),
        ) => ignored(fx, st, &input),
        (
            st @ Stage::Finished,
            input @ (Input::Pod(Some(_))
            | Input::NetnsNotYet
            | Input::NetnsFound { .. }
            | Input::NetnsRefused(_)
            | Input::Readiness(_)
            | Input::HoldSetUp { .. }
            | Input::NetnsGone
            | Input::HoldFailed(_)
            | Input::HoldReleased(_)
            | Input::ReleaseFailed(_)
            | Input::QuitStarted
            | Input::JobFinished(_)
            | Input::DrainFinished(_)
            | Input::Timer(_)
            | Input::ProxyGone),
        ) => ignored(fx, st, &input),
        // Answered for every stage in `machine::step`, before the stage's part is asked; and
        // `Exited` answers nothing (`machine::step` returns before any stage's part).
        (
            st @ (Stage::Running { .. }
            | Stage::JobWatch { .. }
            | Stage::Draining { .. }
            | Stage::Finished),
            input @ (Input::OverBound(_)
            | Input::ChildOverBound { .. }
            | Input::HoldBroken(_)
            | Input::CannotLook(_)
            | Input::ExecutorNotStarted(_)
            | Input::AgentStop),
        )
        | (st @ Stage::Exited, input) => ignored(fx, st, &input),
        // Not this part's stages (`machine::step` routes them to `startup` and `holding`).
        (
            st @ (Stage::WaitingForNetns { .. }
            | Stage::Checking { .. }
            | Stage::SettingUpHold { .. }
            | Stage::Holding { .. }
            | Stage::Releasing { .. }),
            input,
        ) => ignored(fx, st, &input),
    }
}
