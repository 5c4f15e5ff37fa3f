//! Which mesh injected a simulated pod ([`Mesh`]), and each mesh's facts as its injector and
//! its init step write them: the proxy container, the init container, the proxy uid, the
//! capture ports, Envoy's admin address, and the nat rules of its transparent proxy.
//!
//! Read from source (tags kumahq/kuma v2.14.3, hashicorp/consul-k8s v2.0.3,
//! hashicorp/consul-dataplane v2.0.1, hashicorp/consul `sdk/iptables`):
//!
//! - **Kuma**: `kuma.io/sidecar-injected: "true"` annotation and the `kuma.io/mesh` label
//!   (pkg/plugins/runtime/k8s/metadata/annotations.go, labels.go; injector.go sets the label);
//!   containers `kuma-sidecar` / `kuma-init` (pkg/plugins/runtime/k8s/util/names.go); the
//!   classic sidecar is put FIRST among the containers, the native one after `kuma-init` among
//!   the init containers with `restartPolicy: Always` and the preStop `killall -USR2 kuma-dp`
//!   (webhooks/injector/injector.go); uid 5678, outbound 15001, inbound 15006 (the golden
//!   test/transparentproxy/testdata/alpine-3-default.iptables.golden, which [`kuma_rules`]
//!   follows line by line, `ifPlaceholder` being `lo`); Envoy admin on 127.0.0.1:9901, or since
//!   2.14 a Unix socket `<workdir>/kuma-envoy-admin.sock` (pkg/core/xds/sockets.go
//!   `AdminSocketName`, mode 0600 in pkg/xds/bootstrap/template_v3.go), the workdir a
//!   `kuma-dp-<random>` directory made by kuma-dp with mode 0711 (app/kuma-dp/cmd/run.go);
//!   readiness `/ready` on 9902 then (pkg/plugins/runtime/k8s/containers/factory.go: the probes
//!   move to `DefaultReadinessPort` when the admin is on a Unix socket).
//! - **Consul**: `consul.hashicorp.com/connect-inject-status: injected` as an annotation AND a
//!   label, `consul.hashicorp.com/transparent-proxy-status: enabled`
//!   (control-plane/connect-inject/constants/annotations_and_labels.go); containers
//!   `consul-dataplane` / `consul-connect-inject-init` (webhook/mesh_webhook.go,
//!   container_init.go); proxy uid 5995, the init container's 5996 excluded from redirection
//!   (container_init.go, redirect_traffic.go `iptablesConfigJSON`); outbound 15001, inbound
//!   20000 (`ProxyDefaultInboundPort`); the rules of hashicorp/consul sdk/iptables/iptables.go
//!   `Setup` ([`consul_rules`]); Envoy admin on 127.0.0.1:19000 (`-envoy-admin-bind-port`);
//!   consul-dataplane's lifecycle server on 127.0.0.1:20600 (`DefaultGracefulPort`).
//!
//! Consul's native sidecar (consul-k8s 1.9+) is built as [`proxy_container`] says, on the netns
//! backend. What the sim leaves out: Kuma's CNI (`kuma-validation`), Consul's multi-port pods
//! (`consul-dataplane-<svc>`, ports + service index), Consul's DNS redirection and IPv6 rules,
//! and a native Consul sidecar on a dual-stack install (its startup probe asks 127.0.0.1 while
//! its admin is on `::1`: [`CONSUL_NATIVE_STARTUP_PROBE`]).

use std::net::SocketAddr;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvVar, ExecAction, HTTPGetAction, Lifecycle, LifecycleHandler, Probe,
    SecurityContext, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The mesh whose injector shaped the pod ([`super::PodSpec::mesh`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mesh {
    /// Istio (the sim's original shape: [`super::istio_init`], [`super::pilot_agent`]).
    #[default]
    Istio,
    /// Kuma / Kong Mesh: `kuma-sidecar` running kuma-dp ([`super::dataplane`]).
    Kuma(KumaAdmin),
    /// Consul on Kubernetes: `consul-dataplane` ([`super::dataplane`]).
    Consul,
}

/// Where Kuma's Envoy admin API listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KumaAdmin {
    /// TCP 127.0.0.1:9901 (Kuma ≤ 2.13, or 2.14 with the Unix socket turned off).
    Tcp,
    /// `<kuma-dp workdir>/kuma-envoy-admin.sock` (Kuma 2.14's default); no TCP admin.
    UnixSocket,
}

/// Kuma's proxy uid (kuma-dp user).
pub const KUMA_UID: u32 = 5678;
/// Consul's proxy uid (`sidecarUserAndGroupID`).
pub const CONSUL_UID: u32 = 5995;
/// Consul's init container uid (`initContainersUserAndGroupID`), excluded from redirection.
pub const CONSUL_INIT_UID: u32 = 5996;
/// Kuma's Envoy admin TCP port.
pub const KUMA_ADMIN_PORT: u16 = 9901;
/// kuma-dp's readiness reporter port (`/ready`).
pub const KUMA_READINESS_PORT: u16 = 9902;
/// kuma-dp's DNS proxy port (`builtinDNS.port`), where kuma-init redirects UDP DNS.
pub const KUMA_DNS_PORT: u16 = 15053;
/// Consul's Envoy admin port.
pub const CONSUL_ADMIN_PORT: u16 = 19000;
/// consul-dataplane's lifecycle (graceful shutdown/startup) port.
pub const CONSUL_GRACEFUL_PORT: u16 = 20600;
/// A native consul-dataplane's startup probe (hashicorp/consul-k8s
/// control-plane/connect-inject/webhook/consul_dataplane_sidecar.go, v1.9.0+): the exec of
/// consul-dataplane's `-check-proxy-health`, which asks `GET http://127.0.0.1:<admin port>/ready`
/// (its default 19000: the probe passes no flags) and exits 0 on a 2xx/3xx answer
/// (hashicorp/consul-dataplane cmd/consul-dataplane/main.go `doHealthCheck`, v1.9.0+).
pub const CONSUL_NATIVE_STARTUP_PROBE: [&str; 2] =
    ["/usr/local/bin/consul-dataplane", "-check-proxy-health"];
/// The admin socket's file name inside kuma-dp's workdir.
pub const KUMA_ADMIN_SOCKET: &str = "kuma-envoy-admin.sock";

/// Envoy's admin address: TCP or a Unix socket whose path kuma-dp decides at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl Mesh {
    /// The name holdfast's status shows (`istio`, `kuma`, `consul`).
    pub fn name(self) -> &'static str {
        match self {
            Mesh::Istio => "istio",
            Mesh::Kuma(_) => "kuma",
            Mesh::Consul => "consul",
        }
    }

    /// The proxy container's name.
    pub fn proxy_container(self) -> &'static str {
        match self {
            Mesh::Istio => super::pod_object::PROXY_CONTAINER,
            Mesh::Kuma(_) => "kuma-sidecar",
            Mesh::Consul => "consul-dataplane",
        }
    }

    /// The injected init container's name (Istio's CNI mode aside: [`super::PodView::init_name`]).
    pub fn init_container(self) -> &'static str {
        match self {
            Mesh::Istio => super::pod_object::INIT_CONTAINER,
            Mesh::Kuma(_) => "kuma-init",
            Mesh::Consul => "consul-connect-inject-init",
        }
    }

    /// The proxy image as each injector names it (tags the sim follows).
    pub fn proxy_image(self) -> &'static str {
        match self {
            Mesh::Istio => super::pod_object::PROXY_IMAGE,
            Mesh::Kuma(_) => "docker.io/kumahq/kuma-dp:2.14.3",
            Mesh::Consul => "hashicorp/consul-dataplane:1.9.3",
        }
    }

    /// The init image.
    pub fn init_image(self) -> &'static str {
        match self {
            Mesh::Istio => super::pod_object::PROXY_IMAGE,
            Mesh::Kuma(_) => "docker.io/kumahq/kuma-init:2.14.3",
            Mesh::Consul => "hashicorp/consul-k8s-control-plane:1.9.3",
        }
    }

    /// The proxy's uid (and gid).
    pub fn proxy_uid(self) -> u32 {
        match self {
            Mesh::Istio => super::istio_init::PROXY_UID,
            Mesh::Kuma(_) => KUMA_UID,
            Mesh::Consul => CONSUL_UID,
        }
    }

    /// Envoy's outbound capture port.
    pub fn outbound_port(self) -> u16 {
        super::istio_init::OUTBOUND_PORT
    }

    /// Envoy's inbound capture port.
    pub fn inbound_port(self) -> u16 {
        match self {
            Mesh::Istio | Mesh::Kuma(_) => super::istio_init::INBOUND_PORT,
            Mesh::Consul => 20000,
        }
    }

    /// Envoy's admin TCP address, or `None` when it is a Unix socket (Kuma 2.14).
    pub fn admin_tcp(self) -> Option<SocketAddr> {
        let lo = std::net::Ipv4Addr::LOCALHOST;
        match self {
            Mesh::Istio => Some(SocketAddr::from((lo, super::istio_init::ADMIN_PORT))),
            Mesh::Kuma(KumaAdmin::Tcp) => Some(SocketAddr::from((lo, KUMA_ADMIN_PORT))),
            Mesh::Kuma(KumaAdmin::UnixSocket) => None,
            Mesh::Consul => Some(SocketAddr::from((lo, CONSUL_ADMIN_PORT))),
        }
    }

    /// The `sim-app` subcommand of the proxy container's main process.
    pub fn agent_command(self) -> &'static str {
        match self {
            Mesh::Istio => "pilot-agent",
            Mesh::Kuma(_) => "kuma-dp",
            Mesh::Consul => "consul-dataplane",
        }
    }

    /// The nat rules the mesh's init step installs, as `iptables` argument vectors in the order
    /// the mesh applies them (Istio's are in [`super::istio_init`]).
    pub fn nat_rules(self) -> Vec<Vec<String>> {
        match self {
            Mesh::Istio => super::istio_init::iptables_invocations(),
            Mesh::Kuma(_) => kuma_rules(),
            Mesh::Consul => consul_rules(),
        }
    }
}

/// Kuma's transparent-proxy nat rules (kuma-init, no DNS redirect), as `iptables` calls: the
/// chains, then every rule of test/transparentproxy/testdata/alpine-3-default.iptables.golden
/// (kumahq/kuma v2.14.3) in its order, `ifPlaceholder` being the loopback `lo`.
pub fn kuma_rules() -> Vec<Vec<String>> {
    kuma_rules_with_dns(None)
}

/// [`kuma_rules`] with the builtin DNS's redirect (`dns`: kuma-dp's DNS port), as kuma-init
/// writes it when the injector passes `--redirect-all-dns-traffic --redirect-dns-port=<port>`
/// (the builtin DNS on: pkg/plugins/runtime/k8s/webhooks/injector/testdata/inject.23.golden.yaml,
/// v2.14.3): the three nat OUTPUT rules of pkg/transparentproxy/iptables/builder/
/// builder_table_nat.go before the jump to KUMA_MESH_OUTBOUND, in the order of the golden
/// test/transparentproxy/testdata/alpine-3-with-multiple-flags.iptables.golden — kuma-dp's own
/// UDP DNS RETURNed, every other UDP DNS REDIRECTed to kuma-dp, and the app's TCP DNS RETURNed
/// ("allow applications to perform DNS queries over TCP ... without mesh redirection"): kuma-dp
/// serves DNS over UDP only.
pub fn kuma_rules_with_dns(dns: Option<u16>) -> Vec<Vec<String>> {
    const C: &str = "kuma/mesh/transparent/proxy/";
    let uid = KUMA_UID.to_string();
    let mut out: Vec<Vec<String>> = [
        "KUMA_MESH_INBOUND",
        "KUMA_MESH_INBOUND_REDIRECT",
        "KUMA_MESH_OUTBOUND",
        "KUMA_MESH_OUTBOUND_REDIRECT",
    ]
    .iter()
    .map(|c| argv(&["-t", "nat", "-N", c]))
    .collect();
    let comment = |s: &str| format!("{C}{s}");
    let mut rules: Vec<Vec<String>> = vec![argv(&[
        "-t",
        "nat",
        "-A",
        "PREROUTING",
        "-p",
        "tcp",
        "-m",
        "comment",
        "--comment",
        &comment("redirect inbound TCP traffic to our custom chain for processing"),
        "-j",
        "KUMA_MESH_INBOUND",
    ])];
    if let Some(port) = dns {
        let port = port.to_string();
        rules.extend([
            argv(&["-t", "nat", "-A", "OUTPUT", "-p", "udp", "-m", "comment", "--comment", &comment("return early for DNS traffic from kuma-dp"), "-m", "udp", "--dport", "53", "-m", "owner", "--uid-owner", &uid, "-j", "RETURN"]),
            argv(&["-t", "nat", "-A", "OUTPUT", "-p", "udp", "-m", "comment", "--comment", &comment(&format!("redirect all DNS requests to the kuma-dp DNS proxy (listening on port {port})")), "-m", "udp", "--dport", "53", "-j", "REDIRECT", "--to-ports", &port]),
            argv(&["-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-m", "comment", "--comment", &comment(&format!("allow applications to perform DNS queries over TCP to port 53 without mesh redirection (only traffic not owned by UID {uid} (kuma-dp user))")), "-m", "tcp", "--dport", "53", "-m", "owner", "!", "--uid-owner", &uid, "-j", "RETURN"]),
        ]);
    }
    rules.extend([
        argv(&["-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-m", "comment", "--comment", &comment("redirect outbound TCP traffic to our custom chain for processing"), "-j", "KUMA_MESH_OUTBOUND"]),
        argv(&["-t", "nat", "-A", "KUMA_MESH_INBOUND", "-p", "tcp", "-m", "comment", "--comment", &comment("redirect all inbound traffic to the custom chain for processing"), "-j", "KUMA_MESH_INBOUND_REDIRECT"]),
        argv(&["-t", "nat", "-A", "KUMA_MESH_INBOUND_REDIRECT", "-p", "tcp", "-m", "comment", "--comment", &comment("redirect TCP traffic to envoy (port 15006)"), "-j", "REDIRECT", "--to-ports", "15006"]),
        argv(&["-t", "nat", "-A", "KUMA_MESH_OUTBOUND", "-s", "127.0.0.6/32", "-o", "lo", "-m", "comment", "--comment", &comment("prevent traffic loops by ensuring traffic from the sidecar proxy (using 127.0.0.6/32) to loopback interface is not redirected again"), "-j", "RETURN"]),
        argv(&["-t", "nat", "-A", "KUMA_MESH_OUTBOUND", "!", "-d", "127.0.0.1/32", "-o", "lo", "-p", "tcp", "-m", "comment", "--comment", &comment("redirect outbound TCP traffic destined for loopback interface, but not targeting address 127.0.0.1/32, and owned by UID 5678 (kuma-dp user) to KUMA_MESH_INBOUND_REDIRECT chain for proper handling"), "-m", "owner", "--uid-owner", &uid, "-j", "KUMA_MESH_INBOUND_REDIRECT"]),
        argv(&["-t", "nat", "-A", "KUMA_MESH_OUTBOUND", "-o", "lo", "-p", "tcp", "-m", "comment", "--comment", &comment("return outbound TCP traffic destined for loopback interface, owned by any UID other than 5678 (kuma-dp user)"), "-m", "owner", "!", "--uid-owner", &uid, "-j", "RETURN"]),
        argv(&["-t", "nat", "-A", "KUMA_MESH_OUTBOUND", "-m", "comment", "--comment", &comment("return outbound traffic owned by UID 5678 (kuma-dp user)"), "-m", "owner", "--uid-owner", &uid, "-j", "RETURN"]),
        argv(&["-t", "nat", "-A", "KUMA_MESH_OUTBOUND", "-d", "127.0.0.1/32", "-m", "comment", "--comment", &comment("return traffic destined for localhost (127.0.0.1/32) to avoid redirection"), "-j", "RETURN"]),
        argv(&["-t", "nat", "-A", "KUMA_MESH_OUTBOUND", "-m", "comment", "--comment", &comment("redirect all other outbound traffic to our custom chain for further processing"), "-j", "KUMA_MESH_OUTBOUND_REDIRECT"]),
        argv(&["-t", "nat", "-A", "KUMA_MESH_OUTBOUND_REDIRECT", "-p", "tcp", "-m", "comment", "--comment", &comment("redirect TCP traffic to envoy (port 15001)"), "-j", "REDIRECT", "--to-ports", "15001"]),
    ]);
    out.extend(rules);
    out
}

/// Kuma's IPv6 rules (kuma-init with `ipFamilyMode: dualstack`, the default:
/// kuma-cp.defaults.yaml v2.14.3), as `ip6tables` calls: [`kuma_rules_with_dns`] with the
/// loopback addresses of IPv6, `::6/128` and `::1/128`, as the golden
/// test/transparentproxy/testdata/alpine-3-default.ip6tables.golden has them.
pub fn kuma_rules6_with_dns(dns: Option<u16>) -> Vec<Vec<String>> {
    kuma_rules_with_dns(dns)
        .into_iter()
        .map(|rule| {
            rule.into_iter()
                .map(|w| {
                    w.replace("127.0.0.6/32", "::6/128")
                        .replace("127.0.0.1/32", "::1/128")
                })
                .collect()
        })
        .collect()
}

/// Consul's redirect-traffic nat rules as consul-k8s configures them (proxy uid 5995, inbound
/// 20000, outbound 15001, uid 5996 excluded, no DNS, no excluded ports), in the order of
/// hashicorp/consul sdk/iptables/iptables.go `Setup`: chains, outbound (the exclusions
/// inserted at the top of CONSUL_PROXY_OUTPUT with `-I`), inbound. `consul-connect-inject-init`
/// runs them one `iptables` call at a time (`iptablesExecutor`).
pub fn consul_rules() -> Vec<Vec<String>> {
    let uid = CONSUL_UID.to_string();
    let init_uid = CONSUL_INIT_UID.to_string();
    let mut out: Vec<Vec<String>> = [
        "CONSUL_PROXY_INBOUND",
        "CONSUL_PROXY_IN_REDIRECT",
        "CONSUL_PROXY_OUTPUT",
        "CONSUL_PROXY_REDIRECT",
        "CONSUL_DNS_REDIRECT",
    ]
    .iter()
    .map(|c| argv(&["-t", "nat", "-N", c]))
    .collect();
    out.extend([
        argv(&[
            "-t",
            "nat",
            "-A",
            "CONSUL_PROXY_REDIRECT",
            "-p",
            "tcp",
            "-j",
            "REDIRECT",
            "--to-port",
            "15001",
        ]),
        argv(&[
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-p",
            "tcp",
            "-j",
            "CONSUL_PROXY_OUTPUT",
        ]),
        argv(&[
            "-t",
            "nat",
            "-A",
            "CONSUL_PROXY_OUTPUT",
            "-m",
            "owner",
            "--uid-owner",
            &uid,
            "-j",
            "RETURN",
        ]),
        argv(&[
            "-t",
            "nat",
            "-A",
            "CONSUL_PROXY_OUTPUT",
            "-d",
            "127.0.0.1/32",
            "-j",
            "RETURN",
        ]),
        argv(&[
            "-t",
            "nat",
            "-A",
            "CONSUL_PROXY_OUTPUT",
            "-j",
            "CONSUL_PROXY_REDIRECT",
        ]),
        argv(&[
            "-t",
            "nat",
            "-I",
            "CONSUL_PROXY_OUTPUT",
            "-m",
            "owner",
            "--uid-owner",
            &init_uid,
            "-j",
            "RETURN",
        ]),
        argv(&[
            "-t",
            "nat",
            "-A",
            "CONSUL_PROXY_IN_REDIRECT",
            "-p",
            "tcp",
            "-j",
            "REDIRECT",
            "--to-port",
            "20000",
        ]),
        argv(&[
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-p",
            "tcp",
            "-j",
            "CONSUL_PROXY_INBOUND",
        ]),
        argv(&[
            "-t",
            "nat",
            "-A",
            "CONSUL_PROXY_INBOUND",
            "-p",
            "tcp",
            "-j",
            "CONSUL_PROXY_IN_REDIRECT",
        ]),
    ]);
    out
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// The init step of a Kuma or Consul pod (`sim-app mesh-init`): the mesh's nat rules in the
/// calling process's netns, one `iptables` call each, then a wait until `min_duration` has
/// passed since `started` (as [`super::istio_init::run`]).
pub fn run_init(
    mesh: Mesh,
    iptables: &str,
    dns: Option<u16>,
    ipv6: bool,
    min_duration: std::time::Duration,
    started: std::time::Instant,
) -> Result<(), super::istio_init::InitError> {
    use super::istio_init::InitError;
    let mut rules: Vec<(String, Vec<String>)> = match mesh {
        Mesh::Kuma(_) => kuma_rules_with_dns(dns),
        _ => mesh.nat_rules(),
    }
    .into_iter()
    .map(|r| (iptables.to_string(), r))
    .collect();
    if ipv6 && matches!(mesh, Mesh::Kuma(_)) {
        // ip6tables of the same backend (`iptables` → `ip6tables`, `iptables-nft` →
        // `ip6tables-nft`).
        let ip6tables = iptables.replacen("iptables", "ip6tables", 1);
        rules.extend(
            kuma_rules6_with_dns(dns)
                .into_iter()
                .map(|r| (ip6tables.clone(), r)),
        );
    }
    for (iptables, args) in rules {
        let out = std::process::Command::new(&iptables)
            .arg("-w")
            .args(&args)
            .output()
            .map_err(|source| InitError::Spawn {
                args: args.clone(),
                source,
            })?;
        if !out.status.success() {
            return Err(InitError::Failed {
                args,
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
    }
    if let Some(rest) = min_duration.checked_sub(started.elapsed()) {
        std::thread::sleep(rest);
    }
    Ok(())
}

impl std::str::FromStr for Mesh {
    type Err = String;
    /// `istio`, `kuma` (TCP admin), `kuma-uds`, `consul`.
    fn from_str(s: &str) -> Result<Mesh, String> {
        match s {
            "istio" => Ok(Mesh::Istio),
            "kuma" => Ok(Mesh::Kuma(KumaAdmin::Tcp)),
            "kuma-uds" => Ok(Mesh::Kuma(KumaAdmin::UnixSocket)),
            "consul" => Ok(Mesh::Consul),
            other => Err(format!(
                "unknown mesh {other:?} (istio, kuma, kuma-uds, consul)"
            )),
        }
    }
}

impl std::fmt::Display for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mesh::Istio => "istio",
            Mesh::Kuma(KumaAdmin::Tcp) => "kuma",
            Mesh::Kuma(KumaAdmin::UnixSocket) => "kuma-uds",
            Mesh::Consul => "consul",
        })
    }
}

/// Annotations or labels: `(key, value)` pairs.
pub type Metadata = Vec<(&'static str, String)>;

/// The pod's annotations and labels as Kuma's or Consul's injector adds them (Istio's are in
/// [`super::pod_object`]).
///
/// - Kuma (pkg/plugins/runtime/k8s/webhooks/injector/testdata/inject.01.golden.yaml, v2.14.3):
///   `kuma.io/sidecar-injected: "true"`, `kuma.io/transparent-proxying: enabled`, the ports and
///   uid, `kuma.io/envoy-admin-port` (TCP admin only); label `kuma.io/mesh: default`.
/// - Consul (control-plane/connect-inject/webhook/mesh_webhook.go, v2.0.3):
///   `consul.hashicorp.com/connect-inject-status: injected` as annotation and label,
///   `consul.hashicorp.com/transparent-proxy-status: enabled`, and the label
///   `consul.hashicorp.com/connect-inject-managed-by: consul-k8s-endpoints-controller`.
///
/// With the builtin DNS on (the default since Kuma 2.x, `builtinDNS.enabled: true`):
/// `kuma.io/builtin-dns: enabled` and `kuma.io/builtin-dns-port` (inject.23.golden.yaml).
pub fn injected_metadata(spec: &super::PodSpec) -> (Metadata, Metadata) {
    let mesh = spec.mesh;
    match mesh {
        Mesh::Istio => (Vec::new(), Vec::new()),
        Mesh::Kuma(admin) => {
            let mut a = vec![
                ("kuma.io/sidecar-injected", "true".to_string()),
                ("kuma.io/sidecar-uid", KUMA_UID.to_string()),
                ("kuma.io/transparent-proxying", "enabled".into()),
                ("kuma.io/transparent-proxying-inbound-port", "15006".into()),
                ("kuma.io/transparent-proxying-outbound-port", "15001".into()),
                // `sidecarContainer.ipFamilyMode: dualstack`, the default (kuma-cp.defaults.yaml).
                (
                    "kuma.io/transparent-proxying-ip-family-mode",
                    "dualstack".into(),
                ),
                ("kuma.io/virtual-probes", "disabled".into()),
            ];
            if admin == KumaAdmin::Tcp {
                a.push(("kuma.io/envoy-admin-port", KUMA_ADMIN_PORT.to_string()));
            }
            if spec.dns_capture.is_some() {
                a.push(("kuma.io/builtin-dns", "enabled".into()));
                a.push(("kuma.io/builtin-dns-port", KUMA_DNS_PORT.to_string()));
            }
            (a, vec![("kuma.io/mesh", "default".into())])
        }
        Mesh::Consul => (
            vec![
                (
                    "consul.hashicorp.com/connect-inject-status",
                    "injected".into(),
                ),
                (
                    "consul.hashicorp.com/transparent-proxy-status",
                    "enabled".into(),
                ),
                ("consul.hashicorp.com/connect-k8s-version", "v1.9.3".into()),
                ("consul.hashicorp.com/consul-k8s-version", "v1.9.3".into()),
            ],
            vec![
                (
                    "consul.hashicorp.com/connect-inject-status",
                    "injected".into(),
                ),
                (
                    "consul.hashicorp.com/connect-inject-managed-by",
                    "consul-k8s-endpoints-controller".into(),
                ),
            ],
        ),
    }
}

/// The injected init container of a Kuma or Consul pod, as its injector writes it (the fields
/// holdfast and the kubelet read).
pub fn init_container(spec: &super::PodSpec) -> Container {
    let mesh = spec.mesh;
    match mesh {
        Mesh::Consul => {
            // redirect_traffic.go: the iptables.Config as JSON in CONSUL_REDIRECT_TRAFFIC_CONFIG.
            let cfg = serde_json::json!({
                "ConsulDNSIP": "", "ConsulDNSPort": 0,
                "ProxyUserID": CONSUL_UID.to_string(),
                "ProxyInboundPort": 20000, "ProxyOutboundPort": 15001,
                "ExcludeInboundPorts": null, "ExcludeOutboundPorts": null,
                "ExcludeOutboundCIDRs": null, "ExcludeUIDs": [CONSUL_INIT_UID.to_string()],
                "NetNS": "",
            });
            Container {
                name: mesh.init_container().into(),
                image: Some(mesh.init_image().into()),
                command: Some(vec![
                    "/bin/sh".into(),
                    "-ec".into(),
                    "consul-k8s-control-plane connect-init -pod-name=${POD_NAME} -pod-namespace=${POD_NAMESPACE} -log-level=info -log-json=false".into(),
                ]),
                env: Some(vec![EnvVar {
                    name: "CONSUL_REDIRECT_TRAFFIC_CONFIG".into(),
                    value: Some(cfg.to_string()),
                    ..EnvVar::default()
                }]),
                security_context: Some(SecurityContext {
                    run_as_user: Some(i64::from(CONSUL_INIT_UID)),
                    run_as_group: Some(i64::from(CONSUL_INIT_UID)),
                    ..SecurityContext::default()
                }),
                ..Container::default()
            }
        }
        _ => Container {
            name: mesh.init_container().into(),
            image: Some(mesh.init_image().into()),
            command: Some(
                ["/usr/bin/kumactl", "install", "transparent-proxy"]
                    .map(String::from)
                    .to_vec(),
            ),
            // With the builtin DNS: `--redirect-all-dns-traffic --redirect-dns-port=<port>`
            // before `--verbose` (inject.23.golden.yaml).
            args: Some(if spec.dns_capture.is_some() {
                vec![
                    "--redirect-all-dns-traffic".into(),
                    format!("--redirect-dns-port={KUMA_DNS_PORT}"),
                    "--verbose".into(),
                ]
            } else {
                vec!["--verbose".into()]
            }),
            security_context: Some(SecurityContext {
                run_as_user: Some(0),
                run_as_group: Some(0),
                capabilities: Some(Capabilities {
                    add: Some(vec!["NET_ADMIN".into(), "NET_RAW".into()]),
                    drop: Some(vec!["ALL".into()]),
                }),
                ..SecurityContext::default()
            }),
            ..Container::default()
        },
    }
}

/// The proxy container of a Kuma or Consul pod, as its injector writes it.
///
/// - `kuma-sidecar` (pkg/plugins/runtime/k8s/containers/factory.go, injector.go): `run
///   --log-level=info --concurrency=2`, uid/gid 5678; liveness and readiness `GET /ready` on
///   the admin port, or on 9902 when the admin is a Unix socket; native: `restartPolicy:
///   Always`, the startup probe the same, preStop `killall -USR2 kuma-dp`.
/// - `consul-dataplane` (control-plane/connect-inject/webhook/consul_dataplane_sidecar.go):
///   the lifecycle flags (`-graceful-port=20600`, `-shutdown-drain-listeners`,
///   `-shutdown-grace-period-seconds=30`, ...), uid/gid 5995, readiness a TCP probe of 20000.
///   Native (consul-k8s 1.9.0+, `connectInject.dataplaneAsSidecarInitContainer.defaultEnabled`,
///   off by default, or the pod annotation `consul.hashicorp.com/enable-consul-dataplane-as-sidecar`;
///   hashicorp/consul-k8s d113609da, #4678): `restartPolicy: Always`, appended to the init
///   containers after `consul-connect-inject-init` (mesh_webhook.go), the startup probe an exec
///   of `/usr/local/bin/consul-dataplane -check-proxy-health` with the chart's defaults
///   (`initialProbeCheckDelaySeconds: 1`, `probeCheckPeriodSeconds: 1`,
///   `probeCheckFailureThreshold: 10`, `probeCheckTimeoutSeconds: 5`: charts/consul/values.yaml),
///   and no lifecycle hook (consul-dataplane drains at its SIGTERM).
pub fn proxy_container(spec: &super::PodSpec) -> Container {
    let mesh = spec.mesh;
    let uid = i64::from(mesh.proxy_uid());
    let security = SecurityContext {
        run_as_user: Some(uid),
        run_as_group: Some(uid),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Capabilities::default()
        }),
        ..SecurityContext::default()
    };
    match mesh {
        Mesh::Consul => {
            let secs = spec.mesh_drain.as_secs();
            Container {
                name: mesh.proxy_container().into(),
                image: Some(mesh.proxy_image().into()),
                args: Some(vec![
                    "-addresses=consul-server.consul.svc".into(),
                    format!("-envoy-admin-bind-address={}", spec.admin_addr().ip()),
                    "-grpc-port=8502".into(),
                    "-proxy-service-id-path=/consul/connect-inject/proxyid".into(),
                    "-log-level=info".into(),
                    "-log-json=false".into(),
                    "-envoy-concurrency=2".into(),
                    "-tls-disabled".into(),
                    format!("-graceful-port={CONSUL_GRACEFUL_PORT}"),
                    "-shutdown-drain-listeners".into(),
                    format!("-shutdown-grace-period-seconds={secs}"),
                    "-graceful-shutdown-path=/graceful_shutdown".into(),
                    "-startup-grace-period-seconds=0".into(),
                    "-graceful-startup-path=/graceful_startup".into(),
                    "-telemetry-prom-scrape-path=/metrics".into(),
                ]),
                readiness_probe: Some(Probe {
                    tcp_socket: Some(TCPSocketAction {
                        port: IntOrString::Int(20000),
                        ..TCPSocketAction::default()
                    }),
                    initial_delay_seconds: Some(1),
                    ..Probe::default()
                }),
                restart_policy: spec.is_native().then(|| "Always".to_string()),
                startup_probe: spec.is_native().then(|| Probe {
                    exec: Some(ExecAction {
                        command: Some(CONSUL_NATIVE_STARTUP_PROBE.map(String::from).to_vec()),
                    }),
                    initial_delay_seconds: Some(1),
                    period_seconds: Some(1),
                    failure_threshold: Some(10),
                    timeout_seconds: Some(5),
                    ..Probe::default()
                }),
                security_context: Some(security),
                ..Container::default()
            }
        }
        _ => {
            let probe_port = match mesh.admin_tcp() {
                Some(a) => a.port(),
                None => KUMA_READINESS_PORT,
            };
            let probe = |period: i32| Probe {
                http_get: Some(HTTPGetAction {
                    path: Some("/ready".into()),
                    port: IntOrString::Int(i32::from(probe_port)),
                    ..HTTPGetAction::default()
                }),
                period_seconds: Some(period),
                timeout_seconds: Some(3),
                failure_threshold: Some(12),
                ..Probe::default()
            };
            let native = spec.is_native();
            Container {
                name: mesh.proxy_container().into(),
                image: Some(mesh.proxy_image().into()),
                args: Some(
                    ["run", "--log-level=info", "--concurrency=2"]
                        .map(String::from)
                        .to_vec(),
                ),
                // containers/factory.go: `KUMA_DNS_ENABLED` "true" with the proxy port when the
                // builtin DNS is on, else "false".
                env: Some(match spec.dns_capture {
                    Some(_) => vec![
                        env("KUMA_DNS_ENABLED", "true"),
                        env("KUMA_DNS_PROXY_PORT", &KUMA_DNS_PORT.to_string()),
                    ],
                    None => vec![env("KUMA_DNS_ENABLED", "false")],
                }),
                restart_policy: native.then(|| "Always".to_string()),
                lifecycle: native.then(|| Lifecycle {
                    pre_stop: Some(LifecycleHandler {
                        exec: Some(ExecAction {
                            command: spec.pre_stop_command(),
                        }),
                        ..LifecycleHandler::default()
                    }),
                    ..Lifecycle::default()
                }),
                liveness_probe: Some(probe(5)),
                readiness_probe: Some(probe(5)),
                startup_probe: native.then(|| probe(1)),
                security_context: Some(security),
                ..Container::default()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Renders `iptables -t nat` argument vectors as `iptables-save` lines (`-A`/`-I` only).
    fn save_lines(rules: &[Vec<String>]) -> Vec<String> {
        rules
            .iter()
            .filter(|r| r[2] == "-A")
            .map(|r| {
                r[2..]
                    .iter()
                    .map(|w| {
                        if w.contains(' ') {
                            format!("\"{w}\"")
                        } else {
                            w.clone()
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }

    #[test]
    fn kuma_rules_are_the_golden_of_kuma_2_14() {
        // test/transparentproxy/testdata/alpine-3-default.iptables.golden (kumahq/kuma
        // v2.14.3), with ifPlaceholder = lo: the rules in order.
        let golden = r#"-A PREROUTING -p tcp -m comment --comment "kuma/mesh/transparent/proxy/redirect inbound TCP traffic to our custom chain for processing" -j KUMA_MESH_INBOUND
-A OUTPUT -p tcp -m comment --comment "kuma/mesh/transparent/proxy/redirect outbound TCP traffic to our custom chain for processing" -j KUMA_MESH_OUTBOUND
-A KUMA_MESH_INBOUND -p tcp -m comment --comment "kuma/mesh/transparent/proxy/redirect all inbound traffic to the custom chain for processing" -j KUMA_MESH_INBOUND_REDIRECT
-A KUMA_MESH_INBOUND_REDIRECT -p tcp -m comment --comment "kuma/mesh/transparent/proxy/redirect TCP traffic to envoy (port 15006)" -j REDIRECT --to-ports 15006
-A KUMA_MESH_OUTBOUND -s 127.0.0.6/32 -o lo -m comment --comment "kuma/mesh/transparent/proxy/prevent traffic loops by ensuring traffic from the sidecar proxy (using 127.0.0.6/32) to loopback interface is not redirected again" -j RETURN
-A KUMA_MESH_OUTBOUND ! -d 127.0.0.1/32 -o lo -p tcp -m comment --comment "kuma/mesh/transparent/proxy/redirect outbound TCP traffic destined for loopback interface, but not targeting address 127.0.0.1/32, and owned by UID 5678 (kuma-dp user) to KUMA_MESH_INBOUND_REDIRECT chain for proper handling" -m owner --uid-owner 5678 -j KUMA_MESH_INBOUND_REDIRECT
-A KUMA_MESH_OUTBOUND -o lo -p tcp -m comment --comment "kuma/mesh/transparent/proxy/return outbound TCP traffic destined for loopback interface, owned by any UID other than 5678 (kuma-dp user)" -m owner ! --uid-owner 5678 -j RETURN
-A KUMA_MESH_OUTBOUND -m comment --comment "kuma/mesh/transparent/proxy/return outbound traffic owned by UID 5678 (kuma-dp user)" -m owner --uid-owner 5678 -j RETURN
-A KUMA_MESH_OUTBOUND -d 127.0.0.1/32 -m comment --comment "kuma/mesh/transparent/proxy/return traffic destined for localhost (127.0.0.1/32) to avoid redirection" -j RETURN
-A KUMA_MESH_OUTBOUND -m comment --comment "kuma/mesh/transparent/proxy/redirect all other outbound traffic to our custom chain for further processing" -j KUMA_MESH_OUTBOUND_REDIRECT
-A KUMA_MESH_OUTBOUND_REDIRECT -p tcp -m comment --comment "kuma/mesh/transparent/proxy/redirect TCP traffic to envoy (port 15001)" -j REDIRECT --to-ports 15001"#;
        assert_eq!(
            save_lines(&kuma_rules()),
            golden.lines().collect::<Vec<_>>()
        );
    }

    #[test]
    fn kuma_dns_rules_are_the_golden_of_kuma_2_14() {
        // test/transparentproxy/testdata/alpine-3-with-multiple-flags.iptables.golden (kumahq/kuma
        // v2.14.3): the builtin DNS's nat OUTPUT rules, in order, before the jump to
        // KUMA_MESH_OUTBOUND (that golden's exclusions left out).
        let golden = r#"-A OUTPUT -p udp -m comment --comment "kuma/mesh/transparent/proxy/return early for DNS traffic from kuma-dp" -m udp --dport 53 -m owner --uid-owner 5678 -j RETURN
-A OUTPUT -p udp -m comment --comment "kuma/mesh/transparent/proxy/redirect all DNS requests to the kuma-dp DNS proxy (listening on port 15053)" -m udp --dport 53 -j REDIRECT --to-ports 15053
-A OUTPUT -p tcp -m comment --comment "kuma/mesh/transparent/proxy/allow applications to perform DNS queries over TCP to port 53 without mesh redirection (only traffic not owned by UID 5678 (kuma-dp user))" -m tcp --dport 53 -m owner ! --uid-owner 5678 -j RETURN
-A OUTPUT -p tcp -m comment --comment "kuma/mesh/transparent/proxy/redirect outbound TCP traffic to our custom chain for processing" -j KUMA_MESH_OUTBOUND"#;
        let lines = save_lines(&kuma_rules_with_dns(Some(15053)));
        let output: Vec<&str> = lines
            .iter()
            .filter(|l| l.starts_with("-A OUTPUT"))
            .map(String::as_str)
            .collect();
        assert_eq!(output, golden.lines().collect::<Vec<_>>());
        // The IPv6 rules: the loopbacks of IPv6 (alpine-3-default.ip6tables.golden).
        let v6 = save_lines(&kuma_rules6_with_dns(None)).join("\n");
        assert!(
            v6.contains("-A KUMA_MESH_OUTBOUND -s ::6/128 -o lo"),
            "{v6}"
        );
        assert!(v6.contains("-A KUMA_MESH_OUTBOUND -d ::1/128 -m comment --comment \"kuma/mesh/transparent/proxy/return traffic destined for localhost (::1/128) to avoid redirection\""), "{v6}");
        assert!(!v6.contains("127.0.0."), "{v6}");
    }

    #[test]
    fn consul_rules_redirect_to_its_ports_and_exclude_its_uids() {
        let rules = consul_rules();
        let lines = save_lines(&rules);
        assert!(lines
            .contains(&"-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5995 -j RETURN".to_string()));
        assert!(lines
            .contains(&"-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-port 20000".into()));
        assert!(
            lines.contains(&"-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-port 15001".into())
        );
        // The init uid's exclusion is inserted at the top of the output chain.
        assert!(rules
            .iter()
            .any(|r| r.join(" ")
                == "-t nat -I CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN"));
        // Chains before the rules that use them.
        let first_rule = rules.iter().position(|r| r[2] != "-N").expect("rules");
        assert!(rules[..first_rule].len() == 5);
    }

    #[test]
    fn mesh_facts() {
        let kuma = Mesh::Kuma(KumaAdmin::UnixSocket);
        assert_eq!(kuma.proxy_container(), "kuma-sidecar");
        assert_eq!(kuma.proxy_uid(), 5678);
        assert_eq!(kuma.admin_tcp(), None);
        assert_eq!(
            Mesh::Kuma(KumaAdmin::Tcp).admin_tcp(),
            Some("127.0.0.1:9901".parse().expect("addr"))
        );
        assert_eq!(Mesh::Consul.inbound_port(), 20000);
        assert_eq!(Mesh::Consul.proxy_uid(), 5995);
        for m in ["istio", "kuma", "kuma-uds", "consul"] {
            assert_eq!(m.parse::<Mesh>().expect("mesh").to_string(), m);
        }
        assert!("linkerd".parse::<Mesh>().is_err());
    }
}
