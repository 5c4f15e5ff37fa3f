//! The per-pod rows of the `/status` document: phases, what the hold did, the row itself.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::reports::{DrainReport, JobReport};
use super::time::rfc3339;
use super::timeline::Timeline;

/// How a pod's sidecar runs, which decides what holdfast does for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SidecarMode {
    /// `istio-proxy` is a regular container: the startup hold, the drain, Job completion.
    #[default]
    Classic,
    /// `istio-proxy` is a native sidecar (a restartable init container, Kubernetes 1.29+; Istio
    /// 1.27+'s default with kubelets ≥ 1.33): the kubelet orders start, stop and Jobs; holdfast
    /// covers a proxy restart (hold), the deletion (measured, or ended on evidence without
    /// Istio's preStop) and a sidecar lost during termination (reported).
    Native,
}

impl SidecarMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SidecarMode::Classic => "classic",
            SidecarMode::Native => "native",
        }
    }
}

/// Which mesh injected a pod's sidecar (the agent's mesh profile for it: `node-agent/src/mesh/`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mesh {
    /// Istio's sidecar template (`istio-proxy`, pilot-agent).
    #[default]
    Istio,
    /// Kuma / Kong Mesh (`kuma-sidecar`, kuma-dp).
    Kuma,
    /// Consul on Kubernetes (`consul-dataplane`).
    Consul,
}

impl Mesh {
    /// Every mesh the agent knows, in the order their markers are read.
    pub const ALL: [Mesh; 3] = [Mesh::Istio, Mesh::Kuma, Mesh::Consul];

    pub fn as_str(self) -> &'static str {
        match self {
            Mesh::Istio => "istio",
            Mesh::Kuma => "kuma",
            Mesh::Consul => "consul",
        }
    }
}

/// The fixes `holdfast check` gives that name a mesh's parts. They live here, beside [`Mesh`],
/// because the CLI links only `api` (tests/layout.rs); the agent's own texts are in its mesh
/// profiles (`mesh::MeshTexts`).
impl Mesh {
    /// How to get the holdfast filter into this mesh's proxies (docs/install.md, "Delivering the
    /// filter"); `None`: the mesh cannot load it (Consul), so its absence is expected.
    pub fn filter_install_fix(self) -> Option<&'static str> {
        match self {
            Mesh::Istio => Some("install the filter (kubectl apply -k manifests/, or the chart's meshes.istio), check that its WasmPlugins select the pod (label security.istio.io/tlsMode=istio) and that istiod could pull the module (istioctl proxy-config ... ; docs/install.md, \"Delivering the filter\")"),
            Mesh::Kuma => Some("install the MeshProxyPatch (manifests/kuma-filter, or the chart's meshes.kuma.enabled=true) for the pod's mesh; check the module's URL and sha256 (docs/install.md, \"Delivering the filter\")"),
            Mesh::Consul => None,
        }
    }

    /// Which release of this mesh brings Envoy 1.34+ (`drain_listeners?inboundonly` no longer
    /// drains outbound: envoyproxy/envoy#37873); docs/install.md, "Tested Envoy versions".
    pub fn envoy_1_34_fix(self) -> &'static str {
        match self {
            Mesh::Istio => "upgrade the mesh to a release shipping Envoy 1.34 or later (Istio 1.26+); docs/install.md, \"Tested Envoy versions\"",
            Mesh::Kuma => "upgrade Kuma to a release whose Envoy is 1.34 or later; docs/install.md, \"Tested Envoy versions\"",
            Mesh::Consul => "upgrade consul-dataplane to a release whose Envoy is 1.34 or later; docs/install.md, \"Tested Envoy versions\"",
        }
    }
}

impl std::fmt::Display for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Lifecycle phase of a tracked pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Tracked, but no process of the pod exists yet (no network namespace to act in).
    WaitingForNetns,
    /// The app's new connections are held until the proxy is ready.
    Holding,
    /// The proxy is ready and nothing is held.
    Ready,
    /// The pod is being deleted; inbound is drained and the app watched.
    Draining,
    /// The agent asked the proxy to exit.
    Quitting,
    /// Nothing left to do for this pod.
    Done,
    /// The pod has the proxy container but holdfast leaves it alone (see `skipped_reason`).
    Skipped,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::WaitingForNetns => "waiting-for-netns",
            Phase::Holding => "holding",
            Phase::Ready => "ready",
            Phase::Draining => "draining",
            Phase::Quitting => "quitting",
            Phase::Done => "done",
            Phase::Skipped => "skipped",
        }
    }
}

/// Why a hold ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HoldOutcome {
    /// The proxy became ready.
    Ready,
    /// The hold deadline passed first (fail open).
    Deadline,
    /// The pod was deleted while held.
    PodDeleted,
    /// The agent stopped while holding; the rule stays for the next agent, which adopts it.
    AgentStopped,
    /// The hold could not be set up or released cleanly; traffic flows as without the agent.
    Failed,
    /// The pod's network namespace went away while held (its sandbox was recreated: no process
    /// of the pod is in it any more); the pod is held again in its new one.
    SandboxGone,
}

impl HoldOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            HoldOutcome::Ready => "ready",
            HoldOutcome::Deadline => "deadline",
            HoldOutcome::PodDeleted => "pod-deleted",
            HoldOutcome::AgentStopped => "agent-stopped",
            HoldOutcome::Failed => "failed",
            HoldOutcome::SandboxGone => "sandbox-gone",
        }
    }
}

/// What the startup hold did for one pod.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HoldRecord {
    /// When the hold rule went in (or was adopted from a previous agent).
    #[serde(with = "rfc3339::option", default)]
    pub started_at: Option<SystemTime>,
    /// When the hold was released.
    #[serde(with = "rfc3339::option", default)]
    pub released_at: Option<SystemTime>,
    /// Packets (SYNs, including retransmissions) held.
    pub packets_held: u64,
    /// Distinct connections held.
    pub connections_held: u64,
    /// Time from seeing the proxy ready to every held packet accepted, in milliseconds.
    pub ready_to_release_ms: Option<f64>,
    /// True when this agent took over a hold left by a previous agent.
    pub adopted: bool,
    /// True when an app container was already running when the hold went in: the agent was
    /// late, and the app's earliest connections may have met the proxy unheld.
    #[serde(default)]
    pub late: bool,
    /// Why the hold ended; `None` while holding.
    pub outcome: Option<HoldOutcome>,
}

/// One row of the board.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodStatus {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub phase: Phase,
    /// The sidecar's mode (`None`: a skipped pod, or an older agent).
    #[serde(default)]
    pub mode: Option<SidecarMode>,
    /// The mesh that injected the sidecar (`None`: a pod left alone before its mesh was known,
    /// or an older agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh: Option<Mesh>,
    /// When the agent first saw the pod.
    #[serde(with = "rfc3339")]
    pub tracked_since: SystemTime,
    /// `None` when the proxy was already ready when the pod was first seen (no hold needed).
    pub hold: Option<HoldRecord>,
    /// What the drain did, once the pod was deleted.
    #[serde(default)]
    pub drain: Option<DrainReport>,
    /// What the Job completion did, for a finished Job.
    #[serde(default)]
    pub job: Option<JobReport>,
    /// Problems worth an operator's attention (invalid annotations, admin API errors...).
    pub last_error: Option<String>,
    /// Why a pod in phase `skipped` is left alone (gateway, native sidecar, TPROXY...).
    #[serde(default)]
    pub skipped_reason: Option<String>,
    /// The pod's steps, first sight to the end (`holdfast status POD`). Always present from
    /// this agent on; `None` in a document from an older agent, which recorded none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Timeline>,
}

/// The JSON document served at `/status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeStatus {
    pub node: String,
    pub agent_version: String,
    pub pods: Vec<PodStatus>,
    /// Pod source entries that were rejected or ignored (bad files, duplicate uids...).
    #[serde(default)]
    pub source_problems: Vec<SourceProblem>,
    /// What this agent found of its node's startup taint (`None`: pods come from a directory,
    /// not the API server, or an agent older than this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_taint: Option<StartupTaint>,
}

/// What an agent found of its node's startup taint `holdfast.io/agent-not-ready`
/// (docs/install.md, "New nodes: the startup taint").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StartupTaint {
    /// Not removed yet (the first pod list is not loaded, or the API server refuses).
    Pending,
    /// The node carried it and this agent removed it.
    Removed,
    /// The node did not carry it when this agent first looked: the node pool does not set it,
    /// or an earlier agent on the node removed it (`holdfast check` tells the two apart: HF0106).
    NotThere,
}

impl StartupTaint {
    pub fn as_str(self) -> &'static str {
        match self {
            StartupTaint::Pending => "pending",
            StartupTaint::Removed => "removed",
            StartupTaint::NotThere => "not-there",
        }
    }
}

/// A pod source entry that was rejected or ignored (a bad file, a duplicate uid...): served on
/// `/status` and counted, not only logged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceProblem {
    /// What the problem is about (a file path, an object's namespace/name).
    pub entry: String,
    /// What is wrong, and the fix.
    pub problem: String,
}
