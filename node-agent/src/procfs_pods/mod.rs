//! What procfs says about pods: which pod and container a process belongs to ([`cgroup`]), and
//! which TCP ports listen in a process's network namespace ([`sockets`]).
//!
//! The cached index of every pod's processes, which the agent polls, is
//! [`crate::agent::pod_procs`]; it classifies processes with [`cgroup::parse_pod_cgroup`].

#![forbid(unsafe_code)]

pub mod cgroup;
pub mod sock_diag;
pub mod sockets;

pub use crate::netns::NetnsId;
pub use cgroup::{parse_pod_cgroup, PodCgroup};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read TCP sockets of pid {pid}: {reason}")]
    Sockets { pid: i32, reason: String },
    #[error("cannot read TCP sockets in netns {netns:?}: {reason}")]
    NetnsSockets { netns: NetnsId, reason: String },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;
