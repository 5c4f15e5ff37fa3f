//! What the agent needs to know about one Kubernetes Pod, read defensively from the API object.
//!
//! A `Pod` from the API server (or a pods directory) may be incomplete at any stage: no status
//! yet, no container ids yet, missing fields in a hand-written file. Everything here returns a
//! safe answer for such objects instead of failing.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;

use crate::config::{HoldSettings, PodOverrides, ProxyConfig};

/// Stable identity of a pod: its UID, plus `namespace/name` for humans.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

/// Why a pod is not tracked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotTracked {
    /// The object has no `metadata.uid` (or no name): it cannot be tied to processes.
    Incomplete(&'static str),
    /// No container named like the proxy (`--proxy-container`).
    NoProxy,
    /// `hostNetwork: true`: the pod shares the node's namespace; holding there would hold the node.
    HostNetwork,
    /// Opted out with `holdfast.io/enabled: "false"`.
    OptedOut,
    /// Scheduled on another node (a source should not deliver these; checked anyway).
    OtherNode,
}

impl std::fmt::Display for NotTracked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotTracked::Incomplete(what) => write!(f, "pod object has no {what}"),
            NotTracked::NoProxy => f.write_str("no proxy container"),
            NotTracked::HostNetwork => f.write_str("hostNetwork pod"),
            NotTracked::OptedOut => f.write_str("opted out by annotation"),
            NotTracked::OtherNode => f.write_str("scheduled on another node"),
        }
    }
}

/// One container's runtime state as the kubelet reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerView {
    pub name: String,
    /// Runtime container id without the `containerd://` style prefix; `None` before it is created.
    pub id: Option<String>,
    pub is_proxy: bool,
    pub state: ContainerState,
}

/// A container's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerState {
    Waiting,
    Running,
    Terminated { exit_code: i32 },
}

/// A meshed pod on this node, as the agent sees it.
#[derive(Debug, Clone)]
pub struct PodView {
    pub key: PodKey,
    pub overrides: PodOverrides,
    /// Containers of the pod (regular containers; init containers are not tracked).
    pub containers: Vec<ContainerView>,
    /// `Always` (the default), `OnFailure` or `Never`.
    pub restart_policy: String,
    /// Set once the pod is being deleted.
    pub deletion: Option<Deletion>,
}

/// A pod's deletion: when it started and how long the kubelet grants it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deletion {
    pub timestamp: Timestamp,
    pub grace: Duration,
}

/// Kubernetes' default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

impl PodView {
    /// Reads a Pod object. Returns why the pod is not tracked when it is not meshed.
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
        if spec.host_network == Some(true) {
            return Err(NotTracked::HostNetwork);
        }
        if !spec.containers.iter().any(|c| c.name == proxy.container) {
            return Err(NotTracked::NoProxy);
        }
        let annotations = meta
            .annotations
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.as_str()));
        let overrides = PodOverrides::from_annotations(annotations, hold);
        if !overrides.enabled {
            return Err(NotTracked::OptedOut);
        }

        let statuses: &[ContainerStatus] = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_deref())
            .unwrap_or(&[]);
        let containers = spec
            .containers
            .iter()
            .map(|c| {
                let status = statuses.iter().find(|s| s.name == c.name);
                ContainerView {
                    name: c.name.clone(),
                    id: status
                        .and_then(|s| s.container_id.as_deref())
                        .and_then(strip_runtime_prefix),
                    is_proxy: c.name == proxy.container,
                    state: status
                        .map(container_state)
                        .unwrap_or(ContainerState::Waiting),
                }
            })
            .collect();

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
            restart_policy: spec
                .restart_policy
                .clone()
                .unwrap_or_else(|| "Always".into()),
            deletion,
        })
    }

    /// Envoy's admin address for this pod: Istio binds it on `::1` when the pod's first IP is
    /// IPv6, else on 127.0.0.1 (the configured port either way).
    /// TODO(issue 10): read `status.podIPs`.
    pub fn admin_addr(&self, proxy: &ProxyConfig) -> std::net::SocketAddr {
        proxy.admin
    }

    /// Whether the pod has an IPv6 address (its IPv6 connections are then held too).
    /// TODO(issue 10): read `status.podIPs`.
    pub fn has_ipv6(&self) -> bool {
        false
    }

    /// Whether Istio redirects the pod's DNS to pilot-agent (15053), so DNS is held too.
    /// TODO(issue 10): read the proxy's `ISTIO_META_DNS_CAPTURE`.
    pub fn dns_capture(&self) -> bool {
        false
    }

    /// Whether every init container has completed (before that, the pod's connections come
    /// from init containers, which are never held). TODO(issue 10): read initContainerStatuses.
    pub fn init_done(&self) -> bool {
        true
    }

    /// The app (non-proxy) containers.
    pub fn app_containers(&self) -> impl Iterator<Item = &ContainerView> {
        self.containers.iter().filter(|c| !c.is_proxy)
    }

    /// The proxy container.
    pub fn proxy_container(&self) -> Option<&ContainerView> {
        self.containers.iter().find(|c| c.is_proxy)
    }

    /// True when every app container has exited and the kubelet will not restart any of them, so
    /// the pod only waits for its proxy: a finished Job. `restartPolicy: Always` never qualifies.
    pub fn apps_finished_for_good(&self) -> bool {
        let mut apps = self.app_containers().peekable();
        if apps.peek().is_none() {
            return false;
        }
        apps.all(|c| match c.state {
            ContainerState::Terminated { exit_code } => match self.restart_policy.as_str() {
                "Never" => true,
                "OnFailure" => exit_code == 0,
                _ => false,
            },
            _ => false,
        })
    }
}

/// `containerd://abc` → `abc`. Returns `None` for an empty id.
pub fn strip_runtime_prefix(id: &str) -> Option<String> {
    let bare = id.split_once("://").map_or(id, |(_, rest)| rest);
    (!bare.is_empty()).then(|| bare.to_ascii_lowercase())
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub fn pod_json(extra: serde_json::Value) -> Pod {
        let mut base = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "2C48913C-b29f-4a8e-9c4b-0123456789ab"},
            "spec": {
                "nodeName": "node-a",
                "containers": [{"name": "istio-proxy"}, {"name": "app"}],
                "terminationGracePeriodSeconds": 45
            }
        });
        merge(&mut base, extra);
        serde_json::from_value(base).expect("valid pod")
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn view(pod: &Pod) -> Result<PodView, NotTracked> {
        PodView::from_pod(
            pod,
            "node-a",
            &ProxyConfig::default(),
            &HoldSettings::default(),
        )
    }

    #[test]
    fn early_pod_has_no_container_ids() {
        let v = view(&pod_json(json!({}))).unwrap();
        assert_eq!(v.key.uid, "2c48913c-b29f-4a8e-9c4b-0123456789ab");
        assert_eq!(v.key.to_string(), "shop/web-1");
        assert!(v.containers.iter().all(|c| c.id.is_none()));
        assert_eq!(v.proxy_container().unwrap().name, "istio-proxy");
        assert_eq!(v.app_containers().count(), 1);
        assert!(v.deletion.is_none());
        assert!(!v.apps_finished_for_good());
    }

    #[test]
    fn container_ids_and_states() {
        let v = view(&pod_json(json!({"status": {"containerStatuses": [
            {"name": "app", "containerID": "containerd://ABC123", "image": "", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"terminated": {"exitCode": 3}}},
            {"name": "istio-proxy", "containerID": "containerd://def", "image": "", "imageID": "", "ready": true, "restartCount": 0,
             "state": {"running": {}}}
        ]}})))
        .unwrap();
        let app = v.app_containers().next().unwrap();
        assert_eq!(app.id.as_deref(), Some("abc123"));
        assert_eq!(app.state, ContainerState::Terminated { exit_code: 3 });
        assert_eq!(v.proxy_container().unwrap().state, ContainerState::Running);
    }

    #[test]
    fn not_tracked_reasons() {
        assert_eq!(
            view(&pod_json(json!({"spec": {"hostNetwork": true}}))).unwrap_err(),
            NotTracked::HostNetwork
        );
        assert_eq!(
            view(&pod_json(
                json!({"spec": {"containers": [{"name": "app"}]}})
            ))
            .unwrap_err(),
            NotTracked::NoProxy
        );
        assert_eq!(
            view(&pod_json(
                json!({"metadata": {"annotations": {"holdfast.io/enabled": "false"}}})
            ))
            .unwrap_err(),
            NotTracked::OptedOut
        );
        assert_eq!(
            view(&pod_json(json!({"metadata": {"uid": ""}}))).unwrap_err(),
            NotTracked::Incomplete("metadata.uid")
        );
        assert_eq!(
            view(&pod_json(json!({"spec": {"nodeName": "node-b"}}))).unwrap_err(),
            NotTracked::OtherNode
        );
    }

    #[test]
    fn deletion_uses_grace_period() {
        let v = view(&pod_json(
            json!({"metadata": {"deletionTimestamp": "2026-11-22T10:00:00Z"}}),
        ))
        .unwrap();
        let d = v.deletion.unwrap();
        assert_eq!(d.grace, Duration::from_secs(45));
        let v = view(&pod_json(json!({"metadata": {"deletionTimestamp": "2026-11-22T10:00:00Z", "deletionGracePeriodSeconds": 5}}))).unwrap();
        assert_eq!(v.deletion.unwrap().grace, Duration::from_secs(5));
    }

    #[test]
    fn job_completion_follows_restart_policy() {
        let status = |code: i32| {
            json!({"status": {"containerStatuses": [
                {"name": "app", "containerID": "containerd://a", "image": "", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"terminated": {"exitCode": code}}}
            ]}})
        };
        let with = |policy: &str, code: i32| {
            let mut p = pod_json(status(code));
            p.spec.as_mut().unwrap().restart_policy = Some(policy.into());
            view(&p).unwrap().apps_finished_for_good()
        };
        assert!(with("Never", 0));
        assert!(with("Never", 1));
        assert!(with("OnFailure", 0));
        assert!(!with("OnFailure", 1));
        assert!(!with("Always", 0));
    }

    #[test]
    fn runtime_prefixes() {
        assert_eq!(
            strip_runtime_prefix("containerd://ab").as_deref(),
            Some("ab")
        );
        assert_eq!(strip_runtime_prefix("cri-o://cd").as_deref(), Some("cd"));
        assert_eq!(strip_runtime_prefix("ef").as_deref(), Some("ef"));
        assert_eq!(strip_runtime_prefix("containerd://"), None);
    }
}
