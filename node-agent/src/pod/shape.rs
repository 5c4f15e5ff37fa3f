//! Whether a pod is a classic sidecar pod holdfast may act on, and if not, why: the text of
//! [`NotTracked`] is what the pod's status row and the agent's info log show.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use super::{injected_init_containers, interception_modes};
use crate::api::text::pod_text;
use crate::api::SidecarMode;
use crate::config::{
    runtime_class_matches, PodOverrides, ProxyConfig, ANNOTATION_ENABLED,
    ANNOTATION_ISTIO_SIDECAR_STATUS,
};

/// The init steps Istio's sidecar template injects: `istio-init` writes the iptables rules;
/// with the Istio CNI plugin `istio-validation` checks them (injection-template.yaml). They
/// send nothing through the capture ports.
pub const ISTIO_INIT_STEPS: [&str; 2] = ["istio-init", "istio-validation"];

/// Why a pod is not tracked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotTracked {
    /// The object has no `metadata.uid` (or no name): it cannot be tied to processes.
    Incomplete(&'static str),
    /// No container named like the proxy (`--proxy-container`): not meshed (not worth a log line).
    NoProxy,
    /// `hostNetwork: true`: the pod shares the node's namespace; holding there would hold the node.
    HostNetwork,
    /// Opted out with `holdfast.io/enabled: "false"`.
    OptedOut,
    /// Scheduled on another node (a source should not deliver these; checked anyway).
    OtherNode,
    /// A gateway, waypoint or ztunnel: the proxy runs in another role than `sidecar`, or no app
    /// container runs next to it. They have no capture ports and must drain all listeners, so
    /// they get neither a hold nor an early quit.
    NotASidecar { why: String },
    /// Interception mode other than REDIRECT (TPROXY, NONE): other rules and capture ports.
    Interception { mode: String },
    /// Not injected by Istio's sidecar template (no status annotation naming its init step).
    NotInjected { why: String },
    /// `hostUsers: false`: the pod has its own user namespace (see `check` for why holdfast
    /// stays out).
    HostUsers,
    /// `runtimeClassName` names a sandboxed runtime (`--sandboxed-runtime-classes`): gVisor or
    /// Kata run the pod's processes where the node's /proc and the pod's netns as the agent
    /// reads them do not show them.
    Sandboxed { runtime_class: String },
}

impl std::fmt::Display for NotTracked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotTracked::Incomplete(what) => write!(f, "pod object has no {what}"),
            NotTracked::NoProxy => f.write_str("no proxy container"),
            NotTracked::HostNetwork => f.write_str("hostNetwork pod: it shares the node's network namespace"),
            NotTracked::OptedOut => write!(f, "opted out by annotation {ANNOTATION_ENABLED}: \"false\""),
            NotTracked::OtherNode => f.write_str("scheduled on another node"),
            // `why` and `mode` quote the pod (its args, annotations): cut and escaped.
            NotTracked::NotASidecar { why } => write!(
                f,
                "not a sidecar pod ({}): gateways, waypoints and ztunnel get no hold and no early quit",
                pod_text(why)
            ),
            NotTracked::Interception { mode } => write!(
                f,
                "interception mode {}: holdfast holds REDIRECT-mode pods only",
                pod_text(mode)
            ),
            NotTracked::NotInjected { why } => {
                write!(f, "not injected by Istio's sidecar template: {}", pod_text(why))
            }
            NotTracked::HostUsers => f.write_str(
                "hostUsers: false (own user namespace): the kernel refuses the hold rule's \
                 owner match from the node's user namespace",
            ),
            NotTracked::Sandboxed { runtime_class } => write!(
                f,
                "sandboxed runtime (runtimeClassName {runtime_class}): its processes run in a VM or \
                 behind gVisor, out of the agent's sight; a hold would only run to its deadline"
            ),
        }
    }
}

/// Checks that `pod` is a sidecar pod holdfast may act on and returns its proxy container and
/// how it runs (a regular container: classic; a restartable init container: native).
///
/// `hostUsers: false`: holdfast stays out. Its hold rule matches the app's SYNs "from any uid but
/// the proxy's" with `xt_owner`, and the kernel rejects an owner match written into a network
/// namespace owned by another user namespace (net/netfilter/xt_owner.c `owner_check`: the
/// writer's user namespace must be the netns's). Dropping the match would hold the proxy's own
/// connections to 127.0.0.1:15001/15006 as well; proving that safe (and moving the agent into the
/// pod's user namespace to write it) is not done, so such pods run as without holdfast.
pub(super) fn check<'a>(
    pod: &'a Pod,
    spec: &'a PodSpec,
    proxy_config: &ProxyConfig,
    overrides: &PodOverrides,
    annotation: &dyn Fn(&str) -> Option<&'a String>,
) -> Result<(&'a Container, SidecarMode), NotTracked> {
    let proxy_name = proxy_config.container.as_str();
    let regular = spec.containers.iter().find(|c| c.name == proxy_name);
    let native = spec
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == proxy_name && c.restart_policy.as_deref() == Some("Always"));
    if regular.is_none() && native.is_none() {
        return Err(NotTracked::NoProxy);
    }
    if !overrides.enabled {
        return Err(NotTracked::OptedOut);
    }
    if spec.host_network == Some(true) {
        return Err(NotTracked::HostNetwork);
    }
    // A sandboxed runtime (docs/reference.md, "Where holdfast acts"): gVisor runs the pod's
    // processes under its own kernel (the Sentry), Kata in a VM: neither shows the app or Envoy
    // in the node's /proc, so no process, cgroup or netns of theirs is what the agent reads.
    if let Some(class) = spec.runtime_class_name.as_deref() {
        if runtime_class_matches(&proxy_config.sandboxed_runtime_classes, class) {
            return Err(NotTracked::Sandboxed {
                runtime_class: class.to_string(),
            });
        }
    }
    // A native sidecar (Istio 1.27+ with kubelets >= 1.33: `DetectNativeSidecar` in
    // pkg/kube/inject/webhook.go) is an init container with `restartPolicy: Always`; the
    // kubelet starts it before the app and stops it after.
    let (proxy, mode) = match (regular, native) {
        (Some(p), _) => (p, SidecarMode::Classic),
        (None, Some(p)) => (p, SidecarMode::Native),
        (None, None) => return Err(NotTracked::NoProxy),
    };

    // pilot-agent's role is its second argument: `proxy sidecar` in the sidecar template,
    // `proxy router` for gateways (gateway-injection-template.yaml), `proxy waypoint`
    // (waypoint.yaml), `proxy ztunnel` (charts/ztunnel/templates/daemonset.yaml).
    let args: Vec<&str> = proxy.args.iter().flatten().map(String::as_str).collect();
    if let ["proxy", role, ..] = args.as_slice() {
        if *role != "sidecar" {
            let kind = match *role {
                "router" => "a gateway",
                "waypoint" => "a waypoint",
                "ztunnel" => "ztunnel",
                _ => "not a sidecar",
            };
            return Err(NotTracked::NotASidecar {
                why: format!("{proxy_name} runs `proxy {role}`: {kind}"),
            });
        }
    }
    if !spec.containers.iter().any(|c| c.name != proxy_name) {
        return Err(NotTracked::NotASidecar {
            why: format!(
                "{proxy_name} is the only container, as in a gateway, waypoint or ztunnel"
            ),
        });
    }

    let Some(status) = annotation(ANNOTATION_ISTIO_SIDECAR_STATUS) else {
        return Err(NotTracked::NotInjected {
            why: format!("no {ANNOTATION_ISTIO_SIDECAR_STATUS} annotation"),
        });
    };
    let inits = injected_init_containers(status).map_err(|why| NotTracked::NotInjected { why })?;
    if !inits.iter().any(|i| ISTIO_INIT_STEPS.contains(&i.as_str())) {
        return Err(NotTracked::NotInjected {
            why: format!(
                "{ANNOTATION_ISTIO_SIDECAR_STATUS} names neither istio-init nor istio-validation \
                 (interception mode NONE, or another template)"
            ),
        });
    }

    for mode in interception_modes(pod, proxy, annotation) {
        let mode = mode.trim();
        if !mode.is_empty() && !mode.eq_ignore_ascii_case("REDIRECT") {
            return Err(NotTracked::Interception {
                mode: mode.to_ascii_uppercase(),
            });
        }
    }

    if spec.host_users == Some(false) {
        return Err(NotTracked::HostUsers);
    }
    Ok((proxy, mode))
}
