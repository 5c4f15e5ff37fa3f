//! The startup hold on the pod shapes of issue 10 §4–5, end to end: the real `holdfast` agent on
//! the simulated node with real Envoy.
//!
//! - An IPv6-first dual-stack pod (Istio's ip6tables rules, admin on `[::1]:15000`, the app
//!   calling over IPv6): held and released, nothing refused; then deleted, and its drain reads
//!   Envoy's byte counters over `[::1]`.
//! - DNS capture (`ISTIO_META_DNS_CAPTURE`): the app's first step is a lookup through the
//!   system resolver, redirected to pilot-agent's 15053, which listens 2 s late: the lookup waits
//!   and is answered at the release (without the agent the first query is lost and glibc's
//!   retry 5 s later is answered).
//! - A user init container that calls out (vault-agent-init style, Istio CNI mode so its
//!   traffic is redirected): it fails as fast as without holdfast — never held.
//!
//! Each shape also runs without an agent, to show what the agent changes (and that the sim's
//! IPv6 and DNS paths work at all).
//!
//! The agent reads the shape from the Pod object (`status.podIPs`, the proxy's
//! `ISTIO_META_DNS_CAPTURE`, `initContainerStatuses`): the agent-side tests need the pods
//! helper's `PodView::has_ipv6()/dns_capture()/admin_addr()`, the admin helper's 15053
//! readiness, and the lifecycle's pass-through wiring (issue 10 round).

use std::process::Command;
use std::time::Duration;

use holdfast::api::{DrainOutcome, HoldOutcome, QuitReason};
use holdfast_tests::agent::AgentProcess;
use holdfast_tests::sim::report::AppReport;
use holdfast_tests::sim::{
    privileged, AppScript, CallError, IpFamilies, NodeOptions, Phase, PodSpec, SimNode,
};

fn node(test: &str) -> SimNode {
    let opts = NodeOptions {
        sim_app: Some(env!("CARGO_BIN_EXE_sim-app").into()),
        ..NodeOptions::default()
    };
    SimNode::for_test(test, opts)
}

fn agent(node: &SimNode) -> AgentProcess {
    AgentProcess::for_node(node).expect("start the holdfast agent")
}

/// `iptables -S` / `ip6tables -S` lines of the pod's netns mentioning holdfast.
fn hold_rules(node: &SimNode, pod: &str, program: &'static str) -> Vec<String> {
    let out = node
        .in_pod_netns(pod, || Command::new(program).args(["-w", "-S"]).output())
        .expect("enter pod netns")
        .expect("run iptables -S");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.to_ascii_lowercase().contains("holdfast"))
        .map(str::to_string)
        .collect()
}

fn assert_clean(node: SimNode, agent: Option<AgentProcess>) {
    drop(agent);
    let left = node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

fn wait_boot_calls(node: &SimNode, pod: &str, calls: u32, within: Duration) -> AppReport {
    node.wait_report(pod, within, "boot calls or exit", |r| {
        let s = r.calls(Phase::Startup);
        s.ok + s.failed >= calls || !r.exit_codes().is_empty()
    })
    .expect("the app makes its boot calls")
}

/// An IPv6-first pod calling the remote services over IPv6 at boot, with Envoy `late`.
fn ipv6_caller(late: Duration) -> PodSpec {
    PodSpec::new("v6")
        // A dual-stack hold writes rules for both families (iptables-restore and
        // ip6tables-restore): with the other tests of this file starting Envoys at the same
        // time on 2 cores, 150 ms of istio-init was sometimes shorter than that (a late hold,
        // calls refused). Real istio-init runs take longer than this anyway.
        .init_duration(Duration::from_millis(400))
        .ip_families(IpFamilies::DualV6First)
        .app(AppScript::CallAtStart { calls: 3 })
        .proxy_delay(late)
        .call_timeout(late + Duration::from_secs(20))
}

#[test]
fn ipv6_pod_without_agent_calls_through_envoy_over_ipv6_or_is_refused() {
    if !privileged("ipv6_pod_without_agent_calls_through_envoy_over_ipv6_or_is_refused") {
        return;
    }
    let mut node = node("shape6base");
    // Envoy in time (the app waits 3 s first): the IPv6 calls go through Envoy's `::` listener.
    node.add_pod(ipv6_caller(Duration::ZERO).app_init(Duration::from_secs(3)))
        .expect("add pod");
    // IPv6 only, DNS capture on (an IPv6 nameserver, redirected to [::1]:15053), everything in
    // time: the lookup and the call go over IPv6.
    node.add_pod(
        PodSpec::new("v6only")
            .ip_families(IpFamilies::V6)
            .dns_capture(Duration::ZERO)
            .lookup_remote(true)
            .app(AppScript::CallAtStart { calls: 1 })
            .app_init(Duration::from_secs(3)),
    )
    .expect("add pod");
    // Envoy 2 s late and no agent: refused, as on a cluster without holdfast.
    let mut late = ipv6_caller(Duration::from_secs(2));
    late.name = "v6late".into();
    node.add_pod(late).expect("add pod");
    node.start_pods().expect("start");
    let in_time = wait_boot_calls(&node, "v6", 3, Duration::from_secs(30));
    assert_eq!(
        in_time.calls(Phase::Startup).ok,
        3,
        "{:?}",
        in_time.calls(Phase::Startup)
    );
    let v6only = wait_boot_calls(&node, "v6only", 1, Duration::from_secs(30));
    assert_eq!(
        v6only.calls(Phase::Startup).ok,
        1,
        "{:?} {:?}",
        v6only.lookups(),
        v6only.calls(Phase::Startup)
    );
    assert!(
        v6only
            .lookups()
            .first()
            .is_some_and(|l| l.0 && l.2.contains(':')),
        "the lookup answers the IPv6 address: {:?}",
        v6only.lookups()
    );
    let refused = wait_boot_calls(&node, "v6late", 1, Duration::from_secs(30));
    assert!(
        refused
            .calls(Phase::Startup)
            .errors(CallError::ConnectionRefused)
            >= 1,
        "no agent, Envoy late: the IPv6 call is refused ({:?})",
        refused.calls(Phase::Startup)
    );
    // Envoy really served them over IPv6: its outbound listener counted them on `::`.
    let pod = node.pod("v6").expect("pod");
    let ips = pod.pod_ips();
    assert!(ips[0].contains(':'), "IPv6 first in status.podIPs: {ips:?}");
    assert_clean(node, None);
}

#[test]
fn ipv6_first_pod_is_held_and_released() {
    if !privileged("ipv6_first_pod_is_held_and_released") {
        return;
    }
    let late = Duration::from_secs(2);
    let mut node = node("shape6");
    let agent = agent(&node);
    node.add_pod(ipv6_caller(late)).expect("add pod");
    node.start_pods().expect("start");
    let report = wait_boot_calls(&node, "v6", 3, late + Duration::from_secs(30));
    let startup = report.calls(Phase::Startup);
    assert_eq!(
        startup.failed,
        0,
        "IPv6 boot calls failed: {startup:?}; agent row: {:?}; agent log:\n{}",
        agent.pod("default", "v6"),
        agent.log_tail()
    );
    assert_eq!(startup.ok, 3);
    assert!(report.exit_codes().is_empty(), "the app did not crash");
    let row = agent
        .wait_hold_ended("default", "v6", Duration::from_secs(10))
        .expect("agent status");
    let hold = row.hold.expect("a hold");
    assert_eq!(hold.outcome, Some(HoldOutcome::Ready), "{hold:?}");
    assert!(
        hold.connections_held >= 1,
        "the IPv6 call was held: {hold:?}"
    );
    assert!(hold_rules(&node, "v6", "iptables").is_empty());
    assert!(
        hold_rules(&node, "v6", "ip6tables").is_empty(),
        "IPv6 rule left after release"
    );

    // The drain of the IPv6-first pod: its samples go to the admin API on [::1], under Istio's
    // stats matcher with holdfast's mesh config, and read Envoy's byte counters there (the
    // app's IPv6 calls moved them).
    node.delete_pod("v6").expect("delete");
    node.wait_gone("v6", Duration::from_secs(30))
        .expect("pod terminates");
    let drain = agent
        .pod("default", "v6")
        .expect("agent status")
        .and_then(|row| row.drain)
        .expect("a drain report");
    assert_eq!(drain.outcome, DrainOutcome::AppDone, "{drain:?}");
    assert!(
        matches!(drain.quit_reason, Some(QuitReason::Idle(_))),
        "{drain:?}"
    );
    assert!(
        drain.last_traffic_bytes.is_some_and(|b| b > 0),
        "Envoy's byte counters read over [::1]: {drain:?}"
    );
    assert_eq!(drain.advice, None, "{drain:?}");
    assert_clean(node, Some(agent));
}

/// An app whose first step is looking up `remote` through the pod's resolv.conf, with DNS
/// capture on (`dns_late`: pilot-agent's DNS proxy starts that long after the proxy container).
fn dns_looker(name: &str, dns_late: Option<Duration>) -> PodSpec {
    let spec = PodSpec::new(name)
        .app(AppScript::CallAtStart { calls: 1 })
        .lookup_remote(true)
        .call_timeout(Duration::from_secs(20));
    match dns_late {
        Some(late) => spec.dns_capture(late),
        None => spec,
    }
}

/// glibc's resolver waits this long for an answer before it sends the query again
/// (`RES_TIMEOUT`, resolv.conf `options timeout:`; kubelet's resolv.conf does not change it).
const GLIBC_RETRY: Duration = Duration::from_secs(5);

#[test]
fn dns_capture_without_agent_loses_the_first_lookup() {
    if !privileged("dns_capture_without_agent_loses_the_first_lookup") {
        return;
    }
    let mut node = node("shapednsbase");
    // Capture off: the lookup goes to the cluster DNS and works at once.
    node.add_pod(dns_looker("off", None)).expect("add pod");
    // Capture on, pilot-agent's DNS 2 s late, no agent: the first query meets no listener on
    // 15053. Its ICMP port-unreachable does not reach the app (Istio's conntrack zones keep it
    // from being matched to the NATed query), so the query is lost and only glibc's retry, 5 s
    // later, is answered.
    node.add_pod(dns_looker("late", Some(Duration::from_secs(2))))
        .expect("add pod");
    // Capture on, DNS proxy in time (the app waits 3 s): answered by pilot-agent's stand-in.
    node.add_pod(dns_looker("intime", Some(Duration::ZERO)).app_init(Duration::from_secs(3)))
        .expect("add pod");
    node.start_pods().expect("start");
    let mut took = Vec::new();
    for pod in ["off", "late", "intime"] {
        let report = node
            .wait_report(pod, Duration::from_secs(30), "a lookup", |r| {
                !r.lookups().is_empty()
            })
            .expect("lookup recorded");
        let lookups = report.lookups();
        eprintln!("{pod}: lookups (ok, ms, answer) {lookups:?}");
        assert!(lookups[0].0, "{pod}: {lookups:?}");
        took.push(Duration::from_millis(lookups[0].1));
    }
    assert!(
        took[0] < Duration::from_secs(1),
        "capture off: {:?}",
        took[0]
    );
    assert!(
        took[1] >= GLIBC_RETRY - Duration::from_millis(200),
        "capture on, DNS late, no agent: answered before glibc's retry ({:?})",
        took[1]
    );
    assert!(
        took[2] < Duration::from_secs(1),
        "DNS proxy in time: {:?}",
        took[2]
    );
    assert_clean(node, None);
}

#[test]
fn dns_lookup_waits_for_a_late_dns_proxy() {
    if !privileged("dns_lookup_waits_for_a_late_dns_proxy") {
        return;
    }
    let mut node = node("shapedns");
    let agent = agent(&node);
    // 2 s late: within glibc's first wait. 7 s late: past its first retry (5 s), within its
    // second wait; without the agent this lookup fails at 10 s (both queries lost, then the
    // other search domains answer NXDOMAIN), measured on this sim.
    let cases = [
        ("dns2", Duration::from_secs(2)),
        ("dns7", Duration::from_secs(7)),
    ];
    for (name, late) in cases {
        node.add_pod(dns_looker(name, Some(late))).expect("add pod");
    }
    node.start_pods().expect("start");
    for (name, late) in cases {
        let report = node
            .wait_report(name, Duration::from_secs(40), "lookup and call", |r| {
                let s = r.calls(Phase::Startup);
                s.ok + s.failed >= 1 || !r.exit_codes().is_empty()
            })
            .expect("the app looks up and calls");
        let lookups = report.lookups();
        eprintln!("{name}: DNS proxy {late:?} late, lookups (ok, ms, answer) {lookups:?}");
        assert!(
            lookups.first().is_some_and(|l| l.0),
            "{name}: the lookup failed: {lookups:?}"
        );
        // Answered by the release (the DNS proxy's start plus the agent's poll), not by a
        // later retry of glibc's (every 5 s).
        let took = Duration::from_millis(lookups[0].1);
        assert!(
            took < late + Duration::from_millis(1500),
            "{name}: answered {took:?} after start, DNS proxy {late:?} late: {lookups:?}"
        );
        assert_eq!(report.calls(Phase::Startup).ok, 1, "{name}: {report:?}");
        let row = agent
            .wait_hold_ended("default", name, Duration::from_secs(10))
            .expect("agent status");
        let hold = row.hold.expect("a hold");
        assert_eq!(hold.outcome, Some(HoldOutcome::Ready), "{hold:?}");
        assert!(hold.packets_held >= 1, "the lookup was held: {hold:?}");
        assert!(hold_rules(&node, name, "iptables").is_empty());
    }
    assert_clean(node, Some(agent));
}

/// A CNI-mode pod whose user init container calls the remote services once, before any Envoy
/// can exist; returns how long its failed call took and the error.
fn user_init_call(node: &SimNode, pod: &str) -> (u64, Option<CallError>) {
    let path = node
        .work_dir()
        .join(pod)
        .join("vault-agent-init-report.jsonl");
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    loop {
        if let Ok(r) = AppReport::read(&path) {
            if let Some((latency, error)) = r.events.iter().find_map(|e| match e {
                holdfast_tests::sim::report::AppEvent::Call {
                    latency_ms, error, ..
                } => Some((*latency_ms, *error)),
                _ => None,
            }) {
                return (latency, error);
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{pod}: the init container made no call"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn vault_init_pod(name: &str) -> PodSpec {
    PodSpec::new(name)
        .cni(true)
        // A held call would time out after 10 s; refused, it fails at once.
        .user_init("vault-agent-init", Duration::from_secs(10))
        .app(AppScript::Idle)
}

#[test]
fn user_init_container_that_calls_out_fails_as_fast_as_without_holdfast() {
    if !privileged("user_init_container_that_calls_out_fails_as_fast_as_without_holdfast") {
        return;
    }
    // Without an agent: redirected to 15001 where no Envoy can listen yet, refused at once.
    let mut base = node("shapeinitbase");
    base.add_pod(vault_init_pod("vault")).expect("add pod");
    base.start_pods().expect("start");
    let (without_ms, without_err) = user_init_call(&base, "vault");
    assert_clean(base, None);

    let mut node = node("shapeinit");
    let agent = agent(&node);
    node.add_pod(vault_init_pod("vault")).expect("add pod");
    node.start_pods().expect("start");
    let (with_ms, with_err) = user_init_call(&node, "vault");
    eprintln!(
        "user init call: without holdfast {without_ms} ms {without_err:?}, with {with_ms} ms {with_err:?}"
    );
    assert_eq!(without_err, Some(CallError::ConnectionRefused));
    assert_eq!(
        with_err,
        Some(CallError::ConnectionRefused),
        "the init container's call must fail as without holdfast, not be held"
    );
    assert!(
        with_ms < without_ms + 1000,
        "held: {with_ms} ms with holdfast vs {without_ms} ms without"
    );
    assert_clean(node, Some(agent));
}

#[test]
fn user_init_container_before_istio_init_calls_out_directly() {
    if !privileged("user_init_container_before_istio_init_calls_out_directly") {
        return;
    }
    // Without CNI, Istio orders istio-init last (reorderPod): a user init container runs before
    // any redirect, so its call goes straight to the remote service — with or without the agent
    // (whose rules match only what Istio redirected to Envoy's ports).
    let mut node = node("shapeinitclassic");
    let agent = agent(&node);
    node.add_pod(vault_init_pod("vault").cni(false))
        .expect("add pod");
    node.start_pods().expect("start");
    let (took_ms, error) = user_init_call(&node, "vault");
    eprintln!("user init before istio-init: {took_ms} ms, {error:?}");
    assert_eq!(error, None, "the direct call succeeds");
    assert!(took_ms < 1000, "not held: {took_ms} ms");
    node.wait_for(
        "vault",
        Duration::from_secs(20),
        "the app container started after both init containers",
        |p| p.app().is_some_and(|c| c.is_running()),
    )
    .expect("app starts");
    assert_clean(node, Some(agent));
}
