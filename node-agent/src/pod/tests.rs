//! Pod objects shaped as the real ones: what Istio's injector, charts and the kubelet write.
//! Sources, in istio/istio: manifests/charts/istio-control/istio-discovery/files/
//! injection-template.yaml (sidecar), gateway-injection-template.yaml and charts/gateway
//! (gateway), files/waypoint.yaml (waypoint), charts/ztunnel/templates/daemonset.yaml (ztunnel);
//! pkg/kube/inject/webhook.go `getInjectionStatus` (the status annotation).

use super::*;
use serde_json::json;

const UID: &str = "2C48913C-b29f-4a8e-9c4b-0123456789ab";

/// What Istio's webhook writes for the default sidecar template without CNI.
fn sidecar_status(inits: &str) -> String {
    format!(
        r#"{{"initContainers":{inits},"containers":["istio-proxy"],"volumes":["workload-socket","credential-socket","workload-certs","istio-envoy","istio-data","istio-podinfo","istio-token","istiod-ca-cert"],"imagePullSecrets":null,"revision":"default"}}"#
    )
}

fn istio_init(mode: &str) -> serde_json::Value {
    json!({
        "name": "istio-init", "image": "docker.io/istio/proxyv2:1.28.0",
        "args": ["istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", mode,
                 "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020", "--log_output_level=default:info"]
    })
}

fn istio_proxy(env: serde_json::Value) -> serde_json::Value {
    let mut base = vec![
        json!({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}),
        json!({"name": "INSTANCE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}),
        json!({"name": "ISTIO_META_INTERCEPTION_MODE", "value": "REDIRECT"}),
    ];
    base.extend(env.as_array().cloned().unwrap_or_default());
    json!({
        "name": "istio-proxy", "image": "docker.io/istio/proxyv2:1.28.0",
        "args": ["proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local",
                 "--proxyLogLevel=warning", "--proxyComponentLogLevel=misc:error", "--log_output_level=default:info"],
        "ports": [{"containerPort": 15090, "name": "http-envoy-prom", "protocol": "TCP"}],
        "env": base,
        "securityContext": {"runAsUser": 1337, "runAsGroup": 1337, "runAsNonRoot": true}
    })
}

/// An injected classic-sidecar pod (app first, istio-proxy appended, istio-init), merged with
/// `extra` (objects merge, arrays replace).
pub(crate) fn pod_json(extra: serde_json::Value) -> Pod {
    let mut base = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web-1", "namespace": "shop", "uid": UID,
                     "annotations": {"sidecar.istio.io/status": sidecar_status(r#"["istio-init"]"#),
                                     "istio.io/rev": "default"}},
        "spec": {
            "nodeName": "node-a",
            "initContainers": [istio_init("REDIRECT")],
            "containers": [{"name": "app", "image": "shop/web:1"}, istio_proxy(json!([]))],
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
                // `null` deletes the key (a map of strings cannot hold null).
                if v.is_null() {
                    a.remove(&k);
                } else {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
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

fn status(name: &str, state: serde_json::Value) -> serde_json::Value {
    json!({"name": name, "image": "", "imageID": "", "ready": false, "restartCount": 0, "state": state})
}

#[test]
fn early_pod_has_no_container_ids() {
    let v = view(&pod_json(json!({}))).unwrap();
    assert_eq!(v.key.uid, "2c48913c-b29f-4a8e-9c4b-0123456789ab");
    assert_eq!(v.key.to_string(), "shop/web-1");
    assert!(v.containers.iter().all(|c| c.id.is_none() && !c.ran));
    assert_eq!(v.proxy_container().unwrap().name, "istio-proxy");
    assert_eq!(v.app_containers().count(), 1);
    assert!(v.deletion.is_none());
    assert!(!v.apps_finished_for_good());
    assert_eq!(v.phase, None);
    assert!(
        v.overrides.problems.is_empty(),
        "{:?}",
        v.overrides.problems
    );
}

#[test]
fn container_ids_and_states() {
    let v = view(&pod_json(json!({"status": {"phase": "Running", "containerStatuses": [
        {"name": "app", "containerID": "containerd://ABC123", "image": "", "imageID": "", "ready": false, "restartCount": 0,
         "state": {"terminated": {"exitCode": 3}}},
        {"name": "istio-proxy", "containerID": "containerd://def", "image": "", "imageID": "", "ready": true, "restartCount": 0,
         "state": {"running": {}}}
    ]}})))
    .unwrap();
    let app = v.app_containers().next().unwrap();
    assert_eq!(app.id.as_deref(), Some("abc123"));
    assert_eq!(app.state, ContainerState::Terminated { exit_code: 3 });
    assert!(app.ran);
    assert_eq!(v.proxy_container().unwrap().state, ContainerState::Running);
    assert_eq!(v.phase.as_deref(), Some("Running"));
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

/// An ingress gateway from charts/gateway, after the `gateway` injection template: `proxy
/// router`, no init container, the status annotation with `"initContainers":null`.
fn gateway_pod(extra_containers: serde_json::Value) -> Pod {
    let mut proxy = istio_proxy(json!([]));
    proxy["args"] = json!([
        "proxy",
        "router",
        "--domain",
        "$(POD_NAMESPACE).svc.cluster.local",
        "--proxyLogLevel=warning",
        "--proxyComponentLogLevel=misc:error",
        "--log_output_level=default:info"
    ]);
    proxy["env"] = json!([{"name": "ISTIO_META_WORKLOAD_NAME", "value": "istio-ingressgateway"}]);
    let mut containers = vec![proxy];
    containers.extend(extra_containers.as_array().cloned().unwrap_or_default());
    let mut status: serde_json::Value = serde_json::from_str(&sidecar_status("null")).unwrap();
    status["volumes"] = json!([
        "workload-socket",
        "istio-envoy",
        "istio-token",
        "istiod-ca-cert"
    ]);
    pod_json(json!({
        "metadata": {"name": "istio-ingressgateway-7d9f8c6b5-x2x9q", "namespace": "istio-ingress",
                     "labels": {"app": "istio-ingressgateway", "istio": "ingressgateway",
                                "sidecar.istio.io/inject": "true", "inject.istio.io/templates": "gateway"},
                     "annotations": {"sidecar.istio.io/status": status.to_string()}},
        "spec": {"initContainers": null, "containers": containers,
                 "securityContext": {"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]}}
    }))
}

#[test]
fn gateway_is_not_a_sidecar() {
    let err = view(&gateway_pod(json!([]))).unwrap_err();
    assert!(
        matches!(&err, NotTracked::NotASidecar { why } if why.contains("proxy router")),
        "{err:?}"
    );
    assert!(err.to_string().contains("a gateway"), "{err}");
    // charts/gateway's `additionalContainers` put another container next to the proxy: still a
    // gateway.
    let err = view(&gateway_pod(
        json!([{"name": "oauth2-proxy", "image": "oauth2-proxy:7"}]),
    ))
    .unwrap_err();
    assert!(matches!(err, NotTracked::NotASidecar { .. }), "{err:?}");
}

#[test]
fn waypoint_and_ztunnel_are_not_sidecars() {
    // files/waypoint.yaml: labels sidecar.istio.io/inject "false", `proxy waypoint`.
    let waypoint = pod_json(json!({
        "metadata": {"name": "waypoint-5c7b8d9f6-abcde", "namespace": "shop",
                     "labels": {"sidecar.istio.io/inject": "false", "istio.io/dataplane-mode": "none",
                                "gateway.networking.k8s.io/gateway-name": "waypoint"},
                     "annotations": {"sidecar.istio.io/status": null, "istio.io/rev": "default"}},
        "spec": {"initContainers": null, "containers": [{
            "name": "istio-proxy", "image": "docker.io/istio/proxyv2:1.28.0",
            "args": ["proxy", "waypoint", "--domain", "$(POD_NAMESPACE).svc.cluster.local",
                     "--serviceCluster", "waypoint.$(POD_NAMESPACE)", "--proxyLogLevel", "warning"],
            "ports": [{"containerPort": 15020, "name": "metrics"}, {"containerPort": 15021, "name": "status-port"},
                      {"containerPort": 15090, "name": "http-envoy-prom"}]}]}
    }));
    let err = view(&waypoint).unwrap_err();
    assert!(
        matches!(&err, NotTracked::NotASidecar { why } if why.contains("waypoint")),
        "{err:?}"
    );

    // charts/ztunnel/templates/daemonset.yaml: container istio-proxy, `proxy ztunnel`.
    let ztunnel = pod_json(json!({
        "metadata": {"name": "ztunnel-k2v7p", "namespace": "istio-system",
                     "labels": {"app": "ztunnel", "sidecar.istio.io/inject": "false"},
                     "annotations": {"sidecar.istio.io/status": null, "sidecar.istio.io/inject": "false"}},
        "spec": {"initContainers": null, "containers": [{
            "name": "istio-proxy", "image": "docker.io/istio/ztunnel:1.28.0",
            "args": ["proxy", "ztunnel"],
            "env": [{"name": "INPOD_ENABLED", "value": "true"}],
            "ports": [{"containerPort": 15020, "name": "ztunnel-stats"}]}]}
    }));
    let err = view(&ztunnel).unwrap_err();
    assert!(
        matches!(&err, NotTracked::NotASidecar { why } if why.contains("ztunnel")),
        "{err:?}"
    );

    // A hand-made proxy-only pod without args: the shape alone says gateway-like.
    let alone = pod_json(json!({"spec": {"containers": [{"name": "istio-proxy"}]}}));
    assert!(matches!(
        view(&alone).unwrap_err(),
        NotTracked::NotASidecar { .. }
    ));
}

/// A native-sidecar pod as Istio 1.28 injects it, with `pre_stop` as the proxy's preStop exec
/// command (`None`: no hook), a log shipper (a native sidecar) started after the proxy, the
/// proxy and the shipper running.
pub(crate) fn native_pod(pre_stop: Option<serde_json::Value>) -> Pod {
    let mut proxy = istio_proxy(json!([]));
    proxy["restartPolicy"] = json!("Always");
    if let Some(cmd) = pre_stop {
        proxy["lifecycle"] = json!({"preStop": {"exec": {"command": cmd}}});
    }
    let shipper = json!({"name": "log-shipper", "image": "fluent-bit", "restartPolicy": "Always"});
    pod_json(json!({
        "metadata": {"annotations": {"sidecar.istio.io/status": sidecar_status(r#"["istio-init","istio-proxy"]"#)}},
        "spec": {"initContainers": [istio_init("REDIRECT"), proxy, shipper],
                 "containers": [{"name": "app", "image": "shop/web:1"}]},
        "status": {"initContainerStatuses": [
            status("istio-init", json!({"terminated": {"exitCode": 0}})),
            status("istio-proxy", json!({"running": {"startedAt": "2026-11-22T10:00:01Z"}})),
            status("log-shipper", json!({"running": {"startedAt": "2026-11-22T10:00:02Z"}})),
        ]}
    }))
}

/// Istio 1.27+'s native sidecar (pkg/kube/inject/testdata/inject/native-sidecar.yaml.injected,
/// istio/istio 1.28): `istio-proxy` among the init containers after istio-init, with
/// `restartPolicy: Always` and Istio's preStop drain; its status in `initContainerStatuses`.
/// Tracked, in native mode; a log shipper started after it is stopped before it.
#[test]
fn native_sidecar_is_tracked_in_native_mode() {
    let native = native_pod;
    let istio = json!([
        "pilot-agent",
        "request",
        "--debug-port=15020",
        "POST",
        "drain"
    ]);
    let v = view(&native(Some(istio))).expect("tracked");
    assert_eq!(v.mode, SidecarMode::Native);
    assert!(v.prestop_drain);
    let proxy = v
        .proxy_container()
        .expect("the proxy, among the init containers");
    assert!(proxy.restartable && proxy.state == ContainerState::Running);
    let before: Vec<&str> = v
        .containers_before_proxy_stops()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(before, ["app", "log-shipper"]);
    // `global.proxy.lifecycle` replaced the hook (or removed it): pilot-agent drains only after
    // its SIGTERM.
    for other in [Some(json!(["sleep", "5"])), None] {
        let v = view(&native(other)).expect("tracked");
        assert_eq!(v.mode, SidecarMode::Native);
        assert!(!v.prestop_drain);
    }
}

#[test]
fn tproxy_pod_stays_out() {
    // The template with interceptionMode TPROXY: istio-init `-m TPROXY`, the proxy's env, and
    // (with the CNI plugin) the annotation.
    let mut proxy = istio_proxy(json!([]));
    proxy["env"][2]["value"] = json!("TPROXY");
    let pod = pod_json(json!({
        "spec": {"initContainers": [istio_init("TPROXY")],
                 "containers": [{"name": "app", "image": "shop/web:1"}, proxy]}
    }));
    let err = view(&pod).unwrap_err();
    assert_eq!(
        err,
        NotTracked::Interception {
            mode: "TPROXY".into()
        }
    );
    assert!(err.to_string().contains("REDIRECT-mode pods only"), "{err}");
    // CNI: istio-validation instead of istio-init, the mode only in the annotation.
    let cni = pod_json(json!({
        "metadata": {"annotations": {
            "sidecar.istio.io/status": sidecar_status(r#"["istio-validation"]"#),
            "sidecar.istio.io/interceptionMode": "TPROXY"}},
        "spec": {"initContainers": [{"name": "istio-validation", "args": ["istio-iptables", "--run-validation", "--skip-rule-apply"]}]}
    }));
    assert_eq!(
        view(&cni).unwrap_err(),
        NotTracked::Interception {
            mode: "TPROXY".into()
        }
    );
    let cni_redirect = pod_json(json!({
        "metadata": {"annotations": {
            "sidecar.istio.io/status": sidecar_status(r#"["istio-validation"]"#),
            "sidecar.istio.io/interceptionMode": "REDIRECT"}},
        "spec": {"initContainers": [{"name": "istio-validation", "args": ["istio-iptables", "--run-validation", "--skip-rule-apply"]}]}
    }));
    assert!(view(&cni_redirect).is_ok());
}

#[test]
fn not_injected_by_istio_stays_out() {
    let no_annotation =
        pod_json(json!({"metadata": {"annotations": {"sidecar.istio.io/status": null}}}));
    let err = view(&no_annotation).unwrap_err();
    assert!(
        matches!(&err, NotTracked::NotInjected { why, .. } if why.contains("no sidecar.istio.io/status")),
        "{err:?}"
    );
    // interceptionMode NONE: the template injects no init container.
    let none = pod_json(json!({
        "metadata": {"annotations": {"sidecar.istio.io/status": sidecar_status("null")}},
        "spec": {"initContainers": null}
    }));
    assert!(matches!(
        view(&none).unwrap_err(),
        NotTracked::NotInjected { .. }
    ));
    let garbage =
        pod_json(json!({"metadata": {"annotations": {"sidecar.istio.io/status": "{not json"}}}));
    let err = view(&garbage).unwrap_err();
    assert!(err.to_string().contains("not Istio's JSON"), "{err}");
}

/// gVisor (GKE Sandbox's `gvisor`) and Kata (`kata*`: kata-deploy's, AKS' `kata-vm-isolation`)
/// pods are left alone with the reason; other classes (`nvidia`, `runc`) are acted on; the list
/// is the operator's (`--sandboxed-runtime-classes`).
#[test]
fn sandboxed_runtime_classes_stay_out() {
    for class in ["gvisor", "runsc", "kata", "kata-qemu", "kata-vm-isolation"] {
        let err = view(&pod_json(json!({"spec": {"runtimeClassName": class}}))).unwrap_err();
        assert_eq!(
            err,
            NotTracked::Sandboxed {
                runtime_class: class.into()
            }
        );
        assert!(err.to_string().contains(class), "{err}");
    }
    for class in ["nvidia", "runc", "crun", "gvisor-not"] {
        assert!(
            view(&pod_json(json!({"spec": {"runtimeClassName": class}}))).is_ok(),
            "{class}"
        );
    }
    let only_mine = ProxyConfig {
        sandboxed_runtime_classes: vec!["my-sandbox".into()],
        ..ProxyConfig::default()
    };
    let pod = pod_json(json!({"spec": {"runtimeClassName": "my-sandbox"}}));
    assert!(matches!(
        PodView::from_pod(&pod, "node-a", &only_mine, &HoldSettings::default()),
        Err(NotTracked::Sandboxed { .. })
    ));
}

#[test]
fn host_users_false_stays_out() {
    let err = view(&pod_json(json!({"spec": {"hostUsers": false}}))).unwrap_err();
    assert_eq!(err, NotTracked::HostUsers);
    assert!(view(&pod_json(json!({"spec": {"hostUsers": true}}))).is_ok());
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

/// kubernetes/kubernetes pkg/kubelet/kubelet_pods.go reports a container not started yet as
/// `waiting` (ContainerCreating, PodInitializing, ImagePullBackOff); a crash-looping one as
/// `waiting` with a terminated `lastState` and a restart count.
#[test]
fn an_app_that_never_ran_is_never_finished() {
    let job = |app_status: serde_json::Value| {
        let mut p = pod_json(json!({"status": {"containerStatuses": [app_status,
            status("istio-proxy", json!({"running": {"startedAt": "2026-11-22T10:00:01Z"}}))]}}));
        p.spec.as_mut().unwrap().restart_policy = Some("Never".into());
        view(&p).unwrap()
    };
    for reason in ["ContainerCreating", "PodInitializing", "ImagePullBackOff"] {
        let v = job(status("app", json!({"waiting": {"reason": reason}})));
        let app = v.app_containers().next().unwrap();
        assert!(!app.ran && !app.has_run(), "{reason}");
        assert!(!v.apps_finished_for_good(), "{reason}");
    }
    let mut crashed = status("app", json!({"waiting": {"reason": "CrashLoopBackOff"}}));
    crashed["lastState"] = json!({"terminated": {"exitCode": 1}});
    crashed["restartCount"] = json!(2);
    let v = job(crashed);
    assert!(v.app_containers().next().unwrap().ran);
    assert!(
        !v.apps_finished_for_good(),
        "waiting again: the kubelet restarts it"
    );
}

fn init_status(name: &str, state: serde_json::Value) -> serde_json::Value {
    let mut s = status(name, state);
    s["containerID"] = json!(format!("containerd://{}", "c".repeat(64)));
    s
}

#[test]
fn init_containers_and_native_log_shipper() {
    let shipper =
        json!({"name": "log-shipper", "image": "fluent-bit:3", "restartPolicy": "Always"});
    let vault = json!({"name": "vault-agent-init", "image": "hashicorp/vault:1.17"});
    let pod = |init_statuses: serde_json::Value| {
        view(&pod_json(json!({
            "spec": {"initContainers": [istio_init("REDIRECT"), vault.clone(), shipper.clone()],
                     "restartPolicy": "Never"},
            "status": {"initContainerStatuses": init_statuses}
        })))
        .unwrap()
    };
    let done = json!({"terminated": {"exitCode": 0, "reason": "Completed"}});
    let running = json!({"running": {"startedAt": "2026-11-22T10:00:01Z"}});

    let v = pod(json!([
        init_status("istio-init", done.clone()),
        init_status("vault-agent-init", running.clone()),
        status(
            "log-shipper",
            json!({"waiting": {"reason": "PodInitializing"}})
        )
    ]));
    let apps: Vec<_> = v
        .app_containers()
        .map(|c| (c.name.as_str(), c.restartable))
        .collect();
    assert_eq!(apps, vec![("app", false), ("log-shipper", true)]);
    assert_eq!(v.regular_app_containers().count(), 1);

    // The Job's app exited; the log shipper still runs (the kubelet stops it after the proxy):
    // the Job is finished.
    let finished = pod_json(json!({
        "spec": {"initContainers": [istio_init("REDIRECT"), shipper.clone()], "restartPolicy": "Never"},
        "status": {"initContainerStatuses": [init_status("istio-init", done.clone()), init_status("log-shipper", running.clone())],
                   "containerStatuses": [status("app", json!({"terminated": {"exitCode": 0}})),
                                         status("istio-proxy", running)]}
    }));
    assert!(view(&finished).unwrap().apps_finished_for_good());
}

#[test]
fn ipv6_admin_address_follows_istio_bootstrap() {
    let proxy = ProxyConfig::default();
    let ips = |ips: &[&str], env: serde_json::Value| {
        let list: Vec<_> = ips.iter().map(|ip| json!({"ip": ip})).collect();
        view(&pod_json(json!({
            "spec": {"containers": [{"name": "app"}, istio_proxy(env)]},
            "status": {"podIP": ips.first(), "podIPs": list}
        })))
        .unwrap()
    };
    let v4 = ips(&["10.244.1.7"], json!([]));
    assert_eq!(v4.admin_addr(&proxy), "127.0.0.1:15000".parse().unwrap());
    assert!(!v4.has_ipv6());

    let v6 = ips(&["fd00:10:244::7"], json!([]));
    assert_eq!(v6.admin_addr(&proxy), "[::1]:15000".parse().unwrap());
    assert!(v6.has_ipv6());

    // Dual stack, IPv6 first: ::1 only with ISTIO_DUAL_STACK (pkg/bootstrap/config.go).
    let v6_first = ips(&["fd00:10:244::7", "10.244.1.7"], json!([]));
    assert_eq!(
        v6_first.admin_addr(&proxy),
        "127.0.0.1:15000".parse().unwrap()
    );
    assert!(v6_first.has_ipv6());
    let v6_first_ds = ips(
        &["fd00:10:244::7", "10.244.1.7"],
        json!([{"name": "ISTIO_DUAL_STACK", "value": "true"}]),
    );
    assert_eq!(
        v6_first_ds.admin_addr(&proxy),
        "[::1]:15000".parse().unwrap()
    );
    let v4_first = ips(
        &["10.244.1.7", "fd00:10:244::7"],
        json!([{"name": "ISTIO_DUAL_STACK", "value": "true"}]),
    );
    assert_eq!(
        v4_first.admin_addr(&proxy),
        "127.0.0.1:15000".parse().unwrap()
    );
    assert!(v4_first.has_ipv6());

    // Only the legacy status.podIP.
    let legacy = view(&pod_json(json!({"status": {"podIP": "fd00::9"}}))).unwrap();
    assert_eq!(legacy.admin_addr(&proxy), "[::1]:15000".parse().unwrap());
    // A configured port (the agent's --admin-addr) is kept.
    let custom = ProxyConfig {
        admin: "127.0.0.1:19000".parse().unwrap(),
        ..ProxyConfig::default()
    };
    let v6_custom = PodView::from_pod(
        &pod_json(json!({"status": {"podIP": "fd00::9", "podIPs": [{"ip": "fd00::9"}]}})),
        "node-a",
        &custom,
        &HoldSettings::default(),
    )
    .unwrap();
    assert_eq!(
        v6_custom.admin_addr(&custom),
        "[::1]:19000".parse().unwrap()
    );
    // Garbage in status: ignored, reported, IPv4 default.
    let bad = view(&pod_json(
        json!({"status": {"podIPs": [{"ip": "not-an-ip"}]}}),
    ))
    .unwrap();
    assert_eq!(bad.admin_addr(&proxy), proxy.admin);
    assert_eq!(bad.overrides.problems.len(), 1);
}

#[test]
fn dns_capture_and_exit_on_zero_from_env_or_annotation() {
    let with = |env: serde_json::Value, annotation: Option<&str>| {
        let mut extra = json!({"spec": {"containers": [{"name": "app"}, istio_proxy(env)]}});
        if let Some(a) = annotation {
            extra["metadata"] = json!({"annotations": {"proxy.istio.io/config": a}});
        }
        view(&pod_json(extra)).unwrap()
    };
    let off = with(json!([]), None);
    assert!(!off.dns_capture() && !off.exit_on_zero());

    // The injector renders proxyMetadata as env vars on istio-proxy.
    let on = with(
        json!([{"name": "ISTIO_META_DNS_CAPTURE", "value": "true"},
                         {"name": "EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "value": "True"}]),
        None,
    );
    assert!(on.dns_capture() && on.exit_on_zero());
    assert!(on.overrides.problems.is_empty());

    let from_annotation = with(
        json!([]),
        Some("proxyMetadata:\n  ISTIO_META_DNS_CAPTURE: \"true\"\n"),
    );
    assert!(from_annotation.dns_capture());
    // pilot-agent reads its env: the env wins over the annotation.
    let env_wins = with(
        json!([{"name": "ISTIO_META_DNS_CAPTURE", "value": "false"}]),
        Some(r#"{"proxyMetadata": {"ISTIO_META_DNS_CAPTURE": "true"}}"#),
    );
    assert!(!env_wins.dns_capture());

    let malformed = with(
        json!([{"name": "ISTIO_META_DNS_CAPTURE", "value": "yes"}]),
        Some("{broken"),
    );
    assert!(!malformed.dns_capture());
    assert_eq!(
        malformed.overrides.problems.len(),
        2,
        "{:?}",
        malformed.overrides.problems
    );
    assert!(malformed
        .overrides
        .problems
        .iter()
        .any(|p| p.contains("\"yes\"")));

    let value_from = with(
        json!([{"name": "EXIT_ON_ZERO_ACTIVE_CONNECTIONS",
                                  "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}]),
        None,
    );
    assert!(!value_from.exit_on_zero());
    assert!(value_from.overrides.problems[0].contains("valueFrom"));
}

#[test]
fn drain_advice_depends_on_exit_on_zero() {
    let plain = view(&pod_json(json!({}))).unwrap();
    let advice = drain_advice(&plain);
    assert!(
        advice.contains("terminationDrainDuration") && advice.contains("grace period"),
        "{advice}"
    );
    assert!(!advice.contains(crate::mesh::istio::ENV_EXIT_ON_ZERO));
    let on = view(&pod_json(json!({"spec": {"containers": [{"name": "app"},
        istio_proxy(json!([{"name": "EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "value": "true"}]))]}})))
    .unwrap();
    let advice = drain_advice(&on);
    assert!(
        advice.contains("Remove EXIT_ON_ZERO_ACTIVE_CONNECTIONS"),
        "{advice}"
    );
    assert!(advice.contains("no effect"), "{advice}");
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
