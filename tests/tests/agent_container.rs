//! The agent in its own container on the containerd backend, with exactly the privileges its
//! DaemonSet (`manifests/agent/daemonset.yaml`) grants: hostPID, its own netns, root, drop ALL +
//! SYS_ADMIN/NET_ADMIN/SYS_PTRACE, read-only root filesystem, no_new_privs, RuntimeDefault
//! seccomp. A pod whose Envoy is late boots with 0 refused calls; without NET_ADMIN the agent
//! says which capability is missing and the pod is no worse off than without holdfast.

use std::time::{Duration, Instant};

use holdfast_tests::agent::holdfast_binary;
use holdfast_tests::cri::agent_pod::{start_agent_pod, AgentPod, AgentPrivileges};
use holdfast_tests::cri::kubelet::remove_pod_cgroups;
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

fn start_agent(node: &SimNode, privs: &AgentPrivileges) -> AgentPod {
    let rt = holdfast_tests::cri::shared().expect("runtime");
    let holdfast = holdfast_binary().expect("holdfast binary");
    start_agent_pod(
        rt,
        privs,
        &holdfast,
        node.test_name(),
        node.node_name(),
        node.pods_dir(),
        node.work_dir(),
    )
    .expect("start the agent's pod")
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

fn finish(node: SimNode, agent: AgentPod) {
    let left = node.finish();
    let cg = remove_pod_cgroups(&agent.uid);
    assert!(left.is_empty(), "left behind: {left:#?}");
    assert!(cg.is_empty(), "{cg:?}");
}

#[test]
fn manifest_privileges_are_parsed() {
    let p = AgentPrivileges::shipped().expect("parse the DaemonSet");
    assert!(p.host_pid && !p.host_network);
    assert_eq!(p.run_as_user, Some(0));
    assert!(p.read_only_root && p.no_new_privs && p.seccomp_runtime_default);
    assert_eq!(p.cap_drop, ["ALL"]);
    let mut add = p.cap_add.clone();
    add.sort();
    assert_eq!(add, ["NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"]);
    assert_eq!(p.mount_paths, ["/run"]);
}

/// The DaemonSet's privileges suffice: the agent, in its container, holds the boot calls of a
/// pod whose Envoy is 2 s late; none is refused.
#[test]
fn agent_in_its_daemonset_container_holds_the_startup() {
    if runtime_for("agent_in_its_daemonset_container_holds_the_startup").is_none() {
        return;
    }
    let (_serial, mut node) = node("cragent");
    let privs = AgentPrivileges::shipped().expect("parse the DaemonSet");
    let agent = start_agent(&node, &privs);
    wait_log(&agent, "status API listening", Duration::from_secs(20));
    let pid_line = std::fs::read_to_string(&agent.log).unwrap_or_default();
    eprintln!("agent container log so far:\n{pid_line}");
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
fn agent_without_net_admin_names_the_capability_and_fails_open() {
    if runtime_for("agent_without_net_admin_names_the_capability_and_fails_open").is_none() {
        return;
    }
    let (_serial, mut node) = node("crnoadmin");
    let mut privs = AgentPrivileges::shipped().expect("parse the DaemonSet");
    privs.cap_add.retain(|c| c != "NET_ADMIN");
    let agent = start_agent(&node, &privs);
    wait_log(&agent, "status API listening", Duration::from_secs(20));
    // Where the runtime put the agent: its /proc/<pid>/cgroup, as the agent itself (hostPID, no
    // cgroup namespace on this cgroup v1/v2 hybrid) and the host see it.
    let rt = holdfast_tests::cri::shared().expect("runtime");
    let mut c = rt.client.clone();
    let st = rt
        .call(c.container_status(k8s_cri::v1::ContainerStatusRequest {
            container_id: agent.container_id.clone(),
            verbose: true,
        }))
        .expect("agent container status");
    let info = holdfast_tests::cri::status::parse_info(&st.info);
    let pid = holdfast_tests::cri::status::info_pid(&info).expect("agent pid");
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("agent cgroup");
    eprintln!("the agent container's /proc/{pid}/cgroup:\n{cgroup}");
    let parsed = holdfast::effects::procfs::parse_pod_cgroup(&cgroup).expect("a pod cgroup");
    assert_eq!(parsed.pod_uid, agent.uid);
    assert_eq!(
        parsed.container_id.as_deref(),
        Some(agent.container_id.as_str())
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
