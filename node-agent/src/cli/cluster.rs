//! The cluster as `kubectl holdfast check` and `kubectl holdfast status` read it, with the
//! user's kubeconfig: the nodes, the agent pods, the ResourceQuotas of the agent's namespace,
//! and every agent's `/status`, each read over a port-forward to its loopback status port
//! (`super::remote::fetch_pod_status_body`: the agent answers `/status` on loopback only, so
//! the API server's pod proxy, which connects to the pod IP, cannot reach it; see
//! [`super::remote`] for why).
//!
//! The fan-out is bounded: at most [`FanOut::concurrency`] agents are read at once, each
//! within [`FanOut::per_agent`]; an agent that does not answer in time (or at all) is an
//! `AgentAnswer` saying why, never left out. Calls to the API server: one list of nodes, one
//! of agent pods, one of quotas, and one port-forward per running agent.
//!
//! RBAC (the caller's): the Role `holdfast-status-reader` (pods list, pods/portforward get and
//! create in the agent's namespace) and the ClusterRole `holdfast-cluster-reader` (nodes list,
//! resourcequotas list); manifests/agent/status-reader-role.yaml and
//! cluster-reader-clusterrole.yaml, checked against this file by tests/tests/manifests.rs.

use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use kube::api::ListParams;
use kube::Api;

use super::remote::{fetch_pod_status_body, RemoteError, AGENT_SELECTOR};
use crate::api::NodeStatus;

/// The bounds of one fan-out.
#[derive(Debug, Clone, Copy)]
pub struct FanOut {
    /// Agents read at once.
    pub concurrency: usize,
    /// Deadline of one agent's read (the port-forward and `GET /status`).
    pub per_agent: Duration,
    /// Largest `/status` body accepted.
    pub max_body: usize,
}

impl Default for FanOut {
    fn default() -> Self {
        FanOut {
            concurrency: 32,
            per_agent: Duration::from_secs(5),
            max_body: 16 << 20,
        }
    }
}

/// A node as `check` needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeInfo {
    pub name: String,
    /// `kubernetes.io/os` is `linux` (or unset): the DaemonSet's nodeSelector picks it.
    pub linux: bool,
    /// The node's `Ready` condition is True.
    pub ready: bool,
    /// A GKE node (label `cloud.google.com/gke-nodepool`).
    pub gke: bool,
    /// Its taints, as `key[=value]:effect`.
    pub taints: Vec<String>,
    /// `metadata.creationTimestamp`: when the node joined.
    pub created: Option<SystemTime>,
}

impl NodeInfo {
    pub(crate) fn from_node(n: &Node) -> NodeInfo {
        let labels = n.metadata.labels.clone().unwrap_or_default();
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let taints = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .map(|ts| {
                ts.iter()
                    .map(|t| match &t.value {
                        Some(v) => format!("{}={v}:{}", t.key, t.effect),
                        None => format!("{}:{}", t.key, t.effect),
                    })
                    .collect()
            })
            .unwrap_or_default();
        NodeInfo {
            name: n.metadata.name.clone().unwrap_or_default(),
            linux: labels
                .get("kubernetes.io/os")
                .is_none_or(|os| os == "linux"),
            ready,
            gke: labels.contains_key("cloud.google.com/gke-nodepool"),
            taints,
            created: n
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| SystemTime::from(t.0)),
        }
    }
}

/// An agent pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentPod {
    pub name: String,
    /// `spec.nodeName` (`None`: not scheduled).
    pub node: Option<String>,
    /// `status.phase` (`Pending`, `Running`...).
    pub phase: String,
    /// Its `Ready` condition is True.
    pub ready: bool,
    /// Why it is not ready, from its containers' states (e.g. `CrashLoopBackOff`), if known.
    pub waiting_reason: Option<String>,
    /// `status.startTime`: when the kubelet took the pod.
    pub started: Option<SystemTime>,
    /// Its containers' restarts, together.
    pub restarts: i32,
}

impl AgentPod {
    pub(crate) fn from_pod(p: &Pod) -> AgentPod {
        let status = p.status.as_ref();
        AgentPod {
            name: p.metadata.name.clone().unwrap_or_default(),
            node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
            phase: status
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "Unknown".into()),
            ready: status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            waiting_reason: status
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| {
                    cs.iter().find_map(|c| {
                        c.state
                            .as_ref()
                            .and_then(|st| st.waiting.as_ref())
                            .and_then(|w| w.reason.clone())
                    })
                }),
            started: status
                .and_then(|s| s.start_time.as_ref())
                .map(|t| SystemTime::from(t.0)),
            restarts: status
                .and_then(|s| s.container_statuses.as_ref())
                .map_or(0, |cs| cs.iter().map(|c| c.restart_count).sum()),
        }
    }
}

/// A ResourceQuota of the agent's namespace, as `check` needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QuotaInfo {
    pub name: String,
    /// The PriorityClass names its scope selector admits (`In`), empty without one.
    pub priority_classes: Vec<String>,
}

impl QuotaInfo {
    pub(crate) fn from_quota(q: &ResourceQuota) -> QuotaInfo {
        let priority_classes = q
            .spec
            .as_ref()
            .and_then(|s| s.scope_selector.as_ref())
            .and_then(|s| s.match_expressions.as_ref())
            .map(|es| {
                es.iter()
                    .filter(|e| e.scope_name == "PriorityClass" && e.operator == "In")
                    .flat_map(|e| e.values.clone().unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default();
        QuotaInfo {
            name: q.metadata.name.clone().unwrap_or_default(),
            priority_classes,
        }
    }
}

/// One agent's `/status`, or why it could not be read.
#[derive(Debug, Clone)]
pub(crate) struct AgentAnswer {
    pub pod: String,
    pub node: String,
    pub result: Result<NodeStatus, String>,
}

/// Everything read from the cluster.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClusterView {
    /// The agent's namespace.
    pub namespace: String,
    pub nodes: Vec<NodeInfo>,
    pub agents: Vec<AgentPod>,
    /// `None`: the quotas could not be listed (the reason is in `problems`).
    pub quotas: Option<Vec<QuotaInfo>>,
    /// One per agent pod scheduled on a node, in node order.
    pub answers: Vec<AgentAnswer>,
    /// What could not be read, with the fix (RBAC, mostly).
    pub problems: Vec<String>,
}

pub(crate) fn list_error(e: kube::Error, what: &str, rbac: &str) -> RemoteError {
    match &e {
        kube::Error::Api(s) if s.code == 403 => RemoteError::Api {
            what: what.to_string(),
            why: format!("forbidden (403): ask for {rbac}"),
        },
        _ => RemoteError::Api {
            what: what.to_string(),
            why: e.to_string(),
        },
    }
}

/// The nodes (`list nodes`, cluster-wide).
pub(crate) async fn list_nodes(client: &kube::Client) -> Result<Vec<NodeInfo>, RemoteError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes.list(&ListParams::default()).await.map_err(|e| {
        list_error(
            e,
            "list nodes",
            "the ClusterRole holdfast-cluster-reader (nodes list)",
        )
    })?;
    let mut out: Vec<NodeInfo> = list.items.iter().map(NodeInfo::from_node).collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The agent pods of `namespace` (`list pods` with the agent's labels).
pub(crate) async fn list_agents(
    client: &kube::Client,
    namespace: &str,
) -> Result<Vec<AgentPod>, RemoteError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let list = pods
        .list(&ListParams::default().labels(AGENT_SELECTOR))
        .await
        .map_err(|e| {
            list_error(
                e,
                &format!("list pods in {namespace}"),
                &format!("the Role holdfast-status-reader in {namespace} (pods list)"),
            )
        })?;
    let mut out: Vec<AgentPod> = list.items.iter().map(AgentPod::from_pod).collect();
    out.sort_by(|a, b| (&a.node, &a.name).cmp(&(&b.node, &b.name)));
    Ok(out)
}

/// The ResourceQuotas of `namespace`.
pub(crate) async fn list_quotas(
    client: &kube::Client,
    namespace: &str,
) -> Result<Vec<QuotaInfo>, RemoteError> {
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), namespace);
    let list = quotas.list(&ListParams::default()).await.map_err(|e| {
        list_error(
            e,
            &format!("list resourcequotas in {namespace}"),
            "the ClusterRole holdfast-cluster-reader (resourcequotas list)",
        )
    })?;
    Ok(list.items.iter().map(QuotaInfo::from_quota).collect())
}

/// The agent on each node: a running one if there are several (a rolling update).
pub(crate) fn agent_per_node(agents: &[AgentPod]) -> Vec<&AgentPod> {
    let mut by_node: std::collections::BTreeMap<&str, &AgentPod> = Default::default();
    for a in agents {
        let Some(node) = a.node.as_deref() else {
            continue;
        };
        match by_node.get(node) {
            Some(prev) if prev.phase == "Running" && prev.ready => {}
            Some(prev) if prev.phase == "Running" && a.phase != "Running" => {}
            _ => {
                by_node.insert(node, a);
            }
        }
    }
    by_node.into_values().collect()
}

/// Reads every agent in `agents` that runs (one per node, [`agent_per_node`]), at most
/// `fan.concurrency` at once, each within `fan.per_agent`. Agents not running get an answer
/// saying so without a request.
pub(crate) async fn read_agents(
    client: &kube::Client,
    namespace: &str,
    agents: &[AgentPod],
    fan: FanOut,
) -> Vec<AgentAnswer> {
    let per_node = agent_per_node(agents);
    let reads = per_node.into_iter().map(|a| {
        let client = client.clone();
        let namespace = namespace.to_string();
        let pod = a.name.clone();
        let node = a.node.clone().unwrap_or_default();
        let phase = a.phase.clone();
        async move {
            let result = if phase != "Running" {
                Err(format!(
                    "agent pod {namespace}/{pod} is {phase}, not Running"
                ))
            } else {
                match tokio::time::timeout(
                    fan.per_agent,
                    fetch_pod_status_body(client, &pod, &namespace, fan.max_body),
                )
                .await
                {
                    Err(_) => Err(format!(
                        "no answer from {namespace}/{pod} within {} ms",
                        fan.per_agent.as_millis()
                    )),
                    Ok(Err(e)) => Err(e.to_string()),
                    Ok(Ok(body)) => serde_json::from_str::<NodeStatus>(&body).map_err(|e| {
                        format!(
                            "{namespace}/{pod} answered a document this holdfast cannot read: {e}"
                        )
                    }),
                }
            };
            AgentAnswer { pod, node, result }
        }
    });
    let mut out: Vec<AgentAnswer> = futures::stream::iter(reads)
        .buffer_unordered(fan.concurrency.max(1))
        .collect()
        .await;
    out.sort_by(|a, b| a.node.cmp(&b.node));
    out
}

/// Reads the whole cluster for `check`: nodes, agents, quotas, every agent's status. Fails only
/// when the agents cannot be listed; other reads that fail are in `problems`.
pub(crate) async fn gather(
    client: &kube::Client,
    namespace: &str,
    fan: FanOut,
) -> Result<ClusterView, RemoteError> {
    let agents = list_agents(client, namespace).await?;
    let mut view = ClusterView {
        namespace: namespace.to_string(),
        ..Default::default()
    };
    match list_nodes(client).await {
        Ok(n) => view.nodes = n,
        Err(e) => view.problems.push(e.to_string()),
    }
    match list_quotas(client, namespace).await {
        Ok(q) => view.quotas = Some(q),
        Err(e) => view.problems.push(e.to_string()),
    }
    view.answers = read_agents(client, namespace, &agents, fan).await;
    view.agents = agents;
    Ok(view)
}
