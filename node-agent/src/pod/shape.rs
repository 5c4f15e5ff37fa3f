//! Whether a pod is a classic sidecar pod holdfast may act on, and if not, why: the text of
//! [`NotTracked`] is what the pod's status row and the agent's info log show.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use crate::api::text::pod_text;
use crate::api::SidecarMode;
use crate::config::{runtime_class_matches, PodOverrides, ProxyConfig, ANNOTATION_ENABLED};
use crate::mesh::{self, Markers, Mesh, MeshProfile, PodReads, Recognised};

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
    /// A mesh's proxy container, but that mesh's injector did not mark the pod (Istio: no
    /// status annotation naming its init step; Kuma, Consul: their injected markers).
    NotInjected { mesh: Mesh, why: String },
    /// Proxy containers of more than one mesh, each marked injected: whose rules are in the
    /// netns cannot be told, so the pod runs as without holdfast.
    SeveralMeshes { meshes: Vec<Mesh> },
    /// More than one proxy container of the mesh (Consul's multi-port pods: one
    /// `consul-dataplane-<service>` each, each its own Envoy and admin port): holdfast follows
    /// one proxy per pod.
    SeveralProxies { names: Vec<String> },
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
            NotTracked::NotInjected { mesh, why } => write!(
                f,
                "not injected by {}: {}",
                mesh::texts_of(*mesh).injector,
                pod_text(why)
            ),
            NotTracked::SeveralMeshes { meshes } => {
                let names: Vec<&str> = meshes.iter().map(|m| m.as_str()).collect();
                write!(
                    f,
                    "proxies of several meshes ({}) in one pod: holdfast cannot tell whose rules \
                     are in its netns",
                    names.join(", ")
                )
            }
            NotTracked::SeveralProxies { names } => write!(
                f,
                "{} proxy containers ({}): holdfast follows one proxy per pod",
                names.len(),
                pod_text(&names.join(", "))
            ),
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

/// What [`check`] found: the proxy container, how it runs, the pod's mesh, and the meshes whose
/// marker was there without their proxy (said on the row).
pub(super) struct Shape<'a> {
    pub proxy: &'a Container,
    pub mode: SidecarMode,
    pub profile: MeshProfile,
    pub ignored: Vec<Mesh>,
}

/// Checks that `pod` is a sidecar pod holdfast may act on and returns its proxy container, how
/// it runs (a regular container: classic; a restartable init container: native) and its mesh
/// ([`crate::mesh::recognise`]).
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
) -> Result<Shape<'a>, NotTracked> {
    let names: Vec<&str> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| c.name.as_str())
        .collect();
    let labels = pod.metadata.labels.as_ref();
    let annotation_str = |k: &str| annotation(k).map(String::as_str);
    let label_str = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    let recognised = mesh::recognise(
        &Markers {
            annotation: &annotation_str,
            label: &label_str,
            containers: &names,
        },
        proxy_config,
    );
    let (profile, ignored, not_injected) = match recognised {
        Recognised::None => return Err(NotTracked::NoProxy),
        Recognised::One { profile, ignored } => (profile, ignored, None),
        Recognised::NotInjected { mesh, why } => (
            mesh::profile_of(mesh, proxy_config),
            Vec::new(),
            Some(NotTracked::NotInjected { mesh, why }),
        ),
        Recognised::Several(meshes) => {
            if !overrides.enabled {
                return Err(NotTracked::OptedOut);
            }
            return Err(NotTracked::SeveralMeshes { meshes });
        }
    };
    let regulars: Vec<&Container> = spec
        .containers
        .iter()
        .filter(|c| profile.proxy.matches(&c.name))
        .collect();
    let natives: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| profile.proxy.matches(&c.name) && c.restart_policy.as_deref() == Some("Always"))
        .collect();
    if regulars.is_empty() && natives.is_empty() {
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
    if regulars.len() + natives.len() > 1 {
        return Err(NotTracked::SeveralProxies {
            names: regulars
                .iter()
                .chain(natives.iter())
                .map(|c| c.name.clone())
                .collect(),
        });
    }
    // A native sidecar (Istio 1.27+ with kubelets >= 1.33: `DetectNativeSidecar` in
    // pkg/kube/inject/webhook.go; Kuma 2.14+ by default; Consul with
    // `enable-consul-dataplane-as-sidecar`) is an init container with `restartPolicy: Always`;
    // the kubelet starts it before the app and stops it after.
    let (proxy, mode) = match (regulars.first(), natives.first()) {
        (Some(p), _) => (*p, SidecarMode::Classic),
        (None, Some(p)) => (*p, SidecarMode::Native),
        (None, None) => return Err(NotTracked::NoProxy),
    };
    let proxy_name = proxy.name.as_str();
    let reads = PodReads {
        pod,
        proxy,
        annotation: &annotation_str,
    };

    if let Some(why) = profile.not_a_sidecar(&reads) {
        return Err(NotTracked::NotASidecar { why });
    }
    if !spec.containers.iter().any(|c| c.name != proxy_name) {
        return Err(NotTracked::NotASidecar {
            why: format!(
                "{proxy_name} is the only container, as in a gateway, waypoint or ztunnel"
            ),
        });
    }

    if let Some(not_injected) = not_injected {
        return Err(not_injected);
    }

    if let Some(mode) = profile.other_interception(&reads) {
        return Err(NotTracked::Interception { mode });
    }

    if spec.host_users == Some(false) {
        return Err(NotTracked::HostUsers);
    }
    Ok(Shape {
        proxy,
        mode,
        profile,
        ignored,
    })
}
