//! Network namespaces and links of the simulated node, through `ip` (iproute2).
//!
//! Each pod gets a named netns (`/run/netns/<name>`, what `ip netns` manages) with `lo` up and a
//! veth `eth0` whose peer sits on a bridge in the node's "remote services" namespace. A [`NetNs`]
//! deletes its namespace on drop (which also deletes its veth and its iptables rules).
//!
//! IPv6: the bridge also has [`REMOTE_IP6`] in the ULA prefix `fd00:c612::/64`, and a pod that
//! asks for IPv6 gets [`pod_ip6`] on its `eth0` ([`NetNs::add_ipv6`]). Addresses are added with
//! `nodad`: duplicate address detection would leave them "tentative" (unusable) for a second or
//! more, a delay a real CNI plugin does not show either (it disables DAD in the pod too).

use std::fs::File;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::SimError;

/// Runs a command given as program + args (never a shell string) to completion; a non-zero
/// exit is an error carrying its stderr. Returns its stdout.
pub(crate) fn run_output(program: &str, args: &[&str]) -> Result<String, SimError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| SimError::Io {
            what: format!("cannot run {program} {args:?} (is it installed? `just setup`)"),
            source,
        })?;
    if !out.status.success() {
        return Err(SimError::Command {
            cmd: format!("{program} {}", args.join(" ")),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`run_output`] for a command whose output is not needed.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<(), SimError> {
    run_output(program, args).map(drop)
}

/// Prefix length used for every address of the simulated node (198.18.0.0/15, RFC 2544).
pub const PREFIX_LEN: u8 = 15;
/// The remote services' address on the node's bridge.
pub const REMOTE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

/// Prefix length of the node's IPv6 addresses.
pub const PREFIX6_LEN: u8 = 64;
/// The remote services' IPv6 address on the node's bridge (ULA, RFC 4193).
pub const REMOTE_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xc612, 0, 0, 0, 0, 0, 1);

/// The IPv6 address of the pod whose IPv4 address is `v4` (one per IPv4 address, in
/// `fd00:c612::/64`): 198.18.1.4 → fd00:c612::1:4.
pub fn pod_ip6(v4: Ipv4Addr) -> Ipv6Addr {
    let o = v4.octets();
    Ipv6Addr::new(
        0xfd00,
        0xc612,
        0,
        0,
        0,
        u16::from(o[1]),
        u16::from(o[2]),
        u16::from(o[3]),
    )
}

/// The address of the `index`-th pod (0-based) of a node: 198.18.1.2, 198.18.1.3, ...
pub fn pod_ip(index: usize) -> Ipv4Addr {
    let n = index + 2;
    Ipv4Addr::new(198, 18, 1 + (n / 250) as u8, (n % 250) as u8 + 2)
}

/// A named network namespace, deleted on drop.
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates `name` (deleting a stale one left by a killed earlier run) with `lo` up.
    pub fn create(name: &str) -> Result<NetNs, SimError> {
        if PathBuf::from("/run/netns").join(name).exists() {
            let _ = run("ip", &["netns", "delete", name]);
        }
        run("ip", &["netns", "add", name])?;
        let ns = NetNs {
            name: name.to_string(),
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// Opens the namespace (for `setns`).
    pub fn open(&self) -> Result<File, SimError> {
        File::open(self.path()).map_err(|source| SimError::Io {
            what: format!("cannot open netns {}", self.path().display()),
            source,
        })
    }

    /// `ip -n <name> <args>`.
    pub fn ip(&self, args: &[&str]) -> Result<(), SimError> {
        let mut a = vec!["-n", self.name.as_str()];
        a.extend_from_slice(args);
        run("ip", &a)
    }

    /// Makes this the remote services' namespace: bridge `br0` with [`REMOTE_IP`].
    pub fn add_bridge(&self) -> Result<(), SimError> {
        // A fixed (locally administered) MAC: a bridge without one takes the lowest of its
        // ports' and changes it when that port goes, so a pod ending would leave the other
        // pods' neighbour entries for the remote address stale and their traffic stalled.
        self.ip(&[
            "link",
            "add",
            "br0",
            "address",
            "02:00:c6:12:00:01",
            "type",
            "bridge",
        ])?;
        self.ip(&[
            "addr",
            "add",
            &format!("{REMOTE_IP}/{PREFIX_LEN}"),
            "dev",
            "br0",
        ])?;
        // Best effort: on a host without IPv6 only the IPv6 pod shapes are unavailable.
        if let Err(e) = self.ip(&[
            "addr",
            "add",
            &format!("{REMOTE_IP6}/{PREFIX6_LEN}"),
            "dev",
            "br0",
            "nodad",
        ]) {
            eprintln!("sim: no IPv6 on the node's bridge ({e}): IPv6 pods will not work");
        }
        self.ip(&["link", "set", "br0", "up"])
    }

    /// Gives this pod's `eth0` (see [`NetNs::link_to`]) the IPv6 address `ip`.
    pub fn add_ipv6(&self, ip: Ipv6Addr) -> Result<(), SimError> {
        self.ip(&[
            "addr",
            "add",
            &format!("{ip}/{PREFIX6_LEN}"),
            "dev",
            "eth0",
            "nodad",
        ])
    }

    /// Links this (pod) namespace to `remote`'s bridge: `eth0` here with `ip`, peer `peer` there.
    /// Created from inside the namespaces, so names never clash with the host's interfaces.
    pub fn link_to(&self, remote: &str, peer: &str, ip: Ipv4Addr) -> Result<(), SimError> {
        self.ip(&[
            "link", "add", "eth0", "type", "veth", "peer", "name", peer, "netns", remote,
        ])?;
        run(
            "ip",
            &["-n", remote, "link", "set", peer, "master", "br0", "up"],
        )?;
        self.ip(&["addr", "add", &format!("{ip}/{PREFIX_LEN}"), "dev", "eth0"])?;
        self.ip(&["link", "set", "eth0", "up"])
    }
}

impl NetNs {
    /// Removes the pod's `eth0` and so its veth peer on the bridge, as the CNI plugin's DEL does
    /// when the kubelet stops a sandbox: a peer name can then be used again at once, even while
    /// someone (the agent) still holds the old namespace open.
    pub fn unlink(&self) -> Result<(), SimError> {
        self.ip(&["link", "del", "eth0"])
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Err(e) = run("ip", &["netns", "delete", &self.name]) {
            eprintln!("sim: cannot delete netns {}: {e}", self.name);
        }
    }
}

/// Runs `f` on a new thread that has entered the network namespace at `path` (sockets it creates
/// stay in that namespace after it returns; the caller's thread never switches).
pub fn run_in<R: Send>(path: &Path, f: impl FnOnce() -> R + Send) -> Result<R, SimError> {
    let file = File::open(path).map_err(|source| SimError::Io {
        what: format!("cannot open netns {}", path.display()),
        source,
    })?;
    std::thread::scope(|s| {
        s.spawn(move || {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| {
                SimError::Io {
                    what: format!("cannot enter netns {}", path.display()),
                    source: e.into(),
                }
            })?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(SimError::Setup("netns thread panicked".into())))
    })
}

/// Named namespaces whose name starts with `prefix`.
pub fn list_with_prefix(prefix: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_ips_stay_in_the_benchmark_range() {
        assert_eq!(pod_ip(0), Ipv4Addr::new(198, 18, 1, 4));
        for i in [0, 1, 247, 248, 249, 1000] {
            let ip = pod_ip(i);
            assert_eq!(ip.octets()[0], 198);
            assert!(matches!(ip.octets()[1], 18 | 19), "{ip}");
            assert!(ip.octets()[3] >= 2, "{ip}");
            assert_ne!(ip, REMOTE_IP);
        }
        assert_ne!(pod_ip(247), pod_ip(248));
    }

    #[test]
    fn pod_ipv6_addresses_are_ula_and_distinct() {
        assert_eq!(pod_ip6(pod_ip(0)).to_string(), "fd00:c612::12:1:4");
        assert_ne!(pod_ip6(pod_ip(247)), pod_ip6(pod_ip(248)));
        for i in [0, 1, 1000, 70000] {
            let ip = pod_ip6(pod_ip(i));
            assert_eq!(ip.segments()[..2], [0xfd00, 0xc612], "{ip}");
            assert_ne!(ip, REMOTE_IP6);
        }
    }
}
