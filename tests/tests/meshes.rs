//! Kuma and Consul pods on the simulated node (issue 31), WITHOUT holdfast: each mesh's own
//! failure reproduced and measured, on pods shaped as their injectors write them, with their
//! real nat rules in the pod's netns, the real Envoy and the kuma-dp / consul-dataplane
//! stand-ins (tests/src/sim/mesh.rs, dataplane.rs, which cite the source they follow).
//!
//! - Kuma classic (TCP admin): an app calling at boot before Envoy is ready is refused.
//! - Kuma classic: on SIGTERM kuma-dp waits its fixed `drainTime` although the app is gone.
//! - Kuma native (Unix-socket admin, 2.14's default): in `meshes_native.rs` (netns backend
//!   only).
//! - Consul classic: consul-dataplane waits its fixed shutdown grace after SIGTERM although the
//!   app is gone.
//! - Consul Job: the app is done, consul-dataplane runs on, the Job never completes
//!   (hashicorp/consul-k8s#1791).
//!
//! Both backends: `just test` runs this file on the containerd backend too (the init steps and
//! stand-ins as real containers, Kuma's sidecar with its emptyDir on `/tmp`).

use std::process::Command;
use std::time::{Duration, Instant};

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

fn assert_clean(node: SimNode) {
    let left = node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// `iptables -t nat -S` in the pod's netns.
fn nat_rules(node: &SimNode, pod: &str) -> String {
    let out = node
        .in_pod_netns(pod, || {
            Command::new("iptables")
                .args(["-w", "-t", "nat", "-S"])
                .output()
        })
        .expect("enter pod netns")
        .expect("run iptables");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The uid of a process (`Uid:` of /proc/<pid>/status, real uid).
fn uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Kuma classic, TCP admin: kuma-sidecar starts first (as Kuma injects it) but nothing waits
/// for its Envoy; the app's boot call is refused while Envoy is late.
#[test]
fn kuma_classic_boot_call_refused_without_holdfast() {
    if !privileged("kuma_classic_boot_call_refused_without_holdfast") {
        return;
    }
    let mut node = node("kumaboot");
    node.add_pod(
        PodSpec::new("web")
            .mesh(Mesh::Kuma(KumaAdmin::Tcp))
            .app(AppScript::CallAtStart { calls: 1 })
            .proxy_delay(Duration::from_secs(2))
            .holdfast_enabled(false),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    let view = node
        .wait_app_exited("web", Duration::from_secs(20))
        .expect("the app gives up");
    let report = node.report("web").expect("report");
    let startup = report.calls(Phase::Startup);
    eprintln!("kuma classic, Envoy 2 s late: boot calls {startup:?}");
    assert_eq!(startup.ok, 0, "{startup:?}");
    assert!(
        startup.errors(CallError::ConnectionRefused) >= 1,
        "refused by the kernel (REDIRECT to 15001, nothing listening): {startup:?}"
    );
    assert_eq!(
        view.app().and_then(|c| c.last_exit().map(|t| t.exit_code)),
        Some(1)
    );
    // Kuma's rules, and the proxy as uid 5678 once it runs.
    let rules = nat_rules(&node, "web");
    assert!(
        rules.contains("-A KUMA_MESH_OUTBOUND_REDIRECT -p tcp"),
        "{rules}"
    );
    assert!(rules.contains("--uid-owner 5678"), "{rules}");
    node.wait_proxy_live("web", Duration::from_secs(20))
        .expect("Envoy LIVE on 9901");
    let envoy = node.envoy_pid("web").expect("Envoy under kuma-dp");
    assert_eq!(uid_of(envoy), Some(5678));
    assert_clean(node);
}

/// Kuma classic: SIGTERM to kuma-dp → `/healthcheck/fail`, then its fixed `drainTime` whatever
/// the app does; the pod is gone only after it (10 s here: the default 30 s is the same code).
#[test]
fn kuma_classic_drain_waits_drain_time_without_holdfast() {
    if !privileged("kuma_classic_drain_waits_drain_time_without_holdfast") {
        return;
    }
    let drain = Duration::from_secs(10);
    let mut node = node("kumadrain");
    node.add_pod(
        PodSpec::new("idle")
            .mesh(Mesh::Kuma(KumaAdmin::Tcp))
            .mesh_drain(drain)
            .holdfast_enabled(false),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    node.wait_proxy_live("idle", Duration::from_secs(20))
        .expect("Envoy LIVE");
    let t = Instant::now();
    node.delete_pod("idle").expect("delete");
    let app_gone = node
        .wait_app_exited("idle", Duration::from_secs(10))
        .map(|_| t.elapsed())
        .expect("app exits on SIGTERM");
    let view = node
        .wait_gone("idle", Duration::from_secs(30))
        .expect("gone");
    let took = t.elapsed();
    eprintln!("kuma classic drainTime {drain:?}: app gone after {app_gone:?}, pod after {took:?}");
    assert!(app_gone < Duration::from_secs(2), "{app_gone:?}");
    assert!(took >= drain, "pod gone after {took:?}, before drainTime");
    assert_eq!(view.proxy().and_then(|c| c.exit_code()), Some(0));
    assert_clean(node);
}

/// Consul classic: SIGTERM → `drain_listeners?inboundonly&graceful&skip_exit`, the fixed
/// shutdown grace, `/quitquitquit`; the app exits at once, the pod goes only after the wait
/// (10 s here: the injected 30 s is the same code).
#[test]
fn consul_classic_drain_waits_fixed_grace_without_holdfast() {
    if !privileged("consul_classic_drain_waits_fixed_grace_without_holdfast") {
        return;
    }
    let grace = Duration::from_secs(10);
    let mut node = node("consuldrain");
    node.add_pod(
        PodSpec::new("idle")
            .mesh(Mesh::Consul)
            .mesh_drain(grace)
            .holdfast_enabled(false),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    node.wait_proxy_live("idle", Duration::from_secs(20))
        .expect("Envoy LIVE on 19000");
    let rules = nat_rules(&node, "idle");
    assert!(
        rules.contains("-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000"),
        "{rules}"
    );
    assert!(rules.contains("--uid-owner 5996 -j RETURN"), "{rules}");
    let envoy = node.envoy_pid("idle").expect("Envoy");
    assert_eq!(uid_of(envoy), Some(5995));
    let t = Instant::now();
    node.delete_pod("idle").expect("delete");
    let app_gone = node
        .wait_app_exited("idle", Duration::from_secs(10))
        .map(|_| t.elapsed())
        .expect("app exits on SIGTERM");
    let view = node
        .wait_gone("idle", Duration::from_secs(30))
        .expect("gone");
    let took = t.elapsed();
    eprintln!("consul classic grace {grace:?}: app gone after {app_gone:?}, pod after {took:?}");
    assert!(app_gone < Duration::from_secs(2), "{app_gone:?}");
    assert!(
        took >= grace,
        "pod gone after {took:?}, before the fixed wait"
    );
    assert_eq!(
        view.proxy().and_then(|c| c.exit_code()),
        Some(0),
        "/quitquitquit ends consul-dataplane with 0"
    );
    assert_clean(node);
}

/// Consul Job (hashicorp/consul-k8s#1791): the app finishes, consul-dataplane runs on; the
/// pod stays Running and the Job never completes.
#[test]
fn consul_job_never_completes_without_holdfast() {
    if !privileged("consul_job_never_completes_without_holdfast") {
        return;
    }
    let mut node = node("consuljob");
    node.add_pod(
        PodSpec::new("batch")
            .mesh(Mesh::Consul)
            .job()
            .app(AppScript::Batch {
                calls: 1,
                exit_code: 0,
            })
            .mesh_drain(Duration::from_secs(1))
            .holdfast_enabled(false),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    let view = node
        .wait_app_exited("batch", Duration::from_secs(30))
        .expect("the job's app finishes");
    assert_eq!(view.app().and_then(|c| c.exit_code()), Some(0));
    let report = node.report("batch").expect("report");
    assert!(report.all_calls().ok >= 1, "{:?}", report.all_calls());
    let done = Instant::now();
    let waited = Duration::from_secs(8);
    let completed = node.wait_for("batch", waited, "Succeeded", |p| {
        p.phase() == PodPhase::Succeeded
    });
    assert!(
        completed.is_err(),
        "the Job completed without holdfast: {completed:?}"
    );
    let view = node.pod("batch").expect("pod");
    eprintln!(
        "consul job: app done, {:?} later the pod is {} with consul-dataplane running",
        done.elapsed(),
        view.phase().as_str()
    );
    assert_eq!(view.phase(), PodPhase::Running);
    assert!(view.proxy().is_some_and(|c| c.is_running()));
    node.delete_pod("batch").expect("delete");
    node.wait_gone("batch", Duration::from_secs(30))
        .expect("gone");
    assert_clean(node);
}

/// What ending Kuma's classic drain takes (app/kuma-dp/cmd/run.go): once SIGTERM came, kuma-dp
/// waits `drainTime` in a `select` on the timer and the SECOND stop signal only; Envoy's exit
/// (a `/quitquitquit`) does not end that wait, so the container runs on until `drainTime`. A
/// second SIGTERM to kuma-dp ends it at once, with exit 0.
#[test]
fn kuma_classic_drain_ends_on_a_second_sigterm_not_on_quit() {
    if !privileged("kuma_classic_drain_ends_on_a_second_sigterm_not_on_quit") {
        return;
    }
    let drain = Duration::from_secs(8);
    let mut node = node("kumaquit");
    node.add_pod(
        PodSpec::new("idle")
            .mesh(Mesh::Kuma(KumaAdmin::Tcp))
            .mesh_drain(drain)
            .holdfast_enabled(false),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    node.wait_proxy_live("idle", Duration::from_secs(20))
        .expect("Envoy LIVE");
    let kuma_dp = node
        .pod("idle")
        .and_then(|v| v.proxy().and_then(|c| c.pid))
        .expect("kuma-dp");
    let t = Instant::now();
    node.delete_pod("idle").expect("delete");
    node.wait_app_exited("idle", Duration::from_secs(10))
        .expect("app exits");
    std::thread::sleep(Duration::from_millis(300));
    node.admin("idle", "POST", "/quitquitquit").expect("quit");
    std::thread::sleep(Duration::from_secs(2));
    let envoy_left = node.envoy_pid("idle");
    let view = node.pod("idle").expect("pod");
    assert!(
        view.proxy().is_some_and(|c| c.is_running()),
        "kuma-dp still waits its drainTime after Envoy quit"
    );
    assert_eq!(envoy_left, None, "Envoy is gone");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(kuma_dp as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("second SIGTERM");
    let view = node
        .wait_gone("idle", Duration::from_secs(10))
        .expect("gone");
    let took = t.elapsed();
    eprintln!("kuma classic: quit did not end the drain; a second SIGTERM did, pod gone after {took:?} (drainTime {drain:?})");
    assert!(took < drain, "{took:?}");
    assert_eq!(view.proxy().and_then(|c| c.exit_code()), Some(0));
    assert_clean(node);
}
