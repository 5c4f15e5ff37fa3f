//! The `meshes` benchmark section (issue 31; docs/benchmarks.md, "Meshes"): each mesh's
//! sidecar alone beside the same pods with holdfast, in one run.
//!
//! Two simulated nodes, side by side ([`side_by_side`]): **holdfast** (the real agent) and
//! **mesh alone** (no agent). On each, for every mesh — Istio classic, Kuma classic with the TCP
//! admin (Kuma 2.13's default), Kuma classic with the Unix-socket admin (2.14's default admin),
//! both with Kuma's builtin DNS on (its default: kuma-init's UDP DNS redirect, kuma-dp's
//! UDP-only DNS proxy `DNS_LATE` after the container starts), Consul classic — three pods as
//! that mesh's injector writes them ([`crate::sim::Mesh`]):
//!
//! - **boot** (`<m>-b`): the app (Kuma's: after looking the remote up by name) calls 3 times at
//!   start while Envoy is `PROXY_LATE` late — counted: boot lookups failed, boot calls refused,
//!   the app's starts;
//! - **stop** (`<m>-s`): the app keeps calling `AFTER_SIGTERM` after SIGTERM; the pod is
//!   deleted — counted: calls failed after SIGTERM, and deletion → every container ended (the
//!   simulated kubelet's `finishedAt`, so the runtime's sandbox teardown is not in it). The
//!   mesh's own wait: Istio's `terminationDrainDuration` 5 s (its default) alone, = the grace
//!   period with holdfast (the shipped mesh config); Kuma's `drainTime` and Consul's shutdown
//!   grace `MESH_WAIT` (their defaults) on both nodes;
//! - **job** (`<m>-j`): a Job whose app calls once and exits — counted: app exit → pod
//!   `Succeeded`, or "never" when it is still running `JOB_WAIT` later.
//!
//! Not in this section: the restart window of native sidecars (meshes_native.rs proves the
//! Kuma case); Istio's figures at scale (the `drain` and `hold` sections).

use std::time::{Duration, Instant, SystemTime};

use anyhow::{ensure, Context as _, Result};

pub use crate::bench_opts::SimBenchOpts;

use super::{load_average, side_by_side, Side};
use crate::sim::pod_object::CState;
use crate::sim::{AppScript, KumaAdmin, Mesh, NodeOptions, Phase, PodPhase, PodSpec, PodView};

/// How late Envoy is at boot (the boot pods).
const PROXY_LATE: Duration = Duration::from_secs(2);
/// How late kuma-dp's DNS proxy binds (it starts with kuma-dp's other components).
const DNS_LATE: Duration = Duration::from_millis(500);
/// How long the stop pods' app keeps calling after SIGTERM.
const AFTER_SIGTERM: Duration = Duration::from_secs(2);
/// Kuma's `drainTime` and consul-dataplane's shutdown grace: both default to 30 s.
const MESH_WAIT: Duration = Duration::from_secs(30);
/// Every pod's grace period (longer than the mesh's wait, so the wait, not the kill, shows).
const GRACE: Duration = Duration::from_secs(45);
/// How long after the Job's app exits its pod may take to be `Succeeded` before it counts as never.
const JOB_WAIT: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Holdfast,
    Alone,
}

impl Side for Variant {
    const HOLDFAST: Variant = Variant::Holdfast;

    fn label(self) -> &'static str {
        match self {
            Variant::Holdfast => "with holdfast",
            Variant::Alone => "mesh alone",
        }
    }

    fn node_name(self) -> &'static str {
        match self {
            Variant::Holdfast => "bmhf",
            Variant::Alone => "bmalone",
        }
    }
}

/// One mesh as this section runs it.
#[derive(Debug, Clone, Copy)]
struct Case {
    label: &'static str,
    prefix: &'static str,
    mesh: Mesh,
    /// Kuma's builtin DNS on (its default install).
    builtin_dns: bool,
}

const CASES: [Case; 4] = [
    Case {
        label: "Istio classic",
        prefix: "is",
        mesh: Mesh::Istio,
        builtin_dns: false,
    },
    Case {
        label: "Kuma classic, TCP admin, builtin DNS (2.13's default)",
        prefix: "kt",
        mesh: Mesh::Kuma(KumaAdmin::Tcp),
        builtin_dns: true,
    },
    Case {
        label: "Kuma classic, Unix-socket admin, builtin DNS (2.14 classic)",
        prefix: "ku",
        mesh: Mesh::Kuma(KumaAdmin::UnixSocket),
        builtin_dns: true,
    },
    Case {
        label: "Consul classic",
        prefix: "co",
        mesh: Mesh::Consul,
        builtin_dns: false,
    },
];

impl Case {
    fn name(&self, pod: char) -> String {
        format!("{}-{pod}", self.prefix)
    }

    /// The mesh's own wait on shutdown, per variant.
    fn with_wait(&self, spec: PodSpec, v: Variant) -> PodSpec {
        match (self.mesh, v) {
            // The shipped mesh config: drain = grace, the agent ends Envoy on evidence.
            (Mesh::Istio, Variant::Holdfast) => spec.drain(GRACE),
            // Istio's default terminationDrainDuration.
            (Mesh::Istio, Variant::Alone) => spec.drain(Duration::from_secs(5)),
            (_, _) => spec.mesh_drain(MESH_WAIT),
        }
    }

    fn pods(&self, v: Variant) -> Vec<PodSpec> {
        let base = |pod| {
            let spec = PodSpec::new(&self.name(pod))
                .mesh(self.mesh)
                .grace(GRACE)
                .call_timeout(PROXY_LATE + Duration::from_secs(20));
            if self.builtin_dns {
                spec.dns_capture(DNS_LATE)
            } else {
                spec
            }
        };
        vec![
            base('b')
                .app(AppScript::CallAtStart { calls: 3 })
                .lookup_remote(self.builtin_dns)
                .proxy_delay(PROXY_LATE),
            self.with_wait(base('s'), v)
                .app(AppScript::CallThroughShutdown {
                    every: Duration::from_millis(200),
                    pool: 2,
                    after_sigterm: AFTER_SIGTERM,
                }),
            base('j')
                .job()
                .app(AppScript::Batch {
                    calls: 1,
                    exit_code: 0,
                })
                .app_init(Duration::from_secs(1)),
        ]
    }
}

/// A stop pod's end: its last view and deletion → gone.
type Ended = Result<(PodView, Duration)>;

/// One mesh's figures on one node.
#[derive(Debug, Clone, Default)]
struct Sample {
    boot_lookups_failed: u32,
    boot_lookups: u32,
    boot_starts: u32,
    boot_refused: u32,
    boot_calls: u32,
    stop_failed: u32,
    stop_ok: u32,
    /// Deletion → the pod's last container ended (ms).
    stop_ended_ms: Option<f64>,
    /// Deletion → the pod gone from the node (ms).
    stop_gone_ms: Option<f64>,
    /// App exit → pod `Succeeded` (ms); `None`: not within [`JOB_WAIT`].
    job_done_ms: Option<f64>,
}

/// Runs the section and prints its table.
pub fn run(opts: &SimBenchOpts) -> Result<()> {
    ensure!(
        nix::unistd::geteuid().is_root(),
        "the meshes section needs root (network namespaces, iptables): run it with sudo"
    );
    let load_before = load_average();
    let started = Instant::now();
    let node_opts = NodeOptions {
        sim_app: Some(opts.sim_app.clone()),
        ..NodeOptions::default()
    };
    let variants = [Variant::Holdfast, Variant::Alone];
    eprintln!(
        "meshes: {} meshes x 3 pods per variant; agent {}",
        CASES.len(),
        opts.holdfast.display()
    );
    let (nodes, agent) = side_by_side(&variants, &node_opts, |v| {
        CASES.iter().flat_map(|c| c.pods(v)).collect()
    })?;
    let mut samples: Vec<(Variant, Case, Sample)> = Vec::new();
    for (v, _) in &nodes {
        for c in CASES {
            samples.push((*v, c, Sample::default()));
        }
    }
    let sample = |samples: &mut Vec<(Variant, Case, Sample)>, v: Variant, c: &Case| -> usize {
        samples
            .iter()
            .position(|(sv, sc, _)| *sv == v && sc.prefix == c.prefix)
            .expect("a sample per variant and mesh")
    };

    // Boot: every boot pod's three calls, whatever their outcome.
    for (v, node) in &nodes {
        for c in &CASES {
            let name = c.name('b');
            let r = node
                .wait_report(&name, Duration::from_secs(60), "3 boot calls", |r| {
                    let s = r.calls(Phase::Startup);
                    s.ok + s.failed >= 3
                })
                .with_context(|| format!("{}: {name}", v.label()))?;
            let s = r.calls(Phase::Startup);
            let i = sample(&mut samples, *v, c);
            samples[i].2.boot_refused = s.failed;
            samples[i].2.boot_calls = s.ok + s.failed;
            let lookups = r.lookups();
            samples[i].2.boot_lookups = lookups.len() as u32;
            samples[i].2.boot_lookups_failed = lookups.iter().filter(|l| !l.0).count() as u32;
            samples[i].2.boot_starts = r.starts() as u32;
        }
    }
    // Jobs: app exit → Succeeded.
    for (v, node) in &nodes {
        for c in &CASES {
            let name = c.name('j');
            node.wait_app_exited(&name, Duration::from_secs(60))
                .with_context(|| format!("{}: {name}'s app never exited", v.label()))?;
            let exited = Instant::now();
            let done = node.wait_phase(&name, PodPhase::Succeeded, JOB_WAIT).ok();
            let i = sample(&mut samples, *v, c);
            samples[i].2.job_done_ms = done.as_ref().map(|d| {
                app_exit_to_last_exit_ms(d).unwrap_or(exited.elapsed().as_secs_f64() * 1e3)
            });
            if done.is_none() {
                eprintln!(
                    "meshes: {} {name} not Succeeded {JOB_WAIT:?} after its app: {:?}",
                    v.label(),
                    node.phase(&name)
                );
            }
        }
    }
    // Stop: every stop pod calling, then all deleted at once.
    for (v, node) in &nodes {
        for c in &CASES {
            let name = c.name('s');
            node.wait_report(&name, Duration::from_secs(60), "calling", |r| {
                r.calls(Phase::Running).ok >= 3
            })
            .with_context(|| format!("{}: {name} never called out", v.label()))?;
        }
    }
    let (t, deleted) = (Instant::now(), SystemTime::now());
    for (_, node) in &nodes {
        for c in &CASES {
            node.delete_pod(&c.name('s'))?;
        }
    }
    // Each pod waited for on a thread of its own, so one pod's 30 s wait is not counted
    // against the pods looked at after it.
    let ended: Vec<(Variant, Case, Ended)> = std::thread::scope(|s| {
        let waits: Vec<_> = nodes
            .iter()
            .flat_map(|(v, node)| CASES.iter().map(move |c| (*v, node, *c)))
            .map(|(v, node, c)| {
                let h = s.spawn(move || {
                    let name = c.name('s');
                    let view = node
                        .wait_gone(&name, GRACE + Duration::from_secs(15))
                        .with_context(|| format!("{}: {name} did not end", v.label()))?;
                    Ok((view, t.elapsed()))
                });
                (v, c, h)
            })
            .collect();
        waits
            .into_iter()
            .map(|(v, c, h)| {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a wait thread panicked")));
                (v, c, r)
            })
            .collect()
    });
    for (v, c, r) in ended {
        let (view, gone) = r?;
        let node = &nodes.iter().find(|(nv, _)| *nv == v).expect("its node").1;
        let r = node.report(&c.name('s'))?;
        let after = r.calls(Phase::AfterSigterm);
        let i = sample(&mut samples, v, &c);
        let s = &mut samples[i].2;
        s.stop_failed = after.failed;
        s.stop_ok = after.ok;
        s.stop_gone_ms = Some(gone.as_secs_f64() * 1e3);
        s.stop_ended_ms = last_exit_ms(&view).map(|l| l - ms_since_epoch(deleted));
    }
    for (_, node) in &nodes {
        for c in &CASES {
            for pod in ['b', 'j'] {
                node.delete_pod(&c.name(pod))?;
            }
        }
    }
    for (_, node) in &nodes {
        for c in &CASES {
            for pod in ['b', 'j'] {
                node.wait_gone(&c.name(pod), GRACE + Duration::from_secs(15))?;
            }
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
    let note = format!(
        "load average before/after: {load_before} / {}; section took {:.0} s",
        load_average(),
        started.elapsed().as_secs_f64()
    );
    print_table(&samples, &note);
    Ok(())
}

fn ms_since_epoch(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
        * 1e3
}

fn exited_ms(state: &CState) -> Option<f64> {
    match state {
        CState::Terminated(t) => Some(t.finished_at.as_millisecond() as f64),
        _ => None,
    }
}

/// When the pod's last container (app or proxy) ended, in ms since the epoch.
fn last_exit_ms(view: &PodView) -> Option<f64> {
    let app = view.app().and_then(|c| exited_ms(&c.state))?;
    let proxy = view.proxy().and_then(|c| exited_ms(&c.state))?;
    Some(app.max(proxy))
}

/// App exit → the proxy's exit (what makes a Job's pod `Succeeded`), in ms.
fn app_exit_to_last_exit_ms(view: &PodView) -> Option<f64> {
    let app = view.app().and_then(|c| exited_ms(&c.state))?;
    Some(last_exit_ms(view)? - app)
}

fn print_table(samples: &[(Variant, Case, Sample)], note: &str) {
    println!();
    println!(
        "### Meshes: each mesh alone vs with holdfast (Envoy {} s late at boot; app calling {} s \
         past SIGTERM; Kuma drainTime / Consul shutdown grace {} s, Istio alone 5 s)",
        PROXY_LATE.as_secs(),
        AFTER_SIGTERM.as_secs(),
        MESH_WAIT.as_secs()
    );
    println!();
    println!(
        "| mesh | variant | boot lookups failed | boot calls refused | app starts | calls failed \
         after SIGTERM | deletion → containers ended, s | deletion → pod gone, s | Job: app exit \
         → Succeeded |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for c in &CASES {
        for v in [Variant::Alone, Variant::Holdfast] {
            let Some((_, _, s)) = samples
                .iter()
                .find(|(sv, sc, _)| *sv == v && sc.prefix == c.prefix)
            else {
                continue;
            };
            let secs = |ms: Option<f64>| ms.map_or("?".into(), |m| format!("{:.2}", m / 1e3));
            let job = s.job_done_ms.map_or_else(
                || format!("**never** (> {} s)", JOB_WAIT.as_secs()),
                |m| format!("{m:.0} ms"),
            );
            let lookups = if s.boot_lookups == 0 {
                "–".to_string()
            } else {
                format!("{} of {}", s.boot_lookups_failed, s.boot_lookups)
            };
            println!(
                "| {} | {} | {} | {} of {} | {} | {} of {} | {} | {} | {} |",
                c.label,
                v.label(),
                lookups,
                s.boot_refused,
                s.boot_calls,
                s.boot_starts,
                s.stop_failed,
                s.stop_failed + s.stop_ok,
                secs(s.stop_ended_ms),
                secs(s.stop_gone_ms),
                job
            );
        }
    }
    println!();
    println!("{note}");
}
