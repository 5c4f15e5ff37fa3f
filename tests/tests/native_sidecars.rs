//! Native sidecars on the simulated node (issue 22): the pod as Istio 1.28 injects it (the
//! proxy an init container with `restartPolicy: Always`, a startup probe, Istio's preStop
//! drain) and the kubelet stand-ins' native-sidecar rules ([`holdfast_tests::sim::native`]),
//! with real Envoy, pilot-agent's status port and real apps.
//!
//! Each scenario is a function taking `with_agent`. The baseline tests (without holdfast)
//! assert what the kubelet and Istio give (start order, stop order and lag, refused calls
//! across a sidecar restart, no restart during termination, a Job that completes) and print
//! the figures; the holdfast tests run the same scenario with and without the agent in the
//! same test (the run without is the control) and assert what holdfast adds: the app's calls
//! held across a sidecar restart, a deletion no worse than the kubelet's, the proxy ended on
//! evidence when Istio's preStop is overridden, a sidecar lost during termination reported.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use holdfast::api::{DrainOutcome, HoldOutcome, PodStatus, SidecarMode};
use holdfast_tests::agent::AgentProcess;
use holdfast_tests::sim::pod_object::{CState, ContainerView, Terminated};
use holdfast_tests::sim::report::now_us;
use holdfast_tests::sim::{
    privileged, AppScript, CallError, NodeOptions, Phase, PodPhase, PodSpec, PodView, SimNode,
};

/// The kubelet's initial restart back-off, shortened from 10 s.
const BACKOFF: Duration = Duration::from_secs(2);
/// istiod's first push arrives this late (Envoy starts at once and waits for it).
const XDS_DELAY: Duration = Duration::from_millis(700);

fn node(test: &str) -> SimNode {
    let opts = NodeOptions {
        sim_app: Some(env!("CARGO_BIN_EXE_sim-app").into()),
        restart_backoff: Some(BACKOFF),
        ..NodeOptions::default()
    };
    SimNode::for_test(test, opts)
}

/// The agent on `node` when asked for (the holdfast variant of a scenario), before the pods.
fn maybe_agent(node: &SimNode, with_agent: bool) -> Option<AgentProcess> {
    with_agent.then(|| AgentProcess::for_node(node).expect("start the holdfast agent"))
}

fn finish(node: SimNode, agent: Option<AgentProcess>) {
    drop(agent);
    let left = node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// A native-sidecar pod whose Envoy gets its config [`XDS_DELAY`] late.
fn native(name: &str, app: AppScript) -> PodSpec {
    PodSpec::new(name)
        .native()
        .xds_delay(XDS_DELAY)
        .app(app)
        .call_timeout(Duration::from_secs(10))
}

/// An app calling out every 100 ms over one pooled connection (a broken connection is opened
/// again through the redirect), and for `after` past SIGTERM.
fn caller(after: Duration) -> AppScript {
    AppScript::CallThroughShutdown {
        every: Duration::from_millis(100),
        pool: 1,
        after_sigterm: after,
    }
}

fn us(t: &k8s_openapi::jiff::Timestamp) -> i64 {
    (t.as_nanosecond() / 1000) as i64
}

fn started_us(c: &ContainerView) -> Option<i64> {
    match &c.state {
        CState::Running { started_at } => Some(us(started_at)),
        CState::Terminated(t) => Some(us(&t.started_at)),
        CState::Waiting { .. } => None,
    }
}

fn last_exit(c: &ContainerView) -> Terminated {
    c.last_exit()
        .cloned()
        .unwrap_or_else(|| panic!("{} has not exited: {:?}", c.name, c.state))
}

/// When Envoy of pod `pod` first served (µs, wall clock): `/ready` LIVE and, when the node's
/// sidecars load the holdfast filter, its `loaded` gauge at 1 — until then Envoy's workers
/// serve nothing, the startup probe through its 15021 listener included (docs/benchmarks.md,
/// "Native sidecars vs classic + holdfast"). Polled every 5 ms from inside the pod's netns,
/// from the sandbox's start on.
fn watch_envoy_serving(node: &SimNode, pod: &str, stop: &AtomicBool) -> Option<u64> {
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], 15000));
    let filter = node.filter().is_some();
    let get = |path: &str| holdfast_tests::sim::pilot_agent::admin_request(admin, "GET", path);
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.pod(pod).is_none_or(|v| !v.sandbox_ready) {
        if stop.load(Ordering::SeqCst) || Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    node.in_pod_netns(pod, || loop {
        let at = now_us();
        let live = get("/ready").is_ok_and(|b| b.trim() == "LIVE");
        let loaded = !filter
            || get("/stats?filter=%5Ewasmcustom%5C.holdfast%5C.loaded%24").is_ok_and(|b| {
                b.lines()
                    .any(|l| l.trim() == "wasmcustom.holdfast.loaded: 1")
            });
        if live && loaded {
            return Some(at);
        }
        if stop.load(Ordering::SeqCst) || Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    })
    .ok()
    .flatten()
}

/// What a native pod's start showed.
#[derive(Debug)]
struct StartRun {
    /// Envoy serving (xDS config in, filter loaded) → the app container started, ms.
    serving_to_app_ms: f64,
    /// The proxy container started → the app container started, ms.
    proxy_to_app_ms: f64,
    startup_refused: u32,
}

/// Starts a native pod whose app calls out once at boot; returns the start's figures.
fn start_native(test: &str, with_agent: bool) -> StartRun {
    let mut node = node(test);
    let agent = maybe_agent(&node, with_agent);
    node.add_pod(native("web", AppScript::CallAtStart { calls: 1 }))
        .expect("add pod");
    node.start_pods().expect("start");
    let stop = AtomicBool::new(false);
    let (serving_us, view) = std::thread::scope(|s| {
        let watcher = s.spawn(|| watch_envoy_serving(&node, "web", &stop));
        let view = node.wait_for("web", Duration::from_secs(30), "pod Ready", |p| {
            p.containers_ready()
        });
        stop.store(true, Ordering::SeqCst);
        (watcher.join().expect("watcher"), view)
    });
    let view = view.expect("the native pod becomes Ready");
    let report = node
        .wait_report("web", Duration::from_secs(10), "the boot call", |r| {
            r.calls(Phase::Startup).ok + r.calls(Phase::Startup).failed > 0
        })
        .expect("the app calls out");
    let proxy = view.proxy().expect("proxy");
    let app = view.app().expect("app");
    let serving_us = serving_us.expect("Envoy served") as i64;
    let app_us = started_us(app).expect("app started");
    let proxy_us = started_us(proxy).expect("proxy started");
    // What the kubelet reported on the way: the proxy is a started, ready init container.
    let pod = view.to_pod();
    let status = pod.status.expect("status");
    let inits = status.init_container_statuses.expect("init statuses");
    let proxy_status = inits
        .iter()
        .find(|c| c.name == "istio-proxy")
        .expect("istio-proxy among the init container statuses");
    assert_eq!(proxy_status.started, Some(true));
    assert!(proxy_status.ready);
    assert!(status
        .container_statuses
        .expect("statuses")
        .iter()
        .all(|c| c.name != "istio-proxy"));
    let run = StartRun {
        serving_to_app_ms: (app_us - serving_us) as f64 / 1e3,
        proxy_to_app_ms: (app_us - proxy_us) as f64 / 1e3,
        startup_refused: report
            .calls(Phase::Startup)
            .errors(CallError::ConnectionRefused),
    };
    eprintln!("{test}: agent={with_agent}: {run:?}");
    finish(node, agent);
    run
}

#[test]
fn the_app_starts_once_the_proxys_startup_probe_passed() {
    if !privileged("the_app_starts_once_the_proxys_startup_probe_passed") {
        return;
    }
    let run = start_native("nsstart", false);
    assert_eq!(run.startup_refused, 0, "{run:?}");
    // The app waited for Envoy's config (started ≥ the xDS delay after the proxy) ...
    assert!(
        run.proxy_to_app_ms >= XDS_DELAY.as_secs_f64() * 1e3,
        "the app started before Envoy had its config: {run:?}"
    );
    // ... and started once Envoy served, within about one startup-probe period (1 s; the
    // bound leaves room for the probe's round trip and, on the containerd backend, the
    // container's creation; the watcher's 5 ms polls may see the filter's gauge late).
    assert!(
        (-100.0..=2000.0).contains(&run.serving_to_app_ms),
        "the app started {} ms after Envoy served (expected 0–1 probe period): {run:?}",
        run.serving_to_app_ms
    );
}

/// What a native pod's deletion showed.
#[derive(Debug)]
struct StopRun {
    /// The app's exit → the proxy's exit (the kubelet's container exit times), ms.
    proxy_lag_ms: f64,
    /// Deletion → the pod gone, ms.
    gone_ms: f64,
    /// Calls the app made after SIGTERM that failed.
    failed_after_sigterm: u32,
    ok_after_sigterm: u32,
    proxy_exit_code: i32,
    /// With the agent: its row once the drain was recorded.
    row: Option<PodStatus>,
}

/// Deletes a running native pod whose app calls out for 1 s past SIGTERM.
fn delete_native(test: &str, with_agent: bool, lifecycle_override: bool) -> StopRun {
    let mut node = node(test);
    let agent = maybe_agent(&node, with_agent);
    // With Istio's hook the drain duration must not matter (the default 5 s); without it the
    // 2 s drain is what the proxy takes after the app.
    let drain = if lifecycle_override {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(5)
    };
    node.add_pod(
        native("web", caller(Duration::from_secs(1)))
            .lifecycle_override(lifecycle_override)
            .drain(drain)
            .grace(Duration::from_secs(10)),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    node.wait_report("web", Duration::from_secs(30), "5 calls", |r| {
        r.calls(Phase::Running).ok >= 5
    })
    .expect("the app calls out");
    let t0 = Instant::now();
    node.delete_pod("web").expect("delete");
    let gone = node
        .wait_gone("web", Duration::from_secs(30))
        .expect("the pod goes");
    let gone_ms = t0.elapsed().as_secs_f64() * 1e3;
    let app = last_exit(gone.app().expect("app"));
    let proxy = last_exit(gone.proxy().expect("proxy"));
    let report = node.report("web").expect("report");
    let after = report.calls(Phase::AfterSigterm);
    let row = agent.as_ref().map(|agent| {
        agent
            .wait_pod(
                "default",
                "web",
                Duration::from_secs(10),
                "drain recorded",
                |row| row.drain.is_some(),
            )
            .expect("the agent recorded the deletion")
    });
    let run = StopRun {
        proxy_lag_ms: (us(&proxy.finished_at) - us(&app.finished_at)) as f64 / 1e3,
        gone_ms,
        failed_after_sigterm: after.failed,
        ok_after_sigterm: after.ok,
        proxy_exit_code: proxy.exit_code,
        row,
    };
    eprintln!(
        "{test}: agent={with_agent} lifecycle_override={lifecycle_override}: proxy lag {:.0} ms, gone {:.0} ms, after SIGTERM {} ok {} failed, proxy exit {}; drain {:?}",
        run.proxy_lag_ms,
        run.gone_ms,
        run.ok_after_sigterm,
        run.failed_after_sigterm,
        run.proxy_exit_code,
        run.row.as_ref().and_then(|r| r.drain.as_ref())
    );
    finish(node, agent);
    run
}

#[test]
fn deletion_stops_the_app_first_and_the_drained_proxy_right_after() {
    if !privileged("deletion_stops_the_app_first_and_the_drained_proxy_right_after") {
        return;
    }
    let run = delete_native("nsstop", false, false);
    assert_eq!(run.failed_after_sigterm, 0, "{run:?}");
    assert!(run.ok_after_sigterm >= 5, "{run:?}");
    // The proxy waited for the app (its turn), and Istio's preStop had drained it, so the
    // SIGTERM ends it at once: far less than the 5 s terminationDrainDuration. (The bound
    // leaves room for the containerd backend, where the stand-in sees an exit 45–390 ms late,
    // once 1.1 s: docs/containerd-backend.md, finding 6.)
    assert!(
        run.proxy_lag_ms >= 0.0 && run.proxy_lag_ms < 2000.0,
        "proxy exit lag {} ms: {run:?}",
        run.proxy_lag_ms
    );
    assert_eq!(run.proxy_exit_code, 0, "{run:?}");
    // Nothing waited for the 10 s grace period's SIGKILL.
    assert!(run.gone_ms < 9000.0, "{run:?}");
}

#[test]
fn without_istios_prestop_the_proxy_drains_after_the_app() {
    if !privileged("without_istios_prestop_the_proxy_drains_after_the_app") {
        return;
    }
    // global.proxy.lifecycle set: no /drain hook, so pilot-agent drains its 2 s
    // terminationDrainDuration after the SIGTERM that comes once the app has exited.
    let run = delete_native("nsovr", false, true);
    assert_eq!(run.failed_after_sigterm, 0, "{run:?}");
    assert!(
        (1900.0..6000.0).contains(&run.proxy_lag_ms),
        "proxy exit lag {} ms, expected the 2 s drain: {run:?}",
        run.proxy_lag_ms
    );
}

/// Deleting a native pod with Istio's preStop drain is no worse with holdfast: the kubelet
/// ends the proxy ~50 ms after the app either way, holdfast never quits it, only measures the
/// lag and puts it on the row (outcome `kubelet-ordered`). The run without holdfast is the
/// control.
#[test]
fn holdfast_leaves_a_native_deletion_with_istios_prestop_to_the_kubelet() {
    if !privileged("holdfast_leaves_a_native_deletion_with_istios_prestop_to_the_kubelet") {
        return;
    }
    let without = delete_native("nsdel0", false, false);
    let with = delete_native("nsdelhf", true, false);
    for run in [&without, &with] {
        assert_eq!(run.failed_after_sigterm, 0, "{run:?}");
        assert!(run.ok_after_sigterm >= 5, "{run:?}");
        assert_eq!(run.proxy_exit_code, 0, "{run:?}");
        assert!(run.gone_ms < 9000.0, "{run:?}");
    }
    // The exit lag as without holdfast: the same kubelet order (the bound leaves room for the
    // containerd backend's late exit events, docs/containerd-backend.md finding 6).
    assert!(
        with.proxy_lag_ms >= 0.0 && with.proxy_lag_ms < without.proxy_lag_ms + 1000.0,
        "with holdfast the proxy exited {} ms after the app, without {} ms",
        with.proxy_lag_ms,
        without.proxy_lag_ms
    );
    let row = with.row.as_ref().expect("the agent's row");
    assert_eq!(row.mode, Some(SidecarMode::Native), "{row:?}");
    let drain = row.drain.as_ref().expect("drain");
    assert_eq!(drain.outcome, DrainOutcome::KubeletOrdered, "{drain:?}");
    // Holdfast sent nothing: no inbound drain of its own (Istio's preStop did it), no quit.
    assert!(
        drain.quit_sent_at.is_none(),
        "holdfast quit the proxy: {drain:?}"
    );
    assert!(!drain.inbound_drained, "{drain:?}");
    // The lag is measured and on the row (the agent sees the admin API go, a little after the
    // kubelet's exit time).
    let lag = drain
        .app_gone_to_proxy_exit
        .expect("the app → proxy exit lag on the row");
    assert!(lag < Duration::from_secs(3), "{drain:?}");
}

/// Without Istio's preStop (the mesh's `global.proxy.lifecycle`), pilot-agent drains its
/// `terminationDrainDuration` (2 s here) after the SIGTERM the kubelet sends once the app
/// has exited: the control shows that lag. Holdfast ends the proxy on evidence once the app
/// is gone and nothing is in flight, well before, and no call fails.
#[test]
fn holdfast_ends_a_native_proxy_on_evidence_without_istios_prestop() {
    if !privileged("holdfast_ends_a_native_proxy_on_evidence_without_istios_prestop") {
        return;
    }
    let without = delete_native("nsovr0", false, true);
    let with = delete_native("nsovrhf", true, true);
    for run in [&without, &with] {
        assert_eq!(run.failed_after_sigterm, 0, "{run:?}");
        assert!(run.ok_after_sigterm >= 5, "{run:?}");
    }
    assert!(
        without.proxy_lag_ms >= 1900.0,
        "the control did not drain its 2 s: {without:?}"
    );
    // The proxy outlived the app (never ended while it ran) ...
    assert!(with.proxy_lag_ms >= 0.0, "{with:?}");
    // ... and ended on evidence, not after the 2 s drain.
    assert!(
        with.proxy_lag_ms < 1500.0 && with.proxy_lag_ms < without.proxy_lag_ms - 500.0,
        "with holdfast the proxy exited {} ms after the app, without {} ms",
        with.proxy_lag_ms,
        without.proxy_lag_ms
    );
    let row = with.row.as_ref().expect("the agent's row");
    assert_eq!(row.mode, Some(SidecarMode::Native), "{row:?}");
    let drain = row.drain.as_ref().expect("drain");
    assert_eq!(drain.outcome, DrainOutcome::AppDone, "{drain:?}");
    assert!(drain.quit_sent_at.is_some(), "{drain:?}");
    assert!(
        drain
            .app_gone_at
            .is_some_and(|gone| drain.quit_sent_at >= Some(gone)),
        "quit before the app was gone: {drain:?}"
    );
}

/// One kill of the native sidecar's Envoy while the app calls out.
#[derive(Debug)]
struct Crash {
    /// Calls refused from the kill until the restarted proxy served again.
    refused: u32,
    /// Calls that succeeded from the kill until then (held ones included).
    ok: u32,
    /// The proxy container's exit → its next start (the kubelet's times), ms.
    restart_after_ms: f64,
    /// The pod was seen not Ready while the proxy was down.
    not_ready_seen: bool,
    /// With the agent: its row once the hold installed after this kill was released.
    row: Option<PodStatus>,
}

/// Kills the native sidecar's Envoy `crashes` times while the app calls out every 100 ms;
/// each time waits until the restarted proxy is ready and the app's calls succeed again.
fn kill_native_envoy(test: &str, with_agent: bool, crashes: usize) -> Vec<Crash> {
    let mut node = node(test);
    let agent = maybe_agent(&node, with_agent);
    node.add_pod(native("oom", caller(Duration::ZERO)).call_timeout(Duration::from_secs(20)))
        .expect("add pod");
    node.start_pods().expect("start");
    node.wait_report("oom", Duration::from_secs(30), "5 calls", |r| {
        r.calls(Phase::Running).ok >= 5
    })
    .expect("the app calls out");
    let mut out = Vec::new();
    for n in 0..crashes {
        let view = node
            .wait_for("oom", Duration::from_secs(30), "proxy ready", |p| {
                p.containers_ready()
            })
            .expect("ready before the kill");
        if let Some(agent) = &agent {
            // The agent follows the running pod (and, after a kill, released its hold).
            agent
                .wait_pod("default", "oom", Duration::from_secs(20), "ready", |row| {
                    row.phase == holdfast::api::Phase::Ready
                })
                .expect("the agent follows the running native pod");
        }
        let restarts = view.proxy().expect("proxy").restart_count;
        let before = node.report("oom").expect("report").calls(Phase::Running);
        let killed_at = std::time::SystemTime::now();
        node.kill_envoy("oom").expect("kill Envoy");
        // Every state the pod showed until the restarted proxy is ready (a waiter may miss a
        // short one, not the seconds until the new Envoy passes its startup probe).
        let not_ready_seen = std::cell::Cell::new(false);
        let up = node
            .wait_for(
                "oom",
                Duration::from_secs(30),
                "proxy restarted and ready",
                |p| {
                    not_ready_seen.set(not_ready_seen.get() || !p.containers_ready());
                    p.proxy()
                        .is_some_and(|c| c.restart_count > restarts && c.is_ready())
                },
            )
            .expect("the kubelet restarts the proxy");
        let not_ready_seen = not_ready_seen.get();
        // Calls in flight finish (held ones once the new Envoy is ready), and a few more
        // succeed through the new Envoy.
        let ok_at_up = node.report("oom").expect("report").calls(Phase::Running).ok;
        let report = node
            .wait_report("oom", Duration::from_secs(30), "calls succeed again", |r| {
                r.calls(Phase::Running).ok >= ok_at_up + 3
            })
            .expect("the app's calls succeed again");
        let after = report.calls(Phase::Running);
        let proxy = up.proxy().expect("proxy");
        let exited = last_exit(proxy);
        let row = agent.as_ref().map(|agent| {
            agent
                .wait_pod(
                    "default",
                    "oom",
                    Duration::from_secs(20),
                    "the hold after the kill released",
                    |row| {
                        row.hold.as_ref().is_some_and(|h| {
                            h.outcome.is_some() && h.started_at.is_some_and(|t| t >= killed_at)
                        })
                    },
                )
                .expect("the agent held the app's calls again after the kill")
        });
        let crash = Crash {
            refused: after.errors(CallError::ConnectionRefused)
                - before.errors(CallError::ConnectionRefused),
            ok: after.ok - before.ok,
            restart_after_ms: (started_us(proxy).expect("running") - us(&exited.finished_at))
                as f64
                / 1e3,
            not_ready_seen,
            row,
        };
        eprintln!(
            "{test}: agent={with_agent}: crash {}: refused {}, ok {}, restart after {:.0} ms, not Ready seen {}; hold {:?}",
            n + 1,
            crash.refused,
            crash.ok,
            crash.restart_after_ms,
            crash.not_ready_seen,
            crash.row.as_ref().and_then(|r| r.hold.as_ref())
        );
        let app = up.app().expect("app");
        assert_eq!(app.restart_count, 0, "the app kept running");
        out.push(crash);
    }
    finish(node, agent);
    out
}

#[test]
fn a_killed_sidecar_is_restarted_with_backoff_and_the_app_is_refused_meanwhile() {
    if !privileged("a_killed_sidecar_is_restarted_with_backoff_and_the_app_is_refused_meanwhile") {
        return;
    }
    let crashes = kill_native_envoy("nscrash", false, 2);
    for c in &crashes {
        assert!(c.not_ready_seen, "the pod stayed Ready: {c:?}");
        // The restarted pilot-agent waits for istiod's push again: the calls of that time and
        // of the back-off are refused.
        assert!(c.refused >= 3, "{c:?}");
    }
    // The first exit is restarted at once (no back-off entry yet), the second after the
    // initial back-off.
    assert!(crashes[0].restart_after_ms < 1500.0, "{:?}", crashes[0]);
    assert!(
        crashes[1].restart_after_ms >= BACKOFF.as_secs_f64() * 1e3 - 50.0,
        "{:?}",
        crashes[1]
    );
    assert!(crashes[1].refused > crashes[0].refused, "{crashes:?}");
}

/// Issue 22's first row: the native sidecar's Envoy killed while the app calls out every
/// 100 ms; the kubelet restarts it (the second time after its back-off). Without holdfast
/// (the control, same test) the app's calls are refused until the new Envoy serves; with
/// holdfast they are held: at most one refused per crash (a call whose pooled connection the
/// kill broke mid-request may fail), the row says native, re-held, and why.
#[test]
fn holdfast_holds_the_apps_calls_across_a_native_sidecar_restart() {
    if !privileged("holdfast_holds_the_apps_calls_across_a_native_sidecar_restart") {
        return;
    }
    let without = kill_native_envoy("nscrash0", false, 2);
    let with = kill_native_envoy("nscrashhf", true, 2);
    eprintln!(
        "refused per crash: without holdfast {:?}, with {:?}",
        without.iter().map(|c| c.refused).collect::<Vec<_>>(),
        with.iter().map(|c| c.refused).collect::<Vec<_>>()
    );
    // The control: the same kills refuse many calls without holdfast.
    for c in &without {
        assert!(c.refused >= 3, "the control refused few calls: {c:?}");
    }
    for c in &with {
        // The kubelet still restarted the proxy (the second time after its back-off) and the
        // pod went not Ready meanwhile: holdfast changed nothing of that.
        assert!(c.not_ready_seen, "{c:?}");
        assert!(c.refused <= 1, "calls refused across the restart: {c:?}");
        // The calls of the window were held, not lost: they succeeded.
        assert!(c.ok >= 3, "{c:?}");
        let row = c.row.as_ref().expect("the agent's row");
        assert_eq!(row.mode, Some(SidecarMode::Native), "{row:?}");
        let hold = row.hold.as_ref().expect("a hold");
        assert_eq!(hold.outcome, Some(HoldOutcome::Ready), "{hold:?}");
        assert!(hold.connections_held >= 1, "nothing was held: {hold:?}");
        let problem = row.last_error.as_deref().unwrap_or_default();
        assert!(
            problem.contains("native sidecar") && problem.contains("back-off"),
            "the row does not say the back-off is the kubelet's: {row:?}"
        );
    }
    assert!(
        with[1].restart_after_ms >= BACKOFF.as_secs_f64() * 1e3 - 50.0,
        "the second restart came before the kubelet's back-off: {:?}",
        with[1]
    );
}

/// What a sidecar lost during termination showed.
#[derive(Debug)]
struct Lost {
    /// The proxy's restarts after the kill.
    restarts: u32,
    /// The app's calls refused after SIGTERM.
    refused: u32,
    /// With the agent: its row once the drain was recorded, and its `/metrics` and log then.
    row: Option<PodStatus>,
    metrics: String,
    log: String,
}

/// Deletes a native pod whose app calls out for 3 s past SIGTERM and kills its Envoy 1 s into
/// that.
fn kill_envoy_during_termination(test: &str, with_agent: bool) -> Lost {
    let mut node = node(test);
    let agent = maybe_agent(&node, with_agent);
    node.add_pod(native("term", caller(Duration::from_secs(3))).grace(Duration::from_secs(10)))
        .expect("add pod");
    node.start_pods().expect("start");
    node.wait_report("term", Duration::from_secs(30), "5 calls", |r| {
        r.calls(Phase::Running).ok >= 5
    })
    .expect("the app calls out");
    if let Some(agent) = &agent {
        agent
            .wait_pod("default", "term", Duration::from_secs(20), "ready", |row| {
                row.phase == holdfast::api::Phase::Ready
            })
            .expect("the agent follows the running native pod");
    }
    node.delete_pod("term").expect("delete");
    node.wait_report("term", Duration::from_secs(10), "SIGTERM", |r| {
        r.calls(Phase::AfterSigterm).ok >= 5
    })
    .expect("the app calls out after SIGTERM");
    let view = node.pod("term").expect("pod");
    let restarts = view.proxy().expect("proxy").restart_count;
    node.kill_envoy("term").expect("kill Envoy");
    let gone = node
        .wait_gone("term", Duration::from_secs(30))
        .expect("the pod goes");
    let proxy = gone.proxy().expect("proxy");
    let report = node.report("term").expect("report");
    let refused = report
        .calls(Phase::AfterSigterm)
        .errors(CallError::ConnectionRefused);
    let (row, metrics, log) = match &agent {
        Some(agent) => {
            let row = agent
                .wait_pod(
                    "default",
                    "term",
                    Duration::from_secs(10),
                    "drain recorded",
                    |row| row.drain.is_some(),
                )
                .expect("the agent recorded the deletion");
            let metrics = agent.get("/metrics").expect("/metrics");
            (Some(row), metrics, agent.log_text())
        }
        None => (None, String::new(), String::new()),
    };
    let lost = Lost {
        restarts: proxy.restart_count - restarts,
        refused,
        row,
        metrics,
        log,
    };
    eprintln!(
        "{test}: agent={with_agent}: restarts after the kill {}, refused after SIGTERM {}; drain {:?}",
        lost.restarts,
        lost.refused,
        lost.row.as_ref().and_then(|r| r.drain.as_ref())
    );
    finish(node, agent);
    lost
}

#[test]
fn a_sidecar_lost_during_termination_is_not_restarted() {
    if !privileged("a_sidecar_lost_during_termination_is_not_restarted") {
        return;
    }
    let lost = kill_envoy_during_termination("nsterm", false);
    assert_eq!(
        lost.restarts, 0,
        "the kubelet restarted a sidecar during termination"
    );
    // The app has no egress for the rest of its shutdown (about 2 s of calls every 100 ms).
    assert!(lost.refused >= 10, "{lost:?}");
}

/// A sidecar lost during termination cannot be restarted (by anyone, until KEP-4438); holdfast
/// says so where operators look: the row's outcome `sidecar-lost` with advice, the Warning
/// Event `SidecarLostDuringTermination` (logged here: no API server), and
/// `holdfast_drains_total{outcome="sidecar-lost"}`. The control is a pod whose deletion goes
/// well: outcome `kubelet-ordered`, no such Event, the metric at 0.
#[test]
fn holdfast_reports_a_sidecar_lost_during_termination() {
    if !privileged("holdfast_reports_a_sidecar_lost_during_termination") {
        return;
    }
    let lost = kill_envoy_during_termination("nstermhf", true);
    assert_eq!(lost.restarts, 0, "{lost:?}");
    assert!(lost.refused >= 10, "{lost:?}");
    let row = lost.row.as_ref().expect("the agent's row");
    assert_eq!(row.mode, Some(SidecarMode::Native), "{row:?}");
    let drain = row.drain.as_ref().expect("drain");
    assert_eq!(drain.outcome, DrainOutcome::SidecarLost, "{drain:?}");
    assert!(
        drain
            .advice
            .as_deref()
            .is_some_and(|a| a.contains("KEP-4438")),
        "{drain:?}"
    );
    assert!(
        lost.log.contains("SidecarLostDuringTermination"),
        "no SidecarLostDuringTermination event in the agent's log"
    );
    assert_eq!(
        metric(
            &lost.metrics,
            "holdfast_drains_total{outcome=\"sidecar-lost\"}"
        ),
        Some(1.0),
        "{}",
        lost.metrics
    );

    // The control: a native pod deleted without a kill.
    let mut node = node("nstermok");
    let agent = AgentProcess::for_node(&node).expect("start the holdfast agent");
    node.add_pod(native("term", caller(Duration::from_secs(1))).grace(Duration::from_secs(10)))
        .expect("add pod");
    node.start_pods().expect("start");
    node.wait_report("term", Duration::from_secs(30), "5 calls", |r| {
        r.calls(Phase::Running).ok >= 5
    })
    .expect("the app calls out");
    agent
        .wait_pod("default", "term", Duration::from_secs(30), "ready", |row| {
            row.phase == holdfast::api::Phase::Ready
        })
        .expect("the agent follows the running native pod");
    node.delete_pod("term").expect("delete");
    node.wait_gone("term", Duration::from_secs(30))
        .expect("the pod goes");
    let row = agent
        .wait_pod(
            "default",
            "term",
            Duration::from_secs(10),
            "drain recorded",
            |row| row.drain.is_some(),
        )
        .expect("the agent recorded the deletion");
    let drain = row.drain.as_ref().expect("drain");
    assert_eq!(drain.outcome, DrainOutcome::KubeletOrdered, "{drain:?}");
    let metrics = agent.get("/metrics").expect("/metrics");
    assert_ne!(
        metric(&metrics, "holdfast_drains_total{outcome=\"sidecar-lost\"}"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "holdfast_drains_total{outcome=\"kubelet-ordered\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    assert!(!agent.log_text().contains("SidecarLostDuringTermination"));
    finish(node, Some(agent));
}

/// A sample's value from an OpenMetrics text (`name{labels}` exactly as written).
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// Runs a native-sidecar Job (3 calls, exit 0); returns the pod's final view and how long
/// after the app's exit the proxy exited (ms).
fn native_job(test: &str, with_agent: bool) -> (PodView, f64) {
    let mut node = node(test);
    let agent = maybe_agent(&node, with_agent);
    node.add_pod(
        native(
            "job",
            AppScript::Batch {
                calls: 3,
                exit_code: 0,
            },
        )
        .job(),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    let done = node
        .wait_phase("job", PodPhase::Succeeded, Duration::from_secs(30))
        .expect("the Job's pod completes");
    let app = last_exit(done.app().expect("app"));
    let proxy = last_exit(done.proxy().expect("proxy"));
    let lag = (us(&proxy.finished_at) - us(&app.finished_at)) as f64 / 1e3;
    eprintln!("{test}: agent={with_agent}: proxy exited {lag} ms after the app");
    node.delete_pod("job").expect("delete");
    node.wait_gone("job", Duration::from_secs(30))
        .expect("the pod goes");
    finish(node, agent);
    (done, lag)
}

#[test]
fn a_native_sidecar_job_completes() {
    if !privileged("a_native_sidecar_job_completes") {
        return;
    }
    let (done, lag) = native_job("nsjob", false);
    let report_ok = done.app().and_then(ContainerView::exit_code);
    assert_eq!(report_ok, Some(0));
    // The kubelet stopped the sidecar once the app was done, not a timer (a classic sidecar
    // would run on: failures.rs, job_never_completes).
    assert!((0.0..3000.0).contains(&lag), "proxy exit lag {lag} ms");
    assert_eq!(done.proxy().map(|c| c.restart_count), Some(0));
}
