//! The advice texts that name the pod's mesh's parts (its agent, its own drain, its settings),
//! made from its [`MeshTexts`].

use super::{consul, istio, kuma, Mesh, MeshProfile, MeshTexts};

/// The drain's advice when a connection stays open after the app exited and Envoy keeps no
/// byte counters (only the bytes could tell an idle keep-alive from traffic in flight).
pub fn unexposed_bytes_advice(t: &MeshTexts) -> String {
    let fix = match t.keep_byte_counters {
        Some(how) => format!("{how} so holdfast can end it once no byte moves."),
        None => "Keep Envoy's downstream byte counters so holdfast can end it once no byte moves."
            .to_string(),
    };
    format!(
        "a connection through the proxy is still open after the app exited (a client's \
         keep-alive into the pod, or a response still being sent), and Envoy does not keep its \
         downstream byte counters (a stats matcher drops them), so an idle keep-alive cannot be \
         told from traffic in flight: holdfast waits for the connection to close, for {} or for \
         its deadline. {fix}",
        t.own_end
    )
}

/// The drain's advice when neither the filter nor Envoy's byte counters are there.
pub fn unseen_advice(t: &MeshTexts) -> String {
    let fix = match (t.install_filter, t.keep_byte_counters) {
        (Some(filter), Some(bytes)) => format!("{filter}, and {bytes},"),
        (Some(filter), None) => format!("{filter},"),
        (None, Some(bytes)) => format!("{bytes},"),
        (None, None) => "Keep Envoy's downstream byte counters".to_string(),
    };
    format!(
        "the holdfast filter is not in this pod's proxy and Envoy does not keep its downstream \
         byte counters, so whether a response is still being sent after the app exited cannot be \
         seen: holdfast does not end the proxy, which ends by {} or at the drain's deadline, as \
         without holdfast. {fix} so holdfast can end it when nothing is in flight.",
        t.own_end
    )
}

/// The advice when a native sidecar's proxy died during the pod's termination.
pub fn proxy_died_advice(profile: &MeshProfile, app_processes: usize) -> String {
    format!(
        "the native sidecar's proxy exited during the pod's termination while {app_processes} \
         app process(es) still ran: the kubelet does not restart a sidecar then (KEP-4438 is not \
         in Kubernetes 1.33-1.35), so the app had no mesh egress for the rest of its shutdown. \
         Look for why Envoy or {} died (OOM-kill, a crash) in the {} container's previous logs",
        profile.texts().agent,
        profile.proxy.exact
    )
}

/// What an operator should change when Envoy exited before the app was done (drain outcome
/// `proxy-gone-early`): the pod's mesh's own drain setting (`exit_on_zero`: Istio's
/// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS` is set on the pod).
pub fn proxy_gone_early_advice(profile: &MeshProfile, exit_on_zero: bool) -> String {
    match profile.mesh {
        Mesh::Istio => istio::proxy_gone_early_advice(exit_on_zero),
        Mesh::Kuma => kuma::proxy_gone_early_advice(),
        Mesh::Consul => consul::proxy_gone_early_advice(),
    }
}
