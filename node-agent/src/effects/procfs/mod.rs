//! What procfs (and the kernel) say about pods: which pod and container a process belongs to
//! ([`cgroup`]), which sockets listen in a network namespace ([`sock_diag`], over netlink, what
//! readiness uses), and the same from `/proc/<pid>/net/tcp{,6}` ([`sockets`], the fallback when a
//! kernel has no sock_diag: it walks the whole established table, ~4 ms per read).
//!
//! The cached index of every pod's processes, which the agent polls, is
//! [`crate::effects::procfs::pod_procs`]; it classifies processes with [`cgroup::parse_pod_cgroup`].

#![forbid(unsafe_code)]

pub mod cgroup;
pub mod pod_procs;
pub mod proxy_procs;
pub mod sock_diag;
pub mod sockets;

pub use crate::effects::netns::NetnsId;
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
