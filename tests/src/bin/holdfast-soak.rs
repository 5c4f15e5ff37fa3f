//! `holdfast-soak` (`just soak`): the chaos soak's long form — by default 1000 lifecycles with
//! holdfast under chaos, then the same seed without holdfast — printed side by side (see
//! `holdfast_tests::soak` and docs/benchmarks.md, "Chaos soak"). Exits 1 when holdfast's run
//! misses a goal (a count that must be 0).

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
}

fn main() -> ExitCode {
    let args = Args::parse();
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
