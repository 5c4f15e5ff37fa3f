//! The agent in its own container, with exactly the privileges of its DaemonSet: the pod and
//! container `securityContext` of `manifests/agent/daemonset.yaml` are parsed (k8s-openapi
//! types) and applied to a CRI sandbox and container config the way kubelet maps them
//! (kubelet `kuberuntime_sandbox.go` / `security_context.go`: `hostPID` → pid namespace NODE,
//! no `hostNetwork` → the pod's own netns, `capabilities`, `runAsUser`, `readOnlyRootFilesystem`,
//! `allowPrivilegeEscalation: false` → `no_new_privs`, `seccompProfile`). So every run proves
//! that these privileges suffice, and a test can drop one to see what breaks.
//!
//! Differences from a cluster, each deliberate: the `holdfast` binary and the host's `/usr`
//! (glibc, iptables) are read-only bind mounts instead of the image; the agent reads the
//! simulated node's pods directory (read-only) instead of `--kube`; the `run` emptyDir is a
//! host scratch directory (kubelet also bind-mounts emptyDirs from the host; `medium: Memory`
//! would make it a tmpfs).

use std::path::{Path, PathBuf};

use k8s_cri::v1::{
    Capability, ContainerConfig, ContainerMetadata, CreateContainerRequest, ImageSpec, Int64Value,
    LinuxContainerConfig, LinuxContainerSecurityContext, LinuxPodSandboxConfig,
    LinuxSandboxSecurityContext, Mount, NamespaceMode, NamespaceOption, PodSandboxConfig,
    PodSandboxMetadata, PodSandboxStatusRequest, RunPodSandboxRequest, SecurityProfile,
    StartContainerRequest,
};
use k8s_openapi::api::apps::v1::DaemonSet;

use super::kubelet::NODE_LABEL;
use super::runtime::{Containerd, BASE_IMAGE};
use crate::sim::SimError;

/// What the DaemonSet grants the agent's container.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentPrivileges {
    pub host_pid: bool,
    pub host_network: bool,
    pub run_as_user: Option<i64>,
    pub read_only_root: bool,
    pub no_new_privs: bool,
    pub seccomp_runtime_default: bool,
    pub cap_add: Vec<String>,
    pub cap_drop: Vec<String>,
    /// `volumeMounts[].mountPath` (all emptyDirs in the shipped manifest).
    pub mount_paths: Vec<String>,
}

fn setup(msg: String) -> SimError {
    SimError::Setup(msg)
}

impl AgentPrivileges {
    /// Reads the DaemonSet `holdfast-agent` (container `agent`) from `manifests/agent/`.
    pub fn from_manifest(path: &Path) -> Result<AgentPrivileges, SimError> {
        let text = std::fs::read_to_string(path).map_err(|source| SimError::Io {
            what: format!("cannot read {}", path.display()),
            source,
        })?;
        let ds: DaemonSet = serde_saphyr::from_str(&text)
            .map_err(|e| setup(format!("{} is not a DaemonSet: {e}", path.display())))?;
        let pod = ds
            .spec
            .and_then(|s| s.template.spec)
            .ok_or_else(|| setup("the DaemonSet has no pod spec".into()))?;
        let c = pod
            .containers
            .iter()
            .find(|c| c.name == "agent")
            .ok_or_else(|| setup("the DaemonSet has no container `agent`".into()))?;
        let sc = c.security_context.clone().unwrap_or_default();
        let caps = sc.capabilities.clone().unwrap_or_default();
        let seccomp = sc
            .seccomp_profile
            .clone()
            .or_else(|| pod.security_context.as_ref()?.seccomp_profile.clone());
        Ok(AgentPrivileges {
            host_pid: pod.host_pid.unwrap_or(false),
            host_network: pod.host_network.unwrap_or(false),
            run_as_user: sc.run_as_user,
            read_only_root: sc.read_only_root_filesystem.unwrap_or(false),
            // kubelet: no_new_privs unless allowPrivilegeEscalation is true (or unset).
            no_new_privs: sc.allow_privilege_escalation == Some(false),
            seccomp_runtime_default: seccomp.is_some_and(|s| s.type_ == "RuntimeDefault"),
            cap_add: caps.add.unwrap_or_default(),
            cap_drop: caps.drop.unwrap_or_default(),
            mount_paths: c
                .volume_mounts
                .iter()
                .flatten()
                .map(|m| m.mount_path.clone())
                .collect(),
        })
    }

    /// The shipped manifest of this workspace.
    pub fn shipped() -> Result<AgentPrivileges, SimError> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        AgentPrivileges::from_manifest(&root.join("manifests/agent/daemonset.yaml"))
    }

    fn namespaces(&self) -> NamespaceOption {
        let mode = |host: bool| {
            if host {
                NamespaceMode::Node
            } else {
                NamespaceMode::Pod
            }
        };
        NamespaceOption {
            network: mode(self.host_network) as i32,
            pid: mode(self.host_pid) as i32,
            ipc: NamespaceMode::Pod as i32,
            ..Default::default()
        }
    }

    fn seccomp(&self) -> Option<SecurityProfile> {
        self.seccomp_runtime_default.then(SecurityProfile::default) // RuntimeDefault = 0
    }
}

/// A started agent pod.
#[derive(Debug)]
pub struct AgentPod {
    /// The pod's uid (its cgroup is `kubepods/besteffort/pod<uid>`).
    pub uid: String,
    pub sandbox_id: String,
    pub container_id: String,
    pub pod_ip: String,
    /// The container's log (CRI format).
    pub log: PathBuf,
}

/// Starts `holdfast agent --node-name <node> --pods-dir <pods>` in a pod of its own with
/// `privs` applied; `scratch` holds its log and the `run` emptyDir. Labelled with the node's
/// label so the node's teardown removes it.
pub fn start_agent_pod(
    rt: &Containerd,
    privs: &AgentPrivileges,
    holdfast: &Path,
    node_label: &str,
    node_name: &str,
    pods_dir: &Path,
    scratch: &Path,
) -> Result<AgentPod, SimError> {
    let uid = crate::sim::random_uuid();
    let logs = scratch.join("agent-pod");
    std::fs::create_dir_all(logs.join("run")).map_err(|source| SimError::Io {
        what: format!("cannot create {}", logs.display()),
        source,
    })?;
    let sandbox = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "holdfast-agent".into(),
            uid: uid.clone(),
            namespace: "holdfast-system".into(),
            attempt: 0,
        }),
        log_directory: logs.to_string_lossy().into_owned(),
        labels: [(NODE_LABEL.to_string(), node_label.to_string())].into(),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: format!("/kubepods/besteffort/pod{uid}"),
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(privs.namespaces()),
                seccomp: privs.seccomp(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut c = rt.client.clone();
    let sandbox_id = rt
        .call(c.run_pod_sandbox(RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        }))?
        .pod_sandbox_id;
    let st = rt.call(c.pod_sandbox_status(PodSandboxStatusRequest {
        pod_sandbox_id: sandbox_id.clone(),
        verbose: false,
    }))?;
    let pod_ip = st
        .status
        .and_then(|s| s.network)
        .map(|n| n.ip)
        .unwrap_or_default();
    let bind = |host: &Path, at: &str, readonly: bool| Mount {
        container_path: at.to_string(),
        host_path: host.to_string_lossy().into_owned(),
        readonly,
        ..Default::default()
    };
    let mut mounts = vec![
        bind(Path::new("/usr"), "/usr", true),
        bind(Path::new("/etc/alternatives"), "/etc/alternatives", true),
        bind(holdfast, "/holdfast", true),
        bind(pods_dir, &pods_dir.to_string_lossy(), true),
    ];
    for path in &privs.mount_paths {
        let dir = logs.join(path.trim_start_matches('/').replace('/', "_"));
        std::fs::create_dir_all(&dir).map_err(|source| SimError::Io {
            what: format!("cannot create {}", dir.display()),
            source,
        })?;
        mounts.push(bind(&dir, path, false));
    }
    let config = ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: "agent".into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: BASE_IMAGE.into(),
            ..Default::default()
        }),
        command: vec!["/holdfast".into()],
        args: vec![
            "agent".into(),
            "--node-name".into(),
            node_name.into(),
            "--pods-dir".into(),
            pods_dir.to_string_lossy().into_owned(),
            // As the DaemonSet: everything on loopback, probes and metrics on the pod IP.
            "--status-listen".into(),
            "127.0.0.1:15300".into(),
            "--health-listen".into(),
            "0.0.0.0:15301".into(),
            "--metrics-listen".into(),
            "0.0.0.0:15302".into(),
        ],
        envs: vec![k8s_cri::v1::KeyValue {
            key: "HOLDFAST_LOG".into(),
            value: "holdfast=info".into(),
        }],
        mounts,
        log_path: "agent.log".into(),
        linux: Some(LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                capabilities: Some(Capability {
                    add_capabilities: privs.cap_add.clone(),
                    drop_capabilities: privs.cap_drop.clone(),
                    ..Default::default()
                }),
                namespace_options: Some(privs.namespaces()),
                run_as_user: privs.run_as_user.map(|value| Int64Value { value }),
                readonly_rootfs: privs.read_only_root,
                no_new_privs: privs.no_new_privs,
                seccomp: privs.seccomp(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let container_id = rt
        .call(c.create_container(CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(config),
            sandbox_config: Some(sandbox),
        }))?
        .container_id;
    rt.call(c.start_container(StartContainerRequest {
        container_id: container_id.clone(),
    }))?;
    Ok(AgentPod {
        uid,
        sandbox_id,
        container_id,
        pod_ip,
        log: logs.join("agent.log"),
    })
}
