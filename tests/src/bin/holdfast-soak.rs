//! `holdfast-soak` (`just soak`): the chaos soak's long form — by default 1000 lifecycles with
//! holdfast under chaos, then the same seed without holdfast — printed side by side (see
//! `holdfast_tests::soak` and docs/benchmarks.md, "Chaos soak"). Exits 1 when holdfast's run
//! misses a goal (a count that must be 0).
//!
//! `--hostile` runs the hostile-pod suite's long form instead (issue 25,
//! `holdfast_tests::hostile`): each attack beside an honest pod, with the agent's CPU, RSS and
//! fds over a `--window` (default 10 s), and the run without an attacker; `--baseline-agent
//! PATH` runs the same against another agent build (one from before the health and metrics
//! listeners), side by side. `--scenario NAME` runs one.

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use holdfast_tests::soak::{self, plan::ChaosRates, SoakOpts, Variant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Which {
    Both,
    Holdfast,
    Baseline,
}

#[derive(Debug, Parser)]
#[command(about = "chaos soak of the holdfast agent on the simulated node (root)")]
struct Args {
    /// Pod lifecycles per variant.
    #[arg(long, default_value_t = 1000)]
    lifecycles: usize,
    /// The seed (printed at start; the same seed repeats the same plan). Default: from the clock.
    #[arg(long)]
    seed: Option<u64>,
    /// Start at this lifecycle of the plan (repeat a failure at lifecycle N alone).
    #[arg(long, default_value_t = 0)]
    from: usize,
    /// Pods alive at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Which variants to run.
    #[arg(long, value_enum, default_value_t = Which::Both)]
    variants: Which,
    /// Share of lifecycles that restart the agent.
    #[arg(long, default_value_t = ChaosRates::default().agent)]
    agent_rate: f64,
    /// Share of Deployment-like lifecycles whose Envoy is killed or frozen.
    #[arg(long, default_value_t = ChaosRates::default().envoy)]
    envoy_rate: f64,
    /// Run the hostile-pod suite instead of the chaos soak.
    #[arg(long)]
    hostile: bool,
    /// Hostile suite: only this scenario (none, fake-envoy, rule-flood, netlink-forger,
    /// slot-holders, pid-wrapper, terminal-pods, pod-text, many-procs, many-procs-fake-envoy,
    /// exec-loop, annotation-toggle;
    /// a prefix runs every scenario it starts: many-procs runs both).
    #[arg(long)]
    scenario: Option<String>,
    /// Hostile suite: run the agent without the DaemonSet's cgroup limits (by default it runs
    /// under cpu 200m and memory 128Mi, as a node runs it).
    #[arg(long)]
    unconfined: bool,
    /// Hostile suite: the measuring window in seconds.
    #[arg(long, default_value_t = 10)]
    window: u64,
    /// Hostile suite: the agent build to measure as "this build" (default: the optimised
    /// `quota` build, `target/quota/holdfast`, else the one built with this binary's tests).
    #[arg(long)]
    agent: Option<std::path::PathBuf>,
    /// Hostile suite: also run every scenario against this agent build (with one listener for
    /// everything, as before issue 25).
    #[arg(long)]
    baseline_agent: Option<std::path::PathBuf>,
}

fn hostile(args: &Args) -> ExitCode {
    use holdfast_tests::hostile::{run, Opts, Scenario};
    let all = [
        Scenario::None,
        Scenario::FakeEnvoy,
        Scenario::RuleFlood,
        Scenario::NetlinkForger,
        Scenario::SlotHolders,
        Scenario::PidWrapper,
        Scenario::TerminalPods(300),
        Scenario::PodText,
        Scenario::ManyProcs,
        Scenario::ManyProcsFakeEnvoy,
        Scenario::ExecLoop,
        Scenario::AnnotationToggle,
    ];
    let chosen: Vec<Scenario> = all
        .into_iter()
        .filter(|s| {
            args.scenario
                .as_deref()
                .is_none_or(|n| s.name().starts_with(n))
        })
        .collect();
    // Under the DaemonSet's quota the debug build is not the program a node runs (it spends
    // 3-10x the CPU on the same work: docs/benchmarks.md "The short form under the quota"):
    // by default this measures the optimised `quota` build, as the short form does.
    let agent =
        args.agent
            .clone()
            .or_else(|| match holdfast_tests::agent::holdfast_quota_binary() {
                Ok(p) => Some(p),
                Err(e) => {
                    eprintln!("holdfast-soak --hostile: measuring the debug agent: {e:#}");
                    None
                }
            });
    if let Some(a) = &agent {
        eprintln!("holdfast-soak --hostile: this build is {}", a.display());
    }
    let mut builds = vec![("this build", agent, false)];
    if let Some(b) = &args.baseline_agent {
        builds.push(("baseline", Some(b.clone()), true));
    }
    let mut ok = true;
    for s in chosen {
        for (label, bin, legacy) in &builds {
            let opts = Opts {
                sim_app: None,
                holdfast: bin.clone(),
                legacy_listeners: *legacy,
                window: std::time::Duration::from_secs(args.window),
                prefix: if *legacy { "hlb-".into() } else { "hl-".into() },
                confine: !args.unconfined,
                cpu_quota: !args.unconfined,
            };
            match run(s, &opts) {
                Ok(f) => {
                    println!("{label:<10} {}", f.line());
                    if !f.attack_log.is_empty() {
                        println!("{:<10} attack: {}", "", f.attack_log);
                    }
                }
                Err(e) => {
                    println!("{label:<10} {}: failed: {e:#}", s.name());
                    ok = false;
                }
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.hostile {
        return hostile(&args);
    }
    let opts = SoakOpts {
        seed: args.seed.unwrap_or_else(soak::rng::seed_from_clock),
        lifecycles: args.lifecycles,
        from: args.from,
        concurrency: args.concurrency,
        rates: ChaosRates {
            agent: args.agent_rate,
            envoy: args.envoy_rate,
            ..ChaosRates::default()
        },
        sim_app: None,
        holdfast: None,
        // Not "soak": the short form in `cargo test` may run at the same time.
        name: "soakl".into(),
    };
    let variants: &[Variant] = match args.variants {
        Which::Both => &[Variant::Holdfast, Variant::Baseline],
        Which::Holdfast => &[Variant::Holdfast],
        Which::Baseline => &[Variant::Baseline],
    };
    let runs = match soak::run(&opts, variants) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("soak (seed {}): {e:#}", opts.seed);
            return ExitCode::FAILURE;
        }
    };
    let mut ok = true;
    for r in runs.iter().filter(|r| r.variant == Variant::Holdfast) {
        for m in soak::missed_goals(r) {
            eprintln!("soak (seed {}): goal missed: {m}", opts.seed);
            ok = false;
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
