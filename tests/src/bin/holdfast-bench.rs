//! `holdfast-bench`: benchmarks against side-by-side baselines, one section at a time.
//!
//! ```text
//! holdfast-bench            # every known section
//! holdfast-bench filter     # Envoy with vs without the holdfast filter
//! holdfast-bench hold       # startup: holdfast vs serial start vs DROP rule vs nothing
//! holdfast-bench drain      # shutdown: holdfast vs fixed drain vs EXIT_ON_ZERO_ACTIVE_CONNECTIONS
//! holdfast-bench lifecycle  # native sidecar vs classic serial start vs classic + holdfast
//! holdfast-bench fanout     # kubectl holdfast status across 1,000 simulated agents
//! ```
//! Figures and the exact commands live in docs/benchmarks.md. Benchmarks are not timed tests:
//! they print what they measure and never fail on a figure.
//!
//! # The `filter` section
//! Two Envoys from the same bootstrap (`--concurrency 1`, one INBOUND tcp_proxy listener to a
//! local echo upstream), one with the filter in front of tcp_proxy and one without, run at the
//! same time. Rounds alternate between them (A/B/A/B...) so drift (thermal, noisy neighbours)
//! hits both alike. Two workloads:
//! - **new connections/s**: connect, one small request/response, close (FIN), over and over;
//! - **keep-alive requests/s**: N persistent connections doing request/response ping-pong.
//!
//! Each reports throughput, p50/p99 latency (client side), and Envoy's CPU time per operation
//! (from `/proc/<pid>/task/*/schedstat`), the figure least disturbed by the load generator sharing the machine.
//! With 2+ CPUs Envoy is pinned to CPU 0 and the load generator and upstream to the others.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use clap::{Parser, ValueEnum};
use holdfast_tests::echo::EchoServer;
use holdfast_tests::envoy::{
    self, bootstrap, holdfast_filter, static_cluster, tcp_proxy_listener, Envoy, EnvoyOptions,
    TrafficDirection,
};

/// A benchmark section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Section {
    /// Envoy with vs without the holdfast filter: connections/s, keep-alive requests/s, latency.
    Filter,
    /// Startup on the simulated node: holdfast vs serial start vs DROP rule vs nothing (root).
    Hold,
    /// Shutdown on the simulated node: holdfast vs fixed drain vs exit-on-zero (root).
    Drain,
    /// Many pods at once on one node: release seen from outside, agent CPU, idle cost, RSS,
    /// drain lag; optionally against a baseline agent build side by side (root).
    Scale,
    /// A pod's whole life — first call, Ready, an Envoy crash, deletion — as a native sidecar,
    /// a classic sidecar with holdApplicationUntilProxyStarts, and a classic one with holdfast
    /// (root).
    Lifecycle,
    /// Each mesh's sidecar (Istio, Kuma over TCP and Unix-socket admin, Consul) alone vs with
    /// holdfast: boot calls refused, the shutdown, a Job's completion (root).
    Meshes,
    /// `kubectl holdfast status` across a simulated cluster of --fanout-agents agents: wall time
    /// (p50/p95) and the API server's requests, by concurrency cap, and with 1% of agents hung.
    Fanout,
}

#[derive(Debug, Parser)]
#[command(about = "holdfast benchmarks against side-by-side baselines (see docs/benchmarks.md)")]
struct Args {
    /// Sections to run; none = every known section.
    #[arg(value_enum)]
    sections: Vec<Section>,
    /// fanout: simulated agents.
    #[arg(long, default_value_t = 1000)]
    fanout_agents: usize,
    /// fanout: pod rows each agent serves.
    #[arg(long, default_value_t = 30)]
    fanout_rows: usize,
    /// fanout: concurrency caps, one variant each.
    #[arg(long, value_delimiter = ',', default_values_t = vec![8usize, 32, 128])]
    fanout_concurrency: Vec<usize>,
    /// fanout: each agent's deadline, in ms.
    #[arg(long, default_value_t = 5000)]
    fanout_timeout_ms: u64,
    /// Seconds per measured round (each variant, each workload).
    #[arg(long, default_value_t = 1.0)]
    round_secs: f64,
    /// Measured rounds per variant and workload (interleaved with the other variant).
    #[arg(long, default_value_t = 12)]
    rounds: u32,
    /// Seconds of unmeasured warm-up per variant and workload.
    #[arg(long, default_value_t = 1.0)]
    warmup_secs: f64,
    /// Client threads opening connections in the connections/s workload.
    #[arg(long, default_value_t = 4)]
    connect_clients: usize,
    /// Persistent connections in the keep-alive workload (each has its own client thread on
    /// the load generator's CPU; beyond a few, their scheduling makes the rate noisy).
    #[arg(long, default_value_t = 4)]
    keepalive_connections: usize,
    /// Request (and response) size in bytes.
    #[arg(long, default_value_t = 64)]
    message_bytes: usize,
    /// filter: one more variant, `NAME=PATH` of a wasm module loaded like the holdfast filter
    /// (e.g. the previous build, for before/after in the same interleaved run). Repeatable.
    #[arg(long, value_name = "NAME=PATH")]
    extra_module: Vec<String>,
    /// Do not pin Envoy and the load generator to separate CPUs.
    #[arg(long)]
    no_pin: bool,
    /// hold/drain: repetitions per variant.
    #[arg(long, default_value_t = 10)]
    runs: u32,
    /// hold: how late Envoy is, in ms.
    #[arg(long, default_value_t = 2000)]
    proxy_delay_ms: u64,
    /// drain: how long the calling app keeps calling out after SIGTERM, in ms.
    #[arg(long, default_value_t = 2000)]
    after_sigterm_ms: u64,
    /// hold: how long the app initialises before its first call, in ms.
    #[arg(long, default_value_t = 1000)]
    app_init_ms: u64,
    /// hold: pods per variant in each round (--runs rounds).
    #[arg(long, default_value_t = 3)]
    hold_pods: u32,
    /// scale: pod counts, one scenario each.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1u32, 30, 110])]
    scale_pods: Vec<u32>,
    /// scale: another `holdfast` binary to run side by side (e.g. a build of the previous commit).
    #[arg(long)]
    baseline_agent: Option<std::path::PathBuf>,
    /// scale: how often the outside observer polls each pod's Envoy, in ms.
    #[arg(long, default_value_t = 1)]
    observe_poll_ms: u64,
    /// scale: how long the idle agent's CPU is measured, in seconds.
    #[arg(long, default_value_t = 10)]
    idle_secs: u64,
    /// lifecycle: pods per variant in each round.
    #[arg(long, default_value_t = 2)]
    lifecycle_pods: u32,
    /// lifecycle: rounds per app-init scenario.
    #[arg(long, default_value_t = 3)]
    lifecycle_rounds: u32,
    /// lifecycle: the app's initialisation before its boot call, in ms; one scenario each.
    #[arg(long, value_delimiter = ',', default_values_t = vec![0u64, 2000, 4000])]
    lifecycle_app_init_ms: Vec<u64>,
    /// lifecycle: how late istiod's first push reaches Envoy (Envoy itself starts at once), ms.
    #[arg(long, default_value_t = 1000)]
    xds_delay_ms: u64,
    /// lifecycle: the kubelet's initial restart back-off, ms (kubelet's is 10 s).
    #[arg(long, default_value_t = 10_000)]
    restart_backoff_ms: u64,
}

/// Options for the simulated-node sections: binaries next to this one.
fn sim_opts(args: &Args) -> Result<holdfast_tests::bench_opts::SimBenchOpts> {
    let exe = std::env::current_exe().context("locating holdfast-bench")?;
    let dir = exe.parent().context("holdfast-bench has no directory")?;
    let holdfast = dir.join("holdfast");
    let sim_app = dir.join("sim-app");
    ensure!(
        holdfast.is_file() && sim_app.is_file(),
        "holdfast and sim-app must be built next to {} (`cargo build --release -p holdfast -p holdfast-tests --bins`, as `just bench` does)",
        exe.display()
    );
    Ok(holdfast_tests::bench_opts::SimBenchOpts {
        holdfast,
        sim_app,
        runs: args.runs,
        proxy_delay: Duration::from_millis(args.proxy_delay_ms),
        app_init: Duration::from_millis(args.app_init_ms),
        after_sigterm: Duration::from_millis(args.after_sigterm_ms),
        hold_pods: args.hold_pods,
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    let sections = if args.sections.is_empty() {
        Section::value_variants().to_vec()
    } else {
        args.sections.clone()
    };
    for s in sections {
        let r = match s {
            Section::Filter => filter_section(&args),
            Section::Hold => sim_opts(&args).and_then(|o| holdfast_tests::bench::hold::run(&o)),
            Section::Drain => sim_opts(&args).and_then(|o| holdfast_tests::bench::drain::run(&o)),
            Section::Scale => sim_opts(&args).and_then(|o| {
                let scale = holdfast_tests::bench::scale::ScaleOpts {
                    pods: args.scale_pods.clone(),
                    baseline: args.baseline_agent.clone(),
                    observe_poll: Duration::from_millis(args.observe_poll_ms.max(1)),
                    idle: Duration::from_secs(args.idle_secs.max(1)),
                };
                holdfast_tests::bench::scale::run(&o, &scale)
            }),
            Section::Meshes => sim_opts(&args).and_then(|o| holdfast_tests::bench::meshes::run(&o)),
            Section::Fanout => {
                holdfast_tests::bench::fanout::run(&holdfast_tests::bench::fanout::FanoutOpts {
                    agents: args.fanout_agents.max(1),
                    rows: args.fanout_rows,
                    runs: args.runs.max(1),
                    concurrencies: args.fanout_concurrency.clone(),
                    per_agent: Duration::from_millis(args.fanout_timeout_ms),
                })
            }
            Section::Lifecycle => sim_opts(&args).and_then(|o| {
                let lifecycle = holdfast_tests::bench::lifecycle::LifecycleOpts {
                    pods: args.lifecycle_pods,
                    rounds: args.lifecycle_rounds,
                    xds_delay: Duration::from_millis(args.xds_delay_ms),
                    app_inits: args
                        .lifecycle_app_init_ms
                        .iter()
                        .map(|ms| Duration::from_millis(*ms))
                        .collect(),
                    restart_backoff: Duration::from_millis(args.restart_backoff_ms),
                };
                holdfast_tests::bench::lifecycle::run(&o, &lifecycle)
            }),
        };
        if let Err(e) = r {
            eprintln!("holdfast-bench {s:?}: {e:#}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

// ---------------------------------------------------------------------------------------------
// Filter section
// ---------------------------------------------------------------------------------------------

/// One Envoy under test.
struct Variant {
    name: String,
    envoy: Envoy,
    addr: SocketAddr,
    conn: Totals,
    keepalive: Totals,
}

/// What a variant accumulated over its measured rounds of one workload.
#[derive(Default)]
struct Totals {
    latencies_us: Vec<u32>,
    /// Throughput of each round.
    round_rates: Vec<f64>,
    /// Envoy CPU µs per operation of each round.
    round_cpu_us: Vec<f64>,
    errors: u64,
}

impl Totals {
    fn add(&mut self, r: RoundResult, cpu: Duration) {
        self.round_rates
            .push(r.ops as f64 / r.elapsed.as_secs_f64().max(1e-9));
        self.round_cpu_us
            .push(cpu.as_secs_f64() * 1e6 / (r.ops.max(1) as f64));
        self.errors += r.errors;
        self.latencies_us.extend(r.latencies_us);
    }

    /// Median throughput over the rounds: a round disturbed by something else on the machine
    /// moves a mean, not a median.
    fn rate(&self) -> f64 {
        median(&self.round_rates)
    }

    /// Median over the rounds of Envoy's CPU time per operation, in µs.
    fn cpu_us_per_op(&self) -> f64 {
        median(&self.round_cpu_us)
    }

    fn percentile(&mut self, p: f64) -> u32 {
        if self.latencies_us.is_empty() {
            return 0;
        }
        self.latencies_us.sort_unstable();
        let i = ((self.latencies_us.len() - 1) as f64 * p).round() as usize;
        self.latencies_us[i.min(self.latencies_us.len() - 1)]
    }

    /// Interquartile range of the round throughputs, in percent of the median.
    fn spread_pct(&self) -> f64 {
        iqr_pct(&self.round_rates)
    }
}

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let v = sorted(v);
    if v.is_empty() {
        return 0.0;
    }
    let pos = (v.len() - 1) as f64 * q;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

fn iqr_pct(v: &[f64]) -> f64 {
    let m = median(v);
    if m == 0.0 {
        return 0.0;
    }
    (quantile(v, 0.75) - quantile(v, 0.25)) / m * 100.0
}

struct RoundResult {
    ops: u64,
    elapsed: Duration,
    latencies_us: Vec<u32>,
    errors: u64,
}

#[derive(Clone, Copy)]
enum Workload {
    NewConnections,
    KeepAlive,
}

fn filter_section(args: &Args) -> Result<()> {
    ensure!(args.rounds > 0, "--rounds must be at least 1");
    ensure!(args.round_secs > 0.0, "--round-secs must be positive");
    ensure!(args.message_bytes > 0, "--message-bytes must be at least 1");
    let wasm = envoy::filter_wasm()?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pin = !args.no_pin && cpus >= 2;
    if pin {
        pin_self_to_cpus_from(1, cpus)?;
    }
    let echo = EchoServer::start().context("starting the echo upstream")?;

    // Without any filter, then (when built) a filter that does nothing, then any extra modules,
    // then holdfast: direction read per connection, and direction from its configuration.
    type Module = (String, Option<(PathBuf, Option<&'static str>)>);
    let mut modules: Vec<Module> = vec![("without filter".into(), None)];
    match noop_wasm() {
        Some(p) => modules.push(("no-op SDK filter".into(), Some((p, None)))),
        None => eprintln!(
            "note: no no-op filter module (build it with `cargo build -p holdfast-filter --example \
             noop_filter --target wasm32-wasip1 --profile wasm-release`); running without that baseline"
        ),
    }
    for extra in &args.extra_module {
        let (name, path) = extra
            .split_once('=')
            .with_context(|| format!("--extra-module {extra:?}: expected NAME=PATH"))?;
        ensure!(
            Path::new(path).is_file(),
            "--extra-module {name}: no file {path}"
        );
        modules.push((name.to_string(), Some((PathBuf::from(path), None))));
    }
    modules.push(("holdfast".into(), Some((wasm.clone(), None))));
    modules.push((
        "holdfast, direction configured".into(),
        Some((wasm, Some(r#"{"direction":"inbound"}"#))),
    ));
    let mut variants = Vec::new();
    for (name, module) in modules {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let filter = module.map(|(m, config)| holdfast_filter(&m, config));
        let bs = bootstrap(
            vec![tcp_proxy_listener(
                "in",
                Some(TrafficDirection::Inbound),
                any,
                "echo",
                filter,
            )],
            vec![static_cluster("echo", echo.addr())],
        );
        let opts = EnvoyOptions {
            concurrency: 1,
            log_level: "warning".into(),
            command_prefix: if pin {
                vec!["taskset".into(), "-c".into(), "0".into()]
            } else {
                Vec::new()
            },
            label: "bench".into(),
            ..EnvoyOptions::default()
        };
        let envoy =
            Envoy::start_value(&bs, &opts).with_context(|| format!("starting Envoy {name}"))?;
        let addr = envoy.listener_addr("in")?;
        variants.push(Variant {
            name,
            envoy,
            addr,
            conn: Totals::default(),
            keepalive: Totals::default(),
        });
    }

    let load_before = load_average();
    let round = Duration::from_secs_f64(args.round_secs);
    let warmup = Duration::from_secs_f64(args.warmup_secs);
    eprintln!(
        "filter: {} rounds x {:.1} s per variant and workload, interleaved; Envoy pinned: {pin}",
        args.rounds, args.round_secs
    );
    for workload in [Workload::NewConnections, Workload::KeepAlive] {
        for v in &variants {
            run_round(workload, v.addr, args, warmup)?;
        }
        for i in 0..args.rounds {
            // Rotate the order (A/B/C, B/C/A, ...): no variant always goes first.
            let n = variants.len();
            for k in 0..n {
                let idx = (k + i as usize) % n;
                let v = &mut variants[idx];
                let cpu0 = process_cpu(v.envoy.pid())?;
                let r = run_round(workload, v.addr, args, round)?;
                let cpu = process_cpu(v.envoy.pid())?.saturating_sub(cpu0);
                match workload {
                    Workload::NewConnections => v.conn.add(r, cpu),
                    Workload::KeepAlive => v.keepalive.add(r, cpu),
                }
            }
        }
    }

    // The filter counted what it saw: a cheap sanity check that it was really in the path.
    let with = variants.last().context("no variant")?;
    let counted = with
        .envoy
        .admin()
        .holdfast_stat("inbound.cx_total")?
        .unwrap_or(0);
    let loaded = with.envoy.admin().holdfast_stat("loaded")?;
    ensure!(
        loaded == Some(1),
        "holdfast.loaded is {loaded:?}, expected 1: the filter is not loaded"
    );
    if counted == 0 {
        // Only a stripped-down module (HOLDFAST_FILTER_WASM) gets here; say so next to the figures.
        eprintln!("warning: the filter counted no connection (a stripped-down module?)");
    }

    let load_avg_note = format!("{load_before} / {}", load_average());
    print_table(args, pin, &mut variants, counted, &load_avg_note);
    Ok(())
}

fn print_table(
    args: &Args,
    pin: bool,
    variants: &mut [Variant],
    counted: u64,
    load_avg_note: &str,
) {
    println!();
    println!(
        "## holdfast-bench filter: Envoy --concurrency 1, tcp_proxy to a local echo upstream, {}-byte request/response",
        args.message_bytes
    );
    println!(
        "{} rounds x {:.1} s per variant and workload, interleaved; Envoy pinned to CPU 0: {pin}; \
         {} client threads for new connections, {} keep-alive connections",
        args.rounds, args.round_secs, args.connect_clients, args.keepalive_connections
    );
    println!();
    // Ratios: every filter variant against Envoy without a filter (variant 0).
    let ratio_cols: Vec<usize> = (1..variants.len()).collect();
    let mut header = String::from("| workload | metric |");
    let mut rule = String::from("|---|---|");
    for v in variants.iter() {
        header.push_str(&format!(" {} |", v.name));
        rule.push_str("---:|");
    }
    for &c in &ratio_cols {
        header.push_str(&format!(" {} / without |", variants[c].name));
        rule.push_str("---:|");
    }
    println!("{header}\n{rule}");
    for workload in [Workload::NewConnections, Workload::KeepAlive] {
        let (label, unit) = match workload {
            Workload::NewConnections => (
                "new connections (connect, 1 req/resp, close)",
                "connections/s",
            ),
            Workload::KeepAlive => ("keep-alive requests", "requests/s"),
        };
        let mut rows: Vec<(String, Vec<f64>, Vec<String>)> = Vec::new();
        let mut rate = (Vec::new(), Vec::new());
        let mut p50 = (Vec::new(), Vec::new());
        let mut p99 = (Vec::new(), Vec::new());
        let mut cpu = (Vec::new(), Vec::new());
        let mut errors = 0;
        for v in variants.iter_mut() {
            let t = match workload {
                Workload::NewConnections => &mut v.conn,
                Workload::KeepAlive => &mut v.keepalive,
            };
            rate.0.push(t.rate());
            rate.1
                .push(format!("{:.0} (IQR {:.0} %)", t.rate(), t.spread_pct()));
            let (a, b) = (t.percentile(0.50), t.percentile(0.99));
            p50.0.push(f64::from(a));
            p50.1.push(a.to_string());
            p99.0.push(f64::from(b));
            p99.1.push(b.to_string());
            cpu.0.push(t.cpu_us_per_op());
            cpu.1.push(format!("{:.1}", t.cpu_us_per_op()));
            errors += t.errors;
        }
        rows.push((format!("{label} | {unit}"), rate.0, rate.1));
        rows.push(("| p50 latency µs".into(), p50.0, p50.1));
        rows.push(("| p99 latency µs".into(), p99.0, p99.1));
        rows.push(("| Envoy CPU µs per op".into(), cpu.0, cpu.1));
        for (name, values, shown) in rows {
            let mut line = format!("| {name} |");
            for s in &shown {
                line.push_str(&format!(" {s} |"));
            }
            for &c in &ratio_cols {
                line.push_str(&format!(" {:.3} |", values[c] / values[0].max(1e-9)));
            }
            println!("{line}");
        }
        if errors > 0 {
            println!("| | errors (all variants) | {errors} |");
        }
    }
    println!();
    println!(
        "(rates and CPU are medians over rounds; IQR = interquartile range of the round rates; \
         latencies over all requests; load average before/after: {}; the holdfast filter counted \
         {counted} connections)",
        load_avg_note
    );
}

/// The no-op baseline module: `$HOLDFAST_NOOP_WASM`, else where cargo puts the example.
fn noop_wasm() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HOLDFAST_NOOP_WASM") {
        return Some(PathBuf::from(p));
    }
    let p =
        envoy::workspace_root().join("target/wasm32-wasip1/wasm-release/examples/noop_filter.wasm");
    p.exists().then_some(p)
}

fn run_round(
    workload: Workload,
    addr: SocketAddr,
    args: &Args,
    dur: Duration,
) -> Result<RoundResult> {
    match workload {
        Workload::NewConnections => run_threads(args.connect_clients, dur, |deadline| {
            connect_loop(addr, args.message_bytes, deadline)
        }),
        Workload::KeepAlive => {
            // Open the connections before the clock starts.
            let conns = (0..args.keepalive_connections)
                .map(|_| open(addr))
                .collect::<Result<Vec<_>>>()?;
            let conns = std::sync::Mutex::new(conns);
            run_threads(args.keepalive_connections, dur, |deadline| {
                let conn = conns
                    .lock()
                    .map_err(|_| anyhow::anyhow!("connection list poisoned"))?
                    .pop()
                    .context("fewer connections than threads")?;
                keepalive_loop(conn, args.message_bytes, deadline)
            })
        }
    }
}

/// Runs `threads` copies of `work` from a common start for `dur`; sums their results.
fn run_threads<F>(threads: usize, dur: Duration, work: F) -> Result<RoundResult>
where
    F: Fn(Instant) -> Result<(u64, Vec<u32>, u64)> + Sync,
{
    ensure!(threads > 0, "need at least one client thread");
    let barrier = Arc::new(Barrier::new(threads + 1));
    let (start, results) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let b = barrier.clone();
                let work = &work;
                s.spawn(move || {
                    b.wait();
                    work(Instant::now() + dur)
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let results: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        (start, results)
    });
    let elapsed = start.elapsed();
    let mut out = RoundResult {
        ops: 0,
        elapsed,
        latencies_us: Vec::new(),
        errors: 0,
    };
    for r in results {
        let Ok(r) = r else {
            bail!("a client thread panicked")
        };
        let (ops, lat, errs) = r?;
        out.ops += ops;
        out.latencies_us.extend(lat);
        out.errors += errs;
    }
    Ok(out)
}

fn open(addr: SocketAddr) -> Result<TcpStream> {
    let s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    Ok(s)
}

fn request(s: &mut TcpStream, msg: &[u8], buf: &mut [u8]) -> std::io::Result<()> {
    s.write_all(msg)?;
    s.read_exact(buf)
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// Connect, one request/response, close; until `deadline`. Returns (ops, latencies, errors).
fn connect_loop(addr: SocketAddr, size: usize, deadline: Instant) -> Result<(u64, Vec<u32>, u64)> {
    let msg = vec![b'c'; size];
    let mut buf = vec![0u8; size];
    let (mut ops, mut errors, mut lat) = (0u64, 0u64, Vec::with_capacity(1 << 16));
    while Instant::now() < deadline {
        let t = Instant::now();
        let ok = open(addr)
            .and_then(|mut s| request(&mut s, &msg, &mut buf).map_err(Into::into))
            .is_ok();
        if ok {
            ops += 1;
            lat.push(micros(t.elapsed()));
        } else {
            errors += 1;
        }
    }
    Ok((ops, lat, errors))
}

/// Request/response ping-pong on one connection until `deadline`.
fn keepalive_loop(
    mut s: TcpStream,
    size: usize,
    deadline: Instant,
) -> Result<(u64, Vec<u32>, u64)> {
    let msg = vec![b'k'; size];
    let mut buf = vec![0u8; size];
    let (mut ops, mut lat) = (0u64, Vec::with_capacity(1 << 16));
    while Instant::now() < deadline {
        let t = Instant::now();
        request(&mut s, &msg, &mut buf).context("keep-alive request")?;
        ops += 1;
        lat.push(micros(t.elapsed()));
    }
    Ok((ops, lat, 0))
}

/// CPU time a process's threads have run, in ns, from `/proc/<pid>/task/*/schedstat` (nanosecond
/// resolution; `/proc/<pid>/stat` counts 10 ms ticks, too coarse for 1 s rounds). Threads that
/// exit between two reads would be lost, but Envoy's threads live as long as Envoy.
fn process_cpu(pid: u32) -> Result<Duration> {
    let dir = format!("/proc/{pid}/task");
    let mut ns = 0u64;
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        let path = entry?.path().join("schedstat");
        // A thread may exit between the listing and the read: skip it.
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let run: u64 = text
            .split_whitespace()
            .next()
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("unexpected {}: {text:?}", path.display()))?;
        ns = ns.saturating_add(run);
    }
    Ok(Duration::from_nanos(ns))
}

/// Keeps this process (and the threads it will start) off CPU 0, which Envoy gets.
fn pin_self_to_cpus_from(first: usize, cpus: usize) -> Result<()> {
    use nix::sched::{sched_setaffinity, CpuSet};
    let mut set = CpuSet::new();
    for c in first..cpus {
        set.set(c).context("CPU set")?;
    }
    sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).context("sched_setaffinity")?;
    Ok(())
}

/// The 1-minute load average, to show how busy the machine was.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}
