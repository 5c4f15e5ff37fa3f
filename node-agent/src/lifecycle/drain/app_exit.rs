//! Watching the app's processes exit.
//!
//! - [`ExitWatcher`]: one notification per process exit, from a pidfd (`pidfd_open(2)`, Linux
//!   5.3+) registered with tokio's reactor: the pidfd turns readable the moment the process
//!   exits (becomes a zombie), so the drain learns of the app's last exit within microseconds
//!   instead of at the next poll. Kernels without pidfds fall back to polling
//!   `<proc-root>/<pid>/stat` (the `procfs` crate, under the agent's `--proc-root`).
//! - [`AppTracker`]: which of a pod's processes are the app's (non-proxy containers, found by
//!   container id; the sandbox's pause process and the proxy's processes are not), re-scanned
//!   as new processes can appear (an app forking a helper), and what that says about each app
//!   container: still running, exited, never started, or not visible.
//!
//! One `unsafe` call, in `register`: handing the pidfd to tokio's reactor (tokio made that
//! registration `unsafe` because it cannot check the fd's ownership; an `OwnedFd` satisfies it).
//! `pidfd_open` itself is rustix's safe wrapper returning an `OwnedFd`.

#![deny(unsafe_code)]

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use rustix::process::{pidfd_open, Pid, PidfdFlags};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::task::{Id, JoinSet};

use crate::effects::procfs::pod_procs::{PodProcess, PodProcs, NEW_PER_DRAIN_LOOK};
use crate::pod::{
    app_end, AppContainerEnd, AppEnd, AppNow, ContainerRestart, ContainerState, PodKey, PodView,
    RestartPolicy,
};

/// Poll interval of the fallback for kernels without pidfds.
const FALLBACK_POLL: Duration = Duration::from_millis(10);

/// What [`ExitWatcher::watch`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// The process is alive and watched: [`ExitWatcher::next_exit`] reports its exit.
    Watching,
    /// The process had already exited (or the pid is not in use): nothing to watch.
    AlreadyExited,
}

/// Exit notifications for a set of processes.
#[derive(Debug)]
pub struct ExitWatcher {
    /// Each task ends when its process exits, with the pid and the moment the exit was seen.
    tasks: JoinSet<(i32, Instant)>,
    by_task: HashMap<Id, i32>,
    watched: HashSet<i32>,
    /// Set once `pidfd_open` said the kernel lacks it, so it is not tried for every pid.
    no_pidfd: bool,
    /// The pod, for log lines (`namespace/name`; empty when not watching a pod's processes).
    pod: String,
    /// Where the processes' `stat` files are read when pidfds cannot tell (the agent's
    /// `--proc-root`).
    proc_root: Arc<Path>,
}

impl Default for ExitWatcher {
    fn default() -> Self {
        ExitWatcher::new()
    }
}

impl ExitWatcher {
    /// A watcher of this process's own `/proc`.
    pub fn new() -> ExitWatcher {
        ExitWatcher {
            tasks: JoinSet::new(),
            by_task: HashMap::new(),
            watched: HashSet::new(),
            no_pidfd: false,
            pod: String::new(),
            proc_root: Arc::from(Path::new("/proc")),
        }
    }

    /// A watcher whose log lines name the pod, reading `proc_root` (the agent's
    /// `--proc-root`) where pidfds cannot tell.
    pub(crate) fn for_pod(pod: &PodKey, proc_root: &Path) -> ExitWatcher {
        ExitWatcher {
            pod: pod.to_string(),
            proc_root: Arc::from(proc_root),
            ..ExitWatcher::new()
        }
    }

    /// Starts watching `pid` (a thread-group leader). Must be called within a tokio runtime.
    /// A pid that is already watched stays watched; a pid that is gone or a zombie counts as
    /// exited.
    pub fn watch(&mut self, pid: i32) -> Watch {
        if self.watched.contains(&pid) {
            return Watch::Watching;
        }
        let how = if self.no_pidfd {
            Opened::Unsupported
        } else {
            open_exit_fd(&self.proc_root, pid, &self.pod)
        };
        let root = self.proc_root.clone();
        let task = match how {
            Opened::Exited => return Watch::AlreadyExited,
            Opened::Alive(fd) => match register(fd) {
                Ok(fd) => self.tasks.spawn(async move {
                    // Readable = exited. An error from the reactor (never seen in practice) would
                    // otherwise lose the exit: poll procfs instead.
                    if fd.readable().await.is_err() {
                        poll_until_gone(&root, pid).await;
                    }
                    (pid, Instant::now())
                }),
                Err(e) => {
                    tracing::debug!(pid, error = %e, "cannot register a pidfd with the reactor; polling procfs");
                    self.tasks.spawn(async move {
                        poll_until_gone(&root, pid).await;
                        (pid, Instant::now())
                    })
                }
            },
            Opened::Unsupported => {
                if !self.no_pidfd {
                    tracing::info!("pidfd_open is not available (Linux < 5.3?); polling procfs for process exits");
                }
                self.no_pidfd = true;
                if process_gone(&root, pid) {
                    return Watch::AlreadyExited;
                }
                self.tasks.spawn(async move {
                    poll_until_gone(&root, pid).await;
                    (pid, Instant::now())
                })
            }
        };
        self.by_task.insert(task.id(), pid);
        self.watched.insert(pid);
        Watch::Watching
    }

    /// The pids watched by pidfd and not reported as exited: each is still the process it was
    /// (empty when exits are polled: a polled pid could be reused unnoticed).
    pub(crate) fn pidfd_watched(&self) -> HashSet<i32> {
        if self.no_pidfd {
            HashSet::new()
        } else {
            self.watched.clone()
        }
    }

    /// True while `pid` is watched and has not been reported as exited.
    pub(crate) fn is_watching(&self, pid: i32) -> bool {
        self.watched.contains(&pid)
    }

    /// Number of watched processes not yet reported as exited.
    pub fn live(&self) -> usize {
        self.watched.len()
    }

    /// Waits for a watched process to exit; returns its pid and when the exit was noticed
    /// (which may be earlier than this call's return, if the caller was busy). Never completes
    /// while nothing is watched, so it can sit in a `select!` next to other branches. Cancel safe.
    pub async fn next_exit(&mut self) -> (i32, Instant) {
        loop {
            match self.tasks.join_next_with_id().await {
                Some(done) => {
                    if let Some(exit) = self.take(done) {
                        return exit;
                    }
                }
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// Forgets the pid of a finished watch task: the exit it reports.
    fn take(
        &mut self,
        done: Result<(Id, (i32, Instant)), tokio::task::JoinError>,
    ) -> Option<(i32, Instant)> {
        match done {
            Ok((id, (pid, at))) => {
                self.by_task.remove(&id);
                self.watched.remove(&pid);
                Some((pid, at))
            }
            // Only a panic (none can happen in these tasks) or an abort gets here: forget the
            // pid rather than wait for it forever.
            Err(e) => {
                let pid = self.by_task.remove(&e.id())?;
                self.watched.remove(&pid);
                Some((pid, Instant::now()))
            }
        }
    }
}

impl ExitWatcher {
    /// The exits already noticed and not yet taken (each as [`ExitWatcher::next_exit`] returns
    /// it), without waiting: a group of processes killed at once reaches the caller as one
    /// batch, so it looks at the pod once rather than once per process.
    pub(crate) fn ready_exits(&mut self) -> Vec<(i32, Instant)> {
        let mut out = Vec::new();
        while let Some(done) = self.tasks.try_join_next_with_id() {
            out.extend(self.take(done));
        }
        out
    }
}

/// Registers a pidfd with tokio's reactor, for readability (= the process exited).
#[allow(unsafe_code)]
fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: `register_with_interest` requires that the fd stays open and refers to the same
    // file description for the `AsyncFd`'s whole life, and that `as_raw_fd` always returns it.
    // The `AsyncFd` takes ownership of the `OwnedFd`: its raw fd never changes, and it is closed
    // only when dropped, which `AsyncFd`'s drop does after deregistering. Nothing calls
    // `get_mut` or `into_inner` on it.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(|e| e.into_parts().1)
}

enum Opened {
    Alive(OwnedFd),
    Exited,
    Unsupported,
}

/// Opens a pidfd for `pid` and tells whether the process has already exited.
fn open_exit_fd(proc_root: &Path, pid: i32, pod: &str) -> Opened {
    // pid <= 0 names no single process (rustix asserts on negative pids).
    let Some(raw) = (pid > 0).then(|| Pid::from_raw(pid)).flatten() else {
        return Opened::Exited;
    };
    match pidfd_open(raw, PidfdFlags::empty()) {
        Ok(fd) => {
            // A zombie's pidfd is readable at once: check now, so a process that exited before
            // we looked is reported as exited rather than as a watch that fires immediately.
            let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::ZERO) {
                Ok(n) if n > 0 => Opened::Exited,
                _ => Opened::Alive(fd),
            }
        }
        Err(rustix::io::Errno::SRCH) => Opened::Exited,
        Err(rustix::io::Errno::NOSYS) => Opened::Unsupported,
        // EINVAL: not a thread-group leader (cannot happen for /proc entries); EMFILE and the
        // like: polling still works.
        Err(e) => {
            tracing::debug!(pod, pid, error = %e, "pidfd_open failed; polling procfs for this process");
            if process_gone(proc_root, pid) {
                Opened::Exited
            } else {
                Opened::Unsupported
            }
        }
    }
}

async fn poll_until_gone(proc_root: &Path, pid: i32) {
    while !process_gone(proc_root, pid) {
        tokio::time::sleep(FALLBACK_POLL).await;
    }
}

/// True when `<proc_root>/<pid>` is gone or the process is a zombie (`Z`) or dead (`X`), read
/// by the `procfs` crate (proc(5) `stat`; it maps ENOENT and ESRCH to `NotFound`).
fn process_gone(proc_root: &Path, pid: i32) -> bool {
    let stat = procfs::process::Process::new_with_root(proc_root.join(pid.to_string()))
        .and_then(|p| p.stat());
    match stat {
        Ok(stat) => matches!(stat.state, 'Z' | 'X'),
        Err(procfs::ProcError::NotFound(_)) => true,
        Err(_) => false,
    }
}

/// Where the pod's processes come from: [`PodProcsSource`] in the agent, a fixed list in tests.
pub trait PodProcessSource: Send + Sync {
    /// Every live process of the pod (sandbox, proxy and app alike), with its container id.
    fn processes(&self) -> impl Future<Output = Vec<PodProcess>> + Send;

    /// Like [`PodProcessSource::processes`], without the pids in `watched` (the caller holds
    /// a live pidfd on each: the same process, nothing to check again). A source that checks
    /// each pid it hands out ([`PodProcsSource`]) skips those checks.
    fn processes_except(
        &self,
        watched: HashSet<i32>,
    ) -> impl Future<Output = Vec<PodProcess>> + Send {
        let all = self.processes();
        async move {
            let mut all = all.await;
            all.retain(|p| !watched.contains(&p.pid));
            all
        }
    }

    /// Sends SIGTERM to the main process of container `container_id` (the proxy container's:
    /// the mesh's agent); the pid signalled, or why not.
    fn terminate_main(
        &self,
        container_id: &str,
    ) -> impl Future<Output = Result<i32, String>> + Send {
        let _ = container_id;
        std::future::ready(Err("this process source cannot signal".to_string()))
    }

    /// The procfs the processes are read from (the agent's `--proc-root`), where their `stat`
    /// is looked at when pidfds cannot tell an exit.
    fn proc_root(&self) -> PathBuf {
        PathBuf::from("/proc")
    }
}

/// The agent's process index, for one pod.
#[derive(Debug, Clone)]
pub struct PodProcsSource {
    procs: PodProcs,
    uid: String,
}

impl PodProcsSource {
    /// `uid` is the pod's canonical (lowercase) uid, as in [`crate::pod::PodKey`].
    pub fn new(procs: PodProcs, uid: impl Into<String>) -> PodProcsSource {
        PodProcsSource {
            procs,
            uid: uid.into(),
        }
    }
}

impl PodProcessSource for PodProcsSource {
    fn processes(&self) -> impl Future<Output = Vec<PodProcess>> + Send {
        self.procs.of_pod(&self.uid)
    }

    fn processes_except(
        &self,
        watched: HashSet<i32>,
    ) -> impl Future<Output = Vec<PodProcess>> + Send {
        self.procs
            .of_pod_except(&self.uid, watched, NEW_PER_DRAIN_LOOK)
    }

    fn proc_root(&self) -> PathBuf {
        self.procs.proc_root()
    }

    async fn terminate_main(&self, container_id: &str) -> Result<i32, String> {
        let pids: Vec<i32> = self
            .procs
            .of_pod(&self.uid)
            .await
            .into_iter()
            .filter(|p| p.container_id.as_deref() == Some(container_id))
            .map(|p| p.pid)
            .collect();
        let proc_root = self.procs.proc_root();
        tokio::task::spawn_blocking(move || {
            crate::effects::procfs::proxy_procs::terminate_main(&proc_root, &pids)
        })
        .await
        .unwrap_or_else(|e| Err(format!("the signal task did not finish: {e}")))
    }
}

/// Where one app container is, as far as the agent can tell.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum AppContainer {
    /// This many of its processes are alive.
    Live { pids: usize },
    /// The kubelet reports it terminated.
    Terminated { exit_code: i32 },
    /// Its processes are all gone (seen by the agent, before the kubelet reports it).
    Exited,
    /// It has not been created (no container id, not running).
    NotStarted,
    /// The kubelet says it runs, but none of its processes is visible and the agent cannot
    /// prove it would see them (no other process of the pod is visible by container id either).
    Unseen,
}

/// The app's state after a refresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppSnapshot {
    /// App processes alive now.
    pub live: usize,
    /// Per app container, by name.
    pub containers: Vec<(String, AppContainer)>,
}

impl AppSnapshot {
    /// How far the app is from finished, by status and procfs together ([`app_end()`], the one
    /// rule): the pod's `policy` and each container's `own` restart rules say whether the
    /// kubelet would restart an exited container.
    pub fn end(&self, policy: RestartPolicy, own: impl Fn(&str) -> ContainerRestart) -> AppEnd {
        app_end(
            policy,
            self.containers.iter().map(|(name, c)| {
                let (ran, now) = match c {
                    AppContainer::Live { .. } | AppContainer::Unseen => (true, AppNow::Running),
                    AppContainer::Terminated { exit_code } => (
                        true,
                        AppNow::Terminated {
                            exit_code: *exit_code,
                        },
                    ),
                    AppContainer::Exited => (true, AppNow::Exited),
                    AppContainer::NotStarted => (false, AppNow::Waiting),
                };
                AppContainerEnd {
                    ran,
                    now,
                    restart: own(name),
                }
            }),
        )
    }

    /// Every app container ran and is gone, and no app process is alive: the drain's "app
    /// done" (the kubelet restarts nothing of a pod being deleted). A container that never
    /// started (still `waiting`: ContainerCreating, a slow image pull) does not count as done —
    /// its pod gets no early quit; the deadline or the pod going ends the drain.
    pub fn gone_for_drain(&self) -> bool {
        self.live == 0
            && self.end(RestartPolicy::Always, |_| ContainerRestart::default()) >= AppEnd::Exited
    }
}

/// Follows the app's processes of one pod.
#[derive(Debug)]
pub struct AppTracker<S> {
    source: S,
    watcher: ExitWatcher,
    /// Watched pid → container id.
    pid_container: HashMap<i32, String>,
    /// Container ids with a process seen alive at some point.
    seen_alive: HashSet<String>,
    /// Set once a process of the pod was seen under a container id the pod's status names:
    /// procfs classification works for this pod, so an app container without processes has
    /// exited (rather than being invisible).
    visibility_proven: bool,
    /// When the last exit notification arrived.
    last_exit: Option<Instant>,
    /// App processes seen in total.
    processes_seen: usize,
}

impl<S: PodProcessSource> AppTracker<S> {
    /// The process source the tracker reads.
    pub(crate) fn source(&self) -> &S {
        &self.source
    }

    pub fn new(pod: &PodKey, source: S) -> AppTracker<S> {
        AppTracker {
            watcher: ExitWatcher::for_pod(pod, &source.proc_root()),
            source,
            pid_container: HashMap::new(),
            seen_alive: HashSet::new(),
            visibility_proven: false,
            last_exit: None,
            processes_seen: 0,
        }
    }

    /// Re-scans the pod's processes, watches new app processes, and reports where each app
    /// container is: those the proxy must outlive (`PodView::containers_before_proxy_stops`).
    /// For a classic proxy the regular containers only: the kubelet stops restartable init
    /// containers (native sidecars such as log shippers) after every regular container, the
    /// proxy included, has exited (kubernetes pkg/kubelet/kuberuntime
    /// kuberuntime_termination_order.go), so waiting for them would hold the drain to its
    /// deadline. For a native proxy also the sidecars started after it, which the kubelet stops
    /// before it. `view` is the latest view of the pod (container ids and states).
    pub async fn refresh(&mut self, view: &PodView) -> AppSnapshot {
        let known_ids: HashSet<&str> = view
            .containers
            .iter()
            .filter_map(|c| c.id.as_deref())
            .collect();
        let app_ids: HashSet<&str> = view
            .containers_before_proxy_stops()
            .filter_map(|c| c.id.as_deref())
            .collect();
        // Processes already watched by pidfd are the same processes until their exit is
        // reported: not handed out (nor re-checked) again.
        for p in self
            .source
            .processes_except(self.watcher.pidfd_watched())
            .await
        {
            let Some(cid) = p.container_id.as_deref() else {
                continue;
            };
            if known_ids.contains(cid) {
                self.visibility_proven = true;
            }
            if !app_ids.contains(cid) || self.watcher.is_watching(p.pid) {
                continue;
            }
            if self.watcher.watch(p.pid) == Watch::Watching {
                self.processes_seen += 1;
                self.seen_alive.insert(cid.to_string());
                self.pid_container.insert(p.pid, cid.to_string());
            }
        }
        // Watched pids of containers no longer named (restarted under a new id) still count:
        // they are app processes until they exit.
        self.pid_container
            .retain(|pid, _| self.watcher.is_watching(*pid));

        let mut live_per_id: HashMap<&str, usize> = HashMap::new();
        for cid in self.pid_container.values() {
            *live_per_id.entry(cid.as_str()).or_default() += 1;
        }
        let containers = view
            .containers_before_proxy_stops()
            .map(|c| {
                let live = c.id.as_deref().and_then(|id| live_per_id.get(id).copied());
                let seen =
                    c.id.as_deref()
                        .is_some_and(|id| self.seen_alive.contains(id));
                let state = match (c.state, live) {
                    (ContainerState::Terminated { exit_code }, _) => {
                        AppContainer::Terminated { exit_code }
                    }
                    (_, Some(pids)) => AppContainer::Live { pids },
                    (_, None) if seen => AppContainer::Exited,
                    // Running by status with an id, yet no process: exited, if the agent can see
                    // this pod's processes at all.
                    (ContainerState::Running, None) if c.id.is_some() && self.visibility_proven => {
                        AppContainer::Exited
                    }
                    (ContainerState::Running, None) => AppContainer::Unseen,
                    (ContainerState::Waiting, None) => AppContainer::NotStarted,
                };
                (c.name.clone(), state)
            })
            .collect();
        AppSnapshot {
            live: self.watcher.live(),
            containers,
        }
    }

    /// Waits for the next app process exit (see [`ExitWatcher::next_exit`]); records when.
    /// Cancel safe.
    pub async fn next_exit(&mut self) -> (i32, Instant) {
        let (pid, at) = self.watcher.next_exit().await;
        self.last_exit = Some(self.last_exit.map_or(at, |t| t.max(at)));
        self.pid_container.remove(&pid);
        (pid, at)
    }

    /// Takes every app process exit already noticed, without waiting (see
    /// [`ExitWatcher::ready_exits`]); records the last. The number taken.
    pub(crate) fn take_ready_exits(&mut self) -> usize {
        let exits = self.watcher.ready_exits();
        for (pid, at) in &exits {
            self.last_exit = Some(self.last_exit.map_or(*at, |t| t.max(*at)));
            self.pid_container.remove(pid);
        }
        exits.len()
    }

    /// When the last app process exit was noticed.
    pub(crate) fn last_exit(&self) -> Option<Instant> {
        self.last_exit
    }

    /// App processes watched and not yet seen exiting.
    pub(crate) fn live(&self) -> usize {
        self.watcher.live()
    }

    /// App processes seen alive since the tracker started.
    pub(crate) fn processes_seen(&self) -> usize {
        self.processes_seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_not_gone() {
        let proc = Path::new("/proc");
        assert!(!process_gone(proc, std::process::id() as i32));
        assert!(process_gone(proc, i32::MAX));
        // Under another proc root: what is there, not this process's `/proc`.
        assert!(process_gone(
            Path::new("/nonexistent-proc"),
            std::process::id() as i32
        ));
    }

    #[tokio::test]
    async fn watching_an_impossible_pid_reports_it_exited() {
        let mut w = ExitWatcher::new();
        assert_eq!(w.watch(0), Watch::AlreadyExited);
        assert_eq!(w.watch(-5), Watch::AlreadyExited);
        assert_eq!(w.watch(i32::MAX), Watch::AlreadyExited);
        assert_eq!(w.live(), 0);
        // Nothing watched: next_exit never completes.
        assert!(
            tokio::time::timeout(Duration::from_millis(20), w.next_exit())
                .await
                .is_err()
        );
    }

    /// Issue 29: processes that end together reach the drain as one batch (one rescan).
    #[tokio::test]
    async fn exits_already_noticed_are_taken_together() {
        let mut children: Vec<std::process::Child> = (0..3)
            .map(|_| {
                std::process::Command::new("sleep")
                    .arg("30")
                    .spawn()
                    .expect("sleep")
            })
            .collect();
        let mut w = ExitWatcher::new();
        for c in &children {
            assert_eq!(w.watch(c.id() as i32), Watch::Watching);
        }
        assert!(w.ready_exits().is_empty(), "nothing has exited yet");
        for c in &mut children {
            c.kill().expect("kill");
            c.wait().expect("reap");
        }
        let (first, _) = tokio::time::timeout(Duration::from_secs(5), w.next_exit())
            .await
            .expect("an exit");
        // The other two exits are noticed by their tasks without this caller waiting on them.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut rest = Vec::new();
        while rest.len() < 2 && Instant::now() < deadline {
            tokio::task::yield_now().await;
            rest.extend(w.ready_exits().into_iter().map(|(pid, _)| pid));
        }
        rest.push(first);
        rest.sort_unstable();
        let mut want: Vec<i32> = children.iter().map(|c| c.id() as i32).collect();
        want.sort_unstable();
        assert_eq!(rest, want);
        assert_eq!(w.live(), 0);
    }
}
