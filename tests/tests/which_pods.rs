//! Which pods the real `holdfast` agent acts on, end to end through its pods directory: Pod
//! objects shaped as Istio's charts and templates write them (istio/istio
//! manifests/charts/istio-control/istio-discovery/files/{injection-template,
//! gateway-injection-template,waypoint}.yaml) are written next to a classic sidecar pod. The
//! classic pod is tracked (its row waits for its network namespace, as no process runs for it);
//! the others get a `skipped` row that names why, and never a tracked phase or a hold.

use std::time::Duration;

use holdfast::api::SidecarMode;
use holdfast::report::board::Phase as AgentPhase;
use holdfast_tests::agent::AgentProcess;
use holdfast_tests::sim::{privileged, NodeOptions, SimNode};
use serde_json::{json, Value};

fn status_annotation(inits: &str) -> String {
    format!(
        r#"{{"initContainers":{inits},"containers":["istio-proxy"],"volumes":["istio-envoy"],"imagePullSecrets":null,"revision":"default"}}"#
    )
}

fn proxy(role: &str, mode: &str) -> Value {
    json!({"name": "istio-proxy", "image": "docker.io/istio/proxyv2:1.28.0",
           "args": ["proxy", role, "--domain", "$(POD_NAMESPACE).svc.cluster.local"],
           "env": [{"name": "ISTIO_META_INTERCEPTION_MODE", "value": mode}]})
}

fn istio_init(mode: &str) -> Value {
    json!({"name": "istio-init", "image": "docker.io/istio/proxyv2:1.28.0",
           "args": ["istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", mode,
                    "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020"]})
}

fn pod(node: &str, name: &str, uid_tail: u32, annotations: Value, spec: Value) -> Value {
    let mut spec = spec;
    spec["nodeName"] = json!(node);
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default",
                        "uid": format!("3f1c2b7a-5d4e-4c3b-9a2f-{uid_tail:012x}"),
                        "annotations": annotations},
           "spec": spec})
}

#[test]
fn gateways_waypoints_and_tproxy_are_left_alone_native_sidecars_are_tracked() {
    if !privileged("gateways_waypoints_and_tproxy_are_left_alone_native_sidecars_are_tracked") {
        return;
    }
    let node = SimNode::with_options("whichpods", NodeOptions::default())
        .unwrap_or_else(|e| panic!("cannot build the simulated node: {e}"));
    let agent = AgentProcess::for_node(&node).expect("start the holdfast agent");
    let n = node.node_name().to_string();
    let sidecar = json!({"sidecar.istio.io/status": status_annotation(r#"["istio-init"]"#)});
    let mut native_proxy = proxy("sidecar", "REDIRECT");
    native_proxy["restartPolicy"] = json!("Always");
    let pods = [
        pod(
            &n,
            "classic",
            1,
            sidecar.clone(),
            json!({"initContainers": [istio_init("REDIRECT")],
                   "containers": [{"name": "app", "image": "app"}, proxy("sidecar", "REDIRECT")]}),
        ),
        pod(
            &n,
            "gateway",
            2,
            json!({"sidecar.istio.io/status": status_annotation("null")}),
            json!({"containers": [proxy("router", "REDIRECT")]}),
        ),
        pod(
            &n,
            "waypoint",
            3,
            json!({"istio.io/rev": "default"}),
            json!({"containers": [proxy("waypoint", "REDIRECT")]}),
        ),
        pod(
            &n,
            "native",
            4,
            json!({"sidecar.istio.io/status": status_annotation(r#"["istio-init","istio-proxy"]"#)}),
            json!({"initContainers": [istio_init("REDIRECT"), native_proxy],
                   "containers": [{"name": "app", "image": "app"}]}),
        ),
        pod(
            &n,
            "tproxy",
            5,
            sidecar,
            json!({"initContainers": [istio_init("TPROXY")],
                   "containers": [{"name": "app", "image": "app"}, proxy("sidecar", "TPROXY")]}),
        ),
    ];
    let mut files = Vec::new();
    for p in &pods {
        let name = p["metadata"]["name"].as_str().expect("name");
        let path = node.pods_dir().join(format!("default_{name}.json"));
        std::fs::write(&path, p.to_string()).expect("write pod");
        files.push(path);
    }

    // The classic pod is tracked: it waits for its netns (no process runs for it).
    let classic = agent
        .wait_pod(
            "default",
            "classic",
            Duration::from_secs(10),
            "the classic pod's row",
            |r| r.phase == AgentPhase::WaitingForNetns,
        )
        .expect("the classic sidecar pod is tracked and waits for its netns");
    assert!(classic.skipped_reason.is_none(), "{classic:?}");
    assert_eq!(classic.mode, Some(SidecarMode::Classic), "{classic:?}");
    // A native sidecar (Istio 1.27+ on kubelets >= 1.33: the proxy is a restartable init
    // container) is tracked too, in native mode.
    let native = agent
        .wait_pod(
            "default",
            "native",
            Duration::from_secs(10),
            "the native pod's row",
            |r| r.phase == AgentPhase::WaitingForNetns,
        )
        .expect("the native sidecar pod is tracked and waits for its netns");
    assert_eq!(native.mode, Some(SidecarMode::Native), "{native:?}");
    // Every other pod has a `skipped` row that says why (what `holdfast status` shows), never a
    // tracked phase or a hold.
    for (name, reason) in [
        (
            "gateway",
            "not a sidecar pod (istio-proxy runs `proxy router`: a gateway)",
        ),
        (
            "waypoint",
            "not a sidecar pod (istio-proxy runs `proxy waypoint`: a waypoint)",
        ),
        ("tproxy", "interception mode TPROXY"),
    ] {
        let row = agent
            .wait_pod(
                "default",
                name,
                Duration::from_secs(10),
                "a skipped row",
                |r| r.phase == AgentPhase::Skipped,
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            row.skipped_reason
                .as_deref()
                .is_some_and(|r| r.starts_with(reason)),
            "{name}: the reason says why: {row:?}"
        );
        assert!(row.hold.is_none() && row.drain.is_none(), "{name}: {row:?}");
    }
    // And it stays so: the whole board, once more, has no tracked row but the two sidecar pods'.
    let status = agent.status().expect("status");
    let tracked: Vec<&str> = status
        .pods
        .iter()
        .filter(|p| p.phase != AgentPhase::Skipped)
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(tracked, ["classic", "native"], "{status:?}");
    for f in files {
        std::fs::remove_file(f).expect("remove pod file");
    }
    drop(agent);
    let left = node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
}
