//! Runs the plan's lifecycles on the simulated node, a few pods at a time: one poll loop moves
//! every live pod through its stages (start, run, Envoy chaos, deletion; for a Job, completion)
//! and fires the agent restarts the plan ties to those moments. What each pod went through is
//! kept as [`Facts`] for the tally.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::chaos::{signal_envoy, AgentSupervisor};
use super::plan::{
    AgentChaos, EnvoyChaos, Kind, Lifecycle, Moment, PodRestart, DOWNLOAD_RATE, GRACE, SERVE_PORT,
};
use crate::sim::download::{Download, DownloadClient};
use crate::sim::node::summary;
use crate::sim::report::now_us;
use crate::sim::{AppReport, PodPhase, PodView, SimNode};

/// How long a Job's pod may take to complete after its app exited before it counts as never
/// completing (the longest agent gap is 3 s; the successor needs a moment to adopt).
pub const JOB_COMPLETION_TIMEOUT: Duration = Duration::from_secs(8);
/// The longest a pod may take to start (its app's first call), or to go away once deleted
/// beyond its grace period, before the soak records it as stuck and moves on.
const STAGE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the loop looks at the pods.
const POLL: Duration = Duration::from_millis(50);
/// A hold rule or bound queue seen in a running pod is stale only when the agent has been up,
/// and the pod's Envoy untouched, for this long, and it is still there a second later.
const SETTLED: Duration = Duration::from_secs(3);

/// What one lifecycle went through.
#[derive(Debug, Clone)]
pub struct Facts {
    pub plan: Lifecycle,
    /// Wall clock, µs.
    pub deleted_us: Option<u64>,
    /// The Envoy chaos was applied (Envoy ran at its moment).
    pub envoy_chaos_done: bool,
    /// When it was applied (wall clock, µs).
    pub envoy_chaos_us: Option<u64>,
    /// The pod was restarted whole as planned (wall clock, µs).
    pub restarted_us: Option<u64>,
    /// What the download client saw (download pods that reached their deletion).
    pub download: Option<Download>,
    /// Job: the pod reached Succeeded within [`JOB_COMPLETION_TIMEOUT`] of its app's exit.
    pub job_completed: Option<bool>,
    /// A hold rule or a bound queue in the running pod while nothing excused it.
    pub stale_hold: Option<String>,
    /// A stage that timed out.
    pub stuck: Option<String>,
    /// The pod as the kubelet last saw it (after it was removed).
    pub view: Option<PodView>,
    /// The agent's last drain report for the pod, read from `/status` while it was deleted
    /// (what the agent says about a slow drain).
    pub drain: Option<holdfast::api::DrainReport>,
    /// What the app saw.
    pub report: AppReport,
}

enum Stage {
    /// Created; waiting for the app's first call (a Job: for its app to exit).
    Starting,
    Running {
        until: Instant,
    },
    Frozen {
        cont_at: Instant,
        until: Instant,
    },
    /// Every container restarted (sandbox recreated or in place): waiting for the new app's
    /// boot calls to have succeeded through the new Envoy.
    Restarting {
        ok_before: u32,
        until: Instant,
    },
    /// A download pod: the client started; waiting for its first bytes before the deletion.
    Downloading,
    /// Job: the app exited; waiting for the pod to complete.
    Completing {
        app_exited: Instant,
    },
    Deleting,
}

struct Live {
    facts: Facts,
    stage: Stage,
    since: Instant,
    envoy_at: Option<Instant>,
    /// After an Envoy kill: the proxy restart count to wait for before deleting.
    proxy_restarts: Option<u32>,
    envoy_touched: Option<Instant>,
    /// When the planned whole-pod restart is due.
    restart_at: Option<Instant>,
    download: Option<DownloadClient>,
}

/// Drives the lifecycles; `agent` is `None` for the baseline.
pub struct Driver<'a> {
    node: &'a mut SimNode,
    agent: Option<&'a AgentSupervisor>,
    drain: Duration,
    concurrency: usize,
    live: Vec<Live>,
    chaos_due: Vec<(Instant, AgentChaos)>,
    /// Agent restarts planned / fired / skipped because one was under way.
    pub restarts_fired: u32,
    pub restarts_skipped: u32,
}

impl<'a> Driver<'a> {
    pub fn new(
        node: &'a mut SimNode,
        agent: Option<&'a AgentSupervisor>,
        drain: Duration,
        concurrency: usize,
    ) -> Driver<'a> {
        Driver {
            node,
            agent,
            drain,
            concurrency: concurrency.max(1),
            live: Vec::new(),
            chaos_due: Vec::new(),
            restarts_fired: 0,
            restarts_skipped: 0,
        }
    }

    /// Runs every lifecycle; returns their facts in plan order.
    pub fn run(&mut self, plan: &[Lifecycle], label: &str) -> Vec<Facts> {
        let mut done: Vec<Facts> = Vec::with_capacity(plan.len());
        let mut next = 0;
        let started = Instant::now();
        while next < plan.len() || !self.live.is_empty() {
            while self.live.len() < self.concurrency && next < plan.len() {
                self.launch(&plan[next]);
                next += 1;
            }
            self.fire_agent_chaos();
            self.note_drain_reports();
            let mut i = 0;
            while i < self.live.len() {
                if self.step(i) {
                    let mut l = self.live.swap_remove(i);
                    if let Some(d) = l.download.take() {
                        l.facts.download = Some(d.finish());
                    }
                    let name = l.facts.plan.pod_name();
                    l.facts.view = self.node.pod(&name);
                    l.facts.report = self.node.report(&name).unwrap_or_default();
                    done.push(l.facts);
                    if done.len().is_multiple_of(50) {
                        eprintln!(
                            "soak {label}: {}/{} lifecycles in {:.0?}",
                            done.len(),
                            plan.len(),
                            started.elapsed()
                        );
                    }
                } else {
                    i += 1;
                }
            }
            std::thread::sleep(POLL);
        }
        done.sort_by_key(|f| f.plan.index);
        done
    }

    /// While pods are being deleted, one `/status` read keeps each one's latest drain report
    /// (a successor agent's, after an outage, replaces the one before).
    fn note_drain_reports(&mut self) {
        let Some(agent) = self.agent else { return };
        if !self.live.iter().any(|l| matches!(l.stage, Stage::Deleting)) {
            return;
        }
        let Some(status) = fetch_status(agent.status_addr) else {
            return;
        };
        for l in self
            .live
            .iter_mut()
            .filter(|l| matches!(l.stage, Stage::Deleting))
        {
            let name = l.facts.plan.pod_name();
            if let Some(d) = status
                .pods
                .iter()
                .find(|p| p.name == name)
                .and_then(|p| p.drain.clone())
            {
                l.facts.drain = Some(d);
            }
        }
    }

    fn launch(&mut self, plan: &Lifecycle) {
        let facts = Facts {
            plan: plan.clone(),
            deleted_us: None,
            envoy_chaos_done: false,
            envoy_chaos_us: None,
            restarted_us: None,
            download: None,
            job_completed: None,
            stale_hold: None,
            stuck: None,
            view: None,
            drain: None,
            report: AppReport::default(),
        };
        let mut live = Live {
            facts,
            stage: Stage::Starting,
            since: Instant::now(),
            envoy_at: None,
            proxy_restarts: None,
            envoy_touched: None,
            restart_at: None,
            download: None,
        };
        let added = self
            .node
            .add_pod(plan.spec(self.drain))
            .and_then(|()| self.node.start_pods());
        if let Err(e) = added {
            live.facts.stuck = Some(format!("cannot start: {e}"));
            live.stage = Stage::Deleting;
        }
        self.schedule(plan, Moment::Start);
        self.live.push(live);
    }

    fn schedule(&mut self, plan: &Lifecycle, moment: Moment) {
        if let (Some(_), Some(c)) = (self.agent, plan.agent) {
            if c.moment == moment {
                self.chaos_due.push((Instant::now() + c.delay, c));
            }
        }
    }

    fn fire_agent_chaos(&mut self) {
        let Some(agent) = self.agent else { return };
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = self.chaos_due.drain(..).partition(|(t, _)| *t <= now);
        self.chaos_due = later;
        for (_, c) in due {
            if agent.restart(c.end, c.gap) {
                self.restarts_fired += 1;
            } else {
                self.restarts_skipped += 1;
            }
        }
    }

    /// Moves pod `i` on; true when its lifecycle is over.
    fn step(&mut self, i: usize) -> bool {
        let now = Instant::now();
        let plan = self.live[i].facts.plan.clone();
        let name = plan.pod_name();
        let Some(view) = self.node.pod(&name) else {
            return true;
        };
        let l = &mut self.live[i];
        let timed_out = now.duration_since(l.since) > STAGE_TIMEOUT;
        match l.stage {
            Stage::Starting if plan.kind == Kind::Job => {
                if view.app().and_then(|c| c.exit_code()).is_some() {
                    l.stage = Stage::Completing { app_exited: now };
                } else if timed_out {
                    l.facts.stuck = Some(format!("job app never exited: {}", summary(&view)));
                    self.delete(i);
                } else if view.phase() == PodPhase::Running && l.envoy_at.is_none() {
                    // The Job's "running" moment: its proxy is up, its app works.
                    l.envoy_at = Some(now);
                    self.schedule(&plan, Moment::Running);
                }
            }
            Stage::Starting => {
                // Started = the app has called out and Envoy is LIVE. A pod deleted before its
                // Envoy ever started has no proxy for its shutdown calls (pilot-agent exits on
                // SIGTERM before starting Envoy): no agent can help there, so the soak does not
                // count it against one.
                // A download pod makes no call: its app serving is its start.
                let called = if plan.kind == Kind::Download {
                    view.app().is_some_and(|c| c.is_running())
                } else {
                    self.node
                        .report(&name)
                        .is_ok_and(|r| r.all_calls().ok + r.all_calls().failed > 0)
                };
                if called && envoy_live(self.node, &name) {
                    l.stage = Stage::Running {
                        until: now + plan.run_for,
                    };
                    l.envoy_at = plan.envoy.map(|(at, _)| now + at);
                    l.restart_at = plan.restart.map(|r| now + r.at);
                    self.schedule(&plan, Moment::Running);
                } else if timed_out {
                    l.facts.stuck = Some(format!("app never called: {}", summary(&view)));
                    self.delete(i);
                }
            }
            Stage::Running { until } => {
                if let (Some(at), Some((_, chaos))) = (l.envoy_at, plan.envoy) {
                    if now >= at {
                        l.envoy_at = None;
                        return self.envoy_chaos(i, chaos, until);
                    }
                }
                if let (Some(at), Some(r)) = (l.restart_at, plan.restart) {
                    if now >= at {
                        l.restart_at = None;
                        return self.restart_whole(i, r.kind, r.proxy_late, until);
                    }
                }
                if now < until {
                    return false;
                }
                if let Some(n) = l.proxy_restarts {
                    // Back means Envoy LIVE again, not just its container running: a pod deleted
                    // before its restarted Envoy started has no proxy at all (pilot-agent exits
                    // on SIGTERM before starting Envoy), which no agent can make up for.
                    let back = view
                        .proxy()
                        .is_some_and(|c| c.restart_count >= n && c.is_running())
                        && envoy_live(self.node, &name);
                    if !back && !timed_out {
                        return false;
                    }
                    if !back {
                        l.facts.stuck = Some(format!("proxy not restarted: {}", summary(&view)));
                    }
                }
                self.check_stale_hold(i);
                if plan.kind == Kind::Download {
                    self.start_download(i);
                } else {
                    self.delete(i);
                }
            }
            Stage::Downloading => {
                let begun = l.download.as_mut().is_none_or(DownloadClient::begun);
                if begun || timed_out {
                    if !begun {
                        l.facts.stuck = Some(format!("download never began: {}", summary(&view)));
                    }
                    self.delete(i);
                }
            }
            Stage::Restarting { ok_before, until } => {
                let ok = self.node.report(&name).map_or(0, |r| r.all_calls().ok);
                let booted = ok >= ok_before + plan.boot_calls
                    && view.app().is_some_and(|c| c.is_running())
                    && envoy_live(self.node, &name);
                if booted {
                    l.envoy_touched = Some(now);
                    l.stage = Stage::Running {
                        until: until.max(now + Duration::from_secs(1)),
                    };
                } else if timed_out {
                    l.facts.stuck = Some(format!(
                        "restarted pod never booted through its Envoy: {}",
                        summary(&view)
                    ));
                    self.delete(i);
                }
            }
            Stage::Frozen { cont_at, until } => {
                if now >= cont_at {
                    if l.facts.envoy_chaos_done {
                        signal_envoy(self.node, &name, Signal::SIGCONT);
                    }
                    l.envoy_touched = Some(now);
                    l.stage = Stage::Running {
                        until: until.max(now + Duration::from_secs(1)),
                    };
                }
            }
            Stage::Completing { app_exited } => {
                let phase = view.phase();
                if matches!(phase, PodPhase::Succeeded | PodPhase::Failed) {
                    l.facts.job_completed = Some(phase == PodPhase::Succeeded);
                    self.delete(i);
                } else if now.duration_since(app_exited) > JOB_COMPLETION_TIMEOUT {
                    l.facts.job_completed = Some(false);
                    self.delete(i);
                }
            }
            Stage::Deleting => {
                // A download pod's lifecycle ends when its client has too (the server's close,
                // or its read timeout).
                if view.gone && l.download.as_ref().is_none_or(DownloadClient::ended) {
                    if let Some(d) = l.download.take() {
                        l.facts.download = Some(d.finish());
                    }
                    return true;
                }
                if now.duration_since(l.since) > GRACE + STAGE_TIMEOUT {
                    l.facts.stuck = Some(format!("never went away: {}", summary(&view)));
                    return true;
                }
            }
        }
        false
    }

    /// Kills or freezes the pod's Envoy (if it runs), and stretches the run past it.
    fn envoy_chaos(&mut self, i: usize, chaos: EnvoyChaos, until: Instant) -> bool {
        let now = Instant::now();
        let name = self.live[i].facts.plan.pod_name();
        let restarts = self
            .node
            .pod(&name)
            .and_then(|v| v.proxy().map(|c| c.restart_count));
        let l = &mut self.live[i];
        match chaos {
            EnvoyChaos::Kill => {
                if signal_envoy(self.node, &name, Signal::SIGKILL).is_some() {
                    l.facts.envoy_chaos_done = true;
                    l.facts.envoy_chaos_us = Some(now_us());
                    l.proxy_restarts = restarts.map(|n| n + 1);
                }
                l.envoy_touched = Some(now);
                l.stage = Stage::Running {
                    until: until.max(now + Duration::from_secs(2)),
                };
            }
            EnvoyChaos::Stop(d) => {
                l.facts.envoy_chaos_done =
                    signal_envoy(self.node, &name, Signal::SIGSTOP).is_some();
                l.facts.envoy_chaos_us = l.facts.envoy_chaos_done.then(now_us);
                l.envoy_touched = Some(now);
                l.stage = Stage::Frozen {
                    cont_at: now + d,
                    until,
                };
            }
        }
        l.since = now;
        false
    }

    /// Restarts every container of pod `i` (its sandbox recreated, or in place), the new proxy
    /// `proxy_late` after the new app; the run goes on once the new app has booted.
    fn restart_whole(
        &mut self,
        i: usize,
        kind: PodRestart,
        proxy_late: Duration,
        until: Instant,
    ) -> bool {
        let now = Instant::now();
        let name = self.live[i].facts.plan.pod_name();
        let ok_before = self.node.report(&name).map_or(0, |r| r.all_calls().ok);
        let done = match kind {
            PodRestart::Sandbox => self.node.recreate_sandbox(&name, proxy_late),
            PodRestart::InPlace => self.node.restart_in_place(&name, proxy_late),
        };
        let l = &mut self.live[i];
        l.envoy_touched = Some(now);
        l.since = now;
        match done {
            Ok(()) => {
                l.facts.restarted_us = Some(now_us());
                l.stage = Stage::Restarting { ok_before, until };
            }
            Err(e) => {
                l.facts.stuck = Some(format!("cannot restart the pod ({kind:?}): {e}"));
                l.stage = Stage::Running { until };
            }
        }
        false
    }

    /// Starts pod `i`'s download client; the pod is deleted once the download has begun.
    fn start_download(&mut self, i: usize) {
        let name = self.live[i].facts.plan.pod_name();
        match DownloadClient::start(self.node, &name, SERVE_PORT, DOWNLOAD_RATE) {
            Ok(client) => {
                let l = &mut self.live[i];
                l.download = Some(client);
                l.stage = Stage::Downloading;
                l.since = Instant::now();
            }
            Err(e) => {
                self.live[i].facts.stuck = Some(format!("cannot start the download: {e}"));
                self.delete(i);
            }
        }
    }

    fn delete(&mut self, i: usize) {
        let plan = self.live[i].facts.plan.clone();
        let l = &mut self.live[i];
        l.stage = Stage::Deleting;
        l.since = Instant::now();
        if self.node.delete_pod(&plan.pod_name()).is_ok() {
            l.facts.deleted_us = Some(now_us());
        }
        self.schedule(&plan, Moment::Deletion);
        self.schedule(&plan, Moment::LateDrain);
    }

    /// With the agent up and settled and the pod's Envoy ready and untouched, no hold rule may
    /// be left in the pod and no queue bound (checked twice, a second apart).
    fn check_stale_hold(&mut self, i: usize) {
        let Some(agent) = self.agent else { return };
        let now = Instant::now();
        let settled_since = now.checked_sub(SETTLED);
        let agent_settled = !agent.restarting()
            && agent.outages().last().is_none_or(|o| {
                o.up_us
                    .is_some_and(|up| now_us().saturating_sub(up) > SETTLED.as_micros() as u64)
            });
        let l = &self.live[i];
        let envoy_settled = match (l.envoy_touched, settled_since) {
            (Some(t), Some(s)) => t < s,
            (None, _) => true,
            (Some(_), None) => false,
        };
        let name = l.facts.plan.pod_name();
        if !(agent_settled && envoy_settled && envoy_live(self.node, &name)) {
            return;
        }
        let first = hold_traces(self.node, &name);
        if first.is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_secs(1));
        let second = hold_traces(self.node, &name);
        if !second.is_empty() {
            self.live[i].facts.stale_hold = Some(second.join("; "));
        }
    }
}

/// Whether the pod's Envoy answers `/ready` with LIVE.
/// One `GET /status` from the agent at `addr` (loopback), parsed; `None` while it is down.
fn fetch_status(addr: std::net::SocketAddr) -> Option<holdfast::api::NodeStatus> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /status HTTP/1.1\r\nHost: holdfast\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    serde_json::from_str(body).ok()
}

fn envoy_live(node: &SimNode, pod: &str) -> bool {
    node.admin(pod, "GET", "/ready")
        .is_ok_and(|b| b.trim() == "LIVE")
}

/// Hold rules (`-j NFQUEUE`, IPv4 and IPv6) and bound NFQUEUE queues in the pod's netns.
pub fn hold_traces(node: &SimNode, pod: &str) -> Vec<String> {
    let found = node.in_pod_netns(pod, || {
        let mut traces = Vec::new();
        for tool in ["iptables-save", "ip6tables-save"] {
            let text = match std::process::Command::new(tool).output() {
                Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
                // A check that cannot run must not pass: it shows as a trace.
                Ok(o) => format!("{tool} -j NFQUEUE? failed: {}", o.status),
                Err(e) => format!("{tool} -j NFQUEUE? cannot run: {e}"),
            };
            for line in text.lines() {
                if line.contains("-j NFQUEUE") {
                    traces.push(format!("{tool}: {line}"));
                }
            }
        }
        // This thread's netns (not the process's): `thread-self`.
        let queues = std::fs::read_to_string("/proc/thread-self/net/netfilter/nfnetlink_queue");
        for line in queues.unwrap_or_default().lines() {
            traces.push(format!("queue bound: {line}"));
        }
        traces
    });
    found.unwrap_or_default()
}
