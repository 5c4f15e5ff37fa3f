//! After the hold: the proxy is ready and the pod runs (a proxy restart holds again); the Job
//! watch and the drain run as executors and report here.
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
        Stage::Running { netns, proxy_id } => running(s, netns, proxy_id, input, now, fx),
        Stage::JobWatch { netns } => job_watch(s, netns, input, fx),
        Stage::Draining { netns } => draining(s, netns, input, fx),
        Stage::Finished => finished(s, input, now, fx),
        // `Exited` answers nothing (`machine::step` returns before any stage's part).
        st @ Stage::Exited => ignored(fx, st, &input),
        // Not this part's stages (`machine::step` routes them to `startup` and `holding`).
        st @ (Stage::WaitingForNetns { .. }
        | Stage::Checking { .. }
        | Stage::SettingUpHold { .. }
        | Stage::Holding { .. }
        | Stage::Releasing { .. }) => ignored(fx, st, &input),
    }
}

/// The proxy is ready; following the pod: its deletion (drain), its end, a restart of its
/// containers or its proxy (hold again), the proxy's processes going, a Job watch retried.
fn running(
    s: &mut State,
    netns: NetnsId,
    proxy_id: Option<String>,
    input: Input,
    now: Now,
    fx: &mut Vec<Effect>,
) -> Stage {
    match input {
        Input::Pod(None) => done_and_exit(fx),
        Input::Pod(Some(p)) if p.deletion.is_some() => start_drain(fx, netns),
        Input::Pod(Some(p)) if p.finished() => {
            fx.push(Effect::SetPhase(Phase::Done));
            Stage::Finished
        }
        Input::Pod(Some(p)) => running_pod(s, netns, proxy_id, &p, now, fx),
        // A process of the proxy (pilot-agent or Envoy) exited while the app runs (OOM-kill,
        // or the sandbox dying): the kubelet restarts the proxy container after its back-off
        // (or the whole sandbox), and the Pod status says so only with the kubelet's lag (PLEG
        // relist, status sync). Check at once in the pod's netns (a look first would cost tens
        // of milliseconds, each a refused call): Envoy gone (`Down`) re-installs the hold there,
        // released by the normal path when the new Envoy is ready. The driver then checks a
        // process of the pod is still in that netns: none (the sandbox died) is `NetnsGone`, and
        // the netns is looked up again, so the new sandbox's is found and held. Envoy still
        // ready: back to `Running`. Re-checks are paced and budgeted per pod (`proxy_gone.rs`):
        // what makes them is the pod's, and a deferred one comes back as `ProxyRecheck`.
        Input::ProxyGone | Input::Timer(Timer::ProxyRecheck) => match s.pod.clone() {
            Some(p) if p.deletion.is_none() && p.app_may_run() && !s.stopping => {
                proxy_gone::proxy_gone(s, fx, now, netns, proxy_id, &p)
            }
            _ => Stage::Running { netns, proxy_id },
        },
        // A Job watch that could not start, tried again (while the pod still needs one).
        Input::Timer(Timer::JobWatchRetry) => match &s.pod {
            Some(p) if p.is_job() && !p.native() && p.deletion.is_none() && !s.stopping => {
                fx.push(Effect::StartJobWatch);
                Stage::JobWatch { netns }
            }
            _ => Stage::Running { netns, proxy_id },
        },
        // --- ignored here, each by name --------------------------------------------------
        // Every pod update is handled above; the other inputs change nothing here.
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
        | Input::Timer(Timer::NetnsPoll | Timer::ReadinessPoll | Timer::HoldDeadline)) => {
            ignored(fx, Stage::Running { netns, proxy_id }, &input)
        }
        input @ (answered_for_every_stage!()) => {
            ignored(fx, Stage::Running { netns, proxy_id }, &input)
        }
    }
}

/// A pod update while running, the pod neither deleted nor finished: its containers or its
/// proxy restarted (look for the netns again and hold), or it runs on.
fn running_pod(
    s: &mut State,
    netns: NetnsId,
    proxy_id: Option<String>,
    p: &PodFacts,
    now: Now,
    fx: &mut Vec<Effect>,
) -> Stage {
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

/// A Job's app is watched (the executor quits the proxy once the app is done) and reports.
fn job_watch(s: &State, netns: NetnsId, input: Input, fx: &mut Vec<Effect>) -> Stage {
    match input {
        Input::JobFinished(report) => match report.outcome {
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
        Input::QuitStarted => {
            fx.push(Effect::SetPhase(Phase::Quitting));
            Stage::JobWatch { netns }
        }
        // --- ignored here, each by name --------------------------------------------------
        // The executor follows the pod itself and reports.
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
        | Input::ProxyGone) => ignored(fx, Stage::JobWatch { netns }, &input),
        // The other executor's answer.
        input @ Input::DrainFinished(_) => ignored(fx, Stage::JobWatch { netns }, &input),
        input @ (answered_for_every_stage!()) => ignored(fx, Stage::JobWatch { netns }, &input),
    }
}

/// The drain runs (the executor ends the proxy once nothing is in flight) and reports.
fn draining(s: &State, netns: NetnsId, input: Input, fx: &mut Vec<Effect>) -> Stage {
    match input {
        Input::QuitStarted => {
            fx.push(Effect::SetPhase(Phase::Quitting));
            Stage::Draining { netns }
        }
        Input::DrainFinished(report) => {
            let outcome = report.outcome;
            fx.push(Effect::Record(Outcome::Drain(report)));
            fx.push(Effect::SetPhase(Phase::Done));
            match outcome {
                DrainOutcome::AgentStopping | DrainOutcome::PodGone => exit(fx),
                _ if s.pod.is_none() || s.stopping => exit(fx),
                _ => Stage::Finished,
            }
        }
        // --- ignored here, each by name --------------------------------------------------
        // The executor follows the pod itself and reports.
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
        | Input::ProxyGone) => ignored(fx, Stage::Draining { netns }, &input),
        // The other executor's answer.
        input @ Input::JobFinished(_) => ignored(fx, Stage::Draining { netns }, &input),
        input @ (answered_for_every_stage!()) => ignored(fx, Stage::Draining { netns }, &input),
    }
}

/// Nothing more to do for the pod until it goes — or the kubelet runs it again.
fn finished(s: &mut State, input: Input, now: Now, fx: &mut Vec<Effect>) -> Stage {
    match input {
        Input::Pod(None) => done_and_exit(fx),
        // A container runs again under a new id, or every container restarts in place (a
        // Job's pod under a `RestartAllContainers` rule): the kubelet runs the pod again, so
        // the agent follows it again — unless it left the pod alone (a broken bound) or the
        // pod is being deleted.
        Input::Pod(Some(p))
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
        // --- ignored here, each by name --------------------------------------------------
        // Every other input changes nothing: the pod updates that matter are handled above
        // (the facts are kept).
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
        | Input::ProxyGone) => ignored(fx, Stage::Finished, &input),
        input @ (answered_for_every_stage!()) => ignored(fx, Stage::Finished, &input),
    }
}
