//! The agent's DaemonSet pod on the containerd backend, run the way a kubelet runs it: the pod
//! template of the DaemonSet **as rendered from `manifests/`** (its image pinned by kustomize's
//! `images:` to the image pulled from the registry, [`super::agent_image`]) is turned into a
//! CRI sandbox and container config the way the kubelet's kuberuntime does it
//! (kubernetes/kubernetes pkg/kubelet/kuberuntime `kuberuntime_sandbox.go`
//! `generatePodSandboxConfig`, `kuberuntime_container.go` `generateContainerConfig`,
//! `kuberuntime_container_linux.go`, `security_context.go`; pkg/securitycontext `util.go`):
//!
//! - `hostPID` → pid namespace NODE, no `hostNetwork` → the pod's own netns (CNI);
//! - the container's and the pod's `securityContext`: capabilities, `runAsUser`,
//!   `readOnlyRootFilesystem`, `allowPrivilegeEscalation: false` → `no_new_privs`, `seccompProfile`
//!   (the container's over the pod's), SELinux options, AppArmor (the field or the
//!   `container.apparmor.security.beta.kubernetes.io/<name>` annotation), the default masked
//!   and read-only `/proc` paths;
//! - `env` (values, and the downward API's `fieldRef`), `$(VAR)` expanded in `args` and values
//!   as the kubelet expands them; no `command`, so the image's entrypoint runs;
//! - `volumeMounts` of `emptyDir` volumes (a tmpfs of `sizeLimit` for `medium: Memory`, as the
//!   kubelet mounts one), and the termination-message file;
//! - `resources`: the QoS class (Burstable) and its cgroup parent, CPU shares and quota, the
//!   memory limit;
//! - probes: the readiness probe (`httpGet`, port by name, path, timeout) gates "started", and
//!   the liveness probe must answer once the pod is ready.
//!
//! What stands in, and why (docs/containerd-backend.md): no API server exists here, so `--kube`
//! is replaced by `--pods-dir <the simulated node's pods dir>`, mounted read-only (the node's
//! Pod objects, the same source the kubelet stand-in writes); no service-account token or
//! service environment variables are injected; a test may append flags (`--hold-timeout 1s`),
//! as a kustomize patch would; the probes are polled every 100 ms rather than every
//! `periodSeconds`, so tests do not wait for the period; the container's log is
//! `<node work dir>/agent.log` (the kubelet's is `<pod log dir>/agent/<attempt>.log`); the
//! liveness probe does not restart the container (tests kill and restart it themselves).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_cri::v1::{
    security_profile::ProfileType, Capability, ContainerConfig, ContainerMetadata,
    ContainerStatusRequest, CreateContainerRequest, ImageSpec, Int64Value, KeyValue,
    LinuxContainerConfig, LinuxContainerResources, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, Mount, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, PodSandboxStatusRequest, RemoveContainerRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, SeLinuxOption, SecurityProfile,
    StartContainerRequest, StopContainerRequest, StopPodSandboxRequest,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, PodSpec, Probe, SecurityContext};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::kubelet::NODE_LABEL;
use super::runtime::Containerd;
use crate::sim::SimError;

/// The kubelet's default masked and read-only paths for a container that is not privileged
/// and has the default `procMount` (kubernetes pkg/securitycontext/util.go).
const DEFAULT_MASKED_PATHS: [&str; 11] = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
const DEFAULT_READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];
/// The AppArmor annotation's prefix (Kubernetes before 1.30; still honoured).
const APPARMOR_ANNOTATION: &str = "container.apparmor.security.beta.kubernetes.io/";
/// The container the DaemonSet runs the agent in.
pub const AGENT_CONTAINER: &str = "agent";

fn setup(msg: impl Into<String>) -> SimError {
    SimError::Setup(msg.into())
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> SimError {
    move |source| SimError::Io { what, source }
}

/// The DaemonSet's pod template, as rendered.
#[derive(Debug, Clone)]
pub struct AgentPodSpec {
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub pod: PodSpec,
    /// The container named `agent` (tests may change it, e.g. drop a capability).
    pub container: Container,
}

impl AgentPodSpec {
    /// From the rendered DaemonSet `holdfast-agent`.
    pub fn from_daemonset(ds: &serde_json::Value) -> Result<AgentPodSpec, SimError> {
        let ds: DaemonSet = serde_json::from_value(ds.clone())
            .map_err(|e| setup(format!("the rendered DaemonSet does not parse: {e}")))?;
        let meta = ds.metadata;
        let template = ds
            .spec
            .map(|s| s.template)
            .ok_or_else(|| setup("the DaemonSet has no spec.template"))?;
        let pod = template
            .spec
            .ok_or_else(|| setup("the DaemonSet's template has no spec"))?;
        let container = pod
            .containers
            .iter()
            .find(|c| c.name == AGENT_CONTAINER)
            .cloned()
            .ok_or_else(|| {
                setup(format!(
                    "the DaemonSet has no container `{AGENT_CONTAINER}`"
                ))
            })?;
        let tmeta = template.metadata.unwrap_or_default();
        Ok(AgentPodSpec {
            name: meta.name.unwrap_or_default(),
            namespace: meta.namespace.unwrap_or_else(|| "default".into()),
            labels: tmeta.labels.unwrap_or_default(),
            annotations: tmeta.annotations.unwrap_or_default(),
            pod,
            container,
        })
    }

    /// The image the container runs.
    pub fn image(&self) -> Result<&str, SimError> {
        self.container
            .image
            .as_deref()
            .ok_or_else(|| setup("the agent container has no image"))
    }

    fn security(&self) -> SecurityContext {
        self.container.security_context.clone().unwrap_or_default()
    }

    /// Capabilities the container adds (for tests and messages).
    pub fn cap_add(&self) -> Vec<String> {
        self.security()
            .capabilities
            .and_then(|c| c.add)
            .unwrap_or_default()
    }

    /// Removes an added capability (a test of what breaks without it).
    pub fn drop_added_capability(&mut self, cap: &str) {
        if let Some(c) = self
            .container
            .security_context
            .as_mut()
            .and_then(|s| s.capabilities.as_mut())
            .and_then(|c| c.add.as_mut())
        {
            c.retain(|x| x != cap);
        }
    }

    fn namespaces(&self) -> NamespaceOption {
        let mode = |host: bool, otherwise: NamespaceMode| {
            if host {
                NamespaceMode::Node as i32
            } else {
                otherwise as i32
            }
        };
        NamespaceOption {
            network: mode(self.pod.host_network == Some(true), NamespaceMode::Pod),
            pid: mode(self.pod.host_pid == Some(true), NamespaceMode::Container),
            ipc: mode(self.pod.host_ipc == Some(true), NamespaceMode::Pod),
            ..Default::default()
        }
    }

    /// The pod's seccomp profile (the sandbox's).
    fn pod_seccomp(&self) -> Option<SecurityProfile> {
        let p = self
            .pod
            .security_context
            .as_ref()?
            .seccomp_profile
            .clone()?;
        Some(seccomp_profile(p))
    }

    /// The container's seccomp profile, else the pod's (kubelet `getSeccompProfile`).
    fn seccomp(&self) -> Option<SecurityProfile> {
        let p = self.security().seccomp_profile.or_else(|| {
            self.pod
                .security_context
                .as_ref()
                .and_then(|s| s.seccomp_profile.clone())
        })?;
        Some(seccomp_profile(p))
    }

    /// The AppArmor profile: the container's field, the pod's, else the annotation.
    fn apparmor(&self) -> Option<(SecurityProfile, String)> {
        let field = self.security().app_armor_profile.or_else(|| {
            self.pod
                .security_context
                .as_ref()
                .and_then(|s| s.app_armor_profile.clone())
        });
        let (kind, localhost) = match field {
            Some(p) => (p.type_, p.localhost_profile.unwrap_or_default()),
            None => {
                let a = self
                    .annotations
                    .get(&format!("{APPARMOR_ANNOTATION}{}", self.container.name))?;
                match a.as_str() {
                    "unconfined" => ("Unconfined".to_string(), String::new()),
                    "runtime/default" => ("RuntimeDefault".to_string(), String::new()),
                    other => (
                        "Localhost".to_string(),
                        other.trim_start_matches("localhost/").to_string(),
                    ),
                }
            }
        };
        // Both forms, as the kubelet sends them since 1.30: `apparmor` for newer runtimes and
        // the deprecated `apparmor_profile` string containerd 1.6 reads.
        Some(match kind.as_str() {
            "Unconfined" => (
                SecurityProfile {
                    profile_type: ProfileType::Unconfined as i32,
                    ..Default::default()
                },
                "unconfined".into(),
            ),
            "RuntimeDefault" => (
                SecurityProfile {
                    profile_type: ProfileType::RuntimeDefault as i32,
                    ..Default::default()
                },
                "runtime/default".into(),
            ),
            _ => (
                SecurityProfile {
                    profile_type: ProfileType::Localhost as i32,
                    localhost_ref: localhost.clone(),
                },
                format!("localhost/{localhost}"),
            ),
        })
    }

    fn selinux(&self) -> Option<SeLinuxOption> {
        let o = self.security().se_linux_options.or_else(|| {
            self.pod
                .security_context
                .as_ref()
                .and_then(|s| s.se_linux_options.clone())
        })?;
        Some(SeLinuxOption {
            user: o.user.unwrap_or_default(),
            role: o.role.unwrap_or_default(),
            r#type: o.type_.unwrap_or_default(),
            level: o.level.unwrap_or_default(),
        })
    }

    /// The resources' (requests, limits) of cpu (millicores) and memory (bytes).
    fn resources(&self) -> Result<(Quantities, Quantities), SimError> {
        let r = self.container.resources.clone().unwrap_or_default();
        let read = |m: Option<
            BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        >|
         -> Result<Quantities, SimError> {
            let m = m.unwrap_or_default();
            Ok(Quantities {
                cpu_milli: m.get("cpu").map(|q| cpu_millis(&q.0)).transpose()?,
                memory: m.get("memory").map(|q| bytes(&q.0)).transpose()?,
            })
        };
        let limits = read(r.limits)?;
        let mut requests = read(r.requests)?;
        // A limit without a request requests the limit (API defaulting).
        requests.cpu_milli = requests.cpu_milli.or(limits.cpu_milli);
        requests.memory = requests.memory.or(limits.memory);
        Ok((requests, limits))
    }

    /// The QoS class's cgroup directory under `kubepods` (kubelet qos `GetPodQOS`).
    fn qos_dir(&self) -> Result<&'static str, SimError> {
        let (req, lim) = self.resources()?;
        Ok(
            if req == Quantities::default() && lim == Quantities::default() {
                "besteffort"
            } else if lim.cpu_milli.is_some() && lim.memory.is_some() && req == lim {
                ""
            } else {
                "burstable"
            },
        )
    }
}

fn seccomp_profile(p: k8s_openapi::api::core::v1::SeccompProfile) -> SecurityProfile {
    match p.type_.as_str() {
        "RuntimeDefault" => SecurityProfile {
            profile_type: ProfileType::RuntimeDefault as i32,
            ..Default::default()
        },
        "Unconfined" => SecurityProfile {
            profile_type: ProfileType::Unconfined as i32,
            ..Default::default()
        },
        _ => SecurityProfile {
            profile_type: ProfileType::Localhost as i32,
            localhost_ref: p.localhost_profile.unwrap_or_default(),
        },
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Quantities {
    cpu_milli: Option<i64>,
    memory: Option<i64>,
}

/// A CPU quantity in millicores (`20m`, `0.5`, `2`).
pub fn cpu_millis(q: &str) -> Result<i64, SimError> {
    let bad = || setup(format!("cpu quantity {q:?} is not one this stand-in reads"));
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().map_err(|_| bad());
    }
    q.parse::<f64>()
        .map(|c| (c * 1000.0).round() as i64)
        .map_err(|_| bad())
}

/// A memory quantity in bytes (`32Mi`, `1Gi`, `128974848`, `1M`).
pub fn bytes(q: &str) -> Result<i64, SimError> {
    let units: [(&str, i64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, mult) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n
                .parse::<i64>()
                .map(|n| n * mult)
                .map_err(|_| setup(format!("memory quantity {q:?}")));
        }
    }
    q.parse().map_err(|_| {
        setup(format!(
            "memory quantity {q:?} is not one this stand-in reads"
        ))
    })
}

/// The kubelet's `$(VAR)` expansion of commands, args and env values
/// (kubernetes third_party/forked/golang/expansion): `$(NAME)` is replaced by the variable's
/// value if it is defined (left as written otherwise), `$$` is a literal `$`.
pub fn expand(s: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match env.get(name) {
                        Some(v) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Where and for whom the agent pod runs.
#[derive(Debug, Clone)]
pub struct PodContext {
    /// The simulated node's test name: the sandbox carries it as [`NODE_LABEL`], so the node's
    /// teardown removes the pod too.
    pub node_label: String,
    pub node_name: String,
    /// The simulated node's pods directory (the API server stand-in).
    pub pods_dir: PathBuf,
    /// Where the container's log goes (`agent.log`).
    pub log_dir: PathBuf,
    /// Flags appended to the manifest's args.
    pub extra_args: Vec<String>,
}

/// A running agent pod.
#[derive(Debug)]
pub struct AgentPod {
    pub spec: AgentPodSpec,
    pub uid: String,
    pub sandbox_id: String,
    pub container_id: String,
    pub pod_ip: String,
    /// The sandbox's network namespace (where `/status` answers loopback clients).
    pub netns: PathBuf,
    /// The container's log (CRI format, appended across restarts).
    pub log: PathBuf,
    /// The status API's port (from `--status-listen`: loopback in the pod's netns).
    pub status_port: u16,
    /// The probes' port (`--health-listen`) and the metrics port (`--metrics-listen`), on the
    /// pod IP.
    pub health_port: u16,
    pub metrics_port: u16,
    rt: &'static Containerd,
    sandbox: PodSandboxConfig,
    config: ContainerConfig,
    attempt: u32,
    /// The pod's volumes on the host (under the runtime's directory).
    volumes: PathBuf,
    tmpfs: Vec<PathBuf>,
    removed: bool,
}

impl AgentPod {
    /// Creates the sandbox and the container and starts it; returns once the readiness probe
    /// passes (or fails with the container's log after `ready_timeout`).
    pub fn start(
        rt: &'static Containerd,
        spec: AgentPodSpec,
        ctx: &PodContext,
        ready_timeout: Duration,
    ) -> Result<AgentPod, SimError> {
        let uid = crate::sim::random_uuid();
        let qos = spec.qos_dir()?;
        let cgroup_parent = if qos.is_empty() {
            format!("/kubepods/pod{uid}")
        } else {
            format!("/kubepods/{qos}/pod{uid}")
        };
        let pod_name = format!("{}-{}", spec.name, &crate::sim::random_hex(3)[..5]);
        let mut labels: std::collections::HashMap<String, String> =
            spec.labels.clone().into_iter().collect();
        labels.insert(NODE_LABEL.into(), ctx.node_label.clone());
        let sandbox = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: pod_name.clone(),
                uid: uid.clone(),
                namespace: spec.namespace.clone(),
                attempt: 0,
            }),
            hostname: pod_name.clone(),
            log_directory: ctx.log_dir.to_string_lossy().into_owned(),
            labels,
            annotations: spec.annotations.clone().into_iter().collect(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent,
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(spec.namespaces()),
                    seccomp: spec.pod_seccomp(),
                    selinux_options: spec.selinux(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let volumes = rt.dir.join("agent-pods").join(&uid);
        let mut pod = AgentPod {
            spec,
            uid,
            sandbox_id: String::new(),
            container_id: String::new(),
            pod_ip: String::new(),
            netns: PathBuf::new(),
            log: ctx.log_dir.join("agent.log"),
            status_port: 0,
            health_port: 0,
            metrics_port: 0,
            rt,
            sandbox,
            config: ContainerConfig::default(),
            attempt: 0,
            volumes,
            tmpfs: Vec::new(),
            removed: false,
        };
        // From here on, Drop removes what exists.
        let mut c = rt.client.clone();
        pod.sandbox_id = rt
            .call(c.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(pod.sandbox.clone()),
                runtime_handler: String::new(),
            }))?
            .pod_sandbox_id;
        let st = rt.call(c.pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: pod.sandbox_id.clone(),
            verbose: true,
        }))?;
        pod.pod_ip = st
            .status
            .as_ref()
            .and_then(|s| s.network.as_ref())
            .map(|n| n.ip.clone())
            .unwrap_or_default();
        pod.netns = super::status::info_netns(&super::status::parse_info(&st.info))
            .ok_or_else(|| setup("the agent's sandbox reports no network namespace"))?;
        pod.config = pod.container_config(ctx)?;
        pod.status_port = listen_port(&pod.config.args, "--status-listen")?;
        pod.health_port = listen_port(&pod.config.args, "--health-listen")?;
        pod.metrics_port = listen_port(&pod.config.args, "--metrics-listen")?;
        pod.create_and_start()?;
        pod.wait_ready(ready_timeout)?;
        Ok(pod)
    }

    // `apparmor_profile` is deprecated in the CRI, but containerd 1.6 reads only it.
    #[allow(deprecated)]
    fn container_config(&mut self, ctx: &PodContext) -> Result<ContainerConfig, SimError> {
        let spec = &self.spec;
        let c = &spec.container;
        // env, in order; each value may refer to those before it.
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        let mut envs = Vec::new();
        for e in c.env.iter().flatten() {
            let value = if let Some(v) = &e.value {
                expand(v, &env)
            } else if let Some(from) = &e.value_from {
                let field = from.field_ref.as_ref().ok_or_else(|| {
                    setup(format!(
                        "env {}: only fieldRef is implemented by the kubelet stand-in",
                        e.name
                    ))
                })?;
                match field.field_path.as_str() {
                    "spec.nodeName" => ctx.node_name.clone(),
                    "metadata.name" => self
                        .sandbox
                        .metadata
                        .as_ref()
                        .map(|m| m.name.clone())
                        .unwrap_or_default(),
                    "metadata.namespace" => spec.namespace.clone(),
                    "metadata.uid" => self.uid.clone(),
                    "status.podIP" => self.pod_ip.clone(),
                    "spec.serviceAccountName" => {
                        spec.pod.service_account_name.clone().unwrap_or_default()
                    }
                    other => {
                        return Err(setup(format!(
                            "env {}: fieldRef {other} is not implemented by the kubelet stand-in",
                            e.name
                        )))
                    }
                }
            } else {
                String::new()
            };
            env.insert(e.name.clone(), value.clone());
            envs.push(KeyValue {
                key: e.name.clone(),
                value,
            });
        }
        // The API server stand-in: the node's Pod objects instead of a watch.
        let mut args: Vec<String> = Vec::new();
        let mut replaced = false;
        for a in c.args.iter().flatten() {
            if a == "--kube" {
                args.push("--pods-dir".into());
                args.push(ctx.pods_dir.to_string_lossy().into_owned());
                replaced = true;
            } else {
                args.push(expand(a, &env));
            }
        }
        if !replaced {
            return Err(setup(
                "the DaemonSet's args have no --kube: the stand-in replaces it with --pods-dir; update tests/src/cri/agent_pod.rs",
            ));
        }
        args.extend(ctx.extra_args.iter().cloned());
        let command: Vec<String> = c
            .command
            .iter()
            .flatten()
            .map(|x| expand(x, &env))
            .collect();

        // Volumes: emptyDir only (what the manifest uses); hostPath would be a bind.
        std::fs::create_dir_all(&self.volumes)
            .map_err(io(format!("cannot create {}", self.volumes.display())))?;
        let mut mounts = Vec::new();
        for m in c.volume_mounts.iter().flatten() {
            let vol = spec
                .pod
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == m.name)
                .ok_or_else(|| setup(format!("volumeMount {} names no volume", m.name)))?;
            let host = if let Some(dir) = &vol.empty_dir {
                let host = self.volumes.join("volumes").join(&vol.name);
                std::fs::create_dir_all(&host)
                    .map_err(io(format!("cannot create {}", host.display())))?;
                if dir.medium.as_deref() == Some("Memory") && !self.tmpfs.contains(&host) {
                    let size = dir
                        .size_limit
                        .as_ref()
                        .map(|q| bytes(&q.0))
                        .transpose()?
                        .map(|b| format!("size={b}"));
                    nix::mount::mount(
                        Some("tmpfs"),
                        &host,
                        Some("tmpfs"),
                        nix::mount::MsFlags::empty(),
                        size.as_deref(),
                    )
                    .map_err(|e| SimError::Io {
                        what: format!("cannot mount the emptyDir tmpfs at {}", host.display()),
                        source: e.into(),
                    })?;
                    self.tmpfs.push(host.clone());
                }
                host
            } else if let Some(hp) = &vol.host_path {
                PathBuf::from(&hp.path)
            } else {
                return Err(setup(format!(
                    "volume {}: only emptyDir and hostPath are implemented by the kubelet stand-in",
                    vol.name
                )));
            };
            mounts.push(Mount {
                container_path: m.mount_path.clone(),
                host_path: host.to_string_lossy().into_owned(),
                readonly: m.read_only == Some(true),
                ..Default::default()
            });
        }
        // The termination message file the kubelet mounts (terminationMessagePath).
        let term = self.volumes.join("termination-log");
        std::fs::write(&term, b"").map_err(io(format!("cannot create {}", term.display())))?;
        mounts.push(Mount {
            container_path: c
                .termination_message_path
                .clone()
                .unwrap_or_else(|| "/dev/termination-log".into()),
            host_path: term.to_string_lossy().into_owned(),
            ..Default::default()
        });
        mounts.push(Mount {
            container_path: ctx.pods_dir.to_string_lossy().into_owned(),
            host_path: ctx.pods_dir.to_string_lossy().into_owned(),
            readonly: true,
            ..Default::default()
        });

        let sc = spec.security();
        let caps = sc.capabilities.clone().unwrap_or_default();
        let (apparmor, apparmor_profile) = spec
            .apparmor()
            .map_or((None, String::new()), |(p, s)| (Some(p), s));
        let privileged = sc.privileged == Some(true);
        let (requests, limits) = spec.resources()?;
        let mut resources = LinuxContainerResources::default();
        if let Some(m) = requests.cpu_milli {
            // kubelet cm `MilliCPUToShares`: 1024 shares per CPU, at least 2.
            resources.cpu_shares = (m * 1024 / 1000).max(2);
        }
        if let Some(m) = limits.cpu_milli {
            // kubelet cm `MilliCPUToQuota`, 100 ms period.
            resources.cpu_period = 100_000;
            resources.cpu_quota = (m * 100_000 / 1000).max(1_000);
        }
        if let Some(b) = limits.memory {
            resources.memory_limit_in_bytes = b;
        }
        Ok(ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: c.name.clone(),
                attempt: self.attempt,
            }),
            image: Some(ImageSpec {
                image: spec.image()?.to_string(),
                ..Default::default()
            }),
            command,
            args,
            working_dir: c.working_dir.clone().unwrap_or_default(),
            envs,
            mounts,
            labels: [
                ("io.kubernetes.container.name".to_string(), c.name.clone()),
                (
                    "io.kubernetes.pod.namespace".to_string(),
                    spec.namespace.clone(),
                ),
            ]
            .into(),
            log_path: "agent.log".into(),
            linux: Some(LinuxContainerConfig {
                resources: Some(resources),
                security_context: Some(LinuxContainerSecurityContext {
                    capabilities: Some(Capability {
                        add_capabilities: caps.add.unwrap_or_default(),
                        drop_capabilities: caps.drop.unwrap_or_default(),
                        ..Default::default()
                    }),
                    privileged,
                    namespace_options: Some(spec.namespaces()),
                    selinux_options: spec.selinux(),
                    run_as_user: sc.run_as_user.map(|value| Int64Value { value }),
                    run_as_group: sc.run_as_group.map(|value| Int64Value { value }),
                    readonly_rootfs: sc.read_only_root_filesystem == Some(true),
                    // kubelet `AddNoNewPrivileges`: only when explicitly false.
                    no_new_privs: sc.allow_privilege_escalation == Some(false),
                    masked_paths: if privileged {
                        vec![]
                    } else {
                        DEFAULT_MASKED_PATHS.iter().map(|s| s.to_string()).collect()
                    },
                    readonly_paths: if privileged {
                        vec![]
                    } else {
                        DEFAULT_READONLY_PATHS
                            .iter()
                            .map(|s| s.to_string())
                            .collect()
                    },
                    seccomp: spec.seccomp(),
                    apparmor,
                    apparmor_profile,
                    ..Default::default()
                }),
            }),
            ..Default::default()
        })
    }

    fn create_and_start(&mut self) -> Result<(), SimError> {
        let mut config = self.config.clone();
        if let Some(m) = config.metadata.as_mut() {
            m.attempt = self.attempt;
        }
        let mut c = self.rt.client.clone();
        self.container_id = self
            .rt
            .call(c.create_container(CreateContainerRequest {
                pod_sandbox_id: self.sandbox_id.clone(),
                config: Some(config),
                sandbox_config: Some(self.sandbox.clone()),
            }))?
            .container_id;
        self.rt.call(c.start_container(StartContainerRequest {
            container_id: self.container_id.clone(),
        }))?;
        Ok(())
    }

    fn probe_http(&self, probe: &Probe, what: &str) -> Result<(), String> {
        let get = probe.http_get.as_ref().ok_or_else(|| {
            format!("the {what} probe is not an httpGet (the stand-in runs those)")
        })?;
        let port = match &get.port {
            IntOrString::Int(n) => *n,
            IntOrString::String(name) => self
                .spec
                .container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .map(|p| p.container_port)
                .ok_or_else(|| format!("the {what} probe's port {name:?} is no container port"))?,
        };
        let ip: std::net::IpAddr = self
            .pod_ip
            .parse()
            .map_err(|_| format!("pod IP {:?}", self.pod_ip))?;
        let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
        let path = get.path.as_deref().unwrap_or("/");
        let addr = SocketAddr::new(ip, port as u16);
        let status = http_get_status(|| TcpStream::connect_timeout(&addr, timeout), path, timeout)
            .map_err(|e| format!("GET http://{addr}{path}: {e}"))?;
        // kubelet prober/http: 200 <= code < 400 is success.
        if (200..400).contains(&status) {
            Ok(())
        } else {
            Err(format!("GET http://{addr}{path}: HTTP {status}"))
        }
    }

    /// Waits for the readiness probe to pass, then checks the liveness probe once.
    pub fn wait_ready(&self, timeout: Duration) -> Result<(), SimError> {
        let c = &self.spec.container;
        let readiness = c
            .readiness_probe
            .as_ref()
            .ok_or_else(|| setup("the agent container has no readiness probe"))?;
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.probe_http(readiness, "readiness") {
                Ok(()) => break,
                Err(e) => e,
            };
            if let Some(exit) = self.exit_code() {
                return Err(setup(format!(
                    "the agent container exited ({exit}) before it was ready; log:\n{}",
                    self.log_tail(40)
                )));
            }
            if Instant::now() >= deadline {
                return Err(setup(format!(
                    "the agent pod's readiness probe did not pass within {timeout:?} ({last}); log:\n{}",
                    self.log_tail(40)
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(live) = &c.liveness_probe {
            self.probe_http(live, "liveness").map_err(|e| {
                setup(format!(
                    "the agent is ready but its liveness probe fails: {e}"
                ))
            })?;
        }
        Ok(())
    }

    /// The container's exit code, if it has exited.
    pub fn exit_code(&self) -> Option<i32> {
        let mut c = self.rt.client.clone();
        let st = self
            .rt
            .call(c.container_status(ContainerStatusRequest {
                container_id: self.container_id.clone(),
                verbose: false,
            }))
            .ok()?
            .status?;
        // CONTAINER_EXITED = 2
        (st.state == 2).then_some(st.exit_code)
    }

    /// The container's main process (the agent), as the host sees it.
    pub fn pid(&self) -> Option<u32> {
        let mut c = self.rt.client.clone();
        let st = self
            .rt
            .call(c.container_status(ContainerStatusRequest {
                container_id: self.container_id.clone(),
                verbose: true,
            }))
            .ok()?;
        super::status::info_pid(&super::status::parse_info(&st.info))
    }

    /// CRI `StopContainer` with `timeout` seconds (0: SIGKILL at once); returns the exit code.
    fn stop(&mut self, timeout: i64) -> Result<Option<i32>, SimError> {
        let mut c = self.rt.client.clone();
        self.rt.call(c.stop_container(StopContainerRequest {
            container_id: self.container_id.clone(),
            timeout,
        }))?;
        Ok(self.exit_code())
    }

    /// SIGKILL, as when the node OOM-kills the agent.
    pub fn kill(&mut self) -> Result<(), SimError> {
        self.stop(0).map(|_| ())
    }

    /// SIGTERM with the pod's `terminationGracePeriodSeconds`, as on a rolling update; fails if
    /// the agent had to be killed at the end of it.
    pub fn terminate(&mut self) -> Result<(), SimError> {
        let grace = self.spec.pod.termination_grace_period_seconds.unwrap_or(30);
        let started = Instant::now();
        let code = self.stop(grace)?;
        if code == Some(137) && started.elapsed() >= Duration::from_secs(grace as u64) {
            return Err(setup(format!(
                "the agent did not stop within its {grace} s grace period and was killed"
            )));
        }
        Ok(())
    }

    /// A new container in the same sandbox (the kubelet's restart after an exit).
    pub fn restart(&mut self, ready_timeout: Duration) -> Result<(), SimError> {
        if self.exit_code().is_none() {
            self.kill()?;
        }
        let mut c = self.rt.client.clone();
        self.rt.call(c.remove_container(RemoveContainerRequest {
            container_id: self.container_id.clone(),
        }))?;
        self.attempt += 1;
        self.create_and_start()?;
        self.wait_ready(ready_timeout)
    }

    /// A TCP connection to `127.0.0.1:port` inside the pod, made from its network namespace as
    /// the runtime's port-forward does (containerd's CRI `PortForward` dials localhost in the
    /// sandbox's netns): what `kubectl port-forward` reaches.
    pub fn connect_local(&self, port: u16, timeout: Duration) -> std::io::Result<TcpStream> {
        crate::sim::netns::run_in(&self.netns, || {
            TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), timeout)
        })
        .map_err(|e| std::io::Error::other(e.to_string()))?
    }

    /// The container log's last `n` lines.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Stops and removes the pod; returns what could not be removed.
    pub fn remove(&mut self) -> Vec<String> {
        if self.removed {
            return Vec::new();
        }
        self.removed = true;
        let mut left = Vec::new();
        if !self.sandbox_id.is_empty() {
            let mut c = self.rt.client.clone();
            let id = self.sandbox_id.clone();
            if let Err(e) = self.rt.call(c.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })) {
                left.push(format!("stop agent sandbox {id}: {e}"));
            }
            if let Err(e) = self.rt.call(c.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })) {
                left.push(format!("remove agent sandbox {id}: {e}"));
            }
        }
        for t in self.tmpfs.drain(..) {
            if let Err(e) = nix::mount::umount2(&t, nix::mount::MntFlags::MNT_DETACH) {
                left.push(format!("umount {}: {e}", t.display()));
            }
        }
        let _ = std::fs::remove_dir_all(&self.volumes);
        left.extend(super::kubelet::remove_pod_cgroups(&self.uid));
        left
    }
}

impl Drop for AgentPod {
    fn drop(&mut self) {
        for l in self.remove() {
            eprintln!("cri: agent pod: {l}");
        }
    }
}

/// The port of `FLAG ADDR` (`--status-listen`, `--health-listen`, `--metrics-listen`) in the
/// args.
fn listen_port(args: &[String], flag: &str) -> Result<u16, SimError> {
    let i = args
        .iter()
        .position(|a| a == flag)
        .ok_or_else(|| setup(format!("the agent's args have no {flag}")))?;
    args.get(i + 1)
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .map(|a| a.port())
        .ok_or_else(|| setup(format!("{flag} is not IP:port")))
}

/// One HTTP/1.1 GET over a fresh connection; returns the status code.
pub fn http_get_status(
    connect: impl FnOnce() -> std::io::Result<TcpStream>,
    path: &str,
    timeout: Duration,
) -> std::io::Result<u16> {
    let (status, _) = http_get(connect, path, timeout)?;
    Ok(status)
}

/// One HTTP/1.1 GET (connection close); returns the status code and the body.
pub fn http_get(
    connect: impl FnOnce() -> std::io::Result<TcpStream>,
    path: &str,
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    let mut s = connect()?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: holdfast\r\nUser-Agent: kube-probe/1.33\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP header end"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            std::io::Error::other(format!("bad status line {:?}", head.lines().next()))
        })?;
    Ok((status, body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_like_the_kubelet() {
        let env: BTreeMap<String, String> = [("NODE_NAME".to_string(), "n1".to_string())].into();
        assert_eq!(expand("$(NODE_NAME)", &env), "n1");
        assert_eq!(expand("a-$(NODE_NAME)-b", &env), "a-n1-b");
        assert_eq!(expand("$(MISSING)", &env), "$(MISSING)");
        assert_eq!(expand("$$(NODE_NAME)", &env), "$(NODE_NAME)");
        assert_eq!(expand("cost $5", &env), "cost $5");
        assert_eq!(expand("$(unclosed", &env), "$(unclosed");
    }

    #[test]
    fn quantities() {
        assert_eq!(cpu_millis("20m").unwrap(), 20);
        assert_eq!(cpu_millis("0.5").unwrap(), 500);
        assert_eq!(cpu_millis("2").unwrap(), 2000);
        assert_eq!(bytes("32Mi").unwrap(), 32 << 20);
        assert_eq!(bytes("1M").unwrap(), 1_000_000);
        assert!(bytes("lots").is_err());
    }
}
