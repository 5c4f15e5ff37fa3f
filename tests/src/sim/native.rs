//! What the kubelet does for a native sidecar (a restartable init container), and how its prober
//! reaches each mesh's proxy: the one module of kubelet rules both kubelet stand-ins
//! ([`super::kubelet`], [`crate::cri::kubelet`]) follow — plain functions and state, and the
//! `NativeKubelet` trait whose provided methods drive both. Read from
//! kubernetes/kubernetes `pkg/kubelet/kuberuntime` (1.33):
//!
//! - **Start** (`kuberuntime_container.go` `computeInitContainerActions`): init containers run in
//!   spec order; a running restartable init container with a startup probe lets the next one
//!   (here: the regular containers) start only once that probe has succeeded. The probe runs
//!   on its worker's ticker (`pkg/kubelet/prober/worker.go`), one tick per `periodSeconds` from
//!   the pod's admission, so the app starts 0–1 period after the proxy is ready
//!   ([`super::prober`]).
//! - **Restart while running**: an exited restartable init container is started again whatever
//!   the pod's `restartPolicy`, through the same `doBackOff` as every container
//!   (`kuberuntime_manager.go`): [`CrashLoopBackOff`]. The app keeps running meanwhile; the pod
//!   is not Ready while the sidecar is not.
//! - **Stop** (`kuberuntime_container.go` `killContainer`, `kuberuntime_termination_order.go`):
//!   every container's kill runs in parallel: its preStop hook first (at once), then — for a
//!   sidecar — `waitForTurn` until every regular container and every sidecar started after it
//!   has exited, then `StopContainer` (SIGTERM, SIGKILL after the timeout). One grace period is
//!   shared: the hook's and the wait's whole seconds are taken off it, and the last step gets at
//!   least 2 s (`minimumGracePeriodInSeconds`): [`SidecarStop`]. A sidecar that exits during
//!   termination is not restarted (the pod is no longer synced, only killed; KEP-4438's
//!   restart during termination is not in 1.33–1.35).
//! - **Jobs** (`kuberuntime_manager.go` `computePodActions`): once no regular container runs or
//!   will be started again, the pod is killed (`KillPod`, `InitContainersToStart = nil`: "To
//!   prevent the restartable init containers to keep pod alive"), through the same kill path.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::kubelet::pod_core::PodCore;
use super::kubelet::PodEvent;
use super::pod_object::{now_ts, CState, PodView, ProbeState, Terminated};
use super::prober::{ProbeResult, ProbeTarget};

/// kubelet's `MaxContainerBackOff`.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// kubelet's `minimumGracePeriodInSeconds`.
pub const MIN_GRACE_SECS: u64 = 2;

/// One container's restart back-off, with the semantics of client-go's `flowcontrol.Backoff`
/// as kubelet's `doBackOff` uses it (no jitter): at the first exit there is no entry yet, so
/// the container is started again at once and the entry is created with the initial back-off;
/// an exit while an entry is fresh waits until `finishedAt + backoff`, and each start after a
/// wait doubles the back-off (capped at [`MAX_BACKOFF`]). An entry not updated for twice the
/// cap is stale (`hasExpired`), and the next exit is treated as a first one again.
#[derive(Debug, Clone)]
pub struct CrashLoopBackOff {
    initial: Duration,
    entry: Option<BackOffEntry>,
}

#[derive(Debug, Clone, Copy)]
struct BackOffEntry {
    backoff: Duration,
    last_update: Instant,
}

impl CrashLoopBackOff {
    /// `initial` is kubelet's `backOffPeriod` (10 s; tests shorten it).
    pub fn new(initial: Duration) -> CrashLoopBackOff {
        CrashLoopBackOff {
            initial,
            entry: None,
        }
    }

    fn expired(entry: &BackOffEntry, event: Instant) -> bool {
        event.saturating_duration_since(entry.last_update) > MAX_BACKOFF * 2
    }

    /// A sync at `now` of a container that exited at `finished`: `None` means start it now
    /// (and the back-off moves on, `Next`); `Some(t)` means it is in back-off until `t`
    /// (kubelet's pod worker syncs again then).
    pub fn sync(&mut self, finished: Instant, now: Instant) -> Option<Instant> {
        if let Some(e) = self.entry {
            let in_backoff =
                !Self::expired(&e, finished) && now.saturating_duration_since(finished) < e.backoff;
            if in_backoff {
                return Some(finished + e.backoff);
            }
        }
        self.entry = Some(match self.entry {
            Some(e) if !Self::expired(&e, finished) => BackOffEntry {
                backoff: (e.backoff * 2).min(MAX_BACKOFF),
                last_update: now,
            },
            _ => BackOffEntry {
                backoff: self.initial.min(MAX_BACKOFF),
                last_update: now,
            },
        });
        None
    }
}

/// Where the kubelet probes a pod's proxy, by the pod's mesh, for both kubelet stand-ins (so they
/// cannot drift): Istio's `/healthz/ready` on pilot-agent's 15021 (injection-template.yaml);
/// Kuma's native sidecar (Unix-socket admin) `/ready` on kuma-dp's readiness port 9902
/// (kumahq/kuma `containers/factory.go`); Consul's native sidecar the exec of
/// `consul-dataplane -check-proxy-health` ([`super::mesh::CONSUL_NATIVE_STARTUP_PROBE`]), which
/// asks Envoy's `/ready` on `127.0.0.1:19000` from inside the pod: the prober asks the same
/// from the pod's netns (its readiness probe, a TCP connect to 20000, is read the same way).
pub fn proxy_probe(v: &PodView) -> (std::net::SocketAddr, &'static str) {
    match v.spec.mesh {
        super::Mesh::Kuma(_) => (
            std::net::SocketAddr::from((v.pod_ip, super::mesh::KUMA_READINESS_PORT)),
            "/ready",
        ),
        super::Mesh::Consul => (
            std::net::SocketAddr::from((
                std::net::Ipv4Addr::LOCALHOST,
                super::mesh::CONSUL_ADMIN_PORT,
            )),
            "/ready",
        ),
        _ => (
            std::net::SocketAddr::from((v.pod_ip, super::istio_init::HEALTH_PORT)),
            "/healthz/ready",
        ),
    }
}

/// A grace period in whole seconds, as the API has it (a fraction is rounded up).
pub fn grace_secs(grace: Duration) -> u64 {
    grace.as_secs() + u64::from(grace.subsec_nanos() > 0)
}

/// The next step of a sidecar's stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopStep {
    /// The preStop hook is running (started at the stop's start).
    Hook { since: Instant },
    /// `waitForTurn`: waiting for the containers it must outlive, up to `left` whole seconds.
    Turn { since: Instant, left: u64 },
    /// `StopContainer` was asked for, with this timeout (SIGKILL after it).
    Signalled { timeout: u64 },
}

/// One sidecar's stop, as `killContainer` runs it with a termination ordering (see the module
/// docs). Pure: the caller feeds it the time and what happened, and performs what it returns.
#[derive(Debug, Clone)]
pub struct SidecarStop {
    grace: u64,
    step: StopStep,
}

impl SidecarStop {
    /// The stop begins at `now` with `grace` whole seconds; `pre_stop`: the container has a
    /// preStop hook (the caller starts it now).
    pub fn begin(grace: u64, pre_stop: bool, now: Instant) -> SidecarStop {
        let step = if pre_stop && grace > 0 {
            StopStep::Hook { since: now }
        } else {
            StopStep::Turn {
                since: now,
                left: grace,
            }
        };
        SidecarStop { grace, step }
    }

    pub fn step(&self) -> StopStep {
        self.step
    }

    /// Moves on: `hook_done` once the hook returned, `turn` once every container it waits for
    /// has exited. Returns `Some(timeout)` exactly once, when it is time to `StopContainer`
    /// (SIGTERM now, SIGKILL `timeout` seconds later).
    pub fn advance(&mut self, now: Instant, hook_done: bool, turn: bool) -> Option<u64> {
        if let StopStep::Hook { since } = self.step {
            // executePreStopHook waits for the hook at most the grace period.
            let limit = since + Duration::from_secs(self.grace);
            if !hook_done && now < limit {
                return None;
            }
            let spent = now.saturating_duration_since(since).as_secs();
            let left = self.grace.saturating_sub(spent);
            self.step = StopStep::Turn { since: now, left };
        }
        if let StopStep::Turn { since, left } = self.step {
            // waitForTurn only runs with time left, and ends at the end of that time.
            let limit = since + Duration::from_secs(left);
            if left > 0 && !turn && now < limit {
                return None;
            }
            let waited = now.saturating_duration_since(since).as_secs();
            let timeout = left.saturating_sub(waited).max(MIN_GRACE_SECS);
            self.step = StopStep::Signalled { timeout };
            return Some(timeout);
        }
        None
    }

    /// When [`SidecarStop::advance`] must be called again even if nothing happens.
    pub fn deadline(&self) -> Option<Instant> {
        match self.step {
            StopStep::Hook { since } => Some(since + Duration::from_secs(self.grace)),
            StopStep::Turn { since, left } => Some(since + Duration::from_secs(left)),
            StopStep::Signalled { .. } => None,
        }
    }
}

/// What a kubelet stand-in keeps about a pod's native sidecar, on both backends: its restart
/// back-off, whether the pod is being killed, and its ordered stop. The backends keep only how
/// they run a container (a process or a CRI call) to themselves.
#[derive(Debug)]
pub struct NativeState {
    backoff: CrashLoopBackOff,
    /// In back-off: started again at this time.
    restart_at: Option<Instant>,
    /// When the sidecar last exited (the back-off counts from its `finishedAt`).
    finished_at: Option<Instant>,
    /// The pod is being killed (deleted, or a Job whose app is done): nothing restarts.
    killing: bool,
    /// The sidecar's ordered stop, once begun.
    stop: Option<SidecarStop>,
    /// Its preStop hook has returned (or there is none).
    hook_done: bool,
}

/// What follows a native sidecar's exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterExit {
    /// Started again at once (no back-off entry yet, or it expired).
    StartNow,
    /// `CrashLoopBackOff` until then.
    BackOffUntil(Instant),
    /// The pod is being killed: it stays terminated.
    Stays,
}

impl NativeState {
    pub fn new(initial_backoff: Duration) -> NativeState {
        NativeState {
            backoff: CrashLoopBackOff::new(initial_backoff),
            restart_at: None,
            finished_at: None,
            killing: false,
            stop: None,
            hook_done: false,
        }
    }

    /// The pod is being killed (deleted, or a Job's end): nothing restarts from now on.
    pub fn kill(&mut self) {
        self.killing = true;
        self.restart_at = None;
    }

    pub fn killing(&self) -> bool {
        self.killing
    }

    /// Whether the sidecar's ordered stop has begun.
    pub fn stopping(&self) -> bool {
        self.stop.is_some()
    }

    /// The sidecar exited at `finished`; `pod_stopping`: the pod is deleted or the node shuts
    /// down. Restarts at once, in back-off, or not at all ([`CrashLoopBackOff`]).
    pub fn exited(&mut self, finished: Instant, now: Instant, pod_stopping: bool) -> AfterExit {
        self.stop = None;
        self.finished_at = Some(finished);
        if pod_stopping || self.killing {
            return AfterExit::Stays;
        }
        match self.backoff.sync(finished, now) {
            None => AfterExit::StartNow,
            Some(at) => {
                self.restart_at = Some(at);
                AfterExit::BackOffUntil(at)
            }
        }
    }

    /// At a timer: whether the sidecar starts again now. The pod worker syncs again at the
    /// back-off's end, and `doBackOff` lets it start (the back-off moves on).
    pub fn restart_due(&mut self, now: Instant, pod_stopping: bool) -> bool {
        if self.restart_at.is_none_or(|t| t > now) {
            return false;
        }
        self.restart_at = None;
        if pod_stopping || self.killing {
            return false;
        }
        let finished = self.finished_at.unwrap_or(now);
        match self.backoff.sync(finished, now) {
            None => true,
            Some(t) => {
                self.restart_at = Some(t);
                false
            }
        }
    }

    /// Begins the sidecar's ordered stop: its preStop hook (if `hook`) now, then its turn.
    pub fn begin_stop(&mut self, grace: u64, hook: bool, now: Instant) {
        self.stop = Some(SidecarStop::begin(grace, hook, now));
        self.hook_done = !hook;
    }

    /// The preStop hook returned (or could not run).
    pub fn hook_done(&mut self) {
        self.hook_done = true;
    }

    /// The stop's next step ([`SidecarStop::advance`]): the timeout to stop the sidecar with,
    /// once, when its hook returned and its `turn` came (or the grace period ran out).
    pub fn advance_stop(&mut self, now: Instant, turn: bool) -> Option<u64> {
        let hook_done = self.hook_done;
        self.stop.as_mut()?.advance(now, hook_done, turn)
    }

    /// Whether a stop deadline passed (call [`NativeState::advance_stop`]).
    pub fn stop_due(&self, now: Instant) -> bool {
        self.stop
            .as_ref()
            .and_then(SidecarStop::deadline)
            .is_some_and(|d| d <= now)
    }

    /// The next time something must happen without an event.
    pub fn deadline(&self) -> Option<Instant> {
        self.restart_at
            .into_iter()
            .chain(self.stop.as_ref().and_then(SidecarStop::deadline))
            .min()
    }
}

/// What a probe result did to the pod's status ([`apply_probe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probed {
    /// For no running container (a stale result).
    Ignored,
    Applied,
    /// The native sidecar's startup probe passed before any regular container started
    /// (`computeInitContainerActions`: the last init container is initialized; the regular
    /// containers start).
    SidecarStarted,
}

/// Applies a probe result to the running container it names: `started` by the startup probe,
/// `ready` by the readiness probe.
pub fn apply_probe(v: &mut PodView, r: &ProbeResult) -> Probed {
    let (id, started, ready) = match r {
        ProbeResult::Started { container_id } => (container_id.as_str(), true, None),
        ProbeResult::Ready {
            container_id,
            ready,
        } => (container_id.as_str(), false, Some(*ready)),
    };
    let c = v
        .containers
        .iter_mut()
        .chain(v.sidecar.iter_mut())
        .find(|c| c.id.as_deref() == Some(id) && c.is_running());
    let Some(c) = c else {
        return Probed::Ignored;
    };
    let p = c.probed.get_or_insert_with(ProbeState::default);
    p.started |= started;
    if let Some(ready) = ready {
        p.ready = ready;
    }
    let first = v
        .sidecar
        .as_ref()
        .is_some_and(|s| s.id.as_deref() == Some(id))
        && v.containers.iter().all(|c| c.id.is_none());
    if started && first {
        Probed::SidecarStarted
    } else {
        Probed::Applied
    }
}

/// Records the sidecar's container `id` running (a restart counts).
pub fn record_sidecar_start(v: &mut PodView, id: &str, pid: Option<u32>, restarting: bool) {
    if let Some(c) = v.sidecar.as_mut() {
        if restarting {
            c.restart_count += 1;
        }
        c.id = Some(id.to_string());
        c.pid = pid;
        c.state = CState::Running {
            started_at: now_ts(),
        };
        c.probed = Some(ProbeState::default());
    }
}

/// Records that the sidecar's container could not be started.
pub fn record_sidecar_start_error(v: &mut PodView, e: &dyn std::fmt::Display) {
    if let Some(c) = v.sidecar.as_mut() {
        c.state = CState::Waiting {
            reason: format!("RunContainerError: {e}"),
        };
    }
}

/// Records the sidecar's exit `t` and what follows: `CrashLoopBackOff` while it waits, its last
/// state kept when it restarts.
pub fn record_sidecar_exit(v: &mut PodView, t: Terminated, next: AfterExit) {
    let Some(c) = v.sidecar.as_mut() else { return };
    c.pid = None;
    match next {
        AfterExit::BackOffUntil(_) => {
            c.last = Some(t);
            c.state = CState::Waiting {
                reason: "CrashLoopBackOff".into(),
            };
        }
        AfterExit::StartNow => {
            c.last = Some(t.clone());
            c.state = CState::Terminated(t);
        }
        AfterExit::Stays => c.state = CState::Terminated(t),
    }
}

/// Every regular container has run and none runs or will start again (`computePodActions`:
/// `keepCount == 0` and nothing to start, so `KillPod`, sidecars included).
pub fn regular_done_for_good(v: &PodView) -> bool {
    v.containers
        .iter()
        .all(|c| c.id.is_some() && !c.is_running() && !v.will_restart(c))
}

/// Records regular container `i` running as `id` (a restart counts; a probed proxy's probe
/// state starts over). Returns whether it is probed (the proxy of a pod with probes).
pub fn record_container_start(
    v: &mut PodView,
    i: usize,
    id: &str,
    pid: Option<u32>,
    restarting: bool,
) -> bool {
    let probed = v.spec.proxy_probes && v.containers[i].name == v.spec.proxy_container();
    let c = &mut v.containers[i];
    if restarting {
        c.restart_count += 1;
    }
    c.id = Some(id.to_string());
    c.pid = pid;
    c.state = CState::Running {
        started_at: now_ts(),
    };
    c.probed = probed.then(ProbeState::default);
    probed
}

/// Records that regular container `i` could not be started.
pub fn record_container_start_error(v: &mut PodView, i: usize, e: &dyn std::fmt::Display) {
    v.containers[i].state = CState::Waiting {
        reason: format!("RunContainerError: {e}"),
    };
}

/// The regular containers whose restart back-off ended by `now`, taken out of `restart_at`.
pub fn restarts_due(restart_at: &mut HashMap<usize, Instant>, now: Instant) -> Vec<usize> {
    let due: Vec<usize> = restart_at
        .iter()
        .filter(|(_, t)| **t <= now)
        .map(|(i, _)| *i)
        .collect();
    for i in &due {
        restart_at.remove(i);
    }
    due
}

/// The preStop hook's command as the stand-ins run it with `sim-app`: `pilot-agent request ...`
/// is `sim-app request ...`, `killall -USR2 kuma-dp` is `sim-app killall-usr2-kuma-dp`.
pub fn pre_stop_sim_args(hook: &[String]) -> Vec<String> {
    if hook.first().map(String::as_str) == Some("killall") {
        vec!["killall-usr2-kuma-dp".into()]
    } else {
        hook.iter().skip(1).cloned().collect()
    }
}

/// Starts the prober of a pod's proxy ([`proxy_probe`] says where, by the pod's mesh), from
/// `netns` (the pod's own on the netns backend; `None`: the node's, as the kubelet probes the pod
/// IP on the containerd backend), its tickers from the pod's admission; results go to `tx`.
pub(crate) fn start_proxy_prober(
    v: &PodView,
    pod: &str,
    netns: Option<std::fs::File>,
    admitted: Instant,
    tx: std::sync::mpsc::Sender<PodEvent>,
) -> ProbeTarget {
    let target = ProbeTarget::default();
    let (addr, path) = proxy_probe(v);
    super::prober::spawn_path(path, pod, netns, addr, admitted, target.clone(), move |r| {
        let _ = tx.send(PodEvent::Probe(r));
    });
    target
}

/// A kubelet stand-in as the native-sidecar rules drive it. The backend says what runs and
/// does what the rules decide (start or stop a container, run the preStop hook: a process or a
/// CRI call); the rules themselves — the app started once the sidecar's startup probe passed,
/// the sidecar restarted with back-off while the pod runs and never during its termination, a
/// Job's pod killed once its regular containers are done for good, the stop order (the regular
/// containers at once, the sidecar's hook at once and its `StopContainer` only once the others
/// have exited) — are the provided methods, so both stand-ins follow them by construction.
pub(crate) trait NativeKubelet {
    /// The worker state both backends share ([`crate::sim::kubelet::pod_core`]).
    fn core(&self) -> &PodCore;
    fn core_mut(&mut self) -> &mut PodCore;
    /// The sidecar's container runs.
    fn sidecar_running(&self) -> bool;
    /// A container the sidecar must outlive still runs (its turn has not come).
    fn others_running(&self) -> bool;
    /// Starts (or restarts) the sidecar's container.
    fn start_sidecar(&mut self);
    /// Starts the regular containers.
    fn start_regular_containers(&mut self);
    /// Stops every running regular container: SIGTERM, SIGKILL after `grace` seconds.
    fn stop_regular(&mut self, grace: u64);
    /// Stops the sidecar's container: SIGTERM, SIGKILL after `timeout` seconds.
    fn stop_sidecar(&mut self, timeout: u64);
    /// Runs the sidecar's preStop hook (bounded by `grace` seconds); its end comes back as
    /// [`NativeKubelet::hook_returned`] (or, when it cannot run, [`NativeState::hook_done`]).
    fn run_pre_stop(&mut self, grace: u64);

    fn native_state(&mut self) -> &mut NativeState {
        &mut self.core_mut().native
    }

    fn native_view<R>(&self, f: impl FnOnce(&PodView) -> R) -> R {
        self.core().view(f)
    }

    fn native_update<R>(&self, f: impl FnOnce(&mut PodView) -> R) -> R {
        self.core().update(f)
    }

    /// The pod is being deleted.
    fn deleting(&self) -> bool {
        self.core().deleting
    }

    /// The node is shutting down.
    fn shutting_down(&self) -> bool {
        self.core().shutting_down
    }

    /// The pod is deleted or the node shuts down.
    fn pod_stopping(&self) -> bool {
        self.core().pod_stopping()
    }

    /// A probe result: the container's `started`/`ready`; a native sidecar's first startup
    /// success lets the regular containers start.
    fn on_probe(&mut self, r: ProbeResult) {
        let probed = self.native_update(|v| apply_probe(v, &r));
        if probed == Probed::SidecarStarted
            && !self.pod_stopping()
            && !self.native_state().killing()
        {
            self.start_regular_containers();
        }
    }

    /// The sidecar's container exited (`t`, at `finished`): started again at once, after its
    /// back-off, or — during the pod's termination — not at all.
    fn sidecar_exited(&mut self, t: Terminated, finished: Instant) {
        let stopping = self.pod_stopping();
        let next = self
            .native_state()
            .exited(finished, Instant::now(), stopping);
        self.native_update(|v| record_sidecar_exit(v, t, next));
        if next == AfterExit::StartNow {
            self.start_sidecar();
        }
    }

    /// A regular container exited (already recorded): while the pod is deleted the sidecar may
    /// now have its turn; otherwise a Job whose regular containers are all done for good is
    /// killed, sidecar included.
    fn after_regular_exit(&mut self) {
        if self.deleting() || self.native_state().killing() {
            self.advance_sidecar_stop();
            return;
        }
        if self.shutting_down() {
            return;
        }
        if self.native_view(regular_done_for_good) {
            self.native_state().kill();
            self.begin_sidecar_stop();
        }
    }

    /// Deletion of a native pod: the regular containers stopped at once with the grace period
    /// (at least 2 s), the sidecar's hook and ordered stop.
    fn on_native_delete(&mut self) {
        self.native_state().kill();
        let grace = self
            .native_view(|v| grace_secs(v.spec.grace))
            .max(MIN_GRACE_SECS);
        self.stop_regular(grace);
        if !self.native_state().stopping() {
            self.begin_sidecar_stop();
        }
    }

    /// Begins the sidecar's stop (if it runs): its preStop hook now, then its turn.
    fn begin_sidecar_stop(&mut self) {
        if !self.sidecar_running() {
            return;
        }
        let (grace, hook) = self.native_view(|v| {
            (
                grace_secs(v.spec.grace),
                v.spec.pre_stop_command().is_some(),
            )
        });
        self.native_state().begin_stop(grace, hook, Instant::now());
        if hook {
            self.run_pre_stop(grace);
        }
        self.advance_sidecar_stop();
    }

    /// The sidecar's preStop hook returned.
    fn hook_returned(&mut self) {
        self.native_state().hook_done();
        self.advance_sidecar_stop();
    }

    /// Moves the sidecar's stop on: stopped once its hook returned and every container it must
    /// outlive has exited (or the grace period ran out), with what is left of the grace period.
    fn advance_sidecar_stop(&mut self) {
        let turn = !self.others_running();
        if let Some(timeout) = self.native_state().advance_stop(Instant::now(), turn) {
            self.stop_sidecar(timeout);
        }
    }

    /// The native timers at `now`: the sidecar's restart after its back-off, its stop's
    /// deadlines.
    fn native_timers(&mut self, now: Instant) {
        let stopping = self.pod_stopping();
        if self.native_state().restart_due(now, stopping) {
            self.start_sidecar();
        }
        if self.native_state().stop_due(now) {
            self.advance_sidecar_stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn first_exit_restarts_at_once_then_backoff_doubles_to_the_cap() {
        let t0 = Instant::now();
        let mut b = CrashLoopBackOff::new(10 * S);
        // First exit: no entry yet, start now (doBackOff: not in back-off, Next).
        assert_eq!(b.sync(t0, t0), None);
        // Second exit 5 s later: in back-off until 10 s after it.
        let t1 = t0 + 5 * S;
        assert_eq!(b.sync(t1, t1), Some(t1 + 10 * S));
        assert_eq!(b.sync(t1, t1 + 9 * S), Some(t1 + 10 * S));
        assert_eq!(b.sync(t1, t1 + 10 * S), None);
        // Third exit: 20 s, then 40, 80, 160, 300 (cap), 300.
        let mut t = t1 + 11 * S;
        for want in [20, 40, 80, 160, 300, 300] {
            assert_eq!(b.sync(t, t), Some(t + want * S), "back-off {want} s");
            assert_eq!(b.sync(t, t + want * S), None);
            t += (want + 1) * S;
        }
    }

    #[test]
    fn a_long_healthy_run_resets_the_backoff() {
        let t0 = Instant::now();
        let mut b = CrashLoopBackOff::new(10 * S);
        assert_eq!(b.sync(t0, t0), None);
        // Exits again after more than twice the cap: treated as a first exit.
        let later = t0 + 601 * S;
        assert_eq!(b.sync(later, later), None);
        // ... and the one after waits the initial back-off again.
        let t = later + S;
        assert_eq!(b.sync(t, t), Some(t + 10 * S));
    }

    #[test]
    fn the_sidecar_is_signalled_after_the_hook_and_its_turn_with_the_rest_of_the_grace() {
        let t0 = Instant::now();
        let mut s = SidecarStop::begin(30, true, t0);
        assert_eq!(s.deadline(), Some(t0 + 30 * S));
        // The hook returns after 50 ms: the sidecar waits for its turn.
        let t = t0 + Duration::from_millis(50);
        assert_eq!(s.advance(t, true, false), None);
        assert_eq!(s.step(), StopStep::Turn { since: t, left: 30 });
        // The app exits 3.7 s later: SIGTERM now, 30 - 3 (whole seconds waited) = 27 s left.
        let app_gone = t + Duration::from_millis(3700);
        assert_eq!(s.advance(app_gone, true, true), Some(27));
        assert_eq!(s.deadline(), None);
        assert_eq!(s.advance(app_gone + S, true, true), None, "only once");
    }

    #[test]
    fn the_turn_ends_with_the_grace_and_the_stop_gets_at_least_two_seconds() {
        let t0 = Instant::now();
        // No hook (the lifecycle override), an app that outlives the grace period.
        let mut s = SidecarStop::begin(5, false, t0);
        assert_eq!(s.advance(t0 + 4 * S, false, false), None);
        assert_eq!(s.advance(t0 + 5 * S, false, false), Some(MIN_GRACE_SECS));
        // A hook that takes the whole grace period: no wait for the turn at all.
        let mut h = SidecarStop::begin(3, true, t0);
        assert_eq!(h.advance(t0 + 2 * S, false, false), None);
        assert_eq!(h.advance(t0 + 3 * S, false, false), Some(MIN_GRACE_SECS));
        // A zero grace period: signalled at once.
        let mut z = SidecarStop::begin(0, true, t0);
        assert_eq!(z.advance(t0, false, false), Some(MIN_GRACE_SECS));
    }

    #[test]
    fn a_sidecar_restarts_in_backoff_while_the_pod_runs_and_not_once_it_is_killed() {
        let t0 = Instant::now();
        let mut n = NativeState::new(10 * S);
        assert_eq!(n.exited(t0, t0, false), AfterExit::StartNow);
        let t1 = t0 + S;
        assert_eq!(
            n.exited(t1, t1, false),
            AfterExit::BackOffUntil(t1 + 10 * S)
        );
        assert_eq!(n.deadline(), Some(t1 + 10 * S));
        assert!(!n.restart_due(t1 + 9 * S, false), "still in back-off");
        assert!(n.restart_due(t1 + 10 * S, false), "back-off over");
        assert_eq!(n.deadline(), None);
        // Killed while in back-off: the restart is dropped, and a later exit stays.
        let t2 = t1 + 11 * S;
        assert!(matches!(
            n.exited(t2, t2, false),
            AfterExit::BackOffUntil(_)
        ));
        n.kill();
        assert!(!n.restart_due(t2 + 60 * S, false));
        assert_eq!(n.exited(t2 + 61 * S, t2 + 61 * S, false), AfterExit::Stays);
        // A deleted pod's sidecar stays too, killed or not.
        let mut d = NativeState::new(10 * S);
        assert_eq!(d.exited(t0, t0, true), AfterExit::Stays);
    }

    #[test]
    fn the_stop_waits_for_the_hook_and_the_turn() {
        let t0 = Instant::now();
        let mut n = NativeState::new(10 * S);
        n.begin_stop(30, true, t0);
        assert!(n.stopping());
        assert_eq!(n.advance_stop(t0, true), None, "hook still running");
        n.hook_done();
        assert_eq!(n.advance_stop(t0 + S, true), Some(29));
        assert!(!n.stop_due(t0 + 60 * S), "signalled: no deadline left");
    }

    #[test]
    fn grace_is_whole_seconds() {
        assert_eq!(grace_secs(Duration::from_secs(30)), 30);
        assert_eq!(grace_secs(Duration::from_millis(2500)), 3);
        assert_eq!(grace_secs(Duration::ZERO), 0);
    }
}
