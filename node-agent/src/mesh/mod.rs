//! The mesh profiles: what each Envoy sidecar mesh's injector writes into a pod, and how its
//! proxy is reached, judged and ended. One file per mesh (`istio.rs`, `kuma.rs`, `consul.rs`);
//! a pod's profile is chosen once, from its markers, by [`recognise`], and carried on its
//! `PodView`. The machine and the executors never learn a mesh's name: they read the values of
//! the pod's [`MeshProfile`].
//!
//! A fourth mesh is one file here (its `profile()` and its marker check, each fact cited from
//! its source) and one line in [`profile_of`] (plus its variant of [`Mesh`] in `api`).

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use k8s_openapi::api::core::v1::Container;
use serde::Serialize;

pub use crate::api::Mesh;
use crate::config::ProxyConfig;
pub use texts::{
    proxy_died_advice, proxy_gone_early_advice, unexposed_bytes_advice, unseen_advice,
};

pub mod consul;
pub mod istio;
pub mod istio_config;
pub mod kuma;
mod pod_reads;
mod texts;

pub use pod_reads::{env_value, EnvValue, PodReads, PodSwitches};

/// The capture ports, proxy uid and admin address that tools and tests use where no pod's
/// profile is at hand (`RuleSpec::default`, `envoy_admin::DEFAULT_ADMIN_ADDR`): Istio's, the
/// first mesh holdfast served. The agent never uses them for a pod: it reads each pod's
/// [`MeshProfile`].
pub const REFERENCE_OUTBOUND_PORT: u16 = istio::OUTBOUND_PORT;
/// See [`REFERENCE_OUTBOUND_PORT`].
pub const REFERENCE_INBOUND_PORT: u16 = istio::INBOUND_PORT;
/// See [`REFERENCE_OUTBOUND_PORT`].
pub const REFERENCE_PROXY_UID: u32 = istio::PROXY_UID;
/// See [`REFERENCE_OUTBOUND_PORT`].
pub const REFERENCE_ADMIN: std::net::SocketAddr = istio::ADMIN;

/// The path that asks Envoy to exit (its admin API's `POST /quitquitquit`), which ends every
/// mesh's proxy container with exit code 0: pilot-agent, kuma-dp and consul-dataplane each exit
/// when their Envoy does (kuma-dp not during its SIGTERM wait: `MeshProfile::sigterm_after_quit`;
/// see each profile's `end` note).
pub const QUIT_PATH: &str = "/quitquitquit";

/// Where a mesh's Envoy serves its admin API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AdminAt {
    /// A TCP address inside the pod's network namespace. A loopback IPv4 address becomes `::1`
    /// where the mesh's bootstrap binds IPv6 (see [`MeshProfile::admin_tcp_for`]).
    Tcp(SocketAddr),
    /// A Unix socket inside the proxy container's mount namespace, reached through
    /// `/proc/<envoy pid>/root<parent>/<dir_prefix>*/<name>` (Kuma 2.14+: the socket is in
    /// kuma-dp's work directory, a `os.MkdirTemp` directory under the sidecar's `$TMPDIR`).
    UnixSocket {
        /// The directory holding the work directories, inside the container (`/tmp`).
        parent: &'static str,
        /// The work directory's name before its random part (`kuma-dp-`).
        dir_prefix: &'static str,
        /// The socket's file name in the work directory.
        name: &'static str,
    },
}

/// The operator texts that name a mesh's own parts: every text on a pod's row, log line, Event
/// or advice that speaks of the proxy's agent, its own drain or its settings takes them from the
/// pod's mesh ([`MeshProfile::texts`]), so a Kuma pod's row never speaks of Istio.
#[derive(Debug, PartialEq, Eq)]
pub struct MeshTexts {
    /// What injects the sidecar (a pod "not injected by" it).
    pub injector: &'static str,
    /// The program in the proxy container that starts and ends Envoy.
    pub agent: &'static str,
    /// What drains a native sidecar's inbound at the deletion (its preStop).
    pub prestop_drain: &'static str,
    /// How the proxy ends without holdfast once the pod is deleted.
    pub own_end: &'static str,
    /// How to make Envoy keep its downstream byte counters (`None`: the mesh keeps every stat).
    pub keep_byte_counters: Option<&'static str>,
    /// How the filter gets into the mesh's proxies (`None`: the mesh cannot load it).
    pub install_filter: Option<&'static str>,
    /// The mesh release that brings Envoy 1.34+ (`drain_listeners?inboundonly` fixed).
    pub envoy_1_34: &'static str,
}

/// How a mesh's proxy container is named in the pod spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProxyName {
    /// The name the injector gives the proxy container.
    pub exact: String,
    /// Another form of the name (Consul's multi-port pods: `consul-dataplane-<service>`, one
    /// proxy per service).
    pub prefix: Option<&'static str>,
}

impl ProxyName {
    pub fn matches(&self, name: &str) -> bool {
        name == self.exact
            || self
                .prefix
                .is_some_and(|p| name.strip_prefix(p).is_some_and(|rest| !rest.is_empty()))
    }
}

/// One mesh's facts, as the agent uses them for a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MeshProfile {
    pub mesh: Mesh,
    /// The proxy container.
    pub proxy: ProxyName,
    /// The init containers the injector adds (they write the iptables rules, or check them
    /// with the mesh's CNI plugin); they send nothing through the capture ports.
    pub init_steps: &'static [&'static str],
    /// uid the proxy runs as: the mesh's iptables rules exclude it, and so does the hold.
    pub proxy_uid: u32,
    /// Envoy's outbound capture port (the app's outbound connections are redirected there).
    pub outbound_port: u16,
    /// Envoy's inbound capture port.
    pub inbound_port: u16,
    /// Where the mesh redirects the pod's DNS when its DNS capture is on (held until it
    /// listens); `None`: the agent does not hold DNS for this mesh.
    pub dns_port: Option<u16>,
    /// The mesh's DNS proxy serves TCP as well as UDP (its init redirects both): readiness then
    /// wants a TCP listener on [`MeshProfile::dns_port`] besides the bound UDP socket. Istio's
    /// pilot-agent serves both; Kuma's kuma-dp serves UDP only (its init RETURNs TCP/53), so a
    /// Kuma pod whose readiness waited for a TCP listener there would never be ready.
    pub dns_tcp: bool,
    /// Envoy's admin API.
    pub admin: AdminAt,
    /// The mesh's bootstrap moves a loopback IPv4 admin to `::1` on a pod whose IPs are IPv6
    /// (Istio: its bootstrap's "localhost" follows the proxy's IPs). `false`: the admin address
    /// is the profile's whatever the pod's IPs (Kuma's `adminAddress`, copied into every
    /// bootstrap; Consul's injector flag, read from the container's args).
    pub admin_follows_pod_ips: bool,
    /// `http.<stat_prefix>` scopes of the mesh's own listeners (probes, metrics, admin
    /// proxies): their bytes are not the pod's traffic, so the drain's idle test skips them.
    pub own_http_prefixes: &'static [&'static str],
    /// Envoy's own capture listeners carry every connection of their direction, so their
    /// `listener.<address>_<port>.downstream_cx_active` gauges give the drain the directional
    /// counts where the filter cannot be loaded (Consul: one outbound listener with a filter
    /// chain per upstream, one public listener, every stat kept).
    pub listener_counts: bool,
    /// The mesh's agent sends `POST /healthcheck/fail` on SIGTERM (kuma-dp), which makes every
    /// listener drain-close — outbound too, while the app still calls out — until it stops
    /// Envoy: the drain undoes it ([`crate::mesh`]'s users: `drain::decide::restore_health`).
    pub fails_health_check_on_sigterm: bool,
    /// The mesh's agent, once SIGTERMed, waits its fixed drain time whatever Envoy does, and
    /// ends at a second SIGTERM (kuma-dp: run.go's wait selects only on its timer and the second
    /// signal, not on Envoy's exit): after the drain's quit, the agent sends it that SIGTERM so
    /// the container ends (exit 0) when Envoy does.
    pub sigterm_after_quit: bool,
    /// What the kubelet probes the proxy's readiness on, for the reader (the agent judges
    /// readiness by Envoy's own stats, the same for every mesh).
    pub readiness: &'static str,
}

impl MeshProfile {
    /// The admin TCP address for a pod: a loopback admin becomes `::1` when the pod's IPs call
    /// for it (`v6_loopback`) and the mesh's bootstrap follows them
    /// ([`MeshProfile::admin_follows_pod_ips`]).
    pub fn admin_tcp_for(&self, v6_loopback: bool) -> Option<SocketAddr> {
        match &self.admin {
            AdminAt::Tcp(addr)
                if self.admin_follows_pod_ips && v6_loopback && addr.ip().is_loopback() =>
            {
                Some(SocketAddr::new(
                    IpAddr::V6(Ipv6Addr::LOCALHOST),
                    addr.port(),
                ))
            }
            AdminAt::Tcp(addr) => Some(*addr),
            AdminAt::UnixSocket { .. } => None,
        }
    }

    /// The capture ports (outbound, inbound) whose listeners give the drain its counts
    /// ([`MeshProfile::listener_counts`]), or `None`.
    pub fn listener_ports(&self) -> Option<(u16, u16)> {
        self.listener_counts
            .then_some((self.outbound_port, self.inbound_port))
    }

    /// The operator texts of the pod's mesh.
    pub fn texts(&self) -> &'static MeshTexts {
        texts_of(self.mesh)
    }

    /// Whether the native proxy's preStop drains it at the deletion and its container exits at
    /// the SIGTERM the kubelet sends after the app exited: the kubelet then orders the drain.
    pub fn prestop_drain(&self, proxy: &Container) -> bool {
        match self.mesh {
            Mesh::Istio => istio::prestop_drain(proxy),
            Mesh::Kuma => kuma::prestop_drain(proxy),
            Mesh::Consul => false,
        }
    }
}

/// What a mesh reads from one pod beyond its markers (its file's `read_pod`).
impl MeshProfile {
    /// Reads the pod's own settings into the profile (Kuma's uid and ports, each mesh's admin
    /// address) and returns the switches they turn on; what cannot be read goes to `problems`
    /// and the mesh's default stays.
    pub fn read_pod(&mut self, reads: &PodReads<'_>, problems: &mut Vec<String>) -> PodSwitches {
        match self.mesh {
            Mesh::Istio => istio::read_pod(reads, problems),
            Mesh::Kuma => kuma::read_pod(self, reads, problems),
            Mesh::Consul => consul::read_pod(self, reads, problems),
        }
    }

    /// The proxy is the mesh's, but not a sidecar (a gateway, a waypoint, ztunnel): why.
    pub fn not_a_sidecar(&self, reads: &PodReads<'_>) -> Option<String> {
        match self.mesh {
            Mesh::Istio => istio::not_a_sidecar(reads),
            Mesh::Kuma | Mesh::Consul => None,
        }
    }

    /// The pod's interception mode when it is not REDIRECT (other rules and capture ports).
    pub fn other_interception(&self, reads: &PodReads<'_>) -> Option<String> {
        match self.mesh {
            Mesh::Istio => istio::other_interception(reads),
            Mesh::Kuma | Mesh::Consul => None,
        }
    }
}

/// Every annotation the meshes read (the pod source keeps these).
pub const READ_ANNOTATIONS: [&str; 10] = [
    istio::ANNOTATION_SIDECAR_STATUS,
    istio::ANNOTATION_INTERCEPTION_MODE,
    istio::ANNOTATION_PROXY_CONFIG,
    kuma::ANNOTATION_SIDECAR_INJECTED,
    kuma::ANNOTATION_ENVOY_ADMIN_PORT,
    kuma::ANNOTATION_SIDECAR_UID,
    kuma::ANNOTATION_OUTBOUND_PORT,
    kuma::ANNOTATION_INBOUND_PORT,
    consul::KEY_INJECT_STATUS,
    consul::KEY_TRANSPARENT_PROXY_STATUS,
];

/// Every container environment variable the meshes read (the pod source keeps these).
pub const READ_ENV: [&str; 6] = [
    istio::ENV_DNS_CAPTURE,
    istio::ENV_EXIT_ON_ZERO,
    istio::ENV_DUAL_STACK,
    istio::ENV_INTERCEPTION_MODE,
    kuma::ENV_DNS_ENABLED,
    kuma::ENV_DNS_PROXY_PORT,
];

/// The operator texts of `mesh` ([`MeshTexts`]).
pub fn texts_of(mesh: Mesh) -> &'static MeshTexts {
    match mesh {
        Mesh::Istio => &istio::TEXTS,
        Mesh::Kuma => &kuma::TEXTS,
        Mesh::Consul => &consul::TEXTS,
    }
}

/// The profile of `mesh`; Istio's takes the agent's `--proxy-*` flags.
pub fn profile_of(mesh: Mesh, istio: &ProxyConfig) -> MeshProfile {
    match mesh {
        Mesh::Istio => istio::profile(istio),
        Mesh::Kuma => kuma::profile(),
        Mesh::Consul => consul::profile(),
    }
}

/// What a pod's markers say about its mesh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recognised {
    /// No mesh's marker and no mesh's proxy container: not meshed.
    None,
    /// One mesh: its profile. `ignored` names other meshes whose marker is there without their
    /// proxy container (an annotation copied from another template): said on the pod's row.
    One {
        profile: MeshProfile,
        ignored: Vec<Mesh>,
    },
    /// A proxy container of a mesh whose injection marker is missing (or says it did not inject).
    NotInjected { mesh: Mesh, why: String },
    /// More than one mesh's marker and proxy container: holdfast cannot tell whose rules are in
    /// the netns, and leaves the pod alone.
    Several(Vec<Mesh>),
}

/// A pod's metadata as the recognition reads it.
pub struct Markers<'a> {
    pub annotation: &'a dyn Fn(&str) -> Option<&'a str>,
    pub label: &'a dyn Fn(&str) -> Option<&'a str>,
    /// Every container name of the pod (regular and init).
    pub containers: &'a [&'a str],
}

/// Chooses a pod's mesh: a mesh is the pod's when its proxy container is there; its injection
/// marker must say it injected it. Two meshes' proxies in one pod: left alone.
pub fn recognise(markers: &Markers<'_>, istio: &ProxyConfig) -> Recognised {
    let profiles: Vec<MeshProfile> = Mesh::ALL.iter().map(|m| profile_of(*m, istio)).collect();
    let with_proxy: Vec<&MeshProfile> = profiles
        .iter()
        .filter(|p| markers.containers.iter().any(|c| p.proxy.matches(c)))
        .collect();
    let marked: Vec<Mesh> = profiles
        .iter()
        .filter(|p| marker(p.mesh, markers).is_ok())
        .map(|p| p.mesh)
        .collect();
    match with_proxy.as_slice() {
        [] => Recognised::None,
        [one] => match marker(one.mesh, markers) {
            Ok(()) => Recognised::One {
                profile: (*one).clone(),
                ignored: marked.into_iter().filter(|m| *m != one.mesh).collect(),
            },
            Err(why) => Recognised::NotInjected {
                mesh: one.mesh,
                why,
            },
        },
        several => {
            let both: Vec<Mesh> = several
                .iter()
                .map(|p| p.mesh)
                .filter(|m| marked.contains(m))
                .collect();
            match both.as_slice() {
                [only] => Recognised::One {
                    profile: profile_of(*only, istio),
                    ignored: marked.into_iter().filter(|m| m != only).collect(),
                },
                [] => Recognised::NotInjected {
                    mesh: several[0].mesh,
                    why: "proxy containers of several meshes, none marked injected".into(),
                },
                _ => Recognised::Several(both),
            }
        }
    }
}

/// Whether `mesh`'s injector marked the pod as injected (`Err`: why not).
fn marker(mesh: Mesh, markers: &Markers<'_>) -> Result<(), String> {
    match mesh {
        Mesh::Istio => istio::injected(markers),
        Mesh::Kuma => kuma::injected(markers),
        Mesh::Consul => consul::injected(markers),
    }
}

/// Every label a mesh's recognition reads (the pod source keeps these).
pub const READ_LABELS: [&str; 2] = [kuma::LABEL_MESH, consul::KEY_INJECT_STATUS];

#[cfg(test)]
mod tests;
