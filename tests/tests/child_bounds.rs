//! Issue 29, item 3: the agent's children inside bounds of their own, end to end. A pod floods
//! its own `filter` table (20,000 rules, and a second jump to holdfast's chain) while it is
//! held; iptables-nft fetches the whole table for any rule deletion or listing, so the hold's
//! release stops at the command's own bounds (16 MiB of data memory). The pod is failed open
//! (its row `skipped`, the reason), holdfast's chains are emptied and its namespace marked
//! (`HOLDFAST_BOUND`), and a restarted agent meets the mark in its first, cheap probe: it leaves
//! the pod alone without running the command that broke its bounds again.

use std::process::Command;
use std::time::{Duration, Instant};

use holdfast::api::Phase as AgentPhase;
use holdfast_tests::agent::AgentProcess;
use holdfast_tests::sim::attacks::Attack;
use holdfast_tests::sim::{privileged, AppScript, NodeOptions, PodSpec, SimNode};

fn node(test: &str) -> SimNode {
    let opts = NodeOptions {
        sim_app: Some(env!("CARGO_BIN_EXE_sim-app").into()),
        ..NodeOptions::default()
    };
    SimNode::for_test(test, opts)
}

/// CPU seconds of the agent's reaped children (its `iptables` commands): `/proc/<pid>/stat`
/// fields 16 and 17.
fn children_cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(13) // state .. stime: fields 3 to 15
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    f.iter().sum::<u64>() as f64 / ticks
}

/// `iptables-restore` probe of a chain in the pod's netns (cheap whatever the table holds):
/// whether it exists.
fn chain_exists(node: &SimNode, pod: &str, chain: &str) -> bool {
    let script = format!("*filter\n-N {chain}\n-X {chain}\nCOMMIT\n");
    let out = node
        .in_pod_netns(pod, || {
            let mut child = Command::new("iptables-restore")
                .args(["-w", "5", "--noflush"])
                .stdin(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()?;
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("piped")
                .write_all(script.as_bytes())?;
            child.wait_with_output()
        })
        .expect("enter pod netns")
        .expect("run iptables-restore");
    !out.status.success()
}

#[test]
fn a_flooded_table_fails_the_pod_open_once_and_for_every_successor() {
    if !privileged("a_flooded_table_fails_the_pod_open_once_and_for_every_successor") {
        return;
    }
    let mut node = node("childbound");
    node.add_pod(
        PodSpec::new("flooder")
            .app(AppScript::Attack(Attack::RuleFlood { rules: 20_000 }))
            // Envoy late enough for the flood to be in before the release.
            .proxy_delay(Duration::from_secs(8)),
    )
    .expect("add pod");
    let mut agent = AgentProcess::for_node_with(&node, &[]).expect("start the agent");
    node.start_pods().expect("start pods");

    let row = agent
        .wait_pod(
            "default",
            "flooder",
            Duration::from_secs(90),
            "failed open and the hold ended",
            |r| {
                r.phase == AgentPhase::Skipped
                    && r.hold.as_ref().is_some_and(|h| h.outcome.is_some())
            },
        )
        .expect("the flooder is failed open");
    let why = row.skipped_reason.clone().unwrap_or_default();
    assert!(
        why.contains("broke its bounds") && why.contains("MiB of memory"),
        "{row:?}"
    );
    assert!(
        row.hold.as_ref().is_some_and(|h| h.outcome.is_some()),
        "the hold ended: {row:?}"
    );
    let log = std::fs::read_to_string(node.work_dir().join("flooder/app.log")).unwrap_or_default();
    assert!(log.contains("20000 rules"), "the flood went in: {log}");
    assert!(
        chain_exists(&node, "flooder", "HOLDFAST_BOUND"),
        "the namespace is marked"
    );
    let first_children = children_cpu_s(agent.pid().expect("pid"));

    // A successor meets the pod (its proxy ready now) and the mark, and runs only the probe.
    agent.terminate().expect("stop the agent");
    agent.restart().expect("restart the agent");
    let pid = agent.pid().expect("pid");
    let row = agent
        .wait_pod(
            "default",
            "flooder",
            Duration::from_secs(60),
            "left alone by the successor",
            |r| r.phase == AgentPhase::Skipped,
        )
        .expect("the successor leaves the flooder alone");
    let why = row.skipped_reason.clone().unwrap_or_default();
    assert!(why.contains("HOLDFAST_BOUND"), "{row:?}");
    // Its children's CPU: a few cheap probes, against at least one command stopped at its
    // bounds (a fetch of the whole flooded table) for the first agent.
    let settle = Instant::now() + Duration::from_secs(2);
    while Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(100));
    }
    let successor_children = children_cpu_s(pid);
    eprintln!(
        "children CPU: first agent {first_children:.2} s, successor {successor_children:.2} s"
    );
    assert!(
        successor_children < 0.1 && successor_children * 4.0 < first_children.max(0.01),
        "the successor ran {successor_children:.2} s of children (the first agent {first_children:.2} s)"
    );

    drop(agent);
    let left = node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
}
