//! One pod's lifecycle as a pure state machine: `step(state, input, now) -> (state, effects)`.
//!
//! No I/O, no runtime: the driver (`super::driver`) turns the outside world into [`Input`]s
//! (pod updates, netns lookups, readiness observations, results of the hold and of the drain and
//! Job executors, timers, the agent stopping) and performs the [`Effect`]s. Every decision about
//! *what happens next* to a pod — hold or not, when a hold ends and why, when a drain or a Job
//! watch starts, which outcome is recorded, which phase the row shows — is made here, so every
//! case is a table row in `machine_tests.rs`. The shape is ztunnel's in-pod state manager
//! (`process_msg`): messages in, commands out.
//!
//! `step` handles the agent stopping, broken bounds, no way to look and executors that could
//! not start, then hands each input to the part of the pod's life it is in: `startup`
//! (waiting for the netns, the first readiness look), `holding` (the startup hold),
//! `afterwards` (running, proxy restarts, the Job watch and the drain). Each part hands each
//! stage to a function of the stage's name, which names every input it ignores.

use std::time::{Duration, Instant};

use crate::api::{DrainOutcome, DrainReport, HoldOutcome, JobOutcome, JobReport, Phase, StepKind};
use crate::effects::netns::NetnsId;

/// The inputs [`step`] answers for every stage before a stage's own function is asked
/// (`agent_stop`, `over_bound`, `cannot_look`, `executor_not_started`; `HoldBroken` and
/// `ChildOverBound` become `OverBound` first). Each stage function names them as ignored with
/// this one pattern, so the list is written once and a new input still fails to compile there.
macro_rules! answered_for_every_stage {
    () => {
        Input::OverBound(_)
            | Input::ChildOverBound { .. }
            | Input::HoldBroken(_)
            | Input::CannotLook(_)
            | Input::ExecutorNotStarted(_)
            | Input::AgentStop
    };
}

mod afterwards;
mod holding;
mod proxy_gone;
mod startup;

pub(crate) use super::facts::{netns_poll_after, pass_through, PodFacts};
pub(crate) use super::messages::{Effect, Input, Now, Outcome, Released, Seen, Timer};
pub(crate) use proxy_gone::ProxyGonePace;

#[derive(Debug, Clone, PartialEq)]
pub enum Stage {
    /// No process of the pod yet. `waiting_since`: the last pod update (backoff base).
    WaitingForNetns {
        waiting_since: Instant,
        looked: bool,
        refused: Refused,
    },
    /// The netns is known; one readiness observation decides whether to hold. `rehold`: the
    /// check follows the proxy's exit while the app ran, so a hold now is a re-hold (the app
    /// running is expected, not a hold that went in late).
    Checking {
        netns: NetnsId,
        fresh: bool,
        rehold: bool,
    },
    SettingUpHold {
        netns: NetnsId,
        /// The hold follows the proxy's exit while the app ran (see [`Stage::Checking`]).
        rehold: bool,
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

impl Stage {
    /// The stage's name, as the `stage` label of `holdfast_inputs_ignored_total` says it.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Stage::WaitingForNetns { .. } => "waiting-for-netns",
            Stage::Checking { .. } => "checking",
            Stage::SettingUpHold { .. } => "setting-up-hold",
            Stage::Holding { .. } => "holding",
            Stage::Releasing { .. } => "releasing",
            Stage::Running { .. } => "running",
            Stage::JobWatch { .. } => "job-watch",
            Stage::Draining { .. } => "draining",
            Stage::Finished => "finished",
            Stage::Exited => "exited",
        }
    }
}

/// Whether the pod's processes showed a netns the agent must not use (the node's, its own)
/// while waiting: since when, and whether the row says so yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Never,
    Since(Instant),
    Noted,
}

/// How long a refused netns must last before the pod's row shows it: runc puts `runc init` in
/// the container's cgroup before it joins the sandbox's netns, so a look at that moment sees
/// the node's netns (docs/containerd-backend.md); that passes within milliseconds.
pub(crate) const REFUSAL_NOTED_AFTER: Duration = Duration::from_secs(2);

/// How long after a Job watch could not start it is started again.
pub(crate) const JOB_WATCH_RETRY: Duration = Duration::from_secs(1);

/// How often a holding pod is checked while its Envoy starts: the proxy container runs by the
/// pod's status (pilot-agent launches Envoy at once), Envoy's admin port listens
/// (`Seen::Starting`), or its capture ports listen but it is not LIVE yet (`Seen::Up`).
///
/// Envoy opens its capture ports and goes LIVE within a millisecond of each other on an idle
/// node, and its admin port only milliseconds before (the scale benchmark's observer: ports
/// listen → fully ready 0.0 ms p50), so the moment the ports open is on the release's critical
/// path: at the `ready_poll` cadence (5 ms) it alone added up to 5 ms. A check before the ports
/// open is one or two `sock_diag` lookups, an `Up` check one `/stats` request on the kept-alive
/// admin connection: cheap, and the driver paces them node-wide (`pacing::FAST_CHECK_SHARE`,
/// `pacing::FAST_WINDOW_LIMIT`) so that many pods starting at once, or an Envoy that waits
/// minutes for istiod, do not multiply the cost. Before the proxy container runs: `ready_poll`.
pub(crate) const LIVE_WINDOW_POLL: Duration = Duration::from_millis(1);

/// When to check again after `seen`: fast while Envoy starts (`proxy_running`: the proxy
/// container runs by the pod's status).
pub(crate) fn next_check_after(seen: Seen, ready_poll: Duration, proxy_running: bool) -> Duration {
    match seen {
        Seen::Up | Seen::Live | Seen::Starting => ready_poll.min(LIVE_WINDOW_POLL),
        Seen::Down if proxy_running => ready_poll.min(LIVE_WINDOW_POLL),
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
    /// The pod broke a bound and was failed open: no hold, drain or Job quit any more.
    pub left_alone: bool,
    /// The Pod status showed the proxy container restarted while the app runs, and the netns
    /// is being looked up again: the next hold is a re-hold (for a native sidecar the only kind
    /// there is; for a classic one not "late", the app runs by design).
    pub proxy_restarted: bool,
    /// The proxy container ran by the last pod view (for the timeline's `proxy-running`).
    pub proxy_running: bool,
    /// How far the proxy got in the current start, as `readiness_step` ranks it (for the
    /// timeline: each level once per start; a proxy restart starts over).
    pub readiness_seen: u8,
    /// The pace and budget of re-checks after the proxy was seen going (`machine/proxy_gone.rs`).
    pub proxy_gone: ProxyGonePace,
    /// The latest pod update showed a container restarted (`PodFacts::restarted_since`), or
    /// the kubelet starting to restart every container in place: the pod's netns must be
    /// looked up again (a recreated sandbox has a new one). Set by each pod update, read by
    /// the stage that handles it.
    pub containers_restarted: bool,
    /// The netns the pod was last found in: one found after it that differs is new (the
    /// sandbox was recreated).
    pub last_netns: Option<NetnsId>,
}

impl State {
    pub(crate) fn new(pod: PodFacts, ready_poll: Duration, now: Now) -> (State, Vec<Effect>) {
        if pod.finished() {
            // A completed pod (an agent restarted after its Job finished): nothing to wait for.
            let state = State {
                stage: Stage::Finished,
                pod: Some(pod),
                ready_poll,
                stopping: false,
                fresh: None,
                left_alone: false,
                proxy_restarted: false,
                proxy_running: false,
                readiness_seen: 0,
                proxy_gone: ProxyGonePace::default(),
                containers_restarted: false,
                last_netns: None,
            };
            return (state, vec![Effect::SetPhase(Phase::Done)]);
        }
        let proxy_running = pod.proxy_running();
        let state = State {
            stage: Stage::WaitingForNetns {
                waiting_since: now.mono,
                looked: false,
                refused: Refused::Never,
            },
            pod: Some(pod),
            ready_poll,
            stopping: false,
            fresh: None,
            left_alone: false,
            proxy_restarted: false,
            proxy_running,
            readiness_seen: 0,
            proxy_gone: ProxyGonePace::default(),
            containers_restarted: false,
            last_netns: None,
        };
        let mut fx = vec![Effect::SetPhase(Phase::WaitingForNetns)];
        if proxy_running {
            fx.push(Effect::Step(
                StepKind::ProxyRunning,
                Some("already running when first seen".into()),
            ));
        }
        fx.push(Effect::LookForNetns);
        (state, fx)
    }

    fn deleting(&self) -> bool {
        self.pod.as_ref().is_none_or(|p| p.deletion.is_some())
    }

    /// Whether the machine may still ask for readiness observations (deciding whether to hold,
    /// or holding): outside these stages the driver keeps no readiness probe open.
    pub(crate) fn checks_readiness(&self) -> bool {
        matches!(
            self.stage,
            Stage::Checking { .. }
                | Stage::SettingUpHold { .. }
                | Stage::Holding { .. }
                | Stage::Releasing { .. }
        )
    }

    /// Whether the driver should watch the proxy container's processes for an exit (answer:
    /// `ProxyGone`): only while the proxy is ready and the pod runs on (`Running`), never during
    /// a drain or a Job watch, where the agent itself ends Envoy, nor while a re-check waits
    /// for its pace (`machine/proxy_gone.rs`). A watch costs one pidfd per process and no
    /// polling.
    pub(crate) fn watches_proxy(&self) -> bool {
        matches!(self.stage, Stage::Running { .. })
            && !self.stopping
            && !self.deleting()
            && !self.proxy_gone.deferred
    }

    /// Whether the driver keeps a handle on the pod's netns: not once the pod is finished (a
    /// completed Job may stay for days; its netns must not be kept alive by the agent's fd). A
    /// pod that runs again is looked up anew.
    pub(crate) fn keeps_netns(&self) -> bool {
        !matches!(self.stage, Stage::Finished | Stage::Exited)
    }
}

/// One transition: the latest facts kept, the input put in its common form, the timeline's
/// steps marked; then the inputs every stage answers alike (the agent stopping, a broken bound,
/// no way to look, an executor that could not start), and the rest by where the pod is in its
/// life.
pub(crate) fn step(mut s: State, input: Input, now: Now) -> (State, Vec<Effect>) {
    let mut fx = Vec::new();
    if s.stage == Stage::Exited {
        let stage = std::mem::replace(&mut s.stage, Stage::Exited);
        s.stage = ignored(&mut fx, stage, &input);
        return (s, fx);
    }
    keep_facts(&mut s, &input);
    let child_over_bound = matches!(input, Input::ChildOverBound { .. });
    let input = normalise(input, &mut fx);
    timeline_steps(&mut s, &input, &mut fx);
    let stage = std::mem::replace(&mut s.stage, Stage::Exited);
    s.stage = match (stage, input) {
        (st, Input::AgentStop) => agent_stop(&s, st, now, &mut fx),
        (st, Input::OverBound(why)) => over_bound(&mut s, st, why, child_over_bound, &mut fx),
        (st, Input::CannotLook(why)) => cannot_look(&s, st, why, &mut fx),
        (st, Input::ExecutorNotStarted(why)) => executor_not_started(&s, st, why, now, &mut fx),

        // The rest by where the pod is in its life.
        (st @ (Stage::WaitingForNetns { .. } | Stage::Checking { .. }), input) => {
            startup::step(&mut s, st, input, now, &mut fx)
        }
        (
            st @ (Stage::SettingUpHold { .. } | Stage::Holding { .. } | Stage::Releasing { .. }),
            input,
        ) => holding::step(&mut s, st, input, now, &mut fx),
        (
            st @ (Stage::Running { .. }
            | Stage::JobWatch { .. }
            | Stage::Draining { .. }
            | Stage::Finished
            | Stage::Exited),
            input,
        ) => afterwards::step(&mut s, st, input, now, &mut fx),
    };
    (s, fx)
}

/// Facts first: every stage sees the latest pod (and whether its containers restarted), the
/// agent stopping, a deferred proxy-gone re-check due.
fn keep_facts(s: &mut State, input: &Input) {
    match input {
        Input::Pod(p) => {
            s.containers_restarted = match (&s.pod, p) {
                (Some(before), Some(now)) => {
                    now.restarted_since(before)
                        || (now.restarting_in_place && !before.restarting_in_place)
                }
                _ => false,
            };
            s.pod = p.clone();
        }
        Input::AgentStop => s.stopping = true,
        // A deferred proxy-gone re-check is due, whatever the stage now (`afterwards.rs`).
        Input::Timer(Timer::ProxyRecheck) => s.proxy_gone.deferred = false,
        _ => {}
    }
}

/// The inputs that are a broken bound under another name become [`Input::OverBound`].
fn normalise(input: Input, fx: &mut Vec<Effect>) -> Input {
    match input {
        // The hold's NFQUEUE reader stopped: nothing holds any more (its queue closed, new SYNs
        // bypass it), and the agent cannot tell the pod's doing from a kernel error: fail it
        // open and leave it alone, as for a broken bound (row, Warning Event, counter, the
        // hold's rules removed).
        Input::HoldBroken(why) => Input::OverBound(format!(
            "the startup hold's queue reader stopped ({why}); the hold no longer held"
        )),
        // A command in the pod's namespace over its bounds (issue 29): the pod's tables cost
        // more than the agent spends on a pod. Its namespace is marked (unless it already
        // was), so no agent, after a restart either, runs such a command there again.
        Input::ChildOverBound { why, remembered } => {
            if !remembered {
                fx.push(Effect::RememberOverBound);
            }
            Input::OverBound(child_over_bound_reason(&why, remembered))
        }
        other => other,
    }
}

/// The agent stops: holds stay for the successor; executors end themselves (they watch the
/// same stop signal) and report; everything else just ends.
fn agent_stop(s: &State, stage: Stage, now: Now, fx: &mut Vec<Effect>) -> Stage {
    match stage {
        Stage::Holding { started, .. } => {
            fx.push(Effect::LeaveHoldForSuccessor);
            fx.push(Effect::Record(Outcome::HoldEnded {
                outcome: HoldOutcome::AgentStopped,
                released: None,
                held_for: now.mono.saturating_duration_since(started),
                timeout: s.pod.as_ref().map_or(Duration::ZERO, |p| p.hold_timeout),
            }));
            exit(fx)
        }
        // The executors and the hold's pending answer see the stop themselves.
        st @ (Stage::JobWatch { .. }
        | Stage::Draining { .. }
        | Stage::SettingUpHold { .. }
        | Stage::Releasing { .. }) => ignored(fx, st, &Input::AgentStop),
        Stage::WaitingForNetns { .. }
        | Stage::Checking { .. }
        | Stage::Running { .. }
        | Stage::Finished
        | Stage::Exited => exit(fx),
    }
}

/// A bound broken (`child_over_bound`: by a command the agent ran in the pod's namespace):
/// release a hold in force, then leave the pod alone (see `after_hold`).
fn over_bound(
    s: &mut State,
    stage: Stage,
    why: String,
    child_over_bound: bool,
    fx: &mut Vec<Effect>,
) -> Stage {
    match stage {
        Stage::Holding { netns, started, .. } => {
            s.left_alone = true;
            fx.push(Effect::Record(Outcome::FailedOpen { why }));
            release(fx, netns, HoldOutcome::Failed, started, None)
        }
        st @ (Stage::SettingUpHold { .. } | Stage::Releasing { .. }) => {
            // The hold's own answer comes next and `after_hold` leaves the pod alone.
            if !s.left_alone {
                s.left_alone = true;
                fx.push(Effect::Record(Outcome::FailedOpen { why }));
            }
            st
        }
        Stage::Checking { .. } => {
            s.left_alone = true;
            fx.push(Effect::Record(Outcome::FailedOpen { why }));
            fx.push(Effect::RemoveLeftoverHold);
            Stage::Finished
        }
        // A command's bound at another stage (removing a leftover hold: after the first look,
        // a failed hold, a restart): left alone from now on as well.
        Stage::Running { .. } if child_over_bound && !s.left_alone => {
            s.left_alone = true;
            fx.push(Effect::Record(Outcome::FailedOpen { why }));
            Stage::Finished
        }
        // A running executor ends by its own answer.
        st @ (Stage::WaitingForNetns { .. }
        | Stage::JobWatch { .. }
        | Stage::Draining { .. }
        | Stage::Finished
        | Stage::Exited)
            if child_over_bound && !s.left_alone =>
        {
            s.left_alone = true;
            fx.push(Effect::Record(Outcome::FailedOpen { why }));
            st
        }
        st @ (Stage::WaitingForNetns { .. }
        | Stage::Running { .. }
        | Stage::JobWatch { .. }
        | Stage::Draining { .. }
        | Stage::Finished
        | Stage::Exited) => {
            // Nothing of the agent's is in force at the other stages; say so only once.
            if !s.left_alone {
                tracing::debug!(%why, "bound broken outside a hold");
            }
            ignored(fx, st, &Input::OverBound(why))
        }
    }
}

/// No way to look at the proxy: act as without the agent, and say why.
fn cannot_look(s: &State, stage: Stage, why: String, fx: &mut Vec<Effect>) -> Stage {
    match stage {
        Stage::Checking { netns, .. } => {
            fx.push(Effect::Problem(format!(
                "cannot check the proxy's readiness ({why}): no startup hold, as without holdfast"
            )));
            match s.pod.clone() {
                None => done_and_exit(fx),
                Some(p) => enter_running(fx, netns, &p),
            }
        }
        Stage::Holding { netns, started, .. } => {
            fx.push(Effect::Problem(format!(
                "cannot check the proxy's readiness ({why}): the hold is released, as without \
                 holdfast"
            )));
            release(fx, netns, HoldOutcome::Failed, started, None)
        }
        st @ (Stage::WaitingForNetns { .. }
        | Stage::SettingUpHold { .. }
        | Stage::Releasing { .. }
        | Stage::Running { .. }
        | Stage::JobWatch { .. }
        | Stage::Draining { .. }
        | Stage::Finished
        | Stage::Exited) => ignored(fx, st, &Input::CannotLook(why)),
    }
}

/// An executor that could not start: its outcome says so; the pod runs on as without the
/// agent (Envoy ends by pilot-agent's drain; a Job's proxy is not quit).
fn executor_not_started(
    s: &State,
    stage: Stage,
    why: String,
    now: Now,
    fx: &mut Vec<Effect>,
) -> Stage {
    match stage {
        Stage::Draining { .. } => {
            let mut report = DrainReport::new(DrainOutcome::NotStarted, now.wall);
            report.errors = vec![why];
            report.error_count = 1;
            fx.push(Effect::Record(Outcome::Drain(Box::new(report))));
            fx.push(Effect::SetPhase(Phase::Done));
            if s.pod.is_none() || s.stopping {
                exit(fx)
            } else {
                Stage::Finished
            }
        }
        Stage::JobWatch { netns } => {
            let mut report = JobReport::new(JobOutcome::NotStarted);
            report.errors = vec![why];
            report.error_count = 1;
            fx.push(Effect::Record(Outcome::Job(Box::new(report))));
            fx.push(Effect::SetPhase(Phase::Ready));
            // Tried again later (the netns handle may be had then); until then the pod runs as
            // without the agent.
            fx.push(Effect::Schedule(
                Timer::JobWatchRetry,
                now.mono + JOB_WATCH_RETRY,
            ));
            Stage::Running {
                netns,
                proxy_id: s
                    .pod
                    .as_ref()
                    .and_then(|p| p.running_proxy().map(str::to_string)),
            }
        }
        st @ (Stage::WaitingForNetns { .. }
        | Stage::Checking { .. }
        | Stage::SettingUpHold { .. }
        | Stage::Holding { .. }
        | Stage::Releasing { .. }
        | Stage::Running { .. }
        | Stage::Finished
        | Stage::Exited) => ignored(fx, st, &Input::ExecutorNotStarted(why)),
    }
}

/// The failed-open reason of [`Input::ChildOverBound`].
fn child_over_bound_reason(why: &str, remembered: bool) -> String {
    if remembered {
        format!("{why}; the pod is left alone, as by the agent that saw it")
    } else {
        format!(
            "a command the agent ran in the pod's network namespace broke its bounds ({why}): \
             the pod's tables cost more than the agent spends on a pod; the namespace is marked \
             so that no agent runs one there again"
        )
    }
}

/// The timeline's steps an input marks, whatever the stage: the proxy container seen running
/// (again), and each readiness level the first time in this start of the proxy.
fn timeline_steps(s: &mut State, input: &Input, fx: &mut Vec<Effect>) {
    match input {
        Input::Pod(Some(p)) => {
            let running = p.proxy_running();
            if running && !s.proxy_running {
                fx.push(Effect::Step(StepKind::ProxyRunning, None));
            }
            s.proxy_running = running;
        }
        Input::Readiness(seen) => {
            let (level, kind, detail) = readiness_step(*seen);
            if level > s.readiness_seen {
                s.readiness_seen = level;
                if let Some(kind) = kind {
                    fx.push(Effect::Step(kind, detail.map(str::to_string)));
                }
            }
        }
        _ => {}
    }
}

/// How far a readiness observation says the proxy got (0: nothing listens), and the step that
/// marks it. Levels only rise within one start of the proxy (a look may see an earlier level
/// after a later one: an Envoy shutting down), so each step is recorded once per start.
pub(crate) fn readiness_step(seen: Seen) -> (u8, Option<StepKind>, Option<&'static str>) {
    match seen {
        Seen::Down => (0, None, None),
        Seen::Starting => (
            1,
            Some(StepKind::EnvoyStarted),
            Some("its admin port listens"),
        ),
        Seen::Up => (
            2,
            Some(StepKind::EnvoyListening),
            Some("its capture ports listen"),
        ),
        Seen::Live => (
            3,
            Some(StepKind::EnvoyLive),
            Some("LIVE, workers started; the filter not ready on every worker yet"),
        ),
        Seen::Ready => (
            4,
            Some(StepKind::ProxyReady),
            Some("LIVE, workers started, the filter ready on every worker"),
        ),
    }
}

/// A new start of the proxy (restarted, or a new sandbox): its readiness steps are recorded
/// again.
pub(super) fn proxy_starts_over(s: &mut State, fx: &mut Vec<Effect>, kind: StepKind, why: &str) {
    fx.push(Effect::Step(kind, Some(why.to_string())));
    s.readiness_seen = 0;
}

/// The pod's containers went (or are going) and come back — the proxy's process exited, a
/// container was restarted, the sandbox was recreated, every container restarts in place —
/// so its netns is looked up again before anything is held: a recreated sandbox has a new one,
/// and a hold is never put in the old, dead one. Whatever is found next is held as a re-hold
/// (the app running then is expected, not a late hold).
pub(super) fn look_again_for_netns(
    s: &mut State,
    fx: &mut Vec<Effect>,
    now: Now,
    kind: StepKind,
    why: &str,
) -> Stage {
    proxy_starts_over(s, fx, kind, why);
    fx.push(Effect::SetPhase(Phase::WaitingForNetns));
    fx.push(Effect::LookForNetns);
    s.fresh = Some(false);
    s.proxy_restarted = true;
    s.containers_restarted = false;
    Stage::WaitingForNetns {
        waiting_since: now.mono,
        looked: false,
        refused: Refused::Never,
    }
}

/// An input the stage has nothing to do with (its facts, read in [`step`]'s first pass, are
/// kept): the stage stays, and [`Effect::Ignored`] says so, for the driver to log at trace and
/// count in `holdfast_inputs_ignored_total{stage,input}`. Every stage names the inputs it
/// ignores (no catch-all arm: `catch_alls_stay_out_of_the_machine` in the tests), so a new
/// input fails to compile until each stage has said what it does with it.
pub(super) fn ignored(fx: &mut Vec<Effect>, stage: Stage, input: &Input) -> Stage {
    fx.push(Effect::Ignored {
        stage: stage.name(),
        input: input.name(),
    });
    stage
}

pub(super) fn exit(fx: &mut Vec<Effect>) -> Stage {
    fx.push(Effect::Exit);
    Stage::Exited
}

pub(super) fn done_and_exit(fx: &mut Vec<Effect>) -> Stage {
    fx.push(Effect::SetPhase(Phase::Done));
    exit(fx)
}

pub(super) fn release(
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

pub(super) fn start_drain(fx: &mut Vec<Effect>, netns: NetnsId) -> Stage {
    fx.push(Effect::Step(StepKind::DrainStarted, None));
    fx.push(Effect::SetPhase(Phase::Draining));
    fx.push(Effect::StartDrain);
    Stage::Draining { netns }
}

/// After the hold (released or failed open): a pod deleted meanwhile is drained if its proxy
/// container runs — the hold may follow a proxy restart (the app called through the proxy
/// before it), and with the shipped mesh config (`terminationDrainDuration` = the grace
/// period, because holdfast ends the drain) pilot-agent alone would keep Envoy for the whole
/// grace period, longer than Istio's own 5 s (the chaos soak's lifecycles worse than without
/// holdfast, issue 28); a proxy not running has nothing to drain. Otherwise the proxy is ready.
pub(super) fn after_hold(fx: &mut Vec<Effect>, s: &State, netns: NetnsId) -> Stage {
    match &s.pod {
        None => done_and_exit(fx),
        Some(_) if s.stopping => exit(fx),
        // Failed open for a broken bound: as without the agent from now on.
        Some(_) if s.left_alone => Stage::Finished,
        Some(p) if p.deletion.is_some() && p.proxy_running() => start_drain(fx, netns),
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
pub(super) fn enter_running(fx: &mut Vec<Effect>, netns: NetnsId, p: &PodFacts) -> Stage {
    if p.deletion.is_some() {
        return start_drain(fx, netns);
    }
    fx.push(Effect::SetPhase(Phase::Ready));
    // A native sidecar's Job is the kubelet's: it stops the sidecars once no regular container
    // runs or will restart (pkg/kubelet/kuberuntime `computePodActions`).
    if p.is_job() && !p.native() {
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
