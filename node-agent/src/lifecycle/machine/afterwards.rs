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
                let restarted = proxy_id.is_some() && now_id.as_ref() != proxy_id.as_ref();
                if restarted && p.app_may_run() {
                    // The proxy container restarted (OOM-kill...) while the app runs: hold the
                    // app's new connections again until the new Envoy is ready. The sandbox
                    // (and so the netns) may be new as well: look again.
                    proxy_starts_over(
                        s,
                        fx,
                        StepKind::ProxyGone,
                        "the proxy container restarted while the app runs",
                    );
                    fx.push(Effect::SetPhase(Phase::WaitingForNetns));
                    fx.push(Effect::LookForNetns);
                    s.fresh = Some(false);
                    s.proxy_restarted = true;
                    Stage::WaitingForNetns {
                        waiting_since: now.mono,
                        looked: false,
                        refused: Refused::Never,
                    }
                } else {
                    Stage::Running {
                        netns,
                        proxy_id: now_id.or(proxy_id),
                    }
                }
            }
        },
        // A process of the proxy (pilot-agent or Envoy) exited while the app runs (OOM-kill):
        // the kubelet restarts the proxy container after its back-off, and the Pod status says
        // so only with the kubelet's lag (PLEG relist, status sync). Check at once; Envoy gone
        // (`Down`) re-installs the hold in the same netns, released by the normal path when the
        // new Envoy is ready. Envoy still ready: back to `Running`. Re-checks are paced and
        // budgeted per pod (`proxy_gone.rs`): what makes them is the pod's.
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
        // The netns changed under the same uid (sandbox recreated): start over in the new one.
        (Stage::Running { netns, .. }, Input::NetnsFound { netns: new }) if new != netns => {
            proxy_starts_over(
                s,
                fx,
                StepKind::NetnsFound,
                "a new network namespace: the pod's sandbox was recreated",
            );
            s.fresh = Some(true);
            fx.push(Effect::CheckReadiness);
            Stage::Checking {
                netns: new,
                fresh: true,
                rehold: false,
            }
        }

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
        (st @ (Stage::JobWatch { .. } | Stage::Draining { .. }), _) => st,

        (Stage::Finished, Input::Pod(None)) => done_and_exit(fx),
        (st, _) => st,
    }
}
