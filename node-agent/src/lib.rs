//! holdfast node agent: startup and shutdown ordering for Envoy sidecars, run from the node.
//!
//! # Layout
//!
//! - [`agent`]: the agent itself — follows the pods and runs one task per meshed pod; the drain
//!   and Job executors ([`agent::drain`]), readiness, a pod's processes.
//! - [`lifecycle`]: one pod's lifecycle — a pure machine (every decision: hold, release, drain,
//!   Job, outcomes, phases), its driver, and the one recorder of outcomes (board, metrics,
//!   Events, log together).
//! - [`api`]: the wire types of the `/status` document (a leaf: imports nothing of the agent).
//! - [`hold`]: the startup hold mechanism in a pod's netns (iptables rules + NFQUEUE).
//! - [`netns`]: entering a pod's network namespace (the one place that does).
//! - [`procfs_pods`]: which processes and sockets belong to a pod (cgroup parsing).
//! - [`envoy_admin`]: the Envoy admin API client.
//! - [`config`]: flags, defaults (Istio conventions), per-pod annotations, durations.
//! - [`pod`]: what the agent reads from a Kubernetes Pod object, and which pods it acts on.
//! - [`node_taint`]: removing the agent's startup taint from its node once it is ready.
//! - [`source`]: where Pod objects come from (a pods directory, or the API server).
//! - [`events`]: Kubernetes Events on pods (what holdfast did, what needs the operator).
//! - [`status`], [`status_api`]: the per-pod status board and the read-only API serving it.
//! - [`process_metrics`]: the agent's own fds, memory and threads as metrics; its fd budget.
//! - [`status_cli`]: `holdfast status`, the node's table read from that API.

pub mod agent;
pub mod api;
pub mod config;
pub mod envoy_admin;
pub mod events;
pub mod hold;
pub mod http1_client;
pub mod lifecycle;
pub mod metrics;
pub mod netns;
pub mod node_taint;
pub mod pod;
pub mod process_metrics;
pub mod procfs_pods;
pub mod source;
pub mod status;
pub mod status_api;
pub mod status_cli;
pub mod status_remote;
