//! The thin driver of one pod's [`machine`]: turns the outside world into inputs (pod updates,
//! netns lookups, readiness checks, the hold's and the executors' results, timers, the agent
//! stopping) and performs the machine's effects. It decides nothing: what happens next is the
//! machine's — including what it means when the driver cannot do something (no way to look at
//! the proxy: `Input::CannotLook`; an executor that cannot start: `Input::ExecutorNotStarted`);
//! how a drain or Job watch runs is `lifecycle::drain`'s (the effect executors).
//!
//! Runs inside the pod's tracing span (`pod`, `uid`), so no line repeats the pod.
//!
//! This file is the loop (`drive`: inputs in, `perform`: effects out) and what follows the
//! pod's object; each kind of effect is in its own module: `netns` (finding the pod's network
//! namespace), `envoy` (the admin client and the readiness check), `hold` (the hold's rule and
//! queue), `proxy_watch` (the ready proxy's processes) and `executor` (starting the drain or the
//! Job watch).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

mod envoy;
mod executor;
mod hold;
mod netns;
mod proxy_watch;

use self::proxy_watch::ProxyWatch;
use super::machine::{self, Effect, Input, Now, PodFacts, State, Timer};
use super::pacing::{FastWindow, Pacing};
use super::record::Recorder;
use super::replay::InputsLog;
use crate::effects::hold::{HoldConfig, HoldQueue};
use crate::effects::netns::PodNetns;
use crate::effects::netns_claims::{NetnsClaim, NetnsOwners};
use crate::lifecycle::drain::DrainStep;
use crate::lifecycle::readiness::ReadinessProbe;
use crate::mesh::MeshProfile;
use crate::pod::{PodKey, PodView};

/// How often the held counts are copied to the status board.
const STATUS_EVERY: Duration = Duration::from_millis(250);

type Executor = Pin<Box<dyn Future<Output = Input> + Send>>;

/// What every pod's driver shares (made once by [`crate::agent::run`]).
pub(crate) struct Shared {
    pub(crate) config: Arc<crate::config::Config>,
    pub(crate) board: crate::report::board::StatusBoard,
    pub(crate) procs: crate::effects::procfs::pod_procs::PodProcs,
    pub(crate) stop: tokio_util::sync::CancellationToken,
    pub(crate) metrics: crate::report::metrics::Metrics,
    pub(crate) events: crate::report::events::PodEvents,
    /// How many pods are in their fast readiness window (see
    /// [`super::pacing::FAST_CHECK_SHARE`]).
    pub(crate) fast_window: FastWindow,
    /// Which tracked pod each network namespace in use belongs to.
    pub(crate) netns_owners: NetnsOwners,
}

/// Runs one pod's lifecycle until it is gone or the agent stops.
pub(crate) async fn run(shared: Arc<Shared>, view: watch::Receiver<Option<PodView>>) {
    let Some(first) = view.borrow().clone() else {
        return;
    };
    let rec = Recorder {
        key: first.key.clone(),
        board: shared.board.clone(),
        metrics: shared.metrics.clone(),
        events: shared.events.clone(),
    };
    let problems = Some(first.overrides.problems.join("; ")).filter(|p| !p.is_empty());
    rec.start(problems, first.mode, first.profile.mesh);
    let (steps_tx, steps_rx) = mpsc::unbounded_channel();
    let hold_cfg = Some(HoldConfig::for_pod(
        &shared.config,
        &first.profile,
        crate::lifecycle::facts::hold_scope(&first),
    ));
    let admin = first.admin_addr(&shared.config.proxy);
    let mut d = Driver {
        key: first.key.clone(),
        shared,
        view,
        rec,
        netns: None,
        netns_claim: None,
        probe: None,
        queue: None,
        timers: HashMap::new(),
        executor: None,
        steps_tx,
        steps_rx,
        pending: VecDeque::new(),
        last_progress: Instant::now(),
        proxy_watch: ProxyWatch::default(),
        hold_cfg,
        admin,
        profile: first.profile.clone(),
        pacing: Pacing::default(),
        proxy_was_running: false,
    };
    let ready_poll = d.shared.config.hold.ready_poll;
    let facts = PodFacts::of(&first);
    InputsLog::start(&facts);
    let (state, fx) = State::new(facts, ready_poll, now());
    if d.drive(state, fx).await {
        // The row stays a while (the agent's `Pods` removes it once the pod is gone for good),
        // so `holdfast status` still shows how the pod's drain went.
        tracing::info!("pod gone; no longer tracked");
    }
}

fn now() -> Now {
    Now {
        mono: Instant::now().into_std(),
        wall: std::time::SystemTime::now(),
    }
}

struct Driver {
    key: PodKey,
    shared: Arc<Shared>,
    view: watch::Receiver<Option<PodView>>,
    rec: Recorder,
    netns: Option<PodNetns>,
    /// This pod's claim on `netns` in the node's [`NetnsOwners`].
    netns_claim: Option<NetnsClaim>,
    probe: Option<ReadinessProbe>,
    queue: Option<HoldQueue>,
    timers: HashMap<Timer, Instant>,
    executor: Option<Executor>,
    /// The running executor's steps ([`DrainStep`]).
    steps_tx: mpsc::UnboundedSender<DrainStep>,
    steps_rx: mpsc::UnboundedReceiver<DrainStep>,
    /// Answers of performed effects, fed to the machine in order.
    pending: VecDeque<Input>,
    last_progress: Instant,
    /// The ready proxy's own processes, whose first exit is `ProxyGone` (`proxy_watch.rs`).
    proxy_watch: ProxyWatch,
    /// What the pod's current object asks for, computed once per pod update: the hold's rules
    /// and queue, and Envoy's admin address (`[::1]` for IPv6-first pods).
    hold_cfg: Option<HoldConfig>,
    admin: std::net::SocketAddr,
    /// The pod's mesh profile as first seen: what the driver falls back to when the current
    /// view is gone (never another mesh's).
    profile: MeshProfile,
    /// The pace of the pod's readiness checks (`pacing.rs`).
    pacing: Pacing,
    /// The proxy container ran by the last pod view (a change to running resets the backoff).
    proxy_was_running: bool,
}

impl Driver {
    /// Steps the machine until it exits. Returns whether the pod is gone (not the agent
    /// stopping).
    async fn drive(&mut self, mut state: State, fx: Vec<Effect>) -> bool {
        let mut exited = self.perform(fx).await;
        let mut stop_sent = false;
        let mut view_closed = false;
        let mut inputs_log = InputsLog::default();
        let stop = self.shared.stop.clone();
        while !exited {
            let input = match self.pending.pop_front() {
                Some(input) => input,
                None => {
                    let next_timer = self
                        .timers
                        .iter()
                        .min_by_key(|(_, at)| **at)
                        .map(|(t, at)| (*t, *at));
                    let has_executor = self.executor.is_some();
                    let executor = self.executor.as_mut();
                    let mut executor_done = false;
                    let hold_stopped = self.queue.as_ref().map(HoldQueue::stopped);
                    let has_proxy_watch = self.proxy_watch.is_armed();
                    let proxy_watch = &mut self.proxy_watch;
                    let mut proxy_gone = false;
                    let mut view_changed = false;
                    let input = tokio::select! {
                        biased;
                        _ = stop.cancelled(), if !stop_sent => {
                            stop_sent = true;
                            Input::AgentStop
                        }
                        Some(step) = self.steps_rx.recv() => {
                            // Every step on the pod's timeline; the quit also to the machine.
                            self.rec.drain_step(&step);
                            match step {
                                DrainStep::Quitting(_) => Input::QuitStarted,
                                _ => continue,
                            }
                        }
                        input = async { executor.expect("guarded").await }, if has_executor => {
                            executor_done = true;
                            input
                        }
                        _ = async { hold_stopped.as_ref().expect("guarded").notified().await }, if hold_stopped.is_some() => {
                            // The hold stopped holding on its own: say why, at once.
                            match self.hold_stopped_input() {
                                Some(input) => input,
                                None => continue,
                            }
                        }
                        pid = proxy_watch.next_exit(), if has_proxy_watch => {
                            tracing::info!(pid, "a process of the proxy (pilot-agent or Envoy) exited");
                            proxy_gone = true;
                            Input::ProxyGone
                        }
                        changed = self.view.changed(), if !view_closed => {
                            let facts = match changed {
                                Ok(()) => self.view.borrow_and_update().as_ref().map(PodFacts::of),
                                Err(_) => None,
                            };
                            view_closed = facts.is_none();
                            view_changed = true;
                            Input::Pod(facts)
                        }
                        timer = async {
                            match next_timer {
                                Some((t, at)) => {
                                    tokio::time::sleep_until(at).await;
                                    t
                                }
                                None => std::future::pending().await,
                            }
                        } => {
                            self.timers.remove(&timer);
                            Input::Timer(timer)
                        }
                    };
                    if executor_done {
                        self.executor = None;
                    }
                    if view_changed {
                        self.follow_view();
                    }
                    if proxy_gone {
                        // One-shot: re-armed when the machine is back in `Running`.
                        self.proxy_watch.clear();
                    }
                    input
                }
            };
            let fx;
            // Every input the machine gets, for a replay (`replay::InputsLog`).
            inputs_log.log(&input);
            (state, fx) = machine::step(state, input, now());
            exited = self.perform(fx).await;
            if !state.checks_readiness() {
                self.probe = None;
                self.pacing.reset();
            }
            if !state.keeps_netns() && self.netns.is_some() {
                // A finished pod (a completed Job may stay for days) keeps no fd on its netns,
                // which would keep the kernel's netns alive after its last process.
                tracing::debug!("pod finished: its network namespace handle is closed");
                self.netns = None;
                self.netns_claim = None;
            }
            if !exited && self.pending.is_empty() {
                self.sync_proxy_watch(&state).await;
            }
        }
        state.pod.is_none()
    }

    /// Performs effects in order; returns true on `Exit`.
    async fn perform(&mut self, effects: Vec<Effect>) -> bool {
        let mut exit = false;
        for effect in effects {
            match effect {
                Effect::SetPhase(p) => self.rec.phase(p),
                Effect::Record(o) => self.rec.outcome(&o),
                Effect::Step(kind, detail) => self.rec.step(kind, detail),
                Effect::Problem(m) => self.rec.problem(m),
                Effect::Ignored { stage, input } => self.rec.ignored(stage, input),
                Effect::Exit => exit = true,
                Effect::Schedule(t, at) => {
                    let at = Instant::from_std(at);
                    let at = if t == Timer::ReadinessPoll {
                        self.pacing.pace(
                            at,
                            Instant::now(),
                            self.shared.config.hold.ready_poll,
                            &self.shared.fast_window,
                        )
                    } else {
                        at
                    };
                    self.timers.insert(t, at);
                }
                Effect::LookForNetns => {
                    let answer = self.look_for_netns().await;
                    self.pending.push_back(answer);
                }
                Effect::CheckReadiness => {
                    let answer = self.check_readiness().await;
                    self.pending.push_back(answer);
                }
                Effect::RemoveLeftoverHold => self.remove_leftover().await,
                Effect::InstallHold { fresh, .. } => {
                    let answer = self.install_hold(fresh).await;
                    self.pending.push_back(answer);
                }
                Effect::SetPassThrough(on) => {
                    if let Some(q) = &self.queue {
                        q.set_pass_through(on);
                    }
                }
                Effect::ReleaseHold { ready_at } => {
                    let answer = self.release(ready_at).await;
                    self.pending.push_back(answer);
                }
                Effect::LeaveHoldForSuccessor => {
                    // Closing the queue leaves the rule: the next agent adopts it (see
                    // `agent::run`).
                    if let Some(q) = self.queue.take() {
                        tracing::info!(
                            held = q.held().connections,
                            "leaving the hold for the next agent"
                        );
                    }
                }
                Effect::RememberOverBound => self.disarm_and_mark().await,
                Effect::StartJobWatch => self.start_executor(false),
                Effect::StartDrain => self.start_executor(true),
            }
        }
        exit
    }

    /// Recomputes what depends on the pod's object (once per update, not per check). The admin
    /// address depends on the pod's IPs (`[::1]` for IPv6-first pods), which the Pod status
    /// often shows only after the netns exists: a probe made before follows it.
    fn follow_view(&mut self) {
        let view = self.view.borrow().clone();
        let Some(view) = view else { return };
        let running = view
            .proxy_container()
            .is_some_and(|c| c.state == crate::pod::ContainerState::Running);
        if running && !self.proxy_was_running && self.pacing.checking() {
            // The proxy container has just started: Envoy may be ready within milliseconds, so
            // a backed-off check comes now, and the fast window starts over.
            self.pacing.reset();
            let soon = Instant::now() + self.shared.config.hold.ready_poll;
            if let Some(at) = self.timers.get_mut(&Timer::ReadinessPoll) {
                *at = (*at).min(soon);
            }
        }
        self.proxy_was_running = running;
        self.hold_cfg = Some(HoldConfig::for_pod(
            &self.shared.config,
            &view.profile,
            crate::lifecycle::facts::hold_scope(&view),
        ));
        let admin = view.admin_addr(&self.shared.config.proxy);
        if admin != self.admin {
            self.admin = admin;
            if self.probe.take().is_some() {
                tracing::info!(admin = %admin, "the pod's IPs are known: asking Envoy's admin there");
            }
        }
    }
}
