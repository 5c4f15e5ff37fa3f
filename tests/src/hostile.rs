//! The hostile-pod suite (issue 25): one honest pod beside one attacker at a time, on the
//! simulated node, with the agent's cost measured from outside (`/proc/<agent pid>/stat`,
//! `status`, `fd`) and the honest pod's figures read from its status row.
//!
//! A run ([`run`]) starts the agent, starts the attack ([`Scenario`]), then the honest pod (its
//! Envoy 1 s late, three calls at boot: held, released when Envoy is ready), waits out the
//! measuring window, deletes the honest pod (its drain: the app exits at SIGTERM) and then the
//! attacker, and reports [`Figures`]: the agent's CPU seconds in the window, its peak RSS and
//! fds, the honest pod's release latency and drain exit lag, the attacker's row. The same run
//! without an attacker ([`Scenario::None`]) is the baseline each attack is compared with.
//!
//! `tests/tests/hostile.rs` runs the short form in `just test` and asserts bounds and
//! correctness (never timing); `holdfast-soak --hostile` runs the long form and prints the
//! figures docs/benchmarks.md ("Hostile pods") records, optionally against a baseline agent
//! build.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use holdfast::api::PodStatus;

use crate::agent::AgentProcess;
use crate::sim::attacks::Attack;
use crate::sim::{AppScript, NodeOptions, Phase, PodSpec, SimNode};

/// What attacks the agent during a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// No attacker: the baseline.
    None,
    /// A pod whose "Envoy" listens on 15000/15001/15006, is never LIVE and answers every admin
    /// request with 4 MiB.
    FakeEnvoy,
    /// A pod that floods its own filter table (and adds a second jump to holdfast's chain).
    RuleFlood,
    /// A pod that sends forged NFQUEUE messages to the agent's queue socket.
    NetlinkForger,
    /// 70 keep-alive clients of the status API's public listener, one request every 4 s each,
    /// while a kubelet-style liveness probe asks once a second.
    SlotHolders,
    /// A pod forking as fast as it can, wrapping the node's pids around.
    PidWrapper,
    /// This many pod objects in a terminal phase (Failed: rejected by the kubelet).
    TerminalPods(u32),
    /// A pod whose annotations the agent reads carry text with a forged log line, C1 and bidi
    /// controls (8 KiB in `holdfast.io/hold-timeout`, 200 KiB in `holdfast.io/enabled`: the
    /// API server allows 256 KiB of annotations) and an 8 KB YAML alias bomb in
    /// `proxy.istio.io/config` (issue 29), parsed again on each of its updates.
    PodText,
    /// A pod whose app has [`MANY_PROCS`] processes (alive until the app exits) and takes its
    /// time to exit after SIGTERM, deleted with a [`ATTACKER_GRACE`] grace period before the
    /// window: the window is spent in its drain, which watches the app's processes (issue 29).
    ManyProcs,
    /// The same, its app also the pod's "Envoy": ready to the readiness check, and every other
    /// admin request (the drain's samples, `/server_info`, the quit) answered with ~1 MB.
    ManyProcsFakeEnvoy,
    /// `while :; do sleep 0.005; done` run in the pod's own istio-proxy container (as `kubectl
    /// exec` runs it) from before its Envoy is ready and through the window: ~200 process exits
    /// a second in the container the agent watches for the proxy's exit (issue 29).
    ExecLoop,
    /// The pod's `holdfast.io/enabled` annotation set to "false" and back to "true" every
    /// [`TOGGLE_EVERY`] through the window: each flip a Pod update that opts the pod out or in
    /// (issue 29: a toggle used to restart the pod's lifecycle, forget "left alone", count a
    /// failed-open pod again and, 300 s later, delete the live task's row).
    AnnotationToggle,
}

/// How often the [`Scenario::AnnotationToggle`] attacker flips its opt-out annotation.
pub const TOGGLE_EVERY: Duration = Duration::from_millis(100);

/// The processes of the [`Scenario::ManyProcs`] attacker's app (the issue's figure).
pub const MANY_PROCS: u32 = 2000;

/// The [`Scenario::ManyProcs`] attacker's grace period (`terminationGracePeriodSeconds`): long,
/// so only the app's own exit ends its drain.
pub const ATTACKER_GRACE: Duration = Duration::from_secs(60);

impl Scenario {
    pub fn name(self) -> String {
        match self {
            Scenario::None => "none".into(),
            Scenario::FakeEnvoy => "fake-envoy".into(),
            Scenario::RuleFlood => "rule-flood".into(),
            Scenario::NetlinkForger => "netlink-forger".into(),
            Scenario::SlotHolders => "slot-holders".into(),
            Scenario::PidWrapper => "pid-wrapper".into(),
            Scenario::TerminalPods(n) => format!("terminal-pods-{n}"),
            Scenario::PodText => "pod-text".into(),
            Scenario::ManyProcs => "many-procs".into(),
            Scenario::ManyProcsFakeEnvoy => "many-procs-fake-envoy".into(),
            Scenario::ExecLoop => "exec-loop".into(),
            Scenario::AnnotationToggle => "annotation-toggle".into(),
        }
    }

    /// Whether the attacker is deleted before the window (its drain is the attack).
    pub fn drains_attacker(self) -> bool {
        matches!(self, Scenario::ManyProcs | Scenario::ManyProcsFakeEnvoy)
    }
}

/// How to run.
#[derive(Debug, Clone)]
pub struct Opts {
    pub sim_app: Option<PathBuf>,
    /// The agent binary (default: the one built with the tests).
    pub holdfast: Option<PathBuf>,
    /// The agent is a build from before the health and metrics listeners (a baseline): its
    /// probes and metrics are on `--status-listen`.
    pub legacy_listeners: bool,
    /// How long the agent's cost is measured from the attack's start.
    pub window: Duration,
    /// A name part for the namespaces (`hf-<prefix><scenario>-…`).
    pub prefix: String,
    /// Run the agent under the DaemonSet's cgroup limits ([`AgentCgroup`]) and read its cost
    /// there too.
    pub confine: bool,
    /// With `confine`: the DaemonSet's CPU quota too (200m), not only its memory limit. The
    /// honest pod then boots in a node's window ([`HONEST_INIT_UNDER_QUOTA`]).
    pub cpu_quota: bool,
}

/// The DaemonSet's limits (manifests/agent/daemonset.yaml `resources.limits`): cpu 200m,
/// memory 128Mi.
pub const DAEMONSET_CPU_MILLIS: u64 = 200;
pub const DAEMONSET_MEMORY_BYTES: u64 = 128 << 20;

/// The agent confined as a node confines it: a cgroup with the DaemonSet's CPU quota and memory
/// limit, the agent (and so every child it starts: `iptables`) inside it, and its cost read
/// from the cgroup, children included. This machine kind has the cpu, cpuacct and memory
/// controllers on cgroup v1 only (/work/shared/reference/cgroup-limits.md): `cpu.cfs_quota_us`
/// / `cpu.cfs_period_us`, `memory.limit_in_bytes`; cost from `cpuacct.usage`,
/// `memory.max_usage_in_bytes`, `memory.failcnt` and `memory.oom_control`'s `oom_kill`. v1 has
/// no `memory.oom.group`: here the kernel kills the largest process of the group, on a cgroup v2
/// node with kubelet >= 1.28 the whole container would die, so "would have been killed" is
/// counted from the peak and the failure count too. The directories are removed on drop (the
/// agent is stopped first: a cgroup with a process cannot be removed).
pub struct AgentCgroup {
    dirs: Vec<PathBuf>,
}

impl AgentCgroup {
    const ROOT: &'static str = "/sys/fs/cgroup";

    /// `hf-<name>-agent` under the cpu, cpuacct and memory hierarchies, with the DaemonSet's
    /// limits (its CPU quota only with `cpu_quota`), and `pid` moved in.
    pub fn confine(name: &str, pid: u32, cpu_quota: bool) -> anyhow::Result<AgentCgroup> {
        let leaf = format!("hf-{name}-agent");
        let mut cg = AgentCgroup { dirs: Vec::new() };
        for controller in ["cpu", "cpuacct", "memory"] {
            let base = PathBuf::from(Self::ROOT).join(controller);
            let dir = base.join(&leaf);
            // cpu and cpuacct are often one hierarchy under two names.
            let same = cg
                .dirs
                .iter()
                .any(|d| std::fs::canonicalize(d).ok() == std::fs::canonicalize(&dir).ok());
            if same && dir.exists() {
                continue;
            }
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot make {} (cgroup v1 here?)", dir.display()))?;
            cg.dirs.push(dir);
        }
        if cpu_quota {
            let period: u64 = cg.read("cpu", "cpu.cfs_period_us").unwrap_or(100_000);
            cg.write(
                "cpu",
                "cpu.cfs_quota_us",
                period * DAEMONSET_CPU_MILLIS / 1000,
            )?;
        }
        cg.write("memory", "memory.limit_in_bytes", DAEMONSET_MEMORY_BYTES)?;
        // The agent's memory so far would move with it (v1 leaves a moved process's pages
        // charged to its old group), but this kernel refuses the knob (EINVAL: deprecated):
        // the group's peak then counts what the agent and its children allocate after the
        // move, and the agent's own peak is its VmHWM ([`Cost::rss_peak_kib`]).
        let _ = cg.write("memory", "memory.move_charge_at_immigrate", 3);
        for controller in ["cpu", "cpuacct", "memory"] {
            cg.write(controller, "cgroup.procs", u64::from(pid))?;
        }
        Ok(cg)
    }

    fn path(&self, controller: &str, file: &str) -> PathBuf {
        let leaf = self.dirs[0].file_name().unwrap_or_default().to_owned();
        PathBuf::from(Self::ROOT)
            .join(controller)
            .join(leaf)
            .join(file)
    }

    fn write(&self, controller: &str, file: &str, value: u64) -> anyhow::Result<()> {
        let path = self.path(controller, file);
        std::fs::write(&path, value.to_string())
            .with_context(|| format!("cannot write {value} to {}", path.display()))
    }

    fn read(&self, controller: &str, file: &str) -> Option<u64> {
        std::fs::read_to_string(self.path(controller, file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// CPU seconds the group used so far (the agent and every child it started).
    pub fn cpu_s(&self) -> f64 {
        self.read("cpuacct", "cpuacct.usage").unwrap_or(0) as f64 / 1e9
    }

    /// What the group's memory and CPU limits did so far.
    pub fn limits(&self) -> CgroupFigures {
        let oom_kills = std::fs::read_to_string(self.path("memory", "memory.oom_control"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0);
        let throttled = std::fs::read_to_string(self.path("cpu", "cpu.stat"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("nr_throttled ")?.trim().parse().ok())
            .unwrap_or(0);
        CgroupFigures {
            memory_peak_bytes: self
                .read("memory", "memory.max_usage_in_bytes")
                .unwrap_or(0),
            memory_failcnt: self.read("memory", "memory.failcnt").unwrap_or(0),
            oom_kills,
            cpu_throttled_periods: throttled,
        }
    }
}

impl Drop for AgentCgroup {
    fn drop(&mut self) {
        for dir in &self.dirs {
            // Whatever is left (a child the agent started, an agent not yet reaped) goes back to
            // the root group first; then the directory can go.
            if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                let root = dir.parent().map(|p| p.join("cgroup.procs"));
                for pid in procs.lines() {
                    if let Some(root) = &root {
                        let _ = std::fs::write(root, pid);
                    }
                }
            }
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// What the agent's cgroup says ([`AgentCgroup::limits`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupFigures {
    /// `memory.max_usage_in_bytes`: the group's peak, children and page cache included.
    pub memory_peak_bytes: u64,
    /// Times the group hit its memory limit.
    pub memory_failcnt: u64,
    /// Processes the kernel's OOM killer killed in the group.
    pub oom_kills: u64,
    /// CFS periods in which the group was throttled (used its 0.2 cores).
    pub cpu_throttled_periods: u64,
}

impl CgroupFigures {
    /// Whether a cgroup v2 node (kubelet >= 1.28, `memory.oom.group`) would have killed the
    /// whole agent container.
    pub fn would_be_killed(&self) -> bool {
        self.oom_kills > 0
            || self.memory_failcnt > 0
            || self.memory_peak_bytes >= DAEMONSET_MEMORY_BYTES
    }
}

/// The agent's cost over a window, from `/proc`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cost {
    /// CPU seconds (its own and its reaped children's: iptables runs) in the window.
    pub cpu_s: f64,
    pub window_s: f64,
    /// Peak resident memory over the agent's life so far (VmHWM), KiB.
    pub rss_peak_kib: u64,
    /// Resident memory at the window's end, KiB.
    pub rss_end_kib: u64,
    /// Most open fds seen (sampled every 100 ms).
    pub fds_max: usize,
    /// CPU seconds in the window by the agent's cgroup (children included), when confined.
    pub cgroup_cpu_s: Option<f64>,
    /// The agent's cgroup at the window's end, when confined.
    pub cgroup: Option<CgroupFigures>,
}

/// What the honest pod saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Honest {
    /// Its boot calls that failed (held, they must all succeed).
    pub failed_calls: u64,
    pub hold_outcome: Option<String>,
    /// From Envoy seen ready to the verdict that let the held connections go.
    pub release_ms: Option<f64>,
    /// From the pod's netns seen to its hold in (its timeline's `netns-found` → `hold-in`):
    /// what an attack beside it must not stretch, or the app's first connect meets no hold.
    pub netns_to_hold_ms: Option<f64>,
    /// From the pod first seen by the agent to its netns found (`first-seen` → `netns-found`).
    pub seen_to_netns_ms: Option<f64>,
    /// From its hold in to the app's first boot call (negative: the call came first, and met
    /// no hold).
    pub hold_to_first_call_ms: Option<f64>,
    /// The boot calls' failures by kind, when any failed.
    pub call_errors: String,
    pub drain_outcome: Option<String>,
    /// From the app's exit to Envoy's.
    pub drain_exit_lag_ms: Option<f64>,
    /// The size of the honest (real) Envoy's answer to the agent's readiness `/stats` request
    /// and to its drain sample (`usedonly`), in bytes: what the caps are set against.
    pub answer_bytes: Option<(usize, usize)>,
}

/// One run's figures.
#[derive(Debug, Clone)]
pub struct Figures {
    pub scenario: Scenario,
    pub cost: Cost,
    pub honest: Honest,
    /// The attacker's status row at the end of the window (`None`: not tracked).
    pub attacker: Option<PodStatus>,
    /// Slot holders: liveness probes answered, of those sent.
    pub liveness: Option<(u32, u32)>,
    /// The attack's own line from its log (what it did).
    pub attack_log: String,
}

impl Figures {
    /// One line for the table in docs/benchmarks.md.
    pub fn line(&self) -> String {
        let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
        format!(
            "{:<18} cpu {:>6.2} s / {:.0} s  rss peak {:>6.1} MiB  fds max {:>4}{}  honest: failed {}{} seen→netns {} ms netns→hold {} ms hold→first call {} ms hold {} release {} ms drain {} lag {} ms{}{}{}",
            self.scenario.name(),
            self.cost.cpu_s,
            self.cost.window_s,
            self.cost.rss_peak_kib as f64 / 1024.0,
            self.cost.fds_max,
            match (self.cost.cgroup_cpu_s, self.cost.cgroup) {
                (Some(cpu), Some(g)) => format!(
                    "  cgroup: cpu {cpu:.2} s, mem peak {:.1} MiB, failcnt {}, oom kills {}, throttled {}",
                    g.memory_peak_bytes as f64 / 1048576.0,
                    g.memory_failcnt,
                    g.oom_kills,
                    g.cpu_throttled_periods
                ),
                _ => String::new(),
            },
            self.honest.failed_calls,
            if self.honest.call_errors.is_empty() {
                String::new()
            } else {
                format!(" {}", self.honest.call_errors)
            },
            ms(self.honest.seen_to_netns_ms),
            ms(self.honest.netns_to_hold_ms),
            ms(self.honest.hold_to_first_call_ms),
            self.honest.hold_outcome.as_deref().unwrap_or("-"),
            ms(self.honest.release_ms),
            self.honest.drain_outcome.as_deref().unwrap_or("-"),
            ms(self.honest.drain_exit_lag_ms),
            self.honest
                .answer_bytes
                .map_or(String::new(), |(r, d)| format!(" (Envoy answers: readiness {r} B, drain sample {d} B)")),
            self.liveness
                .map_or(String::new(), |(ok, n)| format!("  liveness {ok}/{n}")),
            self.attacker.as_ref().map_or(String::new(), |r| format!(
                "  attacker: {}{} {}",
                r.phase.as_str(),
                r.drain.as_ref().map_or(String::new(), |d| format!(
                    " (drain {}, {} app processes watched, {} left, {} errors{})",
                    d.outcome.as_str(),
                    d.app_processes_seen,
                    d.app_processes_left,
                    d.error_count,
                    d.errors.first().map_or(String::new(), |e| format!(
                        ", first: {}",
                        e.chars().take(160).collect::<String>()
                    ))
                )),
                r.skipped_reason
                    .as_deref()
                    .or(r.last_error.as_deref())
                    .map(|s| s.chars().take(100).collect::<String>())
                    .unwrap_or_default()
            )),
        )
    }
}

/// Samples a process's CPU, memory and fds.
struct Sampler {
    pid: u32,
}

impl Sampler {
    fn cpu_s(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
        // Fields after the command (which may hold spaces): state is field 3.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<u64> = rest
            .split_whitespace()
            .skip(11) // state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
            .take(4) // utime stime cutime cstime
            .filter_map(|x| x.parse().ok())
            .collect();
        let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100) as f64;
        f.iter().sum::<u64>() as f64 / ticks
    }

    fn status_kib(&self, field: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix(field)?
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }

    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

/// How long the honest pod's istio-init step takes when the agent runs under the DaemonSet's
/// CPU quota: the window from its sandbox to its app's first connect that a node leaves.
///
/// The sim's default (150 ms) is shorter than any kubelet's: after the sandbox, the kubelet
/// creates and starts istio-init (a CRI `CreateContainer` + `StartContainer`), istio-init runs
/// its `iptables-restore`s and exits, the kubelet notices the exit at its next PLEG relist
/// (`genericPlegRelistPeriod = time.Second * 1`, pkg/kubelet/kubelet.go; Evented PLEG is off by
/// default) and only then creates and starts the app's container: 0–1 s of relist wait alone.
/// 500 ms is below that window's median. Under the quota the agent runs 20 ms of every 100 ms
/// period, so any burst of its own work that meets a pod's boot costs that pod one or two
/// throttled periods (80 ms each): against the sim's 150 ms the honest pod's race was lost
/// now and then even with no attack (CI, 4ea9c60: its hold 83 ms after its netns with no
/// attacker, 111 ms beside 300 terminal pods, 3 boot calls refused), against a node's window
/// it is not. What an attack adds is asserted apart: the hold within 2× its no-attack latency.
pub const HONEST_INIT_UNDER_QUOTA: Duration = Duration::from_millis(500);

/// The honest pod: Envoy 1 s late, three calls at boot (held), exits at SIGTERM; its init step
/// [`HONEST_INIT_UNDER_QUOTA`] long when the agent runs under the CPU quota.
fn honest_pod(opts: &Opts) -> PodSpec {
    let pod = PodSpec::new("honest")
        .app(AppScript::CallAtStart { calls: 3 })
        .proxy_delay(Duration::from_secs(1))
        .call_timeout(Duration::from_secs(30));
    if opts.confine && opts.cpu_quota {
        pod.init_duration(HONEST_INIT_UNDER_QUOTA)
    } else {
        pod
    }
}

/// The attacker pod of a scenario.
fn attacker_pod(s: Scenario, window: Duration) -> Option<PodSpec> {
    let ms = window.as_millis() as u64;
    let (attack, proxy_delay) = match s {
        // Its real Envoy never comes within the run: the fake holds the ports.
        Scenario::FakeEnvoy => (
            Attack::FakeEnvoy { body: 4 << 20 },
            Duration::from_secs(3600),
        ),
        // Envoy gets ready, the hold is released, and the removal meets the flood.
        Scenario::RuleFlood => (Attack::RuleFlood { rules: 5000 }, Duration::from_secs(2)),
        // The hold stays while Envoy is late: forged messages meanwhile.
        Scenario::NetlinkForger => (
            Attack::NetlinkForge { for_ms: ms },
            Duration::from_secs(3600),
        ),
        Scenario::PidWrapper => (Attack::ForkFlood { for_ms: ms }, Duration::from_millis(500)),
        // The app exits 10 s after the window's end (after the honest pod's drain), well inside
        // its grace period: its drain covers the window.
        Scenario::ManyProcs | Scenario::ManyProcsFakeEnvoy => {
            let fake_envoy = s == Scenario::ManyProcsFakeEnvoy;
            return Some(
                PodSpec::new("attacker")
                    .app(AppScript::Attack(Attack::Procs {
                        count: MANY_PROCS,
                        linger_ms: ms + 10_000,
                        fake_envoy,
                    }))
                    // With the fake, its real Envoy never comes (the fake holds the ports).
                    .proxy_delay(if fake_envoy {
                        Duration::from_secs(3600)
                    } else {
                        Duration::from_millis(500)
                    })
                    .grace(ATTACKER_GRACE)
                    // pilot-agent's terminationDrainDuration as long as the grace (what the
                    // agent's advice asks of a pod whose app outlives the default 5 s): Envoy
                    // stays until the agent quits it, so the drain lasts as long as the app.
                    .drain(ATTACKER_GRACE),
            );
        }
        Scenario::PodText => {
            return Some(
                PodSpec::new("attacker")
                    .app(AppScript::CallAtStart { calls: 1 })
                    .proxy_delay(Duration::from_millis(500))
                    .annotation(
                        holdfast::config::ANNOTATION_HOLD_TIMEOUT,
                        &hostile_text(8 << 10),
                    )
                    .annotation(
                        holdfast::config::ANNOTATION_ENABLED,
                        &hostile_text(200 << 10),
                    )
                    .annotation(
                        holdfast::mesh::istio_config::ANNOTATION_ISTIO_PROXY_CONFIG,
                        &alias_bomb(),
                    ),
            )
        }
        // A pod like any other: what it does is done to it from outside ([`run`]).
        Scenario::ExecLoop | Scenario::AnnotationToggle => {
            return Some(
                PodSpec::new("attacker")
                    .app(AppScript::CallAtStart { calls: 1 })
                    .proxy_delay(Duration::from_secs(1)),
            )
        }
        _ => return None,
    };
    Some(
        PodSpec::new("attacker")
            .app(AppScript::Attack(attack))
            .proxy_delay(proxy_delay),
    )
}

/// `len` bytes of pod text that forges a log line and carries C1 and bidi controls.
pub fn hostile_text(len: usize) -> String {
    let mut t = String::from(
        "1s\r\n2026-01-01T00:00:00.000000Z  INFO holdfast: all pods healthy \u{9b}2J \u{202e}lamron ",
    );
    while t.len() < len {
        t.push_str("\u{85}x");
    }
    t
}

/// An 8 KB YAML alias bomb (8 levels of 8 aliases: 8^8 scalars if expanded), as a
/// `proxy.istio.io/config` value.
pub fn alias_bomb() -> String {
    let mut bomb = String::from("a: &a [");
    bomb.push_str(&["\"xxxxxxxx\""; 8].join(","));
    bomb.push_str("]\n");
    let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
    for w in names.windows(2) {
        let refs = vec![format!("*{}", w[0]); 8].join(",");
        bomb.push_str(&format!("{}: &{} [{}]\n", w[1], w[1], refs));
    }
    bomb.push_str("proxyMetadata: *i\n");
    bomb
}

/// A Pod object the kubelet rejected (phase Failed, no container ever ran), shaped like an
/// injected sidecar pod.
fn terminal_pod(i: u32, node: &str) -> serde_json::Value {
    serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("rejected-{i}"), "namespace": "ns",
                     "uid": format!("0b6a3c1e-6a59-4d8e-9f3a-{i:012}"),
                     "annotations": {"sidecar.istio.io/status":
                        r#"{"initContainers":["istio-init"],"containers":["istio-proxy"],"volumes":["istio-envoy"],"imagePullSecrets":null}"#}},
        "spec": {"nodeName": node,
                 "initContainers": [{"name": "istio-init", "image": "proxyv2"}],
                 "containers": [{"name": "app", "image": "app"}, {"name": "istio-proxy", "image": "proxyv2"}]},
        "status": {"phase": "Failed", "reason": "OutOfcpu",
                   "message": "Pod was rejected: Node didn't have enough resource: cpu"}})
}

/// 70 keep-alive clients from 127.0.0.2, one request every 4 s each, until `stop`.
fn slot_holders(target: SocketAddr, stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    (0..70)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(sock) =
                        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    else {
                        return;
                    };
                    let _ = sock.bind(&SocketAddr::from(([127, 0, 0, 2], 0)).into());
                    if sock
                        .connect_timeout(&target.into(), Duration::from_secs(1))
                        .is_err()
                    {
                        std::thread::sleep(Duration::from_millis(200));
                        continue;
                    }
                    let mut s: TcpStream = sock.into();
                    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                    let mut served = false;
                    while !stop.load(Ordering::Relaxed) {
                        if write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").is_err() {
                            break;
                        }
                        let mut buf = [0u8; 64 * 1024];
                        if !matches!(s.read(&mut buf), Ok(n) if n > 0) {
                            break;
                        }
                        served = true;
                        let t = Instant::now();
                        while t.elapsed() < Duration::from_secs(4) && !stop.load(Ordering::Relaxed)
                        {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                    // Closed on us (a limit, or the idle timeout): come back as a client
                    // does, a moment later, not in a tight loop (that is a connection flood,
                    // which costs the agent an accept and a close each).
                    if !served {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
            })
        })
        .collect()
}

/// The kubelet's probe: `GET /healthz` on a new connection (from 127.0.0.1), 1 s timeout.
fn probe(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if write!(
        s,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.1 200")
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One run: see the module docs.
pub fn run(scenario: Scenario, opts: &Opts) -> anyhow::Result<Figures> {
    let name = format!("{}{}", opts.prefix, scenario.name());
    let mut node = SimNode::with_options(
        &name,
        NodeOptions {
            sim_app: opts.sim_app.clone(),
            ..NodeOptions::default()
        },
    )?;
    let (health_port, metrics_port) = (free_port()?, free_port()?);
    let mut extra = Vec::new();
    if !opts.legacy_listeners {
        extra = vec![
            "--health-listen".to_string(),
            format!("127.0.0.1:{health_port}"),
            "--metrics-listen".into(),
            format!("127.0.0.1:{metrics_port}"),
        ];
    }
    let extra_ref: Vec<&str> = extra.iter().map(String::as_str).collect();
    let agent = AgentProcess::start_binary(
        opts.holdfast.as_deref(),
        node.node_name(),
        node.pods_dir(),
        &node.work_dir().join("agent.log"),
        &extra_ref,
    )?;
    let sampler = Sampler {
        pid: agent.pid().context("the agent's pid")?,
    };
    let cgroup = if opts.confine {
        Some(AgentCgroup::confine(&name, sampler.pid, opts.cpu_quota)?)
    } else {
        None
    };
    let (health, public) = if opts.legacy_listeners {
        (agent.status_addr(), agent.status_addr())
    } else {
        (
            SocketAddr::from(([127, 0, 0, 1], health_port)),
            SocketAddr::from(([127, 0, 0, 1], metrics_port)),
        )
    };

    // The attack starts.
    let stop = Arc::new(AtomicBool::new(false));
    let mut holders = Vec::new();
    let mut attacking = false;
    if let Some(spec) = attacker_pod(scenario, opts.window) {
        node.add_pod(spec)?;
        node.start_pods()?;
        attacking = true;
    }
    match scenario {
        Scenario::SlotHolders => holders = slot_holders(public, stop.clone()),
        Scenario::ExecLoop => {
            // In the container before its Envoy is ready (1 s late), so the agent's watch of
            // the ready proxy meets the loop's processes.
            node.wait_for(
                "attacker",
                Duration::from_secs(30),
                "the attacker's proxy container running",
                |p| p.proxy().is_some_and(|c| c.is_running() && c.pid.is_some()),
            )?;
            let mut sh = std::process::Command::new("sh");
            sh.args(["-c", "while :; do sleep 0.005; done"]);
            node.exec_in_proxy("attacker", sh)?;
        }
        Scenario::AnnotationToggle => {
            let annotate = node.annotator("attacker")?;
            let stop = stop.clone();
            holders.push(std::thread::spawn(move || {
                let mut on = false;
                while !stop.load(Ordering::Relaxed)
                    && annotate.set(
                        holdfast::config::ANNOTATION_ENABLED,
                        if on { "true" } else { "false" },
                    )
                {
                    on = !on;
                    std::thread::sleep(TOGGLE_EVERY);
                }
            }));
        }
        Scenario::TerminalPods(n) => {
            for i in 0..n {
                let pod = terminal_pod(i, node.node_name());
                let path = node.pods_dir().join(format!("rejected-{i}.json"));
                std::fs::write(&path, pod.to_string())?;
            }
            // Their arrival is the attacker's boot, as for the others: the agent parses each
            // object once (the phase is read from the parsed pod), and 300 written in one
            // instant are a burst of that work under the 0.2-core quota. An honest pod booting
            // inside it had its hold in 284 ms after its netns (its boot calls all through;
            // the window's agent CPU 0.20 s and 10 throttled periods against 0.13 s and 5
            // with no attacker; `just test` on a fresh clone, 13:17 UTC 2026-11-28). What the
            // attack is about, 300 objects that stay, is measured from the moment the agent
            // has seen them all: its host-process log is at debug, a line per object not
            // tracked.
            let seen = Instant::now();
            let not_tracked = |agent: &AgentProcess| {
                agent
                    .log_text()
                    .matches("pod in a terminal phase; not tracked")
                    .count()
            };
            while not_tracked(&agent) < n as usize {
                anyhow::ensure!(
                    seen.elapsed() < Duration::from_secs(30),
                    "the agent saw {} of the {n} terminal pods in 30 s",
                    not_tracked(&agent)
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        _ => {}
    }
    if attacking && !scenario.drains_attacker() {
        // The attacker's own boot (its sandbox, its istio-init's ~20 `iptables` runs, its hold)
        // is over before the honest pod's begins: on this 2-core machine two pods booting at
        // once compete for CPU with each other's istio-init and the agent's `iptables-restore`
        // children, which is not the attack (simultaneous boots are measured by the hold
        // tests). Seen on 2026-11-28 09:13 UTC beside pod-text: both pods' netns found at the
        // same instant and both holds in 192 ms later, after the honest app's first connect.
        // What each attack does to the agent goes on through the window.
        node.wait_for(
            "attacker",
            Duration::from_secs(30),
            "the attacker's init container done",
            |v| {
                v.init.as_ref().is_some_and(|c| {
                    matches!(c.state, crate::sim::pod_object::CState::Terminated(_))
                })
            },
        )?;
    }
    if scenario.drains_attacker() {
        // Its hold released (its Envoy, or the fake, ready) and its processes forked; then it is
        // deleted, and the window is spent in its drain.
        agent.wait_pod(
            "default",
            "attacker",
            Duration::from_secs(60),
            "the attacker ready",
            |r| r.phase == holdfast::api::Phase::Ready,
        )?;
        wait_attack_line(&node, "procs:", Duration::from_secs(60))?;
        node.delete_pod("attacker")?;
        agent.wait_pod(
            "default",
            "attacker",
            Duration::from_secs(30),
            "the attacker's drain",
            |r| r.phase == holdfast::api::Phase::Draining,
        )?;
    }
    let t0 = Instant::now();
    let cpu0 = sampler.cpu_s();
    let cgroup_cpu0 = cgroup.as_ref().map(AgentCgroup::cpu_s);
    let mut fds_max = sampler.fds();

    // The honest pod, beside it.
    node.add_pod(honest_pod(opts))?;
    node.start_pods()?;
    let mut liveness = None;
    if scenario == Scenario::SlotHolders {
        std::thread::sleep(Duration::from_millis(500));
        let mut ok = 0;
        for _ in 0..10 {
            let t = Instant::now();
            if probe(health) {
                ok += 1;
            }
            fds_max = fds_max.max(sampler.fds());
            std::thread::sleep(Duration::from_secs(1).saturating_sub(t.elapsed()));
        }
        liveness = Some((ok, 10));
    }
    let report = node.wait_report("honest", Duration::from_secs(60), "3 boot calls", |r| {
        r.calls(Phase::Startup).ok + r.calls(Phase::Startup).failed >= 3
    })?;
    let startup = report.calls(Phase::Startup);
    let mut honest = Honest {
        failed_calls: u64::from(startup.failed),
        call_errors: if startup.failed > 0 {
            format!("{:?}", startup.by_error)
        } else {
            String::new()
        },
        ..Honest::default()
    };
    let first_call_us = report.events.iter().find_map(|e| match e {
        crate::sim::report::AppEvent::Call {
            phase: Phase::Startup,
            at_ms,
            at_us,
            ..
        } => Some(at_us.unwrap_or(at_ms * 1000)),
        _ => None,
    });
    // The status API may be the attack: read the row with patience. A baseline agent may not
    // get there at all: that is a figure, not a failure of the run.
    match agent.wait_hold_ended("default", "honest", Duration::from_secs(30)) {
        Ok(row) => {
            if let Some(h) = &row.hold {
                honest.hold_outcome = h.outcome.map(|o| o.as_str().to_string());
                honest.release_ms = h.ready_to_release_ms;
            }
            let at = |kind: holdfast::api::StepKind| {
                row.timeline
                    .as_ref()?
                    .steps
                    .iter()
                    .find(|s| s.step == kind)
                    .map(|s| s.at)
            };
            let ms = |from: std::time::SystemTime, to: std::time::SystemTime| {
                to.duration_since(from).ok().map(|d| d.as_secs_f64() * 1e3)
            };
            let (first, netns, held) = (
                at(holdfast::api::StepKind::FirstSeen),
                at(holdfast::api::StepKind::NetnsFound),
                at(holdfast::api::StepKind::HoldIn),
            );
            if let (Some(seen), Some(held)) = (netns, held) {
                honest.netns_to_hold_ms = ms(seen, held);
            }
            if let (Some(first), Some(netns)) = (first, netns) {
                honest.seen_to_netns_ms = ms(first, netns);
            }
            if let (Some(held), Some(call_us)) = (held, first_call_us) {
                let held_us = held
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros() as i64);
                honest.hold_to_first_call_ms = Some((call_us as i64 - held_us) as f64 / 1e3);
            }
        }
        Err(_) => honest.hold_outcome = Some("not-ended-in-30s".into()),
    }
    let pct = holdfast::effects::envoy_admin::percent_encode;
    let readiness = format!(
        "/stats?filter={}",
        pct(&holdfast::lifecycle::readiness::stats_filter(
            holdfast::lifecycle::readiness::DEFAULT_STAT_PREFIX
        ))
    );
    let drain = format!(
        "/stats?usedonly&filter={}",
        pct(&holdfast::lifecycle::drain::in_flight::sample_regex(
            holdfast::lifecycle::readiness::DEFAULT_STAT_PREFIX
        ))
    );
    if let (Ok(r), Ok(d)) = (
        node.admin("honest", "GET", &readiness),
        node.admin("honest", "GET", &drain),
    ) {
        honest.answer_bytes = Some((r.len(), d.len()));
    }
    while t0.elapsed() < opts.window {
        fds_max = fds_max.max(sampler.fds());
        std::thread::sleep(Duration::from_millis(100));
    }
    let cost = Cost {
        cpu_s: sampler.cpu_s() - cpu0,
        window_s: t0.elapsed().as_secs_f64(),
        rss_peak_kib: sampler.status_kib("VmHWM:"),
        rss_end_kib: sampler.status_kib("VmRSS:"),
        fds_max,
        cgroup_cpu_s: cgroup
            .as_ref()
            .zip(cgroup_cpu0)
            .map(|(g, c0)| g.cpu_s() - c0),
        cgroup: None,
    };
    let mut cost = cost;
    stop.store(true, Ordering::Relaxed);
    for h in holders {
        let _ = h.join();
    }
    let attacker = if scenario == Scenario::RuleFlood {
        // Its Envoy is 2 s late and then starts (seconds on a loaded machine): its row once the
        // hold has ended, released or not, rather than whatever it is at the window's end.
        agent
            .wait_hold_ended("default", "attacker", Duration::from_secs(30))
            .ok()
            .or_else(|| agent.pod("default", "attacker").ok().flatten())
    } else if attacking {
        agent.pod("default", "attacker").ok().flatten()
    } else {
        None
    };

    // The honest pod's drain.
    node.delete_pod("honest")?;
    match agent.wait_pod(
        "default",
        "honest",
        Duration::from_secs(30),
        "drain report",
        |r| r.drain.is_some(),
    ) {
        Ok(row) => {
            if let Some(d) = &row.drain {
                honest.drain_outcome = Some(d.outcome.as_str().to_string());
                honest.drain_exit_lag_ms = d.app_gone_to_proxy_exit.map(|d| d.as_secs_f64() * 1e3);
            }
        }
        Err(_) => honest.drain_outcome = Some("no-report-in-30s".into()),
    }
    let mut attacker = attacker;
    if attacking {
        node.delete_pod("attacker")?;
        let _ = node.wait_gone("attacker", Duration::from_secs(30));
        if scenario.drains_attacker() {
            // Its row with the drain's report (kept a while after the pod is gone).
            attacker = agent
                .wait_pod(
                    "default",
                    "attacker",
                    Duration::from_secs(30),
                    "the attacker's drain report",
                    |r| r.drain.is_some(),
                )
                .ok()
                .or(attacker);
        }
    }
    node.wait_gone("honest", Duration::from_secs(30))?;
    let attack_log = std::fs::read_to_string(node.work_dir().join("pods/attacker/app.log"))
        .or_else(|_| find_attack_log(&node))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("sim-app:"))
        .collect::<Vec<_>>()
        .join("; ");
    if scenario != Scenario::None {
        // Terminal pods are files only: remove them before the leftovers check.
        if let Scenario::TerminalPods(n) = scenario {
            for i in 0..n {
                let _ = std::fs::remove_file(node.pods_dir().join(format!("rejected-{i}.json")));
            }
        }
    }
    // The group's figures cover the whole run (the drains too); then the agent stops, and
    // its cgroup goes.
    cost.cgroup = cgroup.as_ref().map(AgentCgroup::limits);
    drop(agent);
    drop(cgroup);
    let left = node.finish();
    anyhow::ensure!(left.is_empty(), "left behind: {left:#?}");
    Ok(Figures {
        scenario,
        cost,
        honest,
        attacker,
        liveness,
        attack_log,
    })
}

/// Waits until the attacker's app log has a `sim-app:` line containing `what` (its attack's
/// report: the attack has done its set-up).
fn wait_attack_line(node: &SimNode, what: &str, timeout: Duration) -> anyhow::Result<()> {
    let t = Instant::now();
    loop {
        let log = std::fs::read_to_string(node.work_dir().join("pods/attacker/app.log"))
            .or_else(|_| find_attack_log(node))
            .unwrap_or_default();
        if log
            .lines()
            .any(|l| l.starts_with("sim-app:") && l.contains(what))
        {
            return Ok(());
        }
        anyhow::ensure!(
            t.elapsed() < timeout,
            "the attacker's log has no {what:?} line after {timeout:?}: {log:.500}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The attacker's app log, wherever the node keeps its pods' files.
fn find_attack_log(node: &SimNode) -> std::io::Result<String> {
    for entry in walk(node.work_dir()) {
        if entry.file_name().is_some_and(|n| n == "app.log")
            && entry.to_string_lossy().contains("attacker")
        {
            return std::fs::read_to_string(entry);
        }
    }
    Err(std::io::ErrorKind::NotFound.into())
}

fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}
