//! Kuma and Consul pods WITH holdfast (issue 31): the pods of `meshes.rs`, each mesh's own
//! failure there, here with the agent on the node; each test asserts what the app and the node
//! show (the app's report, the pod's containers and phase), beside the figure of its control in
//! `meshes.rs`. The netns backend only (the containerd backend does not build these shapes).

use std::time::{Duration, Instant};

use holdfast_tests::agent::AgentProcess;
use holdfast_tests::sim::{
    privileged, AppScript, CallError, KumaAdmin, Mesh, NodeOptions, Phase, PodPhase, PodSpec,
    SimNode,
};

fn node(test: &str) -> SimNode {
    let opts = NodeOptions {
        sim_app: Some(env!("CARGO_BIN_EXE_sim-app").into()),
        ..NodeOptions::default()
    };
    SimNode::for_test(test, opts)
}

fn agent(node: &SimNode) -> AgentProcess {
    AgentProcess::for_node_with(node, &[]).expect("start the holdfast agent")
}

fn assert_clean(node: SimNode, agent: AgentProcess) {
    drop(agent);
    let left = node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// Kuma classic (TCP admin), Envoy 2 s late: the boot calls are held until Envoy is ready, none
/// refused (control: `kuma_classic_boot_call_refused_without_holdfast`, refused at once).
#[test]
fn kuma_classic_boot_calls_held_with_holdfast() {
    if !privileged("kuma_classic_boot_calls_held_with_holdfast") {
        return;
    }
    let mut node = node("hfkumaboot");
    let agent = agent(&node);
    let late = Duration::from_secs(2);
    node.add_pod(
        PodSpec::new("web")
            .mesh(Mesh::Kuma(KumaAdmin::Tcp))
            .app(AppScript::CallAtStart { calls: 3 })
            .proxy_delay(late)
            .call_timeout(late + Duration::from_secs(20)),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    let report = node
        .wait_report("web", Duration::from_secs(30), "3 boot calls", |r| {
            r.calls(Phase::Startup).ok + r.calls(Phase::Startup).failed >= 3
        })
        .expect("boot calls");
    let startup = report.calls(Phase::Startup);
    eprintln!("kuma classic with holdfast, Envoy {late:?} late: {startup:?}");
    assert_eq!(startup.failed, 0, "{startup:?}\n{}", agent.log_tail());
    assert_eq!(report.starts(), 1, "no crash, no restart");
    let row = agent
        .wait_hold_ended("default", "web", Duration::from_secs(10))
        .expect("agent row");
    let hold = row.hold.expect("a hold");
    assert!(hold.connections_held >= 1, "{hold:?}");
    assert_clean(node, agent);
}

/// Consul classic: the app calls 2 s past SIGTERM and is done; the agent ends the proxy on that
/// evidence instead of consul-dataplane's fixed 30 s (control:
/// `consul_classic_drain_waits_fixed_grace_without_holdfast`, gone only after the wait).
#[test]
fn consul_classic_drain_ends_with_the_app_with_holdfast() {
    if !privileged("consul_classic_drain_ends_with_the_app_with_holdfast") {
        return;
    }
    let grace = Duration::from_secs(30);
    let mut node = node("hfconsuldrain");
    let agent = agent(&node);
    node.add_pod(
        PodSpec::new("flusher")
            .mesh(Mesh::Consul)
            .mesh_drain(grace)
            .grace(Duration::from_secs(45))
            .app(AppScript::CallThroughShutdown {
                every: Duration::from_millis(200),
                pool: 2,
                after_sigterm: Duration::from_secs(2),
            }),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    node.wait_report("flusher", Duration::from_secs(30), "calling", |r| {
        r.calls(Phase::Running).ok >= 3
    })
    .expect("the app calls");
    let t = Instant::now();
    node.delete_pod("flusher").expect("delete");
    let view = node
        .wait_gone("flusher", Duration::from_secs(60))
        .expect("gone");
    let took = t.elapsed();
    let report = node.report("flusher").expect("report");
    let after = report.calls(Phase::AfterSigterm);
    eprintln!("consul classic with holdfast: pod gone after {took:?} (fixed wait {grace:?}); after SIGTERM {after:?}");
    assert_eq!(after.failed, 0, "{after:?}\n{}", agent.log_tail());
    assert!(after.ok >= 5, "the app called 2 s past SIGTERM: {after:?}");
    assert!(
        took < Duration::from_secs(6),
        "the pod ends with the app (~2 s), not after the fixed {grace:?}: {took:?}\n{}",
        agent.log_tail()
    );
    assert_eq!(view.proxy().and_then(|c| c.exit_code()), Some(0));
    assert_clean(node, agent);
}

/// Consul Job (hashicorp/consul-k8s#1791): the app is done, the agent ends the proxy, the pod
/// Succeeds; consul-dataplane exits 0 and is not restarted (control:
/// `consul_job_never_completes_without_holdfast`, still Running 8 s later).
#[test]
fn consul_job_completes_with_holdfast() {
    if !privileged("consul_job_completes_with_holdfast") {
        return;
    }
    let mut node = node("hfconsuljob");
    let agent = agent(&node);
    node.add_pod(
        PodSpec::new("batch")
            .mesh(Mesh::Consul)
            .job()
            .app(AppScript::Batch {
                calls: 1,
                exit_code: 0,
            })
            .app_init(Duration::from_secs(1)),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    node.wait_app_exited("batch", Duration::from_secs(30))
        .expect("the app finishes");
    let t = Instant::now();
    let view = node
        .wait_phase("batch", PodPhase::Succeeded, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_tail()));
    eprintln!(
        "consul job with holdfast: Succeeded {:?} after the app exited",
        t.elapsed()
    );
    let proxy = view.proxy().expect("proxy");
    assert_eq!(proxy.exit_code(), Some(0));
    assert_eq!(proxy.restart_count, 0);
    node.delete_pod("batch").expect("delete");
    node.wait_gone("batch", Duration::from_secs(10))
        .expect("gone");
    assert_clean(node, agent);
}

/// Kuma 2.14 native sidecar with the admin on its Unix socket: Envoy crashes, the sidecar
/// restarts, and the app's calls meanwhile are held, none refused (control:
/// `kuma_native_unix_socket_restart_refuses_calls_without_holdfast`, ~25 refused).
#[test]
fn kuma_native_unix_socket_restart_covered_with_holdfast() {
    if !privileged("kuma_native_unix_socket_restart_covered_with_holdfast") {
        return;
    }
    let mut node = node("hfkumanative");
    let agent = agent(&node);
    node.add_pod(
        PodSpec::new("svc")
            .mesh(Mesh::Kuma(KumaAdmin::UnixSocket))
            .native()
            .app(AppScript::BootThenCall {
                every: Duration::from_millis(100),
                pool: 1,
                after_sigterm: Duration::ZERO,
            })
            .call_timeout(Duration::from_secs(10))
            .proxy_delay(Duration::from_secs(2)),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    node.wait_report("svc", Duration::from_secs(30), "calling", |r| {
        r.calls(Phase::Running).ok >= 5
    })
    .expect("the app calls");
    let before = node.report("svc").expect("report").calls(Phase::Running);
    node.kill_envoy("svc").expect("kill Envoy");
    node.wait_for("svc", Duration::from_secs(20), "sidecar restarted", |p| {
        p.proxy()
            .is_some_and(|c| c.restart_count >= 1 && c.is_running())
    })
    .expect("restart");
    node.wait_proxy_live("svc", Duration::from_secs(20))
        .expect("Envoy LIVE again");
    std::thread::sleep(Duration::from_secs(1));
    let after = node.report("svc").expect("report").calls(Phase::Running);
    let refused =
        after.errors(CallError::ConnectionRefused) - before.errors(CallError::ConnectionRefused);
    eprintln!("kuma native with holdfast: {refused} refused through the restart; {after:?}");
    assert_eq!(refused, 0, "{after:?}\n{}", agent.log_tail());
    node.delete_pod("svc").expect("delete");
    node.wait_gone("svc", Duration::from_secs(30))
        .expect("gone");
    assert_clean(node, agent);
}
