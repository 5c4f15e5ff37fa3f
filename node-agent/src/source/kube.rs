//! The in-cluster pod source: a kube-rs watcher on the pods of this node only
//! (`spec.nodeName=<node>` field selector, one list+watch per agent, never a cluster-wide watch).
//!
//! This module owns:
//! - building the API client from the in-cluster service account (or a kubeconfig), with an error
//!   that says what is missing (`KubePods::connect`);
//! - turning watcher events into [`PodEvent`]s (`EventMapper`, pure and unit-tested), including
//!   the relist diff: after a re-list (the watcher restarts after a 410 Gone, a desync or a
//!   reconnect), a pod known before and absent from the new list was deleted while the watch was
//!   down, and is reported [`PodEvent::Deleted`] so it is not tracked forever;
//! - the run loop ([`KubePods::run`]): watch errors (connection refused, 410 Gone, 5xx, timeouts)
//!   are logged, rate-limited, and retried after [`WATCH_RETRY`] (capped at 5 s, jittered). They are
//!   never fatal and never produce events: the agent keeps its pods' last state until the watch
//!   is back.
//!
//! Idle cost per pod is nothing: one watch stream (one HTTP connection) for the whole node; with
//! no pod changes the task is parked on that socket. There is no timer or poll per pod — the only
//! per-pod state is a uid in `EventMapper`'s set — and the periodic work is per watch, not per
//! pod: a re-watch when the server closes the stream (kube-runtime 5 `watcher::Config::default()`
//! asks `timeoutSeconds=290`) and the API server's periodic bookmark events (`bookmarks: true`), both
//! per watch. [`PodEvent::Synced`] is sent once, after the first complete list (`InitDone`).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::Api;

use crate::backoff::Backoff;
use tokio::sync::mpsc;

use super::PodEvent;

/// Errors building the API client (a failing watch is not an error of the source: it retries).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "cannot configure a Kubernetes API client ({missing}): {source}; run the agent in a pod \
         with a service account token mounted, set KUBECONFIG to a kubeconfig, or use --pods-dir"
    )]
    ClientConfig {
        /// What of the usual configuration was not found, for the message.
        missing: String,
        source: kube::Error,
    },
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// How often a persisting watch error is logged at most (the first one is logged at once).
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(30);
/// Pods per list page. kube-rs asks for 500 by default, and a page is held whole in memory
/// while it is read: 500 full Pod objects (tens of KiB each with `managedFields`) are tens of
/// MiB at list time, and again after every restart or relist. 50 keeps a page to a few MiB; a
/// node has at most 110 pods by default, so a list is still two or three requests.
pub const LIST_PAGE_SIZE: u32 = 50;

/// The pause after each failed list or watch: 0.5 s doubling to 5 s, each jittered into its upper
/// half ([`crate::backoff::jittered`]). Not client-go's 30 s cap (kube-rs's `DefaultBackoff`):
/// the agent must see a pod before the kubelet starts its app, and the kubelet's own watch
/// recovers from an API server restart on client-go's schedule. On a real cluster (issue 38,
/// docs/real-cluster.md) a ~10 s API server restart left the agent's watch at 12–25 s steps, so
/// pods applied right after it was back were seen 26–70 s later and started without a hold.
/// With the cap the watch is back within 5 s of the server. The cost is the same one list per
/// agent, spread over 5 s instead of 30: the lists are field-selected to one node and served
/// from the API server's watch cache.
pub const WATCH_RETRY: Backoff =
    Backoff::doubling(Duration::from_millis(500), Duration::from_secs(5));

/// Follows the pods of one node through the API server.
pub struct KubePods {
    api: Api<Pod>,
    node: String,
}

impl KubePods {
    /// The API client this source watches with (shared with the event publisher).
    pub(crate) fn client(&self) -> kube::Client {
        self.api.clone().into_client()
    }
}

impl std::fmt::Debug for KubePods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubePods")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl KubePods {
    /// Builds the client from the environment: a kubeconfig (`KUBECONFIG` or `~/.kube/config`)
    /// if there is one, else the in-cluster service account (`KUBERNETES_SERVICE_HOST`/`_PORT`
    /// and the mounted token). No request is made here: an unreachable API server is retried by
    /// [`run`](Self::run), not reported as a startup error.
    pub(crate) async fn connect(node: &str) -> Result<Self> {
        match kube::Client::try_default().await {
            Ok(client) => Ok(Self::new(client, node)),
            Err(source) => Err(Error::ClientConfig {
                missing: missing_config(),
                source,
            }),
        }
    }

    /// A source on `client` for the pods with `spec.nodeName == node`.
    pub fn new(client: kube::Client, node: &str) -> Self {
        Self {
            api: Api::all(client),
            node: node.to_owned(),
        }
    }

    /// The field selector every list and watch request carries.
    pub(crate) fn field_selector(&self) -> String {
        format!("spec.nodeName={}", self.node)
    }

    /// Watches and sends events until the receiver is dropped.
    ///
    /// Errors are retried after [`WATCH_RETRY`]. It is applied here rather than with
    /// `WatchStreamExt::default_backoff()`, which resets the backoff on every `Ok` item: the
    /// watcher yields `Ok(Init)` before each list attempt, so against an API server that is down
    /// the delay would never grow past the first step (a retry every ~1 s forever). Here only the
    /// events that carry a server answer reset it.
    pub async fn run(self, tx: mpsc::Sender<PodEvent>) {
        let config = watcher::Config::default()
            .fields(&self.field_selector())
            .page_size(LIST_PAGE_SIZE);
        let stream = watcher(self.api, config);
        futures::pin_mut!(stream);
        let mut mapper = EventMapper::default();
        let mut errors = ErrorLog::default();
        let mut previous: Option<Duration> = None;
        tracing::info!(node = %self.node, "watching the API server for this node's pods");
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => {
                    if !matches!(event, watcher::Event::Init) {
                        errors.recovered();
                        previous = None;
                    }
                    for ev in mapper.map(event) {
                        if tx.send(ev).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    errors.failed(&e, Instant::now());
                    let pause = WATCH_RETRY.next(previous);
                    previous = Some(pause);
                    let delay = crate::backoff::jittered(pause);
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = tx.closed() => return,
                    }
                }
            }
        }
        // The watcher retries forever; ending is a kube-rs change, so say so.
        tracing::error!(node = %self.node, "the pod watch stream ended; no further pod updates");
    }
}

/// Describes which of the usual client configurations is absent, for the startup error.
fn missing_config() -> String {
    let mut missing = Vec::new();
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
        missing.push("KUBERNETES_SERVICE_HOST is not set (not running in a pod)");
    }
    let kubeconfig_env = std::env::var_os("KUBECONFIG").is_some();
    let home_config = std::env::var_os("HOME")
        .map(|h| std::path::Path::new(&h).join(".kube/config").exists())
        .unwrap_or(false);
    if !kubeconfig_env && !home_config {
        missing.push("no kubeconfig (KUBECONFIG unset, no ~/.kube/config)");
    }
    if missing.is_empty() {
        "the configuration found was not usable".to_owned()
    } else {
        missing.join(", ")
    }
}

/// Turns watcher events into [`PodEvent`]s and keeps the set of known pod uids for the relist
/// diff. Pure: no I/O, so every transition is unit-tested.
#[derive(Debug, Default)]
pub(crate) struct EventMapper {
    /// uids reported Applied and not since Deleted.
    known: HashSet<String>,
    /// During a (re)list: the uids listed so far.
    relist: Option<HashSet<String>>,
    /// [`PodEvent::Synced`] was sent (after the first complete list).
    synced: bool,
}

impl EventMapper {
    /// The pod events one watcher event stands for.
    pub(crate) fn map(&mut self, event: watcher::Event<Pod>) -> Vec<PodEvent> {
        match event {
            watcher::Event::Apply(pod) => self.applied(pod, false),
            watcher::Event::InitApply(pod) => self.applied(pod, true),
            watcher::Event::Delete(pod) => match pod_uid(&pod) {
                Some(uid) => {
                    self.known.remove(&uid);
                    if let Some(listed) = &mut self.relist {
                        listed.remove(&uid);
                    }
                    vec![PodEvent::Deleted { uid }]
                }
                None => Vec::new(),
            },
            // A (re)list starts; a list that failed halfway starts over, so restart the set too.
            watcher::Event::Init => {
                self.relist = Some(HashSet::new());
                Vec::new()
            }
            watcher::Event::InitDone => {
                let listed = self.relist.take().unwrap_or_default();
                let mut gone: Vec<String> = self.known.difference(&listed).cloned().collect();
                // Sorted so the order of the Deleted events is reproducible.
                gone.sort();
                self.known = listed;
                let mut events: Vec<PodEvent> = gone
                    .into_iter()
                    .map(|uid| PodEvent::Deleted { uid })
                    .collect();
                // The first complete list is every pod of the node: the agent's view is whole.
                if !std::mem::replace(&mut self.synced, true) {
                    events.push(PodEvent::Synced);
                }
                events
            }
        }
    }

    /// The uids currently considered present (for tests and diagnostics).
    #[cfg(test)]
    pub(crate) fn known(&self) -> impl Iterator<Item = &str> {
        self.known.iter().map(String::as_str)
    }

    fn applied(&mut self, pod: Pod, listing: bool) -> Vec<PodEvent> {
        let Some(uid) = pod_uid(&pod) else {
            return Vec::new();
        };
        if listing {
            if let Some(listed) = &mut self.relist {
                listed.insert(uid.clone());
            }
        }
        self.known.insert(uid);
        // Listed pods are passed on at once rather than at InitDone: each object is current, and
        // a pod must not wait for a long list to finish before the agent acts on it. Cut down
        // to what the agent reads before it is queued.
        vec![PodEvent::Applied(Box::new(super::slim(pod)))]
    }
}

/// A pod's uid; the API server always sets one, so a pod without is skipped with a warning
/// rather than tracked under a made-up identity.
fn pod_uid(pod: &Pod) -> Option<String> {
    match pod.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => Some(uid.to_owned()),
        _ => {
            tracing::warn!(
                pod = pod.metadata.name.as_deref().unwrap_or("<unnamed>"),
                namespace = pod.metadata.namespace.as_deref().unwrap_or(""),
                "ignoring a pod without metadata.uid from the API server"
            );
            None
        }
    }
}

/// Rate-limits watch error logs: the first error of an outage at once, then at most one line per
/// [`ERROR_LOG_INTERVAL`] with the number of errors in between, and one line when it recovers.
#[derive(Debug, Default)]
struct ErrorLog {
    /// When the last error line was written, if the watch is failing.
    last_logged: Option<Instant>,
    /// Errors since the last line.
    suppressed: u64,
    /// Errors in the current outage.
    total: u64,
}

impl ErrorLog {
    fn failed(&mut self, error: &watcher::Error, now: Instant) {
        self.total += 1;
        let due = self
            .last_logged
            .is_none_or(|t| now.duration_since(t) >= ERROR_LOG_INTERVAL);
        if due {
            tracing::warn!(
                error = %error,
                errors_since_last_log = self.suppressed,
                "pod watch failed; retrying with backoff (pods keep their last known state)"
            );
            self.last_logged = Some(now);
            self.suppressed = 0;
        } else {
            self.suppressed += 1;
        }
    }

    fn recovered(&mut self) {
        if self.last_logged.is_some() {
            tracing::info!(errors = self.total, "pod watch recovered");
        }
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(uid: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(format!("pod-{uid}")),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// `A:uid` for Applied, `D:uid` for Deleted, so sequences compare readably.
    fn names(events: Vec<PodEvent>) -> Vec<String> {
        events
            .into_iter()
            .map(|e| match e {
                PodEvent::Applied(p) => format!("A:{}", p.metadata.uid.unwrap_or_default()),
                PodEvent::Deleted { uid } => format!("D:{uid}"),
                PodEvent::Synced => "S".to_string(),
            })
            .collect()
    }

    fn feed(m: &mut EventMapper, events: Vec<watcher::Event<Pod>>) -> Vec<String> {
        events.into_iter().flat_map(|e| names(m.map(e))).collect()
    }

    fn known(m: &EventMapper) -> Vec<&str> {
        let mut k: Vec<&str> = m.known().collect();
        k.sort();
        k
    }

    #[test]
    fn initial_list_applies_every_pod_and_deletes_nothing() {
        let mut m = EventMapper::default();
        let out = feed(&mut m, listed(&["a", "b"]));
        assert_eq!(out, ["A:a", "A:b", "S"]);
        assert_eq!(known(&m), ["a", "b"]);
    }

    #[test]
    fn watch_apply_and_delete() {
        let mut m = EventMapper::default();
        let out = feed(
            &mut m,
            vec![
                watcher::Event::Init,
                watcher::Event::InitApply(pod("a")),
                watcher::Event::InitDone,
                watcher::Event::Apply(pod("b")),
                watcher::Event::Apply(pod("a")),
                watcher::Event::Delete(pod("a")),
            ],
        );
        assert_eq!(out, ["A:a", "S", "A:b", "A:a", "D:a"]);
        assert_eq!(known(&m), ["b"]);
    }

    /// A complete (re-)list of these pods, as the watcher delivers it.
    fn listed(names: &[&str]) -> Vec<watcher::Event<Pod>> {
        let mut events = vec![watcher::Event::Init];
        events.extend(names.iter().map(|n| watcher::Event::InitApply(pod(n))));
        events.push(watcher::Event::InitDone);
        events
    }

    #[test]
    fn relist_reports_pods_gone_while_disconnected() {
        let mut m = EventMapper::default();
        feed(
            &mut m,
            vec![
                watcher::Event::Init,
                watcher::Event::InitApply(pod("a")),
                watcher::Event::InitApply(pod("b")),
                watcher::Event::InitDone,
                watcher::Event::Apply(pod("c")),
            ],
        );
        // 410 Gone: the watcher re-lists; b and c were deleted meanwhile, d is new.
        let out = feed(&mut m, listed(&["a", "d"]));
        assert_eq!(out, ["A:a", "A:d", "D:b", "D:c"]);
        assert_eq!(known(&m), ["a", "d"]);
    }

    #[test]
    fn relist_that_restarts_halfway_uses_only_the_complete_list() {
        let mut m = EventMapper::default();
        feed(&mut m, listed(&["a", "b"]));
        // A paged list fails after its first page and starts over (a second Init): b was in the
        // aborted page only, so it is gone; a is in the complete list.
        let out = feed(
            &mut m,
            vec![
                watcher::Event::Init,
                watcher::Event::InitApply(pod("b")),
                watcher::Event::Init,
                watcher::Event::InitApply(pod("a")),
                watcher::Event::InitDone,
            ],
        );
        assert_eq!(out, ["A:b", "A:a", "D:b"]);
        assert_eq!(known(&m), ["a"]);
    }

    #[test]
    fn empty_relist_deletes_everything() {
        let mut m = EventMapper::default();
        feed(&mut m, listed(&["b", "a"]));
        let out = feed(&mut m, vec![watcher::Event::Init, watcher::Event::InitDone]);
        assert_eq!(out, ["D:a", "D:b"]);
        assert!(known(&m).is_empty());
    }

    #[test]
    fn pod_without_uid_is_skipped() {
        let mut m = EventMapper::default();
        let mut p = pod("x");
        p.metadata.uid = None;
        let mut empty = pod("y");
        empty.metadata.uid = Some(String::new());
        let out = feed(
            &mut m,
            vec![
                watcher::Event::Apply(p.clone()),
                watcher::Event::Apply(empty),
                watcher::Event::Delete(p),
            ],
        );
        assert!(out.is_empty(), "{out:?}");
        assert!(known(&m).is_empty());
    }

    #[test]
    fn error_log_is_rate_limited_and_resets_on_recovery() {
        let mut log = ErrorLog::default();
        let t0 = Instant::now();
        let err = || watcher::Error::NoResourceVersion;
        log.failed(&err(), t0);
        assert_eq!(log.last_logged, Some(t0));
        log.failed(&err(), t0 + Duration::from_secs(1));
        log.failed(&err(), t0 + Duration::from_secs(2));
        assert_eq!(log.suppressed, 2);
        assert_eq!(log.last_logged, Some(t0));
        let t1 = t0 + ERROR_LOG_INTERVAL;
        log.failed(&err(), t1);
        assert_eq!(log.last_logged, Some(t1));
        assert_eq!(log.suppressed, 0);
        assert_eq!(log.total, 4);
        log.recovered();
        assert_eq!(log.total, 0);
        assert_eq!(log.last_logged, None);
    }
}
