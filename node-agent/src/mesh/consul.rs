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
//! - admin 127.0.0.1:19000 (`-envoy-admin-bind-address`, `::1` where the injector runs IPv6);
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

use super::{AdminAt, Markers, Mesh, MeshProfile, ProxyName};

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

/// `http.<stat_prefix>` scopes of Consul's own listeners: Envoy's admin API. consul-dataplane's
/// own servers (20600 graceful, 21000 ready, metrics) are not Envoy listeners.
pub const OWN_HTTP_PREFIXES: [&str; 1] = ["admin"];

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
        admin: AdminAt::Tcp(SocketAddr::from(([127, 0, 0, 1], ADMIN_PORT))),
        own_http_prefixes: &OWN_HTTP_PREFIXES,
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
