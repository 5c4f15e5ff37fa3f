//! When is a pod's proxy ready to take the app's connections?
//!
//! Ready means all of:
//! 1. both capture ports have a TCP socket in LISTEN state in the pod's network namespace (and,
//!    when a DNS capture port is given, a bound UDP socket on it, plus a TCP listener where the
//!    mesh's DNS proxy serves TCP too: `MeshProfile::dns_tcp`, `wanted_listeners`). Asked of the kernel through `sock_diag`
//!    ([`SockDiag`], a netlink socket made once inside the pod's netns): one exact lookup per
//!    port ([`SockDiag::tcp_listening_all`]), a hash probe, unlike `/proc/<pid>/net/tcp` (walks
//!    the whole established table) or a dump (walks the whole listening hash). Checked first,
//!    every poll;
//! 2. then one `GET /stats?filter=...` on the kept-alive admin connection returns Envoy's
//!    `server.state` (0 = LIVE), `server.concurrency` (worker threads) and the filter's gauges,
//!    decided by the pure `decide`: LIVE, and the filter configured on every worker.
//!
//! The admin API is only asked once the ports listen, so a waiting pod does not load its
//! starting Envoy with requests, and the first request after that reuses one connection. From
//! then on the machine checks every millisecond (`machine::LIVE_WINDOW_POLL`): readiness
//! follows the ports within milliseconds, and the release should follow readiness as closely.

use std::sync::Arc;
use std::time::Duration;

use crate::config::HoldSettings;
use crate::effects::envoy_admin::{AdminClient, ErrorCallback, Stats};
use crate::effects::netns::PodNetns;
use crate::effects::procfs::sock_diag::SockDiag;
use crate::effects::procfs::sockets::listening_ports_in_netns;
use crate::mesh::MeshProfile;

/// The filter's stat prefix as `/stats` shows it by default (the filter's `holdfast` inside
/// Envoy's `wasmcustom.` namespace; `DrainSettings.stat_prefix` has the configured one).
pub const DEFAULT_STAT_PREFIX: &str = crate::lifecycle::drain::DEFAULT_STAT_PREFIX;

/// Envoy's server state gauge (`envoy/docs/root/configuration/observability/statistics.rst`:
/// "state, Gauge, Current State of the Server"; `admin.v3.ServerInfo.State`: LIVE = 0,
/// DRAINING = 1, PRE_INITIALIZING = 2, INITIALIZING = 3).
pub(crate) const SERVER_STATE_STAT: &str = "server.state";

/// Envoy's worker-thread count (same document: "concurrency, Gauge, Number of worker threads").
pub(crate) const SERVER_CONCURRENCY_STAT: &str = "server.concurrency";

/// Timeout of one admin request during the hold; the next poll retries.
const ADMIN_TIMEOUT: Duration = Duration::from_millis(500);

/// The cap of the readiness `/stats` answer. [`stats_filter`] matches at most five stats by
/// exact name: Envoy 1.40 answers 141 bytes (docs/benchmarks.md, "Hostile pods"); 16 KiB is
/// over a hundred times that. Anything larger is not Envoy answering this request, and the pod is
/// failed open ([`Readiness::OverBound`]) instead of read again and again.
pub(crate) const READINESS_STATS_MAX: usize = 16 * 1024;

/// One readiness observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Nothing listens on Envoy's admin port: Envoy is not running (yet).
    PortsClosed,
    /// Envoy's admin port listens but the capture ports (or the DNS port, when asked) do not
    /// yet: Envoy is initialising (with Istio: waiting for its listeners from istiod). The
    /// capture ports can open at any moment, usually together with LIVE. (Envoy's
    /// `InstanceImpl::initialize`, source/server/server.cc, starts the admin listener
    /// (`admin_->startHttpListener`) before it makes the listener manager and adds the
    /// bootstrap's listeners; LDS listeners come later still.)
    Starting,
    /// Ports listen but Envoy is not LIVE (or its admin did not answer).
    NotLive,
    /// LIVE, but the holdfast filter is not configured on every worker yet.
    FilterNotLoaded,
    /// Ready for traffic.
    Ready,
    /// The agent may not reach the admin API at all (a Unix socket it lacks the permission
    /// for): the hold is released as without holdfast, not held to its deadline.
    /// `ReadinessProbe::take_violation` says why.
    CannotReach,
    /// What answers on the pod's admin port broke one of the agent's bounds (an answer larger
    /// than `READINESS_STATS_MAX`): the pod is to be failed open, not asked again.
    /// `ReadinessProbe::take_violation` says what happened.
    OverBound,
}

/// What a probe needs beyond the netns and the proxy's ports.
#[derive(Clone, Default)]
pub struct ProbeOptions {
    /// The filter's stat prefix as `/stats` shows it (`DrainSettings.stat_prefix`); empty means
    /// [`DEFAULT_STAT_PREFIX`].
    pub stat_prefix: String,
    /// pilot-agent's DNS capture port (15053) when the pod's DNS is captured: ready then also
    /// needs a TCP listener and a bound UDP socket on it.
    pub dns_port: Option<u16>,
    /// Told the kind of each failed admin request (see
    /// [`AdminClient::with_error_callback`]).
    pub on_admin_error: Option<ErrorCallback>,
}

/// The one admin-error callback: counts each failed request's kind in
/// `holdfast_admin_errors_total{kind}` (readiness probes and the drain's client share it).
pub(crate) fn count_admin_errors(metrics: &crate::report::metrics::Metrics) -> ErrorCallback {
    let errors = metrics.admin_errors.clone();
    Arc::new(move |kind: &'static str| {
        errors
            .get_or_create(&crate::report::metrics::KindLabel {
                kind: kind.to_string(),
            })
            .inc();
    })
}

impl From<&crate::report::metrics::Metrics> for ProbeOptions {
    /// Default prefix, no DNS port, admin errors counted in `holdfast_admin_errors_total`.
    fn from(metrics: &crate::report::metrics::Metrics) -> Self {
        ProbeOptions {
            stat_prefix: DEFAULT_STAT_PREFIX.to_string(),
            dns_port: None,
            on_admin_error: Some(count_admin_errors(metrics)),
        }
    }
}

/// How the listening sockets are read.
enum Sockets {
    /// sock_diag through a netlink socket made in the pod's netns.
    Diag(SockDiag),
    /// `/proc/thread-self/net/tcp{,6}` by a thread entering the netns: only when no sock_diag
    /// socket could be made (a kernel without `CONFIG_INET_DIAG`).
    Procfs(Arc<PodNetns>),
}

/// Probes one pod's proxy.
pub struct ReadinessProbe {
    admin: AdminClient,
    sockets: Sockets,
    /// The capture ports to see listening (the pod's mesh's).
    capture_ports: [u16; 2],
    require_filter: bool,
    stat_prefix: String,
    stats_filter: String,
    dns_port: Option<u16>,
    /// The mesh's DNS proxy serves TCP too (`MeshProfile::dns_tcp`).
    dns_tcp: bool,
    /// Envoy's admin port: listening means Envoy runs (`None`: the admin is a Unix socket, and
    /// the capture ports alone say whether Envoy runs).
    admin_port: Option<u16>,
    /// The admin port was seen listening: not looked up again (one lookup per check while
    /// Envoy starts, as before it starts).
    admin_seen: std::sync::atomic::AtomicBool,
    /// What broke a bound, for [`Readiness::OverBound`].
    violation: std::sync::Mutex<Option<String>>,
}

impl ReadinessProbe {
    /// A probe for the pod in `netns`. `options` takes a [`ProbeOptions`] (or, for today's
    /// caller, `&Metrics`: default prefix, no DNS port).
    pub fn new(
        netns: &PodNetns,
        admin_addr: std::net::SocketAddr,
        profile: &MeshProfile,
        hold: &HoldSettings,
        options: impl Into<ProbeOptions>,
    ) -> crate::effects::netns::Result<Self> {
        let admin = AdminClient::in_netns(netns.try_clone()?, admin_addr);
        Self::with_admin(
            netns,
            admin,
            Some(admin_addr.port()),
            profile,
            hold,
            options,
        )
    }

    /// A probe for the pod in `netns` whose admin API `admin` reaches (TCP in the netns, or
    /// a Unix socket: `admin_port` `None`).
    pub(crate) fn with_admin(
        netns: &PodNetns,
        admin: AdminClient,
        admin_port: Option<u16>,
        profile: &MeshProfile,
        hold: &HoldSettings,
        options: impl Into<ProbeOptions>,
    ) -> crate::effects::netns::Result<Self> {
        let options = options.into();
        let mut admin = admin
            .with_timeout(ADMIN_TIMEOUT)
            .with_max_body(READINESS_STATS_MAX);
        if let Some(on_error) = options.on_admin_error {
            admin = admin.with_error_callback(move |kind| on_error(kind));
        }
        let sockets = match SockDiag::open_in(netns) {
            Ok(diag) => Sockets::Diag(diag),
            Err(e) => {
                tracing::warn!(netns = ?netns.id(), error = %e, "sock_diag unavailable; reading the pod's listeners from procfs (slower)");
                Sockets::Procfs(Arc::new(netns.try_clone()?))
            }
        };
        let stat_prefix = if options.stat_prefix.is_empty() {
            DEFAULT_STAT_PREFIX.to_string()
        } else {
            options.stat_prefix
        };
        Ok(Self {
            admin,
            sockets,
            capture_ports: [profile.outbound_port, profile.inbound_port],
            require_filter: hold.require_filter,
            stats_filter: stats_filter(&stat_prefix),
            stat_prefix,
            dns_port: options.dns_port,
            dns_tcp: profile.dns_tcp,
            admin_port,
            admin_seen: Default::default(),
            violation: Default::default(),
        })
    }

    /// The admin client this probe uses.
    pub fn admin(&self) -> &AdminClient {
        &self.admin
    }

    /// One observation, made through the pod's network namespace (no pid is pinned: the
    /// process the netns was found through may be gone).
    ///
    /// Asks the kernel first, cheapest question first: is Envoy's admin port listening (one
    /// lookup: while Envoy is not running, that is the whole check; once seen, not asked
    /// again: an Envoy that exits and restarts reads as `Starting`), then the capture ports;
    /// only when those listen is Envoy's admin API asked. While Envoy starts, the kept-alive
    /// admin connection is opened ahead (no request).
    pub async fn check(&self) -> Readiness {
        use std::sync::atomic::Ordering::Relaxed;
        if let (false, Some(admin_port)) = (self.admin_seen.load(Relaxed), self.admin_port) {
            match self.listening(&[admin_port]).await {
                Some(true) => self.admin_seen.store(true, Relaxed),
                // Admin not reachable at a loopback address (a custom admin address, or a
                // kernel that cannot say): judge by the capture ports alone.
                None => {}
                Some(false) => return Readiness::PortsClosed,
            }
        }
        if !self.ports_ready().await {
            // Connected now, the admin request that finds Envoy ready does not connect first.
            self.admin.connect_ahead().await;
            return Readiness::Starting;
        }
        let prefix = &self.stat_prefix;
        let wanted = |name: &str| {
            matches!(
                name,
                SERVER_STATE_STAT | SERVER_CONCURRENCY_STAT | WORKERS_STARTED_STAT
            ) || name
                .strip_prefix(prefix.as_str())
                .is_some_and(|rest| matches!(rest, ".workers_ready" | ".loaded"))
        };
        match self
            .admin
            .stats_keeping(Some(&self.stats_filter), false, wanted)
            .await
        {
            Ok(stats) => decide(&stats, &self.stat_prefix, self.require_filter),
            Err(e) if e.is_too_large() => {
                *self.violation.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                Readiness::OverBound
            }
            Err(e) if e.is_denied() => {
                *self.violation.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                Readiness::CannotReach
            }
            // No answer: not known to be LIVE; the next poll asks again.
            Err(_) => Readiness::NotLive,
        }
    }

    /// What made the last check [`Readiness::OverBound`].
    pub(crate) fn take_violation(&self) -> Option<String> {
        self.violation
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Whether every TCP port in `ports` has a listener a loopback SYN reaches (`None`: the
    /// kernel could not say).
    async fn listening(&self, ports: &[u16]) -> Option<bool> {
        match &self.sockets {
            Sockets::Diag(diag) => match diag.tcp_listening_all(ports) {
                Ok(all) => Some(all),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot look up the pod's listeners");
                    None
                }
            },
            Sockets::Procfs(_) => self
                .listening_from_procfs()
                .await
                .ok()
                .map(|open| ports.iter().all(|p| open.contains(p))),
        }
    }

    async fn listening_from_procfs(&self) -> Result<std::collections::HashSet<u16>, String> {
        let Sockets::Procfs(netns) = &self.sockets else {
            return Err("no procfs reader".to_string());
        };
        let netns = netns.clone();
        tokio::task::spawn_blocking(move || {
            listening_ports_in_netns(&netns).map_err(|e| e.to_string())
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
    }

    /// The capture ports (and the DNS port, when asked) listen.
    async fn ports_ready(&self) -> bool {
        let wanted = wanted_listeners(self.capture_ports, self.dns_port, self.dns_tcp);
        if self.listening(&wanted.tcp).await != Some(true) {
            return false;
        }
        let (Some(dns), Sockets::Diag(diag)) = (wanted.udp, &self.sockets) else {
            // Without UDP sock_diag (procfs reads TCP only) a UDP-only DNS proxy cannot be
            // seen: judged by the capture ports alone, never held to the deadline for it.
            return true;
        };
        match diag.udp_bound(dns) {
            Ok(bound) => bound,
            Err(e) => {
                // Fail open: a kernel without UDP sock_diag must not hold the pod to the
                // deadline; the other listeners are then the signal.
                tracing::debug!(error = %e, "cannot list the pod's UDP sockets; DNS not judged");
                true
            }
        }
    }
}

/// The sockets readiness waits for: TCP listeners and a bound UDP port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wanted {
    pub(crate) tcp: Vec<u16>,
    pub(crate) udp: Option<u16>,
}

/// What a pod's proxy must have open before it is ready: the capture ports (TCP), and with a
/// DNS port the UDP socket on it, plus its TCP listener only where the mesh's DNS proxy serves
/// TCP (`dns_tcp`: Istio's pilot-agent; not Kuma's kuma-dp, which serves UDP only).
pub(crate) fn wanted_listeners(capture: [u16; 2], dns_port: Option<u16>, dns_tcp: bool) -> Wanted {
    let mut tcp = capture.to_vec();
    if dns_tcp {
        tcp.extend(dns_port);
    }
    Wanted { tcp, udp: dns_port }
}

/// The `/stats?filter=` regex (RE2) that returns everything [`decide`] reads, in one request.
/// Envoy's gauge that turns 1 when its worker threads have started (initialisation done).
pub(crate) const WORKERS_STARTED_STAT: &str = "listener_manager.workers_started";

pub fn stats_filter(stat_prefix: &str) -> String {
    format!(
        "^(server\\.(state|concurrency)|listener_manager\\.workers_started|{}\\.(workers_ready|loaded))$",
        crate::effects::envoy_admin::regex_escape(stat_prefix)
    )
}

/// The decision, from one `/stats` answer:
/// - `server.state` must be 0 (LIVE) **and** `listener_manager.workers_started` 1; absent or
///   anything else: [`Readiness::NotLive`]. `server.state` alone is not enough: Envoy refreshes
///   that gauge on its stats flush, so it reads 0 while `/ready` still answers PRE_INITIALIZING
///   (seen with Envoy 1.40 while CDS was pending). `workers_started` is set when the workers
///   start, which is when initialisation is done. Readiness probes in the field read both for
///   this reason (the Envoy project's Go `probe.IsReady`: "server state must be 0", "workers
///   started must be 1"; Istio's pilot-agent readiness check likewise).
/// - `<prefix>.workers_ready` (filters that count configured worker VMs, main thread excluded)
///   must reach `server.concurrency`: every worker runs the filter for its connections.
///   Without `server.concurrency` (not seen in Envoy since it was added, kept as a safe
///   default) one configured worker is enough.
/// - Else `<prefix>.loaded` (older filters): must be 1.
/// - No filter stat at all: the filter is not installed; ready unless `require_filter`.
pub(crate) fn decide(stats: &Stats, stat_prefix: &str, require_filter: bool) -> Readiness {
    if stats.get(SERVER_STATE_STAT) != Some(0) || stats.get(WORKERS_STARTED_STAT) != Some(1) {
        return Readiness::NotLive;
    }
    let workers_ready = stats.get(&format!("{stat_prefix}.workers_ready"));
    let loaded = stats.get(&format!("{stat_prefix}.loaded"));
    let filter_ready = match (workers_ready, loaded) {
        (Some(workers), _) => match stats.get(SERVER_CONCURRENCY_STAT) {
            Some(concurrency) => workers >= concurrency,
            None => workers >= 1,
        },
        (None, Some(loaded)) => loaded == 1,
        (None, None) => !require_filter,
    };
    if filter_ready {
        Readiness::Ready
    } else {
        Readiness::FilterNotLoaded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(lines: &str) -> Stats {
        Stats::parse(lines)
    }

    const P: &str = "wasmcustom.holdfast";

    #[test]
    fn decision_table() {
        use Readiness::*;
        let cases: &[(&str, bool, Readiness)] = &[
            // Not LIVE: whatever the filter says.
            ("server.state: 2\nwasmcustom.holdfast.workers_ready: 2\nserver.concurrency: 2\n", false, NotLive),
            ("server.state: 1\n", false, NotLive),
            ("wasmcustom.holdfast.loaded: 1\n", false, NotLive),
            // Per-worker count against Envoy's concurrency.
            ("server.state: 0\nlistener_manager.workers_started: 1\nserver.concurrency: 2\nwasmcustom.holdfast.workers_ready: 1\n", false, FilterNotLoaded),
            ("server.state: 0\nlistener_manager.workers_started: 1\nserver.concurrency: 2\nwasmcustom.holdfast.workers_ready: 2\nwasmcustom.holdfast.loaded: 1\n", false, Ready),
            ("server.state: 0\nlistener_manager.workers_started: 1\nserver.concurrency: 2\nwasmcustom.holdfast.workers_ready: 0\nwasmcustom.holdfast.loaded: 1\n", true, FilterNotLoaded),
            ("server.state: 0\nlistener_manager.workers_started: 1\nwasmcustom.holdfast.workers_ready: 1\n", true, Ready),
            ("server.state: 0\nlistener_manager.workers_started: 1\nwasmcustom.holdfast.workers_ready: 0\n", false, FilterNotLoaded),
            // Older filter: `loaded` only.
            ("server.state: 0\nlistener_manager.workers_started: 1\nserver.concurrency: 2\nwasmcustom.holdfast.loaded: 1\n", true, Ready),
            ("server.state: 0\nlistener_manager.workers_started: 1\nserver.concurrency: 2\nwasmcustom.holdfast.loaded: 0\n", false, FilterNotLoaded),
            // No filter.
            ("server.state: 0\nlistener_manager.workers_started: 1\nserver.concurrency: 2\n", false, Ready),
            ("server.state: 0\nlistener_manager.workers_started: 1\nserver.concurrency: 2\n", true, FilterNotLoaded),
            // Another prefix's stats do not count.
            ("server.state: 0\nlistener_manager.workers_started: 1\nserver.concurrency: 1\nwasmcustom.other.workers_ready: 1\n", true, FilterNotLoaded),
        ];
        for (text, require, expected) in cases {
            assert_eq!(
                decide(&stats(text), P, *require),
                *expected,
                "require_filter {require}: {text:?}"
            );
        }
    }

    #[test]
    fn stale_server_state_is_not_live() {
        // Envoy refreshes server.state on its stats flush: 0 before initialisation is done.
        let s = stats("server.state: 0\nlistener_manager.workers_started: 0\nserver.concurrency: 1\nwasmcustom.holdfast.loaded: 1\n");
        assert_eq!(decide(&s, P, false), Readiness::NotLive);
    }

    #[test]
    fn honours_the_configured_prefix() {
        let s = stats("server.state: 0\nlistener_manager.workers_started: 1\nserver.concurrency: 1\nwasmcustom.hf_2.workers_ready: 1\n");
        assert_eq!(decide(&s, "wasmcustom.hf_2", true), Readiness::Ready);
        assert_eq!(decide(&s, P, true), Readiness::FilterNotLoaded);
        assert_eq!(
            stats_filter("wasmcustom.hf_2"),
            "^(server\\.(state|concurrency)|listener_manager\\.workers_started|wasmcustom\\.hf_2\\.(workers_ready|loaded))$"
        );
    }
}
