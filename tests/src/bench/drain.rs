//! The `drain` benchmark section (see docs/benchmarks.md, "Drain").
//!
//! Pods are deleted while their app calls out over a keep-alive pool, under three ways of ending
//! the sidecar, side by side in the same rounds (one simulated node per variant, all deleted
//! together):
//!
//! - **holdfast**: the real agent; pilot-agent's `terminationDrainDuration` = the grace period
//!   (30 s), as the shipped mesh config sets it, and the agent quits Envoy once the app is done;
//! - **fixed 5 s drain**: Istio's default `terminationDrainDuration`, no agent;
//! - **EXIT_ON_ZERO_ACTIVE_CONNECTIONS**: no agent; pilot-agent waits `MINIMUM_DRAIN_DURATION`
//!   (5 s), then polls Envoy's `downstream_cx_active` every second until it reads 0.
//!
//! Two apps: one that keeps calling for `S` after SIGTERM (flushing, deregistering; default 2 s,
//! `--after-sigterm-ms`), and one that exits at once. Each round runs
//! `PODS_PER_APP` pods of each app per variant; `--runs` is the number of pods per app and
//! variant in total.
//!
//! Measured per pod: the app's failed calls after SIGTERM (its own report), and the lag from the
//! app's exit to the proxy's exit, both as the simulated kubelet reaped them (the app and
//! `istio-proxy` containers' `finishedAt`, ns resolution; pilot-agent exits within 2 ms of
//! Envoy). For holdfast, the agent's own `app_gone_to_proxy_exit_ms` is shown next to it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{ensure, Context as _, Result};
use holdfast::lifecycle::drain::{DrainOutcome, DrainReport};

use crate::agent::AgentProcess;
pub use crate::bench_opts::SimBenchOpts;

use super::{load_average, percentile, side_by_side, yes_no, Side};
use crate::sim::pod_object::{CState, ContainerView};
use crate::sim::{AppScript, NodeOptions, Phase, PodSpec, PodView, SimNode};

/// Goal: app exit → proxy exit at p99.
const GOAL_LAG_P99_MS: f64 = 50.0;
/// The grace period of every pod (and the holdfast variant's drain duration).
const GRACE: Duration = Duration::from_secs(30);
/// Pods of each app per variant in one round.
const PODS_PER_APP: u32 = 2;
/// Default time the calling app keeps calling after SIGTERM.
/// The app's per-call timeout (connect + answer).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How the sidecar is ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Holdfast,
    Fixed,
    ExitOnZero,
}

impl Side for Variant {
    const HOLDFAST: Variant = Variant::Holdfast;

    fn label(self) -> &'static str {
        match self {
            Variant::Holdfast => "holdfast",
            Variant::Fixed => "fixed 5 s drain",
            Variant::ExitOnZero => "EXIT_ON_ZERO_ACTIVE",
        }
    }

    fn node_name(self) -> &'static str {
        match self {
            Variant::Holdfast => "bdhf",
            Variant::Fixed => "bdfix",
            Variant::ExitOnZero => "bdzero",
        }
    }
}

impl Variant {
    const ALL: [Variant; 3] = [Variant::Holdfast, Variant::Fixed, Variant::ExitOnZero];

    fn spec(self, name: &str, app: App, after: Duration) -> PodSpec {
        let after = match app {
            App::Calling => after,
            App::Quick => Duration::ZERO,
        };
        let spec = PodSpec::new(name)
            .app(AppScript::CallThroughShutdown {
                every: Duration::from_millis(100),
                pool: 2,
                after_sigterm: after,
            })
            .grace(GRACE)
            // Long enough that a boot call held by the startup hold on a busy machine (Envoy
            // seconds late) does not time out: this section is about the shutdown.
            .call_timeout(CALL_TIMEOUT);
        match self {
            Variant::Holdfast => spec.drain(GRACE),
            Variant::Fixed => spec.drain(Duration::from_secs(5)),
            Variant::ExitOnZero => spec.exit_on_zero_active(true),
        }
    }
}

/// What the app does on SIGTERM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum App {
    /// Keeps calling for `S`.
    Calling,
    /// Exits at once.
    Quick,
}

impl App {
    const ALL: [App; 2] = [App::Calling, App::Quick];

    fn prefix(self) -> &'static str {
        match self {
            App::Calling => "c",
            App::Quick => "q",
        }
    }
}

/// One pod's figures.
#[derive(Debug, Clone, Default)]
struct PodSample {
    calls_after_ok: u32,
    calls_after_failed: u32,
    /// App container exit → proxy container exit (ms).
    lag_ms: Option<f64>,
    /// Deletion → last container exit (ms).
    shutdown_ms: Option<f64>,
    /// The agent's report (holdfast only).
    agent_lag_ms: Option<f64>,
    agent_outcome: Option<DrainOutcome>,
}

/// Runs the section and prints its table.
pub fn run(opts: &SimBenchOpts) -> Result<()> {
    ensure!(opts.runs > 0, "--runs must be at least 1");
    ensure!(
        nix::unistd::geteuid().is_root(),
        "the drain section needs root (network namespaces, iptables, cgroups): run it with sudo"
    );
    let after = opts.after_sigterm;
    let rounds = opts.runs.div_ceil(PODS_PER_APP);
    eprintln!(
        "drain: {rounds} rounds x {PODS_PER_APP} pods per app per variant; calling app keeps \
         calling {after:?} after SIGTERM; agent {}",
        opts.holdfast.display()
    );
    let load_before = load_average();
    let started = Instant::now();
    let mut samples: Vec<(Variant, App, PodSample)> = Vec::new();
    for round in 0..rounds {
        let t = Instant::now();
        let r = run_round(opts, after).with_context(|| format!("drain round {}", round + 1))?;
        eprintln!(
            "drain: round {}/{rounds} took {:.1} s",
            round + 1,
            t.elapsed().as_secs_f64()
        );
        samples.extend(r);
    }
    let note = format!(
        "load average before/after: {load_before} / {}; section took {:.0} s",
        load_average(),
        started.elapsed().as_secs_f64()
    );
    print_table(after, rounds, &samples, &note);
    Ok(())
}

fn pod_names() -> Vec<(App, String)> {
    App::ALL
        .iter()
        .flat_map(|app| (0..PODS_PER_APP).map(move |i| (*app, format!("{}{i}", app.prefix()))))
        .collect()
}

/// One round: a node per variant, every pod started, then all deleted together.
fn run_round(opts: &SimBenchOpts, after: Duration) -> Result<Vec<(Variant, App, PodSample)>> {
    let node_opts = NodeOptions {
        sim_app: Some(opts.sim_app.clone()),
        ..NodeOptions::default()
    };
    let names = pod_names();
    let (nodes, agent) = side_by_side(&Variant::ALL, &node_opts, |v| {
        names
            .iter()
            .map(|(app, name)| v.spec(name, *app, after))
            .collect()
    })?;
    // Every app calling through its Envoy before the deletion.
    for (v, node) in &nodes {
        for (_, name) in &names {
            node.wait_report(name, Duration::from_secs(60), "3 successful calls", |r| {
                r.calls(Phase::Running).ok >= 3
            })
            .with_context(|| format!("{}: pod {name} never called out", v.label()))?;
        }
    }

    let reports = Reports::default();
    let samples = std::thread::scope(|s| -> Result<Vec<(Variant, App, PodSample)>> {
        s.spawn(|| reports.record(&agent));
        let result = (|| {
            let deleted_at = SystemTime::now();
            for (_, node) in &nodes {
                for (_, name) in &names {
                    node.delete_pod(name)?;
                }
            }
            let mut out = Vec::new();
            for (v, node) in &nodes {
                for (app, name) in &names {
                    let view = node
                        .wait_gone(name, GRACE + Duration::from_secs(10))
                        .with_context(|| format!("{}: pod {name} did not end", v.label()))?;
                    let mut sample = sample(node, name, &view, deleted_at)?;
                    if *v == Variant::Holdfast {
                        if let Some(d) = reports.get(name) {
                            sample.agent_lag_ms =
                                d.app_gone_to_proxy_exit.map(|d| d.as_secs_f64() * 1e3);
                            sample.agent_outcome = Some(d.outcome);
                        }
                    }
                    out.push((*v, *app, sample));
                }
            }
            Ok(out)
        })();
        reports.stop.store(true, Ordering::SeqCst);
        result
    })?;
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

/// The agent's drain reports by pod name, from `/status` polled every 5 ms while the pods end
/// (independent of how long the agent keeps a gone pod's row).
#[derive(Default)]
struct Reports {
    by_pod: Mutex<HashMap<String, DrainReport>>,
    stop: AtomicBool,
}

impl Reports {
    fn record(&self, agent: &AgentProcess) {
        while !self.stop.load(Ordering::SeqCst) {
            if let Ok(status) = agent.status() {
                let mut map = self.by_pod.lock().unwrap_or_else(|p| p.into_inner());
                for row in status.pods {
                    if let Some(d) = row.drain {
                        map.insert(row.name, d);
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn get(&self, pod: &str) -> Option<DrainReport> {
        self.by_pod
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(pod)
            .cloned()
    }
}

/// When a container last exited (ms since the epoch), by the kubelet's view.
fn exited_ms(c: Option<&ContainerView>) -> Option<f64> {
    let c = c?;
    let t = match &c.state {
        CState::Terminated(t) => t,
        _ => c.last.as_ref()?,
    };
    Some(t.finished_at.as_nanosecond() as f64 / 1e6)
}

fn sample(node: &SimNode, name: &str, view: &PodView, deleted_at: SystemTime) -> Result<PodSample> {
    let report = node.report(name)?;
    let after = report.calls(Phase::AfterSigterm);
    if after.failed > 0 {
        // Say how and when calls failed, so a failure can be told from load noise.
        eprintln!(
            "drain: {} pod {name}: {} call(s) failed after SIGTERM {:?}, the first {:?} after it",
            node.node_name(),
            after.failed,
            after.by_error,
            report.first_failure_after_sigterm()
        );
    }
    let app = exited_ms(view.app());
    let proxy = exited_ms(view.proxy());
    let deleted_ms = deleted_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(0.0);
    Ok(PodSample {
        calls_after_ok: after.ok,
        calls_after_failed: after.failed,
        lag_ms: app.zip(proxy).map(|(a, p)| p - a),
        shutdown_ms: app.zip(proxy).map(|(a, p)| a.max(p) - deleted_ms),
        ..PodSample::default()
    })
}

fn fmt_p(v: &[f64], scale: f64, digits: usize) -> String {
    match (percentile(v, 0.5), percentile(v, 0.99)) {
        (Some(a), Some(b)) => format!("{:.digits$} / {:.digits$}", a * scale, b * scale),
        _ => "—".into(),
    }
}

fn print_table(after: Duration, rounds: u32, samples: &[(Variant, App, PodSample)], note: &str) {
    println!();
    println!(
        "## holdfast-bench drain: grace {} s; calling app keeps calling {} ms after SIGTERM \
         (every 100 ms, pool of 2); {rounds} rounds x {PODS_PER_APP} pods per app per variant",
        GRACE.as_secs(),
        after.as_millis()
    );
    println!(
        "goals: 0 failed calls during shutdown; app exit → proxy exit p99 ≤ {GOAL_LAG_P99_MS} ms"
    );
    let mut header = String::from("| metric (p50 / p99 over pods) |");
    let mut rule = String::from("|---|");
    let cols: Vec<(App, Variant)> = App::ALL
        .iter()
        .flat_map(|a| Variant::ALL.iter().map(move |v| (*a, *v)))
        .collect();
    for (a, v) in &cols {
        let app = match a {
            App::Calling => format!("calls {} ms", after.as_millis()),
            App::Quick => "exits at once".into(),
        };
        header.push_str(&format!(" {app}: {} |", v.label()));
        rule.push_str("---:|");
    }
    println!();
    println!("{header}\n{rule}");
    let of = |a: App, v: Variant| -> Vec<&PodSample> {
        samples
            .iter()
            .filter(|(w, b, _)| *w == v && *b == a)
            .map(|(_, _, s)| s)
            .collect()
    };
    let row = |label: &str, cell: &dyn Fn(&[&PodSample]) -> String| {
        let mut line = format!("| {label} |");
        for (a, v) in &cols {
            line.push_str(&format!(" {} |", cell(&of(*a, *v))));
        }
        println!("{line}");
    };
    let collect = |ps: &[&PodSample], f: &dyn Fn(&PodSample) -> Option<f64>| -> Vec<f64> {
        ps.iter().filter_map(|s| f(s)).collect()
    };
    row("pods", &|ps| ps.len().to_string());
    row(
        "calls after SIGTERM: ok / **failed** (pods with failures)",
        &|ps| {
            let ok: u32 = ps.iter().map(|s| s.calls_after_ok).sum();
            let failed: u32 = ps.iter().map(|s| s.calls_after_failed).sum();
            let pods = ps.iter().filter(|s| s.calls_after_failed > 0).count();
            format!("{ok} / {failed} ({pods})")
        },
    );
    row(
        "**app exit → proxy exit**, ms (negative: proxy first)",
        &|ps| fmt_p(&collect(ps, &|s| s.lag_ms), 1.0, 1),
    );
    row("agent: app gone → proxy exit seen, ms", &|ps| {
        fmt_p(&collect(ps, &|s| s.agent_lag_ms), 1.0, 1)
    });
    row("deletion → pod's containers all exited, s", &|ps| {
        fmt_p(&collect(ps, &|s| s.shutdown_ms), 1e-3, 2)
    });
    row("goal: 0 failed", &|ps| {
        yes_no(ps.iter().all(|s| s.calls_after_failed == 0))
    });
    row("goal: 0 ≤ lag, p99 ≤ 50 ms", &|ps| {
        // A negative lag is the shutdown failure itself (the proxy went before the app).
        let v = collect(ps, &|s| s.lag_ms);
        yes_no(
            v.len() == ps.len()
                && v.iter().all(|l| *l >= 0.0)
                && percentile(&v, 0.99).is_some_and(|p| p <= GOAL_LAG_P99_MS),
        )
    });
    println!();
    let outcomes: Vec<String> = samples
        .iter()
        .filter(|(v, _, _)| *v == Variant::Holdfast)
        .map(|(_, _, s)| {
            s.agent_outcome
                .map_or("no report", |o| o.as_str())
                .to_string()
        })
        .collect();
    let mut tally: Vec<(String, usize)> = Vec::new();
    for o in &outcomes {
        match tally.iter_mut().find(|(k, _)| k == o) {
            Some((_, n)) => *n += 1,
            None => tally.push((o.clone(), 1)),
        }
    }
    let tally: Vec<String> = tally.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!(
        "(app exit / proxy exit = the app and istio-proxy containers' exits as the simulated \
         kubelet reaped them; pilot-agent exits within 2 ms of Envoy. Every pod's grace period \
         is {} s. holdfast drain outcomes (agent's /status): {}. {note})",
        GRACE.as_secs(),
        tally.join(", ")
    );
}
