//! The soak's plan: every lifecycle and every chaos step, drawn from the seed before anything
//! runs (pure, so the same seed gives the same plan for both variants and on every machine).

use std::time::Duration;

use super::rng::SplitMix64;
use crate::sim::{AppScript, PodSpec};

/// The grace period of every soak pod (`terminationGracePeriodSeconds`).
pub const GRACE: Duration = Duration::from_secs(10);
/// Istio's default `terminationDrainDuration`: the baseline's pods drain this long.
pub const ISTIO_DEFAULT_DRAIN: Duration = Duration::from_secs(5);
/// The apps' per-call timeout: long enough that a held call (Envoy up to 2 s late, or stopped
/// for up to 2 s) is not cut short; a refusal is never a timeout.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// A download pod's response (issue 28): 2 MiB, read by a slow client at [`DOWNLOAD_RATE`],
/// so about 2 s of it is still on its way when the pod is deleted.
pub const DOWNLOAD_BYTES: u64 = 2 * 1024 * 1024;
/// The download client's read rate, bytes per second (a thin link).
pub const DOWNLOAD_RATE: f64 = 1.0e6;
/// The port a download pod's app serves (through its sidecar's inbound listener).
pub const SERVE_PORT: u16 = 8080;
/// Envoy's `--drain-time-s` for shutdown callers: 3 s, so an agent restarted late in a long
/// drain meets a proxy whose inbound listener has closed (issue 28; Istio's default is 45 s).
pub const ENVOY_DRAIN_TIME: Duration = Duration::from_secs(3);

/// What a lifecycle's app does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Fetches its config at boot (1–3 calls, new connections; exits 1 if one fails), then idles.
    BootCaller,
    /// Calls every 150 ms over a pool of 2 while running and for a while after SIGTERM.
    ShutdownCaller,
    /// A Job: two calls (retried for 10 s), exit 0; the pod completes only if the proxy ends.
    Job,
    /// Serves a 2 MiB download; a slow client outside the pod starts it just before the pod is
    /// deleted, so the response is still on its way through the drain (issue 28).
    Download,
}

/// What happens to the pod's Envoy while the pod runs (Deployment-like pods only: a Job's
/// proxy is never restarted, `restartPolicy: Never`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvoyChaos {
    /// SIGKILL (as an OOM kill): pilot-agent exits with it, the kubelet restarts the container.
    Kill,
    /// SIGSTOP, then SIGCONT after this long (a frozen proxy: node pressure, a debugger).
    Stop(Duration),
}

/// How the kubelet restarts every container of a boot caller's pod while it runs (issue 28).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodRestart {
    /// The sandbox dies and is recreated: a new netns, every container with a new id.
    Sandbox,
    /// Kubernetes 1.36's in-place restart (KEP-5532): same sandbox and netns, istio-init again.
    InPlace,
}

/// One restart of a whole pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WholePodRestart {
    pub kind: PodRestart,
    /// This long into the run.
    pub at: Duration,
    /// How long after the new app the new proxy container starts (its app calls at boot).
    pub proxy_late: Duration,
}

/// How the agent is ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentEnd {
    /// As the node's OOM killer does: no cleanup.
    Sigkill,
    /// As a DaemonSet rolling update does: holds are left for the successor.
    Sigterm,
}

/// When in its lifecycle the agent is hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// Right after the pod is created: while its connections are held.
    Start,
    /// While it runs (or, for a Job, while its app runs: during the Job wait).
    Running,
    /// Right after it is deleted: during its drain.
    Deletion,
    /// 3–6 s after it is deleted: late in a long drain, after Envoy's drain time closed its
    /// inbound listener (the successor must adopt the drain all the same; issue 28).
    LateDrain,
}

/// One agent restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentChaos {
    pub moment: Moment,
    /// After the moment.
    pub delay: Duration,
    pub end: AgentEnd,
    /// How long until the successor starts (log-uniform, 10 ms … 3 s).
    pub gap: Duration,
}

/// One pod's whole life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifecycle {
    pub index: usize,
    pub kind: Kind,
    /// BootCaller: how many startup calls.
    pub boot_calls: u32,
    /// How late Envoy starts after its container (the xDS wait).
    pub proxy_delay: Duration,
    /// Job: how long the app works before its calls.
    pub app_init: Duration,
    /// How long the pod runs before it is deleted (from its app's first call).
    pub run_for: Duration,
    /// ShutdownCaller: calls after SIGTERM for this long (beyond Istio's default 5 s drain in
    /// about a quarter of the pods).
    pub after_sigterm: Duration,
    /// Envoy chaos this long into the run.
    pub envoy: Option<(Duration, EnvoyChaos)>,
    /// Boot callers: every container restarted (sandbox recreated or in place).
    pub restart: Option<WholePodRestart>,
    pub agent: Option<AgentChaos>,
}

impl Lifecycle {
    /// The pod's name: `l0042-boot`.
    pub fn pod_name(&self) -> String {
        let kind = match self.kind {
            Kind::BootCaller => "boot",
            Kind::ShutdownCaller => "call",
            Kind::Job => "job",
            Kind::Download => "dl",
        };
        format!("l{:04}-{kind}", self.index)
    }

    /// The pod, as the shipped mesh config runs it (`terminationDrainDuration` = grace) or, for
    /// the baseline, with Istio's default drain.
    pub fn spec(&self, drain: Duration) -> PodSpec {
        let app = match self.kind {
            Kind::BootCaller => AppScript::CallAtStart {
                calls: self.boot_calls,
            },
            Kind::ShutdownCaller => AppScript::CallThroughShutdown {
                every: Duration::from_millis(150),
                pool: 2,
                after_sigterm: self.after_sigterm,
            },
            Kind::Job => AppScript::Batch {
                calls: 2,
                exit_code: 0,
            },
            Kind::Download => AppScript::ServeDownload {
                bytes: DOWNLOAD_BYTES,
            },
        };
        let spec = PodSpec::new(&self.pod_name())
            .app(app)
            .proxy_delay(self.proxy_delay)
            .app_init(self.app_init)
            .grace(GRACE)
            .drain(drain)
            .call_timeout(CALL_TIMEOUT)
            .proxy_concurrency(1);
        match self.kind {
            Kind::Job => spec.job(),
            Kind::Download => spec.serve(SERVE_PORT),
            Kind::ShutdownCaller => spec.envoy_drain_time(ENVOY_DRAIN_TIME),
            Kind::BootCaller => spec,
        }
    }
}

/// How often things go wrong.
#[derive(Debug, Clone, Copy)]
pub struct ChaosRates {
    /// Share of lifecycles that restart the agent.
    pub agent: f64,
    /// Share of Deployment-like lifecycles whose Envoy is killed or stopped.
    pub envoy: f64,
    /// Share of boot callers whose pod is restarted whole (sandbox recreated or in place).
    pub restart: f64,
    /// The last share of lifecycles runs without agent restarts, so the final agent lives through
    /// many lifecycles (its fds, threads and RSS at the end mean something).
    pub quiet_tail: f64,
}

impl Default for ChaosRates {
    fn default() -> Self {
        ChaosRates {
            agent: 0.25,
            envoy: 0.3,
            restart: 0.3,
            quiet_tail: 0.2,
        }
    }
}

/// The plan of `n` lifecycles for `seed`.
pub fn plan(seed: u64, n: usize, rates: ChaosRates) -> Vec<Lifecycle> {
    let mut rng = SplitMix64::new(seed);
    let chaotic = n - (n as f64 * rates.quiet_tail).round() as usize;
    (0..n)
        .map(|index| {
            let kind = match rng.range(0, 10) {
                0..=3 => Kind::BootCaller,
                4..=6 => Kind::ShutdownCaller,
                7..=8 => Kind::Job,
                _ => Kind::Download,
            };
            let ms = |rng: &mut SplitMix64, lo, hi| Duration::from_millis(rng.range(lo, hi));
            let boot_calls = rng.range(1, 3) as u32;
            let proxy_delay = ms(&mut rng, 0, 2000);
            let app_init = if kind == Kind::Job {
                ms(&mut rng, 0, 1500)
            } else {
                Duration::ZERO
            };
            let run_for = ms(&mut rng, 1000, 4000);
            let after_sigterm = ms(&mut rng, 200, 6500);
            let envoy_roll = rng.chance(rates.envoy);
            let envoy_at = ms(&mut rng, 200, 900);
            let envoy_kind = if rng.chance(0.5) {
                EnvoyChaos::Kill
            } else {
                EnvoyChaos::Stop(ms(&mut rng, 200, 2000))
            };
            let restart_roll = rng.chance(rates.restart);
            let restart = WholePodRestart {
                kind: if rng.chance(0.5) {
                    PodRestart::Sandbox
                } else {
                    PodRestart::InPlace
                },
                at: ms(&mut rng, 200, 900),
                proxy_late: ms(&mut rng, 0, 2000),
            };
            let restart = (restart_roll && kind == Kind::BootCaller).then_some(restart);
            // A pod restarted whole has no Envoy chaos besides; a download has none either.
            let envoy = (envoy_roll
                && matches!(kind, Kind::BootCaller | Kind::ShutdownCaller)
                && restart.is_none())
            .then_some((envoy_at, envoy_kind));
            let agent_roll = rng.chance(rates.agent);
            let moment = match rng.range(0, 3) {
                0 => Moment::Start,
                1 => Moment::Running,
                2 => Moment::Deletion,
                _ => Moment::LateDrain,
            };
            let delay = if moment == Moment::LateDrain {
                ms(&mut rng, 3000, 6000)
            } else {
                ms(&mut rng, 0, 800)
            };
            let end = if rng.chance(0.5) {
                AgentEnd::Sigkill
            } else {
                AgentEnd::Sigterm
            };
            let gap = Duration::from_millis(rng.log_range(10, 3000));
            let agent = (agent_roll && index < chaotic).then_some(AgentChaos {
                moment,
                delay,
                end,
                gap,
            });
            Lifecycle {
                index,
                kind,
                boot_calls,
                proxy_delay,
                app_init,
                run_for,
                after_sigterm,
                envoy,
                restart,
                agent,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_plan_and_every_kind_of_chaos_appears() {
        let a = plan(7, 400, ChaosRates::default());
        assert_eq!(a, plan(7, 400, ChaosRates::default()));
        assert_ne!(a, plan(8, 400, ChaosRates::default()));
        let has = |f: &dyn Fn(&Lifecycle) -> bool| a.iter().any(f);
        for kind in [
            Kind::BootCaller,
            Kind::ShutdownCaller,
            Kind::Job,
            Kind::Download,
        ] {
            assert!(has(&|l| l.kind == kind), "{kind:?}");
        }
        for m in [
            Moment::Start,
            Moment::Running,
            Moment::Deletion,
            Moment::LateDrain,
        ] {
            assert!(has(&|l| l.agent.is_some_and(|c| c.moment == m)), "{m:?}");
        }
        for e in [AgentEnd::Sigkill, AgentEnd::Sigterm] {
            assert!(has(&|l| l.agent.is_some_and(|c| c.end == e)), "{e:?}");
        }
        assert!(has(&|l| matches!(l.envoy, Some((_, EnvoyChaos::Kill)))));
        assert!(has(&|l| matches!(l.envoy, Some((_, EnvoyChaos::Stop(_))))));
        for k in [PodRestart::Sandbox, PodRestart::InPlace] {
            assert!(has(&|l| l.restart.is_some_and(|r| r.kind == k)), "{k:?}");
        }
        // Jobs keep their proxy, downloads too; only boot callers restart whole, without Envoy
        // chaos besides; the quiet tail has no agent restarts.
        assert!(!has(
            &|l| matches!(l.kind, Kind::Job | Kind::Download) && l.envoy.is_some()
        ));
        assert!(!has(
            &|l| l.restart.is_some() && (l.kind != Kind::BootCaller || l.envoy.is_some())
        ));
        assert!(a[320..].iter().all(|l| l.agent.is_none()));
        for l in &a {
            if let Some(c) = l.agent {
                assert!((10..=3000).contains(&(c.gap.as_millis() as u64)));
            }
        }
    }

    #[test]
    fn specs_follow_the_lifecycle() {
        let l = plan(1, 50, ChaosRates::default())
            .into_iter()
            .find(|l| l.kind == Kind::Job)
            .expect("a job in 50");
        let spec = l.spec(GRACE);
        assert!(spec.job);
        assert_eq!(spec.name, l.pod_name());
        assert_eq!((spec.grace, spec.drain), (GRACE, GRACE));
    }
}
