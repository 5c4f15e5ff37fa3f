//! What a mesh reads from one pod beyond its markers: the per-pod settings its injector wrote
//! (annotations, the proxy container's env and args) and the shape checks only some meshes have
//! (Istio's proxy roles and interception modes). `PodView::from_pod` hands each pod to its
//! profile here ([`MeshProfile::read_pod`], [`MeshProfile::not_a_sidecar`],
//! [`MeshProfile::other_interception`]); each mesh's file
//! says what its injector writes.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::config::parse_go_bool;

/// One pod as a mesh's per-pod reads see it.
pub struct PodReads<'a> {
    pub pod: &'a Pod,
    /// The proxy container the shape check found.
    pub proxy: &'a Container,
    /// The pod's annotations, by key.
    pub annotation: &'a dyn Fn(&str) -> Option<&'a str>,
}

/// The pod's switches its mesh's settings turn on (all off for a mesh without them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodSwitches {
    /// The mesh redirects the pod's DNS to its DNS proxy ([`super::MeshProfile::dns_port`]): DNS is
    /// held too.
    pub dns_capture: bool,
    /// The mesh's agent ends Envoy on its own once no listener has an active connection.
    pub exit_on_zero: bool,
    /// The mesh's dual-stack switch: an IPv6-first pod's admin binds `::1`
    /// ([`super::MeshProfile::admin_follows_pod_ips`]).
    pub dual_stack: bool,
}

/// A container's environment variable as written in the spec.
#[derive(Debug, PartialEq, Eq)]
pub enum EnvValue<'a> {
    Absent,
    Literal(&'a str),
    /// `valueFrom` (a ConfigMap, a field): not knowable from the spec.
    FromElsewhere,
}

/// `var` in `c`'s env; the kubelet applies the last of duplicate names.
pub fn env_value<'a>(c: &'a Container, var: &str) -> EnvValue<'a> {
    match c.env.iter().flatten().rev().find(|e| e.name == var) {
        None => EnvValue::Absent,
        Some(e) if e.value_from.is_some() => EnvValue::FromElsewhere,
        Some(e) => EnvValue::Literal(e.value.as_deref().unwrap_or("")),
    }
}

/// A boolean switch in the proxy's env, as the mesh's `agent` reads it (Go's `strconv.ParseBool`);
/// `fallback` gives a value from elsewhere (with its origin, for the problem text) when the env
/// has none. Unreadable (`valueFrom`) or not a boolean: false, said in `problems`.
pub(super) fn env_switch(
    agent: &str,
    proxy: &Container,
    var: &str,
    fallback: Option<(&str, &str)>,
    problems: &mut Vec<String>,
) -> bool {
    let (value, from) = match env_value(proxy, var) {
        EnvValue::Literal(v) => (v, "env"),
        EnvValue::FromElsewhere => {
            problems.push(format!(
                "{}'s {var} is set through valueFrom, which holdfast cannot read; assuming false",
                proxy.name
            ));
            return false;
        }
        EnvValue::Absent => match fallback {
            Some(v) => v,
            None => return false,
        },
    };
    parse_go_bool(value).unwrap_or_else(|| {
        problems.push(format!(
            "{var}={value:?} (from {from}) is not a boolean; {agent} then uses false, and so does \
             holdfast"
        ));
        false
    })
}

/// The port of the container's `readinessProbe` (HTTP GET or TCP), when it is a number.
pub(super) fn readiness_probe_port(c: &Container) -> Option<u16> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let probe = c.readiness_probe.as_ref()?;
    let port = probe
        .http_get
        .as_ref()
        .map(|h| &h.port)
        .or(probe.tcp_socket.as_ref().map(|t| &t.port))?;
    match port {
        IntOrString::Int(p) => u16::try_from(*p).ok(),
        IntOrString::String(s) => s.parse().ok(),
    }
}
