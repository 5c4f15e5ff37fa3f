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
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How many times [`remove_startup_taint_retrying`] tries before it gives up, and its first
/// pause (doubling, at most [`MAX_RETRY_PAUSE`]).
pub const RETRIES: u32 = 8;
pub const FIRST_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);
pub const MAX_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_secs(60);

/// How [`remove_startup_taint_retrying`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Removed after this many tries.
    Removed { tries: u32 },
    /// The node did not carry the taint.
    NotThere,
    /// Every try failed: the taint stays until someone removes it.
    GaveUp { tries: u32 },
}

/// Removes the startup taint, trying again with a doubling pause (1 s, 2 s, … at most 60 s;
/// [`RETRIES`] tries, about 4 minutes) while the API server says no (RBAC being set up, an
/// apiserver restart, endless contention). Never fails: the outcome is logged by the caller.
pub async fn remove_startup_taint_retrying(client: kube::Client, node: &str) -> Removal {
    let mut pause = FIRST_RETRY_PAUSE;
    for attempt in 1..=RETRIES {
        match remove_startup_taint(client.clone(), node).await {
            Ok(true) => return Removal::Removed { tries: attempt },
            Ok(false) => return Removal::NotThere,
            Err(e) => {
                tracing::warn!(node = %node, attempt, error = %e, "cannot remove the startup taint yet; retrying");
                if attempt < RETRIES {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_RETRY_PAUSE);
                }
            }
        }
    }
    Removal::GaveUp { tries: RETRIES }
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
pub fn removal_patch(taints: &[Taint]) -> Result<Option<json_patch::Patch>, String> {
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
