//! Where Pod objects come from. Every source yields the same [`PodEvent`]s built from real
//! `k8s_openapi` Pod objects, so everything after the source is one code path.
//!
//! - [`dir::PodsDir`]: a directory of Pod JSON/YAML files (the simulated node and the demo).
//! - [`kube::KubePods`]: the API server, watching `spec.nodeName=<node>` (in-cluster).

pub mod dir;
mod dir_watch;
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
    /// The source has delivered every pod that existed when it started (the initial listing):
    /// the agent's view of the node is complete (what `/readyz` waits for).
    Synced,
}

pub use crate::api::status::SourceProblem;

/// The number of problems the pod source reports now ([`SourceProblems::set`] writes it; the
/// `holdfast_source_problems` gauge reads it). One per process: an agent has one pod source.
static PROBLEM_COUNT: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// How many problems the pod source reports now.
pub fn problem_count() -> i64 {
    PROBLEM_COUNT.load(std::sync::atomic::Ordering::Relaxed)
}

/// The source's current problems, shared with the status API. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct SourceProblems {
    inner: std::sync::Arc<std::sync::Mutex<Vec<SourceProblem>>>,
}

impl SourceProblems {
    /// Replaces the current list (a source reports its whole picture each time it looks).
    /// Also sets the count behind `holdfast_source_problems` ([`problem_count`]).
    pub fn set(&self, problems: Vec<SourceProblem>) {
        PROBLEM_COUNT.store(
            i64::try_from(problems.len()).unwrap_or(i64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
        *self.inner.lock().unwrap_or_else(|e| e.into_inner()) = problems;
    }

    /// A copy of the current list.
    pub fn snapshot(&self) -> Vec<SourceProblem> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
