//! Which pods the real `holdfast` agent acts on, end to end through its pods directory: Pod
//! objects shaped as Istio's charts and templates write them (istio/istio
//! manifests/charts/istio-control/istio-discovery/files/{injection-template,
//! gateway-injection-template,waypoint}.yaml) are written next to a classic sidecar pod. The
//! classic pod is tracked (its row waits for its network namespace, as no process runs for it);
//! the others never get a tracked row — whatever reason row the status board may show for them,
//! it is never waiting, holding, ready or draining.

use std::time::{Duration, Instant};

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
fn gateways_waypoints_native_sidecars_and_tproxy_are_left_alone() {
    if !privileged("gateways_waypoints_native_sidecars_and_tproxy_are_left_alone") {
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

    // The classic pod proves the agent read the directory.
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        let status = agent.status().expect("status");
        if status.pods.iter().any(|p| p.name == "classic") || Instant::now() > deadline {
            break status;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let classic = status.pods.iter().find(|p| p.name == "classic");
    assert!(
        classic.is_some_and(|p| p.phase == AgentPhase::WaitingForNetns),
        "the classic sidecar pod is tracked and waits for its netns: {status:?}"
    );
    std::thread::sleep(Duration::from_millis(300));
    let status = agent.status().expect("status");
    for name in ["gateway", "waypoint", "native", "tproxy"] {
        let acted = status.pods.iter().filter(|p| p.name == name).any(|p| {
            matches!(
                p.phase,
                AgentPhase::WaitingForNetns
                    | AgentPhase::Holding
                    | AgentPhase::Ready
                    | AgentPhase::Draining
                    | AgentPhase::Quitting
            ) || p.hold.is_some()
        });
        assert!(!acted, "{name} is tracked: {status:?}");
    }
    for f in files {
        std::fs::remove_file(f).expect("remove pod file");
    }
    drop(agent);
    let left = node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
}
