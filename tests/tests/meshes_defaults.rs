//! Kuma and Consul pods as their DEFAULT installs shape them (issue 37), each beside its
//! control without the agent. The netns backend only (the containerd backend builds neither
//! DNS capture nor IPv6: `cri::kubelet::unsupported`).
//!
//! - Kuma 2.13 classic (TCP admin) and 2.14 classic with its Unix-socket admin, both with the
//!   builtin DNS on, the default (kumahq/kuma pkg/config/app/kuma-cp/kuma-cp.defaults.yaml
//!   `builtinDNS.enabled: true`, v2.13.10 and v2.14.3): kuma-init redirects UDP DNS to kuma-dp's
//!   15053 and RETURNs TCP/53 (pkg/transparentproxy/iptables/builder/builder_table_nat.go);
//!   kuma-dp's DNS proxy serves UDP only (app/kuma-dp/pkg/dataplane/dnsproxy/component.go).
//!   Before issue 37 the agent's readiness wanted a TCP listener on 15053 too: the pod was never
//!   judged ready and held to the hold's deadline.
//! - Kuma on an IPv6-only pod: Envoy's admin stays on 127.0.0.1 (`bootstrapServer.params.
//!   adminAddress`), where the agent must ask it (it asked `[::1]` before).
//! - Consul on a dual-stack install (`global.dualStack.enabled`): consul-dataplane's
//!   `-envoy-admin-bind-address=::1` (hashicorp/consul-k8s control-plane/connect-inject/webhook/
//!   consul_dataplane_sidecar.go, v1.9.0), read from the container's args (the agent guessed
//!   from the pod's IPs before: 127.0.0.1 for an IPv6-first pod without `ISTIO_DUAL_STACK`).

use std::process::Command;
use std::time::{Duration, Instant};

use holdfast_tests::agent::AgentProcess;
use holdfast_tests::sim::{
    privileged, AppScript, IpFamilies, KumaAdmin, Mesh, NodeOptions, Phase, PodSpec, SimNode,
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

fn left(node: SimNode) {
    let left = node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// `<tool> -t nat -S` in the pod's netns.
fn nat_rules(node: &SimNode, pod: &str, tool: &str) -> String {
    let out = node
        .in_pod_netns(pod, || {
            Command::new(tool).args(["-w", "-t", "nat", "-S"]).output()
        })
        .expect("enter pod netns")
        .expect("run iptables");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Microseconds since the epoch of a container timestamp.
fn us(t: &k8s_openapi::jiff::Timestamp) -> i64 {
    t.as_microsecond()
}

/// The DNS proxy binds 0.5 s after kuma-dp starts, Envoy is ready ~2 s after it.
const DNS_LATE: Duration = Duration::from_millis(500);
const ENVOY_LATE: Duration = Duration::from_secs(2);

/// A Kuma pod as the default install makes it: builtin DNS on, the app looking the remote
/// service up by name, then calling it at boot and on until 1 s past SIGTERM.
fn kuma_default(name: &str, admin: KumaAdmin, families: IpFamilies) -> PodSpec {
    PodSpec::new(name)
        .mesh(Mesh::Kuma(admin))
        .ip_families(families)
        .dns_capture(DNS_LATE)
        .lookup_remote(true)
        .app(AppScript::BootThenCall {
            every: Duration::from_millis(100),
            pool: 1,
            after_sigterm: Duration::from_secs(1),
        })
        .proxy_delay(ENVOY_LATE)
        .call_timeout(ENVOY_LATE + Duration::from_secs(20))
        .mesh_drain(Duration::from_secs(30))
        .grace(Duration::from_secs(45))
}

/// Control: the same default Kuma pod without the agent. The app's boot lookup goes to
/// kuma-dp's 15053 before its DNS proxy is bound and fails; the app exits 1 and is restarted.
#[test]
fn kuma_default_dns_boot_lookup_fails_without_holdfast() {
    if !privileged("kuma_default_dns_boot_lookup_fails_without_holdfast") {
        return;
    }
    let mut node = node("kdefdns0");
    node.add_pod(kuma_default("web", KumaAdmin::Tcp, IpFamilies::V4).holdfast_enabled(false))
        .expect("add pod");
    node.start_pods().expect("start");
    let report = node
        .wait_report("web", Duration::from_secs(30), "a lookup", |r| {
            !r.lookups().is_empty()
        })
        .expect("the app looks up");
    let lookups = report.lookups();
    eprintln!("kuma default (builtin DNS), no agent: lookups {lookups:?}");
    assert!(
        lookups.first().is_some_and(|l| !l.0),
        "the first lookup, before kuma-dp's DNS proxy is bound, fails: {lookups:?}"
    );
    let rules = nat_rules(&node, "web", "iptables");
    assert!(
        rules.contains("--dport 53 -j REDIRECT --to-ports 15053"),
        "kuma-init redirects UDP DNS to kuma-dp: {rules}"
    );
    assert!(
        rules.contains("-p tcp") && rules.contains("--dport 53 -m owner ! --uid-owner 5678"),
        "kuma-init RETURNs the app's TCP DNS: {rules}"
    );
    left(node);
}

/// Kuma 2.13's default (classic, TCP admin, builtin DNS): held and released when Envoy is
/// ready; the pod's drain ends with the app.
#[test]
fn kuma_2_13_default_pod_with_holdfast() {
    if privileged("kuma_2_13_default_pod_with_holdfast") {
        kuma_default_with_holdfast("kdef213", KumaAdmin::Tcp, IpFamilies::V4);
    }
}

/// Kuma 2.14 classic (the Unix-socket admin, 2.14's default; classic where the API server is
/// older than 1.29 or `sidecarContainers` is off), builtin DNS on.
#[test]
fn kuma_2_14_classic_default_pod_with_holdfast() {
    if privileged("kuma_2_14_classic_default_pod_with_holdfast") {
        kuma_default_with_holdfast("kdef214", KumaAdmin::UnixSocket, IpFamilies::V4);
    }
}

/// Kuma on an IPv6-only pod (TCP admin): the admin stays on 127.0.0.1.
#[test]
fn kuma_ipv6_only_default_pod_with_holdfast() {
    if privileged("kuma_ipv6_only_default_pod_with_holdfast") {
        kuma_default_with_holdfast("kdef6", KumaAdmin::Tcp, IpFamilies::V6);
    }
}

/// Control of the IPv6-only Kuma pod: without the agent its boot lookup fails.
#[test]
fn kuma_ipv6_only_default_pod_without_holdfast() {
    if !privileged("kuma_ipv6_only_default_pod_without_holdfast") {
        return;
    }
    let mut node = node("kdef6x");
    node.add_pod(kuma_default("web", KumaAdmin::Tcp, IpFamilies::V6).holdfast_enabled(false))
        .expect("add pod");
    node.start_pods().expect("start");
    let report = node
        .wait_report("web", Duration::from_secs(30), "a lookup", |r| {
            !r.lookups().is_empty()
        })
        .expect("the app looks up");
    let lookups = report.lookups();
    eprintln!("kuma IPv6-only default, no agent: lookups {lookups:?}");
    assert!(lookups.first().is_some_and(|l| !l.0), "{lookups:?}");
    let rules6 = nat_rules(&node, "web", "ip6tables");
    assert!(
        rules6.contains("-A KUMA_MESH_OUTBOUND_REDIRECT -p tcp"),
        "kuma-init's IPv6 rules: {rules6}"
    );
    left(node);
}

fn kuma_default_with_holdfast(test: &str, admin: KumaAdmin, families: IpFamilies) {
    let mut node = node(test);
    let agent = agent(&node);
    node.add_pod(kuma_default("web", admin, families))
        .expect("add pod");
    node.start_pods().expect("start");
    let report = node
        .wait_report("web", Duration::from_secs(30), "boot calls", |r| {
            r.calls(Phase::Startup).ok + r.calls(Phase::Startup).failed >= 1
        })
        .expect("boot calls");
    let lookups = report.lookups();
    let startup = report.calls(Phase::Startup);
    eprintln!("{test}: lookups {lookups:?}, boot calls {startup:?}");
    assert!(
        !lookups.is_empty() && lookups.iter().all(|l| l.0),
        "every lookup answered: {lookups:?}\n{}",
        agent.log_tail()
    );
    if families == IpFamilies::V6 {
        assert!(lookups[0].2.contains(':'), "an IPv6 answer: {lookups:?}");
    }
    assert_eq!(startup.failed, 0, "{startup:?}\n{}", agent.log_tail());
    assert_eq!(report.starts(), 1, "no crash, no restart");
    let row = agent
        .wait_hold_ended("default", "web", Duration::from_secs(10))
        .expect("agent row");
    let hold = row.hold.expect("a hold");
    eprintln!("{test}: {hold:?}");
    assert!(hold.packets_held >= 1, "{hold:?}");
    assert_eq!(
        hold.outcome,
        Some(holdfast::api::HoldOutcome::Ready),
        "released because the proxy was seen ready (DNS judged by its UDP socket): {hold:?}\n{}",
        agent.log_tail()
    );
    // The goal is 50 ms after the proxy is ready (the bar; the single-pod runs here
    // release within it). Bounded loosely, as the repo's timing checks are, so a loaded CI
    // machine does not fail it: once it took longer with three test binaries on 2 cores.
    let lag = hold.ready_to_release_ms.expect("ready → release");
    eprintln!("{test}: released {lag} ms after the proxy was ready");
    assert!(lag <= 250.0, "released {lag} ms after ready: {hold:?}");

    // Deletion: the proxy ends with the app (kuma-dp's own drainTime is 30 s).
    node.wait_report("web", Duration::from_secs(20), "calling", |r| {
        r.calls(Phase::Running).ok >= 3
    })
    .expect("the app calls");
    let t = Instant::now();
    node.delete_pod("web").expect("delete");
    let view = node
        .wait_gone("web", Duration::from_secs(60))
        .expect("gone");
    let took = t.elapsed();
    let report = node.report("web").expect("report");
    let after = report.calls(Phase::AfterSigterm);
    let app = view
        .app()
        .and_then(|c| c.last_exit().cloned())
        .expect("app exit");
    let proxy = view
        .proxy()
        .and_then(|c| c.last_exit().cloned())
        .expect("proxy exit");
    let proxy_lag_ms = (us(&proxy.finished_at) - us(&app.finished_at)) as f64 / 1e3;
    eprintln!("{test}: gone after {took:?}, proxy {proxy_lag_ms} ms after the app; after SIGTERM {after:?}");
    assert_eq!(after.failed, 0, "{after:?}\n{}", agent.log_tail());
    assert!(
        proxy_lag_ms <= 500.0,
        "the proxy gone {proxy_lag_ms} ms after the app\n{}",
        agent.log_tail()
    );
    assert_eq!(proxy.exit_code, 0);
    drop(agent);
    left(node);
}

/// A Consul pod of a dual-stack install, IPv6 first: consul-dataplane's admin on `[::1]:19000`
/// (the injector's flag). The app calls 1 s past SIGTERM; consul-dataplane's own shutdown grace
/// is 30 s.
fn consul_dual_stack() -> PodSpec {
    PodSpec::new("dual")
        .mesh(Mesh::Consul)
        .consul_dual_stack()
        .ip_families(IpFamilies::DualV6First)
        .mesh_drain(Duration::from_secs(30))
        .grace(Duration::from_secs(45))
        .app(AppScript::CallThroughShutdown {
            every: Duration::from_millis(200),
            pool: 2,
            after_sigterm: Duration::from_secs(1),
        })
}

/// Control: without the agent the dual-stack Consul pod is gone only after consul-dataplane's
/// fixed 30 s shutdown grace.
#[test]
fn consul_dual_stack_drain_waits_fixed_grace_without_holdfast() {
    if !privileged("consul_dual_stack_drain_waits_fixed_grace_without_holdfast") {
        return;
    }
    let mut node = node("cdual0");
    node.add_pod(
        consul_dual_stack()
            .mesh_drain(Duration::from_secs(8))
            .holdfast_enabled(false),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    node.wait_proxy_live("dual", Duration::from_secs(20))
        .expect("Envoy LIVE on [::1]:19000");
    let t = Instant::now();
    node.delete_pod("dual").expect("delete");
    node.wait_gone("dual", Duration::from_secs(30))
        .expect("gone");
    let took = t.elapsed();
    eprintln!("consul dual-stack, no agent: gone after {took:?}");
    assert!(took >= Duration::from_secs(8), "{took:?}");
    left(node);
}

/// With the agent: the admin found on `[::1]:19000`, the proxy ends with the app.
#[test]
fn consul_dual_stack_drain_ends_with_the_app_with_holdfast() {
    if !privileged("consul_dual_stack_drain_ends_with_the_app_with_holdfast") {
        return;
    }
    let mut node = node("cdual");
    let agent = agent(&node);
    node.add_pod(consul_dual_stack()).expect("add pod");
    node.start_pods().expect("start");
    node.wait_report("dual", Duration::from_secs(30), "calling", |r| {
        r.calls(Phase::Running).ok >= 3
    })
    .expect("the app calls");
    let t = Instant::now();
    node.delete_pod("dual").expect("delete");
    let view = node
        .wait_gone("dual", Duration::from_secs(60))
        .expect("gone");
    let took = t.elapsed();
    let report = node.report("dual").expect("report");
    let after = report.calls(Phase::AfterSigterm);
    let app = view
        .app()
        .and_then(|c| c.last_exit().cloned())
        .expect("app exit");
    let proxy = view
        .proxy()
        .and_then(|c| c.last_exit().cloned())
        .expect("proxy exit");
    let proxy_lag_ms = (us(&proxy.finished_at) - us(&app.finished_at)) as f64 / 1e3;
    eprintln!("consul dual-stack with holdfast: gone after {took:?}, proxy {proxy_lag_ms} ms after the app; after SIGTERM {after:?}");
    assert_eq!(after.failed, 0, "{after:?}\n{}", agent.log_tail());
    assert!(
        proxy_lag_ms <= 500.0,
        "the proxy gone {proxy_lag_ms} ms after the app (consul-dataplane's grace is 30 s)\n{}",
        agent.log_tail()
    );
    assert_eq!(proxy.exit_code, 0);
    drop(agent);
    left(node);
}
