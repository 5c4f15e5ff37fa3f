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

fn with_pod_ips(pod: &mut Pod, ips: &[&str]) {
    let ips: Vec<_> = ips
        .iter()
        .map(|ip| serde_json::json!({ "ip": ip }))
        .collect();
    pod.status = Some(serde_json::from_value(serde_json::json!({ "podIPs": ips })).unwrap());
}

/// The consul-dataplane container's args, as `f` changes them.
fn consul_args(pod: &mut Pod, f: impl FnOnce(&mut Vec<String>)) {
    let c = pod
        .spec
        .as_mut()
        .unwrap()
        .containers
        .iter_mut()
        .find(|c| c.name == "consul-dataplane")
        .unwrap();
    f(c.args.as_mut().unwrap());
}

#[test]
fn consul_admin_address_is_the_injectors_flag_not_the_pods_ips() {
    // hashicorp/consul-k8s control-plane/connect-inject/webhook/consul_dataplane_sidecar.go
    // (v1.9.0, v2.0.3): `-envoy-admin-bind-address=` is `Getv4orv6Str("127.0.0.1", "::1")`,
    // `::1` only with CONSUL_DUAL_STACK (Helm's global.dualStack.enabled), whatever the pod's
    // IPs. An IPv6-only pod whose injector wrote 127.0.0.1 has its admin there.
    let mut pod = corpus("pod-consul-classic.json");
    with_pod_ips(&mut pod, &["fd00::5"]);
    let v = view(pod).unwrap();
    assert_eq!(v.admin_tcp(), Some("127.0.0.1:19000".parse().unwrap()));
    // A dual-stack pod (IPv4 first) of a dual-stack install: the admin on ::1.
    let mut pod = corpus("pod-consul-classic.json");
    with_pod_ips(&mut pod, &["10.0.0.5", "fd00::5"]);
    consul_args(&mut pod, |args| {
        for a in args.iter_mut() {
            if a.starts_with("-envoy-admin-bind-address=") {
                *a = "-envoy-admin-bind-address=::1".into();
            }
        }
    });
    let v = view(pod).unwrap();
    assert_eq!(v.admin_tcp(), Some("[::1]:19000".parse().unwrap()));
}

#[test]
fn consul_admin_port_is_the_injectors_flag() {
    // Multi-port pods: `-envoy-admin-bind-port=` 19000 + the service's index (same file).
    let mut pod = corpus("pod-consul-classic.json");
    consul_args(&mut pod, |args| {
        args.push("-envoy-admin-bind-port=19001".into())
    });
    let v = view(pod).unwrap();
    assert_eq!(v.admin_tcp(), Some("127.0.0.1:19001".parse().unwrap()));
    // Go's flag forms, and values that are not an address: the default, said.
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut problems = Vec::new();
    assert_eq!(
        consul::admin_for(
            &args(&[
                "--envoy-admin-bind-address",
                "::1",
                "-envoy-admin-bind-port",
                "19002"
            ]),
            &mut problems
        ),
        tcp("[::1]:19002")
    );
    assert!(problems.is_empty());
    assert_eq!(
        consul::admin_for(&args(&["-envoy-admin-bind-address=0.0.0.0"]), &mut problems),
        tcp("127.0.0.1:19000")
    );
    assert_eq!(
        consul::admin_for(
            &args(&["-envoy-admin-bind-address=junk", "-envoy-admin-bind-port=0"]),
            &mut problems
        ),
        tcp("127.0.0.1:19000")
    );
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert_eq!(
        consul::admin_for(&[], &mut problems),
        tcp("127.0.0.1:19000")
    );
}

#[test]
fn kuma_admin_stays_ipv4_on_an_ipv6_only_pod() {
    // kumahq/kuma pkg/config/app/kuma-cp/kuma-cp.defaults.yaml (v2.13.10, v2.14.3):
    // `bootstrapServer.params.adminAddress: 127.0.0.1`, copied into every bootstrap
    // (pkg/xds/bootstrap/generator.go), whatever the pod's IPs; kuma-dp itself calls
    // `http://127.0.0.1:%d` (app/kuma-dp/pkg/dataplane/envoy/envoy.go).
    for ips in [&["fd00::7"][..], &["fd00::7", "10.0.0.7"][..]] {
        let mut pod = corpus("pod-kuma-classic.json");
        with_pod_ips(&mut pod, ips);
        let v = view(pod).unwrap();
        assert!(v.has_ipv6());
        assert_eq!(
            v.admin_tcp(),
            Some("127.0.0.1:9901".parse().unwrap()),
            "{ips:?}"
        );
    }
    // Istio's still follows the pod's IPs.
    let mut pod = corpus("pod-istio-httpbin.json");
    with_pod_ips(&mut pod, &["fd00::8"]);
    assert_eq!(
        view(pod).unwrap().admin_tcp(),
        Some("[::1]:15000".parse().unwrap())
    );
}

#[test]
fn kuma_uid_and_capture_ports_are_the_pods_annotations() {
    // injector.go `NewAnnotations` (v2.13.10, v2.14.3) writes kuma.io/sidecar-uid and
    // kuma.io/transparent-proxying-{outbound,inbound}-port on every injected pod, from the
    // control plane's settings or the pod's overrides; kuma-init reads them back.
    let mut pod = corpus("pod-kuma-classic.json");
    let a = pod.metadata.annotations.as_mut().unwrap();
    a.insert(kuma::ANNOTATION_SIDECAR_UID.into(), "5679".into());
    a.insert(kuma::ANNOTATION_OUTBOUND_PORT.into(), "15101".into());
    a.insert(kuma::ANNOTATION_INBOUND_PORT.into(), "15106".into());
    let v = view(pod).unwrap();
    assert_eq!(v.profile.proxy_uid, 5679);
    assert_eq!(
        (v.profile.outbound_port, v.profile.inbound_port),
        (15101, 15106)
    );
    // Not numbers: Kuma's defaults, said on the row.
    let mut pod = corpus("pod-kuma-classic.json");
    let a = pod.metadata.annotations.as_mut().unwrap();
    a.insert(kuma::ANNOTATION_SIDECAR_UID.into(), "root".into());
    a.insert(kuma::ANNOTATION_OUTBOUND_PORT.into(), "70000".into());
    let v = view(pod).unwrap();
    assert_eq!(
        (v.profile.proxy_uid, v.profile.outbound_port),
        (5678, 15001)
    );
    assert_eq!(v.overrides.problems.len(), 2, "{:?}", v.overrides.problems);
}

#[test]
fn kuma_readiness_wants_no_tcp_listener_on_its_udp_only_dns_port() {
    // kuma-dp's DNS proxy is `dns.Server{Net: "udp"}` (kumahq/kuma
    // app/kuma-dp/pkg/dataplane/dnsproxy/component.go, v2.14.3) and kuma-init RETURNs TCP/53
    // (pkg/transparentproxy/iptables/builder/builder_table_nat.go): nothing ever listens on
    // TCP 15053 in a Kuma pod.
    let kuma = kuma::profile();
    let w = crate::lifecycle::readiness::wanted_listeners(
        [kuma.outbound_port, kuma.inbound_port],
        kuma.dns_port,
        kuma.dns_tcp,
    );
    assert_eq!(w.tcp, vec![15001, 15006]);
    assert_eq!(w.udp, Some(15053));
    // pilot-agent serves DNS on both (istio-iptables redirects both).
    let istio = istio::profile(&ProxyConfig::default());
    let w = crate::lifecycle::readiness::wanted_listeners(
        [istio.outbound_port, istio.inbound_port],
        istio.dns_port,
        istio.dns_tcp,
    );
    assert_eq!(w.tcp, vec![15001, 15006, 15053]);
    assert_eq!(w.udp, Some(15053));
}

#[test]
fn own_listeners_are_each_meshs_default_stat_prefixes() {
    use crate::lifecycle::drain::in_flight::TrafficBytes;
    // Kuma's admin listener `kuma_envoy_admin` and Prometheus listener
    // `kuma_metrics_prometheus` (pkg/xds/envoy/names/resource_names.go, v2.14.3); Consul's
    // `envoy_ready` and `envoy_prometheus_metrics` (consul-dataplane
    // pkg/consuldp/testdata/TestBootstrapConfig/*.golden, v2.0.1). Their bytes are the
    // kubelet's probes and the scrapes, never the pod's traffic.
    let cases = [
        (kuma::profile(), "kuma_envoy_admin"),
        (kuma::profile(), "kuma_metrics_prometheus"),
        (consul::profile(), "envoy_ready"),
        (consul::profile(), "envoy_prometheus_metrics"),
    ];
    for (profile, own) in cases {
        let stats = [
            (format!("http.{own}.downstream_cx_rx_bytes_total"), 700u64),
            (
                "http.inbound_0.0.0.0_8080.downstream_cx_rx_bytes_total".to_string(),
                5,
            ),
        ];
        let t = TrafficBytes::from_stats_skipping(profile.own_http_prefixes, stats);
        assert_eq!(t.total, 5, "{own} counted as the pod's traffic");
    }
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

#[test]
fn consul_counts_come_from_its_capture_listeners_without_the_filter() {
    // Consul cannot load the filter; its transparent proxy is one outbound listener (a filter
    // chain per upstream) and one public listener, and its bootstrap keeps every stat
    // (hashicorp/consul agent/xds/listeners.go; consul-dataplane bootstrap goldens, v2.0.1), so
    // Envoy's own `listener.<address>_<port>.downstream_cx_active` are the directional counts.
    use crate::lifecycle::drain::in_flight::{self, DrainSample, InFlight, InFlightJudge};
    use std::time::{Duration, Instant};
    let prefix = crate::lifecycle::drain::DEFAULT_STAT_PREFIX;
    let p = consul::profile();
    let ports = p
        .listener_ports()
        .map(|(outbound, inbound)| in_flight::ListenerPorts { outbound, inbound });
    assert_eq!(p.listener_ports(), Some((15001, 20000)));
    let stats = |out: u64, inb: u64| {
        vec![
            (
                "listener.127.0.0.1_15001.downstream_cx_active".to_string(),
                out,
            ),
            ("listener.10.0.0.5_20000.downstream_cx_active".into(), inb),
            ("listener.admin.downstream_cx_active".into(), 1),
            (
                "listener.127.0.0.1_15001.worker_0.downstream_cx_active".into(),
                9,
            ),
            ("listener.0.0.0.0_21000.downstream_cx_active".into(), 4),
        ]
    };
    let busy =
        DrainSample::from_stats_with_listeners(prefix, p.own_http_prefixes, ports, stats(2, 1));
    assert!(busy.filter.is_none(), "no filter: not said to be there");
    let c = busy.counts().unwrap();
    assert_eq!(
        (c.outbound.cx_active, c.inbound.cx_active),
        (Some(2), Some(1))
    );
    let mut judge = InFlightJudge::new(Duration::from_millis(10));
    let t = Instant::now();
    assert_eq!(
        judge.observe(t, &busy),
        InFlight::Busy {
            connections: Some(3)
        }
    );
    let idle =
        DrainSample::from_stats_with_listeners(prefix, p.own_http_prefixes, ports, stats(0, 0));
    assert!(matches!(judge.observe(t, &idle), InFlight::Idle(_)));
    // Without them (what the drain read before) nothing could be seen at all.
    let before = DrainSample::from_stats_skipping(prefix, p.own_http_prefixes, stats(2, 1));
    assert_eq!(
        InFlightJudge::new(Duration::from_millis(10)).observe(t, &before),
        InFlight::Unseen
    );
    // The sample asks Envoy for exactly those gauges, and keeps them.
    let re = in_flight::sample_regex_with_listeners(prefix, ports);
    assert!(re.contains("(?:15001|20000)"), "{re}");
    assert!(in_flight::sample_keeps_with_listeners(
        prefix,
        ports,
        "listener.[::]_20000.downstream_cx_active"
    ));
    assert!(!in_flight::sample_keeps_with_listeners(
        prefix,
        ports,
        "listener.admin.downstream_cx_active"
    ));
    // Istio's and Kuma's capture listeners hand connections to others: not theirs.
    assert!(kuma::profile().listener_ports().is_none());
    assert!(istio::profile(&ProxyConfig::default())
        .listener_ports()
        .is_none());
}
