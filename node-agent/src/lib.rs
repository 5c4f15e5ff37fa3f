//! holdfast node agent: startup and shutdown ordering for Envoy sidecars, run from the node.
//!
//! # Layout (imports point down this list, never up)
//!
//! ARCHITECTURE.md at the repository root follows a Pod event through these modules and names
//! the file and function of every decision.
//!
//! - [`agent`]: the agent itself — follows the pods, runs one [`lifecycle`] driver per meshed
//!   pod, serves the status API, removes the node's startup taint.
//! - [`lifecycle`]: one pod's life — the pure [`lifecycle::machine`] (hold or not, release, when
//!   a drain or a Job watch starts, outcomes, phases), its `lifecycle::driver`, the proxy's
//!   [`lifecycle::readiness`], the [`lifecycle::drain`] and Job executors (their rules: the pure
//!   `lifecycle::drain::decide`), and the one recorder of outcomes, `lifecycle::record` (board,
//!   metrics, Events, log together).
//! - [`report`]: where outcomes go — the status [`report::board`], Prometheus
//!   [`report::metrics`], Kubernetes `report::events`, the read-only status API
//!   ([`report::server`]) and the agent's own resources (`report::process_metrics`).
//! - [`effects`]: what touches the node — entering a pod's netns ([`effects::netns`]), the
//!   startup hold's iptables rules and NFQUEUE ([`effects::hold`]), the Envoy admin client
//!   ([`effects::envoy_admin`] on `effects::http1_client`), procfs and sock_diag
//!   ([`effects::procfs`]), the node taint ([`effects::node_taint`]).
//! - [`source`]: where Pod objects come from (a pods directory, or the API server); [`pod`]:
//!   what the agent reads from a Pod object, and which pods it acts on.
//! - [`mesh`]: the mesh profiles (Istio, Kuma, Consul): which mesh injected a pod, and its
//!   proxy's container, uid, capture ports, admin address and own listeners.
//! - [`config`]: flags, defaults (Istio conventions), per-pod annotations, durations.
//! - [`api`]: the wire types of the `/status` document (a leaf: imports nothing of the agent).
//! - [`backoff`]: the one growing pause every retry and pause uses (a leaf).
//! - [`cli`]: `holdfast status`, the node's table read from the status API (imports [`api`] and
//!   the HTTP client only).
pub mod agent;
pub mod api;
pub mod backoff;
pub mod cli;
pub mod config;
pub mod effects;
pub mod lifecycle;
pub mod mesh;
pub mod pod;
pub mod report;
pub mod source;
