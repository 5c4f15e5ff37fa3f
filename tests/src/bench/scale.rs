//! The `scale` benchmark section (see docs/benchmarks.md, "Scale").
//!
//! N pods start at once on one simulated node (one Envoy per pod, `--concurrency 1`), each app
//! making one call at boot with Envoy `--proxy-delay-ms` late, under one agent; then they sit
//! idle; then they are all deleted at once. For each N the same scenario runs with the agent
//! under test and, when `--baseline-agent` names another `holdfast` build, with that one, in
//! turn within the same run — before/after figures from the same machine and minutes.
//!
//! Measured from outside the agent:
//! - **release**: an observer per pod ([`super::scale_observer`]) watches the capture ports with
//!   `sock_diag` and, once they listen, asks Envoy's admin every `--observe-poll-ms` (one
//!   kept-alive connection) for `server.state` (0 = LIVE), `listener_manager.workers_started`,
//!   `server.concurrency` and the holdfast filter's gauges; "fully ready" is LIVE, workers
//!   started and the filter configured (`workers_ready >= concurrency` where the filter
//!   publishes it, else `loaded == 1`). Release = that moment → the end of the app's held call
//!   (its own report, µs). The poll interval bounds the resolution (the release is measured from
//!   the first poll that saw ready, so it is under-estimated by at most one interval).
//! - **floor**: the same call made by the observer right after the app's, un-held: what the
//!   machine itself takes at that moment; `release − floor` is what the agent added.
//! - the agent's CPU (`/proc/<pid>/stat` utime+stime, plus its reaped children: iptables) during
//!   the start-up burst and idle afterwards, its RSS (VmRSS idle, VmHWM peak), threads and fds;
//! - refused calls (the app's report), holds that went in late or ended by deadline (the agent's
//!   status rows), and on deletion the lag from the app container's exit to the proxy's, as the
//!   simulated kubelet reaped them, split by the agent's drain report (when it saw the app gone,
//!   when it sent the quit).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use holdfast::report::board::HoldOutcome;

use super::scale_observer::observe;
use super::{load_average, percentile};
use crate::agent::AgentProcess;
use crate::bench_opts::SimBenchOpts;
use crate::sim::pod_object::{CState, ContainerView};
use crate::sim::report::AppEvent;
use crate::sim::{AppScript, CallError, NodeOptions, Phase, PodSpec, SimNode};

/// Goals from the performance issue, printed next to the figures.
const GOAL_RELEASE_P99_MS: f64 = 5.0;
const GOAL_BURST_CPU_S: f64 = 2.0;
const GOAL_IDLE_MS_PER_S_PER_POD: f64 = 0.05;
const GOAL_RSS_MIB: f64 = 20.0;
const GOAL_DRAIN_LAG_P99_MS: f64 = 50.0;

/// Options of the section.
#[derive(Debug, Clone)]
pub struct ScaleOpts {
    /// Pod counts, each a scenario.
    pub pods: Vec<u32>,
    /// Another `holdfast` binary to run side by side (the "before" build).
    pub baseline: Option<PathBuf>,
    /// How often the outside observer polls each pod's Envoy.
    pub observe_poll: Duration,
    /// How long the idle cost is measured.
    pub idle: Duration,
}

/// One scenario's figures.
#[derive(Debug, Clone, Default)]
struct Sample {
    pods: u32,
    refused: u32,
    failed_pods: u32,
    release_ms: Vec<f64>,
    /// Fully ready → the app's held `connect()` returned, ms (and from the last not-ready
    /// observation: an upper bound).
    connect_ms: Vec<f64>,
    connect_bound_ms: Vec<f64>,
    /// From the observer's answer that said fully ready (a lower bound).
    connect_lower_ms: Vec<f64>,
    /// How long that answer took (request sent → answer), ms.
    ready_answer_ms: Vec<f64>,
    /// The un-held `connect()` just after, ms.
    floor_connect_ms: Vec<f64>,
    /// Release measured from the observer's last not-ready observation (an upper bound).
    release_bound_ms: Vec<f64>,
    /// The same call un-held, just after the held one (the machine's floor), ms.
    floor_ms: Vec<f64>,
    /// Per pod: release − floor, ms.
    release_over_floor_ms: Vec<f64>,
    /// Capture ports listening → fully ready (the observer's admin-polling window), ms.
    window_ms: Vec<f64>,
    /// Admin requests the observer made, in all.
    observer_requests: u64,
    agent_release_ms: Vec<f64>,
    late: u32,
    not_ready_outcome: u32,
    burst_cpu_s: f64,
    burst_kernel_share: f64,
    burst_children_s: f64,
    burst_s: f64,
    idle_ms_per_s: f64,
    rss_idle_mib: f64,
    rss_peak_mib: f64,
    threads: u64,
    fds: u64,
    drain_lag_ms: Vec<f64>,
    /// Drain timeline per pod, from the kubelet's exits and the agent's drain report (ms):
    /// app exit (kubelet) → app gone seen by the agent,
    drain_seen_ms: Vec<f64>,
    /// → quit sent by the agent,
    drain_decide_ms: Vec<f64>,
    /// → proxy exit (kubelet).
    drain_exit_ms: Vec<f64>,
    /// Quit sent → Envoy's admin refused connections (the agent's own view of the exit).
    drain_admin_gone_ms: Vec<f64>,
    /// Load average when the burst was over, and at the end.
    load_burst: String,
    load: String,
}

/// Runs the section and prints its table.
pub fn run(opts: &SimBenchOpts, scale: &ScaleOpts) -> Result<()> {
    ensure!(
        nix::unistd::geteuid().is_root(),
        "the scale section needs root (network namespaces, iptables, cgroups): run it with sudo"
    );
    ensure!(
        !scale.pods.is_empty(),
        "--scale-pods: give at least one pod count"
    );
    let mut variants: Vec<(String, Option<PathBuf>)> = Vec::new();
    if let Some(b) = &scale.baseline {
        ensure!(
            b.is_file(),
            "--baseline-agent {}: no such file",
            b.display()
        );
        variants.push((format!("before ({})", b.display()), Some(b.clone())));
    }
    variants.push(("this build".into(), Some(opts.holdfast.clone())));
    let mut results: Vec<(u32, String, Sample)> = Vec::new();
    for &n in &scale.pods {
        ensure!(
            (1..=250).contains(&n),
            "--scale-pods: {n} is not in 1..=250"
        );
        let _inotify = InotifyLimit::raise_for(n)?;
        for (label, bin) in &variants {
            let settled = settle();
            eprintln!("scale: {n} pods, agent {label} (machine settled after {settled:.1?})");
            let s = scenario(opts, scale, n, bin.as_deref())
                .with_context(|| format!("scale: {n} pods with agent {label}"))?;
            results.push((n, label.clone(), s));
        }
    }
    print_table(scale, &results);
    Ok(())
}

/// Waits until the machine is quiet before a scenario: the 1-minute load average at most 8 and
/// at most 2 runnable tasks (the 4th field of `/proc/loadavg`, an instant count) in 10
/// consecutive looks 100 ms apart, or 240 s. After a 110-pod scenario the kernel and the exiting
/// Envoys keep the machine busy for a while although few tasks are runnable at any instant
/// (a runnable-count check alone let the second variant of a pair run on a machine at load
/// 70–87 against 23–47 for the first, and its latencies were ten times worse whichever build
/// it was). Returns how long it waited.
fn settle() -> Duration {
    let started = Instant::now();
    let quiet_now = || -> Option<bool> {
        let s = std::fs::read_to_string("/proc/loadavg").ok()?;
        let mut fields = s.split_whitespace();
        let load: f64 = fields.next()?.parse().ok()?;
        let running: u32 = fields.nth(2)?.split('/').next()?.parse().ok()?;
        // This thread itself is one of the runnable tasks.
        Some(load <= 8.0 && running <= 2)
    };
    let mut quiet = 0;
    while quiet < 10 && started.elapsed() < Duration::from_secs(240) {
        quiet = if quiet_now().unwrap_or(true) {
            quiet + 1
        } else {
            0
        };
        std::thread::sleep(Duration::from_millis(100));
    }
    started.elapsed()
}

fn scenario(
    opts: &SimBenchOpts,
    scale: &ScaleOpts,
    n: u32,
    agent_bin: Option<&Path>,
) -> Result<Sample> {
    let proxy_delay = opts.proxy_delay;
    let node_opts = NodeOptions {
        sim_app: Some(opts.sim_app.clone()),
        ..NodeOptions::default()
    };
    let mut node = SimNode::with_options(&format!("hsc{n}"), node_opts)?;
    let names: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
    for name in &names {
        node.add_pod(
            PodSpec::new(name)
                .app(AppScript::CallAtStart { calls: 1 })
                .proxy_delay(proxy_delay)
                .proxy_concurrency(1)
                .call_timeout(proxy_delay + Duration::from_secs(150)),
        )?;
    }
    let agent = AgentProcess::start_binary(
        agent_bin,
        node.node_name(),
        node.pods_dir(),
        &node.work_dir().join("agent.log"),
        &[],
    )?;
    let pid = agent.pid().context("the agent has no pid")?;
    let cpu0 = ProcCpu::read(pid)?;
    let t0 = Instant::now();
    node.start_pods()?;

    let budget = proxy_delay + Duration::from_secs(150);
    let give_up = Instant::now() + budget;
    let stop = AtomicBool::new(false);
    let mut sample = Sample {
        pods: n,
        ..Sample::default()
    };
    // The agent's row says the hold ended (released, rules gone), or there was none. One
    // `/status` (every pod's row) serves every observer for 100 ms: asked per observer every
    // few ms, serialising 110 rows each time, the benchmark itself cost the agent CPU during
    // the burst it measures (the floor call only has to come after the hold, not at once).
    let status_cache: std::sync::Mutex<Option<(Instant, holdfast::api::NodeStatus)>> =
        std::sync::Mutex::new(None);
    let hold_over_fn = |pod: &str| {
        let mut cache = status_cache.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = cache
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < Duration::from_millis(100));
        if !fresh {
            match agent.status() {
                Ok(status) => *cache = Some((Instant::now(), status)),
                Err(_) => return false,
            }
        }
        cache.as_ref().is_some_and(|(_, status)| {
            status
                .pods
                .iter()
                .find(|r| r.namespace == "default" && r.name == pod)
                .is_some_and(|r| r.hold.as_ref().is_none_or(|h| h.outcome.is_some()))
        })
    };
    let hold_over: &(dyn Fn(&str) -> bool + Sync) = &hold_over_fn;
    std::thread::scope(|s| -> Result<()> {
        let mut pollers = Vec::new();
        for name in &names {
            let (node, stop) = (&node, &stop);
            pollers.push(s.spawn(move || {
                observe(
                    node,
                    name,
                    proxy_delay,
                    scale.observe_poll,
                    give_up,
                    stop,
                    hold_over,
                )
            }));
        }
        let mut first_ok = Vec::new();
        for name in &names {
            let left = give_up.saturating_duration_since(Instant::now());
            let _ = node.wait_report(name, left, "a successful boot call", |r| {
                r.calls(Phase::Startup).ok > 0
            });
            let report = node.report(name)?;
            let calls = report.all_calls();
            sample.refused += calls.errors(CallError::ConnectionRefused);
            let ok = report.events.iter().find_map(|e| match e {
                AppEvent::Call {
                    at_ms,
                    at_us,
                    phase: Phase::Startup,
                    ok: true,
                    connected_us,
                    ..
                } => Some((at_us.unwrap_or(at_ms * 1000), *connected_us)),
                _ => None,
            });
            if ok.is_none() {
                sample.failed_pods += 1;
            }
            first_ok.push(ok);
        }
        sample.burst_s = t0.elapsed().as_secs_f64();
        sample.load_burst = load_average();
        // The observers end by themselves (each after its floor call); `stop` ends those
        // that can no longer see anything.
        let stop_after = Instant::now() + Duration::from_secs(10);
        while pollers.iter().any(|h| !h.is_finished()) && Instant::now() < stop_after {
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::SeqCst);
        for (h, ok) in pollers.into_iter().zip(first_ok) {
            let seen = h
                .join()
                .map_err(|_| anyhow::anyhow!("a readiness observer panicked"))?;
            sample.observer_requests += seen.admin_requests;
            if let (Some(p), Some(r)) = (seen.ports_at, seen.ready_at) {
                sample.window_ms.push((r as f64 - p as f64) / 1e3);
            }
            sample.floor_ms.extend(seen.floor_ms);
            let connected = ok.and_then(|(_, c)| c);
            let ok = ok.map(|(done, _)| done);
            sample.floor_connect_ms.extend(seen.floor_connect_ms);
            if let (Some(r), Some(c)) = (seen.ready_at, connected) {
                sample.connect_ms.push((c as f64 - r as f64) / 1e3);
                if let Some(n) = seen.not_ready_at {
                    sample.connect_bound_ms.push((c as f64 - n as f64) / 1e3);
                }
                if let Some(a) = seen.ready_answered_at {
                    sample.connect_lower_ms.push((c as f64 - a as f64) / 1e3);
                    sample.ready_answer_ms.push((a as f64 - r as f64) / 1e3);
                }
            }
            if let (Some(n), Some(_), Some(ok)) = (seen.not_ready_at, seen.ready_at, ok) {
                sample.release_bound_ms.push((ok as f64 - n as f64) / 1e3);
            }
            if let (Some(r), Some(ok)) = (seen.ready_at, ok) {
                let release = (ok as f64 - r as f64) / 1e3;
                sample.release_ms.push(release);
                if let Some(f) = seen.floor_ms {
                    sample.release_over_floor_ms.push(release - f);
                }
            }
        }
        Ok(())
    })?;
    let cpu1 = ProcCpu::read(pid)?;
    sample.burst_cpu_s = cpu1.own_s() - cpu0.own_s();
    sample.burst_children_s = cpu1.children_s() - cpu0.children_s();
    sample.burst_kernel_share = if sample.burst_cpu_s > 0.0 {
        (cpu1.stime - cpu0.stime) as f64 / ProcCpu::hz() / sample.burst_cpu_s
    } else {
        0.0
    };

    // The agent's own record of each hold.
    for name in &names {
        match agent.wait_pod(
            "default",
            name,
            Duration::from_secs(20),
            "hold ended",
            |r| r.hold.as_ref().is_none_or(|h| h.outcome.is_some()),
        ) {
            Ok(row) => {
                if let Some(h) = row.hold {
                    if h.late {
                        sample.late += 1;
                    }
                    if h.outcome != Some(HoldOutcome::Ready) {
                        sample.not_ready_outcome += 1;
                    }
                    if let Some(ms) = h.ready_to_release_ms {
                        sample.agent_release_ms.push(ms);
                    }
                }
            }
            Err(e) => eprintln!("scale: {name}: {e:#}"),
        }
    }

    // Idle: every pod up, nothing happening.
    std::thread::sleep(Duration::from_secs(2));
    let idle0 = ProcCpu::read(pid)?;
    std::thread::sleep(scale.idle);
    let idle1 = ProcCpu::read(pid)?;
    sample.idle_ms_per_s =
        (idle1.total_s() - idle0.total_s()) * 1e3 / scale.idle.as_secs_f64().max(1e-3);
    let mem = ProcMem::read(pid)?;
    sample.rss_idle_mib = mem.rss_kib as f64 / 1024.0;
    sample.threads = mem.threads;
    sample.fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as u64)
        .unwrap_or(0);

    // All deleted at once.
    let mut drain_exits = Vec::new();
    for name in &names {
        node.delete_pod(name)?;
    }
    for name in &names {
        match node.wait_gone(name, Duration::from_secs(60)) {
            Ok(view) => {
                if let (Some(a), Some(p)) = (exited_ms(view.app()), exited_ms(view.proxy())) {
                    sample.drain_lag_ms.push(p - a);
                    drain_exits.push((name.clone(), a, p));
                }
            }
            Err(e) => eprintln!("scale: {name} not gone: {e}"),
        }
    }
    // Where the drain's time went: the agent's own report of each pod's drain (rows stay a
    // while after the pod is gone).
    for (name, app_exit, proxy_exit) in &drain_exits {
        let Ok(Some(row)) = agent.pod("default", name) else {
            continue;
        };
        let Some(d) = row.drain else { continue };
        let ms = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64() * 1e3)
        };
        if let (Some(gone), Some(quit)) = (d.app_gone_at, d.quit_sent_at) {
            sample.drain_seen_ms.push(ms(gone) - app_exit);
            sample.drain_decide_ms.push(ms(quit) - ms(gone));
            sample.drain_exit_ms.push(proxy_exit - ms(quit));
            if let Some(gone) = d.proxy_exit_seen_at {
                sample.drain_admin_gone_ms.push(ms(gone) - ms(quit));
            }
        }
    }
    sample.rss_peak_mib = ProcMem::read(pid)?.hwm_kib as f64 / 1024.0;
    sample.load = load_average();
    drop(agent);
    let left = node.finish();
    ensure!(left.is_empty(), "the node left things behind: {left:#?}");
    Ok(sample)
}

/// When a container last exited (ms since the epoch), by the simulated kubelet.
fn exited_ms(c: Option<&ContainerView>) -> Option<f64> {
    let c = c?;
    let t = match &c.state {
        CState::Terminated(t) => t,
        _ => c.last.as_ref()?,
    };
    Some(t.finished_at.as_nanosecond() as f64 / 1e6)
}

/// CPU times of a process from `/proc/<pid>/stat`, in clock ticks.
#[derive(Debug, Clone, Copy)]
struct ProcCpu {
    utime: u64,
    stime: u64,
    cutime: u64,
    cstime: u64,
}

impl ProcCpu {
    fn read(pid: u32) -> Result<ProcCpu> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .with_context(|| format!("reading /proc/{pid}/stat"))?;
        // Fields after the command (which may hold spaces) start at field 3 (`state`).
        let rest = text
            .rsplit_once(')')
            .map(|(_, r)| r)
            .context("malformed /proc/<pid>/stat")?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let field = |i: usize| -> Result<u64> {
            f.get(i - 3)
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("/proc/{pid}/stat field {i}"))
        };
        Ok(ProcCpu {
            utime: field(14)?,
            stime: field(15)?,
            cutime: field(16)?,
            cstime: field(17)?,
        })
    }

    fn hz() -> f64 {
        // SAFETY-free: sysconf through nix.
        nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .map_or(100.0, |v| v as f64)
    }

    fn own_s(&self) -> f64 {
        (self.utime + self.stime) as f64 / Self::hz()
    }

    fn children_s(&self) -> f64 {
        (self.cutime + self.cstime) as f64 / Self::hz()
    }

    fn total_s(&self) -> f64 {
        self.own_s() + self.children_s()
    }
}

/// Memory and threads of a process from `/proc/<pid>/status`.
struct ProcMem {
    rss_kib: u64,
    hwm_kib: u64,
    threads: u64,
}

impl ProcMem {
    fn read(pid: u32) -> Result<ProcMem> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("reading /proc/{pid}/status"))?;
        let get = |key: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Ok(ProcMem {
            rss_kib: get("VmRSS:"),
            hwm_kib: get("VmHWM:"),
            threads: get("Threads:"),
        })
    }
}

/// Raises `fs.inotify.max_user_instances` for a run of `n` Envoys (each takes 2, all under uid
/// 1337) and puts the old value back when dropped.
struct InotifyLimit {
    old: Option<u64>,
}

const INOTIFY_PATH: &str = "/proc/sys/fs/inotify/max_user_instances";

impl InotifyLimit {
    fn raise_for(n: u32) -> Result<InotifyLimit> {
        let current: u64 = std::fs::read_to_string(INOTIFY_PATH)
            .context("reading fs.inotify.max_user_instances")?
            .trim()
            .parse()
            .context("parsing fs.inotify.max_user_instances")?;
        let need = u64::from(n) * 2 + 64;
        if current >= need {
            return Ok(InotifyLimit { old: None });
        }
        std::fs::write(INOTIFY_PATH, need.to_string())
            .context("raising fs.inotify.max_user_instances")?;
        eprintln!("scale: fs.inotify.max_user_instances {current} → {need} (restored after)");
        Ok(InotifyLimit { old: Some(current) })
    }
}

impl Drop for InotifyLimit {
    fn drop(&mut self) {
        if let Some(old) = self.old {
            if let Err(e) = std::fs::write(INOTIFY_PATH, old.to_string()) {
                eprintln!("scale: cannot restore fs.inotify.max_user_instances to {old}: {e}");
            }
        }
    }
}

fn fmt_p(v: &[f64]) -> String {
    match (percentile(v, 0.5), percentile(v, 0.99)) {
        (Some(a), Some(b)) => format!("{a:.1} / {b:.1}"),
        _ => "—".into(),
    }
}

fn print_table(scale: &ScaleOpts, results: &[(u32, String, Sample)]) {
    println!();
    println!(
        "## holdfast-bench scale: pods started at once (Envoy --concurrency 1), observer poll {} ms, idle measured over {} s",
        scale.observe_poll.as_secs_f64() * 1e3,
        scale.idle.as_secs()
    );
    println!(
        "goals: release p99 ≤ {GOAL_RELEASE_P99_MS} ms (outside observer); burst CPU ≤ {GOAL_BURST_CPU_S} s at 110 pods; \
         idle ≤ {GOAL_IDLE_MS_PER_S_PER_POD} ms/s per pod; RSS ≤ {GOAL_RSS_MIB} MiB; no late hold, no deadline; \
         drain lag p99 ≤ {GOAL_DRAIN_LAG_P99_MS} ms"
    );
    println!();
    let mut header = String::from("| metric |");
    let mut rule = String::from("|---|");
    for (n, label, _) in results {
        header.push_str(&format!(" {n} pods, {label} |"));
        rule.push_str("---:|");
    }
    println!("{header}\n{rule}");
    let row = |name: &str, cell: &dyn Fn(&Sample) -> String| {
        let mut line = format!("| {name} |");
        for (_, _, s) in results {
            line.push_str(&format!(" {} |", cell(s)));
        }
        println!("{line}");
    };
    row("refused calls (pods without a successful call)", &|s| {
        format!("{} ({})", s.refused, s.failed_pods)
    });
    row(
        "**release**, outside: fully ready → held call done, ms p50 / p99",
        &|s| fmt_p(&s.release_ms),
    );
    row(
        "**held connect**, outside: fully ready → the app's connect() returned, ms p50 / p99",
        &|s| fmt_p(&s.connect_ms),
    );
    row(
        "  upper bound: last not-ready observation → connect() returned, ms p50 / p99",
        &|s| fmt_p(&s.connect_bound_ms),
    );
    row(
        "  lower bound: the observer's answer \"fully ready\" arrived → connect() returned, ms p50 / p99",
        &|s| fmt_p(&s.connect_lower_ms),
    );
    row(
        "  the observer's `/stats` request that saw fully ready: sent → answered, ms p50 / p99",
        &|s| fmt_p(&s.ready_answer_ms),
    );
    row(
        "  floor: an un-held connect() just after, ms p50 / p99",
        &|s| fmt_p(&s.floor_connect_ms),
    );
    row(
        "release, upper bound: last not-ready observation → held call done, ms p50 / p99",
        &|s| fmt_p(&s.release_bound_ms),
    );
    row(
        "floor: the same call un-held, just after, ms p50 / p99",
        &|s| fmt_p(&s.floor_ms),
    );
    row(
        "release − floor (what waiting for the agent added), ms p50 / p99",
        &|s| fmt_p(&s.release_over_floor_ms),
    );
    row(
        "observer: ports listen → fully ready, ms p50 / p99 (admin requests)",
        &|s| format!("{} ({})", fmt_p(&s.window_ms), s.observer_requests),
    );
    row("agent's own ready → release, ms p50 / p99", &|s| {
        fmt_p(&s.agent_release_ms)
    });
    row("late holds / holds not ended by readiness", &|s| {
        format!("{} / {}", s.late, s.not_ready_outcome)
    });
    row("agent CPU during the burst, s (kernel share)", &|s| {
        format!(
            "{:.2} ({:.0} %)",
            s.burst_cpu_s,
            s.burst_kernel_share * 100.0
        )
    });
    row("  its children (iptables) during the burst, s", &|s| {
        format!("{:.2}", s.burst_children_s)
    });
    row("burst: pods started → every call done, s", &|s| {
        format!("{:.1}", s.burst_s)
    });
    row("idle agent CPU, ms per s (per pod)", &|s| {
        format!(
            "{:.2} ({:.3})",
            s.idle_ms_per_s,
            s.idle_ms_per_s / f64::from(s.pods.max(1))
        )
    });
    row("RSS idle / peak, MiB", &|s| {
        format!("{:.1} / {:.1}", s.rss_idle_mib, s.rss_peak_mib)
    });
    row("threads / open fds (idle)", &|s| {
        format!("{} / {}", s.threads, s.fds)
    });
    row("**drain**: app exit → proxy exit, ms p50 / p99", &|s| {
        fmt_p(&s.drain_lag_ms)
    });
    row("  app exit → agent saw it gone, ms p50 / p99", &|s| {
        fmt_p(&s.drain_seen_ms)
    });
    row("  agent saw app gone → quit sent, ms p50 / p99", &|s| {
        fmt_p(&s.drain_decide_ms)
    });
    row(
        "  quit sent → proxy exit (Envoy, pilot-agent, kubelet), ms p50 / p99",
        &|s| fmt_p(&s.drain_exit_ms),
    );
    row(
        "  quit sent → Envoy's admin gone (the agent's view), ms p50 / p99",
        &|s| fmt_p(&s.drain_admin_gone_ms),
    );
    row("load average (1 min) after the burst / at the end", &|s| {
        format!("{} / {}", s.load_burst, s.load)
    });
}
