//! TCP listeners in a process's network namespace, from `/proc/<pid>/net/tcp{,6}`.
//!
//! Those files list every socket of the netns the process is in (not only the process's own), so
//! "is port 15001 listening in the pod?" is answered from any process of the pod.

use std::collections::HashSet;
use std::path::Path;

use procfs::net::{TcpNetEntries, TcpNetEntry, TcpState};
use procfs::process::Process;
use procfs::FromReadSI;

use super::{Error, Result};
use crate::effects::netns::PodNetns;

/// Ports with a TCP socket in LISTEN state (IPv4 or IPv6) in the netns of `pid`.
pub fn listening_ports(pid: i32) -> Result<HashSet<u16>> {
    listening_ports_in(Path::new("/proc"), pid)
}

/// Like [`listening_ports`] with an injectable procfs root.
pub fn listening_ports_in(proc_root: &Path, pid: i32) -> Result<HashSet<u16>> {
    let process =
        Process::new_with_root(proc_root.join(pid.to_string())).map_err(|e| Error::Sockets {
            pid,
            reason: e.to_string(),
        })?;
    let mut ports = HashSet::new();
    let v4 = process.tcp().map_err(|e| Error::Sockets {
        pid,
        reason: format!("net/tcp: {e}"),
    })?;
    // net/tcp6 is absent when IPv6 is disabled in the kernel: not an error.
    let v6 = match process.tcp6() {
        Ok(entries) => entries,
        Err(procfs::ProcError::NotFound(_)) => Vec::new(),
        Err(e) => {
            return Err(Error::Sockets {
                pid,
                reason: format!("net/tcp6: {e}"),
            })
        }
    };
    collect_listening(&mut ports, &v4);
    collect_listening(&mut ports, &v6);
    Ok(ports)
}

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
    fn sees_own_listener() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let ports = listening_ports(std::process::id() as i32).expect("read ports");
        assert!(ports.contains(&port), "port {port} not in {ports:?}");
        drop(listener);
        assert!(
            crate::effects::procfs::gone_soon(|| listening_ports(std::process::id() as i32)
                .expect("read ports")
                .contains(&port)),
            "port {port} still listening 5 s after its listener was closed"
        );
    }

    #[test]
    fn sees_own_listener_through_netns() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("SKIP sees_own_listener_through_netns: setns needs root");
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let netns = PodNetns::open_path(Path::new("/proc/self/ns/net")).expect("open");
        let ports = listening_ports_in_netns(&netns).expect("read ports");
        assert!(ports.contains(&port), "port {port} not in {ports:?}");
    }

    #[test]
    fn missing_process_is_an_error() {
        assert!(listening_ports_in(Path::new("/nonexistent-proc"), 1).is_err());
    }
}
