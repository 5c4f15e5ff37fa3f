//! The `lifecycle` benchmark section (docs/benchmarks.md, "Native sidecars vs classic +
//! holdfast"): the same pods, the same app, on the same machine in the same rounds, injected
//! three ways:
//!
//! - **(a) native**: Istio 1.27+'s native sidecar, ordered by the kubelet (the app starts once
//!   the proxy's startup probe passed; Istio's preStop drain; stop after the app), no agent;
//! - **(b) classic, serial start**: `holdApplicationUntilProxyStarts` (the proxy first, the app
//!   once its postStart `pilot-agent wait` saw Envoy ready), no agent;
//! - **(c) classic + holdfast**: the app starts with the proxy, the real agent holds its
//!   connections until Envoy is ready, drains and ends Envoy when the app is gone.
//!
//! Every proxy starts as with a real istiod: Envoy at once (its admin answers), its listeners
//! and clusters `--xds-delay-ms` late from pilot-agent's xDS stand-in. Every proxy is probed as
//! Istio injects it (startupProbe every 1 s, then readiness), so "pod Ready" means the same in
//! all three. The app initialises for each of `--lifecycle-app-init-ms`, makes one call at boot
//! (and crashes if it fails), then calls out every 100 ms over a pooled connection, and for 1 s
//! past SIGTERM.
//!
//! "Envoy serving" is Envoy LIVE with the holdfast filter loaded, polled from inside the pod:
//! the sidecars load the filter (the holdfast install puts it in every sidecar), and until it
//! is loaded Envoy's workers do not serve — neither the app's calls nor the startup probe,
//! which reaches pilot-agent through Envoy's 15021 listener, so the kubelet sees a native
//! sidecar started 0–1 probe period after it serves, not after LIVE.
//!
//! Per pod: pod start (istio-init done) → Envoy LIVE, → the app's process, → its first
//! successful call, → pod Ready; refused calls across an Envoy crash (SIGKILL) until calls
//! succeed again; deletion → pod gone and the calls that failed after SIGTERM. The crash
//! compared is the one the kubelet restarts after its initial back-off (`--restart-backoff-ms`,
//! kubelet's 10 s): a native sidecar's second exit (the kubelet restarts its first at once,
//! shown too), a classic proxy container's first (the simulated node's classic containers
//! wait the initial back-off from their first exit).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};

pub use crate::bench_opts::SimBenchOpts;

use super::{boot_times, load_average, percentile, pod_start_us, side_by_side, Side};
use crate::sim::report::{now_us, AppEvent};
use crate::sim::{AppReport, AppScript, CallError, NodeOptions, Phase, PodSpec, SimNode};

/// The section's own options (`holdfast-bench lifecycle --help`).
#[derive(Debug, Clone)]
pub struct LifecycleOpts {
    /// Pods per variant in each round.
    pub pods: u32,
    /// Rounds per app-init scenario.
    pub rounds: u32,
    /// How late istiod's first push reaches Envoy.
    pub xds_delay: Duration,
    /// The app's initialisation before its boot call: one scenario each.
    pub app_inits: Vec<Duration>,
    /// The kubelet's initial restart back-off.
    pub restart_backoff: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Native,
    Serial,
    Holdfast,
}

impl Side for Variant {
    const HOLDFAST: Variant = Variant::Holdfast;

    fn label(self) -> &'static str {
        match self {
            Variant::Native => "(a) native sidecar",
            Variant::Serial => "(b) classic, holdApplicationUntilProxyStarts",
            Variant::Holdfast => "(c) classic + holdfast",
        }
    }

    fn node_name(self) -> &'static str {
        match self {
            Variant::Native => "lfn",
            Variant::Serial => "lfs",
            Variant::Holdfast => "lfh",
        }
    }
}

impl Variant {
    const ALL: [Variant; 3] = [Variant::Native, Variant::Serial, Variant::Holdfast];

    /// Envoy kills per pod: a native sidecar's first exit is restarted at once, its second
    /// after the back-off; a classic proxy's first waits the back-off already.
    fn kills(self) -> usize {
        match self {
            Variant::Native => 2,
            Variant::Serial | Variant::Holdfast => 1,
        }
    }

    fn spec(self, name: &str, app_init: Duration, opts: &LifecycleOpts) -> PodSpec {
        let spec = PodSpec::new(name)
            .app(AppScript::BootThenCall {
                every: Duration::from_millis(100),
                pool: 1,
                after_sigterm: Duration::from_secs(1),
            })
            .app_init(app_init)
            .xds_delay(opts.xds_delay)
            // Long enough that a held connect() is never cut short by the app.
            .call_timeout(Duration::from_secs(60));
        match self {
            Variant::Native => spec.native(),
            Variant::Serial => spec.serial_start(true).proxy_probes(true),
            Variant::Holdfast => spec.proxy_probes(true),
        }
    }
}

/// One Envoy kill.
#[derive(Debug, Clone, Copy, Default)]
struct Crash {
    refused: u32,
    /// The kill → the first successful call after it, ms.
    outage_ms: f64,
}

/// What one pod showed (wall-clock µs unless said).
#[derive(Debug, Clone, Default)]
struct PodSample {
    pod_start_us: Option<u64>,
    live_us: Option<u64>,
    /// Envoy LIVE and the holdfast filter loaded (`wasmcustom.holdfast.loaded` 1): the
    /// listeners serve (the hold section's docs: calls between the two were refused).
    serving_us: Option<u64>,
    app_start_us: Option<u64>,
    first_ok_us: Option<u64>,
    ready_us: Option<u64>,
    boot_refused: u32,
    crashes: Vec<Crash>,
    gone_ms: Option<f64>,
    failed_after_sigterm: u32,
}

impl PodSample {
    fn since_start(&self, t: Option<u64>) -> Option<f64> {
        Some((t? as f64 - self.pod_start_us? as f64) / 1e3)
    }
}

/// Runs the section and prints a table per app-init scenario.
pub fn run(sim: &SimBenchOpts, opts: &LifecycleOpts) -> Result<()> {
    ensure!(opts.rounds > 0, "--lifecycle-rounds must be at least 1");
    ensure!(
        opts.pods > 0 && opts.pods <= 20,
        "--lifecycle-pods must be between 1 and 20 (got {})",
        opts.pods
    );
    ensure!(
        !opts.app_inits.is_empty(),
        "--lifecycle-app-init-ms needs at least one value"
    );
    ensure!(
        nix::unistd::geteuid().is_root(),
        "the lifecycle section needs root (network namespaces, iptables, cgroups): run it with sudo"
    );
    for app_init in &opts.app_inits {
        let load_before = load_average();
        let started = Instant::now();
        let mut samples = Vec::new();
        for round in 0..opts.rounds {
            let t = Instant::now();
            let r = run_round(sim, opts, *app_init)
                .with_context(|| format!("lifecycle round {}", round + 1))?;
            eprintln!(
                "lifecycle: app init {} ms: round {}/{} took {:.1} s",
                app_init.as_millis(),
                round + 1,
                opts.rounds,
                t.elapsed().as_secs_f64()
            );
            samples.extend(r);
        }
        let note = format!(
            "load average before/after: {load_before} / {}; scenario took {:.0} s",
            load_average(),
            started.elapsed().as_secs_f64()
        );
        print_table(opts, *app_init, &samples, &note);
    }
    Ok(())
}

/// One round: a node per variant, `pods` pods each, started, crashed and deleted together.
fn run_round(
    sim: &SimBenchOpts,
    opts: &LifecycleOpts,
    app_init: Duration,
) -> Result<Vec<(Variant, PodSample)>> {
    let node_opts = NodeOptions {
        sim_app: Some(sim.sim_app.clone()),
        restart_backoff: Some(opts.restart_backoff),
        ..NodeOptions::default()
    };
    let names: Vec<String> = (0..opts.pods).map(|i| format!("p{i}")).collect();
    let (nodes, agent) = side_by_side(&Variant::ALL, &node_opts, |v| {
        names
            .iter()
            .map(|name| v.spec(name, app_init, opts))
            .collect()
    })?;
    let budget = opts.xds_delay + app_init + Duration::from_secs(60);

    // Start: Envoy LIVE and pod Ready watched for every pod, then its first call.
    let mut samples = std::thread::scope(|s| -> Result<Vec<(Variant, PodSample)>> {
        let mut handles = Vec::new();
        for (v, node) in &nodes {
            for name in &names {
                handles.push((*v, s.spawn(move || start_sample(node, name, budget))));
            }
        }
        handles
            .into_iter()
            .map(|(v, h)| {
                let sample = h
                    .join()
                    .map_err(|_| anyhow::anyhow!("a start watcher panicked"))??;
                Ok((v, sample))
            })
            .collect()
    })?;

    // An Envoy crash in every pod at once (the native ones twice).
    let crashes = std::thread::scope(|s| -> Result<Vec<Vec<Crash>>> {
        let mut handles = Vec::new();
        for (v, node) in &nodes {
            for name in &names {
                let kills = v.kills();
                let wait = opts.restart_backoff * 2 + opts.xds_delay + Duration::from_secs(30);
                handles.push(s.spawn(move || crash_pod(node, name, kills, wait)));
            }
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a crash driver panicked"))?
            })
            .collect()
    })?;
    for ((_, sample), c) in samples.iter_mut().zip(crashes) {
        sample.crashes = c;
    }

    // Deletion of every pod at once.
    let t0 = Instant::now();
    for (_, node) in &nodes {
        for name in &names {
            node.delete_pod(name)?;
        }
    }
    let gone = std::thread::scope(|s| -> Result<Vec<f64>> {
        let mut handles = Vec::new();
        for (_, node) in &nodes {
            for name in &names {
                handles.push(s.spawn(move || {
                    node.wait_gone(name, Duration::from_secs(60))
                        .map(|_| t0.elapsed().as_secs_f64() * 1e3)
                }));
            }
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a deletion watcher panicked"))?
                    .map_err(anyhow::Error::from)
            })
            .collect()
    })?;
    let mut i = 0;
    for (_, node) in &nodes {
        for name in &names {
            let (_, sample) = &mut samples[i];
            sample.gone_ms = Some(gone[i]);
            sample.failed_after_sigterm = node.report(name)?.calls(Phase::AfterSigterm).failed;
            i += 1;
        }
    }
    drop(agent);
    for (v, node) in nodes {
        let left = node.finish();
        ensure!(
            left.is_empty(),
            "the {} node left things behind: {left:#?}",
            v.label()
        );
    }
    Ok(samples)
}

/// Watches one pod's start: Envoy's first LIVE (polled every 2 ms from inside the pod's netns
/// from the sandbox on), the pod's Ready condition, the app's first successful call.
fn start_sample(node: &SimNode, name: &str, budget: Duration) -> Result<PodSample> {
    let give_up = Instant::now() + budget;
    let stop = AtomicBool::new(false);
    let ((live_us, serving_us), ready_us) = std::thread::scope(|s| {
        let live = s.spawn(|| envoy_live(node, name, give_up, &stop));
        let ready = node
            .wait_for(name, budget, "pod Ready", |p| p.containers_ready())
            .map(|_| now_us());
        // Ready implies LIVE; a pod that never got Ready stops the poller too.
        if ready.is_err() {
            stop.store(true, Ordering::SeqCst);
        }
        (live.join().unwrap_or_default(), ready)
    });
    let ready_us = ready_us.with_context(|| format!("pod {name} never became Ready"))?;
    let report = node.wait_report(name, budget, "a successful boot call", |r| {
        r.calls(Phase::Startup).ok > 0
    })?;
    let view = node
        .pod(name)
        .with_context(|| format!("pod {name} vanished"))?;
    let (app_start_us, first_ok_us) = boot_times(&report);
    Ok(PodSample {
        pod_start_us: pod_start_us(&view),
        app_start_us,
        first_ok_us,
        live_us,
        serving_us,
        ready_us: Some(ready_us),
        boot_refused: report
            .calls(Phase::Startup)
            .errors(CallError::ConnectionRefused),
        ..PodSample::default()
    })
}

/// When Envoy first said LIVE, and when its holdfast filter first said loaded after that
/// (µs), polled every 2 ms from inside the pod's netns from the sandbox on.
fn envoy_live(
    node: &SimNode,
    pod: &str,
    give_up: Instant,
    stop: &AtomicBool,
) -> (Option<u64>, Option<u64>) {
    let done = || stop.load(Ordering::SeqCst) || Instant::now() >= give_up;
    while node.pod(pod).is_none_or(|v| !v.sandbox_ready) {
        if done() {
            return (None, None);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], crate::sim::istio_init::ADMIN_PORT));
    let get = |path: &str| crate::sim::pilot_agent::admin_request(admin, "GET", path);
    node.in_pod_netns(pod, || {
        let mut live = None;
        loop {
            let at = now_us();
            if live.is_none() && get("/ready").is_ok_and(|b| b.trim() == "LIVE") {
                live = Some(at);
            }
            if live.is_some() {
                let at = now_us();
                let loaded =
                    get("/stats?filter=%5Ewasmcustom%5C.holdfast%5C.loaded%24").is_ok_and(|b| {
                        b.lines()
                            .any(|l| l.trim() == "wasmcustom.holdfast.loaded: 1")
                    });
                if loaded {
                    return (live, Some(at));
                }
            }
            if done() {
                return (live, None);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    })
    .unwrap_or((None, None))
}

/// The end (µs) of the first successful running call that began after `t` (a call in flight
/// at the kill may still end well).
fn first_ok_after(r: &AppReport, t: u64) -> Option<u64> {
    r.events.iter().find_map(|e| match e {
        AppEvent::Call {
            at_ms,
            at_us,
            phase: Phase::Running,
            ok: true,
            latency_ms,
            ..
        } => {
            let end = at_us.unwrap_or(at_ms * 1000);
            (end.saturating_sub(latency_ms * 1000) > t).then_some(end)
        }
        _ => None,
    })
}

/// Kills the pod's Envoy `kills` times, each once the pod is Ready; counts the refused calls
/// from each kill until calls succeed through the restarted proxy.
fn crash_pod(node: &SimNode, name: &str, kills: usize, wait: Duration) -> Result<Vec<Crash>> {
    let mut out = Vec::new();
    for _ in 0..kills {
        let view = node.wait_for(name, wait, "Ready before the kill", |p| {
            p.containers_ready()
        })?;
        let proxy = view.proxy().context("no proxy")?;
        let restarts = proxy.restart_count;
        let before = node.report(name)?.calls(Phase::Running);
        let killed_us = now_us();
        node.kill_envoy(name)?;
        node.wait_for(name, wait, "proxy restarted and ready", |p| {
            p.proxy()
                .is_some_and(|c| c.restart_count > restarts && c.is_ready())
        })?;
        let r = node.wait_report(name, wait, "a call succeeds after the kill", |r| {
            first_ok_after(r, killed_us).is_some()
        })?;
        let after = r.calls(Phase::Running);
        out.push(Crash {
            refused: after.errors(CallError::ConnectionRefused)
                - before.errors(CallError::ConnectionRefused),
            outage_ms: first_ok_after(&r, killed_us)
                .map_or(f64::NAN, |t| (t as f64 - killed_us as f64) / 1e3),
        });
    }
    Ok(out)
}

fn fmt_ms(v: &[f64]) -> String {
    match (percentile(v, 0.5), percentile(v, 0.0), percentile(v, 1.0)) {
        (Some(p50), Some(lo), Some(hi)) => format!("{p50:.0} [{lo:.0}–{hi:.0}]"),
        _ => "–".into(),
    }
}

fn print_table(
    opts: &LifecycleOpts,
    app_init: Duration,
    samples: &[(Variant, PodSample)],
    note: &str,
) {
    let of = |v: Variant| -> Vec<&PodSample> {
        samples
            .iter()
            .filter(|(w, _)| *w == v)
            .map(|(_, s)| s)
            .collect()
    };
    let values = |v: Variant, f: &dyn Fn(&PodSample) -> Option<f64>| -> Vec<f64> {
        of(v).into_iter().filter_map(f).collect()
    };
    let median = |v: Variant, f: &dyn Fn(&PodSample) -> Option<f64>| percentile(&values(v, f), 0.5);
    println!();
    println!(
        "## holdfast-bench lifecycle: app init {} ms, istiod's push {} ms late, back-off {} ms, {} rounds x {} pods per variant",
        app_init.as_millis(),
        opts.xds_delay.as_millis(),
        opts.restart_backoff.as_millis(),
        opts.rounds,
        opts.pods
    );
    println!();
    let mut header = String::from("| per pod, ms: median [min–max] |");
    let mut rule = String::from("|---|");
    for v in Variant::ALL {
        header.push_str(&format!(" {} |", v.label()));
        rule.push_str("---:|");
    }
    header.push_str(" (c) − (a), medians |");
    rule.push_str("---:|");
    println!("{header}\n{rule}");
    type Metric<'a> = &'a dyn Fn(&PodSample) -> Option<f64>;
    let row = |label: &str, f: Metric| {
        let mut line = format!("| {label} |");
        for v in Variant::ALL {
            line.push_str(&format!(" {} |", fmt_ms(&values(v, f))));
        }
        let delta = match (median(Variant::Holdfast, f), median(Variant::Native, f)) {
            (Some(c), Some(a)) => format!("{:+.0}", c - a),
            _ => "–".into(),
        };
        line.push_str(&format!(" {delta} |"));
        println!("{line}");
    };
    row("pod start → Envoy LIVE (config in)", &|s| {
        s.since_start(s.live_us)
    });
    row("pod start → Envoy serving (filter loaded)", &|s| {
        s.since_start(s.serving_us)
    });
    row("Envoy serving → app process start", &|s| {
        Some((s.app_start_us? as f64 - s.serving_us? as f64) / 1e3)
    });
    row("pod start → app process start", &|s| {
        s.since_start(s.app_start_us)
    });
    row("**pod start → first successful call**", &|s| {
        s.since_start(s.first_ok_us)
    });
    row("**pod start → pod Ready**", &|s| {
        s.since_start(s.ready_us)
    });
    row("boot calls refused", &|s| Some(f64::from(s.boot_refused)));
    row(
        "**refused calls across an Envoy crash** (restarted after the back-off)",
        &|s| s.crashes.last().map(|c| f64::from(c.refused)),
    );
    row("  kill → calls succeed again", &|s| {
        s.crashes.last().map(|c| c.outage_ms)
    });
    row(
        "  native only: its first crash (restarted at once), refused",
        &|s| (s.crashes.len() > 1).then(|| f64::from(s.crashes[0].refused)),
    );
    row("**deletion → pod gone**", &|s| s.gone_ms);
    row("failed calls after SIGTERM", &|s| {
        Some(f64::from(s.failed_after_sigterm))
    });
    // The expectation and the model behind it: native = P + L + A, classic + holdfast
    // = max(P, A), so (a) − (c) = min(P, A) + L, with P the proxy's start until it serves.
    let p = median(Variant::Holdfast, &|s| s.since_start(s.serving_us));
    let l = median(Variant::Native, &|s| {
        Some((s.app_start_us? as f64 - s.serving_us? as f64) / 1e3)
    });
    let first = |v| median(v, &|s: &PodSample| s.since_start(s.first_ok_us));
    if let (Some(p), Some(l), Some(a), Some(c)) =
        (p, l, first(Variant::Native), first(Variant::Holdfast))
    {
        let init = app_init.as_secs_f64() * 1e3;
        println!();
        println!(
            "first call, (a) − (c): **{:.0} ms** (ratio (a)/(c) {:.2}); the issue expected ≈ P + half a probe period = {:.0} ms \
             (P = proxy start, pod start → Envoy serving in (c): {p:.0} ms); \
             the model (a) = P + L + A, (c) = max(P, A) gives min(P, A) + L = {:.0} ms \
             (L = Envoy serving → app start in (a), {l:.0} ms; A = app init {init:.0} ms)",
            a - c,
            a / c.max(1.0),
            p + 500.0,
            p.min(init) + l,
        );
    }
    println!("{note}");
}
