//! The agent as a cluster runs it, on the containerd backend: its image built as `just image`
//! builds it, pushed to a registry on loopback and pulled through CRI `PullImage`; its pod the
//! DaemonSet as rendered from `manifests/` (pinned to that image by kustomize `images:`), with
//! exactly the privileges, env, mounts and probes written there. A pod whose Envoy is late boots
//! with 0 refused calls; the probes answer on the pod IP while `/status` answers loopback only;
//! without NET_ADMIN the agent says which capability is missing and the pod is no worse off than
//! without holdfast.

use std::time::{Duration, Instant};

use holdfast_tests::cri::agent_image;
use holdfast_tests::cri::agent_pod::{http_get, AgentPod, AgentPodSpec, PodContext};
use holdfast_tests::cri::runtime_for;
use holdfast_tests::sim::{AppScript, CallError, NodeOptions, Phase, PodSpec, Runtime, SimNode};

/// On the containerd backend the remote services (echo, cluster DNS on port 53) listen in the
/// host's netns on the CNI bridge: two nodes at once would fight over the same address, so the
/// tests of this binary run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn node(test: &str) -> (std::sync::MutexGuard<'static, ()>, SimNode) {
    let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let opts = NodeOptions {
        sim_app: Some(env!("CARGO_BIN_EXE_sim-app").into()),
        runtime: Runtime::Containerd,
        ..NodeOptions::default()
    };
    let node = SimNode::for_test(test, opts);
    (serial, node)
}

fn boot_caller(late: Duration) -> PodSpec {
    PodSpec::new("boot")
        .app(AppScript::CallAtStart { calls: 3 })
        .proxy_delay(late)
        .call_timeout(late + Duration::from_secs(20))
}

fn start_agent(node: &SimNode, spec: AgentPodSpec) -> AgentPod {
    let rt = holdfast_tests::cri::shared().expect("runtime");
    let ctx = PodContext {
        node_label: node.test_name().to_string(),
        node_name: node.node_name().to_string(),
        pods_dir: node.pods_dir().to_path_buf(),
        log_dir: node.work_dir().to_path_buf(),
        extra_args: Vec::new(),
    };
    AgentPod::start(rt, spec, &ctx, Duration::from_secs(30)).expect("start the agent's pod")
}

fn wait_log(agent: &AgentPod, what: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
        if log.contains(what) || Instant::now() >= deadline {
            return log;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn finish(node: SimNode, mut agent: AgentPod) {
    let left_pod = agent.remove();
    drop(agent);
    let left = node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
    assert!(left_pod.is_empty(), "{left_pod:?}");
}

/// The pod the tests run is the manifest's: rendered through the same overlay `just image`
/// writes, its image the pinned digest, every privilege as written.
#[test]
fn the_pod_run_is_the_rendered_daemonset_pinned_to_the_image() {
    let digest = format!("sha256:{}", "e".repeat(64));
    let pinned = holdfast_image::registry::ImageRef::parse(&format!(
        "127.0.0.1:5000/holdfast/agent@{digest}"
    ))
    .expect("a reference");
    let dir = std::env::temp_dir().join(format!("hf-agentpod-render-{}", std::process::id()));
    let spec = agent_image::render_pinned(&dir, &pinned).expect("render the overlay");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(spec.image().expect("image"), pinned.to_string());
    assert_eq!(spec.pod.host_pid, Some(true));
    assert_ne!(spec.pod.host_network, Some(true));
    let sc = spec
        .container
        .security_context
        .clone()
        .expect("securityContext");
    assert_eq!(sc.run_as_user, Some(0));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    let mut add = spec.cap_add();
    add.sort();
    assert_eq!(add, ["NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"]);
    assert!(
        spec.container.command.is_none(),
        "the image's entrypoint runs"
    );
}

/// The DaemonSet's privileges suffice: the agent, in its pulled container, holds the boot calls
/// of a pod whose Envoy is 2 s late; none is refused. The kubelet's probes reach `/healthz` and
/// `/readyz` on the pod IP's health port, Prometheus `/metrics` on its metrics port; `/status`
/// listens on the pod's loopback only (nothing answers on the pod IP), and from inside the pod
/// (a port-forward's path) it answers.
#[test]
#[ignore = "long form, `just test-all`: the image of the `quota` profile's agent"]
fn agent_in_its_daemonset_container_holds_the_startup() {
    if runtime_for("agent_in_its_daemonset_container_holds_the_startup").is_none() {
        return;
    }
    let (_serial, mut node) = node("cragent");
    let rt = holdfast_tests::cri::shared().expect("runtime");
    let pulled = agent_image::pulled(rt).expect("the agent image, pulled");
    let agent = start_agent(&node, pulled.spec.clone());
    let ip: std::net::IpAddr = agent.pod_ip.parse().expect("pod IP");
    let on_pod_ip = |port: u16, path: &str| {
        let addr = std::net::SocketAddr::new(ip, port);
        http_get(
            || std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)),
            path,
            Duration::from_secs(2),
        )
    };
    let ok = |port: u16, path: &str| {
        on_pod_ip(port, path)
            .unwrap_or_else(|e| panic!("GET {path} on the pod IP's port {port}: {e}"))
            .0
    };
    assert_eq!(ok(agent.health_port, "/healthz"), 200);
    assert_eq!(ok(agent.health_port, "/readyz"), 200);
    assert_eq!(ok(agent.metrics_port, "/metrics"), 200);
    let status = on_pod_ip(agent.status_port, "/status");
    assert!(
        status
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused),
        "/status listens on loopback only: {status:?}"
    );
    let (code, body) = http_get(
        || agent.connect_local(agent.status_port, Duration::from_secs(2)),
        "/status",
        Duration::from_secs(2),
    )
    .expect("GET /status from inside the pod");
    assert_eq!(code, 200, "{body}");
    node.add_pod(boot_caller(Duration::from_secs(2)))
        .expect("add pod");
    node.start_pods().expect("start");
    let report = node
        .wait_report("boot", Duration::from_secs(40), "3 boot calls", |r| {
            r.calls(Phase::Startup).ok + r.calls(Phase::Startup).failed >= 3
        })
        .expect("the app makes its boot calls");
    let log = wait_log(&agent, "hold released", Duration::from_secs(10));
    let startup = report.calls(Phase::Startup);
    assert_eq!(startup.failed, 0, "{startup:?}\nagent log:\n{log}");
    assert_eq!(startup.ok, 3);
    assert!(log.contains("hold released"), "agent log:\n{log}");
    finish(node, agent);
}

/// Without NET_ADMIN the agent cannot install its rules or bind its queue: it says so, naming
/// the capability, and the pod starts as it would without holdfast (the boot call is refused,
/// never hung).
#[test]
#[ignore = "long form, `just test-all`: the image of the `quota` profile's agent"]
fn agent_without_net_admin_names_the_capability_and_fails_open() {
    if runtime_for("agent_without_net_admin_names_the_capability_and_fails_open").is_none() {
        return;
    }
    let (_serial, mut node) = node("crnoadmin");
    let rt = holdfast_tests::cri::shared().expect("runtime");
    let mut spec = agent_image::pulled(rt).expect("the agent image").spec;
    spec.drop_added_capability("NET_ADMIN");
    assert!(!spec.cap_add().contains(&"NET_ADMIN".to_string()));
    let agent = start_agent(&node, spec);
    // Where the runtime put the agent: its /proc/<pid>/cgroup, as the agent itself (hostPID, no
    // cgroup namespace on this cgroup v1/v2 hybrid) and the host see it.
    let pid = agent.pid().expect("agent pid");
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("agent cgroup");
    eprintln!("the agent container's /proc/{pid}/cgroup:\n{cgroup}");
    let parsed = holdfast::effects::procfs::parse_pod_cgroup(&cgroup).expect("a pod cgroup");
    assert_eq!(parsed.pod_uid, agent.uid);
    assert_eq!(
        parsed.container_id.as_deref(),
        Some(agent.container_id.as_str())
    );
    assert!(
        cgroup.contains("/kubepods/burstable/pod"),
        "requests below limits: the Burstable QoS class's cgroup\n{cgroup}"
    );
    node.add_pod(
        PodSpec::new("boot")
            .app(AppScript::CallAtStart { calls: 1 })
            .proxy_delay(Duration::from_secs(2)),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    node.wait_app_exited("boot", Duration::from_secs(40))
        .expect("app exits");
    let report = node.report("boot").expect("report");
    let log = wait_log(&agent, "NET_ADMIN", Duration::from_secs(10));
    eprintln!("agent log without NET_ADMIN:\n{log}");
    assert!(
        report
            .calls(Phase::Startup)
            .errors(CallError::ConnectionRefused)
            > 0,
        "never worse than no agent: refused, not hung"
    );
    assert!(
        log.contains("NET_ADMIN"),
        "the error names the capability:\n{log}"
    );
    finish(node, agent);
}
