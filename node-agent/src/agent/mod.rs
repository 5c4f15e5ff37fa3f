//! The agent: follows the pods on this node and runs one task per meshed pod.
//!
//! - [`run`]: wires the pod source, the per-pod tasks, and the status API.
//! - one pod's lifecycle is [`crate::lifecycle`] (the machine, its driver, the recorder, the
//!   proxy's readiness, the drain and Job executors).
//! - which processes (and so which network namespace) belong to a pod is
//!   [`crate::effects::procfs::pod_procs`], one index shared by every pod's driver.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::{Config, SourceConfig};
use crate::lifecycle::driver::Shared;
use crate::pod::{NotTracked, PodKey, PodView};
use crate::report::board::StatusBoard;
use crate::report::events::PodEvents;
use crate::report::server::{Role, StatusApi};
use crate::source::{dir::PodsDir, PodEvent};

/// Errors that stop the agent at startup. Once running, per-pod problems never stop it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    PodsDir(#[from] crate::source::dir::Error),
    #[error(
        "cannot listen on {addr} for the {what} listener: {source} (choose another --{what}-listen)"
    )]
    StatusListen {
        what: &'static str,
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}")]
    StatusNotLocal(String),
    #[error(transparent)]
    Kube(#[from] crate::source::kube::Error),
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// How often the pods directory is rescanned in full as a safety net (changes arrive through
/// inotify at once).
const PODS_DIR_RESCAN: Duration = Duration::from_secs(10);
/// How long the agent waits for pod tasks to finish on shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Runs the agent until `shutdown` completes.
///
/// On shutdown, holds in progress are left in place (rule and all) for the next agent to adopt:
/// the kernel drops the SYNs this agent was holding when its queue socket closes, TCP
/// retransmits them about a second later, and by then either a new agent holds them again or,
/// with no agent bound, `--queue-bypass` lets them through — never worse than no agent.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<()> {
    let config = Arc::new(config);
    tracing::info!(config = %serde_json::to_string(&*config).unwrap_or_default(), "holdfast agent starting");

    let (tx, mut rx) = mpsc::channel(1024);
    // Entries the source rejected or ignored; the pods-dir source fills it (issue 11).
    let source_problems = crate::source::SourceProblems::default();
    // The API client, when pods come from the API server: the startup taint is removed with it.
    let mut kube_client: Option<kube::Client> = None;
    let (source_task, events) = match &config.source {
        SourceConfig::PodsDir(dir) => {
            let src = PodsDir::new(dir.clone())?.with_problems(source_problems.clone());
            (
                tokio::spawn(src.run(PODS_DIR_RESCAN, tx)),
                PodEvents::log_only(),
            )
        }
        SourceConfig::Kube => {
            let src = crate::source::kube::KubePods::connect(&config.node_name).await?;
            let events = PodEvents::start(src.client(), &config.node_name);
            kube_client = Some(src.client());
            (tokio::spawn(src.run(tx)), events)
        }
    };

    crate::config::check_status_listen(config.status_listen).map_err(Error::StatusNotLocal)?;
    let bind = |role: Role, addr: std::net::SocketAddr| async move {
        let l =
            crate::report::server::bind_listener(addr).map_err(|source| Error::StatusListen {
                what: role.as_str(),
                addr,
                source,
            })?;
        tracing::info!(%addr, listener = role.as_str(), "status API listening");
        Ok::<_, Error>(l)
    };
    let listener = bind(Role::Local, config.status_listen).await?;
    let mut extra_listeners = Vec::new();
    for (role, addr) in [
        (Role::Health, config.health_listen),
        (Role::Metrics, config.metrics_listen),
    ] {
        if let Some(addr) = addr {
            extra_listeners.push((role, bind(role, addr).await?));
        }
    }

    let stop = CancellationToken::new();
    let metrics = crate::report::metrics::MetricsHandle::with_proc_root(&config.proc_root);
    let shared = Arc::new(Shared {
        metrics: metrics.metrics.clone(),
        events,
        config: config.clone(),
        board: StatusBoard::default(),
        procs: crate::effects::procfs::pod_procs::PodProcs::new(config.proc_root.clone()),
        stop: stop.clone(),
        fast_window: Default::default(),
        netns_owners: Default::default(),
    });
    let synced = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let api = StatusApi {
        synced: synced.clone(),
        board: shared.board.clone(),
        config: config.clone(),
        metrics,
        source_problems,
    };
    for (role, l) in extra_listeners {
        tokio::spawn(
            api.clone()
                .serve_role(l, role, stop.clone().cancelled_owned()),
        );
    }
    let api_task = tokio::spawn(api.serve(listener, stop.clone().cancelled_owned()));

    let mut pods = Pods::default();
    let mut expiry = tokio::time::interval(ROW_EXPIRY_EVERY);
    expiry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        let next_opt_in = pods.next_deferred();
        tokio::select! {
            _ = &mut shutdown => break,
            _ = expiry.tick() => pods.expire_rows(std::time::Instant::now(), &shared),
            event = rx.recv() => match event {
                Some(PodEvent::Synced) => {
                    if !synced.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        tracing::info!("first pod list loaded; ready");
                        // Every pod already on the node is now followed: new pods may come.
                        if let Some(client) = kube_client.take() {
                            tokio::spawn(remove_startup_taint(client, config.node_name.clone(), shared.metrics.startup_taint.clone()));
                        }
                    }
                }
                Some(event) => pods.apply(event, &shared),
                None => {
                    tracing::error!("pod source ended; stopping");
                    break;
                }
            },
            Some(done) = pods.tasks.join_next_with_id(), if !pods.tasks.is_empty() => {
                pods.task_ended(done, &shared);
            }
            _ = sleep_until_opt(next_opt_in) => {
                pods.start_due(std::time::Instant::now(), &shared);
            }
        }
    }

    tracing::info!("holdfast agent stopping; holds in progress are left for the next agent");
    stop.cancel();
    source_task.abort();
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while pods.tasks.join_next().await.is_some() {}
    })
    .await;
    let _ = api_task.await;
    Ok(())
}

/// Sleeps until `at`, or for ever with none.
async fn sleep_until_opt(at: Option<std::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// How a pod's task is started: the lifecycle driver (tests inject others, e.g. one that
/// panics, to test the supervision).
type PodTask = Arc<
    dyn Fn(
            Arc<Shared>,
            watch::Receiver<Option<PodView>>,
        ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

/// How often one pod's task may panic and be restarted before the pod is left alone.
const MAX_TASK_RESTARTS: u32 = 3;

/// How long a gone pod's row stays on the status board, so `holdfast status` still shows how
/// its drain went.
const GONE_ROW_RETENTION: Duration = Duration::from_secs(300);

/// How often rows of gone pods are looked at for removal.
const ROW_EXPIRY_EVERY: Duration = Duration::from_secs(10);

/// What the agent remembers of a pod for as long as the pod exists (from its first sighting
/// to its deletion), whatever becomes of its tasks: toggling `holdfast.io/enabled` or a
/// task's panic starts a task anew, never the pod's record (issue 29 item 7, issue 28).
#[derive(Debug)]
struct PodLife {
    /// How often the pod's task panicked and was restarted.
    restarts: u32,
    /// Why the pod is left alone (failed open by its task, or its task kept panicking): no task
    /// is started for it again until it is deleted.
    left_alone: Option<String>,
    /// How often a task of this pod was stopped because the pod stopped being tracked (its
    /// `holdfast.io/enabled` set to "false", mostly), and when last: paces taking it again
    /// ([`opt_in_delay`]).
    opt_outs: u32,
    last_opt_out: Option<std::time::Instant>,
}

impl PodLife {
    fn new() -> PodLife {
        PodLife {
            restarts: 0,
            left_alone: None,
            opt_outs: 0,
            last_opt_out: None,
        }
    }
}

/// How long after its last opt-out a pod opted in again waits before its lifecycle starts anew:
/// nothing the first time (an operator's `kubectl annotate` false then true), then 1 s doubling
/// to [`OPT_IN_DELAY_MAX`] with each further opt-out while the pod lives. Issue 29: each opt-in
/// starts a lifecycle — a netns lookup, a readiness look and, while Envoy is not ready, a hold
/// installed and removed (two `iptables-restore`s each) — and a pod flipping its annotation 10
/// times a second cost the agent ~6 ms of CPU per flip (0.07 cores of its 0.2, optimised
/// build, `holdfast-soak --hostile --scenario annotation-toggle`). Meanwhile the pod is as
/// without holdfast, which is what it asked for half of the time.
fn opt_in_delay(opt_outs: u32) -> Duration {
    match opt_outs {
        0 | 1 => Duration::ZERO,
        n => crate::backoff::Backoff::doubling(OPT_IN_DELAY_FIRST, OPT_IN_DELAY_MAX).after(n - 2),
    }
}

/// The first pause of [`opt_in_delay`].
const OPT_IN_DELAY_FIRST: Duration = Duration::from_secs(1);
/// The longest pause of [`opt_in_delay`].
const OPT_IN_DELAY_MAX: Duration = Duration::from_secs(60);

/// The pods being followed: one task per meshed pod, fed through a watch channel. `None` on the
/// channel means the pod is gone. Tasks are supervised: one that panics is counted
/// (`holdfast_pod_task_panics_total`), logged with its pod, noted on its row, and started again
/// on the pod's latest view — its lifecycle begins anew on the kept row and adopts its hold or
/// drain, as after an agent restart — at most [`MAX_TASK_RESTARTS`] times, then the pod is left
/// alone (as without the agent; a hold it left passes traffic by `--queue-bypass`) with the
/// reason on its row. A pod's rows and what it is owed live as long as the pod ([`PodLife`]):
/// a gone pod's row is removed [`GONE_ROW_RETENTION`] after its task ended, unless a task or a
/// `skipped` row of the same pod has it again.
struct Pods {
    by_uid: HashMap<String, watch::Sender<Option<PodView>>>,
    /// Pods with the proxy container that are left alone (a `skipped` row each), by uid.
    skipped: HashMap<String, PodKey>,
    tasks: JoinSet<()>,
    /// Which pod each task serves.
    task_pod: HashMap<tokio::task::Id, PodKey>,
    /// Every pod tracked at some point and not deleted since, by uid.
    lives: HashMap<String, PodLife>,
    /// Rows whose task ended, and when: removed after [`GONE_ROW_RETENTION`].
    gone_rows: HashMap<String, (PodKey, std::time::Instant)>,
    start_task: PodTask,
    /// A digest of each pod's last applied object (as the source slimmed it, without its
    /// `resourceVersion`), by uid: an update that changes nothing holdfast reads is dropped
    /// before it is parsed ([`Pods::unchanged`]).
    last_seen: HashMap<String, u64>,
    /// Keys of those digests, random per agent, so no pod can aim for a collision.
    digest_keys: std::collections::hash_map::RandomState,
    /// Pods opted in again whose lifecycle starts when due ([`opt_in_delay`]), with their
    /// latest view, by uid.
    deferred: HashMap<String, (std::time::Instant, PodView)>,
}

impl Default for Pods {
    fn default() -> Self {
        Pods::with_task(Arc::new(|shared, rx| {
            Box::pin(crate::lifecycle::driver::run(shared, rx))
        }))
    }
}

impl Pods {
    fn with_task(start_task: PodTask) -> Pods {
        Pods {
            by_uid: HashMap::new(),
            skipped: HashMap::new(),
            tasks: JoinSet::new(),
            task_pod: HashMap::new(),
            lives: HashMap::new(),
            gone_rows: HashMap::new(),
            start_task,
            last_seen: HashMap::new(),
            digest_keys: Default::default(),
            deferred: HashMap::new(),
        }
    }

    /// Whether `pod` is the same object as the last one applied under its uid, as far as
    /// holdfast reads it (the source keeps only what [`PodView::from_pod`] reads:
    /// [`crate::source::slim`]); records it otherwise. A label or an unread annotation changed
    /// in a loop, or a status field holdfast does not read, then costs one serialization and a
    /// hash, never a parse (issue 29).
    fn unchanged(&mut self, pod: &mut k8s_openapi::api::core::v1::Pod) -> bool {
        use std::hash::{BuildHasher, Hasher};
        /// Feeds serialized bytes into a hasher without building them.
        struct HashWriter<H>(H);
        impl<H: Hasher> std::io::Write for HashWriter<H> {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.write(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let Some(uid) = pod.metadata.uid.as_deref().filter(|u| !u.is_empty()) else {
            return false;
        };
        let uid = uid.to_ascii_lowercase();
        pod.metadata.resource_version = None;
        let mut w = HashWriter(self.digest_keys.build_hasher());
        if serde_json::to_writer(&mut w, &*pod).is_err() {
            return false;
        }
        let digest = w.0.finish();
        self.last_seen.insert(uid, digest) == Some(digest)
    }

    /// When pod `uid`, opted in again, may be taken again, if not now ([`opt_in_delay`]).
    fn opt_in_due(&self, uid: &str) -> Option<std::time::Instant> {
        let life = self.lives.get(uid)?;
        let due = life.last_opt_out? + opt_in_delay(life.opt_outs);
        (due > std::time::Instant::now()).then_some(due)
    }

    /// The earliest deferred opt-in.
    fn next_deferred(&self) -> Option<std::time::Instant> {
        self.deferred.values().map(|(due, _)| *due).min()
    }

    /// Starts the lifecycles of the deferred pods due by `now`.
    fn start_due(&mut self, now: std::time::Instant, shared: &Arc<Shared>) {
        let due: Vec<String> = self
            .deferred
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in due {
            let Some((_, view)) = self.deferred.remove(&uid) else {
                continue;
            };
            if !self.by_uid.contains_key(&uid) {
                self.track(shared, view);
            }
        }
    }

    /// Starts following a pod that has no task: its task on a new channel fed `view`.
    fn track(&mut self, shared: &Arc<Shared>, view: PodView) {
        let uid = view.key.uid.clone();
        self.skipped.remove(&uid);
        tracing::info!(pod = %view.key, uid = %uid, "tracking pod");
        let key = view.key.clone();
        let (tx, rx) = watch::channel(Some(view));
        self.by_uid.insert(uid, tx);
        self.spawn(shared, &key, rx);
    }

    /// Starts the task of pod `uid` on `rx`, in the pod's span (every line it logs names it).
    fn spawn(&mut self, shared: &Arc<Shared>, key: &PodKey, rx: watch::Receiver<Option<PodView>>) {
        let span = tracing::info_span!("pod", pod = %key, uid = %key.uid);
        let task = (self.start_task)(shared.clone(), rx).instrument(span);
        let handle = self.tasks.spawn(task);
        self.task_pod.insert(handle.id(), key.clone());
        self.gone_rows.remove(&key.uid);
        self.lives
            .entry(key.uid.clone())
            .or_insert_with(PodLife::new);
    }

    /// A task ended: forget it; if it ended on its own, keep its row a while and remember
    /// whether it left the pod alone; if it panicked, count it, say so on the row and start the
    /// pod's lifecycle again (see [`Pods`]).
    fn task_ended(
        &mut self,
        done: Result<(tokio::task::Id, ()), tokio::task::JoinError>,
        shared: &Arc<Shared>,
    ) {
        let (id, failure) = match done {
            Ok((id, ())) => (id, None),
            Err(e) => (e.id(), Some(e)),
        };
        let key = self.task_pod.remove(&id);
        let Some(e) = failure else {
            if let Some(key) = key {
                self.task_finished(key, shared);
            }
            return;
        };
        if !e.is_panic() {
            // Cancelled: only at shutdown.
            return;
        }
        shared.metrics.pod_task_panics.inc();
        let Some(key) = key else {
            tracing::error!(error = %e, "a pod task panicked (an agent bug)");
            return;
        };
        let uid = key.uid.clone();
        let Some(tx) = self.by_uid.get(&uid) else {
            tracing::error!(uid = %uid, error = %e, "a pod task panicked (an agent bug); the pod is gone");
            self.gone_rows.insert(uid, (key, std::time::Instant::now()));
            return;
        };
        let key = tx.borrow().as_ref().map_or(key, |v| v.key.clone());
        let life = self.lives.entry(uid.clone()).or_insert_with(PodLife::new);
        life.restarts += 1;
        let restarts = life.restarts;
        let rec = crate::lifecycle::record::Recorder {
            key: key.clone(),
            board: shared.board.clone(),
            metrics: shared.metrics.clone(),
            events: shared.events.clone(),
        };
        if restarts > MAX_TASK_RESTARTS {
            tracing::error!(pod = %key, error = %e, restarts = MAX_TASK_RESTARTS, "a pod task panicked again (an agent bug); leaving the pod alone, as without holdfast");
            let reason = format!(
                "the agent's task for this pod panicked {} times (an agent bug: please report \
                 it); left alone, as without holdfast",
                MAX_TASK_RESTARTS + 1
            );
            life.left_alone = Some(reason.clone());
            self.by_uid.remove(&uid);
            crate::lifecycle::record::Recorder::left_alone(&shared.board, &key, &reason);
            self.skipped.insert(uid, key);
            return;
        }
        tracing::error!(pod = %key, error = %e, restart = restarts, "a pod task panicked (an agent bug: please report it); restarting the pod's lifecycle, which adopts its hold or drain");
        rec.problem(format!(
            "the agent's task for this pod panicked (an agent bug: please report it): restarted \
             ({restarts} of {MAX_TASK_RESTARTS}), adopting its hold or drain"
        ));
        let rx = tx.subscribe();
        self.spawn(shared, &key, rx);
    }

    /// A pod's task ended on its own (the pod gone or no longer tracked): its row is removed
    /// [`GONE_ROW_RETENTION`] later, and a pod it left alone (failed open: its row says
    /// `skipped`, with the reason) stays alone if it is tracked again.
    fn task_finished(&mut self, key: PodKey, shared: &Arc<Shared>) {
        let failed_open = shared
            .board
            .snapshot_row(&key.namespace, &key.name)
            .filter(|row| row.uid == key.uid && row.phase == crate::api::Phase::Skipped)
            .map(|row| row.skipped_reason.unwrap_or_default());
        if let (Some(why), Some(life)) = (failed_open, self.lives.get_mut(&key.uid)) {
            life.left_alone.get_or_insert(why);
        }
        self.gone_rows
            .insert(key.uid.clone(), (key, std::time::Instant::now()));
    }

    /// Removes the rows of pods gone for [`GONE_ROW_RETENTION`] (as of `now`), unless a task
    /// or a `skipped` row of the same pod has the row again.
    fn expire_rows(&mut self, now: std::time::Instant, shared: &Arc<Shared>) {
        let due: Vec<String> = self
            .gone_rows
            .iter()
            .filter(|(_, (_, at))| now.saturating_duration_since(*at) >= GONE_ROW_RETENTION)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in due {
            let Some((key, _)) = self.gone_rows.remove(&uid) else {
                continue;
            };
            let kept = self.by_uid.contains_key(&uid)
                || self.skipped.contains_key(&uid)
                || self.lives.get(&uid).is_some_and(|l| l.left_alone.is_some());
            if !kept {
                shared
                    .board
                    .remove_if_uid(&key.namespace, &key.name, &key.uid);
            }
        }
    }

    fn apply(&mut self, event: PodEvent, shared: &Arc<Shared>) {
        match event {
            PodEvent::Applied(mut pod) => {
                if self.unchanged(&mut pod) {
                    return;
                }
                let cfg = &shared.config;
                match PodView::from_pod(&pod, &cfg.node_name, &cfg.proxy, &cfg.hold) {
                    Ok(view) if view.is_terminal() && !self.by_uid.contains_key(&view.key.uid) => {
                        // Finished before the agent followed it (a Job done, a pod the kubelet
                        // rejected): nothing will run in it again, so no task, no polling, no
                        // row. Hundreds of these (a ReplicaSet whose pods keep being rejected)
                        // cost a parsed view each, then nothing.
                        tracing::debug!(pod = %view.key, phase = ?view.phase, "pod in a terminal phase; not tracked");
                        self.deferred.remove(&view.key.uid);
                    }
                    Ok(view)
                        if self
                            .lives
                            .get(&view.key.uid)
                            .is_some_and(|l| l.left_alone.is_some()) =>
                    {
                        // Left alone for good (failed open, or its task kept panicking): an
                        // update, or the opt-out annotation toggled, does not undo that.
                        if let Some(tx) = self.by_uid.get(&view.key.uid) {
                            tx.send_replace(Some(view));
                        }
                    }
                    Ok(view) => {
                        let uid = view.key.uid.clone();
                        if let Some(tx) = self.by_uid.get(&uid) {
                            self.skipped.remove(&uid);
                            // send_replace: the task reads the latest view; intermediate ones may be skipped.
                            tx.send_replace(Some(view));
                        } else if let Some(due) = self.opt_in_due(&uid) {
                            // Taken again when due, on its latest view.
                            if !self.deferred.contains_key(&uid) {
                                let wait = due.saturating_duration_since(std::time::Instant::now());
                                let opt_outs = self.lives.get(&uid).map_or(0, |l| l.opt_outs);
                                tracing::info!(pod = %view.key, uid = %uid, opt_outs, wait_ms = wait.as_millis() as u64, "pod opted in again; taken again after a pause");
                                let reason = format!(
                                    "opted in again after {opt_outs} opt-outs: taken again in {:.1} s (a pod's lifecycle restarts at most at a pace that halves with each opt-out, down to one a minute); meanwhile as without holdfast",
                                    wait.as_secs_f64()
                                );
                                crate::lifecycle::record::Recorder::skipped(
                                    &shared.board,
                                    &view.key,
                                    &reason,
                                );
                                self.skipped.insert(uid.clone(), view.key.clone());
                            }
                            self.deferred.insert(uid, (due, view));
                        } else {
                            self.track(shared, view);
                        }
                    }
                    Err(reason) => {
                        // Keys are lower case (PodView::from_pod): a pod whose uid the source
                        // spells in capitals must find its task.
                        let uid = pod
                            .metadata
                            .uid
                            .clone()
                            .unwrap_or_default()
                            .to_ascii_lowercase();
                        self.deferred.remove(&uid);
                        if let Some(tx) = self.by_uid.remove(&uid) {
                            tracing::info!(uid = %uid, %reason, "pod no longer tracked");
                            tx.send_replace(None);
                            if let Some(life) = self.lives.get_mut(&uid) {
                                life.opt_outs = life.opt_outs.saturating_add(1);
                                life.last_opt_out = Some(std::time::Instant::now());
                            }
                        } else if self.lives.get(&uid).is_some_and(|l| l.left_alone.is_some()) {
                            // Its row says why it is left alone; keep that.
                        } else if !matches!(
                            reason,
                            NotTracked::NoProxy | NotTracked::OtherNode | NotTracked::Incomplete(_)
                        ) {
                            // Has the proxy container, left alone on purpose: say so once, on
                            // the board and at info.
                            let key = PodKey {
                                uid: uid.clone(),
                                namespace: pod
                                    .metadata
                                    .namespace
                                    .clone()
                                    .unwrap_or_else(|| "default".into()),
                                name: pod.metadata.name.clone().unwrap_or_default(),
                            };
                            if self.skipped.get(&key.uid) != Some(&key) {
                                crate::lifecycle::record::Recorder::skipped(
                                    &shared.board,
                                    &key,
                                    &reason.to_string(),
                                );
                                self.skipped.insert(key.uid.clone(), key);
                            }
                        }
                    }
                }
            }
            PodEvent::Synced => {}
            PodEvent::Deleted { uid } => {
                let uid = uid.to_ascii_lowercase();
                self.lives.remove(&uid);
                self.last_seen.remove(&uid);
                self.deferred.remove(&uid);
                if let Some(tx) = self.by_uid.remove(&uid) {
                    tx.send_replace(None);
                }
                if let Some(key) = self.skipped.remove(&uid) {
                    shared
                        .board
                        .remove_if_uid(&key.namespace, &key.name, &key.uid);
                }
            }
        }
    }
}

/// Removes the agent's startup taint from its node (docs/install.md, "New nodes"), retrying with
/// a growing pause while the API server says no, for as long as the agent runs; never stops the
/// agent.
async fn remove_startup_taint(
    client: kube::Client,
    node: String,
    metrics: crate::effects::node_taint::TaintMetrics,
) {
    use crate::effects::node_taint::{self, Removal, STARTUP_TAINT_KEY};
    match node_taint::remove_startup_taint_retrying(client, &node, &metrics).await {
        Removal::Removed { tries } => {
            tracing::info!(node = %node, taint = STARTUP_TAINT_KEY, tries, "removed the startup taint: pods may be scheduled here");
        }
        Removal::NotThere => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Phase;
    use crate::config::{DrainSettings, HoldSettings, ProxyConfig};
    use crate::pod::tests::pod_json;
    use serde_json::json;

    fn shared() -> Arc<Shared> {
        let config = Arc::new(Config {
            node_name: "node-a".into(),
            source: SourceConfig::PodsDir("/nonexistent".into()),
            status_listen: ([127, 0, 0, 1], 0).into(),
            health_listen: None,
            metrics_listen: None,
            proc_root: "/proc".into(),
            proxy: ProxyConfig::default(),
            hold: HoldSettings::default(),
            drain: DrainSettings::default(),
        });
        Arc::new(Shared {
            procs: crate::effects::procfs::pod_procs::PodProcs::new(config.proc_root.clone()),
            config,
            board: StatusBoard::default(),
            stop: CancellationToken::new(),
            metrics: crate::report::metrics::MetricsHandle::new().metrics,
            events: PodEvents::log_only(),
            fast_window: Default::default(),
            netns_owners: Default::default(),
        })
    }

    /// A pod found in a terminal phase (a Job done, a pod the kubelet rejected) gets no task and
    /// no row; a tracked pod that turns terminal is followed to its end.
    #[tokio::test]
    async fn terminal_pods_are_not_tracked() {
        let shared = shared();
        let mut pods = Pods::default();
        for i in 0..300 {
            let rejected = pod_json(json!({
                "metadata": {"name": format!("rejected-{i}"), "uid": format!("u-rejected-{i}")},
                "status": {"phase": "Failed", "reason": "OutOfcpu"}
            }));
            pods.apply(PodEvent::Applied(Box::new(rejected)), &shared);
        }
        assert!(pods.tasks.is_empty() && pods.by_uid.is_empty());
        assert!(shared.board.snapshot().is_empty());
        let running = pod_json(json!({"status": {"phase": "Running"}}));
        pods.apply(PodEvent::Applied(Box::new(running)), &shared);
        assert_eq!(pods.by_uid.len(), 1);
        let done = pod_json(json!({"status": {"phase": "Succeeded"}}));
        pods.apply(PodEvent::Applied(Box::new(done)), &shared);
        assert_eq!(pods.by_uid.len(), 1, "a tracked pod is followed to its end");
        shared.stop.cancel();
    }

    /// A pod with the proxy container that is left alone gets a `skipped` row with the reason;
    /// pods without the proxy or on another node get none; deletion removes the row.
    #[tokio::test]
    async fn skipped_pods_are_on_the_board_with_the_reason() {
        let shared = shared();
        let mut pods = Pods::default();
        let host = pod_json(json!({"spec": {"hostNetwork": true}}));
        pods.apply(PodEvent::Applied(Box::new(host.clone())), &shared);
        // A repeat (every update of the pod) neither duplicates nor re-logs.
        pods.apply(PodEvent::Applied(Box::new(host)), &shared);
        pods.apply(
            PodEvent::Applied(Box::new(pod_json(json!({
                "metadata": {"name": "other", "uid": "u-other"},
                "spec": {"nodeName": "node-b"}
            })))),
            &shared,
        );
        pods.apply(
            PodEvent::Applied(Box::new(pod_json(json!({
                "metadata": {"name": "plain", "uid": "u-plain"},
                "spec": {"containers": [{"name": "app"}]}
            })))),
            &shared,
        );
        let rows = shared.board.snapshot();
        assert_eq!(rows.len(), 1, "{rows:#?}");
        assert_eq!(rows[0].name, "web-1");
        assert_eq!(rows[0].phase, Phase::Skipped);
        assert_eq!(
            rows[0].skipped_reason.as_deref(),
            Some(NotTracked::HostNetwork.to_string().as_str())
        );
        pods.apply(
            PodEvent::Deleted {
                uid: "2C48913C-b29f-4a8e-9c4b-0123456789ab".into(),
            },
            &shared,
        );
        assert!(shared.board.snapshot().is_empty());
        assert!(pods.tasks.is_empty());
    }

    /// An update that changes nothing holdfast reads (a label, an unread annotation, a new
    /// resourceVersion: `kubectl label` in a loop) is dropped before it is parsed and never
    /// reaches the pod's task; one that changes what it reads does.
    #[tokio::test]
    async fn an_update_holdfast_does_not_read_costs_nothing() {
        let shared = shared();
        let (task, _seen) = scripted_task(&[]);
        let mut pods = Pods::with_task(task);
        let base = json!({"metadata": {"resourceVersion": "1"}});
        let apply = |pods: &mut Pods, v: serde_json::Value| {
            pods.apply(
                PodEvent::Applied(Box::new(crate::source::slim(pod_json(v)))),
                &shared,
            )
        };
        apply(&mut pods, base.clone());
        let uid = "2c48913c-b29f-4a8e-9c4b-0123456789ab";
        let mut rx = pods.by_uid[uid].subscribe();
        rx.borrow_and_update();
        for i in 2..50 {
            let mut v = base.clone();
            v["metadata"]["resourceVersion"] = json!(i.to_string());
            v["metadata"]["labels"] = json!({"loop": i.to_string()});
            v["metadata"]["annotations"] = json!({"example.com/nonce": i.to_string()});
            apply(&mut pods, v);
            assert!(!rx.has_changed().unwrap(), "update {i} reached the task");
        }
        let mut v = base.clone();
        v["status"] = json!({"phase": "Running"});
        apply(&mut pods, v);
        assert!(
            rx.has_changed().unwrap(),
            "a change holdfast reads goes through"
        );
        shared.stop.cancel();
    }

    /// A scripted task's starts and the pod names it saw (`None`: gone).
    type TaskLog = Arc<std::sync::Mutex<(u32, Vec<Option<String>>)>>;

    /// A test pod task: counts its starts, records the views it sees, panics on the starts
    /// `panic_on` names (1-based), and otherwise runs until its pod is gone.
    fn scripted_task(panic_on: &'static [u32]) -> (PodTask, TaskLog) {
        let seen = Arc::new(std::sync::Mutex::new((0u32, Vec::new())));
        let log = seen.clone();
        let task: PodTask = Arc::new(move |_shared, mut rx| {
            let log = log.clone();
            Box::pin(async move {
                let start = {
                    let mut l = log.lock().expect("log");
                    l.0 += 1;
                    l.0
                };
                if panic_on.contains(&start) {
                    panic!("test fault hook: start {start} panics");
                }
                loop {
                    let name = rx.borrow_and_update().as_ref().map(|v| v.key.name.clone());
                    log.lock().expect("log").1.push(name.clone());
                    if name.is_none() || rx.changed().await.is_err() {
                        return;
                    }
                }
            })
        });
        (task, seen)
    }

    /// Drives the task set until `n` tasks ended, handing each end to the supervision.
    async fn reap(pods: &mut Pods, shared: &Arc<Shared>, n: usize) {
        for _ in 0..n {
            let done = tokio::time::timeout(Duration::from_secs(5), pods.tasks.join_next_with_id())
                .await
                .expect("a task ends")
                .expect("a task");
            pods.task_ended(done, shared);
        }
    }

    /// A panicking pod task is counted, and the pod's lifecycle starts again on its latest view
    /// (which adopts a hold or a drain, as after an agent restart); a pod whose task keeps
    /// panicking is left alone after three restarts, with the reason on its row.
    #[tokio::test]
    async fn a_panicking_pod_task_is_counted_and_restarted() {
        let shared = shared();
        let (task, seen) = scripted_task(&[1]);
        let mut pods = Pods::with_task(task);
        let pod = pod_json(json!({}));
        pods.apply(PodEvent::Applied(Box::new(pod.clone())), &shared);
        reap(&mut pods, &shared, 1).await;
        assert_eq!(shared.metrics.pod_task_panics.get(), 1);
        // The second start follows the pod (its latest view first) and ends when it goes.
        tokio::time::timeout(Duration::from_secs(5), async {
            while seen.lock().expect("log").1.is_empty() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the restarted task runs");
        pods.apply(PodEvent::Applied(Box::new(pod)), &shared);
        pods.apply(
            PodEvent::Deleted {
                uid: "2C48913C-b29f-4a8e-9c4b-0123456789ab".into(),
            },
            &shared,
        );
        reap(&mut pods, &shared, 1).await;
        let (starts, views) = seen.lock().expect("log").clone();
        assert_eq!(starts, 2, "restarted once");
        assert_eq!(views.first(), Some(&Some("web-1".to_string())), "{views:?}");
        assert_eq!(views.last(), Some(&None), "{views:?}");
        assert_eq!(shared.metrics.pod_task_panics.get(), 1);

        // Always panicking: three restarts, then the pod is left alone.
        let shared = super::tests::shared();
        let (task, seen) = scripted_task(&[1, 2, 3, 4, 5]);
        let mut pods = Pods::with_task(task);
        pods.apply(PodEvent::Applied(Box::new(pod_json(json!({})))), &shared);
        reap(&mut pods, &shared, 4).await;
        assert!(pods.tasks.is_empty());
        assert_eq!(seen.lock().expect("log").0, 4);
        assert_eq!(shared.metrics.pod_task_panics.get(), 4);
        let rows = shared.board.snapshot();
        assert_eq!(rows.len(), 1, "{rows:#?}");
        assert_eq!(rows[0].phase, Phase::Skipped);
        assert!(
            rows[0]
                .skipped_reason
                .as_deref()
                .is_some_and(|r| r.contains("panicked 4 times")),
            "{rows:#?}"
        );
    }

    /// A test pod task that writes the pod's row as the driver does (`Recorder::start`),
    /// counts its starts, panics on the starts `panic_on` names and fails the pod open (a
    /// `FailedOpen` outcome, as the machine records a broken bound) on those `fail_open_on`
    /// names; then runs until its pod is gone.
    fn recording_task(
        panic_on: &'static [u32],
        fail_open_on: &'static [u32],
    ) -> (PodTask, Arc<std::sync::Mutex<u32>>) {
        let starts = Arc::new(std::sync::Mutex::new(0u32));
        let count = starts.clone();
        let task: PodTask = Arc::new(move |shared, mut rx| {
            let count = count.clone();
            Box::pin(async move {
                let start = {
                    let mut n = count.lock().expect("starts");
                    *n += 1;
                    *n
                };
                let Some(view) = rx.borrow_and_update().clone() else {
                    return;
                };
                let rec = crate::lifecycle::record::Recorder {
                    key: view.key.clone(),
                    board: shared.board.clone(),
                    metrics: shared.metrics.clone(),
                    events: shared.events.clone(),
                };
                rec.start(None, view.mode, view.profile.mesh);
                if panic_on.contains(&start) {
                    panic!("test fault hook: start {start} panics");
                }
                if fail_open_on.contains(&start) {
                    rec.outcome(&crate::lifecycle::machine::Outcome::FailedOpen {
                        why: "a test bound".into(),
                    });
                }
                while rx.changed().await.is_ok() {
                    if rx.borrow_and_update().is_none() {
                        return;
                    }
                }
            })
        });
        (task, starts)
    }

    fn opted_out(enabled: bool) -> k8s_openapi::api::core::v1::Pod {
        pod_json(json!({"metadata": {"annotations": {
            "holdfast.io/enabled": if enabled { "true" } else { "false" }
        }}}))
    }

    /// Issue 29 item 7: `holdfast.io/enabled` false then true. The pod's row is kept (its
    /// timeline goes on: the new task's start is a step on it) and the first task's end does
    /// not remove it 300 s later while the second task runs (before: the old task's removal
    /// timer deleted the live row). Uses the real lifecycle driver (the pod never shows a
    /// process, so it waits for its netns).
    #[tokio::test(start_paused = true)]
    async fn toggling_the_opt_out_keeps_the_live_row() {
        let shared = shared();
        let mut pods = Pods::default();
        pods.apply(PodEvent::Applied(Box::new(opted_out(true))), &shared);
        let row = |shared: &Arc<Shared>| shared.board.snapshot_row("shop", "web-1");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let first = row(&shared).expect("a row");
        pods.apply(PodEvent::Applied(Box::new(opted_out(false))), &shared);
        reap(&mut pods, &shared, 1).await;
        pods.apply(PodEvent::Applied(Box::new(opted_out(true))), &shared);
        assert_eq!(pods.tasks.len(), 1, "tracked again");
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Past the retention of the first task's row, the second task's row is there, the
        // same row: its first sighting and the new start on one timeline.
        tokio::time::sleep(GONE_ROW_RETENTION + Duration::from_secs(1)).await;
        pods.expire_rows(
            std::time::Instant::now() + GONE_ROW_RETENTION + Duration::from_secs(1),
            &shared,
        );
        let live = row(&shared).expect("the live task's row is kept");
        assert_eq!(live.tracked_since, first.tracked_since, "{live:#?}");
        let steps: Vec<_> = live
            .timeline
            .as_ref()
            .expect("a timeline")
            .steps
            .iter()
            .filter(|s| s.step == crate::api::StepKind::FirstSeen)
            .map(|s| s.detail.clone())
            .collect();
        assert_eq!(steps.len(), 2, "{steps:?}");
        assert!(steps[1]
            .as_deref()
            .is_some_and(|d| d.contains("tracked again")));

        // Deleted: the row stays for the retention, then goes.
        pods.apply(
            PodEvent::Deleted {
                uid: "2C48913C-b29f-4a8e-9c4b-0123456789ab".into(),
            },
            &shared,
        );
        reap(&mut pods, &shared, 1).await;
        pods.expire_rows(std::time::Instant::now(), &shared);
        assert!(row(&shared).is_some(), "kept a while after the pod is gone");
        pods.expire_rows(std::time::Instant::now() + GONE_ROW_RETENTION, &shared);
        assert!(row(&shared).is_none(), "then removed");
        shared.stop.cancel();
    }

    /// Issue 29 item 7: a pod failed open stays alone when the opt-out annotation is toggled
    /// (before: the toggle started a new task, which failed the pod open again — the
    /// failed-open counter counted toggles, and "left alone" was forgotten).
    #[tokio::test]
    async fn toggling_the_opt_out_does_not_undo_left_alone() {
        let shared = shared();
        let (task, starts) = recording_task(&[], &[1, 2, 3]);
        let mut pods = Pods::with_task(task);
        pods.apply(PodEvent::Applied(Box::new(opted_out(true))), &shared);
        tokio::time::timeout(Duration::from_secs(5), async {
            while shared.metrics.pods_failed_open.get() == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("failed open");
        for _ in 0..3 {
            pods.apply(PodEvent::Applied(Box::new(opted_out(false))), &shared);
            if !pods.tasks.is_empty() {
                reap(&mut pods, &shared, 1).await;
            }
            pods.apply(PodEvent::Applied(Box::new(opted_out(true))), &shared);
            tokio::task::yield_now().await;
        }
        assert!(pods.tasks.is_empty(), "no new task for a pod left alone");
        assert_eq!(*starts.lock().expect("starts"), 1);
        assert_eq!(
            shared.metrics.pods_failed_open.get(),
            1,
            "one pod, counted once"
        );
        let row = shared.board.snapshot_row("shop", "web-1").expect("its row");
        assert_eq!(row.phase, Phase::Skipped);
        assert!(
            row.skipped_reason
                .as_deref()
                .is_some_and(|r| r.contains("a test bound")),
            "{row:#?}"
        );
        // Still there long after (a left-alone pod's row lives as long as the pod).
        pods.expire_rows(std::time::Instant::now() + GONE_ROW_RETENTION * 2, &shared);
        assert!(shared.board.snapshot_row("shop", "web-1").is_some());
        // Deleted: forgotten; a pod of the same name later is a new pod.
        pods.apply(
            PodEvent::Deleted {
                uid: "2C48913C-b29f-4a8e-9c4b-0123456789ab".into(),
            },
            &shared,
        );
        assert!(pods.lives.is_empty());
    }

    /// Issue 29: a pod flipping `holdfast.io/enabled` is taken again at once after its first
    /// opt-out, then after 1 s, 2 s, … (to a minute): each opt-in between waits, with its row
    /// saying so, and is taken on its latest view when due; an opt-out meanwhile cancels it.
    /// Before, every flip started a lifecycle (a netns lookup, a readiness look, a hold
    /// installed and removed while Envoy was not ready).
    #[tokio::test]
    async fn a_toggling_pod_is_taken_again_at_a_pace() {
        let shared = shared();
        let (task, starts) = recording_task(&[], &[]);
        let mut pods = Pods::with_task(task);
        let uid = "2c48913c-b29f-4a8e-9c4b-0123456789ab";
        let started = || *starts.lock().expect("starts");
        let off = |pods: &mut Pods| {
            pods.apply(PodEvent::Applied(Box::new(opted_out(false))), &shared);
        };
        let on = |pods: &mut Pods| {
            pods.apply(PodEvent::Applied(Box::new(opted_out(true))), &shared);
        };
        on(&mut pods);
        assert_eq!((pods.tasks.len(), pods.deferred.len()), (1, 0));
        off(&mut pods);
        reap(&mut pods, &shared, 1).await;
        // The first opt-in after an opt-out: at once (an operator's annotate false, then true).
        on(&mut pods);
        assert_eq!((pods.tasks.len(), pods.deferred.len()), (1, 0));
        off(&mut pods);
        reap(&mut pods, &shared, 1).await;
        // The second: after 1 s.
        on(&mut pods);
        assert!(pods.tasks.is_empty(), "deferred, not started");
        let due = pods.next_deferred().expect("a deferred opt-in");
        let wait = due.saturating_duration_since(std::time::Instant::now());
        assert!(
            wait > Duration::from_millis(500) && wait <= OPT_IN_DELAY_FIRST,
            "{wait:?}"
        );
        let row = shared.board.snapshot_row("shop", "web-1").expect("its row");
        assert_eq!(row.phase, Phase::Skipped, "{row:#?}");
        assert!(
            row.skipped_reason
                .as_deref()
                .is_some_and(|r| r.contains("opted in again after 2 opt-outs")),
            "{row:#?}"
        );
        // Updates meanwhile change the view it will start on, not the time.
        on(&mut pods);
        assert_eq!(pods.next_deferred(), Some(due));
        pods.start_due(due - Duration::from_millis(1), &shared);
        assert!(pods.tasks.is_empty(), "not before it is due");
        pods.start_due(due, &shared);
        assert_eq!(pods.tasks.len(), 1, "taken again when due");
        assert!(pods.deferred.is_empty());
        tokio::task::yield_now().await;
        assert_eq!(started(), 3);
        // The third waits 2 s; an opt-out meanwhile cancels it.
        off(&mut pods);
        reap(&mut pods, &shared, 1).await;
        on(&mut pods);
        let wait = pods
            .next_deferred()
            .expect("deferred")
            .saturating_duration_since(std::time::Instant::now());
        assert!(wait > OPT_IN_DELAY_FIRST, "{wait:?}");
        off(&mut pods);
        assert!(pods.deferred.is_empty(), "an opt-out cancels the opt-in");
        // Deleted: forgotten, and a new pod of the same name is taken at once.
        on(&mut pods);
        assert_eq!(pods.deferred.len(), 1);
        pods.apply(PodEvent::Deleted { uid: uid.into() }, &shared);
        assert!(pods.deferred.is_empty() && pods.lives.is_empty());
        assert_eq!(opt_in_delay(40), OPT_IN_DELAY_MAX);
        assert_eq!(started(), 3);
        shared.stop.cancel();
    }

    /// Issue 28: a task restarted after a panic keeps the pod's row (its timeline and
    /// `last_error`, the panic a step on it), and a pod left alone after its task kept
    /// panicking stays alone at the next Pod update (before: a fresh row at each restart, and
    /// the next update started a task again).
    #[tokio::test]
    async fn a_panicked_task_keeps_the_row_and_left_alone_sticks() {
        let shared = shared();
        let (task, starts) = recording_task(&[1], &[]);
        let mut pods = Pods::with_task(task);
        pods.apply(PodEvent::Applied(Box::new(pod_json(json!({})))), &shared);
        reap(&mut pods, &shared, 1).await;
        tokio::time::timeout(Duration::from_secs(5), async {
            while *starts.lock().expect("starts") < 2 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("restarted");
        tokio::task::yield_now().await;
        let row = shared.board.snapshot_row("shop", "web-1").expect("its row");
        let kinds: Vec<_> = row
            .timeline
            .as_ref()
            .expect("timeline")
            .steps
            .iter()
            .map(|s| s.step.as_str())
            .collect();
        assert_eq!(kinds, ["first-seen", "problem", "first-seen"], "{row:#?}");
        assert!(
            row.last_error
                .as_deref()
                .is_some_and(|e| e.contains("panicked")),
            "{row:#?}"
        );

        // Always panicking: left alone after three restarts, and it stays so.
        let shared = super::tests::shared();
        let (task, starts) = recording_task(&[1, 2, 3, 4, 5, 6], &[]);
        let mut pods = Pods::with_task(task);
        pods.apply(PodEvent::Applied(Box::new(pod_json(json!({})))), &shared);
        reap(&mut pods, &shared, 4).await;
        pods.apply(PodEvent::Applied(Box::new(pod_json(json!({})))), &shared);
        assert!(pods.tasks.is_empty(), "the next update starts no task");
        assert_eq!(*starts.lock().expect("starts"), 4);
        let row = shared.board.snapshot_row("shop", "web-1").expect("its row");
        assert_eq!(row.phase, Phase::Skipped);
        let steps = &row.timeline.as_ref().expect("timeline").steps;
        assert_eq!(
            steps
                .iter()
                .filter(|s| s.step.as_str() == "problem")
                .count(),
            3,
            "each restart a step: {steps:#?}"
        );
        assert_eq!(steps.last().map(|s| s.step.as_str()), Some("skipped"));
    }

    /// A pod whose uid the source spells in capitals: its task is found (keys are lower case)
    /// when it stops being tracked, and ends.
    #[tokio::test]
    async fn an_upper_case_uid_finds_its_task() {
        let shared = shared();
        let (task, seen) = scripted_task(&[]);
        let mut pods = Pods::with_task(task);
        let upper = json!({"metadata": {"uid": "2C48913C-B29F-4A8E-9C4B-0123456789AB"}});
        pods.apply(
            PodEvent::Applied(Box::new(pod_json(upper.clone()))),
            &shared,
        );
        assert_eq!(pods.by_uid.len(), 1);
        // The same pod, opted out: no longer tracked.
        let mut opted = upper;
        opted["metadata"]["annotations"] = json!({"holdfast.io/enabled": "false"});
        pods.apply(PodEvent::Applied(Box::new(pod_json(opted))), &shared);
        assert!(pods.by_uid.is_empty(), "the task's sender is dropped");
        reap(&mut pods, &shared, 1).await;
        assert_eq!(
            seen.lock().expect("log").1.last(),
            Some(&None),
            "the task saw the pod go"
        );
    }
}
