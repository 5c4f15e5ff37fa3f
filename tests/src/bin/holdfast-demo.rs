//! `just demo`: the three sidecar failures on a simulated node of 3 pods started at once, first
//! without holdfast, then with the `holdfast agent` running on the node from before the pods
//! start; one side-by-side table of what each pod's app saw, then the agent's own view
//! (`holdfast status`), and the shutdown pod's timeline as `holdfast status default/flusher`
//! printed it on the node, from first sight to the proxy's quit.
//!
//! Each run is a fresh node (real netns, iptables, Envoy, apps; kubelet and pilot-agent
//! stand-ins); with `--runtime containerd` every pod is a real container of a private
//! containerd (CRI, runc, the CNI bridge plugin). In the run with holdfast every sidecar gets `terminationDrainDuration` = the pod's
//! grace period, as holdfast's mesh config sets it, so Envoy outlives the app and the agent ends
//! it once the app is done. Each scenario is measured on its own thread, so every time shown is
//! taken when the event happened, not when the demo got round to looking.

use std::collections::BTreeMap;
use std::fs::File;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use holdfast::api::{NodeStatus, PodStatus};
use holdfast::cli::status::{self as status_cli, AgentUrl};
use holdfast_tests::agent::holdfast_binary;
use holdfast_tests::sim::report::now_ms;
use holdfast_tests::sim::{
    privileged, AppReport, AppScript, CallError, NodeOptions, Phase, PodPhase, PodSpec, Runtime,
    SimNode,
};

/// Upper bound of one run; the demo as a whole stays well under 90 s.
const RUN_BUDGET: Duration = Duration::from_secs(35);
/// How long the Job pod gets to complete after its app exits before we call it stuck.
const JOB_PATIENCE: Duration = Duration::from_secs(8);
/// How often the agent's status is sampled during the run with holdfast.
const STATUS_POLL: Duration = Duration::from_millis(20);

/// The scenarios, one pod each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Scenario {
    Startup,
    Shutdown,
    Job,
}

impl Scenario {
    const ALL: [Scenario; 3] = [Scenario::Startup, Scenario::Shutdown, Scenario::Job];

    fn pod(self) -> &'static str {
        match self {
            Scenario::Startup => "fetch-config",
            Scenario::Shutdown => "flusher",
            Scenario::Job => "batch",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Scenario::Startup => "1. startup: app calls out at boot, Envoy 2 s late",
            Scenario::Shutdown => "2. shutdown: app calls out for 8 s after SIGTERM",
            Scenario::Job => "3. Job: batch app exits 0",
        }
    }

    /// The pod, as the workload defines it (the same in both runs).
    fn spec(self) -> PodSpec {
        match self {
            Scenario::Startup => PodSpec::new(self.pod())
                .app(AppScript::CallAtStart { calls: 3 })
                .proxy_delay(Duration::from_secs(2))
                // Longer than Envoy is late: a connect() held by the agent must not time out
                // in the app. Without the agent the calls are refused at once anyway.
                .call_timeout(Duration::from_secs(10)),
            Scenario::Shutdown => PodSpec::new(self.pod())
                .app(AppScript::CallThroughShutdown {
                    every: Duration::from_millis(200),
                    pool: 2,
                    after_sigterm: Duration::from_secs(8),
                })
                .grace(Duration::from_secs(20)),
            Scenario::Job => PodSpec::new(self.pod())
                .app(AppScript::Batch {
                    calls: 3,
                    exit_code: 0,
                })
                .job(),
        }
    }
}

/// What one scenario showed in one run: labelled rows, in display order.
#[derive(Debug, Clone, Default)]
struct Outcome {
    rows: Vec<(&'static str, String)>,
}

impl Outcome {
    fn row(&mut self, label: &'static str, value: impl Into<String>) {
        self.rows.push((label, value.into()));
    }
}

/// `just demo [--runtime containerd]`.
#[derive(Debug, clap::Parser)]
#[command(
    name = "holdfast-demo",
    about = "The three sidecar failures (startup, shutdown, Job) on a simulated node of 3 pods, \
             without and with the holdfast agent, side by side (needs root)"
)]
struct Cli {
    /// What runs the pods: `netns` (network namespaces, cgroups and processes made by hand) or
    /// `containerd` (real containers of a private containerd over the CRI, runc and the CNI
    /// bridge plugin; `just setup` installs them).
    #[arg(long, value_enum, default_value_t = RuntimeArg::Netns)]
    runtime: RuntimeArg,
    /// Run only this scenario (repeat for more; default: all three, in the order of the table).
    #[arg(long = "scenario", value_enum)]
    scenarios: Vec<Scenario>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum RuntimeArg {
    Netns,
    Containerd,
}

/// One run of all scenarios on a fresh node.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Column header.
    name: &'static str,
    /// Node name suffix (namespaces `hf-demo<tag><pid>-*`).
    tag: &'static str,
    /// Run `holdfast agent` on the node from before the pods start, with the mesh's drain
    /// duration set to each pod's grace period.
    holdfast: bool,
    runtime: Runtime,
}

/// What a run produced.
struct RunResult {
    outcomes: Vec<(Scenario, Outcome)>,
    /// With holdfast: each pod's last row as the agent served it (a deleted pod's row goes
    /// when the pod does, so its drain record is kept from the last sample before that).
    status: Option<NodeStatus>,
    /// With holdfast: what `holdfast status default/flusher` printed on the node once every
    /// scenario was done (the pod is gone by then; its row stays on the board).
    flusher_timeline: Option<String>,
    took: Duration,
}

/// The shutdown pod's timeline, from the real `holdfast status POD` against the node's agent.
fn pod_timeline(url: &AgentUrl, pod: &str) -> anyhow::Result<String> {
    let out = std::process::Command::new(holdfast_binary()?)
        .args(["status", pod, "--agent", &url.to_string()])
        .output()
        .context("running holdfast status")?;
    if !out.status.success() {
        bail!(
            "holdfast status {pod} exited {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// The app's exit, as recorded by the app itself, to now.
fn since_app_exit(rep: &AppReport) -> Duration {
    Duration::from_millis(now_ms().saturating_sub(rep.exited_at_ms().unwrap_or_else(now_ms)))
}

/// Startup: the app's boot calls, and whether it crashed.
fn startup(node: &SimNode, deadline: Instant) -> anyhow::Result<Outcome> {
    let pod = Scenario::Startup.pod();
    let left = || deadline.saturating_duration_since(Instant::now());
    // The app exits at its first failed call; otherwise it makes all 3.
    node.wait_report(pod, left(), "the boot calls", |r| {
        let c = r.calls(Phase::Startup);
        c.failed >= 1 || c.ok >= 3
    })?;
    let rep = node.report(pod)?;
    let c = rep.calls(Phase::Startup);
    if c.failed > 0 {
        // Let the kubelet stand-in record the crash.
        let _ = node.wait_app_exited(pod, Duration::from_secs(3).min(left()));
    }
    let view = node.pod(pod);
    let mut o = Outcome::default();
    o.row("boot calls ok", format!("{} of 3", c.ok));
    o.row(
        "boot calls refused",
        c.errors(CallError::ConnectionRefused).to_string(),
    );
    o.row(
        "app",
        match view
            .as_ref()
            .and_then(|v| v.app().and_then(|c| c.exit_code()))
        {
            Some(0) => "exited 0".to_string(),
            Some(code) => format!("CRASHED (exit {code})"),
            None => "running".to_string(),
        },
    );
    Ok(o)
}

/// Shutdown: delete the pod once its app reached the remote service through Envoy; count the
/// app's calls after SIGTERM and time the pod's removal.
fn shutdown(node: &SimNode, deadline: Instant) -> anyhow::Result<Outcome> {
    let pod = Scenario::Shutdown.pod();
    let left = || deadline.saturating_duration_since(Instant::now());
    node.wait_report(pod, left(), "a successful call", |r| {
        r.calls(Phase::Running).ok > 0
    })?;
    let deleted_at = Instant::now();
    node.delete_pod(pod)?;
    let gone = node
        .wait_gone(pod, left())
        .ok()
        .map(|_| deleted_at.elapsed());
    let rep = node.report(pod)?;
    let after = rep.calls(Phase::AfterSigterm);
    let mut o = Outcome::default();
    o.row("calls after SIGTERM ok", after.ok.to_string());
    o.row(
        "calls after SIGTERM failed",
        match rep.first_failure_after_sigterm() {
            Some(first) => format!("{} (first at {})", after.failed, secs(first)),
            None => after.failed.to_string(),
        },
    );
    o.row(
        "pod gone after",
        match gone {
            Some(d) => secs(d),
            None => "not gone".into(),
        },
    );
    Ok(o)
}

/// Job: does the pod complete once its app is done?
fn job(node: &SimNode, deadline: Instant) -> anyhow::Result<Outcome> {
    let pod = Scenario::Job.pod();
    let left = || deadline.saturating_duration_since(Instant::now());
    let exited = node.wait_app_exited(pod, left()).is_ok();
    let rep = node.report(pod)?;
    let done = exited
        && node
            .wait_for(
                pod,
                JOB_PATIENCE
                    .saturating_sub(since_app_exit(&rep))
                    .min(left()),
                "completed",
                |p| matches!(p.phase(), PodPhase::Succeeded | PodPhase::Failed),
            )
            .is_ok();
    // Taken now: when the pod completed, or when we gave up.
    let waited = since_app_exit(&rep);
    let view = node.pod(pod);
    let mut o = Outcome::default();
    o.row(
        "app exit code",
        match rep.exit_codes().first() {
            Some(c) => c.to_string(),
            None => "-".into(),
        },
    );
    o.row(
        "pod completed after app",
        if done {
            secs(waited)
        } else if exited {
            format!("NEVER (gave up at {})", secs(waited))
        } else {
            "app did not finish".into()
        },
    );
    o.row(
        "proxy",
        match view.as_ref().and_then(|v| v.proxy()) {
            Some(c) if c.is_running() => "STILL RUNNING".to_string(),
            Some(c) => format!("exited ({})", c.exit_code().unwrap_or(-1)),
            None => "-".into(),
        },
    );
    Ok(o)
}

/// The agent on `node`, with its status API on a free local port. The node SIGKILLs it (by
/// pid) at teardown.
fn start_agent(node: &mut SimNode) -> anyhow::Result<AgentUrl> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free port for the agent's status API")?
        .port();
    let log_path = node.work_dir().join("agent.log");
    let log = File::create(&log_path)
        .with_context(|| format!("creating the agent log {}", log_path.display()))?;
    let mut cmd = node.agent_command(&holdfast_binary()?);
    cmd.arg("--status-listen")
        .arg(format!("127.0.0.1:{port}"))
        .env("HOLDFAST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    node.spawn_host_process(cmd)?;
    let url = AgentUrl::parse(&format!("http://127.0.0.1:{port}"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match status_cli::fetch_status(&url, Duration::from_secs(1)) {
            Ok(_) => return Ok(url),
            Err(e) if Instant::now() >= deadline => {
                let text = std::fs::read_to_string(&log_path).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                bail!(
                    "the holdfast agent did not come up within 10 s: {e}\nagent log ({}):\n{}",
                    log_path.display(),
                    tail.join("\n")
                );
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Every pod's last row seen while sampling the agent's `/status`.
#[derive(Default)]
struct StatusSamples {
    last: Option<NodeStatus>,
    rows: BTreeMap<(String, String), PodStatus>,
}

impl StatusSamples {
    fn add(&mut self, s: NodeStatus) {
        for p in &s.pods {
            self.rows
                .insert((p.namespace.clone(), p.name.clone()), p.clone());
        }
        self.last = Some(s);
    }

    fn merged(self) -> Option<NodeStatus> {
        let last = self.last?;
        Some(NodeStatus {
            pods: self.rows.into_values().collect(),
            ..last
        })
    }
}

fn run(r: Run, scenarios: &[Scenario]) -> anyhow::Result<RunResult> {
    let started = Instant::now();
    let opts = NodeOptions {
        runtime: r.runtime,
        ..NodeOptions::default()
    };
    let mut node = SimNode::with_options(
        &format!("demo{}{}", r.tag, std::process::id() % 10000),
        opts,
    )
    .context("building the simulated node")?;
    for &s in scenarios {
        let mut spec = s.spec();
        if r.holdfast {
            // holdfast's mesh config: terminationDrainDuration = terminationGracePeriodSeconds.
            let grace = spec.grace;
            spec = spec.drain(grace);
        }
        node.add_pod(spec)?;
    }
    let agent = if r.holdfast {
        Some(start_agent(&mut node)?)
    } else {
        None
    };
    let deadline = Instant::now() + RUN_BUDGET;
    node.start_pods()?;

    let samples = Mutex::new(StatusSamples::default());
    let stop = AtomicBool::new(false);
    let node_ref = &node;
    let outcomes = std::thread::scope(|scope| {
        if let Some(url) = &agent {
            let (samples, stop) = (&samples, &stop);
            scope.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(s) = status_cli::fetch_status(url, Duration::from_secs(1)) {
                        samples.lock().unwrap_or_else(|e| e.into_inner()).add(s);
                    }
                    std::thread::sleep(STATUS_POLL);
                }
            });
        }
        let threads: Vec<_> = scenarios
            .iter()
            .map(|&s| {
                let check = match s {
                    Scenario::Startup => startup,
                    Scenario::Shutdown => shutdown,
                    Scenario::Job => job,
                };
                (s, scope.spawn(move || check(node_ref, deadline)))
            })
            .collect();
        let mut outcomes = Vec::new();
        let mut first_err = None;
        for (s, t) in threads {
            match t.join() {
                Ok(Ok(o)) => outcomes.push((s, o)),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e.context(format!("scenario {:?}", s.pod())));
                }
                Err(_) => {
                    first_err.get_or_insert(anyhow::anyhow!("scenario {:?} panicked", s.pod()));
                }
            }
        }
        // One last sample, so the table shows the end state, and the shutdown pod's timeline
        // while the agent still runs.
        let mut timeline = None;
        if let Some(url) = &agent {
            if let Ok(s) = status_cli::fetch_status(url, Duration::from_secs(1)) {
                samples.lock().unwrap_or_else(|e| e.into_inner()).add(s);
            }
        }
        if let Some(url) = agent
            .as_ref()
            .filter(|_| scenarios.contains(&Scenario::Shutdown))
        {
            timeline = Some(
                pod_timeline(url, &format!("default/{}", Scenario::Shutdown.pod()))
                    .unwrap_or_else(|e| format!("{e:#}\n")),
            );
        }
        stop.store(true, Ordering::Relaxed);
        match first_err {
            Some(e) => Err(e),
            None => Ok((outcomes, timeline)),
        }
    });
    let left_over = node.finish();
    let (outcomes, flusher_timeline) = outcomes?;
    anyhow::ensure!(left_over.is_empty(), "the demo node left {left_over:?}");
    Ok(RunResult {
        outcomes,
        status: samples
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .merged(),
        flusher_timeline,
        took: started.elapsed(),
    })
}

/// Renders scenarios × runs: a label column, then one value column per run (≤ 80 columns for
/// up to two runs).
fn render(runs: &[(&str, &[(Scenario, Outcome)])]) -> String {
    const LABEL: usize = 28;
    const VALUE: usize = 24;
    let mut out = format!("{:LABEL$}", "");
    for (name, _) in runs {
        out.push_str(&format!("  {name:VALUE$}"));
    }
    out = out.trim_end().to_string();
    out.push('\n');
    out.push_str(&"-".repeat(LABEL + runs.len() * (VALUE + 2)));
    out.push('\n');
    let shown = Scenario::ALL.into_iter().filter(|s| {
        runs.iter()
            .any(|(_, o)| o.iter().any(|(run_s, _)| run_s == s))
    });
    for s in shown {
        out.push_str(s.title());
        out.push('\n');
        let first = runs
            .first()
            .and_then(|(_, o)| o.iter().find(|(sc, _)| *sc == s))
            .map(|(_, o)| o.rows.clone())
            .unwrap_or_default();
        for (label, _) in first {
            let mut line = format!("  {label:w$}", w = LABEL - 2);
            for (_, outcomes) in runs {
                let v = outcomes
                    .iter()
                    .find(|(sc, _)| *sc == s)
                    .and_then(|(_, o)| o.rows.iter().find(|(l, _)| *l == label))
                    .map(|(_, v)| v.as_str())
                    .unwrap_or("-");
                line.push_str(&format!("  {:VALUE$}", status_cli::fit_end(v, VALUE)));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out
}

/// Errors end the demo with one line (the cause chain joined), never a backtrace: what a
/// newcomer sees first names the path, the uid or the command to fix.
fn main() {
    let cli = <Cli as clap::Parser>::parse();
    if !privileged("holdfast-demo") {
        std::process::exit(1);
    }
    if let Err(e) = demo(cli) {
        eprintln!("holdfast-demo: {e:#}");
        std::process::exit(1);
    }
}

fn demo(cli: Cli) -> anyhow::Result<()> {
    // Fail before starting a pod if a binary is missing or a pod's uid cannot reach it.
    holdfast_binary()?;
    let sim_app = holdfast_tests::sim::sim_app_binary()?;
    let envoy = holdfast_tests::envoy::envoy_binary()?;
    let filter = holdfast_tests::envoy::filter_wasm().ok();
    holdfast_tests::sim::reach::pod_files(
        &sim_app,
        &envoy,
        filter.as_deref(),
        &std::env::temp_dir(),
    )?;
    let started = Instant::now();
    let (runtime, pods) = match cli.runtime {
        RuntimeArg::Netns => (Runtime::Netns, "real Envoy, iptables, netns"),
        RuntimeArg::Containerd => (Runtime::Containerd, "containerd, runc, CNI"),
    };
    let runs = [
        Run {
            name: "without holdfast",
            tag: "a",
            holdfast: false,
            runtime,
        },
        Run {
            name: "with holdfast",
            tag: "b",
            holdfast: true,
            runtime,
        },
    ];
    let scenarios = if cli.scenarios.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        Scenario::ALL
            .into_iter()
            .filter(|s| cli.scenarios.contains(s))
            .collect()
    };
    println!(
        "A simulated node ({pods}), {} started at once, twice:\n\
         without holdfast (Istio defaults: drain 5 s), then with `holdfast agent` on the\n\
         node (drain duration = grace period; the agent ends Envoy when the app is done).\n",
        match scenarios.len() {
            1 => "1 pod".to_string(),
            n => format!("{n} pods"),
        }
    );
    let mut results = Vec::new();
    for r in runs {
        println!("  running {}...", r.name);
        let res = run(r, &scenarios).with_context(|| format!("run {:?}", r.name))?;
        println!("  {} done in {}", r.name, secs(res.took));
        results.push((r.name, res));
    }
    println!();
    let table: Vec<(&str, &[(Scenario, Outcome)])> = results
        .iter()
        .map(|(n, r)| (*n, r.outcomes.as_slice()))
        .collect();
    print!("{}", render(&table));
    println!("\n(total {})", secs(started.elapsed()));
    if let Some(status) = results.iter().find_map(|(_, r)| r.status.as_ref()) {
        println!(
            "\n$ holdfast status    # the node with holdfast; deleted pods: last row served\n"
        );
        print!("{}", status_cli::render_table(status, SystemTime::now()));
    }
    if let Some(timeline) = results
        .iter()
        .find_map(|(_, r)| r.flusher_timeline.as_ref())
    {
        println!(
            "\n$ holdfast status default/{}    # one pod's steps, first sight to the proxy's quit\n",
            Scenario::Shutdown.pod()
        );
        print!("{timeline}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_fits_80_columns_with_two_runs() {
        let mut o = Outcome::default();
        o.row("calls after SIGTERM failed", "14 (first at 5.2 s)");
        o.row(
            "pod completed after app",
            "NEVER (gave up at 8.0 s), and more",
        );
        let outcomes: Vec<(Scenario, Outcome)> =
            Scenario::ALL.iter().map(|s| (*s, o.clone())).collect();
        let t = render(&[
            ("without holdfast", &outcomes),
            ("with holdfast", &outcomes),
        ]);
        assert!(t.lines().all(|l| l.chars().count() <= 80), "{t}");
        assert!(t.contains("14 (first at 5.2 s)"));
        assert!(t.contains("NEVER (gave up at 8.0..."), "{t}");
    }
}
