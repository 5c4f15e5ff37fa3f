//! The pod as the API server would show it: the kubelet stand-in keeps a [`PodView`] per pod and
//! [`PodView::to_pod`] turns it into a real `k8s_openapi` `Pod` (metadata, spec, status), which
//! [`write_atomic`] puts into the pods directory as `<namespace>_<name>.json`.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, EnvVar, Pod, PodCondition, PodIP,
    PodSpec as K8sPodSpec, PodStatus, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
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
        }
    }

    pub fn is_running(&self) -> bool {
        matches!(self.state, CState::Running { .. })
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
    /// In spec order: the app, then `istio-proxy` (where Istio's injector appends it).
    pub containers: Vec<ContainerView>,
    /// The pod failed in a way that stops it (init failure).
    pub failed_reason: Option<String>,
    /// The pod object is gone from the API (deleted and all containers stopped).
    pub gone: bool,
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
        let policy = self.spec.restart_policy;
        let c = &mut self.containers[i];
        c.pid = None;
        if !deleting && policy.restarts(t.exit_code) {
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
        let containers = vec![
            ContainerView::new(&spec.app_name, APP_IMAGE, "PodInitializing"),
            ContainerView::new(PROXY_CONTAINER, PROXY_IMAGE, "PodInitializing"),
        ];
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
            failed_reason: None,
            gone: false,
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
            .chain(self.init.iter())
            .chain(self.user_init.iter())
            .find(|c| c.name == name)
    }

    pub fn app(&self) -> Option<&ContainerView> {
        self.container(&self.spec.app_name)
    }

    pub fn proxy(&self) -> Option<&ContainerView> {
        self.container(PROXY_CONTAINER)
    }

    fn init_done(&self) -> bool {
        let done =
            |c: &ContainerView| matches!(&c.state, CState::Terminated(t) if t.exit_code == 0);
        self.init.as_ref().is_some_and(done)
            && (self.spec.user_init.is_none() || self.user_init.as_ref().is_some_and(done))
    }

    /// The injected init step's name: `istio-validation` in CNI mode, else `istio-init`.
    pub fn init_name(&self) -> &'static str {
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
        match (s.cni, user) {
            (_, None) => vec![injected],
            (true, Some(u)) => vec![injected, u],
            (false, Some(u)) => vec![u, injected],
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
                self.deletion_at.is_none() && self.spec.restart_policy.restarts(t.exit_code)
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
        if !all_done {
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
        let mut annotations = BTreeMap::from([(
            "sidecar.istio.io/status".to_string(),
            format!(
                "{{\"initContainers\":[\"{}\"],\"containers\":[\"{PROXY_CONTAINER}\"],\"volumes\":[],\"imagePullSecrets\":null,\"revision\":\"default\"}}",
                self.init_name()
            ),
        )]);
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
            containers: vec![
                Container {
                    name: s.app_name.clone(),
                    image: Some(APP_IMAGE.into()),
                    ports: app_ports,
                    ..Container::default()
                },
                Container {
                    name: PROXY_CONTAINER.into(),
                    image: Some(PROXY_IMAGE.into()),
                    args: Some(["proxy", "sidecar"].map(String::from).to_vec()),
                    env: self.proxy_metadata_env(),
                    ports: Some(vec![ContainerPort {
                        container_port: 15090,
                        name: Some("http-envoy-prom".into()),
                        protocol: Some("TCP".into()),
                        ..ContainerPort::default()
                    }]),
                    security_context: Some(SecurityContext {
                        run_as_user: Some(1337),
                        run_as_group: Some(1337),
                        ..SecurityContext::default()
                    }),
                    ..Container::default()
                },
            ],
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
            let all_ready = self.containers.iter().all(ContainerView::is_running);
            conditions.push(cond("Initialized", self.init_done()));
            conditions.push(cond("ContainersReady", all_ready));
            conditions.push(cond("Ready", all_ready));
            // In run order (see `init_specs`); only those kubelet has started.
            let inits: Vec<&ContainerView> = if self.spec.cni {
                self.init.iter().chain(self.user_init.iter()).collect()
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
        ready: c.is_running()
            || (c.name == INIT_CONTAINER
                && matches!(&c.state, CState::Terminated(t) if t.exit_code == 0)),
        started: Some(c.is_running()),
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
        assert!(!tracked.init_done(), "istio-init has not run yet");
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
