//! The pod as the API server would show it: the kubelet stand-in keeps a [`PodView`] per pod and
//! [`PodView::to_pod`] turns it into a real `k8s_openapi` `Pod` (metadata, spec, status), which
//! [`write_atomic`] puts into the pods directory as `<namespace>_<name>.json`.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, ContainerRestartRule, ContainerRestartRuleOnExitCodes,
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, EnvVar, ExecAction, HTTPGetAction, Lifecycle, LifecycleHandler, Pod,
    PodCondition, PodIP, PodSpec as K8sPodSpec, PodStatus, Probe, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;

use super::spec::PodSpec;

/// The proxy container's name.
pub const PROXY_CONTAINER: &str = "istio-proxy";
/// The init container's name.
pub const INIT_CONTAINER: &str = "istio-init";
/// The injected init step's name in Istio CNI mode (it only validates the CNI's rules).
pub const VALIDATION_CONTAINER: &str = "istio-validation";
/// The proxy image (what Istio injects).
pub const PROXY_IMAGE: &str = "docker.io/istio/proxyv2:1.28.0";
/// Istio's native-sidecar preStop hook on `istio-proxy` (injection-template.yaml: "preStop is
/// called when the pod starts shutdown. Initialize drain. We will get SIGTERM once applications
/// are torn down."): pilot-agent's `/drain` on its status port.
pub const PRE_STOP_DRAIN: [&str; 5] = [
    "pilot-agent",
    "request",
    "--debug-port=15020",
    "POST",
    "drain",
];
/// The volumes Istio's sidecar template injects, as the status annotation lists them.
const ISTIO_VOLUMES: [&str; 9] = [
    "workload-socket",
    "credential-socket",
    "workload-certs",
    "istio-envoy",
    "istio-data",
    "istio-podinfo",
    "istio-token",
    "istiod-ca-cert",
    "istio-ca-crl",
];
/// The app image (a stand-in name).
pub const APP_IMAGE: &str = "ghcr.io/holdfast-mesh/sim-app:latest";

/// The current time as a `Timestamp` (k8s-openapi builds jiff without `std`, so no `now()`).
pub fn now_ts() -> Timestamp {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp::new(d.as_secs() as i64, d.subsec_nanos() as i32).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// A container's lifecycle state.
#[derive(Debug, Clone, PartialEq)]
pub enum CState {
    Waiting { reason: String },
    Running { started_at: Timestamp },
    Terminated(Terminated),
}

/// A finished container run.
#[derive(Debug, Clone, PartialEq)]
pub struct Terminated {
    pub container_id: String,
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub reason: String,
    pub started_at: Timestamp,
    pub finished_at: Timestamp,
}

/// What the kubelet's probes said about a probed container's current run ([`PodSpec::proxy_probes`]):
/// `started` by the startup probe, `ready` by the readiness probe (kubelet's
/// `prober_manager.go` `UpdatePodStatus`: a container is started once its startup probe
/// succeeded, and ready only by its readiness probe, which runs only once started).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeState {
    pub started: bool,
    pub ready: bool,
}

/// One container's status, as kubelet tracks it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerView {
    pub name: String,
    pub image: String,
    /// 64 hex chars; `None` before the first start.
    pub id: Option<String>,
    /// The container's main process, while it runs.
    pub pid: Option<u32>,
    pub state: CState,
    pub restart_count: u32,
    pub last: Option<Terminated>,
    /// The probes' view of the current run, for a probed container (`None`: not probed; it
    /// counts as started and ready while it runs).
    pub probed: Option<ProbeState>,
}

impl ContainerView {
    pub fn new(name: &str, image: &str, reason: &str) -> ContainerView {
        ContainerView {
            name: name.to_string(),
            image: image.to_string(),
            id: None,
            pid: None,
            state: CState::Waiting {
                reason: reason.to_string(),
            },
            restart_count: 0,
            last: None,
            probed: None,
        }
    }

    pub fn is_running(&self) -> bool {
        matches!(self.state, CState::Running { .. })
    }

    /// Running and, if probed, its startup probe succeeded (`status.started`).
    pub fn is_started(&self) -> bool {
        self.is_running() && self.probed.is_none_or(|p| p.started)
    }

    /// Running and, if probed, its readiness probe succeeded (`status.ready`).
    pub fn is_ready(&self) -> bool {
        self.is_running() && self.probed.is_none_or(|p| p.ready)
    }

    /// The container's last exit (now terminated, or before a restart), if any.
    pub fn last_exit(&self) -> Option<&Terminated> {
        match &self.state {
            CState::Terminated(t) => Some(t),
            _ => self.last.as_ref(),
        }
    }

    /// The last exit code, if the container has terminated (now or before a restart).
    pub fn exit_code(&self) -> Option<i32> {
        match &self.state {
            CState::Terminated(t) => Some(t.exit_code),
            _ => self.last.as_ref().map(|t| t.exit_code),
        }
    }
}

/// Pod phase, as the API defines it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl PodPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            PodPhase::Pending => "Pending",
            PodPhase::Running => "Running",
            PodPhase::Succeeded => "Succeeded",
            PodPhase::Failed => "Failed",
        }
    }
}

/// Everything the kubelet stand-in knows about a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodView {
    pub spec: PodSpec,
    pub uid: String,
    pub node_name: String,
    pub node_ip: Ipv4Addr,
    pub pod_ip: Ipv4Addr,
    /// The pod's IPv6 address, when its spec asks for IPv6.
    pub pod_ip6: Option<Ipv6Addr>,
    pub created_at: Timestamp,
    /// Set once the sandbox exists (the pod's IP is then assigned).
    pub sandbox_ready: bool,
    pub sandbox_pid: Option<u32>,
    pub start_time: Option<Timestamp>,
    /// `metadata.deletionTimestamp`: as the API server sets it for pods, the deletion request's
    /// time plus the grace period (when the pod is due to be gone).
    pub deletion_at: Option<Timestamp>,
    /// `None` until kubelet starts the init container (no statuses before that).
    pub init: Option<ContainerView>,
    /// The user init container ([`PodSpec::user_init`]), once started.
    pub user_init: Option<ContainerView>,
    /// In spec order: the app, then `istio-proxy` (where Istio's injector appends it). A native
    /// sidecar pod has only the app here: its proxy is [`PodView::sidecar`].
    pub containers: Vec<ContainerView>,
    /// The native sidecar: `istio-proxy` as a restartable init container, reported in
    /// `status.initContainerStatuses` after the injected init step. `None` for classic pods.
    pub sidecar: Option<ContainerView>,
    /// The pod failed in a way that stops it (init failure).
    pub failed_reason: Option<String>,
    /// The pod object is gone from the API (deleted and all containers stopped).
    pub gone: bool,
    /// The condition `AllContainersRestarting` (KEP-5532), once the kubelet has restarted the
    /// pod in place: `True` while the old containers are killed, `False` after.
    pub all_containers_restarting: Option<bool>,
}

impl PodView {
    /// Regular container `i` exited (`t`): as kubelet, restart it after its back-off (`base`,
    /// doubling per restart, capped at 5 minutes) if the pod's restart policy says so and the
    /// pod is not going away, else it stays terminated. Returns the back-off of a restart.
    pub(crate) fn container_exited(
        &mut self,
        i: usize,
        t: Terminated,
        deleting: bool,
        base: std::time::Duration,
    ) -> Option<std::time::Duration> {
        let restarts = self.spec.restarts(&self.containers[i].name, t.exit_code);
        let c = &mut self.containers[i];
        c.pid = None;
        if !deleting && restarts {
            let backoff = base
                .saturating_mul(1u32 << c.restart_count.min(5))
                .min(std::time::Duration::from_secs(300));
            c.last = Some(t);
            c.state = CState::Waiting {
                reason: "CrashLoopBackOff".into(),
            };
            Some(backoff)
        } else {
            c.state = CState::Terminated(t);
            None
        }
    }

    /// A freshly scheduled pod: no sandbox, no statuses.
    pub fn new(
        spec: PodSpec,
        uid: String,
        node_name: &str,
        node_ip: Ipv4Addr,
        pod_ip: Ipv4Addr,
    ) -> PodView {
        let mut containers = vec![ContainerView::new(
            &spec.app_name,
            APP_IMAGE,
            "PodInitializing",
        )];
        let proxy = ContainerView::new(
            spec.proxy_container(),
            spec.mesh.proxy_image(),
            "PodInitializing",
        );
        let sidecar = if spec.is_native() {
            Some(proxy)
        } else {
            containers.push(proxy);
            None
        };
        let pod_ip6 = spec
            .ip_families
            .has_ipv6()
            .then(|| super::netns::pod_ip6(pod_ip));
        PodView {
            spec,
            uid,
            node_name: node_name.to_string(),
            node_ip,
            pod_ip,
            pod_ip6,
            created_at: now_ts(),
            sandbox_ready: false,
            sandbox_pid: None,
            start_time: None,
            deletion_at: None,
            init: None,
            user_init: None,
            containers,
            sidecar,
            failed_reason: None,
            gone: false,
            all_containers_restarting: None,
        }
    }

    /// File name in the pods directory.
    pub fn file_name(&self) -> String {
        format!("{}_{}.json", self.spec.namespace, self.spec.name)
    }

    /// The container named `name` (init container included).
    pub fn container(&self, name: &str) -> Option<&ContainerView> {
        self.containers
            .iter()
            .chain(self.sidecar.iter())
            .chain(self.init.iter())
            .chain(self.user_init.iter())
            .find(|c| c.name == name)
    }

    pub fn app(&self) -> Option<&ContainerView> {
        self.container(&self.spec.app_name)
    }

    pub fn proxy(&self) -> Option<&ContainerView> {
        self.container(self.spec.proxy_container())
    }

    /// The pod's `ContainersReady` (and `Ready`) condition: every regular container ready and,
    /// for a native sidecar, the sidecar too (kubelet's `status/generate.go` counts restartable
    /// init containers in).
    pub fn containers_ready(&self) -> bool {
        (self.init.is_some() || self.user_init.is_some())
            && self.containers.iter().all(ContainerView::is_ready)
            && self.sidecar.as_ref().is_none_or(ContainerView::is_ready)
    }

    /// The pod's `Initialized` condition: every init container done and, for a native sidecar,
    /// its startup probe passed once (the app has been started since).
    fn initialized(&self) -> bool {
        self.init_done()
            && self
                .sidecar
                .as_ref()
                .is_none_or(|s| s.is_started() || self.containers.iter().any(|c| c.id.is_some()))
    }

    fn init_done(&self) -> bool {
        let done =
            |c: &ContainerView| matches!(&c.state, CState::Terminated(t) if t.exit_code == 0);
        self.init.as_ref().is_some_and(done)
            && (self.spec.user_init.is_none() || self.user_init.as_ref().is_some_and(done))
    }

    /// The injected init step's name: `istio-validation` in CNI mode, else `istio-init`.
    pub fn init_name(&self) -> &'static str {
        if self.spec.mesh != super::mesh::Mesh::Istio {
            return self.spec.mesh.init_container();
        }
        if self.spec.cni {
            VALIDATION_CONTAINER
        } else {
            INIT_CONTAINER
        }
    }

    /// The pod's IPs in `status.podIPs` order (the first decides Envoy's admin address).
    pub fn pod_ips(&self) -> Vec<String> {
        let v4 = self.pod_ip.to_string();
        match (self.spec.ip_families, self.pod_ip6) {
            (super::spec::IpFamilies::V6, Some(v6)) => vec![v6.to_string()],
            (super::spec::IpFamilies::DualV6First, Some(v6)) => vec![v6.to_string(), v4],
            _ => vec![v4],
        }
    }

    /// The init containers in the order kubelet runs them: Istio's reorderPod
    /// (pkg/kube/inject/webhook.go) puts istio-init last ("so we do not blackhole init
    /// containers") and istio-validation first.
    fn init_specs(&self) -> Vec<Container> {
        let s = &self.spec;
        if s.mesh != super::mesh::Mesh::Istio {
            // Kuma's injector.go: kuma-init, then (native) kuma-sidecar, prepended; Consul's
            // consul-connect-inject-init. No user init containers on these shapes.
            let mut inits = vec![super::mesh::init_container(s)];
            if s.is_native() {
                inits.push(self.proxy_spec());
            }
            return inits;
        }
        let mut injected = Container {
            name: self.init_name().into(),
            image: Some(PROXY_IMAGE.into()),
            args: Some(
                [
                    "istio-iptables",
                    "-p",
                    "15001",
                    "-z",
                    "15006",
                    "-u",
                    "1337",
                    "-m",
                    "REDIRECT",
                    "-i",
                    "*",
                    "-x",
                    "",
                    "-b",
                    "*",
                    "-d",
                    "15090,15021,15020",
                ]
                .map(String::from)
                .to_vec(),
            ),
            env: self.proxy_metadata_env(),
            ..Container::default()
        };
        if s.cni {
            if let Some(args) = injected.args.as_mut() {
                args.extend(["--run-validation", "--skip-rule-apply"].map(String::from));
            }
        }
        let user = s.user_init.as_ref().map(|u| Container {
            name: u.name.clone(),
            image: Some(APP_IMAGE.into()),
            ..Container::default()
        });
        if s.is_native() {
            // reorderPod with a native sidecar: "{istio-init/istio-validation} => proxy => rest".
            let mut inits = vec![injected, self.proxy_spec()];
            inits.extend(user);
            return inits;
        }
        match (s.cni, user) {
            (_, None) => vec![injected],
            (true, Some(u)) => vec![injected, u],
            (false, Some(u)) => vec![u, injected],
        }
    }

    /// The `istio-proxy` container as Istio 1.28's injection template renders it (the fields the
    /// kubelet and holdfast act on). A native sidecar follows the golden file
    /// `pkg/kube/inject/testdata/inject/native-sidecar.yaml.injected` (istio/istio 1.28.0;
    /// template `manifests/charts/istio-control/istio-discovery/files/injection-template.yaml`):
    /// `restartPolicy: Always`, the preStop `pilot-agent request --debug-port=15020 POST drain`
    /// (replaced by `global.proxy.lifecycle` when the mesh sets one), startupProbe `GET
    /// /healthz/ready` on 15021 every 1 s (failureThreshold 600, timeout 3 s) and readinessProbe
    /// the same every 15 s (failureThreshold 4). A classic proxy gets the same probes (the
    /// template renders them for both) when the sim probes it ([`PodSpec::proxy_probes`]).
    fn proxy_spec(&self) -> Container {
        let s = &self.spec;
        if s.mesh != super::mesh::Mesh::Istio {
            return super::mesh::proxy_container(s);
        }
        let probe = |period: i32, failures: i32| Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/healthz/ready".into()),
                port: IntOrString::Int(i32::from(super::istio_init::HEALTH_PORT)),
                ..HTTPGetAction::default()
            }),
            period_seconds: Some(period),
            timeout_seconds: Some(3),
            failure_threshold: Some(failures),
            ..Probe::default()
        };
        let probed = s.proxy_probes || s.is_native();
        let lifecycle = if s.istio_pre_stop() {
            Some(Lifecycle {
                pre_stop: Some(LifecycleHandler {
                    exec: Some(ExecAction {
                        command: Some(PRE_STOP_DRAIN.map(String::from).to_vec()),
                    }),
                    ..LifecycleHandler::default()
                }),
                ..Lifecycle::default()
            })
        } else if s.is_native() && s.lifecycle_override {
            // `global.proxy.lifecycle` replaces Istio's hook; the sim's override has no hooks.
            Some(Lifecycle::default())
        } else {
            None
        };
        Container {
            name: PROXY_CONTAINER.into(),
            image: Some(PROXY_IMAGE.into()),
            restart_policy: s.is_native().then(|| "Always".to_string()),
            args: Some(if s.is_native() {
                [
                    "proxy",
                    "sidecar",
                    "--domain",
                    "$(POD_NAMESPACE).svc.cluster.local",
                ]
                .map(String::from)
                .to_vec()
            } else {
                ["proxy", "sidecar"].map(String::from).to_vec()
            }),
            env: self.proxy_metadata_env(),
            lifecycle,
            ports: Some(vec![ContainerPort {
                container_port: 15090,
                name: Some("http-envoy-prom".into()),
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            }]),
            startup_probe: probed.then(|| probe(1, 600)),
            readiness_probe: probed.then(|| probe(15, 4)),
            security_context: Some(SecurityContext {
                run_as_user: Some(1337),
                run_as_group: Some(1337),
                run_as_non_root: s.is_native().then_some(true),
                read_only_root_filesystem: s.is_native().then_some(true),
                allow_privilege_escalation: s.is_native().then_some(false),
                privileged: s.is_native().then_some(false),
                capabilities: s.is_native().then(|| Capabilities {
                    drop: Some(vec!["ALL".into()]),
                    ..Capabilities::default()
                }),
                ..SecurityContext::default()
            }),
            ..Container::default()
        }
    }

    /// `ProxyConfig.ProxyMetadata` as the injection template sets it on istio-init and
    /// istio-proxy: `ISTIO_META_DNS_CAPTURE` with DNS capture, and `ISTIO_DUAL_STACK` for an
    /// IPv6-first dual-stack pod (what makes Istio bind Envoy's admin on `::1` there,
    /// pkg/bootstrap/config.go; the sim's Envoy does).
    fn proxy_metadata_env(&self) -> Option<Vec<EnvVar>> {
        let var = |name: &str| EnvVar {
            name: name.into(),
            value: Some("true".into()),
            ..EnvVar::default()
        };
        let mut env = Vec::new();
        if self.spec.dns_capture.is_some() {
            env.push(var("ISTIO_META_DNS_CAPTURE"));
        }
        if self.spec.ip_families == super::spec::IpFamilies::DualV6First {
            env.push(var("ISTIO_DUAL_STACK"));
        }
        (!env.is_empty()).then_some(env)
    }

    /// Whether kubelet would start this exited container again.
    pub fn will_restart(&self, c: &ContainerView) -> bool {
        match &c.state {
            CState::Terminated(t) => {
                self.deletion_at.is_none() && self.spec.restarts(&c.name, t.exit_code)
            }
            // Waiting after a run: in back-off, about to restart.
            CState::Waiting { .. } => c.restart_count > 0 || c.last.is_some(),
            CState::Running { .. } => false,
        }
    }

    /// The phase, by the API's rules: Pending until the containers have started; Succeeded or
    /// Failed once every container has terminated for good; Running otherwise.
    pub fn phase(&self) -> PodPhase {
        if self.failed_reason.is_some() {
            return PodPhase::Failed;
        }
        if !self.init_done() || self.containers.iter().any(|c| c.id.is_none()) {
            return PodPhase::Pending;
        }
        let all_done = self
            .containers
            .iter()
            .all(|c| matches!(c.state, CState::Terminated(_)) && !self.will_restart(c));
        // kubelet's getPhase (pkg/kubelet/kubelet_pods.go): a running restartable init container
        // keeps the pod Running; a terminated one (or one in back-off) is ignored, so a Job's pod
        // completes once its sidecar has been stopped.
        let sidecar_running = self.sidecar.as_ref().is_some_and(ContainerView::is_running);
        if !all_done || sidecar_running {
            return PodPhase::Running;
        }
        if self.containers.iter().all(|c| c.exit_code() == Some(0)) {
            PodPhase::Succeeded
        } else {
            PodPhase::Failed
        }
    }

    /// The `Pod` object.
    pub fn to_pod(&self) -> Pod {
        let s = &self.spec;
        let mut labels = BTreeMap::from([("app".to_string(), s.name.clone())]);
        let mut owner = None;
        if s.job {
            labels.insert("job-name".into(), s.name.clone());
            labels.insert("batch.kubernetes.io/job-name".into(), s.name.clone());
            owner = Some(vec![OwnerReference {
                api_version: "batch/v1".into(),
                kind: "Job".into(),
                name: s.name.clone(),
                uid: format!("job-{}", self.uid),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]);
        }
        let status_annotation = if s.is_native() {
            // As in the golden file: the proxy is named among the init containers, and
            // "containers" is null.
            format!(
                "{{\"initContainers\":[\"{}\",\"{PROXY_CONTAINER}\"],\"containers\":null,\"volumes\":[{}],\"imagePullSecrets\":null,\"revision\":\"default\"}}",
                self.init_name(),
                ISTIO_VOLUMES.map(|v| format!("\"{v}\"")).join(",")
            )
        } else {
            format!(
                "{{\"initContainers\":[\"{}\"],\"containers\":[\"{PROXY_CONTAINER}\"],\"volumes\":[],\"imagePullSecrets\":null,\"revision\":\"default\"}}",
                self.init_name()
            )
        };
        let mut annotations = BTreeMap::new();
        if s.mesh == super::mesh::Mesh::Istio {
            annotations.insert("sidecar.istio.io/status".to_string(), status_annotation);
        }
        let (mesh_annotations, mesh_labels) = super::mesh::injected_metadata(s);
        for (k, v) in mesh_annotations {
            annotations.insert(k.to_string(), v);
        }
        for (k, v) in mesh_labels {
            labels.insert(k.to_string(), v);
        }
        if !s.holdfast_enabled {
            annotations.insert(
                holdfast::config::ANNOTATION_ENABLED.to_string(),
                "false".to_string(),
            );
        }
        if let Some(t) = s.hold_timeout {
            annotations.insert(
                holdfast::config::ANNOTATION_HOLD_TIMEOUT.to_string(),
                holdfast::config::format_duration(t),
            );
        }
        for (k, v) in &s.annotations {
            annotations.insert(k.clone(), v.clone());
        }
        let grace_secs = s.grace.as_secs() as i64;
        let metadata = ObjectMeta {
            name: Some(s.name.clone()),
            namespace: Some(s.namespace.clone()),
            uid: Some(self.uid.clone()),
            creation_timestamp: Some(Time(self.created_at)),
            deletion_timestamp: self.deletion_at.map(Time),
            deletion_grace_period_seconds: self.deletion_at.map(|_| grace_secs),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: owner,
            ..ObjectMeta::default()
        };
        let app_ports = s.serve.map(|p| {
            vec![ContainerPort {
                container_port: i32::from(p),
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            }]
        });
        let spec = K8sPodSpec {
            node_name: Some(self.node_name.clone()),
            restart_policy: Some(s.restart_policy.as_str().into()),
            termination_grace_period_seconds: Some(grace_secs),
            init_containers: Some(self.init_specs()),
            containers: {
                let mut containers = vec![Container {
                    name: s.app_name.clone(),
                    image: Some(APP_IMAGE.into()),
                    ports: app_ports,
                    // KEP-5307's example shape (k8s.io/api v0.35.4 core/v1 types.go).
                    restart_policy: (!s.app_restart_on.is_empty()).then(|| "Never".into()),
                    restart_policy_rules: (!s.app_restart_on.is_empty()).then(|| {
                        vec![ContainerRestartRule {
                            action: "Restart".into(),
                            exit_codes: Some(ContainerRestartRuleOnExitCodes {
                                operator: "In".into(),
                                values: Some(s.app_restart_on.clone()),
                            }),
                        }]
                    }),
                    ..Container::default()
                }];
                if !s.is_native() {
                    if matches!(s.mesh, super::mesh::Mesh::Kuma(_)) {
                        // Kuma's injector puts the classic sidecar first.
                        containers.insert(0, self.proxy_spec());
                    } else {
                        containers.push(self.proxy_spec());
                    }
                }
                containers
            },
            ..K8sPodSpec::default()
        };
        Pod {
            metadata,
            spec: Some(spec),
            status: Some(self.status()),
        }
    }

    fn status(&self) -> PodStatus {
        let phase = self.phase();
        let mut st = PodStatus {
            phase: Some(phase.as_str().into()),
            host_ip: Some(self.node_ip.to_string()),
            qos_class: Some("BestEffort".into()),
            ..PodStatus::default()
        };
        let cond = |t: &str, ok: bool| PodCondition {
            type_: t.into(),
            status: if ok { "True" } else { "False" }.into(),
            ..PodCondition::default()
        };
        let mut conditions = vec![cond("PodScheduled", true)];
        if self.sandbox_ready {
            st.pod_ip = Some(self.pod_ip.to_string());
            let ips = self.pod_ips();
            st.pod_ip = ips.first().cloned();
            st.pod_ips = Some(ips.into_iter().map(|ip| PodIP { ip }).collect());
            st.start_time = self.start_time.map(Time);
        }
        if self.init.is_some() || self.user_init.is_some() {
            let all_ready = self.containers_ready();
            conditions.push(cond("Initialized", self.initialized()));
            conditions.push(cond("ContainersReady", all_ready));
            conditions.push(cond("Ready", all_ready));
            // In run order (see `init_specs`); only those kubelet has started.
            let inits: Vec<&ContainerView> = if self.spec.cni || self.sidecar.is_some() {
                // A native sidecar's status is there from the start (waiting, then running):
                // kubelet reports every init container of the spec.
                self.init
                    .iter()
                    .chain(self.sidecar.iter())
                    .chain(self.user_init.iter())
                    .collect()
            } else {
                self.user_init.iter().chain(self.init.iter()).collect()
            };
            st.init_container_statuses = Some(
                inits
                    .into_iter()
                    .map(|c| {
                        let mut status = container_status(c);
                        // kubelet reports a successfully completed init container as ready.
                        status.ready |=
                            matches!(&c.state, CState::Terminated(t) if t.exit_code == 0);
                        status
                    })
                    .collect(),
            );
            st.container_statuses = Some(self.containers.iter().map(container_status).collect());
        }
        if let Some(on) = self.all_containers_restarting {
            // kubernetes/kubernetes pkg/kubelet/status/generate.go
            // `GenerateAllContainersRestartingCondition`.
            let mut c = cond("AllContainersRestarting", on);
            if on {
                c.reason = Some("RestartAllContainersStarted".into());
                c.message = Some("container exited with restart policy rule".into());
            }
            conditions.push(c);
        }
        st.conditions = Some(conditions);
        st.reason = self.failed_reason.clone();
        st
    }
}

fn terminated_state(t: &Terminated) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            container_id: Some(format!("containerd://{}", t.container_id)),
            exit_code: t.exit_code,
            signal: t.signal,
            reason: Some(t.reason.clone()),
            started_at: Some(Time(t.started_at)),
            finished_at: Some(Time(t.finished_at)),
            message: None,
        }),
        ..ContainerState::default()
    }
}

fn container_status(c: &ContainerView) -> ContainerStatus {
    let state = match &c.state {
        CState::Waiting { reason } => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.clone()),
                message: None,
            }),
            ..ContainerState::default()
        },
        CState::Running { started_at } => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(*started_at)),
            }),
            ..ContainerState::default()
        },
        CState::Terminated(t) => terminated_state(t),
    };
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone(),
        image_id: String::new(),
        container_id: c.id.as_ref().map(|id| format!("containerd://{id}")),
        // kubelet reports a successfully completed init container as ready.
        ready: c.is_ready()
            || (c.name == INIT_CONTAINER
                && matches!(&c.state, CState::Terminated(t) if t.exit_code == 0)),
        started: Some(c.is_started()),
        restart_count: c.restart_count as i32,
        state: Some(state),
        last_state: c.last.as_ref().map(terminated_state),
        ..ContainerStatus::default()
    }
}

/// Writes `pod` as JSON to `dir/<file>` atomically: a dotfile first, then a rename, so a reader
/// never sees half a file.
pub fn write_atomic(dir: &Path, file: &str, pod: &Pod) -> std::io::Result<PathBuf> {
    let text = serde_json::to_vec_pretty(pod).map_err(std::io::Error::other)?;
    let tmp = dir.join(format!(".{file}.tmp"));
    let dst = dir.join(file);
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &dst)?;
    Ok(dst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::spec::AppScript;

    fn view() -> PodView {
        PodView::new(
            PodSpec::new("web").app(AppScript::Idle).serve(8080),
            "0b7c6f1e-3d2a-4c55-9a57-3f1f6b0e9d11".into(),
            "node-a",
            Ipv4Addr::new(198, 18, 0, 254),
            Ipv4Addr::new(198, 18, 1, 4),
        )
    }

    fn running() -> CState {
        CState::Running {
            started_at: now_ts(),
        }
    }

    #[test]
    fn scheduled_pod_has_no_container_statuses() {
        let pod = view().to_pod();
        let st = pod.status.expect("status");
        assert_eq!(st.phase.as_deref(), Some("Pending"));
        assert!(st.container_statuses.is_none());
        assert!(st.pod_ip.is_none());
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.containers[1].name, "istio-proxy");
        assert_eq!(spec.init_containers.expect("init")[0].name, "istio-init");
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(
            pod.metadata.uid.as_deref(),
            Some("0b7c6f1e-3d2a-4c55-9a57-3f1f6b0e9d11")
        );
    }

    #[test]
    fn running_pod_shows_containerd_ids_and_phase() {
        let mut v = view();
        v.sandbox_ready = true;
        let mut init = ContainerView::new(INIT_CONTAINER, PROXY_IMAGE, "");
        let now = now_ts();
        init.id = Some("a".repeat(64));
        init.state = CState::Terminated(Terminated {
            container_id: "a".repeat(64),
            exit_code: 0,
            signal: None,
            reason: "Completed".into(),
            started_at: now,
            finished_at: now,
        });
        v.init = Some(init);
        for (i, c) in v.containers.iter_mut().enumerate() {
            c.id = Some(format!("{i}").repeat(64));
            c.state = running();
        }
        assert_eq!(v.phase(), PodPhase::Running);
        let json = serde_json::to_value(v.to_pod()).expect("json");
        assert_eq!(json["status"]["phase"], "Running");
        assert_eq!(json["status"]["podIP"], "198.18.1.4");
        let cid = json["status"]["containerStatuses"][1]["containerID"]
            .as_str()
            .expect("string");
        assert_eq!(cid, format!("containerd://{}", "1".repeat(64)));
        assert!(
            json["status"]["containerStatuses"][0]["state"]["running"]["startedAt"].is_string()
        );
        assert_eq!(
            json["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"],
            0
        );

        // Job semantics: app exits 0, proxy keeps running → still Running.
        let mut job = v.clone();
        job.spec = job.spec.job();
        job.containers[0].state = CState::Terminated(Terminated {
            container_id: "0".repeat(64),
            exit_code: 0,
            signal: None,
            reason: "Completed".into(),
            started_at: now,
            finished_at: now,
        });
        assert_eq!(job.phase(), PodPhase::Running);
        let mut done = job.clone();
        done.containers[1].state = CState::Terminated(Terminated {
            container_id: "1".repeat(64),
            exit_code: 0,
            signal: None,
            reason: "Completed".into(),
            started_at: now,
            finished_at: now,
        });
        assert_eq!(done.phase(), PodPhase::Succeeded);
        let json = serde_json::to_value(done.to_pod()).expect("json");
        assert_eq!(json["metadata"]["labels"]["job-name"], "web");
        assert_eq!(json["metadata"]["ownerReferences"][0]["kind"], "Job");
    }

    /// The agent tracks the simulated pod as a classic sidecar pod: it carries what Istio's
    /// injector writes (the `sidecar.istio.io/status` annotation naming istio-init, `proxy
    /// sidecar`, istio-init's `-m REDIRECT`), so the e2e tests exercise the real tracking rules.
    #[test]
    fn the_agent_tracks_the_simulated_pod() {
        let pod = view().to_pod();
        let tracked = holdfast::pod::PodView::from_pod(
            &pod,
            "node-a",
            &holdfast::config::ProxyConfig::default(),
            &holdfast::config::HoldSettings::default(),
        );
        let tracked = tracked.unwrap_or_else(|why| panic!("the sim's pod is not tracked: {why}"));
        assert!(tracked.overrides.problems.is_empty());
        assert!(
            tracked.init_containers.iter().all(|c| !c.has_run()),
            "istio-init has not run yet"
        );
    }

    /// `want` is a part of `got`: every key of an object, every element of an array (in order).
    fn assert_subset(want: &serde_json::Value, got: &serde_json::Value, at: &str) {
        use serde_json::Value;
        match (want, got) {
            (Value::Object(w), Value::Object(g)) => {
                for (k, v) in w {
                    let gv = g
                        .get(k)
                        .unwrap_or_else(|| panic!("{at}.{k} missing in {got}"));
                    assert_subset(v, gv, &format!("{at}.{k}"));
                }
            }
            (Value::Array(w), Value::Array(g)) => {
                assert!(w.len() <= g.len(), "{at}: {g:?} has fewer than {w:?}");
                for (i, (v, gv)) in w.iter().zip(g).enumerate() {
                    assert_subset(v, gv, &format!("{at}[{i}]"));
                }
            }
            _ => assert_eq!(want, got, "at {at}"),
        }
    }

    fn native_view() -> PodView {
        PodView::new(
            PodSpec::new("hello").app_name("hello").native(),
            "0b7c6f1e-3d2a-4c55-9a57-3f1f6b0e9d12".into(),
            "node-a",
            Ipv4Addr::new(198, 18, 0, 254),
            Ipv4Addr::new(198, 18, 1, 5),
        )
    }

    /// Consul's native sidecar as consul-k8s 1.9+ injects it (`sim::mesh::proxy_container`):
    /// `consul-dataplane` appended to the init containers after `consul-connect-inject-init`,
    /// `restartPolicy: Always`, the exec startup probe, no preStop; the app alone in containers.
    #[test]
    fn the_native_consul_pod_has_the_injectors_shape() {
        let v = PodView::new(
            PodSpec::new("web").mesh(crate::sim::Mesh::Consul).native(),
            "5d0c7c1e-3d2a-4c55-9a57-3f1f6b0e9d12".into(),
            "node-a",
            Ipv4Addr::new(198, 18, 0, 254),
            Ipv4Addr::new(198, 18, 1, 6),
        );
        let pod = v.to_pod();
        let spec = pod.spec.expect("spec");
        let inits = spec.init_containers.expect("init containers");
        let names: Vec<&str> = inits.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["consul-connect-inject-init", "consul-dataplane"]);
        let dp = &inits[1];
        assert_eq!(dp.restart_policy.as_deref(), Some("Always"));
        let startup = dp.startup_probe.as_ref().expect("startup probe");
        assert_eq!(
            startup.exec.as_ref().and_then(|e| e.command.clone()),
            Some(vec![
                "/usr/local/bin/consul-dataplane".to_string(),
                "-check-proxy-health".to_string()
            ])
        );
        assert_eq!(
            (startup.period_seconds, startup.failure_threshold),
            (Some(1), Some(10))
        );
        assert!(dp.lifecycle.is_none(), "no preStop: {:?}", dp.lifecycle);
        assert!(inits[0].restart_policy.is_none());
        let apps: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
        assert!(!apps.contains(&"consul-dataplane"), "{apps:?}");
        // A dual-stack install's admin on ::1 fails the probe's 127.0.0.1: not simulated.
        assert!(PodSpec::new("d")
            .mesh(crate::sim::Mesh::Consul)
            .consul_dual_stack()
            .ip_families(crate::sim::IpFamilies::DualV6First)
            .native()
            .conflict()
            .is_some());
    }

    /// The key fields of Istio 1.28.0's golden file for a native sidecar,
    /// `pkg/kube/inject/testdata/inject/native-sidecar.yaml.injected` (the injector's expected
    /// output from `manifests/charts/istio-control/istio-discovery/files/injection-template.yaml`),
    /// transcribed: what the kubelet and holdfast act on. The simulated node renders the same.
    #[test]
    fn the_native_pod_has_the_shape_of_istios_golden_file() {
        let golden = serde_json::json!({
            "spec": {
                "containers": [{ "name": "hello" }],
                "initContainers": [
                    {
                        "name": "istio-init",
                        "args": ["istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337",
                                 "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*",
                                 "-d", "15090,15021,15020"]
                    },
                    {
                        "name": "istio-proxy",
                        "restartPolicy": "Always",
                        "args": ["proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local"],
                        "lifecycle": { "preStop": { "exec": { "command":
                            ["pilot-agent", "request", "--debug-port=15020", "POST", "drain"] } } },
                        "ports": [{ "containerPort": 15090, "name": "http-envoy-prom", "protocol": "TCP" }],
                        "readinessProbe": {
                            "failureThreshold": 4,
                            "httpGet": { "path": "/healthz/ready", "port": 15021 },
                            "periodSeconds": 15,
                            "timeoutSeconds": 3
                        },
                        "startupProbe": {
                            "failureThreshold": 600,
                            "httpGet": { "path": "/healthz/ready", "port": 15021 },
                            "periodSeconds": 1,
                            "timeoutSeconds": 3
                        },
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "capabilities": { "drop": ["ALL"] },
                            "privileged": false,
                            "readOnlyRootFilesystem": true,
                            "runAsGroup": 1337,
                            "runAsNonRoot": true,
                            "runAsUser": 1337
                        }
                    }
                ]
            }
        });
        let got = serde_json::to_value(native_view().to_pod()).expect("json");
        assert_subset(&golden, &got, "pod");
        let spec = &got["spec"];
        assert_eq!(spec["containers"].as_array().map(Vec::len), Some(1));
        assert_eq!(spec["initContainers"].as_array().map(Vec::len), Some(2));
        // The annotation names the proxy among the init containers, and no containers.
        let status: serde_json::Value = serde_json::from_str(
            got["metadata"]["annotations"]["sidecar.istio.io/status"]
                .as_str()
                .expect("status annotation"),
        )
        .expect("annotation is JSON");
        assert_eq!(
            status["initContainers"],
            serde_json::json!(["istio-init", "istio-proxy"])
        );
        assert_eq!(status["containers"], serde_json::Value::Null);
        assert_eq!(status["volumes"].as_array().map(Vec::len), Some(9));
        // With `global.proxy.lifecycle` set, Istio's preStop is gone.
        let mut v = native_view();
        v.spec = v.spec.lifecycle_override(true);
        let got = serde_json::to_value(v.to_pod()).expect("json");
        assert!(got["spec"]["initContainers"][1]["lifecycle"]
            .get("preStop")
            .is_none());
        // A classic pod keeps its shape: the proxy among the containers, no probes unless asked.
        let classic = serde_json::to_value(view().to_pod()).expect("json");
        assert_eq!(classic["spec"]["containers"][1]["name"], "istio-proxy");
        assert!(classic["spec"]["containers"][1]
            .get("startupProbe")
            .is_none());
        assert!(classic["spec"]["containers"][1]
            .get("restartPolicy")
            .is_none());
    }

    fn finished(code: i32) -> CState {
        let now = now_ts();
        CState::Terminated(Terminated {
            container_id: "f".repeat(64),
            exit_code: code,
            signal: None,
            reason: "Completed".into(),
            started_at: now,
            finished_at: now,
        })
    }

    /// The kubelet reports a native sidecar among the init container statuses, with `started`
    /// from its startup probe and `ready` from its readiness probe, and counts it in the pod's
    /// Ready condition; the phase follows the regular containers (kubelet's getPhase).
    #[test]
    fn native_sidecar_status_and_phase_follow_the_kubelet() {
        let mut v = native_view();
        v.sandbox_ready = true;
        let mut init = ContainerView::new(INIT_CONTAINER, PROXY_IMAGE, "");
        init.id = Some("a".repeat(64));
        init.state = finished(0);
        v.init = Some(init);
        // Before the sidecar starts: its status is there, waiting.
        let st = v.to_pod().status.expect("status");
        let inits = st.init_container_statuses.expect("init statuses");
        assert_eq!(inits[1].name, "istio-proxy");
        assert!(inits[1]
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .is_some());
        assert_eq!(v.phase(), PodPhase::Pending);
        // Running, startup probe not passed yet: not started, not ready, app not started.
        let sidecar = v.sidecar.as_mut().expect("sidecar");
        sidecar.id = Some("b".repeat(64));
        sidecar.state = running();
        sidecar.probed = Some(ProbeState::default());
        let st = v.to_pod().status.expect("status");
        let proxy = &st.init_container_statuses.expect("init")[1];
        assert_eq!((proxy.started, proxy.ready), (Some(false), false));
        assert_eq!(v.phase(), PodPhase::Pending);
        // Started and ready, the app running: the pod is Running and Ready.
        v.sidecar.as_mut().expect("sidecar").probed = Some(ProbeState {
            started: true,
            ready: true,
        });
        v.containers[0].id = Some("c".repeat(64));
        v.containers[0].state = running();
        assert_eq!(v.phase(), PodPhase::Running);
        assert!(v.containers_ready());
        let json = serde_json::to_value(v.to_pod()).expect("json");
        let ready = json["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned())
            .expect("Ready condition");
        assert_eq!(ready["status"], "True");
        assert_eq!(
            json["status"]["containerStatuses"].as_array().map(Vec::len),
            Some(1)
        );
        // The sidecar in back-off while the app runs: Running, not Ready.
        let mut backoff = v.clone();
        let s = backoff.sidecar.as_mut().expect("sidecar");
        s.state = CState::Waiting {
            reason: "CrashLoopBackOff".into(),
        };
        s.last = Some(Terminated {
            container_id: "b".repeat(64),
            exit_code: 137,
            signal: Some(9),
            reason: "Error".into(),
            started_at: now_ts(),
            finished_at: now_ts(),
        });
        s.restart_count = 1;
        assert_eq!(backoff.phase(), PodPhase::Running);
        assert!(!backoff.containers_ready());
        // A Job: the app done, the sidecar still running → Running; once it is stopped →
        // Succeeded, whatever its own exit code.
        let mut job = v.clone();
        job.spec = job.spec.job();
        job.containers[0].state = finished(0);
        assert_eq!(job.phase(), PodPhase::Running);
        job.sidecar.as_mut().expect("sidecar").state = finished(137);
        assert_eq!(job.phase(), PodPhase::Succeeded);
    }

    #[test]
    fn atomic_write_leaves_no_dotfile() {
        let dir = std::env::temp_dir().join(format!("hf-podobj-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let v = view();
        let p = write_atomic(&dir, &v.file_name(), &v.to_pod()).expect("write");
        assert!(p.ends_with("default_web.json"));
        let back: Pod = serde_json::from_slice(&std::fs::read(&p).expect("read")).expect("parse");
        assert_eq!(back.metadata.name.as_deref(), Some("web"));
        let names: Vec<_> = std::fs::read_dir(&dir)
            .expect("ls")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 1);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
