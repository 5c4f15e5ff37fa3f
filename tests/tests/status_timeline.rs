//! `holdfast status POD`, end to end: the real agent on the simulated node follows a pod that is
//! held (its Envoy starts late), released, and drained when it is deleted; the real `holdfast
//! status` binary then prints the pod's timeline — after the pod is gone, while its row stays
//! on the board — by namespace/name and by uid, and `--json` carries the same steps. The steps
//! must come in the order the pod lived them, with times that fit what the test did. A native
//! sidecar killed during its pod's termination is a `sidecar-lost` step (issue 22's outcome,
//! end to end).

use std::process::Command;
use std::time::{Duration, SystemTime};

use holdfast::api::{DrainOutcome, HoldOutcome, PodStatus, SidecarMode, StepKind};
use holdfast_tests::agent::{holdfast_binary, AgentProcess};
use holdfast_tests::sim::{privileged, AppScript, NodeOptions, Phase, PodSpec, SimNode};

fn node(test: &str) -> SimNode {
    let opts = NodeOptions {
        sim_app: Some(env!("CARGO_BIN_EXE_sim-app").into()),
        ..NodeOptions::default()
    };
    SimNode::for_test(test, opts)
}

/// `holdfast status ARGS --agent URL`: exit code, stdout, stderr.
fn status_cli(agent: &AgentProcess, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(holdfast_binary().expect("the holdfast binary"))
        .arg("status")
        .args(args)
        .args(["--agent", &format!("http://{}", agent.status_addr())])
        .output()
        .expect("run holdfast status");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The steps a held, released, then drained classic pod must show, in this order (other steps,
/// such as Envoy's intermediate readiness levels or `proxy-running`, may come in between).
const ORDER: &[StepKind] = &[
    StepKind::FirstSeen,
    StepKind::NetnsFound,
    StepKind::HoldIn,
    StepKind::FirstConnectionHeld,
    StepKind::ProxyReady,
    StepKind::HoldReleased,
    StepKind::DrainStarted,
    StepKind::InboundDrained,
    StepKind::AppContainerExited,
    StepKind::AppGone,
    StepKind::Quitting,
    StepKind::ProxyExited,
    StepKind::DrainFinished,
];

/// Checks the row's steps: every step of [`ORDER`] once, in order, dated in time order, with
/// times that fit the test (the hold lasted about as long as Envoy was late, the drain started
/// after the deletion, the proxy exited soon after the app).
fn check_steps(row: &PodStatus, proxy_late: Duration, deleted: SystemTime) {
    let tl = row
        .timeline
        .as_ref()
        .expect("this agent records a timeline");
    assert_eq!(tl.dropped, 0, "{tl:#?}");
    assert!(
        tl.steps.windows(2).all(|w| w[0].at <= w[1].at),
        "steps out of time order: {tl:#?}"
    );
    let at = |k: StepKind| {
        let found: Vec<_> = tl.steps.iter().filter(|s| s.step == k).collect();
        assert_eq!(found.len(), 1, "{k:?} once: {tl:#?}");
        found[0].at
    };
    let times: Vec<SystemTime> = ORDER.iter().map(|k| at(*k)).collect();
    for (i, w) in times.windows(2).enumerate() {
        assert!(
            w[0] <= w[1],
            "{:?} after {:?}: {tl:#?}",
            ORDER[i],
            ORDER[i + 1]
        );
    }
    assert!(tl.has(StepKind::ProxyRunning), "{tl:#?}");
    assert_eq!(at(StepKind::FirstSeen), row.tracked_since);
    let between = |a: StepKind, b: StepKind| at(b).duration_since(at(a)).expect("ordered");
    let held = between(StepKind::HoldIn, StepKind::HoldReleased);
    assert!(
        held >= proxy_late / 2 && held < proxy_late + Duration::from_secs(10),
        "the hold lasted {held:?} for an Envoy {proxy_late:?} late"
    );
    let release = between(StepKind::ProxyReady, StepKind::HoldReleased);
    assert!(
        release < Duration::from_millis(500),
        "released {release:?} after ready"
    );
    assert!(
        at(StepKind::DrainStarted) >= deleted,
        "the drain started before the deletion"
    );
    let exit_lag = between(StepKind::AppGone, StepKind::ProxyExited);
    assert!(
        exit_lag < Duration::from_secs(2),
        "proxy exit {exit_lag:?} after the app"
    );
    let detail = |k: StepKind| {
        tl.steps
            .iter()
            .find(|s| s.step == k)
            .and_then(|s| s.detail.clone())
            .unwrap_or_default()
    };
    assert!(
        detail(StepKind::HoldReleased).starts_with("ready: held "),
        "{tl:#?}"
    );
    assert!(
        detail(StepKind::Quitting).starts_with("nothing in flight"),
        "{tl:#?}"
    );
    assert!(
        detail(StepKind::DrainFinished).starts_with("app-done after "),
        "{tl:#?}"
    );
}

#[test]
fn timeline_of_a_held_released_and_drained_pod() {
    if !privileged("timeline_of_a_held_released_and_drained_pod") {
        return;
    }
    let mut node = node("tline");
    let agent = AgentProcess::for_node(&node).expect("start the holdfast agent");
    let proxy_late = Duration::from_secs(1);
    let grace = Duration::from_secs(20);
    node.add_pod(
        PodSpec::new("flusher")
            .app(AppScript::CallThroughShutdown {
                every: Duration::from_millis(200),
                pool: 2,
                after_sigterm: Duration::from_millis(600),
            })
            .proxy_delay(proxy_late)
            .call_timeout(Duration::from_secs(20))
            .grace(grace)
            .drain(grace),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    let row = agent
        .wait_hold_ended("default", "flusher", Duration::from_secs(30))
        .expect("the hold ends");
    assert_eq!(
        row.hold.as_ref().and_then(|h| h.outcome),
        Some(HoldOutcome::Ready),
        "{row:#?}"
    );
    // Live: the timeline so far ends in the release, the outcome not yet a drain.
    let (code, live, err) = status_cli(&agent, &["default/flusher"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        live.contains("hold-released") && !live.contains("drain-started"),
        "{live}"
    );

    std::thread::sleep(Duration::from_millis(600));
    let deleted = SystemTime::now();
    node.delete_pod("flusher").expect("delete");
    node.wait_gone("flusher", Duration::from_secs(30))
        .expect("pod terminates");
    // The pod is gone; its row (and so its timeline) stays on the board.
    let row = agent
        .wait_pod(
            "default",
            "flusher",
            Duration::from_secs(10),
            "the drain's end on the timeline",
            |r| {
                r.timeline
                    .as_ref()
                    .is_some_and(|t| t.has(StepKind::DrainFinished))
            },
        )
        .expect("the drained pod's row stays");
    check_steps(&row, proxy_late, deleted);

    // The CLI: by namespace/name and by uid, the same text; every step, in order, 80 columns.
    let (code, text, err) = status_cli(&agent, &["default/flusher"]);
    assert_eq!(code, 0, "{err}");
    eprintln!("{text}");
    let (code, by_uid, err) = status_cli(&agent, &[&row.uid]);
    assert_eq!(code, 0, "{err}");
    let strip_ago = |t: &str| {
        t.lines()
            .filter(|l| !l.contains(" ago)"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(strip_ago(&by_uid), strip_ago(&text));
    let shown: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|w| ORDER.iter().any(|k| k.as_str() == *w))
        .collect();
    let expected: Vec<&str> = ORDER.iter().map(|k| k.as_str()).collect();
    assert_eq!(shown, expected, "{text}");
    assert!(text.contains("OUTCOME  hold: ready"), "{text}");
    assert!(text.contains("drain: app-done after"), "{text}");
    for l in text.lines() {
        assert!(
            l.chars().count() <= 80,
            "{} chars: {l:?}",
            l.chars().count()
        );
    }

    // --json: the row as served, the same steps.
    let (code, json, err) = status_cli(&agent, &["default/flusher", "--json"]);
    assert_eq!(code, 0, "{err}");
    let served: PodStatus = serde_json::from_str(&json).expect("the pod's row as JSON");
    assert_eq!(served.uid, row.uid);
    check_steps(&served, proxy_late, deleted);
    assert_eq!(
        served.timeline.as_ref().map(|t| t.steps.len()),
        row.timeline.as_ref().map(|t| t.steps.len())
    );

    // An unknown pod: exit 7, named, with the way to list them.
    let (code, out, err) = status_cli(&agent, &["default/no-such-pod"]);
    assert_eq!(code, 7, "{out}{err}");
    assert!(
        err.contains("default/no-such-pod") && err.contains("`holdfast status`"),
        "{err}"
    );
    // A malformed one: a usage error before any request.
    let (code, _, err) = status_cli(&agent, &["default/"]);
    assert_eq!(code, 2, "{err}");

    drop(agent);
    let left = node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// A native-sidecar pod (Istio 1.28's injection, the kubelet stand-in's native rules) whose Envoy
/// is SIGKILLed while the pod terminates and the app still calls out: the kubelet does not
/// restart it, the agent's drain ends `sidecar-lost`, and the pod's timeline shows that step
/// between the drain's start and its end.
#[test]
fn timeline_of_a_native_pod_that_loses_its_sidecar() {
    if !privileged("timeline_of_a_native_pod_that_loses_its_sidecar") {
        return;
    }
    let mut node = node("tlnat");
    let agent = AgentProcess::for_node(&node).expect("start the holdfast agent");
    node.add_pod(
        PodSpec::new("term")
            .native()
            .app(AppScript::CallThroughShutdown {
                every: Duration::from_millis(100),
                pool: 1,
                after_sigterm: Duration::from_secs(3),
            })
            .call_timeout(Duration::from_secs(10))
            .grace(Duration::from_secs(10)),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    node.wait_report("term", Duration::from_secs(30), "5 calls", |r| {
        r.calls(Phase::Running).ok >= 5
    })
    .expect("the app calls out");
    let row = agent
        .wait_pod("default", "term", Duration::from_secs(10), "tracked", |r| {
            r.mode == Some(SidecarMode::Native)
        })
        .expect("the native pod is tracked");
    assert!(
        row.hold.is_none(),
        "no startup hold for a native pod: {row:#?}"
    );

    let deleted = SystemTime::now();
    node.delete_pod("term").expect("delete");
    node.wait_report("term", Duration::from_secs(10), "SIGTERM", |r| {
        r.calls(Phase::AfterSigterm).ok >= 5
    })
    .expect("the app calls out after SIGTERM");
    node.kill_envoy("term").expect("kill Envoy");
    node.wait_gone("term", Duration::from_secs(30))
        .expect("the pod goes");
    let row = agent
        .wait_pod(
            "default",
            "term",
            Duration::from_secs(10),
            "the drain's end",
            |r| r.drain.is_some(),
        )
        .expect("the drain's report");
    let drain = row.drain.as_ref().expect("checked");
    assert_eq!(drain.outcome, DrainOutcome::SidecarLost, "{row:#?}");
    let tl = row.timeline.as_ref().expect("timeline");
    let kinds: Vec<StepKind> = tl.steps.iter().map(|s| s.step).collect();
    let pos = |k: StepKind| {
        kinds
            .iter()
            .position(|x| *x == k)
            .unwrap_or_else(|| panic!("no {k:?}: {kinds:?}"))
    };
    assert!(
        pos(StepKind::FirstSeen) < pos(StepKind::DrainStarted),
        "{kinds:?}"
    );
    assert!(
        pos(StepKind::DrainStarted) < pos(StepKind::SidecarLost),
        "{kinds:?}"
    );
    assert_eq!(kinds.last(), Some(&StepKind::DrainFinished), "{kinds:?}");
    assert!(!kinds.contains(&StepKind::HoldIn), "{kinds:?}");
    let lost = &tl.steps[pos(StepKind::SidecarLost)];
    assert!(lost.at >= deleted, "{lost:?}");

    let (code, text, err) = status_cli(&agent, &["default/term"]);
    assert_eq!(code, 0, "{err}");
    eprintln!("{text}");
    assert!(text.contains("sidecar-lost"), "{text}");
    assert!(text.contains("native sidecar, phase"), "{text}");
    assert!(text.contains("drain: sidecar-lost after"), "{text}");

    drop(agent);
    let left = node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
}
