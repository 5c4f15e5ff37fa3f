//! The machine's transition table: each case is a script of inputs and the effects each one
//! must produce (by kind), from a pod's first sighting to its end.

use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::jiff::Timestamp;

use super::proxy_gone::PROXY_GONE_BUDGET;
use super::*;
use crate::api::{DrainReport, FinishedBy, JobOutcome, JobReport};
use crate::lifecycle::drain::app_exit::{AppContainer, AppSnapshot};
use crate::lifecycle::drain::plan::DrainPlan;
use crate::lifecycle::facts::RestartPolicy;
use crate::pod::{AppEnd, ContainerState, Deletion, SidecarMode};

const POLL: Duration = Duration::from_millis(5);
const HOLD: Duration = Duration::from_secs(120);

fn ns(ino: u64) -> NetnsId {
    NetnsId { dev: 4, ino }
}

fn running(id: &str) -> (Option<String>, ContainerState) {
    (Some(id.into()), ContainerState::Running)
}

fn waiting() -> (Option<String>, ContainerState) {
    (None, ContainerState::Waiting)
}

fn terminated(id: &str, code: i32) -> (Option<String>, ContainerState) {
    (
        Some(id.into()),
        ContainerState::Terminated { exit_code: code },
    )
}

fn pod(policy: RestartPolicy) -> PodFacts {
    PodFacts {
        deletion: None,
        restart_policy: policy,
        apps: vec![running("app-1")],
        app_restarts: Vec::new(),
        proxy: Some(running("proxy-1")),
        user_init_running: false,
        hold_timeout: HOLD,
        terminal: false,
        mode: SidecarMode::Classic,
        restarting_in_place: false,
        proxy_startup_probe: false,
    }
}

fn deleted(mut p: PodFacts) -> PodFacts {
    p.deletion = Some(Deletion {
        timestamp: Timestamp::from_second(1_795_327_237).expect("timestamp"),
        grace: Duration::from_secs(30),
    });
    p
}

fn drain_report(outcome: DrainOutcome) -> Box<DrainReport> {
    Box::new(DrainReport::new(outcome, SystemTime::UNIX_EPOCH))
}

fn job_report(outcome: JobOutcome) -> Box<JobReport> {
    let mut r = JobReport::new(outcome);
    r.finished_by = Some(FinishedBy::Procfs);
    Box::new(r)
}

/// An effect as a short, comparable word.
fn kind(e: &Effect) -> String {
    match e {
        Effect::SetPhase(p) => format!("phase:{}", p.as_str()),
        Effect::LookForNetns => "look".into(),
        Effect::Schedule(t, _) => format!("timer:{t:?}"),
        Effect::CheckReadiness => "check".into(),
        Effect::RemoveLeftoverHold => "remove-leftover".into(),
        Effect::InstallHold { fresh, rehold } => {
            format!(
                "install(fresh={fresh}{})",
                if *rehold { ",rehold" } else { "" }
            )
        }
        Effect::SetPassThrough(on) => format!("pass-through:{on}"),
        Effect::ReleaseHold { ready_at } => format!("release(ready={})", ready_at.is_some()),
        Effect::LeaveHoldForSuccessor => "leave-hold".into(),
        Effect::RememberOverBound => "remember-over-bound".into(),
        Effect::StartJobWatch => "job-watch".into(),
        Effect::StartDrain => "drain".into(),
        Effect::Record(Outcome::HoldStarted { adopted, late }) => {
            format!("rec:hold-started(adopted={adopted},late={late})")
        }
        Effect::Record(Outcome::HoldEnded { outcome, .. }) => {
            format!("rec:hold-{}", outcome.as_str())
        }
        Effect::Record(Outcome::Drain(r)) => format!("rec:drain-{}", r.outcome.as_str()),
        Effect::Record(Outcome::Job(r)) => format!("rec:job-{}", r.outcome.as_str()),
        Effect::Record(Outcome::FailedOpen { .. }) => "rec:failed-open".into(),
        Effect::Problem(_) => "problem".into(),
        Effect::Step(k, _) => format!("step:{}", k.as_str()),
        Effect::Exit => "exit".into(),
        Effect::Ignored { stage, input } => format!("ignored:{stage}:{input}"),
    }
}

/// The effects' kinds but the timeline's steps (checked on their own, in
/// `timeline_steps_follow_the_pods_life`) and the inputs ignored (`an_ignored_input_is_said`):
/// the scripts below are about what the agent does.
fn acts(fx: &[Effect]) -> Vec<String> {
    fx.iter()
        .filter(|e| !matches!(e, Effect::Step(..) | Effect::Ignored { .. }))
        .map(kind)
        .collect()
}

struct Run {
    state: State,
    now: Instant,
}

impl Run {
    fn start(p: PodFacts, expect: &[&str]) -> Run {
        let now = Instant::now();
        let (state, fx) = State::new(
            p,
            POLL,
            Now {
                mono: now,
                wall: SystemTime::now(),
            },
        );
        assert_eq!(acts(&fx), expect, "start");
        Run { state, now }
    }

    fn feed(&mut self, input: Input) -> Vec<Effect> {
        let (state, fx) = step(
            self.state.clone(),
            input,
            Now {
                mono: self.now,
                wall: SystemTime::now(),
            },
        );
        self.state = state;
        fx
    }

    /// Feeds each input and checks the effects' kinds.
    fn script(&mut self, name: &str, steps: Vec<(Input, &[&str])>) {
        for (i, (input, expect)) in steps.into_iter().enumerate() {
            let what = format!("{name}: step {i} ({input:?})");
            let fx = self.feed(input);
            assert_eq!(acts(&fx), expect, "{what}");
        }
    }
}

const START: &[&str] = &["phase:waiting-for-netns", "look"];

/// Up to a held pod (fresh netns, proxy not up yet).
fn holding(p: PodFacts) -> Run {
    let mut r = Run::start(p, START);
    r.script(
        "to holding",
        vec![
            (Input::NetnsNotYet, &["timer:NetnsPoll"]),
            (Input::Timer(Timer::NetnsPoll), &["look"]),
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (Input::Readiness(Seen::Down), &["install(fresh=true)"]),
            (
                Input::HoldSetUp {
                    adopted: false,
                    app_running: false,
                    age: Duration::ZERO,
                },
                &[
                    "rec:hold-started(adopted=false,late=false)",
                    "phase:holding",
                    "timer:HoldDeadline",
                    "check",
                ],
            ),
            (Input::Readiness(Seen::Up), &["timer:ReadinessPoll"]),
            (Input::Timer(Timer::ReadinessPoll), &["check"]),
        ],
    );
    assert!(r.state.checks_readiness(), "a held pod is checked");
    r
}

/// While Envoy starts (its container runs, its admin port listens, or its capture ports listen
/// but it is not LIVE) the next check comes after a millisecond, not `ready_poll`: the release
/// follows readiness closely. Before the proxy container runs the cheap check keeps
/// `ready_poll`.
#[test]
fn checks_fast_while_envoy_starts() {
    let mut waiting_proxy = pod(RestartPolicy::Always);
    waiting_proxy.proxy = Some(waiting());
    let mut r = holding(waiting_proxy);
    let at = |fx: &[Effect]| {
        fx.iter().find_map(|e| match e {
            Effect::Schedule(Timer::ReadinessPoll, at) => Some(*at),
            _ => None,
        })
    };
    let fx = r.feed(Input::Readiness(Seen::Down));
    assert_eq!(at(&fx), Some(r.now + POLL), "{fx:?}");
    // The proxy container starts: Envoy follows at once.
    r.feed(Input::Pod(Some(pod(RestartPolicy::Always))));
    let fx = r.feed(Input::Readiness(Seen::Down));
    assert_eq!(at(&fx), Some(r.now + LIVE_WINDOW_POLL), "{fx:?}");
    let fx = r.feed(Input::Readiness(Seen::Starting));
    assert_eq!(at(&fx), Some(r.now + LIVE_WINDOW_POLL), "{fx:?}");
    let fx = r.feed(Input::Readiness(Seen::Up));
    assert_eq!(at(&fx), Some(r.now + LIVE_WINDOW_POLL), "{fx:?}");
    assert!(LIVE_WINDOW_POLL < POLL);
    // A ready_poll below the window's stays as asked.
    assert_eq!(
        next_check_after(Seen::Up, Duration::from_micros(500), true),
        Duration::from_micros(500)
    );
}

/// A pod that breaks a bound while held (an oversized admin answer, forged netlink): its hold is
/// released at once, as without the agent, and it is left alone from then on — no re-hold when
/// its proxy restarts, no drain, no Job quit.
/// Issue 28: the hold's NFQUEUE reader thread failed (nothing holds any more): the pod is
/// failed open at once — a `FailedOpen` record (row, Warning Event, counter), the hold released
/// as `failed` (its rules removed; the release reports the dead reader, and the leftover rules
/// are removed again) — and left alone, instead of a row saying `holding` until the deadline.
/// Issue 28: the hold's deadline is the pod's, not each agent's. An agent that adopts a hold
/// its predecessor installed 100 s ago (its rules say when) releases it 20 s later with a
/// 120 s timeout, so agents crash-looping one after another never hold a pod past it (before:
/// every adoption scheduled a whole new timeout). A hold adopted after its deadline is
/// released at once; a new hold gets the whole timeout.
#[test]
fn an_adopted_hold_keeps_its_first_deadline() {
    let adopt = |age: Duration| {
        let mut r = Run::start(pod(RestartPolicy::Always), START);
        r.script(
            "to the hold",
            vec![
                (Input::NetnsFound { netns: ns(1) }, &["check"]),
                (Input::Readiness(Seen::Down), &["install(fresh=false)"]),
            ],
        );
        let fx = r.feed(Input::HoldSetUp {
            adopted: true,
            app_running: false,
            age,
        });
        let deadline = fx.iter().find_map(|e| match e {
            Effect::Schedule(Timer::HoldDeadline, at) => Some(*at),
            _ => None,
        });
        (r, deadline.expect("a deadline"))
    };
    let (r, at) = adopt(Duration::from_secs(100));
    assert_eq!(at, r.now + HOLD - Duration::from_secs(100));
    let (mut r, at) = adopt(Duration::from_secs(500));
    assert!(at <= r.now, "past already: due at once");
    r.now = at.max(r.now);
    r.script(
        "the deadline",
        vec![(Input::Timer(Timer::HoldDeadline), &["release(ready=false)"])],
    );
    let (r, at) = adopt(Duration::ZERO);
    assert_eq!(at, r.now + HOLD);
}

#[test]
fn a_failed_holder_fails_the_pod_open_at_once() {
    let mut r = holding(pod(RestartPolicy::Always));
    let fx = r.feed(Input::HoldBroken(
        "NFQUEUE 15015: netlink I/O failed: EBADF".into(),
    ));
    assert_eq!(acts(&fx), ["rec:failed-open", "release(ready=false)"]);
    let why = fx.iter().find_map(|e| match e {
        Effect::Record(Outcome::FailedOpen { why }) => Some(why.clone()),
        _ => None,
    });
    assert!(
        why.as_deref()
            .is_some_and(|w| w.contains("queue reader stopped") && w.contains("EBADF")),
        "{why:?}"
    );
    r.script(
        "released",
        vec![
            (
                Input::ReleaseFailed("the holder thread failed".into()),
                &["remove-leftover", "rec:hold-failed", "problem"],
            ),
            (Input::Pod(Some(deleted(pod(RestartPolicy::Always)))), &[]),
            (Input::Pod(None), &["phase:done", "exit"]),
        ],
    );
    assert!(r.state.left_alone);
}

/// Issue 29: a command in the pod's namespace over its bounds (an `iptables` listing or release
/// a flooded table made too costly) fails the pod open and leaves it alone, and the namespace is
/// marked so that no agent runs such a command there again; an agent that finds the mark (a
/// successor) leaves the pod alone too, without marking it again, at whatever stage it learns
/// it.
#[test]
fn a_command_over_its_bounds_fails_the_pod_open_and_is_remembered() {
    let over = |remembered| {
        Input::ChildOverBound {
        why: "`iptables-restore` inside network namespace ... was stopped: it ran out of its 16 MiB of memory".into(),
        remembered,
    }
    };
    // The release meets a flooded table.
    let mut r = holding(pod(RestartPolicy::Always));
    r.script(
        "the release over its bounds",
        vec![
            (Input::Readiness(Seen::Ready), &["release(ready=true)"]),
            (over(false), &["remember-over-bound", "rec:failed-open"]),
            (
                Input::ReleaseFailed("over its bounds".into()),
                &["remove-leftover", "rec:hold-failed", "problem"],
            ),
            // The leftover's look is only the probe, which finds the mark: nothing more.
            (over(true), &[]),
            // Left alone: no drain on deletion.
            (Input::Pod(Some(deleted(pod(RestartPolicy::Always)))), &[]),
            (Input::Pod(None), &["phase:done", "exit"]),
        ],
    );
    assert!(r.state.left_alone);
    let mut r = holding(pod(RestartPolicy::Always));
    r.feed(Input::Readiness(Seen::Ready));
    let fx = r.feed(over(false));
    let why = fx.iter().find_map(|e| match e {
        Effect::Record(Outcome::FailedOpen { why }) => Some(why.clone()),
        _ => None,
    });
    assert!(
        why.as_deref()
            .is_some_and(|w| w.contains("broke its bounds") && w.contains("16 MiB")),
        "{why:?}"
    );

    // A successor: the proxy ready at its first look; removing a leftover finds the mark.
    let mut r = Run::start(pod(RestartPolicy::Always), START);
    r.script(
        "a successor meets the mark after the first look",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (
                Input::Readiness(Seen::Ready),
                &["remove-leftover", "phase:ready"],
            ),
            (over(true), &["rec:failed-open"]),
            (Input::Pod(Some(deleted(pod(RestartPolicy::Always)))), &[]),
            (Input::ProxyGone, &[]),
        ],
    );
    assert!(r.state.left_alone);

    // A successor adopting the hold finds the mark before it lists anything.
    let mut r = Run::start(pod(RestartPolicy::Always), START);
    r.script(
        "a successor meets the mark when it adopts",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (Input::Readiness(Seen::Down), &["install(fresh=false)"]),
            (over(true), &["rec:failed-open"]),
            (
                Input::HoldFailed("remembered".into()),
                &["remove-leftover", "rec:hold-failed", "problem"],
            ),
            (Input::Pod(Some(deleted(pod(RestartPolicy::Always)))), &[]),
        ],
    );
    assert!(r.state.left_alone);
}

#[test]
fn a_pod_over_a_bound_is_failed_open_and_left_alone() {
    let mut r = holding(pod(RestartPolicy::Always));
    r.script(
        "over a bound while holding",
        vec![
            (
                Input::OverBound("a 4 MiB answer".into()),
                &["rec:failed-open", "release(ready=false)"],
            ),
            (
                Input::HoldReleased(Released::default()),
                &["rec:hold-failed"],
            ),
            // Left alone: no drain on deletion, nothing on updates, done when gone.
            (Input::Pod(Some(deleted(pod(RestartPolicy::Always)))), &[]),
            (Input::ProxyGone, &[]),
            (Input::Pod(None), &["phase:done", "exit"]),
        ],
    );
    assert!(r.state.left_alone);

    // Over a bound at the first look (no hold yet): nothing is installed.
    let mut r = Run::start(pod(RestartPolicy::Always), START);
    r.script(
        "over a bound at the first look",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (
                Input::OverBound("forged".into()),
                &["rec:failed-open", "remove-leftover"],
            ),
            (Input::Pod(Some(pod(RestartPolicy::Always))), &[]),
            (Input::Timer(Timer::ReadinessPoll), &[]),
        ],
    );

    // While the hold is being set up: the hold's answer comes, then it is released.
    let mut r = Run::start(pod(RestartPolicy::Always), START);
    r.script(
        "over a bound while setting up",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (Input::Readiness(Seen::Down), &["install(fresh=false)"]),
            (Input::OverBound("forged".into()), &["rec:failed-open"]),
            (
                Input::HoldSetUp {
                    adopted: false,
                    app_running: false,
                    age: Duration::ZERO,
                },
                &[
                    "rec:hold-started(adopted=false,late=false)",
                    "phase:holding",
                    "release(ready=false)",
                ],
            ),
            (
                Input::HoldReleased(Released::default()),
                &["rec:hold-failed"],
            ),
        ],
    );
}

/// A held pod whose proxy turns ready: the hold released, the pod `Ready`.
fn ready(mut r: Run) -> Run {
    r.script(
        "to ready",
        vec![
            (Input::Readiness(Seen::Ready), &["release(ready=true)"]),
            (
                Input::HoldReleased(Released::default()),
                &["rec:hold-ready", "phase:ready"],
            ),
        ],
    );
    r
}

#[test]
fn hold_ready_drain_app_done() {
    let mut r = ready(holding(pod(RestartPolicy::Always)));
    r.script(
        "normal life",
        vec![
            (Input::Pod(Some(pod(RestartPolicy::Always))), &[]),
            (
                Input::Pod(Some(deleted(pod(RestartPolicy::Always)))),
                &["phase:draining", "drain"],
            ),
            (Input::QuitStarted, &["phase:quitting"]),
            (
                Input::DrainFinished(drain_report(DrainOutcome::AppDone)),
                &["rec:drain-app-done", "phase:done"],
            ),
            (Input::Pod(None), &["phase:done", "exit"]),
        ],
    );
}

#[test]
fn hold_deadline_releases_and_the_pod_runs_on() {
    let mut r = holding(pod(RestartPolicy::Always));
    r.script(
        "deadline",
        vec![
            (Input::Timer(Timer::HoldDeadline), &["release(ready=false)"]),
            // A late readiness answer changes nothing once releasing.
            (Input::Readiness(Seen::Ready), &[]),
            (
                Input::HoldReleased(Released::default()),
                &["rec:hold-deadline", "phase:ready"],
            ),
        ],
    );
}

/// A pod deleted while held: the hold is released, then its proxy is drained if its container
/// runs. The chaos soak (seed 1128, lifecycle 438) found the pod deleted while held after an
/// Envoy kill ran to its grace period (10 s) against 5 s without holdfast: the shipped mesh
/// config stretches pilot-agent's drain to the grace period because holdfast ends it. A proxy
/// container not running has nothing to drain; a pod object gone has nothing left to follow.
#[test]
fn pod_deleted_while_holding_releases_then_drains_a_running_proxy() {
    let mut r = holding(pod(RestartPolicy::Always));
    r.script(
        "deleted, the proxy container running",
        vec![
            (
                Input::Pod(Some(deleted(pod(RestartPolicy::Always)))),
                &["release(ready=false)"],
            ),
            (
                Input::HoldReleased(Released::default()),
                &["rec:hold-pod-deleted", "phase:draining", "drain"],
            ),
        ],
    );
    assert!(matches!(r.state.stage, Stage::Draining { .. }), "{r:?}");
    let not_running = PodFacts {
        proxy: Some(waiting()),
        ..pod(RestartPolicy::Always)
    };
    let mut r = holding(not_running.clone());
    r.script(
        "deleted, the proxy container not running",
        vec![
            (
                Input::Pod(Some(deleted(not_running))),
                &["release(ready=false)"],
            ),
            (
                Input::HoldReleased(Released::default()),
                &["rec:hold-pod-deleted", "phase:done"],
            ),
            (Input::Pod(None), &["phase:done", "exit"]),
        ],
    );
    let mut r = holding(pod(RestartPolicy::Always));
    r.script(
        "gone",
        vec![
            (Input::Pod(None), &["release(ready=false)"]),
            (
                Input::HoldReleased(Released::default()),
                &["rec:hold-pod-deleted", "phase:done", "exit"],
            ),
        ],
    );
}

#[test]
fn agent_stop_while_holding_leaves_the_rule_for_the_successor() {
    let mut r = holding(pod(RestartPolicy::Always));
    r.script(
        "stop",
        vec![
            (
                Input::AgentStop,
                &["leave-hold", "rec:hold-agent-stopped", "exit"],
            ),
            (Input::Readiness(Seen::Ready), &[]),
        ],
    );
}

#[test]
fn an_agent_started_during_a_deletion_adopts_the_drain() {
    for (seen, expect) in [
        // Envoy answers but is not ready: it is draining (a previous agent failed its health
        // check) — adopt the drain, never hold.
        (
            Seen::Up,
            &["remove-leftover", "phase:draining", "drain"][..],
        ),
        (
            Seen::Ready,
            &["remove-leftover", "phase:draining", "drain"][..],
        ),
        // Envoy's admin answers but its inbound listener is closed: Envoy's --drain-time-s
        // has passed in a drain begun before this agent started (issue 28) — adopt it, so
        // Envoy ends with the app, not when pilot-agent's drain runs out. (Before the fix: done.)
        (
            Seen::Starting,
            &["remove-leftover", "phase:draining", "drain"][..],
        ),
        // Nothing listens on Envoy's admin port: it never came up, or is gone.
        (Seen::Down, &["remove-leftover", "phase:done"][..]),
    ] {
        let mut r = Run::start(deleted(pod(RestartPolicy::Always)), START);
        r.script(
            "adopt",
            vec![
                // Not treated as gone: the netns is still looked for.
                (Input::NetnsFound { netns: ns(1) }, &["check"]),
                (Input::Readiness(seen), expect),
            ],
        );
    }
    // The deadline is the pod's (deletionTimestamp + grace), not "first seen + grace": two
    // agents seeing the same deletion 3 s apart plan the same deadline.
    let deletion = deleted(pod(RestartPolicy::Always))
        .deletion
        .expect("deletion");
    let stamp = crate::lifecycle::drain::plan::system_time(deletion.timestamp);
    let first = DrainPlan::new(deletion, stamp + Duration::from_millis(10));
    let successor = DrainPlan::new(deletion, stamp + Duration::from_secs(3));
    assert_eq!(first.deadline, successor.deadline);
    assert!(first.deadline.expect("deadline") < stamp + deletion.grace);
}

/// The driver's inputs when an agent starts 5 s into a drain, after Envoy's `--drain-time-s`
/// (3 s) closed the inbound listener (issue 28, `tests/tests/drain_late.rs`): the pod is
/// already deleted when first seen, its netns is found, the first readiness look sees Envoy's
/// admin port but not 15006 (`Starting`), pod updates follow as the app's container ends, and
/// the drain reports. The pod is drained, never marked done before the drain ended.
#[test]
fn a_drain_adopted_after_envoys_drain_time_replays_to_its_end() {
    let p = deleted(pod(RestartPolicy::Always));
    let mut r = Run::start(p.clone(), START);
    r.script(
        "agent restarted late in a drain",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (
                Input::Readiness(Seen::Starting),
                &["remove-leftover", "phase:draining", "drain"],
            ),
            // The kubelet's status updates during the drain go to the executor, not here.
            (Input::Pod(Some(p.clone())), &[]),
            (Input::QuitStarted, &["phase:quitting"]),
            (
                Input::DrainFinished(drain_report(DrainOutcome::AppDone)),
                &["rec:drain-app-done", "phase:done"],
            ),
            (Input::Pod(None), &["phase:done", "exit"]),
        ],
    );
}

#[test]
fn an_agent_started_during_a_job_adopts_the_wait() {
    let mut r = Run::start(pod(RestartPolicy::Never), START);
    r.script(
        "job adopted",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (
                Input::Readiness(Seen::Ready),
                &["remove-leftover", "phase:ready", "job-watch"],
            ),
            // Deleted during the wait: the Job executor hands over to the drain.
            (
                Input::JobFinished(job_report(JobOutcome::Deleting)),
                &["phase:draining", "drain"],
            ),
        ],
    );
}

#[test]
fn proxy_already_ready_needs_no_hold() {
    let mut r = Run::start(pod(RestartPolicy::Always), START);
    r.script(
        "ready",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (
                Input::Readiness(Seen::Ready),
                &["remove-leftover", "phase:ready"],
            ),
            (Input::AgentStop, &["exit"]),
        ],
    );
}

#[test]
fn jobs_by_restart_policy() {
    for (policy, after_ready) in [
        (
            RestartPolicy::Always,
            &["rec:hold-ready", "phase:ready"][..],
        ),
        (
            RestartPolicy::Never,
            &["rec:hold-ready", "phase:ready", "job-watch"][..],
        ),
        (
            RestartPolicy::OnFailure,
            &["rec:hold-ready", "phase:ready", "job-watch"][..],
        ),
    ] {
        let mut r = holding(pod(policy));
        r.script(
            "job",
            vec![
                (Input::Readiness(Seen::Ready), &["release(ready=true)"]),
                (Input::HoldReleased(Released::default()), after_ready),
            ],
        );
        if policy != RestartPolicy::Always {
            r.script(
                "job completes",
                vec![
                    (Input::QuitStarted, &["phase:quitting"]),
                    (
                        Input::JobFinished(job_report(JobOutcome::Completed)),
                        &["rec:job-completed", "phase:done"],
                    ),
                    // The proxy is gone: a later deletion is not drained.
                    (Input::Pod(Some(deleted(pod(policy)))), &[]),
                    (Input::Pod(None), &["phase:done", "exit"]),
                ],
            );
        }
    }
}

/// An app is finished only after it ran: a container still waiting (ContainerCreating, a slow
/// image pull) is never "gone", for the Job quit or the drain's early quit.
#[test]
fn an_app_that_never_started_is_not_finished() {
    let snapshot = |c: AppContainer| AppSnapshot {
        live: 0,
        containers: vec![("app".into(), c)],
    };
    for (c, done) in [
        (AppContainer::NotStarted, false),
        (AppContainer::Unseen, false),
        (AppContainer::Live { pids: 1 }, false),
        (AppContainer::Exited, true),
        (AppContainer::Terminated { exit_code: 0 }, true),
    ] {
        let s = snapshot(c.clone());
        assert_eq!(s.gone_for_drain(), done, "drain: {c:?}");
        assert_eq!(
            s.end(RestartPolicy::Never, |_| Default::default()) == AppEnd::ForGood,
            done,
            "job: {c:?}"
        );
    }
    // No app container at all is not "finished" either.
    let none = AppSnapshot {
        live: 0,
        containers: vec![],
    };
    assert!(
        !none.gone_for_drain()
            && none.end(RestartPolicy::Never, |_| Default::default()) == AppEnd::Running
    );

    // The machine itself never ends a waiting Job: only the executor's report does, and a pod
    // whose app waits is not "finished".
    let mut p = pod(RestartPolicy::Never);
    p.apps = vec![waiting()];
    assert!(!p.finished());
    let mut r = holding(p.clone());
    r.script(
        "app waits",
        vec![
            (Input::Readiness(Seen::Ready), &["release(ready=true)"]),
            (
                Input::HoldReleased(Released::default()),
                &["rec:hold-ready", "phase:ready", "job-watch"],
            ),
            (Input::Pod(Some(p.clone())), &[]),
            // Deleted before the app ever started: the drain runs; its executor quits early
            // only for an app that ran (above), so the deadline or the pod going ends it.
            (
                Input::JobFinished(job_report(JobOutcome::Deleting)),
                &["phase:draining", "drain"],
            ),
            (
                Input::DrainFinished(drain_report(DrainOutcome::PodGone)),
                &["rec:drain-pod-gone", "phase:done", "exit"],
            ),
        ],
    );
}

#[test]
fn proxy_gone_early_is_recorded_as_such() {
    let mut r = Run::start(deleted(pod(RestartPolicy::Always)), START);
    r.script(
        "proxy gone early",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (
                Input::Readiness(Seen::Ready),
                &["remove-leftover", "phase:draining", "drain"],
            ),
            (Input::AgentStop, &[]),
            (
                Input::DrainFinished(drain_report(DrainOutcome::ProxyGoneEarly)),
                &["rec:drain-proxy-gone-early", "phase:done", "exit"],
            ),
        ],
    );
}

#[test]
fn a_restarted_proxy_or_a_new_netns_is_held_again() {
    let ready = |r: &mut Run| {
        r.script(
            "ready",
            vec![
                (Input::NetnsFound { netns: ns(1) }, &["check"]),
                (
                    Input::Readiness(Seen::Ready),
                    &["remove-leftover", "phase:ready"],
                ),
            ],
        )
    };
    // The proxy container restarted (new id) while the app runs.
    let mut r = Run::start(pod(RestartPolicy::Always), START);
    ready(&mut r);
    let mut restarted = pod(RestartPolicy::Always);
    restarted.proxy = Some(waiting());
    r.script(
        "proxy restart",
        vec![
            (
                Input::Pod(Some(restarted)),
                &["phase:waiting-for-netns", "look"],
            ),
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            // A re-hold: the app runs by design, the hold is not "late".
            (
                Input::Readiness(Seen::Down),
                &["install(fresh=false,rehold)"],
            ),
        ],
    );
    // The sandbox was recreated under the same uid: the proxy's exit, no process of the pod
    // for a while, then a new netns.
    let mut r = Run::start(pod(RestartPolicy::Always), START);
    ready(&mut r);
    r.script(
        "new netns",
        vec![
            (Input::ProxyGone, &["check"]),
            (
                Input::Readiness(Seen::Down),
                &["install(fresh=false,rehold)"],
            ),
            (Input::NetnsGone, &["phase:waiting-for-netns", "look"]),
            (Input::NetnsNotYet, &["timer:NetnsPoll"]),
            (Input::Timer(Timer::NetnsPoll), &["look"]),
            (Input::NetnsFound { netns: ns(2) }, &["check"]),
            (Input::Readiness(Seen::Down), &["install(fresh=true)"]),
        ],
    );
}

#[test]
fn waiting_backs_off_and_a_pod_update_resets_it() {
    assert_eq!(netns_poll_after(Duration::ZERO), Duration::from_millis(5));
    assert_eq!(
        netns_poll_after(Duration::from_millis(999)),
        Duration::from_millis(5)
    );
    assert!(netns_poll_after(Duration::from_secs(2)) >= Duration::from_millis(20));
    assert_eq!(
        netns_poll_after(Duration::from_secs(60)),
        Duration::from_millis(500)
    );

    let mut r = Run::start(pod(RestartPolicy::Always), START);
    let scheduled = |fx: &[Effect], now: Instant| match fx {
        [Effect::Schedule(Timer::NetnsPoll, at)] => *at - now,
        other => panic!("expected one poll timer, got {other:?}"),
    };
    let fx = r.feed(Input::NetnsNotYet);
    assert_eq!(scheduled(&fx, r.now), Duration::from_millis(5));
    r.now += Duration::from_secs(30);
    r.feed(Input::Timer(Timer::NetnsPoll));
    let fx = r.feed(Input::NetnsNotYet);
    assert_eq!(scheduled(&fx, r.now), Duration::from_millis(500));
    // A pod update: look now, and poll fast again.
    let fx = r.feed(Input::Pod(Some(pod(RestartPolicy::Always))));
    assert_eq!(acts(&fx), ["look"]);
    let fx = r.feed(Input::NetnsNotYet);
    assert_eq!(scheduled(&fx, r.now), Duration::from_millis(5));
}

#[test]
fn a_finished_pod_is_not_waited_for() {
    let mut r = Run::start(pod(RestartPolicy::Never), START);
    let mut done = pod(RestartPolicy::Never);
    done.apps = vec![terminated("app-1", 0)];
    done.proxy = Some(terminated("proxy-1", 0));
    r.script(
        "finished",
        vec![
            (Input::NetnsNotYet, &["timer:NetnsPoll"]),
            (Input::Pod(Some(done)), &["phase:done"]),
            (Input::Timer(Timer::NetnsPoll), &[]),
            (Input::Pod(None), &["phase:done", "exit"]),
        ],
    );
    // An agent started after the pod completed: done at once, no netns search.
    let mut done = pod(RestartPolicy::Never);
    done.apps = vec![terminated("app-1", 0)];
    done.proxy = Some(terminated("proxy-1", 0));
    let mut r = Run::start(done, &["phase:done"]);
    r.script("gone", vec![(Input::Pod(None), &["phase:done", "exit"])]);
}

#[test]
fn held_packets_pass_while_init_containers_run() {
    let mut p = pod(RestartPolicy::Always);
    p.user_init_running = true;
    let mut r = Run::start(p.clone(), START);
    r.script(
        "init",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (Input::Readiness(Seen::Down), &["install(fresh=false)"]),
            (
                Input::HoldSetUp {
                    adopted: false,
                    app_running: true,
                    age: Duration::ZERO,
                },
                &[
                    "rec:hold-started(adopted=false,late=true)",
                    "phase:holding",
                    "pass-through:true",
                    "timer:HoldDeadline",
                    "check",
                ],
            ),
            (Input::Pod(Some(p.clone())), &[]),
            (
                Input::Pod(Some(pod(RestartPolicy::Always))),
                &["pass-through:false"],
            ),
        ],
    );
}

#[test]
fn a_lasting_netns_refusal_is_shown_once() {
    let mut r = Run::start(pod(RestartPolicy::Always), START);
    let refused = || Input::NetnsRefused("pid 7 is in the node's network namespace".into());
    r.script("first", vec![(refused(), &["timer:NetnsPoll"])]);
    r.now += REFUSAL_NOTED_AFTER;
    r.script(
        "still refused",
        vec![
            (Input::Timer(Timer::NetnsPoll), &["look"]),
            (refused(), &["problem", "timer:NetnsPoll"]),
            (Input::Timer(Timer::NetnsPoll), &["look"]),
            (refused(), &["timer:NetnsPoll"]),
        ],
    );
}

#[test]
fn a_failed_hold_fails_open() {
    let mut r = Run::start(pod(RestartPolicy::Always), START);
    r.script(
        "hold failed",
        vec![
            (Input::NetnsNotYet, &["timer:NetnsPoll"]),
            (Input::Timer(Timer::NetnsPoll), &["look"]),
            // A moment's refusal (runc init before it joins the netns) is not the row's.
            (
                Input::NetnsRefused("host netns".into()),
                &["timer:NetnsPoll"],
            ),
            (Input::Timer(Timer::NetnsPoll), &["look"]),
            (
                Input::NetnsRefused("host netns".into()),
                &["timer:NetnsPoll"],
            ),
            (Input::Timer(Timer::NetnsPoll), &["look"]),
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (Input::Readiness(Seen::Down), &["install(fresh=true)"]),
            (
                Input::HoldFailed("no NFQUEUE".into()),
                &[
                    "remove-leftover",
                    "rec:hold-failed",
                    "problem",
                    "phase:ready",
                ],
            ),
        ],
    );
}

#[test]
fn a_proxy_exit_while_ready_holds_again_until_the_new_envoy_is_ready() {
    let mut r = ready(holding(pod(RestartPolicy::Always)));
    r.script("first hold", vec![]);
    assert!(r.state.watches_proxy(), "a ready pod's proxy is watched");
    assert!(
        !r.state.checks_readiness(),
        "a ready pod keeps no readiness probe"
    );
    r.script(
        "proxy OOM-killed",
        vec![
            // Envoy's exit, seen on its pidfd before the Pod status says anything: checked at
            // once in the pod's netns.
            (Input::ProxyGone, &["check"]),
            (
                Input::Readiness(Seen::Down),
                &["install(fresh=false,rehold)"],
            ),
            (
                Input::HoldSetUp {
                    adopted: false,
                    app_running: true,
                    age: Duration::ZERO,
                },
                // A re-hold: the app runs by design, the hold is not late (the driver used to
                // decide this; the row fed it `late: true`, which the driver never sent).
                &[
                    "rec:hold-started(adopted=false,late=false)",
                    "phase:holding",
                    "timer:HoldDeadline",
                    "check",
                ],
            ),
            // The status catches up (back-off) while holding: nothing changes.
            (
                Input::Pod(Some(PodFacts {
                    proxy: Some(waiting()),
                    ..pod(RestartPolicy::Always)
                })),
                &[],
            ),
            (Input::Readiness(Seen::Down), &["timer:ReadinessPoll"]),
            (Input::Timer(Timer::ReadinessPoll), &["check"]),
            // The restarted Envoy is ready: the normal release.
            (Input::Readiness(Seen::Ready), &["release(ready=true)"]),
            (
                Input::HoldReleased(Released::default()),
                &["rec:hold-ready", "phase:ready"],
            ),
        ],
    );
    assert!(r.state.watches_proxy(), "the new proxy is watched again");

    // Some other process of the proxy container exited, Envoy still ready: no hold.
    let mut r = ready(holding(pod(RestartPolicy::Always)));
    r.script(
        "helper exit",
        vec![
            (Input::ProxyGone, &["check"]),
            (
                Input::Readiness(Seen::Ready),
                &["remove-leftover", "phase:ready"],
            ),
        ],
    );
    // Later (past the re-check pace of `proxy_gone.rs`) the sandbox dies and comes back (a new
    // netns) with Envoy not ready: no hold in the dead netns, a fresh hold in the new one, not a
    // re-hold.
    r.now += Duration::from_secs(2);
    r.script(
        "sandbox dies",
        vec![
            (Input::ProxyGone, &["check"]),
            (
                Input::Readiness(Seen::Down),
                &["install(fresh=false,rehold)"],
            ),
            (Input::NetnsGone, &["phase:waiting-for-netns", "look"]),
            (Input::NetnsFound { netns: ns(99) }, &["check"]),
            (Input::Readiness(Seen::Down), &["install(fresh=true)"]),
        ],
    );
}

/// The proxy's processes exiting again and again while Envoy stays ready (issue 29: the pod's
/// own pilot-agent forking children that exit, each one a re-check of readiness and the hold's
/// rules): the first is re-checked at once, the next waits for its spacing (the proxy not
/// watched meanwhile), and past the budget the pod is failed open and left alone — no hold, no
/// drain, as without holdfast. Before, every exit was a re-check at once, without end.
#[test]
fn proxy_gone_rechecks_are_paced_and_budgeted() {
    let mut r = ready(holding(pod(RestartPolicy::Always)));
    let back_to_ready = (
        Input::Readiness(Seen::Ready),
        &["remove-leftover", "phase:ready"][..],
    );
    r.script(
        "first exit",
        vec![(Input::ProxyGone, &["check"]), back_to_ready.clone()],
    );
    // 5 ms later the next exit: its re-check waits 1 s, and the proxy is not watched.
    r.now += Duration::from_millis(5);
    r.script(
        "too soon",
        vec![(Input::ProxyGone, &["timer:ProxyRecheck"])],
    );
    assert!(
        !r.state.watches_proxy(),
        "not watched while a re-check waits"
    );
    assert_eq!(
        r.state.stage,
        Stage::Running {
            netns: ns(1),
            proxy_id: Some("proxy-1".into())
        }
    );
    r.now += Duration::from_secs(1);
    r.script(
        "its time",
        vec![
            (Input::Timer(Timer::ProxyRecheck), &["check"]),
            back_to_ready.clone(),
        ],
    );
    assert!(r.state.watches_proxy(), "watched again");
    // As fast as the pace allows: ten re-checks in all, then the budget is spent.
    let mut rechecks = 2;
    loop {
        let fx = r.feed(Input::ProxyGone);
        match acts(&fx).as_slice() {
            [t] if t == "timer:ProxyRecheck" => {
                let at = fx
                    .iter()
                    .find_map(|e| match e {
                        Effect::Schedule(Timer::ProxyRecheck, at) => Some(*at),
                        _ => None,
                    })
                    .expect("when");
                r.now = at;
                let fx = r.feed(Input::Timer(Timer::ProxyRecheck));
                if acts(&fx) == ["check"] {
                    rechecks += 1;
                    assert_eq!(
                        acts(&r.feed(Input::Readiness(Seen::Ready))),
                        back_to_ready.1
                    );
                } else {
                    assert_eq!(acts(&fx), ["rec:failed-open"]);
                    break;
                }
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(rechecks, PROXY_GONE_BUDGET);
    assert!(r.state.left_alone && r.state.stage == Stage::Finished);
    assert!(!r.state.watches_proxy());
    // Left alone: its deletion is not drained, its end ends the task.
    r.script(
        "left alone",
        vec![
            (Input::ProxyGone, &[]),
            (Input::Pod(Some(deleted(pod(RestartPolicy::Always)))), &[]),
            (Input::Pod(None), &["phase:done", "exit"]),
        ],
    );

    // A deferred re-check whose moment comes after the pod moved on (the status showed the
    // proxy restarted meanwhile) does nothing there, and the watch comes back after.
    let mut r = ready(holding(pod(RestartPolicy::Always)));
    r.script(
        "first",
        vec![(Input::ProxyGone, &["check"]), back_to_ready.clone()],
    );
    r.script("second", vec![(Input::ProxyGone, &["timer:ProxyRecheck"])]);
    let mut restarted = pod(RestartPolicy::Always);
    restarted.proxy = Some(running("proxy-2"));
    r.script(
        "restart in the status",
        vec![
            (
                Input::Pod(Some(restarted)),
                &["phase:waiting-for-netns", "look"],
            ),
            (Input::Timer(Timer::ProxyRecheck), &[]),
        ],
    );
    assert!(!r.state.proxy_gone.deferred);
}

#[test]
fn a_proxy_exit_the_agent_caused_or_after_the_app_is_not_held() {
    // During a drain the agent itself ends Envoy: no hold, no watch.
    let mut r = ready(holding(pod(RestartPolicy::Always)));
    r.script(
        "drain",
        vec![
            (
                Input::Pod(Some(deleted(pod(RestartPolicy::Always)))),
                &["phase:draining", "drain"],
            ),
            (Input::QuitStarted, &["phase:quitting"]),
            (Input::ProxyGone, &[]),
        ],
    );
    assert!(!r.state.watches_proxy(), "no watch while draining");

    // A Job's proxy, ended by the agent once the app finished: no hold, no watch.
    let mut r = holding(pod(RestartPolicy::Never));
    r.script(
        "job",
        vec![
            (Input::Readiness(Seen::Ready), &["release(ready=true)"]),
            (
                Input::HoldReleased(Released::default()),
                &["rec:hold-ready", "phase:ready", "job-watch"],
            ),
            (Input::QuitStarted, &["phase:quitting"]),
            (Input::ProxyGone, &[]),
        ],
    );
    assert!(!r.state.watches_proxy(), "no watch during a Job watch");

    // The app has ended for good: nothing to hold for.
    let mut r = ready(holding(pod(RestartPolicy::Always)));
    r.script("app ended", vec![]);
    r.state.pod = Some(PodFacts {
        apps: vec![terminated("app-1", 0)],
        ..pod(RestartPolicy::Always)
    });
    r.script("app ended", vec![(Input::ProxyGone, &[])]);
}

/// The driver's two "cannot" answers are the machine's to decide (issue 24): no way to look at
/// the proxy means no hold — at the first look the pod just runs, with the reason on its row;
/// a hold in force is released as failed, never as `ready` — and an executor that cannot start
/// ends the drain as `not-started` (the pod runs on as without the agent), or returns a Job's
/// pod to `ready` with a `not-started` Job record.
#[test]
fn what_the_driver_cannot_do_the_machine_decides() {
    let mut r = Run::start(pod(RestartPolicy::Always), START);
    r.script(
        "cannot look at the first check",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (
                Input::CannotLook("no netns handle".into()),
                &["problem", "phase:ready"],
            ),
        ],
    );
    assert!(
        matches!(r.state.stage, Stage::Running { .. }),
        "{:?}",
        r.state.stage
    );

    let mut r = holding(pod(RestartPolicy::Always));
    r.script(
        "cannot look while holding",
        vec![
            (
                Input::CannotLook("no netns handle".into()),
                &["problem", "release(ready=false)"],
            ),
            (
                Input::HoldReleased(Released::default()),
                &["rec:hold-failed", "phase:ready"],
            ),
        ],
    );

    // The drain cannot start.
    let mut r = Run::start(pod(RestartPolicy::Always), START);
    r.script(
        "drain not started",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (
                Input::Readiness(Seen::Ready),
                &["remove-leftover", "phase:ready"],
            ),
            (
                Input::Pod(Some(deleted(pod(RestartPolicy::Always)))),
                &["phase:draining", "drain"],
            ),
            (
                Input::ExecutorNotStarted("no netns handle".into()),
                &["rec:drain-not-started", "phase:done"],
            ),
            (Input::Pod(None), &["phase:done", "exit"]),
        ],
    );

    // The Job watch cannot start: the pod is `ready` again, the watch is tried again a moment
    // later (before, it never was: the Job's proxy was never quit), a later deletion drains.
    let mut r = Run::start(pod(RestartPolicy::Never), START);
    r.script(
        "job watch not started",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (
                Input::Readiness(Seen::Ready),
                &["remove-leftover", "phase:ready", "job-watch"],
            ),
            (
                Input::ExecutorNotStarted("no netns handle".into()),
                &["rec:job-not-started", "phase:ready", "timer:JobWatchRetry"],
            ),
            (Input::Timer(Timer::JobWatchRetry), &["job-watch"]),
            (
                Input::ExecutorNotStarted("no netns handle".into()),
                &["rec:job-not-started", "phase:ready", "timer:JobWatchRetry"],
            ),
            (
                Input::Pod(Some(deleted(pod(RestartPolicy::Never)))),
                &["phase:draining", "drain"],
            ),
            // A retry due after the deletion starts nothing more.
            (Input::Timer(Timer::JobWatchRetry), &[]),
        ],
    );
}

/// A native sidecar as Istio injects it by default: with its startup probe.
fn native(p: PodFacts) -> PodFacts {
    PodFacts {
        mode: SidecarMode::Native,
        proxy_startup_probe: true,
        ..p
    }
}

/// A native pod's first start is the kubelet's to order (the app starts after the proxy's
/// startup probe): no hold, whatever Envoy's state at the first look. A proxy exit seen on its
/// pidfd while the app runs re-holds (the restart cover), with a problem on the row saying
/// the back-off is the kubelet's; the restarted Envoy ready releases it.
#[test]
fn a_native_pod_is_not_held_at_start_but_across_a_proxy_restart() {
    for seen in [Seen::Down, Seen::Starting, Seen::Up, Seen::Ready] {
        let mut r = Run::start(native(pod(RestartPolicy::Always)), START);
        r.script(
            "first start",
            vec![
                (Input::NetnsFound { netns: ns(1) }, &["check"]),
                (Input::Readiness(seen), &["remove-leftover", "phase:ready"]),
            ],
        );
    }
    let mut r = Run::start(native(pod(RestartPolicy::Always)), START);
    r.script(
        "restart cover",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (
                Input::Readiness(Seen::Starting),
                &["remove-leftover", "phase:ready"],
            ),
            (Input::ProxyGone, &["problem", "check"]),
            (
                Input::Readiness(Seen::Down),
                &["install(fresh=false,rehold)"],
            ),
            // The app runs, as it does by design after the proxy's exit: a re-hold, not late.
            (
                Input::HoldSetUp {
                    adopted: false,
                    app_running: true,
                    age: Duration::ZERO,
                },
                &[
                    "rec:hold-started(adopted=false,late=false)",
                    "phase:holding",
                    "timer:HoldDeadline",
                    "check",
                ],
            ),
            (Input::Readiness(Seen::Ready), &["release(ready=true)"]),
            (
                Input::HoldReleased(Released::default()),
                &["rec:hold-ready", "phase:ready"],
            ),
        ],
    );
    // The problem names the kubelet's back-off.
    let mut r = Run::start(native(pod(RestartPolicy::Always)), START);
    r.feed(Input::NetnsFound { netns: ns(1) });
    r.feed(Input::Readiness(Seen::Ready));
    let fx = r.feed(Input::ProxyGone);
    let problem = fx
        .iter()
        .find_map(|e| match e {
            Effect::Problem(m) => Some(m.clone()),
            _ => None,
        })
        .expect("a problem");
    assert!(
        problem.contains("native sidecar") && problem.contains("back-off"),
        "{problem}"
    );
    // The control: a classic pod's proxy exit re-holds without that problem.
    let mut r = Run::start(pod(RestartPolicy::Always), START);
    r.feed(Input::NetnsFound { netns: ns(1) });
    r.feed(Input::Readiness(Seen::Ready));
    let fx = r.feed(Input::ProxyGone);
    assert_eq!(
        fx.iter().map(kind).collect::<Vec<_>>(),
        ["step:proxy-gone", "check"]
    );
}

/// A native proxy's restart seen first in the Pod status (a new container id; the pidfd
/// missed it) is held as well: the re-look finds the same netns, and the hold goes in as a
/// re-hold. (Before, the re-look counted as a first start and a native pod was not held.)
#[test]
fn a_native_proxy_restart_seen_in_the_status_is_held() {
    let mut r = Run::start(native(pod(RestartPolicy::Always)), START);
    r.script(
        "first start",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (
                Input::Readiness(Seen::Ready),
                &["remove-leftover", "phase:ready"],
            ),
        ],
    );
    let mut restarted = native(pod(RestartPolicy::Always));
    restarted.proxy = Some(running("proxy-2"));
    r.script(
        "restart in the status",
        vec![
            (
                Input::Pod(Some(restarted)),
                &["phase:waiting-for-netns", "look"],
            ),
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (
                Input::Readiness(Seen::Down),
                &["install(fresh=false,rehold)"],
            ),
        ],
    );
    // The control: a new sandbox (the kubelet starts every container again, in order) is a
    // first start, not held.
    let mut r = Run::start(native(pod(RestartPolicy::Always)), START);
    r.feed(Input::NetnsFound { netns: ns(1) });
    r.feed(Input::Readiness(Seen::Ready));
    r.script(
        "new sandbox",
        vec![
            (Input::ProxyGone, &["problem", "check"]),
            (
                Input::Readiness(Seen::Down),
                &["install(fresh=false,rehold)"],
            ),
            (Input::NetnsGone, &["phase:waiting-for-netns", "look"]),
            (Input::NetnsNotYet, &["timer:NetnsPoll"]),
            (Input::Timer(Timer::NetnsPoll), &["look"]),
            (Input::NetnsFound { netns: ns(2) }, &["check"]),
            (
                Input::Readiness(Seen::Down),
                &["remove-leftover", "phase:ready"],
            ),
        ],
    );
}

/// A native sidecar's Job is the kubelet's (it stops the sidecars once the app is done): no Job
/// watch; a classic Job gets one (the control).
#[test]
fn a_native_job_gets_no_job_watch() {
    let mut r = Run::start(native(pod(RestartPolicy::OnFailure)), START);
    r.script(
        "native job",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (
                Input::Readiness(Seen::Ready),
                &["remove-leftover", "phase:ready"],
            ),
        ],
    );
    let mut r = Run::start(pod(RestartPolicy::OnFailure), START);
    r.script(
        "classic job",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (
                Input::Readiness(Seen::Ready),
                &["remove-leftover", "phase:ready", "job-watch"],
            ),
        ],
    );
}

/// A native pod's deletion runs the drain executor (which decides kubelet-ordered or ended on
/// evidence from the view); its outcomes are recorded as they come, a lost sidecar included,
/// and a proxy exit during termination is no restart to cover.
#[test]
fn a_native_deletion_records_kubelet_ordered_or_sidecar_lost() {
    for outcome in [DrainOutcome::KubeletOrdered, DrainOutcome::SidecarLost] {
        let mut r = Run::start(native(pod(RestartPolicy::Always)), START);
        r.feed(Input::NetnsFound { netns: ns(1) });
        r.feed(Input::Readiness(Seen::Ready));
        let rec = format!("rec:drain-{}", outcome.as_str());
        r.script(
            "deletion",
            vec![
                (
                    Input::Pod(Some(deleted(native(pod(RestartPolicy::Always))))),
                    &["phase:draining", "drain"],
                ),
                (Input::ProxyGone, &[]),
                (
                    Input::DrainFinished(drain_report(outcome)),
                    &[rec.as_str(), "phase:done"],
                ),
                (Input::Pod(None), &["phase:done", "exit"]),
            ],
        );
    }
}

/// The timeline's steps as the machine marks them, in order over a pod's life: the proxy
/// container running, the netns found, each readiness level once per start of the proxy (a
/// look that sees an earlier level again adds nothing), the drain started; a proxy restart
/// starts the levels over.
#[test]
fn timeline_steps_follow_the_pods_life() {
    let steps = |fx: &[Effect]| -> Vec<String> {
        fx.iter()
            .filter(|e| matches!(e, Effect::Step(..)))
            .map(kind)
            .collect()
    };
    let mut waiting_proxy = pod(RestartPolicy::Always);
    waiting_proxy.proxy = Some(waiting());
    let mut r = Run::start(waiting_proxy, START);
    let mut seen = Vec::new();
    for input in [
        Input::NetnsFound { netns: ns(1) },
        Input::Readiness(Seen::Down),
        Input::HoldSetUp {
            adopted: false,
            app_running: false,
            age: Duration::ZERO,
        },
        Input::Pod(Some(pod(RestartPolicy::Always))),
        Input::Readiness(Seen::Starting),
        Input::Readiness(Seen::Up),
        Input::Readiness(Seen::Starting),
        Input::Readiness(Seen::Live),
        Input::Readiness(Seen::Live),
        Input::Readiness(Seen::Ready),
    ] {
        seen.extend(steps(&r.feed(input)));
    }
    assert_eq!(
        seen,
        [
            "step:netns-found",
            "step:proxy-running",
            "step:envoy-started",
            "step:envoy-listening",
            "step:envoy-live",
            "step:proxy-ready",
        ]
    );
    // Released, running; the proxy restarts: its levels are marked again.
    r.feed(Input::HoldReleased(Released::default()));
    assert_eq!(
        steps(&r.feed(Input::ProxyGone)),
        ["step:proxy-gone"],
        "{:?}",
        r.state.stage
    );
    assert_eq!(
        steps(&r.feed(Input::Readiness(Seen::Ready))),
        ["step:proxy-ready"]
    );
    // Deleted: the drain's start is a step.
    let fx = r.feed(Input::Pod(Some(deleted(pod(RestartPolicy::Always)))));
    assert_eq!(steps(&fx), ["step:drain-started"], "{fx:?}");
    // A pod first seen with its proxy already running says so.
    let (_, fx) = State::new(
        pod(RestartPolicy::Always),
        POLL,
        Now {
            mono: Instant::now(),
            wall: SystemTime::now(),
        },
    );
    assert_eq!(steps(&fx), ["step:proxy-running"]);
}

/// "Finished" is the kubelet's "will run nothing of it again" (issue 28): an exited app of a
/// `restartPolicy: Always` pod (its sandbox being recreated kills every container) or a failed
/// one under `OnFailure` is not finished; every container ended for good is; a pod whose
/// containers all restart in place (KEP-5532) is not, whatever its policy.
#[test]
fn finished_only_when_the_kubelet_runs_nothing_again() {
    let with = |policy, app: (Option<String>, ContainerState), proxy| PodFacts {
        apps: vec![app],
        proxy: Some(proxy),
        ..pod(policy)
    };
    for (p, want) in [
        // Every container killed with its sandbox: the kubelet starts them all again.
        (
            with(
                RestartPolicy::Always,
                terminated("app-1", 137),
                terminated("proxy-1", 137),
            ),
            false,
        ),
        (
            with(
                RestartPolicy::Always,
                terminated("app-1", 0),
                terminated("proxy-1", 0),
            ),
            false,
        ),
        (
            with(
                RestartPolicy::OnFailure,
                terminated("app-1", 1),
                terminated("proxy-1", 0),
            ),
            false,
        ),
        // OnFailure: the app succeeded but the proxy failed: the kubelet restarts the proxy.
        (
            with(
                RestartPolicy::OnFailure,
                terminated("app-1", 0),
                terminated("proxy-1", 137),
            ),
            false,
        ),
        (
            with(
                RestartPolicy::OnFailure,
                terminated("app-1", 0),
                terminated("proxy-1", 0),
            ),
            true,
        ),
        (
            with(
                RestartPolicy::Never,
                terminated("app-1", 1),
                terminated("proxy-1", 137),
            ),
            true,
        ),
        // The app done, the proxy still up (a Job before its proxy is quit).
        (
            with(
                RestartPolicy::Never,
                terminated("app-1", 0),
                running("proxy-1"),
            ),
            false,
        ),
        // Restarting in place: not finished even under Never.
        (
            PodFacts {
                restarting_in_place: true,
                ..with(
                    RestartPolicy::Never,
                    terminated("app-1", 42),
                    terminated("proxy-1", 0),
                )
            },
            false,
        ),
        // A terminal phase is finished whatever the statuses say.
        (
            PodFacts {
                terminal: true,
                ..pod(RestartPolicy::Always)
            },
            true,
        ),
    ] {
        assert_eq!(p.finished(), want, "{p:?}");
    }
    // The machine: a running pod whose containers all ended, but the kubelet will restart
    // them, stays followed (before, it went `Finished` and was never held again): its netns is
    // looked for again, as the kubelet may recreate the sandbox (see
    // `replay_a_recreated_sandbox_on_containerd_is_held_before_its_app_starts`).
    let mut r = ready(holding(pod(RestartPolicy::Always)));
    r.script(
        "all killed",
        vec![(
            Input::Pod(Some(with(
                RestartPolicy::Always,
                terminated("app-1", 137),
                terminated("proxy-1", 137),
            ))),
            &["phase:waiting-for-netns", "look"],
        )],
    );
    assert!(
        matches!(r.state.stage, Stage::WaitingForNetns { .. }),
        "{r:?}"
    );
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.state.stage)
    }
}

/// The pod's status after its sandbox was recreated: every container a new id, the app
/// running, the proxy not yet (the new Envoy is late), restartCount + 1.
fn recreated(policy: RestartPolicy) -> PodFacts {
    PodFacts {
        apps: vec![running("app-2")],
        proxy: Some((Some("proxy-2".into()), ContainerState::Waiting)),
        ..pod(policy)
    }
}

/// A recreated sandbox, as the driver fed it in tests/tests/hold_lifecycle.rs
/// `a_recreated_sandbox_is_held_in_its_new_netns` (recorded with
/// `HOLDFAST_LOG=info,holdfast::inputs=debug`; readiness polls and repeated inputs left out):
/// the proxy's process exits (the kubelet kills every container), the check in the old netns
/// sees Envoy's sockets not yet closed (`Up`), the hold is taken out at once because no process
/// of the pod is left in that netns (`NetnsGone`), the status shows the proxy, then every container,
/// ended, the new sandbox's netns appears: held there, and released when the new Envoy is
/// ready. Before, the hold went into the old, dead netns and the new one was never looked at.
#[test]
fn replay_a_recreated_sandbox_is_held_in_its_new_netns() {
    let mut r = ready(holding(pod(RestartPolicy::Always)));
    let killed = |app: (Option<String>, ContainerState)| PodFacts {
        apps: vec![app],
        proxy: Some(terminated("proxy-1", 137)),
        ..pod(RestartPolicy::Always)
    };
    r.script(
        "sandbox recreated",
        vec![
            (Input::ProxyGone, &["check"]),
            (Input::Readiness(Seen::Up), &["install(fresh=false,rehold)"]),
            // The driver found no process of the pod left in ns(1).
            (Input::NetnsGone, &["phase:waiting-for-netns", "look"]),
            (Input::NetnsNotYet, &["timer:NetnsPoll"]),
            (Input::Timer(Timer::NetnsPoll), &["look"]),
            (Input::NetnsNotYet, &["timer:NetnsPoll"]),
            (Input::Pod(Some(killed(running("app-1")))), &["look"]),
            (Input::NetnsNotYet, &["timer:NetnsPoll"]),
            (Input::Timer(Timer::NetnsPoll), &["look"]),
            (Input::NetnsNotYet, &["timer:NetnsPoll"]),
            (
                Input::Pod(Some(killed(terminated("app-1", 137)))),
                &["look"],
            ),
            (Input::NetnsNotYet, &["timer:NetnsPoll"]),
            (Input::Timer(Timer::NetnsPoll), &["look"]),
            (Input::NetnsFound { netns: ns(2) }, &["check"]),
            (Input::Readiness(Seen::Down), &["install(fresh=true)"]),
            (
                Input::HoldSetUp {
                    adopted: false,
                    app_running: false,
                    age: Duration::ZERO,
                },
                &[
                    "rec:hold-started(adopted=false,late=false)",
                    "phase:holding",
                    "timer:HoldDeadline",
                    "check",
                ],
            ),
            (Input::Readiness(Seen::Down), &["timer:ReadinessPoll"]),
            (Input::Pod(Some(killed(terminated("app-1", 137)))), &[]),
            // The status catches up: new container ids; each look finds the same new netns.
            (Input::Pod(Some(killed(running("app-2")))), &["look"]),
            (Input::NetnsFound { netns: ns(2) }, &[]),
            (
                Input::Pod(Some(PodFacts {
                    apps: vec![running("app-2")],
                    proxy: Some(running("proxy-2")),
                    ..pod(RestartPolicy::Always)
                })),
                &["look"],
            ),
            (Input::NetnsFound { netns: ns(2) }, &[]),
            (Input::Timer(Timer::ReadinessPoll), &["check"]),
            (Input::Readiness(Seen::Ready), &["release(ready=true)"]),
            (
                Input::HoldReleased(Released::default()),
                &["rec:hold-ready", "phase:ready"],
            ),
        ],
    );
    assert!(
        matches!(r.state.stage, Stage::Running { netns, .. } if netns == ns(2)),
        "{r:?}"
    );
}

/// A recreated sandbox as the containerd backend's driver fed it (tests/tests/hold_lifecycle.rs
/// `a_recreated_sandbox_is_held_in_its_new_netns` with `HOLDFAST_SIM_RUNTIME=containerd`,
/// recorded with `HOLDFAST_LOG=info,holdfast::inputs=debug`; readiness polls left out): the
/// proxy container's main process (pilot-agent) exits first, the check finds Envoy still
/// ready, Envoy's own exit 23 ms later waits for the proxy-gone pace (1 s). The status then
/// shows the app and the proxy exited (`restartPolicy: Always`: the kubelet runs them again):
/// the netns is looked for from there, so the new sandbox's is held before its app starts.
/// Before, the machine stayed `Running` in the dead netns until the status showed the new app
/// running, and the app's boot call had been refused by then.
#[test]
fn replay_a_recreated_sandbox_on_containerd_is_held_before_its_app_starts() {
    let mut r = ready(holding(pod(RestartPolicy::Always)));
    let killed = |app: (Option<String>, ContainerState), proxy| PodFacts {
        apps: vec![app],
        proxy: Some(proxy),
        ..pod(RestartPolicy::Always)
    };
    r.script(
        "pilot-agent first, Envoy after",
        vec![
            (Input::ProxyGone, &["check"]),
            (
                Input::Readiness(Seen::Ready),
                &["remove-leftover", "phase:ready"],
            ),
            (Input::ProxyGone, &["timer:ProxyRecheck"]),
            (
                Input::Pod(Some(killed(terminated("app-1", 137), running("proxy-1")))),
                &[],
            ),
        ],
    );
    r.script(
        "the status shows both exited",
        vec![
            (
                Input::Pod(Some(killed(
                    terminated("app-1", 137),
                    terminated("proxy-1", 137),
                ))),
                &["phase:waiting-for-netns", "look"],
            ),
            (Input::NetnsNotYet, &["timer:NetnsPoll"]),
            (Input::Timer(Timer::NetnsPoll), &["look"]),
            (Input::NetnsFound { netns: ns(2) }, &["check"]),
            (Input::Readiness(Seen::Down), &["install(fresh=true)"]),
        ],
    );
}

/// The race the driver's check cannot close: the hold went into the old netns an instant
/// before its last process went. The status's new container ids make the machine look: another
/// netns (or none) releases the dead one's hold as `sandbox-gone` and holds in the new one.
#[test]
fn a_hold_left_in_a_dead_netns_moves_to_the_new_one() {
    let mut r = ready(holding(pod(RestartPolicy::Always)));
    r.script(
        "held in the old netns",
        vec![
            (Input::ProxyGone, &["check"]),
            (
                Input::Readiness(Seen::Down),
                &["install(fresh=false,rehold)"],
            ),
            (
                Input::HoldSetUp {
                    adopted: false,
                    app_running: false,
                    age: Duration::ZERO,
                },
                &[
                    "rec:hold-started(adopted=false,late=false)",
                    "phase:holding",
                    "timer:HoldDeadline",
                    "check",
                ],
            ),
            (
                Input::Pod(Some(recreated(RestartPolicy::Always))),
                &["look"],
            ),
            (
                Input::NetnsFound { netns: ns(2) },
                &["release(ready=false)"],
            ),
            (
                Input::HoldReleased(Released::default()),
                &["rec:hold-sandbox-gone", "phase:waiting-for-netns", "look"],
            ),
            (Input::NetnsFound { netns: ns(2) }, &["check"]),
            (Input::Readiness(Seen::Down), &["install(fresh=true)"]),
        ],
    );
    // No process of the pod anywhere yet: the same, then the new netns is waited for.
    let mut r = ready(holding(pod(RestartPolicy::Always)));
    r.feed(Input::ProxyGone);
    r.feed(Input::NetnsFound { netns: ns(1) });
    r.feed(Input::Readiness(Seen::Down));
    r.feed(Input::HoldSetUp {
        adopted: false,
        app_running: false,
        age: Duration::ZERO,
    });
    r.script(
        "no netns yet",
        vec![
            (
                Input::Pod(Some(recreated(RestartPolicy::Always))),
                &["look"],
            ),
            (Input::NetnsNotYet, &["release(ready=false)"]),
            (
                Input::HoldReleased(Released::default()),
                &["rec:hold-sandbox-gone", "phase:waiting-for-netns", "look"],
            ),
            (Input::NetnsNotYet, &["timer:NetnsPoll"]),
        ],
    );
}

/// The status after the kubelet began a KEP-5532 in-place restart: the condition
/// `AllContainersRestarting` True, the old containers (same ids) terminated.
fn restarting(policy: RestartPolicy) -> PodFacts {
    PodFacts {
        restarting_in_place: true,
        apps: vec![terminated("app-1", 42)],
        proxy: Some(terminated("proxy-1", 137)),
        ..pod(policy)
    }
}

/// An in-place restart of every container (Kubernetes 1.35+, KEP-5532 `RestartAllContainers`):
/// same sandbox and netns, init containers (istio-init) run again, then every container with a
/// new id. Held like a proxy restart in the same netns: the condition alone starts the look
/// (before any pidfd or new id); the new ids keep the hold where it is (same netns). The
/// sequence as tests/tests/hold_lifecycle.rs `an_in_place_restart_of_every_container_is_held`
/// recorded it (the condition's update came before the proxy's pidfd; Envoy's sockets still
/// open at the first look: `Up`).
#[test]
fn replay_an_in_place_restart_is_held_in_the_same_netns() {
    let mut r = ready(holding(pod(RestartPolicy::Always)));
    r.script(
        "restart all containers",
        vec![
            (
                Input::Pod(Some(restarting(RestartPolicy::Always))),
                &["phase:waiting-for-netns", "look"],
            ),
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (Input::Readiness(Seen::Up), &["install(fresh=false,rehold)"]),
            (
                Input::HoldSetUp {
                    adopted: false,
                    app_running: false,
                    age: Duration::ZERO,
                },
                &[
                    "rec:hold-started(adopted=false,late=false)",
                    "phase:holding",
                    "timer:HoldDeadline",
                    "check",
                ],
            ),
            // The proxy's pidfd fires while held: nothing more to do.
            (Input::ProxyGone, &[]),
            (
                Input::Pod(Some(PodFacts {
                    restarting_in_place: false,
                    ..restarting(RestartPolicy::Always)
                })),
                &[],
            ),
            // The condition goes False, the containers start again under new ids.
            (
                Input::Pod(Some(recreated(RestartPolicy::Always))),
                &["look"],
            ),
            (Input::NetnsFound { netns: ns(1) }, &[]),
            (Input::Readiness(Seen::Ready), &["release(ready=true)"]),
            (
                Input::HoldReleased(Released::default()),
                &["rec:hold-ready", "phase:ready"],
            ),
        ],
    );
    // A Job's pod (`Never`) restarted in place by a rule after it finished: followed again.
    let mut done = pod(RestartPolicy::Never);
    done.apps = vec![terminated("app-1", 0)];
    done.proxy = Some(terminated("proxy-1", 0));
    let mut r = Run::start(pod(RestartPolicy::Never), START);
    r.script(
        "finished, then restarted in place",
        vec![
            (Input::Pod(Some(done.clone())), &["phase:done"]),
            (
                Input::Pod(Some(restarting(RestartPolicy::Never))),
                &["phase:waiting-for-netns", "look"],
            ),
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (
                Input::Readiness(Seen::Down),
                &["install(fresh=false,rehold)"],
            ),
        ],
    );
    // The control: a pod left alone stays alone, a deleted one is not followed again.
    let mut r = Run::start(pod(RestartPolicy::Never), START);
    r.feed(Input::Pod(Some(done.clone())));
    r.state.left_alone = true;
    r.script(
        "left alone",
        vec![(Input::Pod(Some(restarting(RestartPolicy::Never))), &[])],
    );
    let mut r = Run::start(pod(RestartPolicy::Never), START);
    r.feed(Input::Pod(Some(done)));
    r.script(
        "deleted",
        vec![(
            Input::Pod(Some(deleted(restarting(RestartPolicy::Never)))),
            &[],
        )],
    );
}

/// A container restarted while the pod runs (a new id in the status, whichever container):
/// the netns is looked up again; the same netns with Envoy ready is no hold.
#[test]
fn an_app_restart_looks_again_and_a_ready_proxy_needs_no_hold() {
    let mut r = ready(holding(pod(RestartPolicy::Always)));
    r.script(
        "app restarted",
        vec![
            (
                Input::Pod(Some(PodFacts {
                    apps: vec![running("app-2")],
                    ..pod(RestartPolicy::Always)
                })),
                &["phase:waiting-for-netns", "look"],
            ),
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (
                Input::Readiness(Seen::Ready),
                &["remove-leftover", "phase:ready"],
            ),
        ],
    );
    // The same update twice: the second one is no restart.
    r.script(
        "again",
        vec![(
            Input::Pod(Some(PodFacts {
                apps: vec![running("app-2")],
                ..pod(RestartPolicy::Always)
            })),
            &[],
        )],
    );
}

/// A native sidecar without a startup probe (Istio's `startupProbe.enabled=false`): the kubelet
/// starts the app as soon as the sidecar runs, so its first start is held like a classic one;
/// with the probe (the default) it is not (the control).
#[test]
fn a_native_sidecar_without_a_startup_probe_is_held_at_its_first_start() {
    let unprobed = PodFacts {
        proxy_startup_probe: false,
        ..native(pod(RestartPolicy::Always))
    };
    let mut r = Run::start(unprobed, START);
    r.script(
        "no startup probe",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (Input::Readiness(Seen::Down), &["install(fresh=false)"]),
        ],
    );
    let mut r = Run::start(native(pod(RestartPolicy::Always)), START);
    r.script(
        "startup probe",
        vec![
            (Input::NetnsFound { netns: ns(1) }, &["check"]),
            (
                Input::Readiness(Seen::Down),
                &["remove-leftover", "phase:ready"],
            ),
        ],
    );
}

/// The driver keeps no netns handle for a finished pod (a completed Job's netns is not kept
/// alive by the agent), and keeps it at every other stage.
#[test]
fn a_finished_pod_keeps_no_netns_handle() {
    let mut r = holding(pod(RestartPolicy::Never));
    r.feed(Input::Readiness(Seen::Ready));
    r.feed(Input::HoldReleased(Released::default()));
    assert!(r.state.keeps_netns(), "{r:?}");
    r.feed(Input::JobFinished(job_report(JobOutcome::Completed)));
    assert_eq!(r.state.stage, Stage::Finished);
    assert!(!r.state.keeps_netns());
}

/// No pod update is dropped silently (issue 28 item 6). The stages whose catch-all arm ignores
/// pod updates — `SettingUpHold` and `Releasing` (the driver feeds their answer before it reads
/// anything else), `JobWatch` and `Draining` (their executors read the pod themselves),
/// `Finished` — keep the update's facts, and what the update says is acted on at the stage's
/// answer: a deletion during the set-up releases at once, a restart during it is looked at once
/// the hold is in, a deletion during a release drains once the release is done.
#[test]
fn a_pod_update_in_a_waiting_stage_is_kept_and_acted_on() {
    // Deleted while the hold is set up: released as pod-deleted at HoldSetUp.
    let mut r = Run::start(pod(RestartPolicy::Always), START);
    r.feed(Input::NetnsFound { netns: ns(1) });
    r.feed(Input::Readiness(Seen::Down));
    assert!(matches!(r.state.stage, Stage::SettingUpHold { .. }));
    r.script(
        "deleted during set-up",
        vec![
            (Input::Pod(Some(deleted(pod(RestartPolicy::Always)))), &[]),
            (
                Input::HoldSetUp {
                    adopted: false,
                    app_running: false,
                    age: Duration::ZERO,
                },
                &[
                    "rec:hold-started(adopted=false,late=false)",
                    "phase:holding",
                    "release(ready=false)",
                ],
            ),
        ],
    );
    // Deleted while releasing (the proxy ready): drained once the release is done.
    let mut r = holding(pod(RestartPolicy::Always));
    r.feed(Input::Readiness(Seen::Ready));
    assert!(matches!(r.state.stage, Stage::Releasing { .. }));
    r.script(
        "deleted during release",
        vec![
            (Input::Pod(Some(deleted(pod(RestartPolicy::Always)))), &[]),
            (
                Input::HoldReleased(Released::default()),
                &["rec:hold-ready", "phase:draining", "drain"],
            ),
        ],
    );
    assert!(matches!(r.state.stage, Stage::Draining { .. }), "{r:?}");
    // Every stage keeps the latest facts, whatever it does with them.
    let mut r = Run::start(pod(RestartPolicy::Always), START);
    r.feed(Input::NetnsFound { netns: ns(1) });
    r.feed(Input::Readiness(Seen::Down));
    let update = PodFacts {
        user_init_running: true,
        ..pod(RestartPolicy::Always)
    };
    r.feed(Input::Pod(Some(update.clone())));
    assert_eq!(r.state.pod.as_ref(), Some(&update));
}

/// The sequences the end-to-end tests' agents recorded (issue 28 item 6), replayed: each file
/// in `node-agent/tests/corpus/inputs/` is one pod's inputs as its agents logged them
/// (`holdfast::inputs`), written by the test named beside it with
/// `HOLDFAST_RECORD_INPUTS=node-agent/tests/corpus/inputs` (netns backend). Fed the same
/// inputs, the machine must keep the rules every sequence keeps (`Replayed::check`: no hold in a
/// netns the pod's processes left) and reach what the test saw the agent do.
#[test]
fn replay_the_sequences_recorded_by_the_end_to_end_tests() {
    use crate::lifecycle::replay::{Recording, Replayed};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/inputs");
    let installs = Replayed::holds_set_up;
    let drained_app_done = |rec: &Recording, r: &Replayed| {
        assert!(r.any_effect(|e| matches!(e, Effect::StartDrain)), "{r:?}");
        assert_eq!(rec.drain_outcome(), Some(DrainOutcome::AppDone));
        assert!(
            matches!(r.state.stage, Stage::Finished | Stage::Exited),
            "{r:?}"
        );
    };
    type Check<'a> = Box<dyn Fn(&[Recording], &[Replayed]) + 'a>;
    let cases: Vec<(&str, &str, Check)> = vec![
        (
            // tests/tests/hold_lifecycle.rs a_recreated_sandbox_is_held_in_its_new_netns
            "sandbox-recreated",
            "default/boot",
            Box::new(|_, r| {
                let r = r.last().expect("a sequence");
                let holds = installs(r);
                assert!(holds.len() >= 2, "{holds:?}");
                assert_ne!(holds[0], holds[holds.len() - 1], "held in the new netns");
                assert!(
                    matches!(r.state.stage, Stage::Running { netns, .. } if netns == holds[holds.len() - 1]),
                    "{r:?}"
                );
            }),
        ),
        (
            // tests/tests/hold_lifecycle.rs an_in_place_restart_of_every_container_is_held
            "in-place-restart",
            "default/boot",
            Box::new(|_, r| {
                let r = r.last().expect("a sequence");
                let holds = installs(r);
                assert!(holds.len() >= 2, "{holds:?}");
                assert!(
                    holds.iter().all(|n| *n == holds[0]),
                    "the same netns: {holds:?}"
                );
                assert!(matches!(r.state.stage, Stage::Running { .. }), "{r:?}");
            }),
        ),
        (
            // tests/tests/drain.rs drain_adopted_after_envoys_drain_time: the first agent is
            // killed while draining, its successor adopts the drain 5 s in.
            "drain-adopted-late",
            "default/late",
            Box::new(|rec, r| {
                assert_eq!(r.len(), 2, "one sequence per agent");
                assert!(r[0].any_effect(|e| matches!(e, Effect::StartDrain)));
                drained_app_done(&rec[1], &r[1]);
            }),
        ),
        (
            // tests/tests/drain.rs slow_download_through_a_drain_arrives_whole
            "download-through-drain",
            "default/dl",
            Box::new(|rec, r| drained_app_done(&rec[0], &r[0])),
        ),
    ];
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("the corpus of recorded inputs")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let named: Vec<String> = cases.iter().map(|(f, ..)| format!("{f}.log")).collect();
    assert_eq!(
        files,
        {
            let mut n = named.clone();
            n.sort();
            n
        },
        "every recorded sequence has its case"
    );
    for (file, pod, check) in cases {
        let text = std::fs::read_to_string(dir.join(format!("{file}.log"))).expect("read");
        let recs = Recording::from_log(&text, pod).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(!recs.is_empty(), "{file}: no sequence of {pod}");
        let replays: Vec<Replayed> = recs.iter().map(|r| r.replay(POLL)).collect();
        for r in &replays {
            r.check().unwrap_or_else(|e| panic!("{file}: {e}"));
        }
        check(&recs, &replays);
    }
}

/// No stage drops a Pod update silently (issue 28 item 6), proved stage by stage: every stage
/// the machine can be in receives a deletion and keeps its facts (`state.pod`), and either acts
/// on it at once (effects or another stage) or is one of the stages whose catch-all arm
/// (`(st, _) => st`) defers it, each with where it is acted on: `Checking` at its readiness
/// answer (below), `SettingUpHold` and `Releasing` at their answer (`a_pod_update_in_a_waiting_stage_is_kept_and_acted_on`),
/// `JobWatch` and `Draining` in their executors, which follow the pod's view themselves (the
/// driver's watch channel; `drain::tests`).
#[test]
fn every_stage_keeps_a_deletion_and_acts_on_it_or_defers_to_its_answer() {
    let p = || pod(RestartPolicy::Always);
    let mut stages: Vec<(&str, Run)> = Vec::new();
    let mut waiting = Run::start(p(), START);
    waiting.feed(Input::NetnsNotYet);
    stages.push(("waiting-for-netns", waiting));
    let mut checking = Run::start(p(), START);
    checking.feed(Input::NetnsFound { netns: ns(1) });
    stages.push(("checking", checking));
    let mut setting_up = Run::start(p(), START);
    setting_up.feed(Input::NetnsFound { netns: ns(1) });
    setting_up.feed(Input::Readiness(Seen::Down));
    stages.push(("setting-up-hold", setting_up));
    stages.push(("holding", holding(p())));
    let mut releasing = holding(p());
    releasing.feed(Input::Readiness(Seen::Ready));
    stages.push(("releasing", releasing));
    stages.push(("running", ready(holding(p()))));
    let job = || {
        let mut r = holding(pod(RestartPolicy::Never));
        r.feed(Input::Readiness(Seen::Ready));
        r.feed(Input::HoldReleased(Released::default()));
        assert!(matches!(r.state.stage, Stage::JobWatch { .. }), "{r:?}");
        r
    };
    stages.push(("job-watch", job()));
    let mut draining = ready(holding(p()));
    draining.feed(Input::Pod(Some(deleted(p()))));
    stages.push(("draining", draining));
    let mut finished = job();
    finished.feed(Input::JobFinished(job_report(JobOutcome::Completed)));
    assert_eq!(finished.state.stage, Stage::Finished);
    stages.push(("finished", finished));

    let deferred = [
        "checking",
        "setting-up-hold",
        "releasing",
        "job-watch",
        "draining",
        // Nothing runs that the agent acts on: the pod's going (`Pod(None)`) ends the task,
        // and a container run again re-enters (`finished_only_when_the_kubelet_runs_nothing_again`).
        "finished",
    ];
    for (name, mut r) in stages {
        let before = r.state.stage.clone();
        // The pod as the stage knows it, now deleted.
        let update = deleted(r.state.pod.clone().expect("facts"));
        let fx = r.feed(Input::Pod(Some(update.clone())));
        assert_eq!(r.state.pod.as_ref(), Some(&update), "{name}: facts kept");
        let acted =
            fx.iter().any(|e| !matches!(e, Effect::Ignored { .. })) || r.state.stage != before;
        assert!(
            acted || deferred.contains(&name),
            "{name}: a deletion dropped silently ({before:?})"
        );
        if deferred.contains(&name) {
            assert_eq!(
                r.state.stage, before,
                "{name}: deferred, the stage unchanged"
            );
            assert_eq!(
                fx,
                [Effect::Ignored {
                    stage: before.name(),
                    input: "pod"
                }],
                "{name}: deferred, and said so"
            );
        }
        if name == "checking" {
            // Its readiness answer reads the kept facts: deleted and nothing listening, no
            // hold and nothing to drain.
            let fx = r.feed(Input::Readiness(Seen::Down));
            assert_eq!(r.state.stage, Stage::Finished, "{fx:?}");
            assert!(!fx.iter().any(|e| matches!(e, Effect::InstallHold { .. })));
        }
    }
}

/// An input a stage has nothing to do with leaves the stage as it was and says so, by stage and
/// input (the driver counts it: `record_tests::an_ignored_input_is_counted`); an input acted
/// on says nothing of the kind.
#[test]
fn an_ignored_input_is_said() {
    let mut r = ready(holding(pod(RestartPolicy::Always)));
    let before = r.state.stage.clone();
    assert!(matches!(before, Stage::Running { .. }), "{before:?}");
    let fx = r.feed(Input::Timer(Timer::HoldDeadline));
    assert_eq!(r.state.stage, before);
    assert_eq!(
        fx,
        [Effect::Ignored {
            stage: "running",
            input: "timer-hold-deadline"
        }]
    );
    let fx = r.feed(Input::Readiness(Seen::Ready));
    assert_eq!(kind(&fx[fx.len() - 1]), "ignored:running:readiness");
    // Acted on: no `Ignored`.
    let fx = r.feed(Input::Pod(Some(deleted(pod(RestartPolicy::Always)))));
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Ignored { .. })),
        "{fx:?}"
    );
    assert!(matches!(r.state.stage, Stage::Draining { .. }));
    // After the end, every input is ignored as `exited`.
    let mut r = Run::start(pod(RestartPolicy::Always), START);
    r.feed(Input::Pod(None));
    assert_eq!(r.state.stage, Stage::Exited);
    assert_eq!(
        r.feed(Input::NetnsNotYet),
        [Effect::Ignored {
            stage: "exited",
            input: "netns-not-yet"
        }]
    );
}

/// No catch-all arm in the machine: each stage names every input it ignores, so a new `Input`
/// fails to compile until each stage says what it does with it (the matches have no `_` or
/// bare binding in the input's place but for the stages a part does not own, and each
/// stage's own `match input` has none at all). Two earlier bugs were Pod updates dropped in
/// exactly such arms.
#[test]
fn catch_alls_stay_out_of_the_machine() {
    let sources = [
        ("machine.rs", include_str!("machine.rs")),
        ("machine/startup.rs", include_str!("machine/startup.rs")),
        ("machine/holding.rs", include_str!("machine/holding.rs")),
        (
            "machine/afterwards.rs",
            include_str!("machine/afterwards.rs"),
        ),
        (
            "machine/proxy_gone.rs",
            include_str!("machine/proxy_gone.rs"),
        ),
    ];
    let mut found = Vec::new();
    for (file, text) in sources {
        let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        // An arm whose input is `_` (`(st, _) => st`, `(st @ Stage::Holding { .. }, _) => st`),
        // or that hands any input of any stage on (`(st, input) =>`). Seven at f867de4.
        for bad in [", _) =>", ", _) if", "(st, input) =>"] {
            if flat.contains(bad) {
                found.push(format!("{file}: `{bad}`"));
            }
        }
    }
    // Each stage's own function matches the input alone (`match input { .. }`): no arm there
    // may take any input (`_ =>`, `_ if`, a bare binding such as `input =>` or `other =>`).
    // Matches over other things (`match p { Some(..) => .., _ => .. }`) are nested deeper
    // and not looked at.
    for (file, text, stages) in [
        ("machine/startup.rs", include_str!("machine/startup.rs"), 2),
        ("machine/holding.rs", include_str!("machine/holding.rs"), 3),
        (
            "machine/afterwards.rs",
            include_str!("machine/afterwards.rs"),
            4,
        ),
    ] {
        catch_alls_in(&mut found, file, text, "input", stages);
    }
    // The same for the matches over the stage, for an input every stage answers (`machine.rs`:
    // the agent's stop, a broken bound, no way to look, an executor that could not start) and
    // for each part's routing: a new `Stage` fails to compile until each says what it does.
    for (file, text, matches) in [
        ("machine.rs", include_str!("machine.rs"), 4),
        ("machine/startup.rs", include_str!("machine/startup.rs"), 1),
        ("machine/holding.rs", include_str!("machine/holding.rs"), 1),
        (
            "machine/afterwards.rs",
            include_str!("machine/afterwards.rs"),
            1,
        ),
    ] {
        catch_alls_in(&mut found, file, text, "stage", matches);
    }
    assert!(found.is_empty(), "catch-all arms: {found:?}");
}

/// Adds to `found` each arm of a `match <what> { .. }` in `text` that takes any value (`_`,
/// `_ if`, `name @ _`, a bare binding such as `st =>` or `other =>`, guarded or not); at
/// least `expected` such matches must be there, so renaming the scrutinee cannot switch the
/// check off.
fn catch_alls_in(found: &mut Vec<String>, file: &str, text: &str, what: &str, expected: usize) {
    let arms = match_arms(text, what);
    assert!(
        arms.len() >= expected,
        "{file}: {} `match {what}` blocks, {expected} expected",
        arms.len()
    );
    for pattern in arms.iter().flatten() {
        let pattern = pattern.split(" if ").next().unwrap_or_default().trim();
        // Any alternative that is `_`, `name @ _` or a bare lower-case name.
        let catch_all = pattern.split('|').any(|alt| {
            let alt = alt.rsplit(" @ ").next().unwrap_or_default().trim();
            !alt.is_empty()
                && alt
                    .chars()
                    .all(|c| c == '_' || c.is_ascii_lowercase() || c.is_ascii_digit())
        });
        if catch_all {
            found.push(format!("{file}: `{pattern} =>` in a `match {what}`"));
        }
    }
}

/// The arms' patterns (guards included) of each `match <what> { .. }` in `text`, one list a
/// match: the text before each `=>` at the match's own level, from the end of the arm before
/// (a `,` or a closing bracket at that level). Comments and string literals are dropped first.
fn match_arms(text: &str, what: &str) -> Vec<Vec<String>> {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join(" ");
    let mut plain = String::new();
    let mut chars = code.chars();
    while let Some(c) = chars.next() {
        if c == '"' {
            while let Some(c) = chars.next() {
                match c {
                    '\\' => {
                        chars.next();
                    }
                    '"' => break,
                    _ => {}
                }
            }
            plain.push_str("\"\"");
        } else {
            plain.push(c);
        }
    }
    let flat = plain.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut matches = Vec::new();
    let head = format!("match {what} {{");
    for (at, head) in flat.match_indices(head.as_str()) {
        let (mut depth, mut arm, mut arms) = (0usize, String::new(), Vec::new());
        let mut rest = flat[at + head.len()..].chars().peekable();
        while let Some(c) = rest.next() {
            match c {
                '{' | '(' | '[' => depth += 1,
                '}' | ')' | ']' if depth == 0 => break,
                '}' | ')' | ']' => {
                    depth -= 1;
                    if depth == 0 {
                        arm.clear();
                        continue;
                    }
                }
                ',' if depth == 0 => {
                    arm.clear();
                    continue;
                }
                '=' if depth == 0 && rest.peek() == Some(&'>') => {
                    rest.next();
                    arms.push(arm.trim().to_string());
                    arm.clear();
                    continue;
                }
                _ => {}
            }
            if depth == 0 {
                arm.push(c);
            }
        }
        matches.push(arms);
    }
    matches
}
