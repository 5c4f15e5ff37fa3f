//! Kuma's (and Kong Mesh's) sidecar, as its injector writes it (kumahq/kuma
//! pkg/plugins/runtime/k8s/webhooks/injector/injector.go, pkg/plugins/runtime/k8s/containers/
//! factory.go; golden files pkg/plugins/runtime/k8s/webhooks/injector/testdata/inject.*.golden.yaml,
//! master 2026-08 at 348b6528) and as kuma-dp runs it (app/kuma-dp/cmd/run.go).
//!
//! - marker: the annotation `kuma.io/sidecar-injected: "true"`
//!   (pkg/plugins/runtime/k8s/metadata/annotations.go `KumaSidecarInjectedAnnotation`), with the
//!   label `kuma.io/mesh`;
//! - proxy `kuma-sidecar`, init `kuma-init` (`kuma-validation` with Kuma's CNI)
//!   (pkg/plugins/runtime/k8s/util/names.go);
//! - uid 5678, capture 15001/15006, DNS 15053 (pkg/config/app/kuma-cp/kuma-cp.defaults.yaml
//!   `sidecarContainer.uid`, `redirectPortOutbound`, `redirectPortInbound`, `builtinDNS.port`),
//!   per pod as the injector wrote them into the annotations `kuma.io/sidecar-uid`,
//!   `kuma.io/transparent-proxying-outbound-port` and `-inbound-port` (injector.go, v2.13.10
//!   and v2.14.3; kuma-init reads them back): [`pod_settings`];
//! - DNS: the builtin DNS is on by default (kuma-cp.defaults.yaml `builtinDNS.enabled: true`,
//!   v2.13.10 and v2.14.3), kuma-dp's DNS proxy serves **UDP only**
//!   (app/kuma-dp/pkg/dataplane/dnsproxy/component.go `dns.Server{..., Net: "udp"}`, v2.14.3)
//!   and kuma-init RETURNs the app's TCP/53 ("allow applications to perform DNS queries over TCP
//!   ... without mesh redirection", pkg/transparentproxy/iptables/builder/builder_table_nat.go):
//!   readiness wants the UDP socket only (`MeshProfile::dns_tcp` false);
//! - admin: TCP 127.0.0.1:9901 whatever the pod's IPs (`bootstrapServer.params.adminAddress:
//!   127.0.0.1`, copied into every bootstrap by pkg/xds/bootstrap/generator.go; kuma-dp itself
//!   calls `http://127.0.0.1:%d`, app/kuma-dp/pkg/dataplane/envoy/envoy.go, v2.13.10 and
//!   v2.14.3), the port `bootstrapServer.params.adminPort` or per pod the annotation
//!   `kuma.io/envoy-admin-port`), or — the default since 2.14 (`envoyAdminUnixSocket: true`,
//!   pkg/config/xds/bootstrap/config.go) — a Unix socket `<workdir>/kuma-envoy-admin.sock`
//!   (pkg/core/xds/sockets.go `AdminSocketName`), the workdir made by `os.MkdirTemp("",
//!   "kuma-dp-")` under the sidecar's `$TMPDIR` (`/tmp`, an emptyDir) with mode 0711
//!   (app/kuma-dp/cmd/run.go). With the socket the injector points the probes at kuma-dp's
//!   readiness port 9902 instead of the admin port (containers/factory.go: "When admin UDS is
//!   enabled ... Use the dedicated readiness port for probes"): that is how a pod tells which
//!   ([`admin_for`]);
//! - drain: on SIGTERM kuma-dp sends `/healthcheck/fail` and waits `drainTime` (30 s) before
//!   stopping Envoy; a native sidecar's preStop `killall -USR2 kuma-dp` sends
//!   `drain_listeners?inboundonly&graceful&skip_exit` and kuma-dp then exits at once on SIGTERM
//!   (run.go, app/kuma-dp/pkg/dataplane/envoy/envoy.go `DrainForever`);
//! - end: `POST /quitquitquit`: when Envoy exits 0, kuma-dp's Envoy component returns nil and its
//!   `OnFinish` cancels every component (run.go), so kuma-dp exits 0 and its container stays
//!   ended in a Job (the control plane does the same for classic Jobs: `PodStatusReconciler`).
//!   But once kuma-dp got its SIGTERM (a deletion) its wait selects only on `drainTime` and a
//!   second signal, not on the components: it outlives Envoy until then. So a deletion's drain
//!   follows the quit with a SIGTERM to kuma-dp (`sigterm_after_quit`), on which it exits 0.

use k8s_openapi::api::core::v1::Container;

use super::pod_reads::{env_value, readiness_probe_port, EnvValue, PodReads, PodSwitches};
use super::{AdminAt, Markers, Mesh, MeshProfile, MeshTexts, ProxyName};
use crate::config::parse_go_bool;
use std::net::SocketAddr;

/// The injector's marker annotation.
pub const ANNOTATION_SIDECAR_INJECTED: &str = "kuma.io/sidecar-injected";
/// The per-pod admin port annotation (`KumaEnvoyAdminPort`).
pub const ANNOTATION_ENVOY_ADMIN_PORT: &str = "kuma.io/envoy-admin-port";
/// The per-pod drain time annotation (`KumaSidecarDrainTime`).
pub const ANNOTATION_DRAIN_TIME: &str = "kuma.io/sidecar-drain-time";
/// The label naming the pod's mesh.
pub const LABEL_MESH: &str = "kuma.io/mesh";
/// The proxy container.
pub const PROXY_CONTAINER: &str = "kuma-sidecar";
/// Kuma's init steps: the iptables writer, and its CNI's check.
pub const INIT_STEPS: [&str; 2] = ["kuma-init", "kuma-validation"];
/// kuma-dp's uid.
pub const PROXY_UID: u32 = 5678;
/// Envoy's admin port (TCP admin).
pub const ADMIN_PORT: u16 = 9901;
/// kuma-dp's readiness port (`bootstrapServer.params.readinessPort`).
pub const READINESS_PORT: u16 = 9902;
/// kuma-dp's DNS proxy port (`builtinDNS.port`).
pub const DNS_PORT: u16 = 15053;
/// The sidecar's builtin-DNS switch and port, as the injector writes them
/// (containers/factory.go: `KUMA_DNS_ENABLED` `"true"` with `KUMA_DNS_PROXY_PORT`, else
/// `"false"`); kuma-init then redirects the pod's DNS to that port.
pub const ENV_DNS_ENABLED: &str = "KUMA_DNS_ENABLED";
pub const ENV_DNS_PROXY_PORT: &str = "KUMA_DNS_PROXY_PORT";
/// The admin socket's work directory parent, prefix and name.
pub const SOCKET_PARENT: &str = "/tmp";
pub const SOCKET_DIR_PREFIX: &str = "kuma-dp-";
pub const SOCKET_NAME: &str = "kuma-envoy-admin.sock";

/// `http.<stat_prefix>` scopes of Kuma's own listeners: Envoy's admin API (`admin`); the
/// listener Kuma puts on the admin port to serve `/ready` (and, with TLS, the admin) to the
/// kubelet and kuma-dp, `kuma_envoy_admin` by default (pkg/xds/generator/admin_proxy_generator.go
/// `envoy_names.GetAdminListenerName()`, `Join("kuma", "envoy", "admin")` in
/// pkg/xds/envoy/names/resource_names.go, sanitised to the HCM's stat prefix by
/// `StaticEndpoints`), `system_envoy_admin` with unified resource naming (off by default:
/// kuma-cp.defaults.yaml `unifiedResourceNamingEnabled: false`); and the Prometheus listener
/// `kuma_metrics_prometheus` (pkg/xds/generator/prometheus_endpoint_generator.go
/// `GetPrometheusListenerName`), all at v2.14.3. kuma-dp's readiness server on 9902 is
/// kuma-dp's, not Envoy's, so it moves no Envoy counter.
pub const OWN_HTTP_PREFIXES: [&str; 4] = [
    "admin",
    "kuma_envoy_admin",
    "kuma_metrics_prometheus",
    "system_envoy_admin",
];

/// The per-pod proxy uid the injector writes (`KumaSidecarUID`).
pub const ANNOTATION_SIDECAR_UID: &str = "kuma.io/sidecar-uid";
/// The per-pod outbound capture port (`KumaTransparentProxyingOutboundPortAnnotation`).
pub const ANNOTATION_OUTBOUND_PORT: &str = "kuma.io/transparent-proxying-outbound-port";
/// The per-pod inbound capture port (`KumaTransparentProxyingInboundPortAnnotation`).
pub const ANNOTATION_INBOUND_PORT: &str = "kuma.io/transparent-proxying-inbound-port";

/// Kuma's profile with the TCP admin (2.13, or `envoyAdminUnixSocket: false`).
pub fn profile() -> MeshProfile {
    MeshProfile {
        mesh: Mesh::Kuma,
        proxy: ProxyName {
            exact: PROXY_CONTAINER.to_string(),
            prefix: None,
        },
        init_steps: &INIT_STEPS,
        proxy_uid: PROXY_UID,
        outbound_port: 15001,
        inbound_port: 15006,
        dns_port: Some(DNS_PORT),
        dns_tcp: false,
        admin: AdminAt::Tcp(SocketAddr::from(([127, 0, 0, 1], ADMIN_PORT))),
        admin_follows_pod_ips: false,
        own_http_prefixes: &OWN_HTTP_PREFIXES,
        listener_counts: false,
        sigterm_after_quit: true,
        fails_health_check_on_sigterm: true,
        readiness:
            "kuma-dp's /ready on 9902 (Unix-socket admin) or Envoy's /ready on the admin port",
    }
}

/// The admin of one Kuma pod: the Unix socket when the proxy's readiness probe is not on the
/// admin port (the injector moves it to kuma-dp's readiness port then), TCP on the admin port
/// (the annotation's, else 9901) otherwise.
pub fn admin_for(
    admin_port_annotation: Option<&str>,
    readiness_probe_port: Option<u16>,
) -> AdminAt {
    let admin_port = admin_port_annotation
        .and_then(|p| p.trim().parse::<u16>().ok())
        .filter(|p| *p != 0)
        .unwrap_or(ADMIN_PORT);
    match readiness_probe_port {
        Some(p) if p != admin_port => AdminAt::UnixSocket {
            parent: SOCKET_PARENT,
            dir_prefix: SOCKET_DIR_PREFIX,
            name: SOCKET_NAME,
        },
        _ => AdminAt::Tcp(SocketAddr::from(([127, 0, 0, 1], admin_port))),
    }
}

/// Reads the pod's own uid and capture ports from the annotations Kuma's injector wrote
/// (injector.go `NewAnnotations`: `kuma.io/sidecar-uid`, `kuma.io/transparent-proxying-
/// outbound-port`, `-inbound-port`, from the control plane's settings or the pod's own
/// overrides; kuma-init reads the same annotations back to write its rules). A value that is
/// not a number (or is 0) keeps the default and is said in `problems`.
pub fn pod_settings<'a>(
    profile: &mut MeshProfile,
    annotation: &dyn Fn(&str) -> Option<&'a str>,
    problems: &mut Vec<String>,
) {
    let read = |key: &str, max: u32, problems: &mut Vec<String>| -> Option<u32> {
        let v = annotation(key)?;
        match v.trim().parse::<u32>() {
            Ok(n) if n != 0 && n <= max => Some(n),
            _ => {
                problems.push(format!(
                    "{key} is {:?}, not a number Kuma takes there; Kuma's default kept",
                    crate::api::text::cut(v, 40)
                ));
                None
            }
        }
    };
    if let Some(uid) = read(ANNOTATION_SIDECAR_UID, u32::MAX, problems) {
        profile.proxy_uid = uid;
    }
    let port_max = u32::from(u16::MAX);
    if let Some(p) = read(ANNOTATION_OUTBOUND_PORT, port_max, problems) {
        profile.outbound_port = p as u16;
    }
    if let Some(p) = read(ANNOTATION_INBOUND_PORT, port_max, problems) {
        profile.inbound_port = p as u16;
    }
}

/// Kuma injected the pod: `kuma.io/sidecar-injected: "true"`.
pub(super) fn injected(markers: &Markers<'_>) -> Result<(), String> {
    match (markers.annotation)(ANNOTATION_SIDECAR_INJECTED) {
        Some(v) if v.trim().eq_ignore_ascii_case("true") => Ok(()),
        Some(v) => Err(format!(
            "{ANNOTATION_SIDECAR_INJECTED} is {:?}, not \"true\"",
            crate::api::text::cut(v, 40)
        )),
        None => Err(format!("no {ANNOTATION_SIDECAR_INJECTED} annotation")),
    }
}

/// Whether a native proxy's preStop is Kuma's drain: `killall -USR2 kuma-dp`
/// (containers/factory.go; inject.01.golden.yaml).
pub fn prestop_drain(proxy: &Container) -> bool {
    super::istio::prestop_command(proxy).is_some_and(|words| {
        matches!(words.first(), Some(w) if w.ends_with("killall"))
            && words.contains(&"-USR2")
            && words.last() == Some(&"kuma-dp")
    })
}

/// Kuma's operator texts. Kuma's bootstrap keeps every stat (kumahq/kuma
/// pkg/xds/bootstrap/template_v3.go: stats tags, no `stats_matcher`).
pub static TEXTS: MeshTexts = MeshTexts {
    injector: "Kuma's injector",
    agent: "kuma-dp",
    prestop_drain: "Kuma's preStop (`killall -USR2 kuma-dp`) drained inbound",
    own_end: "kuma-dp's own drainTime (kuma.io/sidecar-drain-time)",
    keep_byte_counters: None,
    install_filter: Some(
        "Install the filter (manifests/kuma/, its MeshProxyPatch: docs/install.md \"Kuma\")",
    ),
    envoy_1_34: "a Kuma release whose Envoy is 1.34 or later",
};

/// The advice when Envoy exited before the app was done: kuma-dp stops Envoy `drainTime` after
/// its SIGTERM (app/kuma-dp/cmd/run.go; per pod the annotation,
/// pkg/plugins/runtime/k8s/metadata/annotations.go).
pub fn proxy_gone_early_advice() -> String {
    format!(
        "Envoy exited while the app still ran: kuma-dp stops Envoy its drainTime (30 s by \
         default) after SIGTERM. Set the {ANNOTATION_DRAIN_TIME} annotation (or the control \
         plane's sidecarContainer.drainTime) to the pod's grace period, so Envoy outlives the app \
         and holdfast ends it when the app is done"
    )
}

/// Kuma's per-pod reads: the admin ([`admin_for`]: the annotation's port, the Unix socket when
/// the proxy's readiness probe is elsewhere), the uid and capture ports ([`pod_settings`]), and
/// kuma-dp's DNS proxy, where kuma-init redirects DNS when the injector turned the builtin DNS
/// on (containers/factory.go writes both variables then).
pub(super) fn read_pod(
    profile: &mut MeshProfile,
    reads: &PodReads<'_>,
    problems: &mut Vec<String>,
) -> PodSwitches {
    profile.admin = admin_for(
        (reads.annotation)(ANNOTATION_ENVOY_ADMIN_PORT),
        readiness_probe_port(reads.proxy),
    );
    pod_settings(profile, reads.annotation, problems);
    let dns_capture = matches!(
        env_value(reads.proxy, ENV_DNS_ENABLED),
        EnvValue::Literal(v) if parse_go_bool(v) == Some(true)
    );
    if let EnvValue::Literal(port) = env_value(reads.proxy, ENV_DNS_PROXY_PORT) {
        // A value that is no port: the default (15053) stays.
        if let Ok(p @ 1..) = port.trim().parse::<u16>() {
            profile.dns_port = Some(p);
        }
    }
    PodSwitches {
        dns_capture,
        ..PodSwitches::default()
    }
}
