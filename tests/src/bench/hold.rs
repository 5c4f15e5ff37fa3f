//! The `hold` benchmark section (see docs/benchmarks.md, "Startup hold").
//!
//! An app that initialises for `--app-init-ms` and then makes one call at boot (and crashes if
//! it fails, like an app fetching its config), with Envoy `--proxy-delay-ms` late, under four
//! ways of starting the pod, side by side in the same rounds (one simulated node per variant,
//! all started together, `--hold-pods` pods each, `--runs` rounds):
//!
//! - **holdfast**: the real agent holds the app's SYNs in an NFQUEUE until Envoy is ready;
//! - **serial start**: Istio's `holdApplicationUntilProxyStarts` — the app container starts only
//!   once the proxy's postStart hook (`pilot-agent wait`, 500 ms polls) returns;
//! - **DROP until ready**: iptables DROP for the same SYNs, removed as soon as a 1 ms poll of
//!   Envoy's `/ready` says LIVE; the app's kernel retransmits the SYN (1 s, then 2 s, 4 s...);
//! - **nothing**: plain Istio — refused, crash, restart after kubelet's 10 s back-off.
//!
//! Envoy's readiness is measured independently of every variant: a poller in each pod's netns,
//! from shortly before pilot-agent launches Envoy (it cannot answer earlier), checks every 1 ms
//! Envoy's admin `/ready`, the capture ports' LISTEN state (`/proc/thread-self/net/tcp`) and the
//! holdfast filter's `loaded` gauge. "Envoy ready" is when all three hold: on this machine
//! `/ready` says LIVE and the ports listen 1–2 s before the filter's gauge turns 1, and app calls
//! made in that gap were seen refused, so LIVE alone is not "ready to serve". The app's report
//! gives the end of its first successful call (µs, wall clock); the pod's start is the moment
//! the init container finished, when kubelet starts the first regular container. The ideal first
//! call is at `max(app init, Envoy ready)` after that start.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use holdfast::report::board::{HoldOutcome, PodStatus};

pub use crate::bench_opts::SimBenchOpts;

use super::{boot_times, load_average, percentile, pod_start_us, side_by_side, yes_no, Side};
use crate::sim::istio_init::{INBOUND_PORT, OUTBOUND_PORT};
use crate::sim::pod_object::CState;
use crate::sim::report::{now_us, AppEvent};
use crate::sim::{AppScript, CallError, NodeOptions, Phase, PodSpec, SimNode};

/// Goal: release (Envoy ready → first call done) at p99.
const GOAL_RELEASE_P99_MS: f64 = 5.0;
/// Goal: first call at most this much after the ideal `max(app init, proxy ready)`.
const GOAL_OVERSHOOT_MS: f64 = 10.0;
/// How often the independent readiness poller asks `/ready`.
const READY_POLL: Duration = Duration::from_millis(1);
/// The poller starts this long before pilot-agent is due to launch Envoy.
const READY_POLL_LEAD: Duration = Duration::from_millis(50);

/// How a pod is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Holdfast,
    Serial,
    Drop,
    Nothing,
}

impl Side for Variant {
    const HOLDFAST: Variant = Variant::Holdfast;

    fn label(self) -> &'static str {
        match self {
            Variant::Holdfast => "holdfast",
            Variant::Serial => "serial start (holdApplicationUntilProxyStarts)",
            Variant::Drop => "DROP until ready",
            Variant::Nothing => "nothing (plain Istio)",
        }
    }

    /// The simulated node's name (namespaces `hf-<it>-<pod>`).
    fn node_name(self) -> &'static str {
        match self {
            Variant::Holdfast => "hbh",
            Variant::Serial => "hbs",
            Variant::Drop => "hbd",
            Variant::Nothing => "hbn",
        }
    }
}

impl Variant {
    const ALL: [Variant; 4] = [
        Variant::Holdfast,
        Variant::Serial,
        Variant::Drop,
        Variant::Nothing,
    ];

    fn spec(self, name: &str, opts: &SimBenchOpts) -> PodSpec {
        let spec = PodSpec::new(name)
            .app(AppScript::CallAtStart { calls: 1 })
            .app_init(opts.app_init)
            .proxy_delay(opts.proxy_delay)
            // Long enough that a held or dropped connect() is never cut short by the app.
            .call_timeout(opts.proxy_delay + opts.app_init + Duration::from_secs(60));
        match self {
            Variant::Holdfast | Variant::Nothing => spec,
            Variant::Serial => spec.serial_start(true),
            Variant::Drop => spec.drop_until_ready(true),
        }
    }
}

/// The filter's readiness gauge, and the admin query for it.
const FILTER_LOADED_STAT: &str = "wasmcustom.holdfast.loaded";
const FILTER_LOADED_QUERY: &str = "/stats?filter=%5Ewasmcustom%5C.holdfast%5C.loaded%24";

/// What the independent poller saw, wall-clock µs.
#[derive(Debug, Clone, Copy, Default)]
struct ReadyTimes {
    /// First `/ready` LIVE.
    live_us: Option<u64>,
    /// First time both capture ports were in LISTEN state.
    listen_us: Option<u64>,
    /// First `wasmcustom.holdfast.loaded: 1` (at or after LIVE).
    filter_us: Option<u64>,
}

/// What one pod showed.
#[derive(Debug, Clone, Default)]
struct PodSample {
    /// When the init container finished (kubelet starts the first regular container), µs.
    pod_start_us: Option<u64>,
    /// When the app process first started, µs.
    app_start_us: Option<u64>,
    /// Envoy ready to serve, µs: the first time the independent poller had seen `/ready` LIVE,
    /// the capture ports listening and the holdfast filter's `loaded` gauge at 1. (LIVE and
    /// listening alone come earlier, but calls made then were seen refused: see the docs.)
    ready_us: Option<u64>,
    /// First LIVE answer of Envoy's `/ready` to the independent poller, µs.
    live_us: Option<u64>,
    /// First time the poller saw the capture ports listening, µs.
    listen_us: Option<u64>,
    /// First time the poller saw the holdfast filter's `loaded` gauge at 1 (after LIVE), µs.
    filter_us: Option<u64>,
    /// End of the app's first successful startup call, µs.
    first_ok_us: Option<u64>,
    refused: u32,
    other_failures: u32,
    crashes: u32,
    restarts: u32,
    /// The agent's `ready_to_release_ms` (holdfast only).
    agent_release_ms: Option<f64>,
    agent_held: u64,
    agent_outcome: Option<HoldOutcome>,
}

impl PodSample {
    fn ms(a: Option<u64>, b: Option<u64>) -> Option<f64> {
        Some((a? as f64 - b? as f64) / 1e3)
    }
    /// Envoy ready → first successful call, ms.
    fn release_ms(&self) -> Option<f64> {
        PodSample::ms(self.first_ok_us, self.ready_us)
    }
    /// Envoy LIVE → filter loaded, ms.
    fn filter_lag_ms(&self) -> Option<f64> {
        PodSample::ms(self.filter_us, self.live_us)
    }
    /// Envoy LIVE → capture ports listening, ms.
    fn listen_lag_ms(&self) -> Option<f64> {
        PodSample::ms(self.listen_us, self.live_us)
    }
    /// Pod start → first successful call, ms.
    fn first_call_ms(&self) -> Option<f64> {
        PodSample::ms(self.first_ok_us, self.pod_start_us)
    }
    /// App start → first successful call, ms.
    fn app_first_call_ms(&self) -> Option<f64> {
        PodSample::ms(self.first_ok_us, self.app_start_us)
    }
    /// Pod start → Envoy ready, ms.
    fn proxy_ready_ms(&self) -> Option<f64> {
        PodSample::ms(self.ready_us, self.pod_start_us)
    }
    /// The ideal first call: `max(app init, proxy ready)` after the pod's start, ms.
    fn ideal_ms(&self, app_init: Duration) -> Option<f64> {
        Some(self.proxy_ready_ms()?.max(app_init.as_secs_f64() * 1e3))
    }
}

/// Runs the section and prints its table.
pub fn run(opts: &SimBenchOpts) -> Result<()> {
    ensure!(opts.runs > 0, "--runs must be at least 1");
    ensure!(
        opts.hold_pods > 0 && opts.hold_pods <= 50,
        "--hold-pods must be between 1 and 50 (got {})",
        opts.hold_pods
    );
    ensure!(
        nix::unistd::geteuid().is_root(),
        "the hold section needs root (network namespaces, iptables, cgroups): run it with sudo"
    );
    let agent_bin = crate::agent::holdfast_binary()?;
    eprintln!(
        "hold: {} rounds x {} pods per variant; app init {:?}, Envoy {:?} late; agent {}",
        opts.runs,
        opts.hold_pods,
        opts.app_init,
        opts.proxy_delay,
        agent_bin.display()
    );
    let load_before = load_average();
    let started = Instant::now();
    let mut samples: Vec<(Variant, PodSample)> = Vec::new();
    for round in 0..opts.runs {
        let t = Instant::now();
        let r = run_round(opts).with_context(|| format!("hold round {}", round + 1))?;
        eprintln!(
            "hold: round {}/{} took {:.1} s",
            round + 1,
            opts.runs,
            t.elapsed().as_secs_f64()
        );
        samples.extend(r);
    }
    let note = format!(
        "load average before/after: {load_before} / {}; section took {:.0} s",
        load_average(),
        started.elapsed().as_secs_f64()
    );
    print_table(opts, &samples, &note);
    Ok(())
}

/// One round: a node per variant, `hold_pods` pods each, all started together.
fn run_round(opts: &SimBenchOpts) -> Result<Vec<(Variant, PodSample)>> {
    let node_opts = NodeOptions {
        sim_app: Some(opts.sim_app.clone()),
        ..NodeOptions::default()
    };
    let names: Vec<String> = (0..opts.hold_pods).map(|i| format!("p{i}")).collect();
    let (nodes, agent) = side_by_side(&Variant::ALL, &node_opts, |v| {
        names.iter().map(|name| v.spec(name, opts)).collect()
    })?;

    // Longest a pod may take: Envoy late, app init, kubelet's 10 s back-off, and slack.
    let budget = opts.proxy_delay + opts.app_init + Duration::from_secs(40);
    let give_up = Instant::now() + budget;
    let stop = AtomicBool::new(false);
    let mut samples = std::thread::scope(|s| -> Result<Vec<(Variant, PodSample)>> {
        let mut pollers = Vec::new();
        for (_, node) in &nodes {
            for name in &names {
                let stop = &stop;
                let h = s.spawn(move || ready_time(node, name, opts.proxy_delay, give_up, stop));
                pollers.push((name.clone(), h));
            }
        }
        // Wait for every app's first successful call (or its failure to get one in time).
        let collected = (|| -> Result<Vec<(Variant, PodSample)>> {
            let mut out = Vec::new();
            for (v, node) in &nodes {
                for name in &names {
                    let left = give_up.saturating_duration_since(Instant::now());
                    let waited = node.wait_report(name, left, "a successful boot call", |r| {
                        r.calls(Phase::Startup).ok > 0
                    });
                    if let Err(e) = waited {
                        eprintln!("hold: {}: {e}", v.label());
                    }
                    out.push((*v, sample(node, name)?));
                }
            }
            Ok(out)
        })();
        // Pollers that have not seen Envoy ready by now give up (on an error too).
        stop.store(true, Ordering::SeqCst);
        let mut out = collected?;
        // Pollers and samples are in the same order (variant, then pod).
        for ((name, h), (_, sample)) in pollers.into_iter().zip(out.iter_mut()) {
            let t = h
                .join()
                .map_err(|_| anyhow::anyhow!("the readiness poller of {name} panicked"))?;
            sample.live_us = t.live_us;
            sample.ready_us = match (t.live_us, t.listen_us, t.filter_us) {
                (Some(a), Some(b), Some(c)) => Some(a.max(b).max(c)),
                _ => None,
            };
            sample.filter_us = t.filter_us;
            sample.listen_us = t.listen_us;
        }
        Ok(out)
    })?;

    // The agent's own view of each holdfast pod (the first `names.len()` samples).
    let holdfast = samples
        .iter_mut()
        .filter(|(v, _)| *v == Variant::Holdfast)
        .zip(&names);
    for ((_, sample), name) in holdfast {
        match agent.wait_pod(
            "default",
            name,
            Duration::from_secs(10),
            "hold released",
            |r: &PodStatus| r.hold.as_ref().is_some_and(|h| h.outcome.is_some()),
        ) {
            Ok(row) => {
                if let Some(h) = row.hold {
                    sample.agent_release_ms = h.ready_to_release_ms;
                    sample.agent_held = h.connections_held;
                    sample.agent_outcome = h.outcome;
                }
            }
            Err(e) => eprintln!("hold: agent status of {name}: {e:#}"),
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

/// The pod's figures from its app report and its view.
fn sample(node: &SimNode, name: &str) -> Result<PodSample> {
    let report = node.report(name)?;
    let view = node
        .pod(name)
        .with_context(|| format!("pod {name} vanished"))?;
    let (app_start_us, first_ok_us) = boot_times(&report);
    let mut s = PodSample {
        pod_start_us: pod_start_us(&view),
        app_start_us,
        first_ok_us,
        ..PodSample::default()
    };
    s.crashes = report
        .events
        .iter()
        .filter(|e| matches!(e, AppEvent::Exit { code, .. } if *code != 0))
        .fold(0, |n, _| n + 1);
    let calls = report.all_calls();
    s.refused = calls.errors(CallError::ConnectionRefused);
    s.other_failures = calls.failed - s.refused;
    s.restarts = view.app().map_or(0, |c| c.restart_count);
    Ok(s)
}

/// When the pod's Envoy first answered `/ready` with LIVE, then when its holdfast filter first
/// reported `loaded` (µs), polling every 1 ms.
///
/// Envoy cannot answer before pilot-agent launches it, `proxy_delay` after the proxy container
/// starts, so polling starts shortly before that: 1 ms polls of every pod for the whole round
/// would load the 2-core machine the benchmark runs on.
fn ready_time(
    node: &SimNode,
    pod: &str,
    proxy_delay: Duration,
    give_up: Instant,
    stop: &AtomicBool,
) -> ReadyTimes {
    let proxy_started_us = loop {
        let started = node.pod(pod).and_then(|v| {
            v.proxy().and_then(|c| match &c.state {
                CState::Running { started_at } => u64::try_from(started_at.as_microsecond()).ok(),
                _ => None,
            })
        });
        if let Some(t) = started {
            break t;
        }
        if stop.load(Ordering::SeqCst) || Instant::now() >= give_up {
            return ReadyTimes::default();
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let launch_us = proxy_started_us + proxy_delay.as_micros() as u64;
    let begin_us = launch_us.saturating_sub(READY_POLL_LEAD.as_micros() as u64);
    let now = now_us();
    if begin_us > now {
        std::thread::sleep(Duration::from_micros(begin_us - now));
    }
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], crate::sim::istio_init::ADMIN_PORT));
    let get = |path: &str| crate::sim::pilot_agent::admin_request(admin, "GET", path);
    let given_up = || stop.load(Ordering::SeqCst) || Instant::now() >= give_up;

    node.in_pod_netns(pod, || {
        let mut t = ReadyTimes::default();
        // Each state changed somewhere between sending a request and its answer: take the send
        // time. Ports are read from this thread's netns view of /proc.
        loop {
            let now = now_us();
            if t.live_us.is_none() && get("/ready").is_ok_and(|b| b.trim() == "LIVE") {
                t.live_us = Some(now);
            }
            if t.listen_us.is_none() && capture_ports_listening() {
                t.listen_us = Some(now);
            }
            if t.live_us.is_some() && t.filter_us.is_none() {
                let now = now_us();
                let loaded = get(FILTER_LOADED_QUERY).is_ok_and(|b| {
                    b.lines()
                        .any(|l| l.trim() == format!("{FILTER_LOADED_STAT}: 1"))
                });
                if loaded {
                    t.filter_us = Some(now);
                }
            }
            let done = t.live_us.is_some() && t.listen_us.is_some() && t.filter_us.is_some();
            if done || given_up() {
                return t;
            }
            std::thread::sleep(READY_POLL);
        }
    })
    .unwrap_or_default()
}

/// Whether both capture ports are in LISTEN state in the calling thread's netns. Envoy calls
/// `listen()` only once a listener is warm, so this is when the app's SYNs can be answered.
fn capture_ports_listening() -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/thread-self/net/tcp") else {
        return false;
    };
    let listening: Vec<u16> = text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // `sl local_address rem_address st ...`; LISTEN is state 0A.
            let (local, state) = (f.get(1)?, f.get(3)?);
            let port = local.rsplit_once(':')?.1;
            (*state == "0A").then(|| u16::from_str_radix(port, 16).ok())?
        })
        .collect();
    [OUTBOUND_PORT, INBOUND_PORT]
        .iter()
        .all(|p| listening.contains(p))
}

fn fmt_p(v: &[f64]) -> String {
    match (percentile(v, 0.5), percentile(v, 0.99)) {
        (Some(a), Some(b)) => format!("{a:.1} / {b:.1}"),
        _ => "—".into(),
    }
}

fn print_table(opts: &SimBenchOpts, samples: &[(Variant, PodSample)], note: &str) {
    let init_ms = opts.app_init.as_secs_f64() * 1e3;
    println!();
    println!(
        "## holdfast-bench hold: app init {} ms, Envoy {} ms late, {} rounds x {} pods per variant",
        opts.app_init.as_millis(),
        opts.proxy_delay.as_millis(),
        opts.runs,
        opts.hold_pods
    );
    println!(
        "goals: 0 refused; release (Envoy ready → first call done) p99 ≤ {GOAL_RELEASE_P99_MS} ms; \
         first call ≤ max(app init, proxy ready) + {GOAL_OVERSHOOT_MS} ms"
    );
    println!();
    let mut header = String::from("| metric (ms: p50 / p99 over pods) |");
    let mut rule = String::from("|---|");
    for v in Variant::ALL {
        header.push_str(&format!(" {} |", v.label()));
        rule.push_str("---:|");
    }
    println!("{header}\n{rule}");
    let of = |v: Variant| -> Vec<&PodSample> {
        samples
            .iter()
            .filter(|(w, _)| *w == v)
            .map(|(_, s)| s)
            .collect()
    };
    let row = |label: &str, cell: &dyn Fn(&[&PodSample]) -> String| {
        let mut line = format!("| {label} |");
        for v in Variant::ALL {
            line.push_str(&format!(" {} |", cell(&of(v))));
        }
        println!("{line}");
    };
    let collect = |ps: &[&PodSample], f: &dyn Fn(&PodSample) -> Option<f64>| -> Vec<f64> {
        ps.iter().filter_map(|s| f(s)).collect()
    };
    row("pods (with a successful boot call)", &|ps| {
        let ok = ps.iter().filter(|s| s.first_ok_us.is_some()).count();
        format!("{} ({ok})", ps.len())
    });
    row("refused connections (pods with any)", &|ps| {
        let n: u32 = ps.iter().map(|s| s.refused).sum();
        let pods = ps.iter().filter(|s| s.refused > 0).count();
        format!("{n} ({pods})")
    });
    row("other failed calls", &|ps| {
        ps.iter().map(|s| s.other_failures).sum::<u32>().to_string()
    });
    row("app crashes / restarts", &|ps| {
        let c: u32 = ps.iter().map(|s| s.crashes).sum();
        let r: u32 = ps.iter().map(|s| s.restarts).sum();
        format!("{c} / {r}")
    });
    row(
        "pod start → Envoy ready (LIVE, listening, filter loaded)",
        &|ps| fmt_p(&collect(ps, &|s| s.proxy_ready_ms())),
    );
    row("**release**: Envoy ready → first call done", &|ps| {
        fmt_p(&collect(ps, &|s| s.release_ms()))
    });
    row("`/ready` LIVE → capture ports listening", &|ps| {
        fmt_p(&collect(ps, &|s| s.listen_lag_ms()))
    });
    row("`/ready` LIVE → filter `loaded` gauge 1", &|ps| {
        fmt_p(&collect(ps, &|s| s.filter_lag_ms()))
    });
    row("agent's ready_to_release_ms", &|ps| {
        let v = collect(ps, &|s| s.agent_release_ms);
        if v.is_empty() {
            "—".into()
        } else {
            fmt_p(&v)
        }
    });
    row("**pod start → first call done**", &|ps| {
        fmt_p(&collect(ps, &|s| s.first_call_ms()))
    });
    row("ideal: max(app init, Envoy ready)", &|ps| {
        fmt_p(&collect(ps, &|s| s.ideal_ms(opts.app_init)))
    });
    row("first call − ideal", &|ps| {
        fmt_p(&collect(ps, &|s| {
            Some(s.first_call_ms()? - s.ideal_ms(opts.app_init)?)
        }))
    });
    row("first call / ideal (p50)", &|ps| {
        let r = collect(ps, &|s| {
            Some(s.first_call_ms()? / s.ideal_ms(opts.app_init)?)
        });
        percentile(&r, 0.5).map_or("—".into(), |x| format!("{x:.3}×"))
    });
    row("app (container) start → first call done", &|ps| {
        fmt_p(&collect(ps, &|s| s.app_first_call_ms()))
    });
    row("goal 0 refused", &|ps| {
        yes_no(ps.iter().all(|s| s.refused == 0 && s.first_ok_us.is_some()))
    });
    row("goal release p99 ≤ 5 ms", &|ps| {
        let v = collect(ps, &|s| s.release_ms());
        yes_no(
            v.len() == ps.len() && percentile(&v, 0.99).is_some_and(|p| p <= GOAL_RELEASE_P99_MS),
        )
    });
    row("goal first call ≤ ideal + 10 ms (every pod)", &|ps| {
        let v = collect(ps, &|s| {
            Some(s.first_call_ms()? - s.ideal_ms(opts.app_init)?)
        });
        yes_no(v.len() == ps.len() && v.iter().all(|d| *d <= GOAL_OVERSHOOT_MS))
    });
    println!();
    let held: Vec<u64> = of(Variant::Holdfast).iter().map(|s| s.agent_held).collect();
    let not_ready = of(Variant::Holdfast)
        .iter()
        .filter(|s| s.agent_outcome != Some(HoldOutcome::Ready))
        .count();
    println!(
        "(pod start = init container finished; Envoy ready = first time a 1 ms poller in the pod's \
         netns had seen /ready LIVE, both capture ports in LISTEN and the filter's loaded gauge at \
         1; first call done = end of the app's first successful boot call (connect + ping/pong \
         through Envoy to the remote service); app init {init_ms:.0} ms; holdfast held {} \
         connection(s) in total, {not_ready} hold(s) not ended by readiness; {note})",
        held.iter().sum::<u64>()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(51.0));
        assert_eq!(percentile(&v, 0.99), Some(99.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn ideal_is_the_later_of_init_and_ready() {
        let s = PodSample {
            pod_start_us: Some(1_000_000),
            ready_us: Some(3_500_000),
            first_ok_us: Some(3_504_000),
            ..PodSample::default()
        };
        assert_eq!(s.ideal_ms(Duration::from_secs(1)), Some(2500.0));
        assert_eq!(s.ideal_ms(Duration::from_secs(4)), Some(4000.0));
        assert_eq!(s.release_ms(), Some(4.0));
    }
}
