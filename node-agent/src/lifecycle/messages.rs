//! The lifecycle machine's vocabulary: its inputs, effects, timers and the outcomes it hands to
//! the recorder.

use std::time::{Duration, Instant, SystemTime};

use crate::api::{DrainReport, HoldOutcome, JobReport, Phase, StepKind};
use crate::effects::netns::NetnsId;

use super::facts::PodFacts;

/// The clock, both ways: monotonic for timers, wall for reports.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Now {
    pub(crate) mono: Instant,
    pub(crate) wall: SystemTime,
}

/// A readiness observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Seen {
    /// Ready: hold no longer needed.
    Ready,
    /// Envoy listens but is not ready (starting, or shutting down).
    Up,
    /// Envoy runs (its admin port listens) but its capture ports do not listen yet.
    Starting,
    /// Envoy is LIVE with its workers started, but the filter is not ready on every worker
    /// (not ready: held like `Up`; told apart for the pod's timeline).
    Live,
    /// Nothing listens on the proxy's ports.
    Down,
}

/// What a release did, for the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Released {
    pub(crate) connections: u64,
    pub(crate) packets: u64,
    /// From the proxy seen ready to every held packet accepted.
    pub(crate) ready_to_release: Option<Duration>,
    /// When the first packet was held (`None`: nothing was held), for the timeline.
    pub(crate) first_held_at: Option<SystemTime>,
}

/// Serde: the driver logs every input as JSON (`holdfast::inputs`, debug) and
/// [`super::replay`] reads such a log back into the machine.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Input {
    /// The pod's latest view; `None`: gone from the source (or no longer tracked).
    Pod(Option<PodFacts>),
    NetnsNotYet,
    NetnsFound {
        netns: NetnsId,
    },
    NetnsRefused(String),
    Readiness(Seen),
    /// The hold is in (`adopted`: a previous agent's hold was taken over); `app_running`: an
    /// app process of the pod was running when it went in (the machine decides whether that
    /// makes the hold late).
    HoldSetUp {
        adopted: bool,
        app_running: bool,
        /// How long the hold has been in force already: zero for a new hold; for an adopted
        /// one, since a previous agent installed it (its rules say when), so the deadline
        /// counts from the hold's start, not this agent's.
        age: Duration,
    },
    /// The hold was not installed: no process of the pod is in the netns any more (its sandbox
    /// died, or is being recreated). A hold is never put in a dead netns.
    NetnsGone,
    HoldFailed(String),
    HoldReleased(Released),
    ReleaseFailed(String),
    /// The drain or Job executor sent `/quitquitquit`.
    QuitStarted,
    JobFinished(Box<JobReport>),
    DrainFinished(Box<DrainReport>),
    Timer(Timer),
    /// The pod broke one of the agent's bounds (an oversized admin answer, netlink messages not
    /// from the kernel on its hold's queue): fail it open — release any hold as without the
    /// agent — and leave it alone from now on, saying why.
    OverBound(String),
    /// A command the agent ran in the pod's network namespace (`iptables`, `iptables-restore`)
    /// broke its own bounds — output, time, memory or CPU: the pod's tables made it too costly
    /// — or did before (`remembered`: the namespace carries the mark, from this agent or a
    /// previous one). An over-bound for the pod, whatever the stage: fail it open, leave it
    /// alone, and (when not remembered yet) mark the namespace so that no agent runs it again.
    /// Comes before the failed effect's own answer (`HoldFailed`, `ReleaseFailed`).
    ChildOverBound {
        why: String,
        remembered: bool,
    },
    /// The hold stopped holding on its own (its NFQUEUE reader thread failed; the reason): the
    /// machine fails the pod open at once, as for a broken bound, rather than leave the row
    /// `holding` until the deadline.
    HoldBroken(String),
    /// The proxy's readiness cannot be looked at (no handle on the pod's netns, no probe could
    /// be made): as without the agent — no hold, a hold in force released — and the reason on
    /// the row.
    CannotLook(String),
    /// The drain or Job executor could not start (no handle on the pod's netns): the outcome
    /// `not-started`, and the pod runs as without the agent.
    ExecutorNotStarted(String),
    /// A process of the running proxy container exited (seen on its pidfd, within microseconds
    /// of an OOM-kill): Envoy may be gone, and the app's new connections would be refused until
    /// the kubelet's restart back-off ends and the new Envoy is ready.
    ProxyGone,
    AgentStop,
}

impl Input {
    /// The input's name, as the `input` label of `holdfast_inputs_ignored_total` and the trace
    /// log say it. Every variant by name: a new one fails to compile here.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Input::Pod(Some(_)) => "pod",
            Input::Pod(None) => "pod-gone",
            Input::NetnsNotYet => "netns-not-yet",
            Input::NetnsFound { .. } => "netns-found",
            Input::NetnsRefused(_) => "netns-refused",
            Input::Readiness(_) => "readiness",
            Input::HoldSetUp { .. } => "hold-set-up",
            Input::NetnsGone => "netns-gone",
            Input::HoldFailed(_) => "hold-failed",
            Input::HoldReleased(_) => "hold-released",
            Input::ReleaseFailed(_) => "release-failed",
            Input::QuitStarted => "quit-started",
            Input::JobFinished(_) => "job-finished",
            Input::DrainFinished(_) => "drain-finished",
            Input::Timer(Timer::NetnsPoll) => "timer-netns-poll",
            Input::Timer(Timer::ReadinessPoll) => "timer-readiness-poll",
            Input::Timer(Timer::HoldDeadline) => "timer-hold-deadline",
            Input::Timer(Timer::ProxyRecheck) => "timer-proxy-recheck",
            Input::Timer(Timer::JobWatchRetry) => "timer-job-watch-retry",
            Input::OverBound(_) => "over-bound",
            Input::ChildOverBound { .. } => "child-over-bound",
            Input::HoldBroken(_) => "hold-broken",
            Input::CannotLook(_) => "cannot-look",
            Input::ExecutorNotStarted(_) => "executor-not-started",
            Input::ProxyGone => "proxy-gone",
            Input::AgentStop => "agent-stop",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Timer {
    NetnsPoll,
    ReadinessPoll,
    HoldDeadline,
    /// A proxy-gone's re-check, deferred by its pace (`machine/proxy_gone.rs`).
    ProxyRecheck,
    /// Start a Job watch again that could not start (`Input::ExecutorNotStarted`).
    JobWatchRetry,
}

/// An outcome, for the recorder (board + metrics + Event + log, together).
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    HoldStarted {
        adopted: bool,
        late: bool,
    },
    HoldEnded {
        outcome: HoldOutcome,
        released: Option<Released>,
        held_for: Duration,
        timeout: Duration,
    },
    Drain(Box<DrainReport>),
    Job(Box<JobReport>),
    /// The pod is left alone from now on because it broke a bound (the reason): the row, a
    /// Warning Event, `holdfast_pods_failed_open_total` and the log.
    FailedOpen {
        why: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    SetPhase(Phase),
    /// Look for the pod's netns once (answer: `NetnsNotYet`/`NetnsFound`/`NetnsRefused`).
    LookForNetns,
    Schedule(Timer, Instant),
    /// One readiness observation (answer: `Readiness`).
    CheckReadiness,
    /// Remove a hold rule a previous agent may have left (the proxy is ready or the pod goes).
    RemoveLeftoverHold,
    /// Install the hold (`fresh`: the netns is new, nothing to adopt; `rehold`: after the
    /// proxy's exit, so an app already running is expected — the machine keeps it to judge
    /// the hold late or not) (answer: `HoldSetUp` or `HoldFailed`).
    InstallHold {
        fresh: bool,
        rehold: bool,
    },
    SetPassThrough(bool),
    /// Release every held connection (answer: `HoldReleased` or `ReleaseFailed`).
    ReleaseHold {
        ready_at: Option<Instant>,
    },
    /// Close the queue and leave the rule for the next agent (it adopts the hold).
    LeaveHoldForSuccessor,
    /// Empty the hold's chains (nothing held) and mark the pod's namespace as over its bounds,
    /// without listing anything there (`Input::ChildOverBound`; no answer).
    RememberOverBound,
    /// Watch a Job's app and quit its proxy once it finished (answer: `JobFinished`).
    StartJobWatch,
    /// Drain the deleted pod (answer: `QuitStarted`, then `DrainFinished`).
    StartDrain,
    Record(Outcome),
    /// A step of the pod's life for its timeline (dated now by the recorder), with what the
    /// machine knows about it.
    Step(StepKind, Option<String>),
    /// A problem for the row's `last_error` (and the log).
    Problem(String),
    /// Nothing left to do: the task ends.
    Exit,
    /// The stage had nothing to do with the input (its facts, if any, are kept): the driver
    /// logs it at trace and counts it in `holdfast_inputs_ignored_total{stage,input}`
    /// (`Stage::name`, `Input::name`). No answer.
    Ignored {
        stage: &'static str,
        input: &'static str,
    },
}
