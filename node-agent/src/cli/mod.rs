//! The command-line tools besides the agent: [`status`] (`holdfast status`, the node's table)
//! and [`remote`] (reaching another node's agent through the API server's port-forward).
pub mod remote;
pub mod status;
pub mod table;
