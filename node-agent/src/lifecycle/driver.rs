//! The thin driver of one pod's [`machine`]: turns the outside world into inputs (pod updates,
//! netns lookups, readiness checks, the hold's and the executors' results, timers, the agent
//! stopping) and performs the machine's effects. It decides nothing: what happens next is the
//! machine's — including what it means when the driver cannot do something (no way to look at
//! the proxy: `Input::CannotLook`; an executor that cannot start: `Input::ExecutorNotStarted`);
//! how a drain or Job watch runs is `lifecycle::drain`'s (the effect executors).
//!
//! Runs inside the pod's tracing span (`pod`, `uid`), so no line repeats the pod.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::machine::{self, Effect, Input, Now, PodFacts, Released, Seen, State, Timer};
use super::pacing::{FastWindow, Pacing};
use super::record::Recorder;
use super::replay::InputsLog;
use crate::effects::envoy_admin::AdminClient;
use crate::effects::hold::{Error as HoldError, HoldConfig, HoldQueue};
use crate::effects::netns::PodNetns;
use crate::effects::netns_claims::{NetnsClaim, NetnsOwners};
use crate::effects::procfs::pod_procs::NetnsLookup;
use crate::effects::procfs::proxy_procs::proxy_pids_of;
use crate::lifecycle::drain::app_exit::ExitWatcher;
use crate::lifecycle::drain::{self, DrainCtx, DrainStep, PodProcsSource};
use crate::lifecycle::readiness::{Readiness, ReadinessProbe};
use crate::mesh::AdminAt;
use crate::mesh::MeshProfile;
use crate::pod::{PodKey, PodView};

/// How often the held counts are copied to the status board.
const STATUS_EVERY: Duration = Duration::from_millis(250);

type Executor = Pin<Box<dyn Future<Output = Input> + Send>>;

/// What every pod's driver shares (made once by [`crate::agent::run`]).
pub(crate) struct Shared {
    pub config: Arc<crate::config::Config>,
    pub board: crate::report::board::StatusBoard,
    pub procs: crate::effects::procfs::pod_procs::PodProcs,
    pub stop: tokio_util::sync::CancellationToken,
    pub metrics: crate::report::metrics::Metrics,
    pub events: crate::report::events::PodEvents,
    /// How many pods are in their fast readiness window (see
    /// [`super::pacing::FAST_CHECK_SHARE`]).
    pub fast_window: FastWindow,
    /// Which tracked pod each network namespace in use belongs to.
    pub netns_owners: NetnsOwners,
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
        proxy_watch: None,
        proxy_watch_for: None,
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
    /// Pidfds of the ready proxy's own processes (pilot-agent and Envoy; while the machine `watches_proxy`):
    /// the first exit is `ProxyGone`. No polling: a pidfd turns readable on exit.
    proxy_watch: Option<ExitWatcher>,
    /// The proxy container id the watch was armed for (armed once per id).
    proxy_watch_for: Option<String>,
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
                    let has_proxy_watch = self.proxy_watch.is_some();
                    let proxy_watch = self.proxy_watch.as_mut();
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
                        (pid, _) = async { proxy_watch.expect("guarded").next_exit().await }, if has_proxy_watch => {
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
                        self.proxy_watch = None;
                        self.proxy_watch_for = None;
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

    async fn look_for_netns(&mut self) -> Input {
        match self.shared.procs.find_netns(&self.key.uid).await {
            NetnsLookup::NotYet => Input::NetnsNotYet,
            NetnsLookup::Refused(why) => Input::NetnsRefused(why),
            NetnsLookup::Found { pid, netns } => {
                let id = netns.id();
                if self.netns.as_ref().map(PodNetns::id) != Some(id) {
                    match self.shared.netns_owners.claim(id, &self.key) {
                        Ok(claim) => self.netns_claim = Some(claim),
                        Err(owner) => {
                            // Looked up again at the next poll; the row says so if it lasts.
                            return Input::NetnsRefused(format!(
                                "pid {pid} is in network namespace {id:?}, which belongs to tracked pod {owner}: a stale or reused pid, not this pod's"
                            ));
                        }
                    }
                    tracing::info!(pid, netns = ?id, "found the pod's network namespace");
                    // A probe of the old netns asks the wrong Envoy: made anew at the next check.
                    self.probe = None;
                    self.netns = Some(netns);
                }
                Input::NetnsFound { netns: id }
            }
        }
    }

    fn make_probe(&self, netns: &PodNetns) -> Result<ReadinessProbe, String> {
        let cfg = &self.shared.config;
        let admin_addr = self.admin;
        let dns_port = self.hold_cfg.as_ref().and_then(|c| c.rules.dns_port);
        let options = crate::lifecycle::readiness::ProbeOptions {
            stat_prefix: cfg.drain.stat_prefix.clone(),
            dns_port,
            on_admin_error: Some(crate::lifecycle::readiness::count_admin_errors(
                &self.shared.metrics,
            )),
        };
        let profile = self.current_profile();
        let client = self
            .admin_client(netns)
            .map_err(|e| format!("cannot reach the pod's network namespace: {e}"))?;
        let admin_port = matches!(profile.admin, AdminAt::Tcp(_)).then_some(admin_addr.port());
        ReadinessProbe::with_admin(netns, client, admin_port, &profile, &cfg.hold, options)
            .map_err(|e| format!("cannot reach the pod's network namespace: {e}"))
    }

    /// The pod's mesh profile: the current view's, else the one the pod was first seen with.
    fn current_profile(&self) -> MeshProfile {
        self.view
            .borrow()
            .as_ref()
            .map(|v| v.profile.clone())
            .unwrap_or_else(|| self.profile.clone())
    }

    /// The pod's Envoy admin client: TCP inside its netns, or the mesh's Unix socket in the
    /// proxy's filesystem ([`crate::effects::admin_socket`]), found anew from the proxy
    /// container's current processes whenever the one found last stops answering.
    fn admin_client(&self, netns: &PodNetns) -> crate::effects::netns::Result<AdminClient> {
        let profile = self.current_profile();
        let AdminAt::UnixSocket {
            parent,
            dir_prefix,
            name,
        } = profile.admin
        else {
            return Ok(AdminClient::in_netns(netns.try_clone()?, self.admin));
        };
        let view = self.view.clone();
        let connector = crate::effects::admin_socket::connector(
            self.shared.procs.clone(),
            self.key.uid.clone(),
            crate::effects::admin_socket::SocketAt {
                proxy_uid: profile.proxy_uid,
                parent,
                dir_prefix,
                name,
            },
            move || {
                view.borrow()
                    .as_ref()
                    .and_then(|v| v.proxy_container().and_then(|c| c.id.clone()))
            },
        );
        Ok(AdminClient::unix(
            &format!("{parent}/{dir_prefix}*/{name}"),
            connector,
        ))
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

    /// Why the hold in force stopped holding on its own, as the machine's input: forged
    /// messages on its queue (a broken bound) or its reader thread's failure.
    fn hold_stopped_input(&self) -> Option<Input> {
        let q = self.queue.as_ref()?;
        q.tampered()
            .map(Input::OverBound)
            .or_else(|| q.failure().map(Input::HoldBroken))
    }

    async fn check_readiness(&mut self) -> Input {
        if let Some(input) = self.hold_stopped_input() {
            return input;
        }
        if let Some(q) = &self.queue {
            if self.last_progress.elapsed() >= STATUS_EVERY {
                self.last_progress = Instant::now();
                let held = q.held();
                self.rec
                    .hold_progress(held.packets, held.connections, held.first_held_at);
            }
        }
        // Made when first needed, and dropped once the machine is past the hold (see
        // `drive`): an idle pod keeps no admin connection, netlink socket or netns fd open.
        if self.probe.is_none() {
            let made = match self.netns.as_ref().map(PodNetns::try_clone) {
                Some(Ok(netns)) => self.make_probe(&netns),
                Some(Err(e)) => Err(format!(
                    "cannot keep a handle on the pod's network namespace: {e}"
                )),
                None => Err("the pod's network namespace is not known".to_string()),
            };
            match made {
                Ok(p) => self.probe = Some(p),
                // No way to look: the machine decides what that means (as without the agent).
                Err(why) => return Input::CannotLook(why),
            }
        }
        let seen = match &self.probe {
            None => return Input::CannotLook("no readiness probe".to_string()),
            Some(p) => match p.check().await {
                Readiness::Ready => Seen::Ready,
                Readiness::PortsClosed => Seen::Down,
                Readiness::Starting => Seen::Starting,
                Readiness::NotLive => Seen::Up,
                Readiness::FilterNotLoaded => Seen::Live,
                Readiness::OverBound => {
                    let why = p
                        .take_violation()
                        .unwrap_or_else(|| "the admin answer broke a bound".into());
                    return Input::OverBound(why);
                }
                Readiness::CannotReach => {
                    let why = p
                        .take_violation()
                        .unwrap_or_else(|| "the admin API cannot be reached".into());
                    // Not asked again: a new probe (and a new look) comes with the next start.
                    self.probe = None;
                    return Input::CannotLook(why);
                }
            },
        };
        self.pacing.seen(seen, Instant::now());
        Input::Readiness(seen)
    }

    fn hold_config(&self) -> Option<HoldConfig> {
        self.hold_cfg.clone()
    }

    async fn remove_leftover(&mut self) {
        let (Some(netns), Some(cfg)) = (&self.netns, self.hold_config()) else {
            return;
        };
        match blocking(netns, cfg, |ns, c| HoldQueue::remove_leftover(&ns, &c)).await {
            Ok(true) => tracing::info!("removed a hold rule left by a previous agent"),
            Ok(false) => {}
            Err(e) => {
                if !self.child_over_bound(&e) {
                    self.rec
                        .problem(format!("removing a leftover hold rule failed: {e}"));
                }
            }
        }
    }

    /// Tells the machine when a hold command broke its bounds (`Input::ChildOverBound`, fed
    /// before the effect's own answer). Whether it did is the error's.
    fn child_over_bound(&mut self, e: &HoldError) -> bool {
        let Some(remembered) = e.over_bound() else {
            return false;
        };
        self.pending.push_back(Input::ChildOverBound {
            why: e.to_string(),
            remembered,
        });
        true
    }

    async fn disarm_and_mark(&mut self) {
        let (Some(netns), Some(cfg)) = (&self.netns, self.hold_config()) else {
            return;
        };
        if let Err(e) = blocking(netns, cfg, |ns, c| HoldQueue::disarm_and_mark(&ns, &c)).await {
            self.rec.problem(format!(
                "cannot mark the pod's network namespace as over its bounds: {e}"
            ));
        }
    }

    async fn install_hold(&mut self, fresh: bool) -> Input {
        let (Some(netns), Some(cfg)) = (&self.netns, self.hold_config()) else {
            return Input::HoldFailed("the pod's network namespace is not known".into());
        };
        let id = netns.id();
        let result = blocking(netns, cfg, move |ns, c| {
            if fresh {
                HoldQueue::start_fresh(&ns, &c).map(|q| (q, false))
            } else {
                HoldQueue::start_or_adopt(&ns, &c)
            }
        })
        .await;
        match result {
            Ok((queue, adopted)) => {
                // Checked once the hold is in (a proxy's restart must not wait for this look:
                // the app's calls are refused meanwhile): a netns no process of the pod is in
                // any more is dead (our handle keeps it), and a hold there holds nothing of the
                // pod's. It is released at once and the machine looks for the pod's new one.
                if !self.netns_in_use(id).await {
                    tracing::info!(netns = ?id, "no process of the pod is in its network namespace any more: no hold there");
                    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || queue.release()).await {
                        tracing::warn!(error = %e, "releasing the hold in a dead network namespace failed");
                    }
                    return Input::NetnsGone;
                }
                let age = if adopted {
                    std::time::SystemTime::now()
                        .duration_since(queue.since())
                        .unwrap_or_default()
                } else {
                    Duration::ZERO
                };
                self.queue = Some(queue);
                let app_running = self.app_running().await;
                Input::HoldSetUp {
                    adopted,
                    app_running,
                    age,
                }
            }
            Err(e) => {
                self.child_over_bound(&e);
                Input::HoldFailed(e.to_string())
            }
        }
    }

    async fn release(&mut self, ready_at: Option<std::time::Instant>) -> Input {
        let Some(queue) = self.queue.take() else {
            return Input::ReleaseFailed("no hold to release".into());
        };
        let release_started = Instant::now().into_std();
        match tokio::task::spawn_blocking(move || queue.release()).await {
            Ok(Ok(report)) => Input::HoldReleased(Released {
                connections: report.stats.connections,
                packets: report.stats.packets,
                first_held_at: report.stats.first_held_at,
                // Held connections go at the accept verdict; the rule removal follows it.
                ready_to_release: ready_at
                    .map(|t| release_started.saturating_duration_since(t) + report.verdict_after),
            }),
            Ok(Err(e)) => {
                self.child_over_bound(&e);
                Input::ReleaseFailed(e.to_string())
            }
            Err(e) => Input::ReleaseFailed(format!("the release task failed: {e}")),
        }
    }

    /// Arms the proxy watch while the machine wants it (once per proxy container id), drops it
    /// otherwise. The container's processes are found by container id in the pod's cgroup, and
    /// of those only the proxy's own are watched: the container's main process (pilot-agent)
    /// and its children (Envoy), see `effects::procfs::proxy_procs`; an OOM-kill of either ends
    /// the container.
    async fn sync_proxy_watch(&mut self, state: &State) {
        if !state.watches_proxy() {
            self.proxy_watch = None;
            self.proxy_watch_for = None;
            return;
        }
        let proxy_id = self
            .view
            .borrow()
            .as_ref()
            .and_then(|v| v.proxy_container().and_then(|c| c.id.clone()));
        let Some(proxy_id) = proxy_id else {
            return;
        };
        if self.proxy_watch_for.as_deref() == Some(proxy_id.as_str()) {
            return;
        }
        self.proxy_watch_for = Some(proxy_id.clone());
        let container: Vec<i32> = self
            .shared
            .procs
            .of_pod(&self.key.uid)
            .await
            .iter()
            .filter(|p| p.container_id.as_deref() == Some(proxy_id.as_str()))
            .map(|p| p.pid)
            .collect();
        // Only the proxy itself (pilot-agent and Envoy), not every process of its container:
        // an exec session or probe ending is not the proxy going (issue 29).
        let proc_root = self.shared.procs.proc_root();
        let proxy = tokio::task::spawn_blocking(move || proxy_pids_of(&proc_root, &container))
            .await
            .unwrap_or_default();
        let mut watcher = ExitWatcher::for_pod(&self.key, &self.shared.procs.proc_root());
        // A pid already gone is skipped, not taken as an exit: the process list can lag, and
        // the Pod status path (a new or no running proxy id) covers a container already down.
        for pid in proxy {
            let _ = watcher.watch(pid);
        }
        if watcher.live() > 0 {
            tracing::debug!(processes = watcher.live(), "watching the proxy's processes");
            self.proxy_watch = Some(watcher);
        }
    }

    /// Whether a process of the pod's sandbox or containers is in netns `id` now (a sandbox that
    /// died leaves none: the kubelet recreates it with a new netns).
    async fn netns_in_use(&mut self, id: crate::effects::netns::NetnsId) -> bool {
        let source = self.shared.procs.clone();
        let uid = self.key.uid.clone();
        let procs = source.of_pod(&uid).await;
        let root = source.proc_root();
        procs.iter().filter(|p| p.container_id.is_some()).any(|p| {
            crate::effects::netns::NetnsId::of_path(&root.join(p.pid.to_string()).join("ns/net"))
                .is_ok_and(|ns| ns == id)
        })
    }

    /// Whether a process of an app container (not the sandbox, not the proxy) exists now.
    async fn app_running(&mut self) -> bool {
        let Some(view) = self.view.borrow().clone() else {
            return false;
        };
        let app_ids: Vec<String> = view.app_containers().filter_map(|c| c.id.clone()).collect();
        let procs = self.shared.procs.of_pod(&self.key.uid).await;
        procs.iter().any(|p| {
            p.container_id
                .as_ref()
                .is_some_and(|id| app_ids.iter().any(|a| a == id))
        })
    }

    /// Starts the drain (`drain`) or the Job watch as the running executor.
    fn start_executor(&mut self, drain: bool) {
        let admin = match self.netns.as_ref().map(PodNetns::try_clone) {
            Some(Ok(ns)) => {
                let t = self.shared.config.drain.admin_timeout;
                // The pod's sockets, asked in its netns too (the kernel's send queues).
                let sockets = drain::PodProxy::open_sockets(&ns);
                let client = match self.admin_client(&ns) {
                    Ok(client) => client,
                    Err(_) => AdminClient::in_netns(ns, self.admin),
                }
                .with_timeouts(t, t)
                .with_error_callback({
                    let count =
                        crate::lifecycle::readiness::count_admin_errors(&self.shared.metrics);
                    move |kind| count(kind)
                });
                drain::PodProxy::new(client, sockets, &self.current_profile())
            }
            other => {
                let why = match other {
                    Some(Err(e)) => {
                        format!("cannot keep a handle on the pod's network namespace: {e}")
                    }
                    _ => "the pod's network namespace is not known".into(),
                };
                // The machine decides what a drain or Job watch that cannot start means.
                self.pending.push_back(Input::ExecutorNotStarted(why));
                return;
            }
        };
        let key = self.key.clone();
        let shared = self.shared.clone();
        let view = self.view.clone();
        let steps = self.steps_tx.clone();
        self.executor = Some(Box::pin(async move {
            let ctx = DrainCtx {
                key: &key,
                admin: &admin,
                processes: PodProcsSource::new(shared.procs.clone(), key.uid.clone()),
                view,
                stop: shared.stop.clone(),
                settings: &shared.config.drain,
                steps: Some(steps),
            };
            if drain {
                Input::DrainFinished(Box::new(drain::drain(ctx).await))
            } else {
                Input::JobFinished(Box::new(drain::finish_job(ctx).await))
            }
        }));
    }
}

/// Runs blocking hold work (iptables, netlink) off the async runtime.
async fn blocking<T: Send + 'static>(
    netns: &PodNetns,
    cfg: HoldConfig,
    f: impl FnOnce(PodNetns, HoldConfig) -> crate::effects::hold::Result<T> + Send + 'static,
) -> Result<T, HoldError> {
    let ns = netns.try_clone().map_err(HoldError::Netns)?;
    tokio::task::spawn_blocking(move || f(ns, cfg))
        .await
        .map_err(|e| HoldError::Holder(netns.id(), format!("the hold task failed: {e}")))?
}
