//! Where Pod objects come from. Every source yields the same [`PodEvent`]s built from real
//! `k8s_openapi` Pod objects, so everything after the source is one code path.
//!
//! - [`dir::PodsDir`]: a directory of Pod JSON/YAML files (the simulated node and the demo).
//! - [`kube::KubePods`]: the API server, watching `spec.nodeName=<node>` (in-cluster).

pub mod dir;
pub mod kube;

use k8s_openapi::api::core::v1::Pod;

/// A change to the set of pods on this node.
#[derive(Debug, Clone)]
pub enum PodEvent {
    /// A pod was added or changed (the full current object).
    Applied(Box<Pod>),
    /// A pod is gone from the source (deleted from the API server / its file removed).
    /// `uid` is the uid of the last object seen under that identity.
    Deleted { uid: String },
}
