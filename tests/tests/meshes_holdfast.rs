//! Kuma and Consul pods WITH holdfast (issue 31): the pods of `meshes.rs`, each mesh's own
//! failure there, here with the agent on the node; each test asserts what the app and the node
//! show (the app's report, the pod's containers and phase), beside the figure of its control in
//! `meshes.rs`. Both backends (on the containerd one the agent runs as the DaemonSet's pod); the
//! Kuma native sidecar's are in `meshes_native.rs` (netns backend only).

use std::time::{Duration, Instant};

use holdfast_tests::agent::AgentProcess;
use holdfast_tests::sim::{
    privileged, AppScript, KumaAdmin, Mesh, NodeOptions, Phase, PodPhase, PodSpec, SimNode,
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
    if privileged("kuma_classic_boot_calls_held_with_holdfast") {
        kuma_boot_calls_held("hfkumaboot", KumaAdmin::Tcp);
    }
}

/// The same with Kuma 2.14's default admin, its Unix socket: the agent reads Envoy's readiness
/// through the socket in the sidecar's mount namespace.
#[test]
#[ignore = "NOT PROVEN: the agent does not reach the Unix-socket admin yet (the hold is never released); run with --ignored"]
fn kuma_classic_unix_socket_boot_calls_held_with_holdfast() {
    if privileged("kuma_classic_unix_socket_boot_calls_held_with_holdfast") {
        kuma_boot_calls_held("hfkumauds", KumaAdmin::UnixSocket);
    }
}

fn kuma_boot_calls_held(test: &str, admin: KumaAdmin) {
    let mut node = node(test);
    let agent = agent(&node);
    let late = Duration::from_secs(2);
    node.add_pod(
        PodSpec::new("web")
            .mesh(Mesh::Kuma(admin))
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
    eprintln!("kuma classic ({admin:?} admin) with holdfast, Envoy {late:?} late: {startup:?}");
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

/// One node, pods of the three meshes (Istio native, Kuma classic with the TCP admin, Consul
/// classic): the agent's `/status` shows each with its mesh and mode.
#[test]
fn status_shows_each_pods_mesh_and_mode() {
    if !privileged("status_shows_each_pods_mesh_and_mode") {
        return;
    }
    use holdfast::api::{Mesh as AgentMesh, SidecarMode};
    let mut node = node("hfmeshes");
    let agent = agent(&node);
    node.add_pod(PodSpec::new("istio-web").native())
        .expect("add");
    node.add_pod(PodSpec::new("kuma-web").mesh(Mesh::Kuma(KumaAdmin::Tcp)))
        .expect("add");
    node.add_pod(PodSpec::new("consul-web").mesh(Mesh::Consul))
        .expect("add");
    node.start_pods().expect("start");
    for pod in ["istio-web", "kuma-web", "consul-web"] {
        node.wait_proxy_live(pod, Duration::from_secs(30))
            .expect("Envoy LIVE");
    }
    let want = [
        ("istio-web", AgentMesh::Istio, SidecarMode::Native),
        ("kuma-web", AgentMesh::Kuma, SidecarMode::Classic),
        ("consul-web", AgentMesh::Consul, SidecarMode::Classic),
    ];
    for (pod, mesh, mode) in want {
        let row = agent
            .wait_pod(
                "default",
                pod,
                Duration::from_secs(20),
                "ready, mesh on the row",
                |r| r.mesh.is_some() && r.mode.is_some() && r.phase == holdfast::api::Phase::Ready,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "{pod}: mesh {:?} mode {:?} phase {:?}",
            row.mesh, row.mode, row.phase
        );
        assert_eq!(row.mesh, Some(mesh), "{pod}: {row:#?}");
        assert_eq!(row.mode, Some(mode), "{pod}: {row:#?}");
    }
    for pod in ["istio-web", "kuma-web", "consul-web"] {
        node.delete_pod(pod).expect("delete");
    }
    for pod in ["istio-web", "kuma-web", "consul-web"] {
        node.wait_gone(pod, Duration::from_secs(40)).expect("gone");
    }
    assert_clean(node, agent);
}

/// Kuma classic: the app calls 2 s past SIGTERM and is done; the pod should end with it, not
/// after kuma-dp's fixed `drainTime` (control: `kuma_classic_drain_waits_drain_time_without_holdfast`).
/// kuma-dp's wait ends only on its timer or a second stop signal, not on Envoy's exit
/// (`kuma_classic_drain_ends_on_a_second_sigterm_not_on_quit`), so the agent has to end it.
#[test]
#[ignore = "NOT PROVEN: the agent's /quitquitquit does not end kuma-dp's drainTime wait (pod gone after 30 s, as without holdfast); run with --ignored"]
fn kuma_classic_drain_ends_with_the_app_with_holdfast() {
    if !privileged("kuma_classic_drain_ends_with_the_app_with_holdfast") {
        return;
    }
    let drain = Duration::from_secs(30);
    let mut node = node("hfkumadrain");
    let agent = agent(&node);
    node.add_pod(
        PodSpec::new("flusher")
            .mesh(Mesh::Kuma(KumaAdmin::Tcp))
            .mesh_drain(drain)
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
    eprintln!("kuma classic with holdfast: pod gone after {took:?} (drainTime {drain:?}); after SIGTERM {after:?}");
    assert_eq!(after.failed, 0, "{after:?}\n{}", agent.log_tail());
    assert!(after.ok >= 5, "the app called 2 s past SIGTERM: {after:?}");
    assert!(
        took < Duration::from_secs(6),
        "the pod ends with the app (~2 s), not after drainTime {drain:?}: {took:?}\n{}",
        agent.log_tail()
    );
    assert_eq!(view.proxy().and_then(|c| c.exit_code()), Some(0));
    assert_clean(node, agent);
}
