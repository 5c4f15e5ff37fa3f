//! The proxy container restarting while the app runs (issue 10 §2): Envoy is OOM-killed
//! (SIGKILL), pilot-agent exits with it, the kubelet stand-in restarts the `istio-proxy`
//! container after its back-off. Without the agent the app's new connections in that window go
//! to 15001 where nothing listens: refused. With the agent, the proxy's exit is seen on a pidfd,
//! the hold is installed again, and those calls wait until the new Envoy is ready.

use std::time::{Duration, SystemTime};

use holdfast::report::board::{HoldOutcome, Phase as AgentPhase};
use holdfast_tests::agent::AgentProcess;
use holdfast_tests::sim::{privileged, AppScript, CallError, NodeOptions, Phase, PodSpec, SimNode};

/// The kubelet's first restart back-off, shortened from 10 s.
const BACKOFF: Duration = Duration::from_secs(1);
/// A real kubelet learns of the exit at its PLEG relist (every second) before the Pod status
/// says so; the agent must not wait for the status.
const STATUS_LAG: Duration = Duration::from_millis(800);

/// Runs the app, kills its Envoy, waits for the restarted proxy, and returns the refused and
/// succeeded calls made from the kill on (and the agent, to read its row).
fn kill_envoy_while_calling(
    test: &str,
    with_agent: bool,
) -> (u32, u32, SimNode, Option<AgentProcess>, SystemTime) {
    let opts = NodeOptions {
        sim_app: Some(env!("CARGO_BIN_EXE_sim-app").into()),
        restart_backoff: Some(BACKOFF),
        status_lag: Some(STATUS_LAG),
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
    // One pooled connection, called every 100 ms: Envoy's death breaks it, and every call after
    // that opens a new connection through the redirect to 15001.
    node.add_pod(
        PodSpec::new("oom")
            .app(AppScript::CallThroughShutdown {
                every: Duration::from_millis(100),
                pool: 1,
                after_sigterm: Duration::ZERO,
            })
            .call_timeout(Duration::from_secs(20)),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    node.wait_report("oom", Duration::from_secs(30), "5 running calls", |r| {
        r.calls(Phase::Running).ok >= 5
    })
    .expect("the app calls out");
    if let Some(agent) = &agent {
        agent
            .wait_pod("default", "oom", Duration::from_secs(10), "ready", |row| {
                row.phase == AgentPhase::Ready
            })
            .expect("the agent follows the ready pod");
    }
    let before = node.report("oom").expect("report").calls(Phase::Running);

    let killed_at = SystemTime::now();
    node.kill_envoy("oom").expect("kill Envoy");
    node.wait_for("oom", Duration::from_secs(20), "proxy restarted", |p| {
        p.proxy()
            .is_some_and(|c| c.restart_count >= 1 && c.is_running())
    })
    .expect("the kubelet restarts the proxy");
    // Calls made in the window finish (held ones once the new Envoy is ready), and a few more.
    std::thread::sleep(Duration::from_secs(3));
    let after = node.report("oom").expect("report").calls(Phase::Running);
    let refused =
        after.errors(CallError::ConnectionRefused) - before.errors(CallError::ConnectionRefused);
    let ok = after.ok - before.ok;
    eprintln!(
        "{test}: agent={with_agent}: after the kill: {ok} ok, {refused} refused, {} failed in all",
        after.failed - before.failed
    );
    (refused, ok, node, agent, killed_at)
}

#[test]
fn a_restarted_proxy_holds_the_apps_calls_again() {
    if !privileged("a_restarted_proxy_holds_the_apps_calls_again") {
        return;
    }
    // Baseline: without the agent the back-off window refuses the app's new connections.
    let (refused, _, node, _, _) = kill_envoy_while_calling("oombase", false);
    assert!(
        refused >= 3,
        "without the agent the restart window refuses calls ({refused} refused)"
    );
    let left = node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");

    let (refused, ok, node, agent, killed_at) = kill_envoy_while_calling("oomheld", true);
    let agent = agent.expect("agent");
    assert_eq!(refused, 0, "calls in the restart window were refused");
    assert!(
        ok >= 10,
        "the app's calls went on after the restart ({ok} ok)"
    );
    let row = agent
        .wait_pod(
            "default",
            "oom",
            Duration::from_secs(10),
            "second hold released",
            |row| {
                row.hold.as_ref().is_some_and(|h| {
                    h.outcome.is_some() && h.started_at.is_some_and(|t| t >= killed_at)
                })
            },
        )
        .expect("the agent held again after the kill");
    let hold = row.hold.expect("a hold");
    assert_eq!(hold.outcome, Some(HoldOutcome::Ready), "{hold:?}");
    assert!(hold.connections_held >= 1, "calls were held: {hold:?}");
    assert_eq!(row.phase, AgentPhase::Ready);
    // The pod's timeline (`holdfast status default/oom`): the first start, the proxy gone
    // after the kill (seen on its pidfd), then a second hold until the restarted Envoy is
    // ready, in that order.
    let tl = row.timeline.as_ref().expect("a timeline");
    let kinds: Vec<&str> = tl.steps.iter().map(|s| s.step.as_str()).collect();
    let after = |k: &str, from: usize| {
        kinds[from..]
            .iter()
            .position(|x| *x == k)
            .map(|i| i + from)
            .unwrap_or_else(|| panic!("no {k} after step {from}: {kinds:?}"))
    };
    let first_release = after("hold-released", after("hold-in", 0));
    let gone = after("proxy-gone", first_release);
    assert!(tl.steps[gone].at >= killed_at, "{tl:#?}");
    let ready_again = after("proxy-ready", after("hold-in", gone));
    after("hold-released", ready_again);
    drop(agent);
    let left = node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// The agent's CPU so far (utime + stime + its reaped children's, e.g. `iptables`), in seconds.
fn agent_cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11) // state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
        .take(4) // utime stime cutime cstime
        .filter_map(|x| x.parse::<u64>().ok())
        .sum();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100);
    ticks as f64 / hz as f64
}

/// Issue 29: `while :; do sleep 0.005; done` run in the pod's proxy container (as `kubectl
/// exec` runs it: the container's cgroup and netns, its parent outside the container), there
/// before the agent starts watching the ready proxy, is not the proxy going, nor is an exec
/// session (`sleep 5`) that ends once the proxy is ready: their processes
/// ending cost the agent no re-check, and its CPU stays what it is once the loop is stopped
/// (the control). The proxy is still watched: Envoy killed afterwards is seen going at once.
/// Before the fix every process of the container was watched, and each `sleep` that ended
/// was a re-check (a readiness look and two `iptables -S` in the pod's netns), re-arming the
/// watch on the next `sleep`: without end.
#[test]
fn an_exec_loop_in_the_proxy_container_is_not_the_proxy_going() {
    const TEST: &str = "an_exec_loop_in_the_proxy_container_is_not_the_proxy_going";
    if !privileged(TEST) {
        return;
    }
    const WINDOW: Duration = Duration::from_secs(10);
    let opts = NodeOptions {
        sim_app: Some(env!("CARGO_BIN_EXE_sim-app").into()),
        restart_backoff: Some(BACKOFF),
        ..NodeOptions::default()
    };
    let mut node = SimNode::for_test("execloop", opts);
    let agent = AgentProcess::start(
        node.node_name(),
        node.pods_dir(),
        &node.work_dir().join("agent.log"),
        &[],
    )
    .expect("start the holdfast agent");
    // Envoy starts 2 s after its container: the loop is in the container before the proxy is
    // ready, so the agent's watch of the ready proxy sees the loop's processes.
    node.add_pod(PodSpec::new("exec").proxy_delay(Duration::from_secs(1)))
        .expect("add pod");
    node.start_pods().expect("start");
    node.wait_for("exec", Duration::from_secs(30), "proxy running", |p| {
        p.proxy().is_some_and(|c| c.is_running() && c.pid.is_some())
    })
    .expect("the proxy container runs");
    let exits_seen =
        |agent: &AgentProcess| agent.log_text().matches("a process of the proxy").count();
    let exits0 = exits_seen(&agent);
    let mut sh = std::process::Command::new("sh");
    sh.args(["-c", "while :; do sleep 0.005; done"]);
    let looper = node.exec_in_proxy("exec", sh).expect("exec the loop");
    // And an exec session that ends once the proxy is ready (an operator's `kubectl exec`).
    let mut session = std::process::Command::new("sleep");
    session.arg("5");
    node.exec_in_proxy("exec", session).expect("exec a session");
    agent
        .wait_pod("default", "exec", Duration::from_secs(30), "ready", |row| {
            row.phase == AgentPhase::Ready
        })
        .expect("the agent follows the ready pod");
    let pid = agent.pid().expect("the agent's pid");

    let cpu0 = agent_cpu_s(pid);
    std::thread::sleep(WINDOW);
    let loop_cpu = agent_cpu_s(pid) - cpu0;
    let exits = exits_seen(&agent) - exits0;
    let row = agent
        .pod("default", "exec")
        .expect("status")
        .expect("the pod's row");
    let tl = row.timeline.clone().expect("a timeline");
    let gone = tl
        .steps
        .iter()
        .filter(|s| s.step.as_str() == "proxy-gone")
        .count() as u64;
    node.stop_host_process(looper, Duration::from_millis(100))
        .expect("stop the loop");

    // The control: the same pod and agent, no loop.
    std::thread::sleep(Duration::from_secs(1));
    let cpu1 = agent_cpu_s(pid);
    std::thread::sleep(WINDOW);
    let idle_cpu = agent_cpu_s(pid) - cpu1;
    eprintln!(
        "{TEST}: agent CPU per {WINDOW:?}: {loop_cpu:.2} s with the loop, {idle_cpu:.2} s \
         without; proxy exits seen with the loop: {exits}; proxy-gone steps: {gone} (+{} \
         dropped steps)",
        tl.dropped
    );
    assert_eq!(
        exits, 0,
        "the loop's processes were taken for the proxy ({exits} exits seen)"
    );
    assert_eq!(gone + tl.dropped, 0, "re-checks on the timeline: {tl:#?}");
    assert_eq!(row.phase, AgentPhase::Ready);
    assert!(
        loop_cpu <= idle_cpu + 0.5,
        "the loop costs the agent: {loop_cpu:.2} s of CPU in {WINDOW:?} against {idle_cpu:.2} s"
    );

    // The proxy itself is still watched.
    let killed_at = SystemTime::now();
    node.kill_envoy("exec").expect("kill Envoy");
    agent
        .wait_pod(
            "default",
            "exec",
            Duration::from_secs(10),
            "proxy gone after the kill",
            |row| {
                row.timeline.as_ref().is_some_and(|tl| {
                    tl.steps
                        .iter()
                        .any(|s| s.step.as_str() == "proxy-gone" && s.at >= killed_at)
                })
            },
        )
        .expect("Envoy's exit is seen");
    drop(agent);
    let left = node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
}
