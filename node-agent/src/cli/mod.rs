//! The command-line tools besides the agent: [`status`] (`holdfast status`, the node's table,
//! rendered by `table`; `holdfast status POD`, one pod's `timeline`) and [`remote`]
//! (reaching another node's agent through the API server's port-forward).
pub mod check;
pub mod cluster;
pub mod cluster_status;
pub mod remote;
pub mod status;
pub mod svg;
pub(crate) mod table;
pub(crate) mod timeline;
