//! Where outcomes go: the status [`board`] (served by [`server`]), Prometheus [`metrics`] (with
//! the agent's own resources, `process_metrics`) and Kubernetes `events`. The lifecycle's
//! recorder (`crate::lifecycle::record`) writes to all of them together. The log's writer
//! ([`log_lines`]) keeps every line one line, whatever a pod put in it.
pub mod board;
pub(crate) mod events;
pub mod log_lines;
pub mod metrics;
pub(crate) mod process_metrics;
pub mod server;
