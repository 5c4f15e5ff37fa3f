//! The chaos soak (issue 11): pods through their whole lives on the simulated node — Envoy
//! late, apps calling at boot, calls through shutdown, Jobs, a few pods at a time — while the
//! agent is SIGKILLed and SIGTERMed at random points and restarted 10 ms … 3 s later, Envoys are
//! killed or frozen, and the status API is flooded. The same seed runs again without holdfast
//! (no agent, Istio's default 5 s drain) as the baseline; both are counted the same way.
//!
//! # Layout
//!
//! - [`rng`]: SplitMix64, the only randomness; the seed fixes the whole plan.
//! - [`plan`]: the lifecycles and chaos drawn from the seed (pure).
//! - [`driver`]: runs the lifecycles on a [`SimNode`], fires the chaos tied to their moments.
//! - [`chaos`]: the agent's supervisor (end, gap, restart), Envoy signals, the status API flood.
//! - [`tally`]: the counts, and what "outside the fail-open window" means.
//! - [`versus`]: holdfast against the baseline, lifecycle by lifecycle (never worse).
//! - [`output`]: the side-by-side table.
//!
//! `holdfast-soak` (`just soak`) is the long form; `tests/tests/soak.rs` the short one.

pub mod chaos;
pub mod driver;
pub mod output;
pub mod plan;
pub mod rng;
pub mod tally;
pub mod versus;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use self::chaos::{AgentSupervisor, Flood, Outage};
use self::driver::Driver;
use self::plan::{ChaosRates, Lifecycle, GRACE, ISTIO_DEFAULT_DRAIN};
use self::tally::Tally;
use crate::agent::AgentProcess;
use crate::sim::{NodeOptions, SimNode};

/// The kubelet's restart back-off for the soak's pods (a restarted proxy, a crashed boot
/// caller), shortened from 10 s so a lifecycle stays short.
const RESTART_BACKOFF: Duration = Duration::from_secs(1);
/// After the last lifecycle, with no pod and no flood: long enough for the status API's idle
/// connections (5 s) and tokio's idle blocking threads (10 s) to end.
const QUIET: Duration = Duration::from_secs(11);

/// With or without holdfast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The agent under chaos; pods drain as the shipped mesh config sets them (drain = grace).
    Holdfast,
    /// No agent; pods drain for Istio's default 5 s.
    Baseline,
}

impl Variant {
    pub fn label(self) -> &'static str {
        match self {
            Variant::Holdfast => "holdfast",
            Variant::Baseline => "no agent (baseline)",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakOpts {
    pub seed: u64,
    pub lifecycles: usize,
    /// Run only the lifecycles from this index on (the plan is drawn for all of them, so a
    /// failure at lifecycle N of a seed can be repeated alone).
    pub from: usize,
    /// Pods alive at once.
    pub concurrency: usize,
    pub rates: ChaosRates,
    /// The `sim-app` binary (`None`: found next to the running binary).
    pub sim_app: Option<PathBuf>,
    /// The `holdfast` binary (`None`: found next to the running binary).
    pub holdfast: Option<PathBuf>,
    /// Names the simulated node (`hf-<name>-*` namespaces).
    pub name: String,
}

/// The agent's open fds, threads and resident memory.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcSample {
    pub pid: u32,
    pub fds: usize,
    pub threads: u64,
    pub rss_kib: u64,
}

impl ProcSample {
    pub fn of(pid: u32) -> Option<ProcSample> {
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        };
        Some(ProcSample {
            pid,
            fds,
            threads: field("Threads:")?,
            rss_kib: field("VmRSS:")?,
        })
    }
}

/// One variant's results.
#[derive(Debug)]
pub struct VariantRun {
    pub variant: Variant,
    pub tally: Tally,
    pub outages: Vec<Outage>,
    pub restarts_skipped: u32,
    /// Flood: connections, closed by the agent, requests answered, requests failed.
    pub flood: [u64; 4],
    pub agent_start: Option<ProcSample>,
    pub agent_end: Option<ProcSample>,
    /// Lifecycles deleted after the final agent started (it lived through them).
    pub final_agent_lifecycles: usize,
    pub panics: Vec<String>,
    /// The final agent's `/metrics` at the end (quiet, no pods): `name{labels}` → value, the
    /// counters and gauges the table shows.
    pub final_metrics: Vec<(String, f64)>,
    pub leftovers: Vec<String>,
    /// holdfast's run: its lifecycles against the baseline's (when both ran).
    pub versus: Option<versus::Versus>,
    pub took: Duration,
    pub load_before: String,
    pub load_after: String,
}

/// Runs one variant of the plan on a fresh node.
pub fn run_variant(opts: &SoakOpts, variant: Variant, plan: &[Lifecycle]) -> Result<VariantRun> {
    let started = Instant::now();
    let load_before = crate::bench::load_average();
    let node_opts = NodeOptions {
        sim_app: opts.sim_app.clone(),
        restart_backoff: Some(RESTART_BACKOFF),
        ..NodeOptions::default()
    };
    let node_name = match variant {
        Variant::Holdfast => opts.name.clone(),
        Variant::Baseline => format!("{}b", opts.name),
    };
    let mut node = SimNode::with_options(&node_name, node_opts).context("the simulated node")?;
    let mut run = VariantRun {
        variant,
        tally: Tally::default(),
        outages: Vec::new(),
        restarts_skipped: 0,
        flood: [0; 4],
        agent_start: None,
        agent_end: None,
        final_agent_lifecycles: 0,
        panics: Vec::new(),
        final_metrics: Vec::new(),
        leftovers: Vec::new(),
        versus: None,
        took: Duration::ZERO,
        load_before,
        load_after: String::new(),
    };
    let facts = match variant {
        Variant::Baseline => Driver::new(&mut node, None, ISTIO_DEFAULT_DRAIN, opts.concurrency)
            .run(plan, variant.label()),
        Variant::Holdfast => {
            let log = node.work_dir().join("agent.log");
            let agent = AgentProcess::start_binary(
                opts.holdfast.as_deref(),
                node.node_name(),
                node.pods_dir(),
                &log,
                &[],
            )?;
            std::thread::sleep(Duration::from_secs(1));
            run.agent_start = agent.pid().and_then(ProcSample::of);
            let supervisor = AgentSupervisor::new(agent)?;
            let flood = Flood::start(supervisor.status_addr);
            let mut driver = Driver::new(&mut node, Some(&supervisor), GRACE, opts.concurrency);
            let facts = driver.run(plan, variant.label());
            run.restarts_skipped = driver.restarts_skipped;
            run.flood = flood.totals();
            drop(flood);
            let (agent, outages) = supervisor.finish();
            std::thread::sleep(QUIET);
            run.agent_end = agent.pid().and_then(ProcSample::of);
            run.final_metrics = agent
                .get("/metrics")
                .map(|t| metrics(&t))
                .unwrap_or_default();
            drop(agent);
            let last_up = outages.iter().filter_map(|o| o.up_us).max().unwrap_or(0);
            run.final_agent_lifecycles = facts
                .iter()
                .filter(|f| f.deleted_us.is_some_and(|d| d > last_up))
                .count();
            run.outages = outages;
            run.panics = panics_in(&log);
            facts
        }
    };
    run.tally = tally::tally(&facts, &run.outages);
    if variant == Variant::Holdfast && !missed_goals(&run).is_empty() {
        // The node's work dir goes at teardown: keep the agent's log (every incarnation's) for
        // the failure's details.
        let kept = std::env::temp_dir().join(format!("holdfast-soak-{}-agent.log", opts.seed));
        match std::fs::copy(node.work_dir().join("agent.log"), &kept) {
            Ok(_) => eprintln!(
                "soak (seed {}): agent log kept at {}",
                opts.seed,
                kept.display()
            ),
            Err(e) => eprintln!("soak (seed {}): cannot keep the agent log: {e}", opts.seed),
        }
    }
    run.leftovers = crate::cri::host_netns_holdfast_rules();
    run.leftovers.extend(node.finish());
    run.load_after = crate::bench::load_average();
    run.took = started.elapsed();
    Ok(run)
}

/// The samples of the families the soak reports, from Prometheus text.
fn metrics(text: &str) -> Vec<(String, f64)> {
    const FAMILIES: [&str; 6] = [
        "holdfast_drains_total",
        "holdfast_jobs_total",
        "holdfast_holds_released_total",
        "holdfast_pods{",
        "holdfast_status_api_rejected_connections_total",
        "holdfast_drain_errors_total",
    ];
    text.lines()
        .filter(|l| FAMILIES.iter().any(|f| l.starts_with(f)))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// Pods the final agent still counts in a live phase (holding, draining, ...) after every pod
/// is gone: a gauge that does not come back down.
pub fn pods_left_in_live_phases(r: &VariantRun) -> f64 {
    r.final_metrics
        .iter()
        .filter(|(n, _)| n.starts_with("holdfast_pods{"))
        .filter(|(n, _)| !n.contains("\"done\"") && !n.contains("\"skipped\""))
        .map(|(_, v)| v)
        .sum()
}

/// Lines of the agent's log (every incarnation's stderr) that report a panic.
fn panics_in(log: &Path) -> Vec<String> {
    let Ok(file) = std::fs::File::open(log) else {
        return vec![format!("cannot read the agent log {}", log.display())];
    };
    std::io::BufReader::new(file)
        .lines()
        .map_while(|l| l.ok())
        .filter(|l| l.contains("panicked"))
        .collect()
}

/// Runs the plan for `opts.seed` with holdfast, then without, and prints them side by side.
pub fn run(opts: &SoakOpts, variants: &[Variant]) -> Result<Vec<VariantRun>> {
    anyhow::ensure!(
        nix::unistd::geteuid().is_root(),
        "the soak needs root (network namespaces, iptables, cgroups)"
    );
    eprintln!(
        "soak: seed {} ({} lifecycles, {} at a time); repeat with --seed {}",
        opts.seed, opts.lifecycles, opts.concurrency, opts.seed
    );
    let mut plan = plan::plan(opts.seed, opts.lifecycles, opts.rates);
    plan.drain(..opts.from.min(plan.len()));
    let mut runs = Vec::new();
    for &v in variants {
        let r = run_variant(opts, v, &plan)
            .with_context(|| format!("soak seed {}: {}", opts.seed, v.label()))?;
        runs.push(r);
    }
    let baseline = runs
        .iter()
        .find(|r| r.variant == Variant::Baseline)
        .map(|r| r.tally.lives.clone());
    if let Some(without) = baseline {
        for r in runs.iter_mut().filter(|r| r.variant == Variant::Holdfast) {
            r.versus = Some(versus::compare(&r.tally.lives, &without));
        }
    }
    println!("{}", output::table(opts, &runs));
    Ok(runs)
}

/// Extra fds the final agent may hold, in the quiet end, over the first agent's at its start
/// (also idle, no pods): a leak of one fd per pod or per restart would exceed it in any soak.
pub const FD_MARGIN: usize = 8;

/// The goals holdfast's run missed (empty when every goal count is 0 and fds stayed bounded).
pub fn missed_goals(r: &VariantRun) -> Vec<String> {
    let t = &r.tally;
    let mut missed = Vec::new();
    let mut goal = |what: &str, n: usize| {
        if n > 0 {
            missed.push(format!("{what}: {n}"));
        }
    };
    goal(
        "refused calls outside the fail-open window",
        t.refused_outside.len(),
    );
    goal("drains not adopted", t.drains_not_adopted.len());
    goal(
        "slow drains the agent could have ended sooner (unexplained)",
        t.slow_drains
            .iter()
            .filter(|(c, _)| *c == tally::SlowDrain::Unexplained)
            .count(),
    );
    goal("stale holds in running pods", t.stale_holds.len());
    goal("leftovers after the run", r.leftovers.len());
    goal("agent panics", r.panics.len());
    goal("stuck stages", t.stuck.len());
    goal(
        "pods the final agent still counts as live",
        pods_left_in_live_phases(r) as usize,
    );
    goal(
        "final agent's /metrics unreadable",
        usize::from(r.final_metrics.is_empty()),
    );
    goal("Jobs that never completed", t.jobs_never_completed as usize);
    goal("downloads cut", t.downloads_cut.len());
    if let Some(v) = &r.versus {
        goal(
            "lifecycles worse than without holdfast",
            v.lifecycles_worse(),
        );
    }
    goal(
        "successors that never answered",
        r.outages.iter().filter(|o| o.up_us.is_none()).count(),
    );
    if let (Some(a), Some(b)) = (r.agent_start, r.agent_end) {
        goal(
            "fds over start + margin",
            b.fds.saturating_sub(a.fds + FD_MARGIN),
        );
    } else {
        missed.push("the agent's fds could not be read".into());
    }
    missed
}
