//! Consul's sidecar, as consul-k8s's connect-inject webhook writes it (hashicorp/consul-k8s
//! control-plane/connect-inject/webhook/mesh_webhook.go, consul_dataplane_sidecar.go,
//! container_init.go; control-plane/connect-inject/constants/) and as consul-dataplane runs it
//! (hashicorp/consul-dataplane pkg/consuldp/consul_dataplane.go, lifecycle.go, pkg/envoy/proxy.go).
//!
//! - marker: the annotation **and** the label `consul.hashicorp.com/connect-inject-status:
//!   injected` (mesh_webhook.go sets both; `KeyInjectStatus`), with
//!   `consul.hashicorp.com/transparent-proxy-status: enabled` when the redirect rules are there;
//! - proxy `consul-dataplane` (`consul-dataplane-<service>` on multi-port pods, one proxy per
//!   service, admin 19000 + index), init `consul-connect-inject-init`;
//! - uid 5995 (the init container runs as 5996, excluded from redirection too)
//!   (container_init.go `sidecarUserAndGroupID`, `initContainersUserAndGroupID`);
//! - capture: outbound 15001, inbound 20000 (`ProxyDefaultInboundPort`);
//! - admin: the container's `-envoy-admin-bind-address=` (`127.0.0.1`, or `::1` when the
//!   injector runs with `CONSUL_DUAL_STACK`, Helm's `global.dualStack.enabled`: `Getv4orv6Str`,
//!   control-plane/connect-inject/constants/constants.go) and `-envoy-admin-bind-port=`
//!   (19000 + the service's index on multi-port pods; absent: consul-dataplane's default 19000)
//!   (webhook/consul_dataplane_sidecar.go `getContainerSidecarArgs`, v1.9.0 and v2.0.3): read
//!   from the args, not guessed from the pod's IPs ([`admin_for`]);
//! - readiness: a TCP probe on 20000, or `/ready` on 21000 with `use-proxy-health-check`;
//! - drain: on SIGTERM consul-dataplane (lifecycle on by default) sends
//!   `drain_listeners?inboundonly&graceful&skip_exit`, waits a **fixed**
//!   `shutdownGracePeriodSeconds` (30 s) and then `/quitquitquit` (lifecycle.go
//!   `gracefulShutdown`); its own `/graceful_shutdown` on 127.0.0.1:20600 does the same wait;
//! - end: `POST /quitquitquit` to Envoy: consul-dataplane's run loop returns when Envoy exits
//!   (`proxy.Exited()` → `doneCh <- err`, nil for exit code 0, consul_dataplane.go `Run`), and
//!   its `main` exits 0 with a nil error, so the container ends 0 and a `Never`/`OnFailure` Job
//!   pod does not run it again (hashicorp/consul-k8s#1791: the Job completes once the proxy
//!   container has ended; never `/graceful_shutdown`, which waits the fixed 30 s first).

use std::net::SocketAddr;

use super::pod_reads::{PodReads, PodSwitches};
use super::{AdminAt, Markers, Mesh, MeshProfile, MeshTexts, ProxyName};

/// The inject status key: an annotation and a label, both `injected`.
pub const KEY_INJECT_STATUS: &str = "consul.hashicorp.com/connect-inject-status";
/// The transparent proxy key: annotation `enabled` when the redirect rules were written.
pub const KEY_TRANSPARENT_PROXY_STATUS: &str = "consul.hashicorp.com/transparent-proxy-status";
/// The native sidecar annotation (`AnnotationEnableConsulDataplaneAsSidecar`).
pub const ANNOTATION_DATAPLANE_AS_SIDECAR: &str =
    "consul.hashicorp.com/enable-consul-dataplane-as-sidecar";
/// The per-pod shutdown grace period (`AnnotationSidecarProxyLifecycleShutdownGracePeriodSeconds`).
pub const ANNOTATION_SHUTDOWN_GRACE_PERIOD: &str =
    "consul.hashicorp.com/sidecar-proxy-lifecycle-shutdown-grace-period-seconds";
/// The proxy container, and its multi-port form's prefix.
pub const PROXY_CONTAINER: &str = "consul-dataplane";
pub const PROXY_CONTAINER_PREFIX: &str = "consul-dataplane-";
/// The init step (it writes the redirect rules with `consul connect redirect-traffic`).
pub const INIT_STEPS: [&str; 1] = ["consul-connect-inject-init"];
/// consul-dataplane's uid.
pub const PROXY_UID: u32 = 5995;
/// Envoy's admin port.
pub const ADMIN_PORT: u16 = 19000;
/// Envoy's inbound capture port (the public listener).
pub const INBOUND_PORT: u16 = 20000;
/// consul-dataplane's lifecycle (graceful) port (`DefaultGracefulPort`); served by
/// consul-dataplane, not Envoy.
pub const GRACEFUL_PORT: u16 = 20600;

/// `http.<stat_prefix>` scopes of Consul's own listeners: Envoy's admin API (`admin`), and the
/// bootstrap's static listeners that route to it: `envoy_ready` (the `/ready` listener on
/// 21000 with `use-proxy-health-check`) and `envoy_prometheus_metrics` (the metrics scrape
/// listener) (hashicorp/consul-dataplane pkg/consuldp/testdata/TestBootstrapConfig/
/// ready-listener.golden and custom-prometheus-scrape-path.golden, v2.0.1: consul-dataplane's
/// bootstrap from hashicorp/consul's command/connect/envoy/bootstrap_config.go).
/// consul-dataplane's own servers (20600 graceful, its merged metrics) are not Envoy listeners.
pub const OWN_HTTP_PREFIXES: [&str; 3] = ["admin", "envoy_ready", "envoy_prometheus_metrics"];

/// consul-dataplane's admin bind flags as the injector writes them (`-flag=value`; Go's flag
/// package also takes `-flag value` and `--flag`).
pub const FLAG_ADMIN_BIND_ADDRESS: &str = "envoy-admin-bind-address";
pub const FLAG_ADMIN_BIND_PORT: &str = "envoy-admin-bind-port";

/// Envoy's admin address for a `consul-dataplane` container with `args`: its
/// `-envoy-admin-bind-address` (default `127.0.0.1`) and `-envoy-admin-bind-port` (default
/// 19000), consul-dataplane's defaults (cmd/consul-dataplane/config.go) when absent. A value
/// that is not an IP or a port keeps the default and is said in `problems`.
pub fn admin_for(args: &[String], problems: &mut Vec<String>) -> AdminAt {
    let mut ip = std::net::IpAddr::from([127, 0, 0, 1]);
    let mut port = ADMIN_PORT;
    let mut words = args.iter().map(String::as_str);
    while let Some(word) = words.next() {
        let Some(flag) = word.strip_prefix("--").or_else(|| word.strip_prefix('-')) else {
            continue;
        };
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (flag, None),
        };
        if name != FLAG_ADMIN_BIND_ADDRESS && name != FLAG_ADMIN_BIND_PORT {
            continue;
        }
        let Some(value) = value.or_else(|| words.next()) else {
            continue;
        };
        let value = value.trim();
        if name == FLAG_ADMIN_BIND_ADDRESS {
            match value.trim_start_matches('[').trim_end_matches(']').parse() {
                Ok(v) => ip = v,
                Err(_) => problems.push(format!(
                    "{PROXY_CONTAINER}'s -{name} is {:?}, not an IP; 127.0.0.1 assumed",
                    crate::api::text::cut(value, 40)
                )),
            }
        } else {
            match value.parse::<u16>() {
                Ok(p @ 1..) => port = p,
                _ => problems.push(format!(
                    "{PROXY_CONTAINER}'s -{name} is {:?}, not a port; {ADMIN_PORT} assumed",
                    crate::api::text::cut(value, 40)
                )),
            }
        }
    }
    // A wildcard bind is reached on the loopback of its family.
    if ip.is_unspecified() {
        ip = match ip {
            std::net::IpAddr::V4(_) => std::net::IpAddr::from([127, 0, 0, 1]),
            std::net::IpAddr::V6(_) => std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        };
    }
    AdminAt::Tcp(SocketAddr::new(ip, port))
}

/// Consul's profile.
pub fn profile() -> MeshProfile {
    MeshProfile {
        mesh: Mesh::Consul,
        proxy: ProxyName {
            exact: PROXY_CONTAINER.to_string(),
            prefix: Some(PROXY_CONTAINER_PREFIX),
        },
        init_steps: &INIT_STEPS,
        proxy_uid: PROXY_UID,
        outbound_port: 15001,
        inbound_port: INBOUND_PORT,
        // consul-dataplane's DNS proxy (8600) is redirected only with `dns.enableRedirection`;
        // not held by the agent.
        dns_port: None,
        dns_tcp: false,
        admin: AdminAt::Tcp(SocketAddr::from(([127, 0, 0, 1], ADMIN_PORT))),
        admin_follows_pod_ips: false,
        own_http_prefixes: &OWN_HTTP_PREFIXES,
        listener_counts: true,
        sigterm_after_quit: false,
        fails_health_check_on_sigterm: false,
        readiness: "a TCP probe on 20000 (or /ready on 21000)",
    }
}

/// consul-k8s injected the pod, with transparent proxy (the redirect rules the hold works with):
/// the inject status `injected` as annotation or label (the webhook writes both; the agent's
/// pod source may have dropped one), and `transparent-proxy-status: enabled`.
pub(super) fn injected(markers: &Markers<'_>) -> Result<(), String> {
    let status =
        (markers.annotation)(KEY_INJECT_STATUS).or_else(|| (markers.label)(KEY_INJECT_STATUS));
    match status {
        Some("injected") => {}
        Some(v) => {
            return Err(format!(
                "{KEY_INJECT_STATUS} is {:?}, not \"injected\"",
                crate::api::text::cut(v, 40)
            ))
        }
        None => return Err(format!("no {KEY_INJECT_STATUS} annotation or label")),
    }
    match (markers.annotation)(KEY_TRANSPARENT_PROXY_STATUS) {
        Some("enabled") => Ok(()),
        _ => Err(format!(
            "{KEY_TRANSPARENT_PROXY_STATUS} is not \"enabled\": no redirect rules, nothing to hold"
        )),
    }
}

/// Consul's operator texts. Consul cannot load the filter (docs/install.md "Consul: why there is
/// no filter"); its capture listeners' own counts stand in ([`MeshProfile::listener_counts`]).
pub static TEXTS: MeshTexts = MeshTexts {
    injector: "consul-k8s's connect injector",
    agent: "consul-dataplane",
    prestop_drain: "consul-dataplane's drain",
    own_end: "consul-dataplane's own shutdown grace period \
              (consul.hashicorp.com/sidecar-proxy-lifecycle-shutdown-grace-period-seconds)",
    keep_byte_counters: None,
    install_filter: None,
    envoy_1_34: "a consul-dataplane release whose Envoy is 1.34 or later",
};

/// The advice when Envoy exited before the app was done: consul-dataplane quits Envoy its
/// shutdown grace period after SIGTERM (pkg/consuldp/lifecycle.go).
pub fn proxy_gone_early_advice() -> String {
    format!(
        "Envoy exited while the app still ran: consul-dataplane quits Envoy its shutdown grace \
         period (30 s by default) after SIGTERM. Set the {ANNOTATION_SHUTDOWN_GRACE_PERIOD} \
         annotation (or the Helm value \
         connectInject.sidecarProxy.lifecycle.defaultShutdownGracePeriodSeconds) to the pod's \
         grace period, so Envoy outlives the app and holdfast ends it when the app is done"
    )
}

/// Consul's per-pod reads: the admin address from consul-dataplane's flags ([`admin_for`]).
/// Consul has no per-pod switch holdfast reads: its DNS redirect (`dns.enableRedirection`) goes
/// to the consul-dns Service outside the pod (consul-k8s control-plane/connect-inject/webhook/
/// redirect_traffic.go: `ConsulDNSIP` is `<fullname>_DNS_SERVICE_HOST`), not to a proxy whose
/// start could be awaited; consul-dataplane's own DNS proxy (`dns.proxy.enabled`, off by
/// default) is not held; and consul-dataplane has no zero-connections exit.
pub(super) fn read_pod(
    profile: &mut MeshProfile,
    reads: &PodReads<'_>,
    problems: &mut Vec<String>,
) -> PodSwitches {
    profile.admin = admin_for(reads.proxy.args.as_deref().unwrap_or(&[]), problems);
    PodSwitches::default()
}
