//! What the agent needs to know about one Kubernetes Pod, read defensively from the API object,
//! and whether holdfast acts on it at all.
//!
//! A `Pod` from the API server (or a pods directory) may be incomplete at any stage: no status
//! yet, no container ids yet, missing fields in a hand-written file. Everything here returns a
//! safe answer for such objects instead of failing.
//!
//! holdfast acts only on **sidecar pods of a mesh it knows** (see `NotTracked` for every way
//! out): the mesh's injector marked the pod, its proxy runs as a sidecar (a regular container
//! next to at least one other, or a native sidecar) and its interception is REDIRECT. Which
//! mesh, and everything that mesh's injector wrote for this pod (ports, uid, admin address, its
//! switches), is read by the pod's [`MeshProfile`] (`crate::mesh`); this file reads what every
//! pod has: containers, statuses, IPs, deletion.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};

pub(crate) use crate::api::SidecarMode;
use k8s_openapi::jiff::Timestamp;

use crate::config::{HoldSettings, PodOverrides, ProxyConfig};
use crate::mesh::{PodReads, PodSwitches};

pub(crate) mod app_end;
mod shape;

pub(crate) use app_end::{app_end, AppContainerEnd, AppNow, ContainerRestart};
pub use app_end::{AppEnd, RestartPolicy};
pub(crate) use shape::NotTracked;

pub(crate) use crate::mesh::MeshProfile;

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
    pub(crate) fn app_end(&self) -> AppContainerEnd {
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
    /// The mesh's switches for this pod: DNS capture (`PodView::dns_capture`), the agent's
    /// exit on zero connections (`PodView::exit_on_zero`), dual stack (the admin bind of
    /// IPv6-first pods).
    pub switches: PodSwitches,
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
    /// `restarting_in_place`). Same sandbox, netns, IP and uid; init containers run again.
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
pub(crate) const ALL_CONTAINERS_RESTARTING: &str = "AllContainersRestarting";

/// Whether the pod's conditions say the kubelet is restarting every container in place.
pub(crate) fn restarting_in_place(conditions: &[k8s_openapi::api::core::v1::PodCondition]) -> bool {
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
            switches: PodSwitches::default(),
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
    pub(crate) fn is_terminal(&self) -> bool {
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
pub(crate) const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// Whether [`PodView::from_pod`] reads the annotation `key` (holdfast's own and the meshes'); the
/// pod source drops the others ([`crate::source::slim`]), so a pod's other annotations (labels'
/// cousins, `kubectl annotate` in a loop, megabytes of last-applied-configuration) cost nothing
/// past the source.
pub(crate) fn reads_annotation(key: &str) -> bool {
    crate::config::READ_ANNOTATIONS.contains(&key) || crate::mesh::READ_ANNOTATIONS.contains(&key)
}

/// Every label [`PodView::from_pod`] reads (the meshes' markers); the source drops the others.
pub(crate) const READ_LABELS: [&str; 2] = crate::mesh::READ_LABELS;

/// Every container environment variable [`PodView::from_pod`] reads (the meshes' switches); the
/// source drops the others.
pub(crate) const READ_ENV: [&str; 6] = crate::mesh::READ_ENV;

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
        let annotation_str = |k: &str| annotation(k).map(String::as_str);
        let switches = profile.read_pod(
            &PodReads {
                pod,
                proxy: proxy_container,
                annotation: &annotation_str,
            },
            &mut overrides.problems,
        );
        let prestop_drain = mode == SidecarMode::Native && profile.prestop_drain(proxy_container);

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
            switches,
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
    pub(crate) fn admin_tcp(&self) -> Option<SocketAddr> {
        self.profile.admin_tcp_for(self.admin_v6_loopback())
    }

    /// Whether the mesh's bootstrap binds the admin on `::1` for this pod's IPs.
    fn admin_v6_loopback(&self) -> bool {
        let all_v6 = !self.pod_ips.is_empty() && self.pod_ips.iter().all(IpAddr::is_ipv6);
        let first_v6 = self.pod_ips.first().is_some_and(IpAddr::is_ipv6);
        all_v6 || (first_v6 && self.switches.dual_stack)
    }

    /// [`PodView::admin_tcp`], or `proxy.admin` for a pod whose admin is a Unix socket
    /// (unused: its client connects to the socket).
    pub(crate) fn admin_addr(&self, proxy: &ProxyConfig) -> SocketAddr {
        self.admin_tcp().unwrap_or(proxy.admin)
    }

    /// Whether the pod has an IPv6 address (its IPv6 connections are then held too).
    pub(crate) fn has_ipv6(&self) -> bool {
        self.pod_ips.iter().any(IpAddr::is_ipv6)
    }

    /// Whether the mesh redirects the pod's DNS to its DNS proxy
    /// ([`MeshProfile::dns_port`]), so DNS is held too (each mesh's `read_pod` says where it
    /// reads the switch: Istio's `ISTIO_META_DNS_CAPTURE`, Kuma's `KUMA_DNS_ENABLED`).
    pub(crate) fn dns_capture(&self) -> bool {
        self.switches.dns_capture
    }

    /// Whether the mesh's agent ends Envoy on its own once no listener has an active connection
    /// (Istio's `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`: pilot-agent then ignores
    /// `terminationDrainDuration`, pkg/envoy/agent.go `terminate`).
    pub(crate) fn exit_on_zero(&self) -> bool {
        self.switches.exit_on_zero
    }

    /// The app containers: every regular container but the proxy, then the native sidecars
    /// other than the proxy (log shippers, collectors: `restartable: true`). Native sidecars are
    /// app for the drain's in-flight judgement — their connections go through Envoy — but the
    /// kubelet stops them only after every regular container, the proxy included, has exited:
    /// never wait for their processes to exit before quitting the proxy (that waits for the
    /// deadline). [`PodView::regular_app_containers`] leaves them out.
    pub(crate) fn app_containers(&self) -> impl Iterator<Item = &ContainerView> {
        self.regular_app_containers().chain(
            self.init_containers
                .iter()
                .filter(|c| c.restartable && !c.is_proxy),
        )
    }

    /// The regular (`spec.containers`) app containers: every one but the proxy.
    pub(crate) fn regular_app_containers(&self) -> impl Iterator<Item = &ContainerView> {
        self.containers.iter().filter(|c| !c.is_proxy)
    }

    /// The proxy container: a regular one (classic), or a restartable init container (native).
    pub(crate) fn proxy_container(&self) -> Option<&ContainerView> {
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
    pub(crate) fn containers_before_proxy_stops(&self) -> impl Iterator<Item = &ContainerView> {
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
    pub(crate) fn container_restart(&self, name: &str) -> ContainerRestart {
        self.containers
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.restart.clone())
            .unwrap_or_default()
    }

    /// How far the app is from finished by the Pod status alone ([`app_end()`]: the one rule).
    pub(crate) fn app_end_by_status(&self) -> AppEnd {
        app_end(
            self.restart_policy,
            self.regular_app_containers().map(ContainerView::app_end),
        )
    }

    /// True when every regular app container ran, has exited, and the kubelet will not restart
    /// any of them, so the pod only waits for its proxy: a finished Job (see [`app_end()`]).
    pub(crate) fn apps_finished_for_good(&self) -> bool {
        self.app_end_by_status() == AppEnd::ForGood
    }
}

/// What an operator should change when Envoy exited before the app was done (drain outcome
/// `proxy-gone-early`), in the words of the pod's mesh
/// ([`crate::mesh::proxy_gone_early_advice`]).
pub(crate) fn drain_advice(view: &PodView) -> String {
    crate::mesh::proxy_gone_early_advice(&view.profile, view.exit_on_zero())
}

/// The most problems one pod's view keeps (each cut to [`crate::api::text::MAX_POD_TEXT`]).
pub(crate) const MAX_POD_PROBLEMS: usize = 8;

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
pub(crate) fn strip_runtime_prefix(id: &str) -> Option<String> {
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

#[cfg(test)]
pub(crate) mod tests;
