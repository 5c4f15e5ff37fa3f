//! A pod's containers all restarting while the agent follows it (issue 28): the sandbox
//! recreated (a new netns, every container with a new id) and Kubernetes 1.36's in-place restart
//! of every container (KEP-5532: same sandbox and netns, istio-init run again). In both the new
//! app calls out at boot while its new Envoy comes 2 s late. Without the agent that call goes to
//! 15001 where nothing listens: refused. With it, the call is held until the new Envoy is ready
//! — in the new netns for a recreated sandbox (before, the agent held in the old, dead netns),
//! in the same netns across istio-init's second run for an in-place restart.
//!
//! Both backends (`just test` runs it on containerd too): on the containerd one the kubelet
//! stand-in does both restarts over the CRI (`tests/src/cri/kubelet.rs`, `on_restart`), a new
//! `cni-<uuid>` netns for a recreated sandbox. There the agent must look for the new netns as
//! soon as the status shows every container exited: the status shows the new app only after it
//! started (`replay_a_recreated_sandbox_on_containerd_is_held_before_its_app_starts`).
//! The agent records the machine's inputs in `agent.log` (`holdfast::inputs`, debug): each test
//! replays them through the machine (`replay_agrees`; the host agent of the netns backend), and
//! `machine_tests.rs` replays the ones kept in `node-agent/tests/corpus/inputs/`.

use std::time::{Duration, SystemTime};

use holdfast::report::board::{HoldOutcome, Phase as AgentPhase};
use holdfast_tests::agent::AgentProcess;
use holdfast_tests::sim::{
    privileged, AppScript, CallError, NodeOptions, Phase, PodSpec, Runtime, SimNode,
};

/// How long after the new app the new proxy container starts.
const PROXY_LATE: Duration = Duration::from_secs(2);
/// The kubelet's first restart back-off, shortened from 10 s (the control's app, refused at
/// boot, exits 1 and is restarted).
const BACKOFF: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Restart {
    Sandbox,
    InPlace,
}

struct Outcome {
    refused: u32,
    ok: u32,
    node: SimNode,
    agent: Option<AgentProcess>,
    restarted_at: SystemTime,
}

/// Runs a pod whose app calls out once at boot, waits until it ran once, restarts every
/// container (`how`), and counts the boot calls made from then on.
fn restart_while_booting(test: &str, how: Restart, with_agent: bool) -> Outcome {
    let opts = NodeOptions {
        sim_app: Some(env!("CARGO_BIN_EXE_sim-app").into()),
        restart_backoff: Some(BACKOFF),
        ..NodeOptions::default()
    };
    let mut node = SimNode::for_test(test, opts);
    let agent = with_agent.then(|| {
        AgentProcess::start(
            node.node_name(),
            node.pods_dir(),
            &node.work_dir().join("agent.log"),
            &[],
        )
        .expect("start the holdfast agent")
    });
    node.add_pod(
        PodSpec::new("boot")
            .app(AppScript::CallAtStart { calls: 1 })
            .call_timeout(Duration::from_secs(20)),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    node.wait_report("boot", Duration::from_secs(60), "a boot call", |r| {
        r.calls(Phase::Startup).ok >= 1
    })
    .expect("the app booted once");
    node.wait_for("boot", Duration::from_secs(20), "proxy running", |p| {
        p.proxy().is_some_and(|c| c.is_running())
    })
    .expect("the proxy runs");
    if let Some(agent) = &agent {
        agent
            .wait_pod("default", "boot", Duration::from_secs(20), "ready", |row| {
                row.phase == AgentPhase::Ready
            })
            .expect("the agent follows the ready pod");
    }
    let before = node.report("boot").expect("report").calls(Phase::Startup);
    let (old_ns, old_ns_name) = (pod_netns(&node), node.netns_name("boot"));
    let restarted_at = SystemTime::now();
    match how {
        Restart::Sandbox => node.recreate_sandbox("boot", PROXY_LATE),
        Restart::InPlace => node.restart_in_place("boot", PROXY_LATE),
    }
    .expect("restart the pod's containers");
    let restarted = node
        .wait_for("boot", Duration::from_secs(30), "proxy restarted", |p| {
            p.proxy()
                .is_some_and(|c| c.restart_count >= 1 && c.is_running())
        })
        .expect("the kubelet starts the proxy again");
    let (old_ns, new_ns) = (inode(&old_ns), inode(&pod_netns(&node)));
    match how {
        Restart::InPlace => {
            assert_eq!(
                restarted.all_containers_restarting,
                Some(false),
                "the condition went True, then False"
            );
            assert_eq!(new_ns, old_ns, "an in-place restart keeps the netns");
        }
        Restart::Sandbox => {
            assert_ne!(new_ns, old_ns, "a recreated sandbox has a new netns");
            if node.runtime() == Runtime::Containerd {
                // CNI named the new one anew; StopPodSandbox removed the old one.
                assert_ne!(node.netns_name("boot"), old_ns_name);
                assert!(
                    !std::path::Path::new("/run/netns")
                        .join(&old_ns_name)
                        .exists(),
                    "the old netns {old_ns_name} is gone"
                );
            }
        }
    }
    // The held boot call completes once the new Envoy is ready; the control's app is
    // restarted after its back-off and boots then.
    node.wait_report("boot", Duration::from_secs(30), "a boot call after", |r| {
        r.calls(Phase::Startup).ok > before.ok
    })
    .expect("the app boots again");
    let after = node.report("boot").expect("report").calls(Phase::Startup);
    let refused =
        after.errors(CallError::ConnectionRefused) - before.errors(CallError::ConnectionRefused);
    let ok = after.ok - before.ok;
    eprintln!(
        "{test}: {how:?} agent={with_agent}: boot calls after the restart: {ok} ok, {refused} refused, {} failed in all",
        after.failed - before.failed
    );
    Outcome {
        refused,
        ok,
        node,
        agent,
        restarted_at,
    }
}

/// A handle on the pod's netns. Held across the restart it keeps the old netns from being
/// freed, so the new one cannot get its inode number (the kernel reuses a freed one at once).
fn pod_netns(node: &SimNode) -> std::fs::File {
    node.in_pod_netns("boot", || std::fs::File::open("/proc/thread-self/ns/net"))
        .expect("enter the pod's netns")
        .expect("open its netns")
}

fn inode(f: &std::fs::File) -> u64 {
    std::os::unix::fs::MetadataExt::ino(&f.metadata().expect("fstat a netns"))
}

/// The agent's row after a restart: a hold that started after it, released `ready` with the
/// boot call held; the timeline as `holdfast status default/boot` shows it.
fn held_again(agent: &AgentProcess, restarted_at: SystemTime) -> Vec<(String, Option<String>)> {
    let row = agent
        .wait_pod(
            "default",
            "boot",
            Duration::from_secs(20),
            "a hold after the restart, released",
            |row| {
                row.hold.as_ref().is_some_and(|h| {
                    h.outcome.is_some() && h.started_at.is_some_and(|t| t >= restarted_at)
                })
            },
        )
        .expect("the agent held again after the restart");
    let hold = row.hold.clone().expect("a hold");
    assert_eq!(hold.outcome, Some(HoldOutcome::Ready), "{hold:?}");
    assert!(
        hold.connections_held >= 1,
        "the boot call was held: {hold:?}"
    );
    assert_eq!(row.phase, AgentPhase::Ready);
    row.timeline
        .expect("a timeline")
        .steps
        .into_iter()
        .filter(|s| s.at >= restarted_at)
        .map(|s| (s.step.as_str().to_string(), s.detail))
        .collect()
}

/// The inputs the agent recorded for the pod, replayed through the machine (issue 28 item 6;
/// `HOLDFAST_RECORD_INPUTS=<dir>` writes them out as a corpus file for `machine_tests.rs`): fed
/// the same sequence, the machine holds at the first start and again after the restart — in a
/// new netns for a recreated sandbox, the same one in place — never in a netns the pod's
/// processes left, and ends ready, as the agent's row does.
fn replay_agrees(agent: &AgentProcess, file: &str, new_netns: bool) {
    use holdfast::lifecycle::machine::Stage;
    use holdfast::lifecycle::messages::Effect;
    let replays = agent.replay_inputs("default/boot", file);
    let Some((rec, r)) = replays.last() else {
        return; // The DaemonSet's pod logs at info: nothing recorded.
    };
    eprintln!("{file}: {} inputs replayed", rec.inputs.len());
    let holds = r.holds_set_up();
    assert!(
        holds.len() >= 2,
        "held at start and after the restart: {holds:?}"
    );
    assert_eq!(
        holds[0] != holds[holds.len() - 1],
        new_netns,
        "the hold after the restart in a new netns: {new_netns} ({holds:?})"
    );
    let last_phase = r.effects.iter().flatten().rev().find_map(|e| match e {
        Effect::SetPhase(p) => Some(*p),
        _ => None,
    });
    assert_eq!(last_phase, Some(AgentPhase::Ready), "{:?}", r.state.stage);
    assert!(
        matches!(r.state.stage, Stage::Running { .. }),
        "{:?}",
        r.state.stage
    );
}

#[test]
fn a_recreated_sandbox_is_held_in_its_new_netns() {
    if !privileged("a_recreated_sandbox_is_held_in_its_new_netns") {
        return;
    }
    // Control: Istio alone refuses the new app's boot call.
    let base = restart_while_booting("sandboxbase", Restart::Sandbox, false);
    assert!(
        base.refused >= 1,
        "without the agent the new sandbox's boot call is refused ({} refused)",
        base.refused
    );
    let left = base.node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");

    let held = restart_while_booting("sandboxheld", Restart::Sandbox, true);
    assert_eq!(
        held.refused, 0,
        "a boot call in the new sandbox was refused"
    );
    assert!(held.ok >= 1, "the boot call succeeded ({} ok)", held.ok);
    let agent = held.agent.as_ref().expect("agent");
    let steps = held_again(agent, held.restarted_at);
    replay_agrees(agent, "sandbox-recreated", true);
    // The new netns was found (and named so) before the hold went in.
    let found = steps
        .iter()
        .position(|(k, d)| {
            k == "netns-found"
                && d.as_deref()
                    .is_some_and(|d| d.contains("new network namespace"))
        })
        .unwrap_or_else(|| panic!("no new netns found after the restart: {steps:#?}"));
    assert!(
        steps[found..].iter().any(|(k, _)| k == "hold-in"),
        "{steps:#?}"
    );
    drop(held.agent);
    let left = held.node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

#[test]
fn an_in_place_restart_of_every_container_is_held() {
    if !privileged("an_in_place_restart_of_every_container_is_held") {
        return;
    }
    let base = restart_while_booting("inplacebase", Restart::InPlace, false);
    assert!(
        base.refused >= 1,
        "without the agent the restarted app's boot call is refused ({} refused)",
        base.refused
    );
    let left = base.node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");

    let held = restart_while_booting("inplaceheld", Restart::InPlace, true);
    assert_eq!(
        held.refused, 0,
        "a boot call after the in-place restart was refused (istio-init's second run broke the hold?)"
    );
    assert!(held.ok >= 1, "the boot call succeeded ({} ok)", held.ok);
    let agent = held.agent.as_ref().expect("agent");
    let steps = held_again(agent, held.restarted_at);
    replay_agrees(agent, "in-place-restart", false);
    // The same netns: no new one found.
    assert!(
        !steps.iter().any(|(_, d)| d
            .as_deref()
            .is_some_and(|d| d.contains("new network namespace"))),
        "{steps:#?}"
    );
    drop(held.agent);
    let left = held.node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
}
