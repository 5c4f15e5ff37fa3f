//! The hostile-pod suite's short form (issue 25; the long form with figures is
//! `holdfast-soak --hostile`, docs/benchmarks.md "Hostile pods"): beside an honest pod, one
//! attacker at a time — a fake Envoy with 4 MiB admin answers, a pod flooding its own rules, a
//! netlink forger, 70 status API slot holders, a pid-wrapping forker, 300 terminal-phase pod
//! objects, a pod whose app has 2,000 processes and is deleted with a long grace (its drain
//! covers the window), the same whose "Envoy" answers the drain's samples with ~1 MB, a pod
//! writing hostile text in its annotations, a `sleep` loop exec'd into a pod's proxy container,
//! a pod flipping its opt-out annotation 10 times a second — and the same run without an
//! attacker. Each run
//! prints the agent's CPU, RSS and fds and the honest pod's figures.
//!
//! The agent runs an optimised build (the `quota` profile: `release` without its fat LTO)
//! under the DaemonSet's limits, cpu 200m as a CFS quota and memory 128Mi
//! ([`hostile::AgentCgroup`]), its cost read from that cgroup, children included. The honest
//! pod boots in a node's window from sandbox to app ([`hostile::HONEST_INIT_UNDER_QUOTA`]:
//! 500 ms, not the sim's 150 ms, against which a throttled agent lost the race now and then
//! with no attack at all).
//! Asserted: correctness and bounds. The honest pod's boot calls all succeed, its hold ends
//! `ready` and its drain `app-done` (it reached its own Envoy), and its hold goes in (netns
//! seen → hold in) within twice the no-attack figure or [`HOLD_LATENCY_FLOOR_MS`]; the
//! attacker is failed open alone with the reason on its row where it broke a bound; the agent
//! is never OOM-killed (nor would a cgroup v2 node have killed it), its peak RSS stays under
//! 64 MiB, its own CPU stays under a quarter of the window and beside the 2,000-process drain
//! its cgroup's under half the DaemonSet's limit; the liveness probe is answered at least 9
//! times in 10.

use std::time::Duration;

use holdfast::api::Phase;
use holdfast::effects::procfs::pod_procs::MAX_PROCS_PER_POD;
use holdfast::lifecycle::drain::admin::DRAIN_SAMPLE_MAX;
use holdfast_tests::hostile::{self, Figures, Opts, Scenario, DAEMONSET_CPU_MILLIS};
use holdfast_tests::sim::privileged;

const WINDOW: Duration = Duration::from_secs(5);
const RSS_BOUND_KIB: u64 = 64 * 1024;

/// The honest pod's netns seen → hold in beside an attack: at most twice the same figure with
/// no attacker (issue 29), or this floor when that is larger. The no-attack figure is 7–48 ms
/// on this shared machine, and runs beside attackers that cost the agent no more CPU than none
/// moved up to 135 ms (terminal pods, unconfined at load ~20): most of the window is the
/// `iptables-restore` child that installs the hold, scheduled with everything else, and under
/// the quota a throttled period can stall the agent and that child for up to 80 ms more. So
/// 2× a 7 ms baseline would fail on noise; 200 ms still fails a build that checks the
/// attacker's processes under the node-wide lock (404 ms under the quota, 2026-11-28 06:11
/// UTC; its honest boot calls refused too) and the build before the drain's pids were placed
/// from the pod's cgroup directory (199–289 ms beside the 2,000-process drain, optimised
/// build, 2026-11-28 08:40–08:50 UTC; 3 honest calls refused in 1 of 3 runs); with 128 new
/// pids a drain look, 8–34 ms there (8 runs, 09:31–09:33 UTC).
const HOLD_LATENCY_FLOOR_MS: f64 = 200.0;

/// The honest pod's hold went in within 2× its no-attack latency (or the floor).
fn hold_within_twice(f: &Figures, none_ms: f64) {
    let got = f
        .honest
        .netns_to_hold_ms
        .unwrap_or_else(|| panic!("no netns → hold-in figure: {}", f.line()));
    let bound = (2.0 * none_ms).max(HOLD_LATENCY_FLOOR_MS);
    eprintln!(
        "  {}: honest netns → hold in {got:.0} ms; with no attacker {none_ms:.0} ms; bound {bound:.0} ms",
        f.scenario.name()
    );
    assert!(
        got <= bound,
        "beside {} the honest pod's hold went in {got:.0} ms after its netns was seen, more than \
         twice the {none_ms:.0} ms with no attacker (floor {HOLD_LATENCY_FLOOR_MS} ms): {}",
        f.scenario.name(),
        f.line()
    );
}

/// The attacker's drain watched at most the per-pod cap of its processes, and the agent's
/// cgroup spent less than half the DaemonSet's CPU limit over the window (under the quota it
/// cannot spend more than the limit; before the drain's rescans relied on pidfds it spent
/// 1.31 CPU-s in 5 s unconfined, 0.26 cores; this build 0.14–0.20 CPU-s, 0.03–0.04 cores).
fn drain_bounded(f: &Figures) -> holdfast::api::DrainReport {
    let row = f.attacker.as_ref().expect("attacker row");
    let d = row
        .drain
        .clone()
        .unwrap_or_else(|| panic!("no drain report on the attacker's row: {row:?}"));
    for e in &d.errors {
        eprintln!("  attacker's drain: {e}");
    }
    // At most the per-pod cap at a time: the oldest 512, then (when the app's exit kills the
    // rest) the next ones as those exit; all 2,000 at once before the cap. Once, on a machine
    // at load 35, the pidfds of exited processes stayed open while the next ones were watched:
    // twice the cap, transiently.
    assert!(
        d.app_processes_seen > 0 && d.app_processes_seen <= 2 * MAX_PROCS_PER_POD,
        "{} app processes watched: {}",
        d.app_processes_seen,
        f.line()
    );
    assert!(
        f.cost.fds_max <= 2 * MAX_PROCS_PER_POD + 64,
        "{} fds: {}",
        f.cost.fds_max,
        f.line()
    );
    let cpu = f.cost.cgroup_cpu_s.expect("the agent ran in its cgroup");
    let limit = f.cost.window_s * DAEMONSET_CPU_MILLIS as f64 / 1000.0;
    assert!(
        cpu < limit / 2.0,
        "the agent's cgroup spent {cpu:.2} CPU-s in {:.1} s, over half the DaemonSet's limit: {}",
        f.cost.window_s,
        f.line()
    );
    d
}

/// How the short form runs: the optimised agent under the DaemonSet's memory limit and CPU
/// quota. `None` (outside CI only) when that build is
/// missing: the test is skipped with the command that builds it.
///
/// Issue 29 first ran the debug build here: under the quota a debug build spends 3–10× what
/// the shipped agent does (the 2,000-process drain's first look: 300 ms of CPU), so it
/// measured the wrong program and failed on it — the honest pod's boot calls refused beside
/// the 2,000-process drain (CI, 2026-11-28 07:05 UTC), beside 300 terminal pods (07:10) and
/// beside pod-text unconfined on a loaded machine (08:42).
fn opts() -> Option<Opts> {
    let agent = match holdfast_tests::agent::holdfast_quota_binary() {
        Ok(p) => p,
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => panic!("{e:#}"),
        Err(e) => {
            eprintln!("SKIPPED hostile_pods_cannot_blind_crash_or_steer_the_agent: {e:#}");
            return None;
        }
    };
    Some(Opts {
        sim_app: Some(env!("CARGO_BIN_EXE_sim-app").into()),
        holdfast: Some(agent),
        legacy_listeners: false,
        window: WINDOW,
        prefix: "hs-".into(),
        confine: true,
        cpu_quota: true,
    })
}

fn run(s: Scenario, opts: &Opts) -> Figures {
    let f = hostile::run(s, opts).unwrap_or_else(|e| panic!("{}: {e:#}", s.name()));
    eprintln!("{}", f.line());
    if !f.attack_log.is_empty() {
        eprintln!("  {}", f.attack_log);
    }
    // The honest pod, whatever the attack.
    assert_eq!(f.honest.failed_calls, 0, "{}", f.line());
    assert_eq!(
        f.honest.hold_outcome.as_deref(),
        Some("ready"),
        "{}",
        f.line()
    );
    assert_eq!(
        f.honest.drain_outcome.as_deref(),
        Some("app-done"),
        "{}",
        f.line()
    );
    // The agent under the DaemonSet's limits: never OOM-killed, and no node would have
    // killed it (cgroup v2's memory.oom.group).
    let g = f.cost.cgroup.expect("the agent ran in its cgroup");
    assert!(!g.would_be_killed(), "{g:?}: {}", f.line());
    // The agent's budget.
    assert!(
        f.cost.rss_peak_kib < RSS_BOUND_KIB,
        "RSS peak {} KiB: {}",
        f.cost.rss_peak_kib,
        f.line()
    );
    assert!(
        f.cost.cpu_s < f.cost.window_s / 4.0,
        "the agent spent {:.2} s of CPU in {:.1} s: {}",
        f.cost.cpu_s,
        f.cost.window_s,
        f.line()
    );
    f
}

fn failed_open_because(f: &Figures, why: &str) {
    let row = f
        .attacker
        .as_ref()
        .unwrap_or_else(|| panic!("no attacker row: {}", f.line()));
    assert_eq!(row.phase, Phase::Skipped, "{row:?}");
    let reason = row.skipped_reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains("failed open") && reason.contains(why),
        "{reason}"
    );
}

#[test]
#[ignore = "long form, `just test-all`: runs the `quota` profile's agent"]
fn hostile_pods_cannot_blind_crash_or_steer_the_agent() {
    if !privileged("hostile_pods_cannot_blind_crash_or_steer_the_agent") {
        return;
    }
    let Some(opts) = opts() else {
        return;
    };
    let run = |s| run(s, &opts);
    let none = run(Scenario::None);
    let none_ms = none
        .honest
        .netns_to_hold_ms
        .unwrap_or_else(|| panic!("no netns → hold-in figure: {}", none.line()));

    let f = run(Scenario::FakeEnvoy);
    failed_open_because(&f, "answered more than the agent reads");
    hold_within_twice(&f, none_ms);

    let f = run(Scenario::NetlinkForger);
    failed_open_because(&f, "not from the kernel");
    hold_within_twice(&f, none_ms);

    let f = run(Scenario::RuleFlood);
    let row = f.attacker.as_ref().expect("attacker row");
    assert!(
        row.hold.as_ref().is_some_and(|h| h.outcome.is_some()),
        "the flooder's hold ended: {row:?}"
    );
    hold_within_twice(&f, none_ms);

    let f = run(Scenario::SlotHolders);
    let (ok, n) = f.liveness.expect("probes");
    assert!(ok * 10 >= n * 9, "liveness {ok}/{n}");
    hold_within_twice(&f, none_ms);

    let f = run(Scenario::PidWrapper);
    assert!(f.attack_log.contains("fork flood"), "{}", f.attack_log);
    hold_within_twice(&f, none_ms);

    let f = run(Scenario::TerminalPods(300));
    hold_within_twice(&f, none_ms);

    // Issue 29: 2,000 processes in a pod whose drain lasts the window.
    let f = run(Scenario::ManyProcs);
    assert!(f.attack_log.contains("2000 processes"), "{}", f.attack_log);
    drain_bounded(&f);
    // Before the drain's pids were placed from the pod's cgroup directory its first looks
    // read ~5,000 /proc files in a burst and the honest hold went in 199–289 ms after its netns
    // (its boot calls refused once in 3 runs); with the node-wide lock, 404 ms.
    hold_within_twice(&f, none_ms);

    // The same, and its "Envoy" answers the drain's samples with ~1 MB: each read stops at
    // the sample cap.
    let f = run(Scenario::ManyProcsFakeEnvoy);
    let d = drain_bounded(&f);
    let cap = format!("larger than the {DRAIN_SAMPLE_MAX} byte cap");
    assert!(
        d.errors
            .iter()
            .any(|e| e.contains("/stats") && e.contains(&cap)),
        "no drain sample stopped at the cap: {:?}",
        d.errors
    );
    hold_within_twice(&f, none_ms);

    // Issue 29: a pod's text reaches its row cut and escaped, whatever it writes.
    // Issue 29: a loop's processes ending in the proxy container are not the proxy going.
    let f = run(Scenario::ExecLoop);
    let row = f.attacker.as_ref().expect("attacker row");
    assert_eq!(row.phase, Phase::Ready, "{row:?}");
    let tl = row.timeline.as_ref().expect("a timeline");
    let gone = tl
        .steps
        .iter()
        .filter(|s| s.step == holdfast::api::StepKind::ProxyGone)
        .count();
    assert_eq!(
        (gone, tl.dropped),
        (0, 0),
        "re-checks on the attacker's timeline: {tl:?}"
    );
    hold_within_twice(&f, none_ms);

    // Issue 29: the opt-out annotation flipped 10 times a second costs a bounded parse each
    // (the common assertions) and never loses the pod's row.
    let f = run(Scenario::AnnotationToggle);
    assert!(f.attacker.is_some(), "the toggled pod's row: {}", f.line());
    hold_within_twice(&f, none_ms);

    let f = run(Scenario::PodText);
    let row = f.attacker.as_ref().expect("attacker row");
    let problem = row.last_error.as_deref().unwrap_or_default();
    assert!(
        problem.contains("bytes cut]") && problem.len() < 4096,
        "{} bytes: {problem:.300}",
        problem.len()
    );
    assert!(
        !problem.chars().any(holdfast::api::text::is_unsafe_char),
        "{problem:.300}"
    );
    let row_json = serde_json::to_string(row).expect("json");
    assert!(
        row_json.len() < 64 * 1024,
        "row is {} bytes",
        row_json.len()
    );
    hold_within_twice(&f, none_ms);
}
