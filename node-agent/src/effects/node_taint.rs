//! The agent's startup taint: `holdfast.io/agent-not-ready:NoSchedule`, set by a node pool when
//! the node is created and removed by the agent once it is ready, so no meshed pod is scheduled
//! on a node before the agent can protect it — the pattern of Cilium's
//! `node.cilium.io/agent-not-ready` (cilium/cilium operator/watchers: the taint is removed with a
//! JSON patch that first tests `/spec/taints`).
//!
//! Removal is race-safe: the patch `test`s the whole taint list as read, then `replace`s it
//! without our taint, so a taint another controller adds or removes in between is never lost —
//! the API server refuses the patch (422, the `test` failed; apiserver
//! staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go) and the agent reads again.
//! Only taints with our key are removed. RBAC: `nodes` get and patch, nothing else.

use k8s_openapi::api::core::v1::{Node, Taint};

pub(crate) use crate::api::StartupTaint;
use kube::api::{Patch, PatchParams};
use kube::Api;

/// The startup taint's key.
pub const STARTUP_TAINT_KEY: &str = "holdfast.io/agent-not-ready";
/// The startup taint's documented effect (node pools set `holdfast.io/agent-not-ready:NoSchedule`).
pub const STARTUP_TAINT_EFFECT: &str = "NoSchedule";
/// How often a removal is tried when the node's taints change under it (each a GET and a
/// PATCH).
pub const ATTEMPTS: usize = 5;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read node {node} to remove the startup taint {STARTUP_TAINT_KEY}: {source} (RBAC: the agent needs get on nodes)")]
    Get { node: String, source: kube::Error },
    #[error("cannot remove the startup taint {STARTUP_TAINT_KEY} from node {node}: {source} (RBAC: the agent needs patch on nodes)")]
    Patch { node: String, source: kube::Error },
    #[error("node {node}'s taints changed during each of {ATTEMPTS} attempts to remove {STARTUP_TAINT_KEY}; will be retried")]
    Contended { node: String },
    #[error("cannot build the patch for node {node}: {reason}")]
    Build { node: String, reason: String },
}

/// Result of this module.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// The retry loop's first pause after a refused try, doubling up to [`MAX_RETRY_PAUSE`], which it
/// then keeps for as long as the agent runs (one GET a minute: nothing for the API server).
pub const FIRST_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);
pub const MAX_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_secs(60);
/// After this long without removing the taint the loop logs an error (once) with the fix; the
/// alert `HoldfastStartupTaintNotRemoved` fires on the metric a minute later.
pub const OVERDUE_AFTER: std::time::Duration = std::time::Duration::from_secs(4 * 60);

/// How [`remove_startup_taint_retrying`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Removed after this many tries.
    Removed { tries: u32 },
    /// The node did not carry the taint.
    NotThere,
}

/// What the loop reports to the agent's metrics while it runs: `pending` is 1 until the node is
/// seen free of the taint (`holdfast_startup_taint_pending`), `failures` counts refused tries
/// (`holdfast_startup_taint_removal_failures_total`).
#[derive(Debug, Clone, Default)]
pub struct TaintMetrics {
    pub pending: prometheus_client::metrics::gauge::Gauge,
    pub failures: prometheus_client::metrics::counter::Counter,
    /// What the loop found, for `/status` ([`TaintMetrics::found`]): 0 not started, else a
    /// [`StartupTaint`] as 1 + its index.
    state: std::sync::Arc<std::sync::atomic::AtomicU8>,
}

impl TaintMetrics {
    /// What the removal found so far (`None`: it has not started: no API server source).
    pub(crate) fn found(&self) -> Option<StartupTaint> {
        match self.state.load(std::sync::atomic::Ordering::Relaxed) {
            1 => Some(StartupTaint::Pending),
            2 => Some(StartupTaint::Removed),
            3 => Some(StartupTaint::NotThere),
            _ => None,
        }
    }

    fn set_found(&self, found: StartupTaint) {
        let v = match found {
            StartupTaint::Pending => 1,
            StartupTaint::Removed => 2,
            StartupTaint::NotThere => 3,
        };
        self.state.store(v, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Removes the startup taint, trying again with a doubling pause (1 s, 2 s, … then every 60 s)
/// for as long as the API server says no — RBAC or the admission policy being set up, an API
/// server restart, endless contention — and the agent runs: giving up would keep the node
/// closed to every pod until someone noticed (issue 30: it gave up after 8 tries, ~4 min, with
/// one log line). Past [`OVERDUE_AFTER`] it logs an error with the manual fix, once; the metric
/// stays 1, so the alert keeps saying so.
pub async fn remove_startup_taint_retrying(
    client: kube::Client,
    node: &str,
    metrics: &TaintMetrics,
) -> Removal {
    metrics.pending.set(1);
    metrics.set_found(StartupTaint::Pending);
    let started = tokio::time::Instant::now();
    let mut pause = FIRST_RETRY_PAUSE;
    let mut said_overdue = false;
    let mut attempt = 0u32;
    loop {
        attempt = attempt.saturating_add(1);
        match remove_startup_taint(client.clone(), node).await {
            Ok(removed) => {
                metrics.pending.set(0);
                metrics.set_found(if removed {
                    StartupTaint::Removed
                } else {
                    StartupTaint::NotThere
                });
                return if removed {
                    Removal::Removed { tries: attempt }
                } else {
                    Removal::NotThere
                };
            }
            Err(e) => {
                metrics.failures.inc();
                if !said_overdue && started.elapsed() >= OVERDUE_AFTER {
                    said_overdue = true;
                    tracing::error!(node = %node, attempt, error = %e, "the startup taint is still on the node; retrying every minute for as long as the agent runs. Fix the cause (RBAC, the ValidatingAdmissionPolicy, the API server) or remove it by hand: kubectl taint nodes NODE holdfast.io/agent-not-ready-");
                } else {
                    tracing::warn!(node = %node, attempt, error = %e, "cannot remove the startup taint yet; retrying");
                }
                tokio::time::sleep(pause).await;
                pause = crate::backoff::Backoff::doubling(FIRST_RETRY_PAUSE, MAX_RETRY_PAUSE)
                    .next(Some(pause));
            }
        }
    }
}

/// Removes the startup taint from `node`. Returns `true` when this call removed it, `false` when
/// the node did not carry it (nothing is written then). Other taints are kept as they are.
pub async fn remove_startup_taint(client: kube::Client, node: &str) -> Result<bool, Error> {
    let nodes: Api<Node> = Api::all(client);
    for attempt in 1..=ATTEMPTS {
        let current = nodes.get(node).await.map_err(|source| Error::Get {
            node: node.to_string(),
            source,
        })?;
        let taints: Vec<Taint> = current.spec.and_then(|s| s.taints).unwrap_or_default();
        let Some(patch) = removal_patch(&taints).map_err(|reason| Error::Build {
            node: node.to_string(),
            reason,
        })?
        else {
            return Ok(false);
        };
        match nodes
            .patch(node, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
        {
            Ok(_) => {
                tracing::info!(node, "removed the startup taint {STARTUP_TAINT_KEY}");
                return Ok(true);
            }
            // 422: the `test` op failed (the taints changed since the read); 409: a write
            // conflict. Read again.
            Err(kube::Error::Api(status)) if status.code == 422 || status.code == 409 => {
                tracing::debug!(
                    node,
                    attempt,
                    code = status.code,
                    "node taints changed; reading again"
                );
            }
            Err(source) => {
                return Err(Error::Patch {
                    node: node.to_string(),
                    source,
                })
            }
        }
    }
    Err(Error::Contended {
        node: node.to_string(),
    })
}

/// The JSON patch that removes every taint with [`STARTUP_TAINT_KEY`] from `taints` (the node's
/// list as read), or `None` when there is none.
pub(crate) fn removal_patch(taints: &[Taint]) -> Result<Option<json_patch::Patch>, String> {
    if !taints.iter().any(|t| t.key == STARTUP_TAINT_KEY) {
        return Ok(None);
    }
    let kept: Vec<&Taint> = taints
        .iter()
        .filter(|t| t.key != STARTUP_TAINT_KEY)
        .collect();
    let ops = serde_json::json!([
        {"op": "test", "path": "/spec/taints", "value": taints},
        {"op": "replace", "path": "/spec/taints", "value": kept},
    ]);
    serde_json::from_value(ops)
        .map(Some)
        .map_err(|e| e.to_string())
}
