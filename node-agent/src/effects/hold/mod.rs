//! The startup hold: an app's new connections to Envoy wait in an NFQUEUE until Envoy is ready.
//!
//! Owns the hold's lifecycle in one pod's network namespace: [`rules`] (the iptables rules that
//! queue SYNs to Envoy's capture ports) and [`nfqueue`] (the NFQUEUE netlink client). A
//! [`HoldQueue`] binds the queue first and then installs the rules (with `--queue-bypass` an
//! unbound queue accepts, and the SYN would meet a closed port). A dedicated OS thread reads
//! queued packets and counts them, never giving a verdict. [`HoldQueue::release`] removes the
//! rules, accepts everything read, keeps reading and accepting until the kernel shows nothing
//! waiting in the queue, and only then closes the socket (closing a queue drops what waits in it).
//!
//! Never worse than no agent: if the agent dies, the kernel unbinds the queue, new SYNs bypass
//! it, and SYNs held at that moment are dropped and retransmitted by TCP about 1 s later.
//!
//! **Pass-through** ([`HoldQueue::set_pass_through`]): while a pod's init containers run, their
//! packets must not wait for an Envoy that cannot start before they finish (a vault-agent-init
//! style init container that calls out must fail, or succeed, as fast as without holdfast). While
//! on, the holder thread accepts every packet as it arrives, and switching it on accepts what was
//! held. The rules stay in place, so the hold resumes the moment it is switched off.
//!
//! The calls here block (a few ms: a thread spawn per netns entry, an `iptables-restore` run); in
//! async code call them from `tokio::task::spawn_blocking`.

#![forbid(unsafe_code)]

pub mod nfqueue;
pub mod rules;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use std::os::fd::AsFd;

use crate::effects::netns::{NetnsId, PodNetns};
use nfqueue::{Flow, NfQueue, QueuedPacket};
pub use rules::{FoundHold, RuleSpec};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Netns(#[from] crate::effects::netns::Error),
    #[error(transparent)]
    Rules(#[from] rules::Error),
    #[error(transparent)]
    Queue(#[from] nfqueue::Error),
    #[error("cannot start the holder thread for netns {0:?}: {1}")]
    Thread(NetnsId, std::io::Error),
    #[error("the holder thread for netns {0:?} failed: {1}")]
    Holder(NetnsId, String),
}

impl Error {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Netns(_) => "netns",
            Error::Rules(_) => "rules",
            Error::Queue(_) => "queue",
            Error::Thread(..) | Error::Holder(..) => "thread",
        }
    }

    /// Whether a command run in the pod's namespace broke its own bounds (the pod's tables
    /// made it too costly): `Some(false)` now, `Some(true)` before (the namespace remembers it,
    /// [`rules::BOUND_CHAIN`]); `None` for any other failure. See [`HoldQueue::disarm_and_mark`].
    pub(crate) fn over_bound(&self) -> Option<bool> {
        match self {
            Error::Netns(crate::effects::netns::Error::CommandOverBound { .. }) => Some(false),
            Error::Rules(e) => e.over_bound(),
            _ => None,
        }
    }
}

/// Result of this module.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// Distinct connections a hold remembers (to count them): a pod's startup burst opens tens to
/// hundreds. Past this, packets are still held and counted, connections no more (the count
/// then reads "at least").
pub(crate) const MAX_TRACKED_FLOWS: usize = 4096;

/// How to hold.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HoldConfig {
    /// Rules: queue number, capture ports, proxy uid, iptables binaries.
    pub rules: RuleSpec,
    /// Kernel queue length; past it the kernel accepts (fail-open), never drops.
    pub queue_max_len: u32,
    /// How long `release` keeps reading and accepting after the rules are gone, at most.
    pub release_drain_timeout: Duration,
}

impl Default for HoldConfig {
    fn default() -> Self {
        HoldConfig {
            rules: RuleSpec::default(),
            queue_max_len: 65536,
            release_drain_timeout: Duration::from_secs(1),
        }
    }
}

/// What one pod's hold covers, beyond the capture ports: decided by the lifecycle from the pod's
/// facts (`lifecycle::facts::hold_scope`), applied here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HoldScope {
    /// Hold the pod's IPv6 connections too (ip6tables rules).
    pub ipv6: bool,
    /// Hold DNS to the mesh's DNS proxy (its DNS capture is on: Istio's pilot-agent on 15053).
    pub dns: bool,
}

impl HoldConfig {
    /// The hold for one pod: the node's settings, and what the pod's own shape asks for.
    /// The proxy's uid and ports are its mesh's (`profile`), never held by the hold itself.
    pub(crate) fn for_pod(
        config: &crate::config::Config,
        profile: &crate::mesh::MeshProfile,
        scope: HoldScope,
    ) -> HoldConfig {
        HoldConfig {
            rules: RuleSpec {
                queue_num: config.hold.queue_num,
                outbound_port: profile.outbound_port,
                inbound_port: Some(profile.inbound_port),
                proxy_uid: profile.proxy_uid,
                ipv6: scope.ipv6,
                // The mesh's DNS proxy (Istio: pilot-agent on localhost:15053,
                // DefaultDNSProxyAddr in istio/istio pkg/config/constants/constants.go).
                dns_port: if scope.dns { profile.dns_port } else { None },
                ..RuleSpec::default()
            },
            ..HoldConfig::default()
        }
    }
}

/// What a hold has held so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct HoldStats {
    /// Packets queued (SYN retransmissions count again).
    pub packets: u64,
    /// Distinct connections (by flow: protocol, addresses and ports; a UDP DNS query socket
    /// counts as one).
    pub connections: u64,
    /// Of `packets`, those to the DNS port (UDP queries and TCP SYNs), when DNS is held.
    pub dns_packets: u64,
    /// Packets accepted at once because pass-through was on (init containers); not in `packets`.
    pub passed_through: u64,
    /// When the first packet was held.
    pub first_held_at: Option<SystemTime>,
}

/// What `release` did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReleaseReport {
    /// Totals over the hold's life, including packets read during the release.
    pub stats: HoldStats,
    /// From the first held packet to the verdict that let it go.
    pub longest_wait: Option<Duration>,
    /// Whether the rules were still there to remove.
    pub rules_removed: bool,
    /// Packets read during the release (queued before the rules were gone).
    pub late_packets: u64,
    /// Packets the kernel still reported waiting when the socket was closed (0 unless the drain
    /// timed out).
    pub left_waiting: u64,
    /// From the call to `release` to the verdict that let every held packet go (the rules are
    /// removed after that, so this is what held connections wait).
    pub verdict_after: Duration,
    /// How long the release took.
    pub took: Duration,
}

/// Counters shared between the holder thread and `held()`.
#[derive(Debug, Default)]
struct Shared {
    stats: HoldStats,
    first_held: Option<Instant>,
    flows: HashSet<Flow>,
    max_id: Option<u32>,
    /// The DNS port held (for the `dns_packets` count).
    dns_port: Option<u16>,
    /// See [`HoldQueue::set_pass_through`].
    pass_through: bool,
    /// Set when the holder thread stopped on an error (the queue is then closed).
    failure: Option<String>,
    /// Set when a netlink message not from the kernel reached the queue socket: the pod is
    /// sending forged messages, and is to be failed open (see [`HoldQueue::tampered`]).
    tampered: Option<String>,
}

/// Wakes the hold's owner when the hold stops holding on its own (the holder thread failed, or
/// stopped reading forged messages): see [`HoldQueue::stopped`]. A wake-up before anyone waits
/// is kept (one permit), so it is never lost.
pub(crate) type StopSignal = Arc<tokio::sync::Notify>;

impl Shared {
    /// Counts packets that now wait for a verdict.
    fn record(&mut self, packets: &[QueuedPacket]) {
        for packet in packets {
            if self.first_held.is_none() {
                self.first_held = Some(Instant::now());
                self.stats.first_held_at = Some(SystemTime::now());
            }
            self.stats.packets += 1;
            if let Some(flow) = packet.flow {
                if self.flows.len() < MAX_TRACKED_FLOWS && self.flows.insert(flow) {
                    self.stats.connections += 1;
                }
                if self.dns_port == Some(flow.dst_port) {
                    self.stats.dns_packets += 1;
                }
            }
            self.max_id = Some(self.max_id.map_or(packet.id, |m| m.max(packet.id)));
        }
    }

    /// What a freshly read batch needs: `Some(id)` to accept every packet up to `id` at once
    /// (pass-through), `None` to hold them (recorded).
    fn take_batch(&mut self, packets: &[QueuedPacket]) -> Option<u32> {
        if !self.pass_through {
            self.record(packets);
            return None;
        }
        self.stats.passed_through += packets.len() as u64;
        let batch_max = packets.iter().map(|p| p.id).max()?;
        // A batch verdict accepts every id up to it: anything held before goes too, as it must
        // while passing through.
        Some(self.max_id.map_or(batch_max, |m| m.max(batch_max)))
    }
}

/// A hold in force in one pod's netns. See the module docs.
#[derive(Debug)]
pub struct HoldQueue {
    netns: PodNetns,
    cfg: HoldConfig,
    shared: Arc<Mutex<Shared>>,
    stop: Arc<EventFd>,
    /// Wakes the holder thread to look at `Shared::pass_through` again.
    wake: Arc<EventFd>,
    /// See [`HoldQueue::stopped`].
    stopped: StopSignal,
    holder: Option<JoinHandle<Result<NfQueue, nfqueue::Error>>>,
    /// Why IPv6 is not held although the spec asked for it.
    ipv6_error: Option<String>,
    /// The families whose rules this queue wrote (released without listing them first).
    installed: Vec<rules::Family>,
}

impl HoldQueue {
    /// Binds the queue in the pod's netns, then installs the rules.
    pub fn start(netns: &PodNetns, cfg: &HoldConfig) -> Result<HoldQueue> {
        let existing = rules::find_per_family(netns, &cfg.rules)?;
        HoldQueue::install_new(netns, cfg, &existing)
    }

    /// Binds the queue, then installs the rules over what `existing` says the netns has. On a
    /// failure, undoes what did go in (nothing was queued without the rules, so the queue can
    /// close).
    fn install_new(
        netns: &PodNetns,
        cfg: &HoldConfig,
        existing: &rules::FoundPerFamily,
    ) -> Result<HoldQueue> {
        // The hold starts now: its start goes into the rules for a successor (see `since`).
        let mut cfg = cfg.clone();
        cfg.rules.since = Some(unix_now());
        let cfg = &cfg;
        let mut hold = HoldQueue::bind(netns, cfg, cfg.rules.queue_num)?;
        match rules::install_over(&hold.netns, &cfg.rules, existing) {
            Ok(installed) => hold.note_installed(installed),
            Err(e) => {
                // Over its bounds, a listing would cost more still: the lifecycle disarms the
                // namespace instead (`disarm_and_mark`).
                if e.over_bound().is_none() {
                    let _ = rules::remove(&hold.netns, &cfg.rules);
                }
                let _ = hold.stop_holder();
                return Err(e.into());
            }
        }
        tracing::info!(netns = ?netns.id(), queue = cfg.rules.queue_num, "hold started");
        Ok(hold)
    }

    /// After an agent restart: if the netns has a holdfast hold, binds its queue again (taking
    /// over the hold) and returns it; `None` when there is no hold. The queue number is the one in
    /// the rules, which may differ from `cfg`.
    pub fn adopt(netns: &PodNetns, cfg: &HoldConfig) -> Result<Option<HoldQueue>> {
        let per_family = rules::find_per_family(netns, &cfg.rules)?;
        let found = rules::merge(&per_family);
        if !found.is_active() {
            if !found.chains.is_empty() || !found.jumps.is_empty() {
                // A partial leftover holds nothing; clear it.
                rules::remove(netns, &cfg.rules)?;
            }
            return Ok(None);
        }
        HoldQueue::take_over(netns, cfg, &found, &per_family).map(Some)
    }

    /// Binds the queue of a found hold and brings its rules up to `cfg` (one restore per
    /// family: an older agent may have written no IPv6 or DNS rules). The held packets stay
    /// queued throughout: the chains are replaced in one transaction per family.
    fn take_over(
        netns: &PodNetns,
        cfg: &HoldConfig,
        found: &FoundHold,
        per_family: &rules::FoundPerFamily,
    ) -> Result<HoldQueue> {
        let queue_num = found.queue_num.unwrap_or(cfg.rules.queue_num);
        let mut cfg = cfg.clone();
        cfg.rules.queue_num = queue_num;
        // The hold began when its first agent installed it: kept in the refreshed rules, so
        // every successor counts the deadline from there. A start in the future (a clock set
        // back, a forged marker) counts as now; a hold from an agent that wrote none starts now.
        let now = unix_now();
        cfg.rules.since = Some(found.since.filter(|&t| t <= now).unwrap_or(now));
        let mut hold = HoldQueue::bind(netns, &cfg, queue_num)?;
        match rules::install_over(&hold.netns, &cfg.rules, per_family) {
            Ok(installed) => hold.note_installed(installed),
            // The found rules still hold (and the queue is bound): keep them.
            Err(e) => {
                tracing::warn!(netns = ?netns.id(), error = %e, "adopted hold: cannot refresh its rules; keeping the found ones")
            }
        }
        tracing::info!(netns = ?netns.id(), queue = queue_num, "hold adopted");
        Ok(hold)
    }

    /// [`start`](Self::start) for a namespace that cannot hold a previous agent's rules (it did
    /// not exist when this agent began tracking its pod): one `iptables-restore`, no listing —
    /// the window between a pod's sandbox and its app is short on a busy node. Should rules be
    /// there after all, the restore re-creates the chains and [`release`](Self::release) still
    /// removes every jump it finds.
    pub fn start_fresh(netns: &PodNetns, cfg: &HoldConfig) -> Result<HoldQueue> {
        HoldQueue::install_new(netns, cfg, &rules::FoundPerFamily::nothing(&cfg.rules))
    }

    /// [`adopt`](Self::adopt) if the netns has a hold, else [`start`](Self::start), listing the
    /// rules once (each `iptables` run costs milliseconds, and a pod's init window is short).
    /// Returns the hold and whether it was adopted.
    pub(crate) fn start_or_adopt(netns: &PodNetns, cfg: &HoldConfig) -> Result<(HoldQueue, bool)> {
        let per_family = rules::find_per_family(netns, &cfg.rules)?;
        let found = rules::merge(&per_family);
        if found.is_active() {
            let hold = HoldQueue::take_over(netns, cfg, &found, &per_family)?;
            return Ok((hold, true));
        }
        let hold = HoldQueue::install_new(netns, cfg, &per_family)?;
        Ok((hold, false))
    }

    fn note_installed(&mut self, installed: rules::Installed) {
        self.ipv6_error = installed.ipv6_error;
        self.installed = installed.families;
    }

    /// Removes holdfast rules from a netns where no hold is wanted. `true` if any were there.
    pub fn remove_leftover(netns: &PodNetns, cfg: &HoldConfig) -> Result<bool> {
        Ok(rules::remove(netns, &cfg.rules)?)
    }

    /// After a command in the namespace broke its bounds ([`Error::over_bound`]): empties
    /// holdfast's chains, so nothing is held, and marks the namespace so that no later look —
    /// this agent's or a successor's — runs anything heavier there than a cheap probe
    /// ([`rules::disarm_and_mark`]). No listing.
    pub(crate) fn disarm_and_mark(netns: &PodNetns, cfg: &HoldConfig) -> Result<()> {
        Ok(rules::disarm_and_mark(netns, &cfg.rules, unix_now())?)
    }

    /// Whether a holdfast hold is present in the netns (e.g. after an agent restart).
    pub fn find(netns: &PodNetns, cfg: &HoldConfig) -> Result<FoundHold> {
        Ok(rules::find(netns, &cfg.rules)?)
    }

    fn bind(netns: &PodNetns, cfg: &HoldConfig, queue_num: u16) -> Result<HoldQueue> {
        let max_len = cfg.queue_max_len;
        let own_netns = netns.try_clone()?;
        // The netlink socket must be created inside the pod's netns.
        let nfq = netns.run(move || NfQueue::bind(queue_num, max_len))??;
        let shared = Arc::new(Mutex::new(Shared {
            dns_port: cfg.rules.dns_port,
            ..Shared::default()
        }));
        let eventfd = || {
            EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .map(Arc::new)
                .map_err(|e| Error::Thread(netns.id(), e.into()))
        };
        let stop = eventfd()?;
        let wake = eventfd()?;
        let stopped = StopSignal::default();
        let holder = {
            let shared = shared.clone();
            let stop = stop.clone();
            let wake = wake.clone();
            let stopped = stopped.clone();
            std::thread::Builder::new()
                .name(format!("holdfast-hold-{queue_num}"))
                .spawn(move || {
                    let result = hold_loop(nfq, &shared, &stop, &wake, &stopped);
                    if let Err(e) = &result {
                        holder_failed(&shared, &stopped, queue_num, e);
                    }
                    result
                })
                .map_err(|e| Error::Thread(netns.id(), e))?
        };
        Ok(HoldQueue {
            netns: own_netns,
            cfg: HoldConfig {
                rules: RuleSpec {
                    queue_num,
                    ..cfg.rules.clone()
                },
                ..cfg.clone()
            },
            shared,
            stop,
            wake,
            stopped,
            holder: Some(holder),
            ipv6_error: None,
            installed: Vec::new(),
        })
    }

    /// The queue number in use.
    pub fn queue_num(&self) -> u16 {
        self.cfg.rules.queue_num
    }

    /// When the hold began: when this agent installed it, or, for an adopted hold, when the
    /// first agent did (as its rules say; now if they say nothing). The hold's deadline counts
    /// from here, so agents restarting one after another never hold a pod past
    /// `--max-hold-timeout` in all.
    pub fn since(&self) -> SystemTime {
        std::time::UNIX_EPOCH + Duration::from_millis(self.cfg.rules.since.unwrap_or_else(unix_now))
    }

    /// While `on`, packets are let through at once instead of held, and switching it on lets
    /// every held packet go: used while an init container runs, since init containers finish
    /// before the proxy can start and must fail (or succeed) as fast as without holdfast. `off`
    /// holds again. Safe to call from any thread at any time; the holder thread gives the
    /// verdicts (it owns the socket), woken at once. Once the holder has stopped (released,
    /// failed) this changes nothing.
    pub fn set_pass_through(&self, on: bool) {
        let changed = {
            let mut shared = lock(&self.shared);
            std::mem::replace(&mut shared.pass_through, on) != on
        };
        if changed {
            tracing::debug!(netns = ?self.netns.id(), on, "hold pass-through");
            if let Err(e) = self.wake.write(1) {
                // Only on eventfd counter overflow; the next packet applies the flag anyway.
                tracing::warn!(netns = ?self.netns.id(), error = %e, "cannot wake the holder thread");
            }
        }
    }

    /// Whether pass-through is on.
    pub fn pass_through(&self) -> bool {
        lock(&self.shared).pass_through
    }

    /// Why IPv6 connections are not held although the pod has IPv6 (`ip6tables` missing or
    /// failing); the IPv4 hold is in force regardless. `None` when IPv6 is held or not asked for.
    pub fn ipv6_problem(&self) -> Option<&str> {
        self.ipv6_error.as_deref()
    }

    /// What has been held so far.
    pub fn held(&self) -> HoldStats {
        lock(&self.shared).stats.clone()
    }

    /// Why this hold must be failed open, if it must: a process in the pod's network namespace
    /// sent netlink messages to the queue socket (a kernel never sends from a port id other
    /// than 0). The holder thread stopped reading at once (a flood costs the agent nothing
    /// more; the kernel fails new packets open when the socket's buffer is full); release the
    /// hold.
    pub(crate) fn tampered(&self) -> Option<String> {
        lock(&self.shared).tampered.clone()
    }

    /// Why the holder thread stopped, if it did. The queue is then closed: held SYNs were
    /// dropped (TCP retransmits them) and new ones bypass it. Call `release` to lift the rules.
    pub(crate) fn failure(&self) -> Option<String> {
        lock(&self.shared).failure.clone()
    }

    /// Notified (once) when this hold stops holding on its own: the holder thread failed
    /// ([`failure`](Self::failure)) or a forged message stopped it reading
    /// ([`tampered`](Self::tampered)). Await `notified()` on it beside other work, so the hold
    /// is released at once rather than at the next readiness check or its deadline.
    pub(crate) fn stopped(&self) -> StopSignal {
        self.stopped.clone()
    }

    /// Lets every held connection go, losing none: accept everything read so far, remove the
    /// rules, then keep reading and accepting until the kernel's queue for this netns is empty,
    /// and only then close the socket (closing drops whatever still waits in the queue).
    ///
    /// Accepting before the rules are removed lets held connections proceed without waiting for
    /// `iptables-restore` (~10 ms); SYNs queued in between are read and accepted by the drain
    /// loop, which runs after the rules are gone. Works also when the rules are already gone.
    pub fn release(mut self) -> Result<ReleaseReport> {
        let started = Instant::now();
        // 1. Take the socket back from the holder thread and accept what it read.
        let mut nfq = match self.stop_holder() {
            Ok(nfq) => nfq,
            Err(e) => {
                // The queue is gone (and with it what it held); at least lift the rules.
                let _ = rules::remove(&self.netns, &self.cfg.rules);
                return Err(e);
            }
        };
        let queue_num = nfq.queue_num();
        let held_max_id = lock(&self.shared).max_id;
        if let Some(max_id) = held_max_id {
            nfq.accept_up_to(max_id)?;
        }
        let verdict_after = started.elapsed();
        let longest_wait = lock(&self.shared).first_held.map(|t| t.elapsed());
        // 2. New SYNs now pass straight to Envoy. An error here must not strand queued packets:
        //    drain anyway, and report the error after.
        let removed = rules::remove_installed(&self.netns, &self.cfg.rules, &self.installed);
        let mut late_packets = 0u64;
        let mut batch = Vec::new();
        let deadline = Instant::now() + self.cfg.release_drain_timeout;
        // 3. Read and accept until the kernel shows nothing waiting in this netns's queue.
        let left_waiting = loop {
            batch.clear();
            let read_now = nfq.recv_packets(&mut batch)? as u64;
            if read_now > 0 {
                let max_id = {
                    let mut shared = lock(&self.shared);
                    shared.record(&batch);
                    shared.max_id
                };
                late_packets += read_now;
                if let Some(max_id) = max_id {
                    nfq.accept_up_to(max_id)?;
                }
            }
            let waiting = self
                .netns
                .run(move || nfqueue::kernel_queue_waiting(queue_num))?
                .unwrap_or(0);
            if waiting == 0 {
                break 0;
            }
            if Instant::now() >= deadline {
                tracing::warn!(netns = ?self.netns.id(), queue = queue_num, waiting, "release: packets still waiting at the drain timeout; closing the queue drops them (TCP retransmits)");
                break waiting;
            }
            nfq.wait_readable(Duration::from_millis(5))?;
        };
        // 4. Only now close (unbind) the queue.
        drop(nfq);
        let stats = lock(&self.shared).stats.clone();
        let rules_removed = removed?;
        let report = ReleaseReport {
            stats,
            longest_wait,
            rules_removed,
            late_packets,
            left_waiting,
            verdict_after,
            took: started.elapsed(),
        };
        tracing::info!(netns = ?self.netns.id(), packets = report.stats.packets, connections = report.stats.connections, took = ?report.took, "hold released");
        Ok(report)
    }

    fn stop_holder(&mut self) -> Result<NfQueue> {
        let id = self.netns.id();
        let Some(holder) = self.holder.take() else {
            return Err(Error::Holder(id, "already stopped".to_string()));
        };
        self.stop
            .write(1)
            .map_err(|e| Error::Holder(id, format!("cannot signal the holder thread: {e}")))?;
        match holder.join() {
            Ok(Ok(nfq)) => Ok(nfq),
            Ok(Err(e)) => Err(Error::Queue(e)),
            Err(_) => Err(Error::Holder(id, "panicked".to_string())),
        }
    }
}

impl Drop for HoldQueue {
    /// Dropping without `release` is what an agent crash does: the queue closes, the kernel drops
    /// the held SYNs (TCP retransmits them ~1 s later, then they bypass the unbound queue) and the
    /// rules stay for a later `adopt`. Always prefer `release`.
    fn drop(&mut self) {
        if self.holder.is_some() {
            tracing::warn!(netns = ?self.netns.id(), "hold dropped without release: held SYNs are dropped and retransmitted by TCP");
            let _ = self.stop_holder();
        }
    }
}

/// The holder thread stopped on an error: the hold no longer holds (its queue closes with the
/// thread, so new SYNs bypass it). Say why where [`HoldQueue::failure`] reads it, and wake the
/// owner ([`HoldQueue::stopped`]) so it fails the hold open at once.
fn holder_failed(
    shared: &Mutex<Shared>,
    stopped: &tokio::sync::Notify,
    queue: u16,
    e: &nfqueue::Error,
) {
    tracing::error!(queue, error = %e, "holder thread stopped; the hold no longer holds");
    lock(shared).failure = Some(e.to_string());
    stopped.notify_one();
}

/// The wall clock in Unix milliseconds (what the hold's marker rule carries).
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // Counters stay meaningful even if a holder panicked mid-update.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The holder thread: read and count queued packets (no verdict) until told to stop, then hand
/// the socket back. In pass-through, accept instead (see [`HoldQueue::set_pass_through`]).
/// When forged netlink messages arrive it accepts what it held and stops reading the socket
/// (see [`HoldQueue::tampered`]), waiting only for its stop signal.
fn hold_loop(
    mut nfq: NfQueue,
    shared: &Mutex<Shared>,
    stop: &EventFd,
    wake: &EventFd,
    stopped: &tokio::sync::Notify,
) -> Result<NfQueue, nfqueue::Error> {
    let mut batch = Vec::new();
    let mut reading = true;
    loop {
        if reading {
            batch.clear();
            nfq.recv_packets(&mut batch)?;
            if !batch.is_empty() {
                let accept = lock(shared).take_batch(&batch);
                if let Some(max_id) = accept {
                    nfq.accept_up_to(max_id)?;
                }
            }
            if let (forged @ 1.., sender) = nfq.forged() {
                let why = format!(
                    "{forged} netlink message(s) not from the kernel reached the hold's queue \
                     socket (sender port id {}): a process in the pod's network namespace is \
                     forging NFQUEUE messages",
                    sender.unwrap_or(0)
                );
                let held = {
                    let mut shared = lock(shared);
                    shared.tampered = Some(why);
                    shared.max_id
                };
                // What the kernel queued so far goes now; the release accepts the rest.
                if let Some(max_id) = held {
                    nfq.accept_up_to(max_id)?;
                }
                reading = false;
                stopped.notify_one();
            }
        }
        let mut fds = vec![
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
            PollFd::new(wake.as_fd(), PollFlags::POLLIN),
        ];
        if reading {
            fds.push(PollFd::new(nfq.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(errno) => {
                return Err(nfqueue::Error::Io {
                    queue: nfq.queue_num(),
                    errno,
                })
            }
        }
        let readable = |fd: &PollFd| fd.revents().is_some_and(|r| r.contains(PollFlags::POLLIN));
        if readable(&fds[0]) {
            return Ok(nfq);
        }
        if readable(&fds[1]) {
            // Reset the eventfd (non-blocking; EAGAIN means another read got it first).
            let _ = wake.read();
            let held = {
                let shared = lock(shared);
                if shared.pass_through {
                    shared.max_id
                } else {
                    None
                }
            };
            if let Some(max_id) = held {
                nfq.accept_up_to(max_id)?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 28: a holder thread that stops on an error says why (`failure`) and wakes the
    /// hold's owner, also when nobody waited yet at that moment (before, nothing read
    /// `failure()` and the row said `holding` until the deadline).
    #[tokio::test]
    async fn a_failed_holder_says_why_and_wakes_the_owner() {
        let shared = Mutex::new(Shared::default());
        let stopped = StopSignal::default();
        let e = nfqueue::Error::Io {
            queue: 15015,
            errno: nix::errno::Errno::EBADF,
        };
        holder_failed(&shared, &stopped, 15015, &e);
        assert!(
            lock(&shared)
                .failure
                .as_deref()
                .is_some_and(|f| f.contains("netlink I/O failed")),
            "{:?}",
            lock(&shared).failure
        );
        tokio::time::timeout(Duration::from_secs(1), stopped.notified())
            .await
            .expect("the owner is woken");
    }
}
