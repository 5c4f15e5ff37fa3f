//! What the agent needs to know about one Kubernetes Pod, read defensively from the API object,
//! and whether holdfast acts on it at all.
//!
//! A `Pod` from the API server (or a pods directory) may be incomplete at any stage: no status
//! yet, no container ids yet, missing fields in a hand-written file. Everything here returns a
//! safe answer for such objects instead of failing.
//!
//! holdfast acts only on **classic sidecar pods** (see [`NotTracked`] for every way out): the
//! proxy is a regular container next to at least one other regular container, Istio's sidecar
//! template injected it (its status annotation names `istio-init` or `istio-validation`), and
//! interception is REDIRECT. Gateways, waypoints and ztunnel name their container `istio-proxy`
//! too, but have no capture ports and must drain all listeners: holding or quitting them early
//! is wrong.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};

pub use crate::api::SidecarMode;
use k8s_openapi::jiff::Timestamp;

use crate::config::{parse_go_bool, HoldSettings, PodOverrides, ProxyConfig};
use crate::mesh::istio_config::{
    proxy_metadata_from_annotation, ANNOTATION_ISTIO_INTERCEPTION_MODE,
    ANNOTATION_ISTIO_PROXY_CONFIG, ANNOTATION_ISTIO_SIDECAR_STATUS,
};

pub mod app_end;
mod shape;

pub use app_end::{app_end, AppContainerEnd, AppEnd, AppNow, ContainerRestart, RestartPolicy};
pub use shape::{NotTracked, ISTIO_INIT_STEPS};

pub use crate::mesh::{Mesh, MeshProfile};

/// Stable identity of a pod: its UID, plus `namespace/name` for humans.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodKey {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One container's runtime state as the kubelet reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerView {
    pub name: String,
    /// Runtime container id without the `containerd://` style prefix; `None` before it is created.
    pub id: Option<String>,
    pub is_proxy: bool,
    pub state: ContainerState,
    /// The status shows the container ran at some point: state running or terminated, a
    /// terminated `lastState`, or `restartCount > 0`. A container still `waiting` for its first
    /// start (ContainerCreating, ImagePullBackOff, PodInitializing) has not.
    pub ran: bool,
    /// An init container with `restartPolicy: Always` (a native sidecar, Kubernetes 1.29+):
    /// started in init order, runs next to the regular containers, and is stopped only after
    /// every regular container has exited (kubernetes/kubernetes
    /// pkg/kubelet/kuberuntime/kuberuntime_termination_order.go). Always `false` for regular
    /// containers.
    pub restartable: bool,
    /// Its own restart policy and rules (Kubernetes 1.35's container restart rules), if any.
    pub restart: ContainerRestart,
}

impl ContainerView {
    /// Whether the container ever ran: [`ContainerView::ran`], or a state that implies it.
    pub fn has_run(&self) -> bool {
        self.ran || !matches!(self.state, ContainerState::Waiting)
    }

    /// This container for the app-finished rule ([`app_end()`]), by its status.
    pub fn app_end(&self) -> AppContainerEnd {
        AppContainerEnd {
            ran: self.has_run(),
            now: match self.state {
                ContainerState::Waiting => AppNow::Waiting,
                ContainerState::Running => AppNow::Running,
                ContainerState::Terminated { exit_code } => AppNow::Terminated { exit_code },
            },
            restart: self.restart.clone(),
        }
    }
}

/// A container's lifecycle state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ContainerState {
    #[default]
    Waiting,
    Running,
    Terminated {
        exit_code: i32,
    },
}

/// A meshed pod on this node, as the agent sees it. No `Default`: a pod's view always carries
/// its mesh's profile ([`PodView::blank`] takes one).
#[derive(Debug, Clone)]
pub struct PodView {
    pub key: PodKey,
    pub overrides: PodOverrides,
    /// The regular containers (`spec.containers`), the proxy among them.
    pub containers: Vec<ContainerView>,
    /// `spec.initContainers`, in order; native sidecars have `restartable: true`.
    pub init_containers: Vec<ContainerView>,
    /// `spec.restartPolicy` (`Always` when absent).
    pub restart_policy: RestartPolicy,
    /// Set once the pod is being deleted.
    pub deletion: Option<Deletion>,
    /// `status.phase` (`Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`), if reported.
    pub phase: Option<String>,
    /// `status.podIPs` in order (the first is `status.podIP`); empty before the sandbox exists.
    pub pod_ips: Vec<IpAddr>,
    /// Istio's DNS capture is on for this pod (see [`PodView::dns_capture`]).
    pub dns_capture: bool,
    /// pilot-agent ends Envoy on zero active connections (see [`PodView::exit_on_zero`]).
    pub exit_on_zero: bool,
    /// The proxy's `ISTIO_DUAL_STACK` is true (decides the admin bind of IPv6-first pods).
    pub istio_dual_stack: bool,
    /// Classic (a regular container) or native (a restartable init container).
    pub mode: SidecarMode,
    /// The mesh that injected the sidecar, and its facts for this pod (proxy uid, capture
    /// ports, admin address, its own listeners): `crate::mesh`.
    pub profile: MeshProfile,
    /// A native proxy with its mesh's preStop drain (Istio: `pilot-agent request ... POST
    /// drain`; Kuma: `killall -USR2 kuma-dp`): on deletion the proxy drains at once, and exits
    /// the moment the kubelet sends it SIGTERM, which is after every regular container has
    /// exited (see [`MeshProfile::prestop_drain`]).
    pub prestop_drain: bool,
    /// The kubelet restarts every container of the pod in place (Kubernetes 1.35+, KEP-5532
    /// `RestartAllContainers`): the condition `AllContainersRestarting` is `True` (see
    /// [`restarting_in_place`]). Same sandbox, netns, IP and uid; init containers run again.
    pub restarting_in_place: bool,
    /// The proxy container has a `startupProbe` (Istio's injection template writes one on the
    /// native sidecar unless `values.global.proxy.startupProbe.enabled=false`). Without it the
    /// kubelet starts the app as soon as the native sidecar has started, not once it is ready.
    pub proxy_startup_probe: bool,
}

/// The pod condition the kubelet sets while it restarts every container in place
/// (kubernetes/kubernetes staging/src/k8s.io/api/core/v1/types.go `AllContainersRestarting`;
/// pkg/kubelet/status/generate.go `GenerateAllContainersRestartingCondition`: `True` from the
/// restart rule's trigger until every old container has been cleaned up, then `False` while the
/// init containers and containers start again).
pub const ALL_CONTAINERS_RESTARTING: &str = "AllContainersRestarting";

/// Whether the pod's conditions say the kubelet is restarting every container in place.
pub fn restarting_in_place(conditions: &[k8s_openapi::api::core::v1::PodCondition]) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == ALL_CONTAINERS_RESTARTING && c.status == "True")
}

impl PodView {
    /// A view of nothing but `profile`: every other field empty or at its default (tests and
    /// replays build on it; `from_pod` is the agent's way in).
    pub fn blank(profile: MeshProfile) -> PodView {
        PodView {
            key: PodKey::default(),
            overrides: PodOverrides::default(),
            containers: Vec::new(),
            init_containers: Vec::new(),
            restart_policy: RestartPolicy::default(),
            deletion: None,
            phase: None,
            pod_ips: Vec::new(),
            dns_capture: false,
            exit_on_zero: false,
            istio_dual_stack: false,
            mode: SidecarMode::default(),
            profile,
            prestop_drain: false,
            restarting_in_place: false,
            proxy_startup_probe: false,
        }
    }

    /// The pod is in a terminal phase (`Succeeded` or `Failed`): every container has
    /// terminated and none will run again (kubernetes pkg/apis/core/types.go: "PodSucceeded ...
    /// all containers in the pod have voluntarily terminated ... and the system is not going to
    /// restart any of these containers"; "PodFailed ... will not be restarted"). Also a pod the
    /// kubelet rejected at admission (`OutOfcpu`, `NodeAffinity`): Failed, no container ran.
    pub fn is_terminal(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"))
    }
}

/// A pod's deletion: when it started and how long the kubelet grants it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Deletion {
    pub timestamp: Timestamp,
    pub grace: Duration,
}

/// Kubernetes' default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// Every annotation [`PodView::from_pod`] reads; the pod source drops the others
/// ([`crate::source::slim`]), so a pod's other annotations (labels' cousins, `kubectl
/// annotate` in a loop, megabytes of last-applied-configuration) cost nothing past the source.
pub const READ_ANNOTATIONS: [&str; 12] = [
    crate::config::ANNOTATION_ENABLED,
    crate::config::ANNOTATION_HOLD_TIMEOUT,
    ANNOTATION_ISTIO_SIDECAR_STATUS,
    ANNOTATION_ISTIO_INTERCEPTION_MODE,
    ANNOTATION_ISTIO_PROXY_CONFIG,
    crate::mesh::kuma::ANNOTATION_SIDECAR_INJECTED,
    crate::mesh::kuma::ANNOTATION_ENVOY_ADMIN_PORT,
    crate::mesh::kuma::ANNOTATION_SIDECAR_UID,
    crate::mesh::kuma::ANNOTATION_OUTBOUND_PORT,
    crate::mesh::kuma::ANNOTATION_INBOUND_PORT,
    crate::mesh::consul::KEY_INJECT_STATUS,
    crate::mesh::consul::KEY_TRANSPARENT_PROXY_STATUS,
];

/// Every label [`PodView::from_pod`] reads (the meshes' markers); the source drops the others.
pub const READ_LABELS: [&str; 2] = crate::mesh::READ_LABELS;

/// Every container environment variable [`PodView::from_pod`] reads; the source drops the others.
pub const READ_ENV: [&str; 6] = [
    ENV_DNS_CAPTURE,
    ENV_EXIT_ON_ZERO,
    ENV_DUAL_STACK,
    ENV_INTERCEPTION_MODE,
    crate::mesh::kuma::ENV_DNS_ENABLED,
    crate::mesh::kuma::ENV_DNS_PROXY_PORT,
];

/// The proxy's environment variable that turns on Istio's DNS capture (redirect of port 53 to
/// pilot-agent's 15053): pilot/cmd/pilot-agent/options/options.go `DNSCaptureByAgent`, and
/// tools/istio-iptables/pkg/cmd/root.go for the redirect rule.
pub const ENV_DNS_CAPTURE: &str = "ISTIO_META_DNS_CAPTURE";
/// pilot-agent's "end Envoy on zero active connections" switch (`crate::mesh`'s Istio facts).
pub use crate::mesh::istio::ENV_EXIT_ON_ZERO;
/// Istio's dual-stack switch (pilot/pkg/features/experimental.go `EnableDualStack`).
pub const ENV_DUAL_STACK: &str = "ISTIO_DUAL_STACK";
/// How Istio tells the proxy its interception mode (injection-template.yaml).
pub const ENV_INTERCEPTION_MODE: &str = "ISTIO_META_INTERCEPTION_MODE";

impl PodView {
    /// Reads a Pod object. Returns why the pod is not tracked when it is not a classic sidecar
    /// pod holdfast may act on.
    pub fn from_pod(
        pod: &Pod,
        node_name: &str,
        proxy: &ProxyConfig,
        hold: &HoldSettings,
    ) -> Result<Self, NotTracked> {
        let meta = &pod.metadata;
        let uid = meta
            .uid
            .as_deref()
            .filter(|u| !u.is_empty())
            .ok_or(NotTracked::Incomplete("metadata.uid"))?;
        let name = meta
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or(NotTracked::Incomplete("metadata.name"))?;
        let namespace = meta.namespace.as_deref().unwrap_or("default");
        let key = PodKey {
            uid: uid.to_ascii_lowercase(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        let spec = pod.spec.as_ref().ok_or(NotTracked::Incomplete("spec"))?;
        if let Some(node) = spec.node_name.as_deref() {
            if !node.is_empty() && node != node_name {
                return Err(NotTracked::OtherNode);
            }
        }
        let annotation = |k: &str| meta.annotations.as_ref().and_then(|a| a.get(k));
        let mut overrides = PodOverrides::from_annotations(
            meta.annotations
                .iter()
                .flatten()
                .map(|(k, v)| (k.as_str(), v.as_str())),
            hold,
        );
        let shape::Shape {
            proxy: proxy_container,
            mode,
            mut profile,
            ignored,
        } = shape::check(pod, spec, proxy, &overrides, &annotation)?;
        for other in ignored {
            overrides.problems.push(format!(
                "also marked as injected by {other}, whose proxy container is not in the pod: \
                 followed as a {} pod",
                profile.mesh
            ));
        }
        match profile.mesh {
            Mesh::Istio => {}
            Mesh::Kuma => {
                profile.admin = crate::mesh::kuma::admin_for(
                    annotation(crate::mesh::kuma::ANNOTATION_ENVOY_ADMIN_PORT).map(String::as_str),
                    readiness_probe_port(proxy_container),
                );
                crate::mesh::kuma::pod_settings(
                    &mut profile,
                    &|k| annotation(k).map(String::as_str),
                    &mut overrides.problems,
                );
            }
            Mesh::Consul => {
                profile.admin = crate::mesh::consul::admin_for(
                    proxy_container.args.as_deref().unwrap_or(&[]),
                    &mut overrides.problems,
                );
            }
        }
        let prestop_drain = mode == SidecarMode::Native && profile.prestop_drain(proxy_container);

        // The proxy's settings: its env first (what pilot-agent reads), then the
        // proxy.istio.io/config annotation's proxyMetadata.
        let metadata = match annotation(ANNOTATION_ISTIO_PROXY_CONFIG) {
            Some(v) => proxy_metadata_from_annotation(v).unwrap_or_else(|problem| {
                overrides.problems.push(format!("{problem}; ignored"));
                Default::default()
            }),
            None => Default::default(),
        };
        let mut flag = |var: &str| -> bool {
            let (value, from) = match env_value(proxy_container, var) {
                EnvValue::Literal(v) => (v, "env"),
                EnvValue::FromElsewhere => {
                    overrides.problems.push(format!(
                        "{}'s {var} is set through valueFrom, which holdfast cannot read; assuming false",
                        proxy_container.name
                    ));
                    return false;
                }
                EnvValue::Absent => match metadata.get(var) {
                    Some(v) => (v.as_str(), ANNOTATION_ISTIO_PROXY_CONFIG),
                    None => return false,
                },
            };
            parse_go_bool(value).unwrap_or_else(|| {
                overrides.problems.push(format!(
                    "{var}={value:?} (from {from}) is not a boolean; pilot-agent then uses false, and so does holdfast"
                ));
                false
            })
        };
        // Istio's settings; another mesh's proxy has none of these variables.
        let istio = profile.mesh == Mesh::Istio;
        let dns_capture = match profile.mesh {
            Mesh::Istio => flag(ENV_DNS_CAPTURE),
            // kuma-dp's DNS proxy, where kuma-init redirects DNS when the injector turned the
            // builtin DNS on (containers/factory.go writes both variables then).
            Mesh::Kuma => {
                let on = matches!(
                    env_value(proxy_container, crate::mesh::kuma::ENV_DNS_ENABLED),
                    EnvValue::Literal(v) if parse_go_bool(v) == Some(true)
                );
                if let EnvValue::Literal(port) =
                    env_value(proxy_container, crate::mesh::kuma::ENV_DNS_PROXY_PORT)
                {
                    // A value that is no port: the default (15053) stays.
                    if let Ok(p @ 1..) = port.trim().parse::<u16>() {
                        profile.dns_port = Some(p);
                    }
                }
                on
            }
            Mesh::Consul => false,
        };
        let exit_on_zero = istio && flag(ENV_EXIT_ON_ZERO);
        let istio_dual_stack = istio && flag(ENV_DUAL_STACK);

        let status = pod.status.as_ref();
        let statuses: &[ContainerStatus] = status
            .and_then(|s| s.container_statuses.as_deref())
            .unwrap_or(&[]);
        let init_statuses: &[ContainerStatus] = status
            .and_then(|s| s.init_container_statuses.as_deref())
            .unwrap_or(&[]);
        let containers = spec
            .containers
            .iter()
            .map(|c| container_view(c, statuses, &proxy_container.name, false))
            .collect();
        let init_containers = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| {
                let restartable = c.restart_policy.as_deref() == Some("Always");
                container_view(c, init_statuses, &proxy_container.name, restartable)
            })
            .collect();

        let mut pod_ips = Vec::new();
        let listed = status
            .and_then(|s| s.pod_ips.as_ref())
            .map(|ips| ips.iter().map(|p| p.ip.as_str()).collect::<Vec<_>>())
            .filter(|ips| !ips.is_empty())
            .or_else(|| status.and_then(|s| s.pod_ip.as_deref()).map(|ip| vec![ip]));
        for ip in listed.into_iter().flatten() {
            match ip.parse::<IpAddr>() {
                Ok(ip) => pod_ips.push(ip),
                Err(_) => overrides.problems.push(format!(
                    "status.podIPs has an address that is not an IP: {ip:?}; ignored"
                )),
            }
        }

        bound_problems(&mut overrides.problems);

        let deletion = meta.deletion_timestamp.as_ref().map(|t| Deletion {
            timestamp: t.0,
            grace: meta
                .deletion_grace_period_seconds
                .or(spec.termination_grace_period_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs)
                .unwrap_or(DEFAULT_GRACE),
        });

        Ok(Self {
            key,
            overrides,
            containers,
            init_containers,
            restart_policy: RestartPolicy::from_spec(spec.restart_policy.as_deref()),
            deletion,
            phase: status.and_then(|s| s.phase.clone()),
            pod_ips,
            dns_capture,
            exit_on_zero,
            istio_dual_stack,
            mode,
            profile,
            prestop_drain,
            restarting_in_place: status
                .and_then(|s| s.conditions.as_deref())
                .is_some_and(restarting_in_place),
            proxy_startup_probe: proxy_container.startup_probe.is_some(),
        })
    }

    /// Envoy's TCP admin address for this pod (`None`: its admin is a Unix socket,
    /// [`crate::mesh::AdminAt::UnixSocket`]). Istio's bootstrap binds admin on its "localhost"
    /// (tools/packaging/common/envoy_bootstrap.json), which pkg/bootstrap/config.go picks from
    /// the proxy's IPs — `status.podIP` first (pilot-agent's `INSTANCE_IP`, app/cmd.go), then the
    /// pod's other addresses: `::1` when every IP is IPv6, or when the first is IPv6 and
    /// `ISTIO_DUAL_STACK` is on; `127.0.0.1` otherwise (an IPv6-first dual-stack pod without
    /// `ISTIO_DUAL_STACK` still binds IPv4). Kuma's and Consul's admin address is their
    /// profile's whatever the pod's IPs (`MeshProfile::admin_follows_pod_ips`: Kuma's
    /// `adminAddress`, Consul's `-envoy-admin-bind-address` flag).
    pub fn admin_tcp(&self) -> Option<SocketAddr> {
        self.profile.admin_tcp_for(self.admin_v6_loopback())
    }

    /// Whether the mesh's bootstrap binds the admin on `::1` for this pod's IPs.
    fn admin_v6_loopback(&self) -> bool {
        let all_v6 = !self.pod_ips.is_empty() && self.pod_ips.iter().all(IpAddr::is_ipv6);
        let first_v6 = self.pod_ips.first().is_some_and(IpAddr::is_ipv6);
        all_v6 || (first_v6 && self.istio_dual_stack)
    }

    /// [`PodView::admin_tcp`] for an Istio pod, with the agent's `--admin-addr` in `proxy`
    /// (kept for the callers that predate the mesh profile); for a pod whose admin is a Unix
    /// socket, `proxy.admin` (unused: its client connects to the socket).
    pub fn admin_addr(&self, proxy: &ProxyConfig) -> SocketAddr {
        if self.profile.mesh == Mesh::Istio {
            return crate::mesh::istio::profile(proxy)
                .admin_tcp_for(self.admin_v6_loopback())
                .unwrap_or(proxy.admin);
        }
        self.admin_tcp().unwrap_or(proxy.admin)
    }

    /// Whether the pod has an IPv6 address (its IPv6 connections are then held too).
    pub fn has_ipv6(&self) -> bool {
        self.pod_ips.iter().any(IpAddr::is_ipv6)
    }

    /// Whether Istio redirects the pod's DNS (UDP and TCP port 53) to pilot-agent's 15053, so DNS
    /// is held too: the proxy's `ISTIO_META_DNS_CAPTURE` env (Istio renders mesh-wide and
    /// per-pod `proxyMetadata` into it at injection; pilot-agent reads only its env), else the
    /// `proxy.istio.io/config` annotation's `proxyMetadata`. Malformed: false (Istio's default).
    pub fn dns_capture(&self) -> bool {
        self.dns_capture
    }

    /// Whether pilot-agent ends Envoy on its own once no listener has an active connection
    /// (`EXIT_ON_ZERO_ACTIVE_CONNECTIONS`, read like [`PodView::dns_capture`]). With it,
    /// pilot-agent ignores `terminationDrainDuration` (pkg/envoy/agent.go `terminate`).
    pub fn exit_on_zero(&self) -> bool {
        self.exit_on_zero
    }

    /// The app containers: every regular container but the proxy, then the native sidecars
    /// other than the proxy (log shippers, collectors: `restartable: true`). Native sidecars are
    /// app for the drain's in-flight judgement — their connections go through Envoy — but the
    /// kubelet stops them only after every regular container, the proxy included, has exited:
    /// never wait for their processes to exit before quitting the proxy (that waits for the
    /// deadline). [`PodView::regular_app_containers`] leaves them out.
    pub fn app_containers(&self) -> impl Iterator<Item = &ContainerView> {
        self.regular_app_containers().chain(
            self.init_containers
                .iter()
                .filter(|c| c.restartable && !c.is_proxy),
        )
    }

    /// The regular (`spec.containers`) app containers: every one but the proxy.
    pub fn regular_app_containers(&self) -> impl Iterator<Item = &ContainerView> {
        self.containers.iter().filter(|c| !c.is_proxy)
    }

    /// The proxy container: a regular one (classic), or a restartable init container (native).
    pub fn proxy_container(&self) -> Option<&ContainerView> {
        self.containers
            .iter()
            .chain(self.init_containers.iter().filter(|c| c.restartable))
            .find(|c| c.is_proxy)
    }

    /// The containers whose end the proxy must outlive, whose exit lets it go: the regular app
    /// containers; for a native sidecar also the restartable init containers started after it
    /// (the kubelet stops sidecars in the reverse order of their start, each after the regular
    /// containers and the sidecars started after it: kubernetes/kubernetes
    /// pkg/kubelet/kuberuntime/kuberuntime_termination_order.go).
    pub fn containers_before_proxy_stops(&self) -> impl Iterator<Item = &ContainerView> {
        let later_sidecars: Vec<&ContainerView> = match self.mode {
            SidecarMode::Classic => Vec::new(),
            SidecarMode::Native => self
                .init_containers
                .iter()
                .skip_while(|c| !c.is_proxy)
                .skip(1)
                .filter(|c| c.restartable)
                .collect(),
        };
        self.regular_app_containers().chain(later_sidecars)
    }

    /// A container's own restart policy and rules (none for a name not in the spec).
    pub fn container_restart(&self, name: &str) -> ContainerRestart {
        self.containers
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.restart.clone())
            .unwrap_or_default()
    }

    /// How far the app is from finished by the Pod status alone ([`app_end()`]: the one rule).
    pub fn app_end_by_status(&self) -> AppEnd {
        app_end(
            self.restart_policy,
            self.regular_app_containers().map(ContainerView::app_end),
        )
    }

    /// True when every regular app container ran, has exited, and the kubelet will not restart
    /// any of them, so the pod only waits for its proxy: a finished Job (see [`app_end()`]).
    pub fn apps_finished_for_good(&self) -> bool {
        self.app_end_by_status() == AppEnd::ForGood
    }
}

/// What an operator should change when Envoy exited before the app was done (drain outcome
/// `proxy-gone-early`), in the words of the pod's mesh
/// ([`crate::mesh::proxy_gone_early_advice`]).
pub fn drain_advice(view: &PodView) -> String {
    crate::mesh::proxy_gone_early_advice(&view.profile, view.exit_on_zero)
}

/// Whether a native proxy's preStop is Istio's drain ([`crate::mesh::istio::prestop_drain`]).
pub fn istio_prestop_drain(proxy: &Container) -> bool {
    crate::mesh::istio::prestop_drain(proxy)
}

/// The port of the container's `readinessProbe` (HTTP GET or TCP), when it is a number.
fn readiness_probe_port(c: &Container) -> Option<u16> {
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

/// The most problems one pod's view keeps (each cut to [`crate::api::text::MAX_POD_TEXT`]).
pub const MAX_POD_PROBLEMS: usize = 8;

/// Keeps a pod's problems bounded before they reach its row and the log: at most
/// [`MAX_POD_PROBLEMS`], each made safe with [`crate::api::text::pod_text`] (they quote the pod's
/// annotations and env values, `Debug`-escaped, so one control byte became five), and the rest
/// counted.
fn bound_problems(problems: &mut Vec<String>) {
    let more = problems.len().saturating_sub(MAX_POD_PROBLEMS);
    problems.truncate(MAX_POD_PROBLEMS);
    for p in problems.iter_mut() {
        *p = crate::api::text::pod_text(p);
    }
    if more > 0 {
        problems.push(format!("and {more} more problem(s) not shown"));
    }
}

/// `containerd://abc` → `abc`. Returns `None` for an empty id.
pub fn strip_runtime_prefix(id: &str) -> Option<String> {
    let bare = id.split_once("://").map_or(id, |(_, rest)| rest);
    (!bare.is_empty()).then(|| bare.to_ascii_lowercase())
}

fn container_view(
    c: &Container,
    statuses: &[ContainerStatus],
    proxy_name: &str,
    restartable: bool,
) -> ContainerView {
    let status = statuses.iter().find(|s| s.name == c.name);
    ContainerView {
        name: c.name.clone(),
        id: status
            .and_then(|s| s.container_id.as_deref())
            .and_then(strip_runtime_prefix),
        is_proxy: c.name == proxy_name,
        state: status.map(container_state).unwrap_or_default(),
        ran: status.is_some_and(status_shows_a_run),
        restartable,
        restart: ContainerRestart::from_spec(c),
    }
}

fn container_state(s: &ContainerStatus) -> ContainerState {
    match &s.state {
        Some(st) if st.terminated.is_some() => ContainerState::Terminated {
            exit_code: st.terminated.as_ref().map_or(0, |t| t.exit_code),
        },
        Some(st) if st.running.is_some() => ContainerState::Running,
        _ => ContainerState::Waiting,
    }
}

/// Running or terminated now, terminated before (`lastState`), or restarted: the container ran.
fn status_shows_a_run(s: &ContainerStatus) -> bool {
    let now = s
        .state
        .as_ref()
        .is_some_and(|st| st.running.is_some() || st.terminated.is_some());
    let before = s
        .last_state
        .as_ref()
        .is_some_and(|st| st.terminated.is_some());
    now || before || s.restart_count > 0
}

/// A container's environment variable as written in the spec.
enum EnvValue<'a> {
    Absent,
    Literal(&'a str),
    /// `valueFrom` (a ConfigMap, a field): not knowable from the spec.
    FromElsewhere,
}

fn env_value<'a>(c: &'a Container, var: &str) -> EnvValue<'a> {
    // The kubelet applies the last of duplicate names.
    match c.env.iter().flatten().rev().find(|e| e.name == var) {
        None => EnvValue::Absent,
        Some(e) if e.value_from.is_some() => EnvValue::FromElsewhere,
        Some(e) => EnvValue::Literal(e.value.as_deref().unwrap_or("")),
    }
}

/// The interception mode from every place Istio writes it: the annotation (written by the
/// injector with the CNI plugin), the proxy's `ISTIO_META_INTERCEPTION_MODE`, and istio-init's
/// `-m` argument (injection-template.yaml). `None` when none says: Istio's default, REDIRECT.
fn interception_modes<'a>(
    pod: &'a Pod,
    proxy: &'a Container,
    annotation: &dyn Fn(&str) -> Option<&'a String>,
) -> Vec<&'a str> {
    let mut modes = Vec::new();
    if let Some(m) = annotation(ANNOTATION_ISTIO_INTERCEPTION_MODE) {
        modes.push(m.as_str());
    }
    if let EnvValue::Literal(m) = env_value(proxy, ENV_INTERCEPTION_MODE) {
        modes.push(m);
    }
    let inits = pod.spec.as_ref().and_then(|s| s.init_containers.as_ref());
    for init in inits.into_iter().flatten() {
        let args = init.args.iter().flatten().map(String::as_str);
        let mut args = args.peekable();
        if args.peek() != Some(&"istio-iptables") {
            continue;
        }
        let args: Vec<&str> = args.collect();
        for pair in args.windows(2) {
            if pair[0] == "-m" || pair[0] == "--istio-inbound-interception-mode" {
                modes.push(pair[1]);
            }
        }
    }
    modes
}

#[cfg(test)]
pub(crate) mod tests;
