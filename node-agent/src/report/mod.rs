//! Where outcomes go: the status [`board`] (served by [`server`]), Prometheus [`metrics`] (with
//! the agent's own resources, [`process_metrics`]) and Kubernetes [`events`]. The lifecycle's
//! recorder ([`crate::lifecycle::record`]) writes to all of them together.
pub mod board;
pub mod events;
pub mod metrics;
pub mod process_metrics;
pub mod server;
