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

pub type Result<T, E = Error> = std::result::Result<T, E>;

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
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::StatusListen {
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
    let metrics = crate::report::metrics::MetricsHandle::new();
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
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            event = rx.recv() => match event {
                Some(PodEvent::Synced) => {
                    if !synced.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        tracing::info!("first pod list loaded; ready");
                        // Every pod already on the node is now followed: new pods may come.
                        if let Some(client) = kube_client.take() {
                            tokio::spawn(remove_startup_taint(client, config.node_name.clone()));
                        }
                    }
                }
                Some(event) => pods.apply(event, &shared),
                None => {
                    tracing::error!("pod source ended; stopping");
                    break;
                }
            },
            Some(done) = pods.tasks.join_next(), if !pods.tasks.is_empty() => {
                if let Err(e) = done {
                    tracing::error!(error = %e, "a pod task failed");
                }
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

/// The pods being followed: one task per meshed pod, fed through a watch channel. `None` on the
/// channel means the pod is gone.
#[derive(Default)]
struct Pods {
    by_uid: HashMap<String, watch::Sender<Option<PodView>>>,
    /// Pods with the proxy container that are left alone (a `skipped` row each), by uid.
    skipped: HashMap<String, PodKey>,
    tasks: JoinSet<()>,
}

impl Pods {
    fn apply(&mut self, event: PodEvent, shared: &Arc<Shared>) {
        match event {
            PodEvent::Applied(pod) => {
                let cfg = &shared.config;
                match PodView::from_pod(&pod, &cfg.node_name, &cfg.proxy, &cfg.hold) {
                    Ok(view) if view.is_terminal() && !self.by_uid.contains_key(&view.key.uid) => {
                        // Finished before the agent followed it (a Job done, a pod the kubelet
                        // rejected): nothing will run in it again, so no task, no polling, no
                        // row. Hundreds of these (a ReplicaSet whose pods keep being rejected)
                        // cost a parsed view each, then nothing.
                        tracing::debug!(pod = %view.key, phase = ?view.phase, "pod in a terminal phase; not tracked");
                    }
                    Ok(view) => {
                        let uid = view.key.uid.clone();
                        self.skipped.remove(&uid);
                        if let Some(tx) = self.by_uid.get(&uid) {
                            // send_replace: the task reads the latest view; intermediate ones may be skipped.
                            tx.send_replace(Some(view));
                        } else {
                            // One span per pod task: every line it logs names the pod.
                            let span = tracing::info_span!("pod", pod = %view.key, uid = %uid);
                            span.in_scope(|| tracing::info!("tracking pod"));
                            let (tx, rx) = watch::channel(Some(view));
                            self.by_uid.insert(uid, tx);
                            self.tasks.spawn(
                                crate::lifecycle::driver::run(shared.clone(), rx).instrument(span),
                            );
                        }
                    }
                    Err(reason) => {
                        let uid = pod.metadata.uid.clone().unwrap_or_default();
                        if let Some(tx) = self.by_uid.remove(&uid) {
                            tracing::info!(uid = %uid, %reason, "pod no longer tracked");
                            tx.send_replace(None);
                        } else if !matches!(
                            reason,
                            NotTracked::NoProxy | NotTracked::OtherNode | NotTracked::Incomplete(_)
                        ) {
                            // Has the proxy container, left alone on purpose: say so once, on
                            // the board and at info.
                            let key = PodKey {
                                uid: uid.to_ascii_lowercase(),
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
/// a growing pause while the API server says no; never stops the agent.
async fn remove_startup_taint(client: kube::Client, node: String) {
    use crate::effects::node_taint::{self, Removal, STARTUP_TAINT_KEY};
    match node_taint::remove_startup_taint_retrying(client, &node).await {
        Removal::Removed { .. } => {
            tracing::info!(node = %node, taint = STARTUP_TAINT_KEY, "removed the startup taint: pods may be scheduled here");
        }
        Removal::NotThere => {}
        Removal::GaveUp { tries } => {
            tracing::error!(node = %node, taint = STARTUP_TAINT_KEY, tries, "gave up removing the startup taint: remove it by hand (kubectl taint nodes NODE holdfast.io/agent-not-ready-)");
        }
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
}
