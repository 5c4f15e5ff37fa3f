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
//!   `sidecarContainer.uid`, `redirectPortOutbound`, `redirectPortInbound`, `builtinDNS.port`);
//! - admin: TCP 127.0.0.1:9901 (`bootstrapServer.params.adminPort`, per pod the annotation
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

use super::{AdminAt, Markers, Mesh, MeshProfile, ProxyName};
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

/// `http.<stat_prefix>` scopes of Kuma's own listeners: Envoy's admin API (`admin`) and the
/// listener Kuma puts on the admin port to serve `/ready` (and, with TLS, the admin) to the
/// kubelet and kuma-dp, `system_envoy_admin` (pkg/xds/generator/admin_proxy_generator.go;
/// testdata/admin/09.envoy-config.golden.yaml). kuma-dp's readiness server on 9902 is kuma-dp's,
/// not Envoy's, so it moves no Envoy counter.
pub const OWN_HTTP_PREFIXES: [&str; 2] = ["admin", "system_envoy_admin"];

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
        admin: AdminAt::Tcp(SocketAddr::from(([127, 0, 0, 1], ADMIN_PORT))),
        own_http_prefixes: &OWN_HTTP_PREFIXES,
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
