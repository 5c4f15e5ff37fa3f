//! Where Pod objects come from. Every source yields the same [`PodEvent`]s built from real
//! `k8s_openapi` Pod objects, so everything after the source is one code path.
//!
//! - [`dir::PodsDir`]: a directory of Pod JSON/YAML files (the simulated node and the demo).
//! - [`kube::KubePods`]: the API server, watching `spec.nodeName=<node>` (in-cluster).

pub mod dir;
mod dir_watch;
pub mod kube;

use k8s_openapi::api::core::v1::Pod;

/// A change to the set of pods on this node.
#[derive(Debug, Clone)]
pub enum PodEvent {
    /// A pod was added or changed (the full current object).
    Applied(Box<Pod>),
    /// A pod is gone from the source (deleted from the API server / its file removed).
    /// `uid` is the uid of the last object seen under that identity.
    Deleted { uid: String },
    /// The source has delivered every pod that existed when it started (the initial listing):
    /// the agent's view of the node is complete (what `/readyz` waits for).
    Synced,
}

pub(crate) use crate::api::status::SourceProblem;

/// A Pod object cut down to what the agent reads ([`crate::pod::PodView::from_pod`]): metadata
/// (uid, name, namespace, annotations, deletion, resource version), the spec's node, host
/// network and users, restart policy and grace period, each container's name, args, env,
/// restart policy and preStop exec command (whether a native proxy's preStop is Istio's drain:
/// [`crate::mesh::MeshProfile::prestop_drain`]), whether it has a startup probe (an empty marker, not the
/// probe), and the status's phase, IPs, container statuses and the one condition the agent reads
/// (`AllContainersRestarting`, [`crate::pod::restarting_in_place`]). Of the annotations and env
/// vars only those read ([`crate::pod::reads_annotation`], [`crate::pod::READ_ENV`]) are kept.
/// Everything else —
/// `managedFields` (often the largest part), volumes, images, resources, probes, conditions —
/// is dropped before the object enters the agent's queue (issue 25: a node of large pods must
/// not fill the agent's memory with fields it never reads).
pub(crate) fn slim(pod: Pod) -> Pod {
    use k8s_openapi::api::core::v1::{
        Container, ExecAction, Lifecycle, LifecycleHandler, PodSpec, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let m = pod.metadata;
    let slim_container = |c: Container| Container {
        name: c.name,
        args: c.args,
        env: c.env.map(|env| {
            env.into_iter()
                .filter(|e| crate::pod::READ_ENV.contains(&e.name.as_str()))
                .collect()
        }),
        restart_policy: c.restart_policy,
        // Kubernetes 1.35's container restart rules: when a Job's app is finished for good.
        restart_policy_rules: c.restart_policy_rules,
        // Only whether there is one (`PodView::proxy_startup_probe`): an empty probe.
        startup_probe: c
            .startup_probe
            .map(|_| k8s_openapi::api::core::v1::Probe::default()),
        // Only the port of an HTTP or TCP readiness probe (which admin a Kuma pod's proxy
        // has: `crate::mesh::kuma::admin_for`).
        readiness_probe: c
            .readiness_probe
            .map(|p| k8s_openapi::api::core::v1::Probe {
                http_get: p
                    .http_get
                    .map(|h| k8s_openapi::api::core::v1::HTTPGetAction {
                        port: h.port,
                        ..Default::default()
                    }),
                tcp_socket: p
                    .tcp_socket
                    .map(|t| k8s_openapi::api::core::v1::TCPSocketAction {
                        port: t.port,
                        ..Default::default()
                    }),
                ..Default::default()
            }),
        lifecycle: c
            .lifecycle
            .and_then(|l| l.pre_stop)
            .and_then(|h| h.exec)
            .map(|e| Lifecycle {
                pre_stop: Some(LifecycleHandler {
                    exec: Some(ExecAction { command: e.command }),
                    ..LifecycleHandler::default()
                }),
                ..Lifecycle::default()
            }),
        ..Container::default()
    };
    Pod {
        metadata: ObjectMeta {
            uid: m.uid,
            name: m.name,
            namespace: m.namespace,
            annotations: m.annotations.map(|mut a| {
                a.retain(|k, _| crate::pod::reads_annotation(k));
                for v in a.values_mut() {
                    if v.len() > MAX_ANNOTATION_BYTES {
                        *v = oversized_annotation(v.len());
                    }
                }
                a
            }),
            // Only the meshes' markers; none kept is no map, so a pod's other labels changing
            // (`kubectl label` in a loop) leaves the slim object the same.
            labels: m
                .labels
                .map(|mut l| {
                    l.retain(|k, _| crate::pod::READ_LABELS.contains(&k.as_str()));
                    for v in l.values_mut() {
                        if v.len() > MAX_ANNOTATION_BYTES {
                            *v = oversized_annotation(v.len());
                        }
                    }
                    l
                })
                .filter(|l| !l.is_empty()),
            deletion_timestamp: m.deletion_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            resource_version: m.resource_version,
            ..ObjectMeta::default()
        },
        spec: pod.spec.map(|s| PodSpec {
            node_name: s.node_name,
            host_network: s.host_network,
            host_users: s.host_users,
            runtime_class_name: s.runtime_class_name,
            restart_policy: s.restart_policy,
            termination_grace_period_seconds: s.termination_grace_period_seconds,
            containers: s.containers.into_iter().map(slim_container).collect(),
            init_containers: s
                .init_containers
                .map(|cs| cs.into_iter().map(slim_container).collect()),
            ..PodSpec::default()
        }),
        status: pod.status.map(|s| PodStatus {
            phase: s.phase,
            pod_ip: s.pod_ip,
            pod_ips: s.pod_ips,
            container_statuses: s.container_statuses,
            init_container_statuses: s.init_container_statuses,
            // One condition at most, without its message.
            conditions: s
                .conditions
                .and_then(|cs| {
                    cs.into_iter()
                        .find(|c| c.type_ == crate::pod::ALL_CONTAINERS_RESTARTING)
                })
                .map(|c| {
                    vec![k8s_openapi::api::core::v1::PodCondition {
                        type_: c.type_,
                        status: c.status,
                        ..Default::default()
                    }]
                }),
            ..PodStatus::default()
        }),
    }
}

/// The most bytes of one annotation the agent reads are kept by [`slim`]. Every annotation it
/// reads is a few hundred bytes when valid (Istio's status JSON, a duration, a flag, a short
/// ProxyConfig overlay); a larger one is replaced by [`oversized_annotation`], which is invalid
/// for each of them, so the pod gets the same outcome (a problem on its row, or left alone as
/// not injected) without the agent carrying, hashing and parsing the value on each update
/// (issue 29: the API server allows 256 KiB of annotations).
pub(crate) const MAX_ANNOTATION_BYTES: usize = 16 * 1024;

/// What [`slim`] keeps of an annotation over [`MAX_ANNOTATION_BYTES`]: invalid as every
/// annotation the agent reads, and says why.
pub(crate) fn oversized_annotation(len: usize) -> String {
    format!("(a value of {len} bytes, over the {MAX_ANNOTATION_BYTES} holdfast reads)")
}

/// The source's current problems, shared with the status API. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct SourceProblems {
    inner: std::sync::Arc<std::sync::Mutex<Vec<SourceProblem>>>,
}

impl SourceProblems {
    /// Replaces the current list (a source reports its whole picture each time it looks).
    pub(crate) fn set(&self, problems: Vec<SourceProblem>) {
        *self.inner.lock().unwrap_or_else(|e| e.into_inner()) = problems;
    }

    /// How many problems there are now (the status API's `holdfast_source_problems`, set at
    /// scrape time from the same list `/status` serves).
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// A copy of the current list.
    pub fn snapshot(&self) -> Vec<SourceProblem> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HoldSettings, ProxyConfig};
    use crate::pod::tests::pod_json;
    use serde_json::json;

    /// The slim object reads as the same view, and is much smaller than what the API server
    /// sends (here: managedFields, volumes, resources, probes, conditions).
    #[test]
    fn a_slim_pod_reads_the_same() {
        let big = pod_json(json!({
            "metadata": {"managedFields": (0..50).map(|i| json!({"manager": format!("m{i}"), "operation": "Update", "fieldsV1": {"f:spec": {"f:containers": {"k": "v".repeat(200)}}}})).collect::<Vec<_>>(),
                         "labels": {"app": "web"}},
            "spec": {"volumes": (0..20).map(|i| json!({"name": format!("v{i}"), "emptyDir": {}})).collect::<Vec<_>>()},
            "status": {"phase": "Running", "podIP": "10.1.2.3", "podIPs": [{"ip": "10.1.2.3"}],
                       "conditions": (0..5).map(|i| json!({"type": format!("C{i}"), "status": "True", "message": "x".repeat(300)})).collect::<Vec<_>>(),
                       "containerStatuses": [{"name": "app", "image": "a", "imageID": "", "ready": true, "restartCount": 0,
                                              "containerID": "containerd://abc", "state": {"running": {}}}]}
        }));
        let small = slim(big.clone());
        let view = |p: &Pod| {
            format!(
                "{:?}",
                crate::pod::PodView::from_pod(
                    p,
                    "node-a",
                    &ProxyConfig::default(),
                    &HoldSettings::default()
                )
            )
        };
        assert_eq!(view(&small), view(&big));
        let size = |p: &Pod| serde_json::to_vec(p).unwrap().len();
        assert!(
            size(&small) * 5 < size(&big),
            "{} vs {}",
            size(&small),
            size(&big)
        );
    }

    /// Issue 29: an annotation the agent reads over 16 KiB is replaced before it is queued,
    /// with a value that reads as invalid (the same outcome as the value: a problem on the
    /// row, or not injected), and an annotation it does not read is dropped.
    #[test]
    fn oversized_annotations_are_replaced_and_unread_ones_dropped() {
        let big = "1s".to_string() + &" ".repeat(200 << 10);
        let pod = slim(pod_json(json!({"metadata": {"annotations": {
            "holdfast.io/hold-timeout": big,
            "example.com/huge": "x".repeat(200 << 10),
        }}})));
        let a = pod.metadata.annotations.as_ref().expect("annotations");
        assert!(!a.contains_key("example.com/huge"));
        let kept = &a["holdfast.io/hold-timeout"];
        assert!(
            kept.len() < 100 && kept.contains("bytes, over the"),
            "{kept}"
        );
        let view = crate::pod::PodView::from_pod(
            &pod,
            "node-a",
            &ProxyConfig::default(),
            &HoldSettings::default(),
        )
        .expect("tracked");
        assert!(
            view.overrides
                .problems
                .iter()
                .any(|p| p.contains("bytes, over the")),
            "{:?}",
            view.overrides.problems
        );
        let status = slim(pod_json(json!({"metadata": {"annotations": {
            "sidecar.istio.io/status": format!("{{\"initContainers\":[\"istio-init\"],\"x\":\"{}\"}}", "y".repeat(20 << 10)),
        }}})));
        let e = crate::pod::PodView::from_pod(
            &status,
            "node-a",
            &ProxyConfig::default(),
            &HoldSettings::default(),
        )
        .expect_err("not injected");
        assert!(
            matches!(e, crate::pod::NotTracked::NotInjected { .. }),
            "{e}"
        );
    }

    /// A native sidecar's preStop survives: whether it is Istio's drain decides how the
    /// deletion goes (kubelet-ordered, or ended on evidence). Slimming once dropped it, and
    /// every native pod then got the full drain (found by tests/tests/native_sidecars.rs).
    #[test]
    fn a_slim_native_pod_keeps_istios_prestop() {
        let native = crate::pod::tests::native_pod(Some(json!([
            "pilot-agent",
            "request",
            "--debug-port=15020",
            "POST",
            "drain"
        ])));
        let view = |p: &Pod| {
            crate::pod::PodView::from_pod(
                p,
                "node-a",
                &ProxyConfig::default(),
                &HoldSettings::default(),
            )
            .expect("tracked")
        };
        let big = view(&native);
        let small = view(&slim(native.clone()));
        assert!(big.prestop_drain);
        assert!(small.prestop_drain);
        assert_eq!(format!("{small:?}"), format!("{big:?}"));
        // And its absence too (`global.proxy.lifecycle` with another hook, or none).
        for other in [Some(json!(["sleep", "5"])), None] {
            let p = crate::pod::tests::native_pod(other);
            assert!(!view(&slim(p)).prestop_drain);
        }
    }

    /// What the machine needs of a KEP-5532 in-place restart and of a proxy's startup probe
    /// survives slimming: the condition `AllContainersRestarting` (its type and status only,
    /// the shape of kubernetes/kubernetes pkg/kubelet/status/generate.go
    /// `GenerateAllContainersRestartingCondition`) and whether the proxy has a startupProbe.
    #[test]
    fn a_slim_pod_keeps_the_in_place_restart_and_the_startup_probe() {
        let mut restarting = pod_json(json!({
            "status": {"phase": "Running",
                       "conditions": [
                           {"type": "Ready", "status": "False", "message": "x".repeat(300)},
                           {"type": "AllContainersRestarting", "status": "True",
                            "reason": "RestartAllContainersStarted",
                            "message": "container exited with restart policy rule"}
                       ]}
        }));
        for c in restarting
            .spec
            .as_mut()
            .map(|s| s.containers.iter_mut())
            .into_iter()
            .flatten()
            .filter(|c| c.name == "istio-proxy")
        {
            c.startup_probe = Some(
                serde_json::from_value(json!({"httpGet": {"path": "/healthz/ready", "port": 15021}, "periodSeconds": 1}))
                    .expect("a probe"),
            );
        }
        let view = |p: &Pod| {
            crate::pod::PodView::from_pod(
                p,
                "node-a",
                &ProxyConfig::default(),
                &HoldSettings::default(),
            )
            .expect("tracked")
        };
        let small = slim(restarting.clone());
        let conditions = small
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        assert_eq!(conditions.len(), 1, "{conditions:?}");
        assert!(conditions[0].message.is_none());
        let (big, small) = (view(&restarting), view(&small));
        assert!(big.restarting_in_place && small.restarting_in_place);
        assert!(big.proxy_startup_probe && small.proxy_startup_probe);
        // False, and no probe: neither.
        let after = pod_json(json!({
            "status": {"phase": "Running",
                       "conditions": [{"type": "AllContainersRestarting", "status": "False"}]}
        }));
        let v = view(&slim(after));
        assert!(!v.restarting_in_place);
        assert!(!v.proxy_startup_probe);
    }
}
