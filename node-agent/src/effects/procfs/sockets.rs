//! TCP listeners in a network namespace, from `/proc/thread-self/net/tcp{,6}` read by a thread
//! inside it.
//!
//! Those files list every socket of the netns the reader is in (not only its own), so "is port
//! 15001 listening in the pod?" is answered without any process of the pod.

use std::collections::HashSet;

use procfs::net::{TcpNetEntries, TcpNetEntry, TcpState};
use procfs::FromReadSI;

use super::{Error, Result};
use crate::effects::netns::PodNetns;

/// Ports with a TCP socket in LISTEN state in a netns, read by a thread inside it
/// (`/proc/thread-self/net/tcp{,6}`), for when no pid of the pod is at hand.
pub fn listening_ports_in_netns(netns: &PodNetns) -> Result<HashSet<u16>> {
    let id = netns.id();
    let read = netns
        .run(|| -> Result<HashSet<u16>, String> {
            let info = procfs::current_system_info();
            let mut ports = HashSet::new();
            let v4 = TcpNetEntries::from_file("/proc/thread-self/net/tcp", info)
                .map_err(|e| format!("net/tcp: {e}"))?;
            collect_listening(&mut ports, &v4.0);
            match TcpNetEntries::from_file("/proc/thread-self/net/tcp6", info) {
                Ok(v6) => collect_listening(&mut ports, &v6.0),
                Err(procfs::ProcError::NotFound(_)) => {}
                Err(e) => return Err(format!("net/tcp6: {e}")),
            }
            Ok(ports)
        })
        .map_err(|e| Error::NetnsSockets {
            netns: id,
            reason: e.to_string(),
        })?;
    read.map_err(|reason| Error::NetnsSockets { netns: id, reason })
}

fn collect_listening(ports: &mut HashSet<u16>, entries: &[TcpNetEntry]) {
    for entry in entries {
        if entry.state == TcpState::Listen {
            ports.insert(entry.local_address.port());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_own_listener_through_netns() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("SKIP sees_own_listener_through_netns: setns needs root");
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let netns = PodNetns::open_path(std::path::Path::new("/proc/self/ns/net")).expect("open");
        let ports = listening_ports_in_netns(&netns).expect("read ports");
        assert!(ports.contains(&port), "port {port} not in {ports:?}");
    }
}
