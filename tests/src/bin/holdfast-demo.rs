//! `just demo`: the three sidecar failures on a simulated node of 3 pods started at once, and
//! what each pod's app saw, as a table.
//!
//! The table has one value column per run ([`Run`]); today the only run is "without holdfast".
//! A run with the node agent is another `Run` whose `start_agent` hook starts `holdfast agent`
//! on the node before the pods start; its outcomes print as a second column.

use std::time::{Duration, Instant};

use anyhow::Context;
use holdfast_tests::sim::report::now_ms;
use holdfast_tests::sim::{privileged, AppScript, CallError, Phase, PodPhase, PodSpec, SimNode};

/// Upper bound of one run (the demo as a whole stays under a minute).
const RUN_BUDGET: Duration = Duration::from_secs(40);
/// How long the Job pod gets to complete after its app exits before we call it stuck.
const JOB_PATIENCE: Duration = Duration::from_secs(8);

/// The scenarios, one pod each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
            Scenario::Shutdown => "2. shutdown: app calls out 8 s after SIGTERM",
            Scenario::Job => "3. Job: batch app exits 0",
        }
    }

    fn spec(self) -> PodSpec {
        match self {
            Scenario::Startup => PodSpec::new(self.pod())
                .app(AppScript::CallAtStart { calls: 3 })
                .proxy_delay(Duration::from_secs(2)),
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

/// One run of all scenarios on a fresh node.
struct Run {
    /// Column header.
    name: &'static str,
    /// Called after the node is built and before the pods start (e.g. to start the agent).
    start_agent: Option<fn(&mut SimNode) -> anyhow::Result<()>>,
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

fn run(r: &Run) -> anyhow::Result<Vec<(Scenario, Outcome)>> {
    let mut node = SimNode::new(&format!("demo{}", std::process::id() % 10000))
        .context("building the simulated node")?;
    for s in Scenario::ALL {
        node.add_pod(s.spec())?;
    }
    if let Some(hook) = r.start_agent {
        hook(&mut node)?;
    }
    let t0 = Instant::now();
    node.start_pods()?;
    let left = |t0: Instant| RUN_BUDGET.saturating_sub(t0.elapsed());

    // Shutdown: delete the pod once it has reached the remote service through Envoy.
    let flusher = Scenario::Shutdown.pod();
    node.wait_report(flusher, left(t0), "a successful call", |r| {
        r.calls(Phase::Running).ok > 0
    })?;
    let deleted_at = Instant::now();
    node.delete_pod(flusher)?;

    // Startup: the app's boot calls.
    let mut startup = Outcome::default();
    let pod = Scenario::Startup.pod();
    let v = node.wait_app_exited(pod, left(t0)).ok();
    let rep = node.report(pod)?;
    let c = rep.calls(Phase::Startup);
    startup.row("boot calls ok", c.ok.to_string());
    startup.row(
        "boot calls refused",
        c.errors(CallError::ConnectionRefused).to_string(),
    );
    startup.row(
        "app",
        match v.as_ref().and_then(|v| v.app().and_then(|c| c.exit_code())) {
            Some(0) => "ran".to_string(),
            Some(code) => format!("crashed (exit {code})"),
            None => "still running".to_string(),
        },
    );

    // Job: does the pod complete once the app is done?
    let mut job = Outcome::default();
    let pod = Scenario::Job.pod();
    let exited = node.wait_app_exited(pod, left(t0));
    let rep = node.report(pod)?;
    // Measure from the app's own exit record, not from when this thread looked.
    let since_exit = |rep: &holdfast_tests::sim::AppReport| {
        Duration::from_millis(now_ms().saturating_sub(rep.exited_at_ms().unwrap_or_else(now_ms)))
    };
    job.row(
        "app exit code",
        match rep.exit_codes().first() {
            Some(c) => c.to_string(),
            None => "-".into(),
        },
    );
    let done = exited.is_ok()
        && node
            .wait_for(
                pod,
                JOB_PATIENCE.saturating_sub(since_exit(&rep)).min(left(t0)),
                "completed",
                |p| matches!(p.phase(), PodPhase::Succeeded | PodPhase::Failed),
            )
            .is_ok();
    let view = node.pod(pod);
    job.row(
        "pod completed",
        if done {
            format!("yes, {} after app", secs(since_exit(&rep)))
        } else {
            format!("NO, {} after app", secs(since_exit(&rep)))
        },
    );
    job.row(
        "proxy",
        match view.as_ref().and_then(|v| v.proxy()) {
            Some(c) if c.is_running() => "still running".to_string(),
            Some(c) => format!("exited ({})", c.exit_code().unwrap_or(-1)),
            None => "-".into(),
        },
    );

    // Shutdown results.
    let mut shutdown = Outcome::default();
    let gone = node.wait_gone(flusher, left(t0)).is_ok();
    let rep = node.report(flusher)?;
    let after = rep.calls(Phase::AfterSigterm);
    shutdown.row("calls after SIGTERM ok", after.ok.to_string());
    shutdown.row(
        "calls after SIGTERM failed",
        match rep.first_failure_after_sigterm() {
            Some(first) => format!("{} (first at {})", after.failed, secs(first)),
            None => after.failed.to_string(),
        },
    );
    shutdown.row(
        "pod gone after",
        if gone {
            secs(deleted_at.elapsed())
        } else {
            "not gone".into()
        },
    );

    let left_over = node.finish();
    anyhow::ensure!(left_over.is_empty(), "the demo node left {left_over:?}");
    Ok(vec![
        (Scenario::Startup, startup),
        (Scenario::Shutdown, shutdown),
        (Scenario::Job, job),
    ])
}

/// Renders scenarios × runs: a label column, then one value column per run (≤ 80 columns for
/// up to two runs).
fn render(runs: &[(&str, Vec<(Scenario, Outcome)>)]) -> String {
    const LABEL: usize = 28;
    const VALUE: usize = 22;
    let mut out = format!("{:LABEL$}", "");
    for (name, _) in runs {
        out.push_str(&format!("  {name:VALUE$}"));
    }
    out = out.trim_end().to_string();
    out.push('\n');
    out.push_str(&"-".repeat(LABEL + runs.len() * (VALUE + 2)));
    out.push('\n');
    for s in Scenario::ALL {
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
                line.push_str(&format!("  {v:VALUE$}"));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out
}

fn main() -> anyhow::Result<()> {
    if !privileged("holdfast-demo") {
        std::process::exit(1);
    }
    let started = Instant::now();
    let runs = [Run {
        name: "without holdfast",
        start_agent: None,
    }];
    println!("Simulated node, 3 pods started at once (real Envoy, iptables, netns)...\n");
    let mut results = Vec::new();
    for r in &runs {
        results.push((r.name, run(r).with_context(|| format!("run {:?}", r.name))?));
    }
    print!("{}", render(&results));
    println!("\n(total {})", secs(started.elapsed()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_fits_80_columns_with_two_runs() {
        let mut o = Outcome::default();
        o.row("calls after SIGTERM failed", "14 (first at 5.2 s)");
        let outcomes: Vec<(Scenario, Outcome)> =
            Scenario::ALL.iter().map(|s| (*s, o.clone())).collect();
        let t = render(&[
            ("without holdfast", outcomes.clone()),
            ("with holdfast", outcomes),
        ]);
        assert!(t.lines().all(|l| l.chars().count() <= 80), "{t}");
        assert!(t.contains("14 (first at 5.2 s)"));
    }
}
