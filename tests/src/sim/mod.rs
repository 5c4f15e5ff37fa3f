//! The simulated Kubernetes node: real network namespaces, iptables, cgroups, Envoy and app
//! processes, with kubelet's and pilot-agent's behaviour played by stand-ins. Every end-to-end
//! test, benchmark and `just demo` runs on it.
//!
//! # Layout
//!
//! - [`node`]: [`SimNode`], the scenario API (build a node, add/start/delete pods, wait, read
//!   reports, teardown and leftovers check).
//! - [`spec`]: [`PodSpec`] (builder) and [`AppScript`], what a test asks for.
//! - [`kubelet`]: the kubelet stand-in (sandbox, init, containers in order, SIGTERM/SIGKILL, restarts).
//! - [`native`]: the kubelet's rules for native sidecars (start gate, back-off, stop order and
//!   shared grace), followed by both backends' kubelet stand-ins; [`prober`]: the kubelet's
//!   startup and readiness probes of `istio-proxy`.
//! - [`pod_object`]: the `Pod` object (k8s-openapi) written to the pods directory.
//! - [`istio_init`]: Istio's REDIRECT-mode nat rules (the init container).
//! - [`mesh`]: which mesh injected a pod ([`Mesh`]: Istio, Kuma, Consul) and each mesh's facts
//!   (containers, uid, ports, admin) and nat rules; [`dataplane`]: the kuma-dp and
//!   consul-dataplane stand-ins (their SIGTERM, SIGUSR2, readiness and lifecycle endpoints).
//! - [`pilot_agent`]: the pilot-agent stand-in (starts Envoy as uid 1337, drains on SIGTERM);
//!   [`pilot_status`]: its status port (readiness, `/drain`) and `pilot-agent request`;
//!   [`xds`]: its xDS stand-in (Envoy's config arriving late, as from istiod).
//! - [`bootstrap`]: the sidecar's Envoy configuration (Istio-shaped listeners, holdfast filter).
//! - [`apps`]: the app containers, remote services and pause process (`sim-app` subcommands).
//! - [`attacks`]: what a hostile pod's app does (fake Envoy, rule flood, forged netlink, fork
//!   flood), for the hostile-pod suite.
//! - [`http_calls`]: pooled HTTP/1.1 and HTTP/2 calls through the sidecar's outbound HTTP
//!   listener, counting `Connection: close` and GOAWAY as the app sees them; the remote's HTTP
//!   server.
//! - [`dns`]: the cluster DNS and pilot-agent DNS proxy stand-ins (A/AAAA from a static table).
//! - [`report`]: the apps' JSON-lines reports.
//! - [`netns`], [`cgroup`], [`process`]: Linux plumbing (the only `unsafe` is in `process`).
//!
//! # A pod on the node
//!
//! netns `hf-<test>-<pod>` (lo up, `eth0` 198.18.1.x/15 on a bridge in `hf-<test>-remote`, where
//! the remote echo service listens on 198.18.0.1:7000); cgroups `kubepods/pod<uid>/<64-hex id>`
//! for the pause process, `istio-init`, the app and `istio-proxy` (pilot-agent + Envoy).
//!
//! Pod shapes ([`PodSpec`]): IPv6 ([`IpFamilies`]: `eth0` also gets `fd00:c612::…`, Istio's
//! ip6tables rules, Envoy's admin on `[::1]` when IPv6 comes first), DNS capture (the pod's
//! resolv.conf names the cluster DNS on the remote address; Istio's DNS rules redirect it to
//! pilot-agent's DNS proxy on 15053, which starts late if asked), a user init container, and
//! Istio CNI mode (rules written with the sandbox, `istio-validation` instead of `istio-init`).
//!
//! Kuma and Consul pods ([`PodSpec::mesh`], [`mesh`]): `kuma-init` / `consul-connect-inject-init`
//! write their mesh's nat rules (uid 5678, 15001/15006; uid 5995, 15001/20000, 5996 excluded),
//! the proxy container runs the kuma-dp or consul-dataplane stand-in ([`dataplane`]) with Envoy
//! as the mesh's uid, admin on 9901 / 19000 or Kuma's Unix socket in
//! `/tmp/kuma-dp-*/kuma-envoy-admin.sock` of the sidecar's own mount namespace (its
//! `kuma-sidecar-tmp` emptyDir on `/tmp`); Kuma's classic sidecar comes first among the
//! containers, its native one after `kuma-init` with the preStop `killall -USR2 kuma-dp`.

pub mod apps;
pub mod attacks;
pub mod bootstrap;
pub mod cgroup;
pub mod dataplane;
pub mod dns;
pub mod download;
pub mod http_calls;
pub mod istio_init;
pub mod kubelet;
pub mod mesh;
pub mod native;
pub mod netns;
pub mod node;
pub mod pilot_agent;
pub mod pilot_status;
pub mod pod_object;
pub mod prober;
pub mod process;
pub mod reach;
pub mod report;
pub mod spec;
pub mod xds;

pub use mesh::{KumaAdmin, Mesh};
pub use node::{sim_app_binary, NodeOptions, Runtime, SimNode, REMOTE_PORT};
pub use pod_object::{PodPhase, PodView, PROXY_CONTAINER};
pub use report::{AppReport, CallCounts, CallError, HttpProto, HttpTally, Phase};
pub use spec::{AppScript, IpFamilies, PodSpec, RestartPolicy, SidecarMode};

use std::io::Read;
use std::time::Duration;

/// Errors of the simulated node. Messages name what failed and, where possible, the fix.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        cmd: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("simulated node setup: {0}")]
    Setup(String),
    #[error("no pod named {0} on this node")]
    UnknownPod(String),
    #[error("timed out after {waited:?} waiting for {what}; last state: {last}")]
    Timeout {
        what: String,
        waited: Duration,
        last: String,
    },
    #[error(transparent)]
    Report(#[from] report::ReportError),
}

/// `n` random bytes from the kernel, as lowercase hex (container ids: `random_hex(32)`).
pub fn random_hex(n: usize) -> String {
    let mut buf = vec![0u8; n];
    let filled = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf));
    if filled.is_err() {
        // Unreachable on Linux; fall back to something unique enough for names.
        let seed = format!("{:?}{}", std::time::SystemTime::now(), std::process::id());
        for (i, b) in buf.iter_mut().enumerate() {
            *b = seed.as_bytes()[i % seed.len()].wrapping_add(i as u8);
        }
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// A random (version 4) UUID, as pod uids are.
pub fn random_uuid() -> String {
    let h = random_hex(16);
    let mut b: Vec<char> = h.chars().collect();
    b[12] = '4';
    b[16] = ['8', '9', 'a', 'b'][b[16].to_digit(16).unwrap_or(0) as usize % 4];
    let s: String = b.into_iter().collect();
    format!(
        "{}-{}-{}-{}-{}",
        &s[0..8],
        &s[8..12],
        &s[12..16],
        &s[16..20],
        &s[20..32]
    )
}

/// Gate for privileged tests: true when root; otherwise prints why the test is skipped and
/// returns false — except under CI (`CI` set), where a skipped privileged test is a failure.
pub fn privileged(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "{test}: needs root (netns, iptables, cgroups) and CI is set: run the tests as root"
        );
    }
    eprintln!("SKIPPED {test}: needs root (netns, iptables, cgroups); run as root to include it");
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_kubernetes_shapes() {
        let id = random_hex(32);
        assert_eq!(id.len(), 64);
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
        let u = random_uuid();
        let parts: Vec<&str> = u.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'));
        assert_ne!(random_uuid(), u);
    }
}
