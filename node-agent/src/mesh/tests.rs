//! Recognition of each mesh's injected pod, on the pods as the injectors write them
//! (`node-agent/tests/corpus/pod-*.json`):
//!
//! - `pod-istio-httpbin.json`: Istio's sidecar template (see its own tests in `pod/tests.rs`);
//! - `pod-kuma-native-tcp.json`: kumahq/kuma
//!   pkg/plugins/runtime/k8s/webhooks/injector/testdata/inject.01.golden.yaml (master
//!   2026-08, 348b6528) as written (its injector runs with the TCP admin), the CA certificate
//!   shortened, a uid and node added;
//! - `pod-kuma-native-uds.json`: the same with the probes on kuma-dp's readiness port 9902, as
//!   pkg/plugins/runtime/k8s/containers/factory.go writes them with `envoyAdminUnixSocket`
//!   (the 2.14 default);
//! - `pod-kuma-classic.json`: the same as 2.13 writes it without native sidecars: `kuma-sidecar`
//!   a regular container, no preStop, no startup probe;
//! - `pod-consul-classic.json`, `pod-consul-native.json`, `pod-consul-job.json`: hashicorp/consul-k8s
//!   control-plane/connect-inject/webhook (mesh_webhook.go: the status annotation and label;
//!   consul_dataplane_sidecar.go: the container, its args, probes and security context, and with
//!   `enable-consul-dataplane-as-sidecar` the restartable init container with its exec startup
//!   probe; container_init.go: `consul-connect-inject-init`, its redirect-traffic config with
//!   uid 5995, inbound 20000, outbound 15001, excluded uid 5996).

use std::net::SocketAddr;

use k8s_openapi::api::core::v1::Pod;

use super::*;
use crate::api::SidecarMode;
use crate::config::HoldSettings;
use crate::pod::{NotTracked, PodView};

fn corpus(name: &str) -> Pod {
    let path = format!("{}/tests/corpus/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The pod as the agent reads it: through the pod source's trimming first.
fn view(pod: Pod) -> Result<PodView, NotTracked> {
    PodView::from_pod(
        &crate::source::slim(pod),
        "node-a",
        &ProxyConfig::default(),
        &HoldSettings::default(),
    )
}

fn tcp(addr: &str) -> AdminAt {
    AdminAt::Tcp(addr.parse::<SocketAddr>().unwrap())
}

#[test]
fn istio_pod_gets_istios_profile() {
    let v = view(corpus("pod-istio-httpbin.json")).unwrap();
    assert_eq!(v.profile.mesh, Mesh::Istio);
    assert_eq!(v.profile.proxy_uid, 1337);
    assert_eq!(
        (v.profile.outbound_port, v.profile.inbound_port),
        (15001, 15006)
    );
    assert_eq!(v.admin_tcp(), Some("127.0.0.1:15000".parse().unwrap()));
}

#[test]
fn kuma_classic_pod_with_tcp_admin() {
    let v = view(corpus("pod-kuma-classic.json")).unwrap();
    assert_eq!(v.profile.mesh, Mesh::Kuma);
    assert_eq!(v.mode, SidecarMode::Classic);
    assert_eq!(v.proxy_container().unwrap().name, "kuma-sidecar");
    assert_eq!(v.profile.proxy_uid, 5678);
    assert_eq!(
        (v.profile.outbound_port, v.profile.inbound_port),
        (15001, 15006)
    );
    assert_eq!(v.profile.admin, tcp("127.0.0.1:9901"));
    assert_eq!(v.admin_tcp(), Some("127.0.0.1:9901".parse().unwrap()));
    assert!(!v.prestop_drain);
    assert!(
        v.overrides.problems.is_empty(),
        "{:?}",
        v.overrides.problems
    );
    // The init step is the mesh's, not a user's init container.
    assert!(v.profile.init_steps.contains(&"kuma-init"));
}

#[test]
fn kuma_native_pod_with_tcp_admin_drains_by_its_prestop() {
    let v = view(corpus("pod-kuma-native-tcp.json")).unwrap();
    assert_eq!(v.profile.mesh, Mesh::Kuma);
    assert_eq!(v.mode, SidecarMode::Native);
    assert_eq!(v.profile.admin, tcp("127.0.0.1:9901"));
    // preStop `killall -USR2 kuma-dp`: kuma-dp drains at the deletion, exits at its SIGTERM.
    assert!(v.prestop_drain);
    assert!(v.proxy_startup_probe);
}

#[test]
fn kuma_native_pod_with_probes_on_the_readiness_port_has_the_socket_admin() {
    let v = view(corpus("pod-kuma-native-uds.json")).unwrap();
    assert_eq!(v.profile.mesh, Mesh::Kuma);
    assert_eq!(
        v.profile.admin,
        AdminAt::UnixSocket {
            parent: "/tmp",
            dir_prefix: "kuma-dp-",
            name: "kuma-envoy-admin.sock",
        }
    );
    assert_eq!(v.admin_tcp(), None);
}

#[test]
fn kuma_admin_port_annotation_moves_the_tcp_admin() {
    assert_eq!(
        kuma::admin_for(Some("9911"), Some(9911)),
        tcp("127.0.0.1:9911")
    );
    assert_eq!(
        kuma::admin_for(Some("junk"), Some(9901)),
        tcp("127.0.0.1:9901")
    );
    assert_eq!(kuma::admin_for(None, None), tcp("127.0.0.1:9901"));
    assert!(matches!(
        kuma::admin_for(Some("9911"), Some(9902)),
        AdminAt::UnixSocket { .. }
    ));
}

#[test]
fn consul_classic_pod() {
    let v = view(corpus("pod-consul-classic.json")).unwrap();
    assert_eq!(v.profile.mesh, Mesh::Consul);
    assert_eq!(v.mode, SidecarMode::Classic);
    assert_eq!(v.proxy_container().unwrap().name, "consul-dataplane");
    assert_eq!(v.profile.proxy_uid, 5995);
    assert_eq!(
        (v.profile.outbound_port, v.profile.inbound_port),
        (15001, 20000)
    );
    assert_eq!(v.admin_tcp(), Some("127.0.0.1:19000".parse().unwrap()));
    assert_eq!(v.profile.dns_port, None);
    assert!(!v.prestop_drain);
}

#[test]
fn consul_native_pod_has_no_prestop_drain() {
    let v = view(corpus("pod-consul-native.json")).unwrap();
    assert_eq!(v.profile.mesh, Mesh::Consul);
    assert_eq!(v.mode, SidecarMode::Native);
    // consul-dataplane drains only at its SIGTERM and then waits its fixed 30 s: the agent's
    // full drain ends it on evidence instead.
    assert!(!v.prestop_drain);
}

#[test]
fn consul_job_pod_is_a_job() {
    let v = view(corpus("pod-consul-job.json")).unwrap();
    assert_eq!(v.profile.mesh, Mesh::Consul);
    assert!(v.restart_policy.is_job());
}

#[test]
fn consul_ipv6_pod_asks_admin_on_v6_loopback() {
    let mut pod = corpus("pod-consul-classic.json");
    pod.status =
        Some(serde_json::from_value(serde_json::json!({"podIPs": [{"ip": "fd00::5"}]})).unwrap());
    let v = view(pod).unwrap();
    assert_eq!(v.admin_tcp(), Some("[::1]:19000".parse().unwrap()));
}

#[test]
fn consul_without_transparent_proxy_is_not_held() {
    let mut pod = corpus("pod-consul-classic.json");
    pod.metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove(consul::KEY_TRANSPARENT_PROXY_STATUS);
    match view(pod) {
        Err(NotTracked::NotInjected {
            mesh: Mesh::Consul,
            why,
        }) => {
            assert!(why.contains("transparent-proxy-status"), "{why}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn consul_marker_on_the_label_alone_is_enough() {
    let mut pod = corpus("pod-consul-classic.json");
    pod.metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove(consul::KEY_INJECT_STATUS);
    assert_eq!(view(pod).unwrap().profile.mesh, Mesh::Consul);
}

#[test]
fn consul_multi_port_pod_is_left_alone_with_its_reason() {
    let mut pod = corpus("pod-consul-classic.json");
    let spec = pod.spec.as_mut().unwrap();
    let mut second = spec.containers[1].clone();
    spec.containers[1].name = "consul-dataplane-web".into();
    second.name = "consul-dataplane-admin".into();
    spec.containers.push(second);
    match view(pod) {
        Err(e @ NotTracked::SeveralProxies { .. }) => {
            assert!(e.to_string().contains("consul-dataplane-web"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn kuma_sidecar_without_the_injected_marker_is_not_injected() {
    let mut pod = corpus("pod-kuma-classic.json");
    pod.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(kuma::ANNOTATION_SIDECAR_INJECTED.into(), "false".into());
    match view(pod) {
        Err(
            e @ NotTracked::NotInjected {
                mesh: Mesh::Kuma, ..
            },
        ) => {
            assert!(
                e.to_string().starts_with("not injected by Kuma's injector"),
                "{e}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_pod_of_no_mesh_is_not_meshed() {
    let mut pod = corpus("pod-kuma-classic.json");
    let spec = pod.spec.as_mut().unwrap();
    spec.containers.retain(|c| c.name == "busybox");
    spec.init_containers = None;
    assert_eq!(view(pod).unwrap_err(), NotTracked::NoProxy);
}

#[test]
fn a_marker_without_its_proxy_is_said_on_the_row_and_the_proxy_decides() {
    // A Kuma pod that also carries Consul's markers (copied labels), without consul-dataplane.
    let mut pod = corpus("pod-kuma-classic.json");
    let a = pod.metadata.annotations.as_mut().unwrap();
    a.insert(consul::KEY_INJECT_STATUS.into(), "injected".into());
    a.insert(
        consul::KEY_TRANSPARENT_PROXY_STATUS.into(),
        "enabled".into(),
    );
    let v = view(pod).unwrap();
    assert_eq!(v.profile.mesh, Mesh::Kuma);
    assert!(
        v.overrides.problems.iter().any(|p| p.contains("consul")),
        "{:?}",
        v.overrides.problems
    );
}

#[test]
fn two_meshes_proxies_both_marked_leave_the_pod_alone() {
    let mut pod = corpus("pod-kuma-classic.json");
    let consul_pod = corpus("pod-consul-classic.json");
    let dataplane = consul_pod.spec.unwrap().containers[1].clone();
    pod.spec.as_mut().unwrap().containers.push(dataplane);
    let a = pod.metadata.annotations.as_mut().unwrap();
    a.insert(consul::KEY_INJECT_STATUS.into(), "injected".into());
    a.insert(
        consul::KEY_TRANSPARENT_PROXY_STATUS.into(),
        "enabled".into(),
    );
    match view(pod) {
        Err(NotTracked::SeveralMeshes { meshes }) => {
            assert_eq!(meshes, vec![Mesh::Kuma, Mesh::Consul])
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn two_meshes_proxies_one_marked_follow_the_marked_one() {
    let mut pod = corpus("pod-kuma-classic.json");
    let consul_pod = corpus("pod-consul-classic.json");
    let dataplane = consul_pod.spec.unwrap().containers[1].clone();
    pod.spec.as_mut().unwrap().containers.push(dataplane);
    let v = view(pod).unwrap();
    assert_eq!(v.profile.mesh, Mesh::Kuma);
}

#[test]
fn the_source_keeps_every_marker_and_drops_other_labels() {
    let slim = crate::source::slim(corpus("pod-consul-classic.json"));
    let labels = slim.metadata.labels.unwrap();
    assert_eq!(
        labels.keys().collect::<Vec<_>>(),
        vec![consul::KEY_INJECT_STATUS]
    );
    let slim = crate::source::slim(corpus("pod-kuma-native-uds.json"));
    let sidecar = slim
        .spec
        .unwrap()
        .init_containers
        .unwrap()
        .into_iter()
        .find(|c| c.name == "kuma-sidecar")
        .unwrap();
    let probe = sidecar.readiness_probe.unwrap();
    assert_eq!(
        probe.http_get.unwrap().port,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(9902)
    );
    assert!(probe.failure_threshold.is_none(), "only the port is kept");
}

#[test]
fn proxy_name_matches_consuls_multi_port_form_only_with_a_service() {
    let p = consul::profile();
    assert!(p.proxy.matches("consul-dataplane"));
    assert!(p.proxy.matches("consul-dataplane-web"));
    assert!(!p.proxy.matches("consul-dataplane-"));
    assert!(!p.proxy.matches("consul"));
    assert!(!kuma::profile().proxy.matches("kuma-sidecar-x"));
}

#[test]
fn kuma_builtin_dns_is_held_on_its_port() {
    // inject.01.golden.yaml has the builtin DNS off (KUMA_DNS_ENABLED "false").
    let off = view(corpus("pod-kuma-classic.json")).unwrap();
    assert!(!off.dns_capture());
    let hold = crate::lifecycle::facts::hold_scope(&off);
    assert!(!hold.dns);
    // On, as factory.go writes it with builtinDNS enabled (port 15053, here 15054).
    let mut pod = corpus("pod-kuma-classic.json");
    let sidecar = pod
        .spec
        .as_mut()
        .unwrap()
        .containers
        .iter_mut()
        .find(|c| c.name == "kuma-sidecar")
        .unwrap();
    for e in sidecar.env.as_mut().unwrap().iter_mut() {
        if e.name == "KUMA_DNS_ENABLED" {
            e.value = Some("true".into());
        }
    }
    sidecar
        .env
        .as_mut()
        .unwrap()
        .push(k8s_openapi::api::core::v1::EnvVar {
            name: "KUMA_DNS_PROXY_PORT".into(),
            value: Some("15054".into()),
            value_from: None,
        });
    let on = view(pod).unwrap();
    assert!(on.dns_capture());
    assert_eq!(on.profile.dns_port, Some(15054));
    assert!(crate::lifecycle::facts::hold_scope(&on).dns);
}

#[test]
fn drain_advice_names_each_meshs_own_setting() {
    let kuma = view(corpus("pod-kuma-classic.json")).unwrap();
    assert!(crate::pod::drain_advice(&kuma).contains("kuma.io/sidecar-drain-time"));
    let consul = view(corpus("pod-consul-classic.json")).unwrap();
    assert!(crate::pod::drain_advice(&consul)
        .contains("consul.hashicorp.com/sidecar-proxy-lifecycle-shutdown-grace-period-seconds"));
    let istio = view(corpus("pod-istio-httpbin.json")).unwrap();
    assert!(crate::pod::drain_advice(&istio).contains("terminationDrainDuration"));
}
