//! `holdfast check`'s findings: a clean cluster finds nothing; each problem planted alone is
//! found with its code, the objects it names and a fix; the codes agree with the agent's own
//! constants and with docs/check-codes.md. The read itself (nodes, agents, quotas, statuses
//! through port-forwards of a loopback API server) is in tests/check_cluster.rs.
use super::*;
use crate::api::{
    DrainReport, FilterCounts, HoldRecord, IdleReason, Mesh, Phase, QuitReason, SidecarMode,
    SourceProblem, TimestampMeaning,
};
use crate::cli::cluster::{AgentAnswer, AgentPod, NodeInfo, QuotaInfo};

fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

/// "Now" for every test: an hour and a minute after t(0).
fn now() -> SystemTime {
    t(3660)
}

fn node(name: &str) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        linux: true,
        ready: true,
        gke: false,
        taints: vec![],
        created: None,
    }
}

fn agent(name: &str, node: &str) -> AgentPod {
    AgentPod {
        name: name.into(),
        node: Some(node.into()),
        phase: "Running".into(),
        ready: true,
        waiting_reason: None,
        started: None,
        restarts: 0,
    }
}

fn pod(name: &str) -> PodStatus {
    PodStatus {
        namespace: "shop".into(),
        name: name.into(),
        uid: "5a7e2c1b-0000-4000-8000-000000000001".into(),
        phase: Phase::Ready,
        mode: Some(SidecarMode::Classic),
        mesh: Some(Mesh::Istio),
        tracked_since: t(3000),
        hold: Some(HoldRecord {
            started_at: Some(t(3001)),
            released_at: Some(t(3003)),
            packets_held: 2,
            connections_held: 2,
            ready_to_release_ms: Some(0.4),
            outcome: Some(HoldOutcome::Ready),
            ..HoldRecord::default()
        }),
        drain: None,
        job: None,
        last_error: None,
        skipped_reason: None,
        timeline: None,
    }
}

fn drained(name: &str) -> PodStatus {
    let mut p = pod(name);
    p.phase = Phase::Done;
    p.drain = Some(DrainReport {
        outcome: DrainOutcome::AppDone,
        started_at: t(3500),
        deadline_at: Some(t(3530)),
        deadline_meaning: TimestampMeaning::KillTime,
        inbound_drained: true,
        health_checks_restored: 0,
        agent_signalled: false,
        envoy_version: Some("1.40.0".into()),
        app_gone_at: Some(t(3502)),
        quit_sent_at: Some(t(3502)),
        quit_reason: Some(QuitReason::Idle(IdleReason::NoOutboundConnections)),
        proxy_exit_seen_at: Some(t(3502)),
        app_gone_to_quit: Some(Duration::from_millis(12)),
        app_gone_to_proxy_exit: Some(Duration::from_millis(30)),
        elapsed: Duration::from_millis(2100),
        app_processes_seen: 1,
        app_processes_left: 0,
        filter_present: Some(true),
        last_counts: Some(FilterCounts::default()),
        last_traffic_bytes: Some(0),
        errors: vec![],
        error_count: 0,
        advice: None,
    });
    p
}

fn status(node: &str, pods: Vec<PodStatus>) -> NodeStatus {
    NodeStatus {
        node: node.into(),
        agent_version: "0.1.0".into(),
        pods,
        source_problems: vec![],
        startup_taint: None,
    }
}

/// Two nodes, each with a Ready agent that answered healthy rows (held, drained, a Consul pod
/// drained without a filter, as Consul must), the quota in place, on GKE.
fn clean() -> ClusterView {
    let mut consul = drained("consul-app");
    consul.mesh = Some(Mesh::Consul);
    consul.drain.as_mut().unwrap().filter_present = Some(false);
    // An old deadline hold (two hours ago) is not "the last hour".
    let mut old = pod("old-deadline");
    old.hold.as_mut().unwrap().outcome = Some(HoldOutcome::Deadline);
    old.hold.as_mut().unwrap().started_at = Some(t(0));
    old.hold.as_mut().unwrap().released_at = Some(t(10));
    let mut nodes = vec![node("node-a"), node("node-b")];
    nodes.iter_mut().for_each(|n| n.gke = true);
    // A Windows node runs no agent, and needs none.
    nodes.push(NodeInfo {
        linux: false,
        ..node("win-1")
    });
    // node-a joined with the startup taint and its first agent removed it; node-b's agent came
    // with a rollout an hour after the node joined and found no taint (an earlier agent had
    // removed it): neither is HF0106.
    nodes[0].created = Some(t(0));
    nodes[1].created = Some(t(0));
    let mut first = agent("holdfast-a", "node-a");
    first.started = Some(t(20));
    let mut rolled = agent("holdfast-b", "node-b");
    rolled.started = Some(t(3600));
    ClusterView {
        namespace: "holdfast-system".into(),
        nodes,
        agents: vec![first, rolled],
        quotas: Some(vec![QuotaInfo {
            name: "holdfast-critical-pods".into(),
            priority_classes: vec!["system-node-critical".into()],
        }]),
        answers: vec![
            AgentAnswer {
                pod: "holdfast-a".into(),
                node: "node-a".into(),
                result: Ok(NodeStatus {
                    startup_taint: Some(StartupTaint::Removed),
                    ..status("node-a", vec![pod("web-1"), drained("web-2"), old])
                }),
            },
            AgentAnswer {
                pod: "holdfast-b".into(),
                node: "node-b".into(),
                result: Ok(NodeStatus {
                    startup_taint: Some(StartupTaint::NotThere),
                    ..status("node-b", vec![consul])
                }),
            },
        ],
        problems: vec![],
    }
}

fn rows_of<'a>(view: &'a mut ClusterView, node: &str) -> &'a mut Vec<PodStatus> {
    &mut view
        .answers
        .iter_mut()
        .find(|a| a.node == node)
        .expect("the node's answer")
        .result
        .as_mut()
        .expect("answered")
        .pods
}

/// The one finding of `view`, which must carry `code` and name every one of `objects`.
fn only(view: &ClusterView, code: &str, objects: &[&str]) -> Finding {
    let found = findings(view, now());
    assert_eq!(
        found.iter().map(|f| f.code).collect::<Vec<_>>(),
        [code],
        "{found:#?}"
    );
    let f = found.into_iter().next().unwrap();
    for o in objects {
        assert!(
            f.objects.iter().any(|x| x == o),
            "{o} not in {:?}",
            f.objects
        );
    }
    assert!(!f.fix.is_empty() && !f.message.is_empty());
    f
}

#[test]
fn a_clean_install_finds_nothing() {
    let view = clean();
    let found = findings(&view, now());
    assert!(found.is_empty(), "{found:#?}");
    assert_eq!(exit_code(&found), 0);
    let text = render_text(&found, &view);
    assert!(text.contains("0 error(s), 0 warning(s)"), "{text}");
}

/// A node without a Ready agent that carries the startup taint (its pool sets it): only HF0101.
fn tainted(name: &str) -> NodeInfo {
    NodeInfo {
        taints: vec![format!("{STARTUP_TAINT_KEY}=true:NoSchedule")],
        ..node(name)
    }
}

#[test]
fn hf0101_a_node_without_an_agent() {
    let mut view = clean();
    view.nodes.push(tainted("node-c"));
    let f = only(&view, "HF0101", &["node/node-c"]);
    assert_eq!(f.severity, Severity::Error);
    assert!(
        f.fix.contains("describe daemonset holdfast-agent"),
        "{}",
        f.fix
    );
    assert_eq!(exit_code(&[f]), 1);
}

#[test]
fn hf0101_a_node_whose_agent_is_not_ready() {
    let mut view = clean();
    let a = view
        .agents
        .iter_mut()
        .find(|a| a.node.as_deref() == Some("node-b"))
        .unwrap();
    a.ready = false;
    a.phase = "Running".into();
    a.waiting_reason = Some("CrashLoopBackOff".into());
    view.nodes
        .iter_mut()
        .find(|n| n.name == "node-b")
        .unwrap()
        .taints = tainted("node-b").taints;
    let f = only(
        &view,
        "HF0101",
        &["node/node-b", "pod/holdfast-system/holdfast-b"],
    );
    assert!(f.message.contains("CrashLoopBackOff"), "{}", f.message);
    assert!(f.fix.contains("logs holdfast-b"), "{}", f.fix);
}

/// The same node without the taint: meshed pods can land there before the agent is Ready.
#[test]
fn hf0105_a_node_without_agent_and_without_the_startup_taint() {
    let mut view = clean();
    view.nodes.push(NodeInfo {
        taints: vec!["dedicated=mesh:NoSchedule".into()],
        ..node("node-c")
    });
    let found = findings(&view, now());
    assert_eq!(
        found.iter().map(|f| f.code).collect::<Vec<_>>(),
        ["HF0101", "HF0105"],
        "{found:#?}"
    );
    assert!(found[1].objects == ["node/node-c"]);
    assert!(found[1]
        .fix
        .contains("holdfast.io/agent-not-ready=true:NoSchedule"));
    // With the taint (any value or effect spelling the key), no HF0105.
    view.nodes.last_mut().unwrap().taints = vec![format!("{STARTUP_TAINT_KEY}:NoSchedule")];
    assert_eq!(
        findings(&view, now())
            .iter()
            .map(|f| f.code)
            .collect::<Vec<_>>(),
        ["HF0101"]
    );
}

#[test]
fn hf0102_an_agent_that_does_not_answer() {
    let mut view = clean();
    view.answers[1].result = Err("no answer from holdfast-system/holdfast-b within 5000 ms".into());
    let f = only(
        &view,
        "HF0102",
        &["node/node-b", "pod/holdfast-system/holdfast-b"],
    );
    assert_eq!(f.severity, Severity::Warning);
    assert!(f.message.contains("within 5000 ms"), "{}", f.message);
    assert!(f.fix.contains("holdfast status --node node-b"), "{}", f.fix);
}

#[test]
fn hf0103_gke_without_the_quota() {
    let mut view = clean();
    view.quotas = Some(vec![QuotaInfo {
        name: "other".into(),
        priority_classes: vec!["system-cluster-critical".into()],
    }]);
    let f = only(&view, "HF0103", &["namespace/holdfast-system"]);
    assert_eq!(f.severity, Severity::Error);
    assert!(f.fix.contains("resourcequota.yaml"), "{}", f.fix);
    // Not GKE: no quota needed.
    view.nodes.iter_mut().for_each(|n| n.gke = false);
    assert!(findings(&view, now()).is_empty());
}

#[test]
fn hf0104_what_could_not_be_read_is_said() {
    let mut view = clean();
    view.problems
        .push("list nodes failed: forbidden (403): ask for the ClusterRole holdfast-cluster-reader (nodes list)".into());
    let f = only(&view, "HF0104", &[]);
    assert!(
        f.message.contains("holdfast-cluster-reader"),
        "{}",
        f.message
    );
}

#[test]
fn hf0201_a_hold_that_ran_to_its_deadline_in_the_last_hour() {
    let mut view = clean();
    let mut p = pod("slow-config");
    p.hold.as_mut().unwrap().outcome = Some(HoldOutcome::Deadline);
    rows_of(&mut view, "node-a").push(p);
    let f = only(&view, "HF0201", &["pod/shop/slow-config", "node/node-a"]);
    assert!(
        f.fix
            .contains("holdfast status --node node-a shop/slow-config"),
        "{}",
        f.fix
    );
    assert!(f.fix.contains("--hold-deadline"), "{}", f.fix);
}

#[test]
fn hf0202_a_hold_that_failed_open_in_the_last_hour() {
    let mut view = clean();
    let mut p = pod("no-netns");
    p.hold.as_mut().unwrap().outcome = Some(HoldOutcome::Failed);
    p.last_error = Some("iptables-restore: exit 4".into());
    rows_of(&mut view, "node-b").push(p);
    let f = only(&view, "HF0202", &["pod/shop/no-netns", "node/node-b"]);
    assert!(
        f.message.contains("iptables-restore: exit 4"),
        "{}",
        f.message
    );
}

#[test]
fn hf0203_a_sidecar_without_the_filter() {
    let mut view = clean();
    let mut p = drained("unfiltered");
    p.drain.as_mut().unwrap().filter_present = Some(false);
    rows_of(&mut view, "node-a").push(p);
    let f = only(&view, "HF0203", &["pod/shop/unfiltered"]);
    assert!(f.fix.contains("WasmPlugin"), "{}", f.fix);
    // A Kuma sidecar gets Kuma's fix.
    let mut view = clean();
    let mut p = drained("kuma-unfiltered");
    p.mesh = Some(Mesh::Kuma);
    p.drain.as_mut().unwrap().filter_present = Some(false);
    rows_of(&mut view, "node-a").push(p);
    let f = only(&view, "HF0203", &["pod/shop/kuma-unfiltered"]);
    assert!(f.fix.contains("MeshProxyPatch"), "{}", f.fix);
}

#[test]
fn hf0204_an_envoy_without_the_directional_drain() {
    let mut view = clean();
    let mut p = drained("old-envoy");
    p.drain.as_mut().unwrap().envoy_version = Some("1.33.2".into());
    rows_of(&mut view, "node-a").push(p);
    let f = only(&view, "HF0204", &["pod/shop/old-envoy"]);
    assert!(f.message.contains("1.33.2"), "{}", f.message);
    assert!(f.fix.contains("Istio 1.26"), "{}", f.fix);
    // A Kuma or Consul sidecar's fix names its own mesh's release, not Istio's.
    for (mesh, part) in [(Mesh::Kuma, "Kuma"), (Mesh::Consul, "consul-dataplane")] {
        let mut view = clean();
        let mut p = drained("old-envoy");
        p.mesh = Some(mesh);
        p.drain.as_mut().unwrap().envoy_version = Some("1.33.2".into());
        rows_of(&mut view, "node-a").push(p);
        let f = only(&view, "HF0204", &["pod/shop/old-envoy"]);
        assert!(
            f.fix.contains(part) && !f.fix.contains("Istio"),
            "{mesh}: {}",
            f.fix
        );
    }
    // 1.34.0 has it; a -dev suffix reads as its number.
    for v in ["1.34.0", "1.36.4-dev", "2.0.0"] {
        let mut view = clean();
        let mut p = drained("new-envoy");
        p.drain.as_mut().unwrap().envoy_version = Some(v.into());
        rows_of(&mut view, "node-a").push(p);
        assert!(findings(&view, now()).is_empty(), "{v}");
    }
}

#[test]
fn hf0205_a_mesh_config_that_drops_the_byte_counters() {
    for advice in [
        crate::mesh::unexposed_bytes_advice(&crate::mesh::istio::TEXTS),
        crate::mesh::unseen_advice(&crate::mesh::istio::TEXTS),
    ] {
        let mut view = clean();
        let mut p = drained("keepalive");
        p.drain.as_mut().unwrap().advice = Some(advice.to_string());
        p.drain.as_mut().unwrap().last_traffic_bytes = None;
        rows_of(&mut view, "node-b").push(p);
        let f = only(&view, "HF0205", &["pod/shop/keepalive", "node/node-b"]);
        assert!(f.fix.contains("proxyStatsMatcher"), "{}", f.fix);
    }
}

#[test]
fn hf0206_a_proxy_gone_before_its_app() {
    let mut view = clean();
    let mut p = drained("early");
    p.drain.as_mut().unwrap().outcome = DrainOutcome::ProxyGoneEarly;
    p.drain.as_mut().unwrap().advice = Some("Envoy exited 3.0 s before the app".into());
    rows_of(&mut view, "node-a").push(p);
    let f = only(&view, "HF0206", &["pod/shop/early"]);
    assert!(f.fix.contains("terminationDrainDuration"), "{}", f.fix);
}

#[test]
fn hf0207_source_problems() {
    let mut view = clean();
    if let Ok(s) = &mut view.answers[0].result {
        s.source_problems.push(SourceProblem {
            entry: "shop/bad".into(),
            problem: "duplicate uid".into(),
        });
    }
    only(&view, "HF0207", &["node/node-a"]);
}

/// HF0106: a node's first agent (no restart, started 20 s after the node joined) found no startup
/// taint: the pool does not set it. A restarted agent, or one started long after the node
/// joined, finds none because an earlier agent removed it: not reported.
#[test]
fn hf0106_a_new_node_without_the_startup_taint() {
    let mut view = clean();
    if let Ok(s) = &mut view.answers[0].result {
        s.startup_taint = Some(StartupTaint::NotThere);
    }
    let f = only(
        &view,
        "HF0106",
        &["node/node-a", "pod/holdfast-system/holdfast-a"],
    );
    assert!(
        f.fix
            .contains("holdfast.io/agent-not-ready=true:NoSchedule"),
        "{}",
        f.fix
    );

    let mut restarted = view.clone();
    restarted.agents[0].restarts = 1;
    assert!(findings(&restarted, now()).is_empty());
    let mut late = view.clone();
    late.agents[0].started = Some(t(FIRST_AGENT_WINDOW.as_secs() + 1));
    assert!(findings(&late, now()).is_empty());
    let mut unknown = view;
    unknown.nodes[0].created = None;
    assert!(findings(&unknown, now()).is_empty());
}

/// Several problems at once: errors first, and the exit code says error.
#[test]
fn errors_sort_first_and_set_the_exit_code() {
    let mut view = clean();
    view.answers[1].result = Err("refused".into());
    view.nodes.push(tainted("node-c"));
    let found = findings(&view, now());
    assert_eq!(
        found.iter().map(|f| f.code).collect::<Vec<_>>(),
        ["HF0101", "HF0102"]
    );
    assert_eq!(exit_code(&found), 1);
    let text = render_text(&found, &view);
    assert!(text.contains("1 error(s), 1 warning(s)"), "{text}");
    assert!(text.starts_with("HF0101 error   node/node-c"), "{text}");
}

/// The CLI's copies of agent constants it may not link (tests/layout.rs) stay equal to them.
#[test]
fn constants_agree_with_the_agent() {
    assert_eq!(
        STARTUP_TAINT_KEY,
        crate::effects::node_taint::STARTUP_TAINT_KEY
    );
    let fixed = crate::lifecycle::drain::envoy_version::INBOUND_ONLY_GRACEFUL_FIXED;
    assert_eq!(DIRECTIONAL_DRAIN_SINCE, (fixed.major, fixed.minor));
    for advice in [
        crate::mesh::unexposed_bytes_advice(&crate::mesh::istio::TEXTS),
        crate::mesh::unseen_advice(&crate::mesh::istio::TEXTS),
    ] {
        assert!(advice.contains(BYTE_COUNTERS_ADVICE_MARK), "{advice}");
    }
}

/// docs/check-codes.md has a section per code, with its severity, and no other code.
#[test]
fn every_code_is_documented() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/check-codes.md"),
    )
    .expect("docs/check-codes.md");
    for (code, severity, _) in CODES {
        let heading = format!("## {code} ({})", severity.as_str());
        assert!(
            doc.contains(&heading),
            "docs/check-codes.md lacks `{heading}`"
        );
    }
    let documented = doc.lines().filter(|l| l.starts_with("## HF")).count();
    assert_eq!(
        documented,
        CODES.len(),
        "a documented code the check does not have"
    );
}
