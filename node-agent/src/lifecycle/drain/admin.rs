//! The admin side of a drain and a Job quit: what the executors ask of a pod's Envoy
//! ([`ProxyAdmin`], implemented for [`PodProxy`]: the pod's [`AdminClient`] and its mesh's
//! listeners; a scripted fake in the tests) and how
//! (`Drainer`: every call under the drain's timeout and a bounded number of attempts,
//! refusals counted — enough of them mean Envoy has exited — errors kept for the report).

use std::future::Future;
use std::time::{Duration, SystemTime};

// tokio's clock throughout, so paused-time tests drive the deadlines.
use tokio::time::Instant;

use super::envoy_version;
use super::in_flight::{self, DrainSample};
use super::{DrainSettings, DrainStep, QuitReason, QUIT_PATH, SERVER_INFO_PATH};
use std::sync::Arc;

use crate::effects::envoy_admin::{AdminClient, ServerState};
use crate::effects::netns::PodNetns;
use crate::effects::procfs::sock_diag::SockDiag;

/// The cap of `/server_info`'s answer, read once per drain: Envoy 1.36.4 and 1.40.0 answer
/// 100–125 KB for a small sidecar (measured: the node's list of every compiled-in extension is
/// most of it), so 1 MiB leaves room and still bounds what a pod's Envoy can make the agent
/// read.
const SERVER_INFO_MAX: usize = 1 << 20;

/// The cap of a drain sample's `/stats` answer. The sample asks only for what the judge reads
/// ([`in_flight::sample_regex`], with `usedonly`: Envoy's `StatsParams::parse`,
/// source/server/admin/stats_params.cc, lists only stats ever updated and matching the RE2
/// filter, on 1.36 and 1.40 alike): the filter's five stats and four per HTTP or TCP listener
/// prefix that carried traffic — ~350 bytes for the simulated sidecar, ~360 more per used TCP
/// route that names its cluster. 64 KiB, four times the readiness cap
/// (`crate::lifecycle::readiness::READINESS_STATS_MAX`), is ~170 used TCP routes: past a
/// sidecar's usual share, and a bound on what a pod's Envoy can make the agent read every
/// sample of a long drain. A larger answer is a failed sample.
pub const DRAIN_SAMPLE_MAX: usize = 64 * 1024;

/// Most errors kept in a report (the count is kept in full).
const MAX_ERRORS_KEPT: usize = 10;

/// A failed admin request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminFailure {
    /// The connection was refused (nothing listens: Envoy has exited).
    pub(crate) refused: bool,
    pub(crate) message: String,
}

impl std::fmt::Display for AdminFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<crate::effects::envoy_admin::Error> for AdminFailure {
    fn from(e: crate::effects::envoy_admin::Error) -> Self {
        // Only a refused connection means "nothing listens" ([`Error::is_refused`]: the
        // connector keeps the `io::ErrorKind`). Other connect failures (entering the netns
        // failed, no thread could be spawned) say nothing about Envoy.
        //
        // [`Error::is_refused`]: crate::effects::envoy_admin::Error::is_refused
        AdminFailure {
            refused: e.is_refused(),
            message: e.to_string(),
        }
    }
}

/// What the drain asks of a pod's Envoy admin API.
pub trait ProxyAdmin: Send + Sync {
    /// `POST path`; any 2xx is success.
    fn admin_post(&self, path: &str) -> impl Future<Output = Result<(), AdminFailure>> + Send;
    /// One sample: the filter's counts under `prefix` and Envoy's downstream byte counters,
    /// in one `/stats` request.
    fn drain_sample(
        &self,
        prefix: &str,
    ) -> impl Future<Output = Result<DrainSample, AdminFailure>> + Send;
    /// Any answer from the admin API (`GET /ready`, whatever the state).
    fn probe(&self) -> impl Future<Output = Result<(), AdminFailure>> + Send;
    /// The body of `GET /server_info` (JSON; its `version` decides the inbound drain call).
    fn server_info(&self) -> impl Future<Output = Result<Vec<u8>, AdminFailure>> + Send;
    /// Whether Envoy's health check is failed right now (`GET /ready` answers `DRAINING` once
    /// `/healthcheck/fail` was called: `server_.healthCheckFailed()`, read at the request, in
    /// Envoy's `source/server/admin/server_info_handler.cc::handlerReady`). The `server.state`
    /// gauge in the drain's samples says the same only after Envoy's next stats flush (5 s by
    /// default), too late for the outbound calls of an app still shutting down.
    fn health_check_failed(&self) -> impl Future<Output = Result<bool, AdminFailure>> + Send;
    /// Bytes the pod's TCP sockets still hold for their peers in the kernel's send queues
    /// ([`DrainSample::send_queued`]); `None` when it cannot be known (logged by the
    /// implementation: the judgement then rests on Envoy's counts alone, as before).
    fn send_queued(&self) -> impl Future<Output = Option<u64>> + Send;
}

/// What the agent drains a pod with: its Envoy's admin API ([`AdminClient`], made in the pod's
/// netns) and a sock_diag socket made in the same netns, for the kernel's send queues that
/// Envoy's counters cannot see ([`in_flight`]'s module docs).
pub struct PodProxy {
    pub(crate) admin: AdminClient,
    sockets: Option<Arc<SockDiag>>,
    /// The mesh's own listeners, left out of the idle test (`MeshProfile::own_http_prefixes`).
    own_http_prefixes: &'static [&'static str],
    /// The capture ports whose listeners give the directional counts where the filter cannot
    /// (`MeshProfile::listener_counts`); `None`: the filter's only.
    listener_ports: Option<in_flight::ListenerPorts>,
}

impl PodProxy {
    /// `admin` with the pod's sock_diag socket (`PodProxy::open_sockets`), for a pod of the
    /// mesh `profile`: its own listeners are left out of the idle test
    /// (`MeshProfile::own_http_prefixes`), and its capture listeners give the counts where the
    /// mesh says so (`in_flight::listener_counts`: Consul's, which cannot load the filter).
    pub fn new(
        admin: AdminClient,
        sockets: Option<SockDiag>,
        profile: &crate::mesh::MeshProfile,
    ) -> PodProxy {
        PodProxy {
            admin,
            sockets: sockets.map(Arc::new),
            own_http_prefixes: profile.own_http_prefixes,
            listener_ports: profile
                .listener_ports()
                .map(|(outbound, inbound)| in_flight::ListenerPorts { outbound, inbound }),
        }
    }

    /// A sock_diag socket made in `netns`; without one (a kernel without `CONFIG_INET_DIAG`)
    /// the send queues are unknown, and the drain judges as before.
    pub(crate) fn open_sockets(netns: &PodNetns) -> Option<SockDiag> {
        SockDiag::open_in(netns)
            .inspect_err(|e| {
                tracing::warn!(netns = ?netns.id(), error = %e, "sock_diag unavailable: the drain cannot see bytes still queued in the pod's sockets");
            })
            .ok()
    }
}

impl ProxyAdmin for PodProxy {
    async fn admin_post(&self, path: &str) -> Result<(), AdminFailure> {
        self.admin
            .post(path)
            .await
            .map(|_| ())
            .map_err(AdminFailure::from)
    }

    async fn drain_sample(&self, prefix: &str) -> Result<DrainSample, AdminFailure> {
        sample_with(
            &self.admin,
            prefix,
            self.own_http_prefixes,
            self.listener_ports,
        )
        .await
    }

    async fn probe(&self) -> Result<(), AdminFailure> {
        self.admin
            .ready()
            .await
            .map(|_| ())
            .map_err(AdminFailure::from)
    }

    async fn health_check_failed(&self) -> Result<bool, AdminFailure> {
        self.admin
            .ready()
            .await
            .map(|state| state == ServerState::Draining)
            .map_err(AdminFailure::from)
    }

    async fn server_info(&self) -> Result<Vec<u8>, AdminFailure> {
        let response = self
            .admin
            .request_capped("GET", SERVER_INFO_PATH, SERVER_INFO_MAX)
            .await?;
        if response.status != 200 {
            return Err(AdminFailure {
                refused: false,
                message: format!(
                    "Envoy admin: GET {SERVER_INFO_PATH} answered HTTP {}",
                    response.status
                ),
            });
        }
        Ok(response.body)
    }

    /// `None` without a sock_diag socket (`PodProxy::open_sockets`).
    async fn send_queued(&self) -> Option<u64> {
        let diag = self.sockets.clone()?;
        // Not the agent's own connections to the admin API (their last answer waits for the
        // agent's delayed ACK: seen on every sample otherwise).
        let admin_port = self.admin.addr().port();
        // A dump walks the namespace's established hash: off the async workers.
        match tokio::task::spawn_blocking(move || diag.tcp_send_queued(admin_port)).await {
            Ok(Ok(bytes)) => Some(bytes),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot read the pod's socket send queues");
                None
            }
            Err(e) => {
                tracing::debug!(error = %e, "the send-queue query did not finish");
                None
            }
        }
    }
}

/// One drain sample from `admin`, the listeners in `own` left out of the traffic bytes.
async fn sample_with(
    admin: &AdminClient,
    prefix: &str,
    own: &[&str],
    ports: Option<in_flight::ListenerPorts>,
) -> Result<DrainSample, AdminFailure> {
    // Only the lines the judge reads are kept, whatever else the answer holds.
    let stats = admin
        .stats_keeping_capped(
            Some(&in_flight::sample_regex_with_listeners(prefix, ports)),
            true,
            DRAIN_SAMPLE_MAX,
            |name| in_flight::sample_keeps_with_listeners(prefix, ports, name),
        )
        .await?;
    Ok(DrainSample::from_stats_with_listeners(
        prefix,
        own,
        ports,
        stats.values.iter().map(|(k, v)| (k.as_str(), *v)),
    ))
}

/// Collected errors, bounded.
#[derive(Debug, Default)]
pub(super) struct Errors {
    pub(super) kept: Vec<String>,
    pub(super) count: usize,
}

impl Errors {
    pub(super) fn push(&mut self, message: String) {
        tracing::warn!("{message}");
        self.count += 1;
        if self.kept.len() < MAX_ERRORS_KEPT {
            self.kept.push(message);
        }
    }
}

/// The admin side of a drain or a Job quit.
pub(super) struct Drainer<'a, A> {
    pub(super) admin: &'a A,
    pub(super) settings: &'a DrainSettings,
    pub(super) errors: Errors,
    /// Consecutive refused connections.
    pub(super) refusals: u32,
    /// Start of the drain or Job watch, monotonic and wall-clock, to put instants in reports.
    pub(super) t0: Instant,
    pub(super) t0_wall: SystemTime,
    pub(super) steps: Option<tokio::sync::mpsc::UnboundedSender<DrainStep>>,
}

impl<'a, A> Drainer<'a, A> {
    pub(super) fn new(
        admin: &'a A,
        settings: &'a DrainSettings,
        steps: Option<tokio::sync::mpsc::UnboundedSender<DrainStep>>,
        t0: Instant,
        t0_wall: SystemTime,
    ) -> Self {
        Drainer {
            admin,
            settings,
            errors: Errors::default(),
            refusals: 0,
            t0,
            t0_wall,
            steps,
        }
    }
}

impl<A: ProxyAdmin> Drainer<'_, A> {
    /// Whether Envoy has exited: its admin port refused enough connections in a row. The one
    /// "Envoy gone" test of the drain and the Job watch.
    pub(super) fn envoy_gone(&self) -> bool {
        self.refusals >= self.settings.refusals_for_gone
    }

    /// Tells a step to whoever follows the drain (nobody: fine).
    pub(super) fn tell(&self, step: DrainStep) {
        if let Some(tx) = &self.steps {
            let _ = tx.send(step);
        }
    }

    /// Wall-clock time of a monotonic instant.
    pub(super) fn wall(&self, at: Instant) -> SystemTime {
        match at.checked_duration_since(self.t0) {
            Some(after) => self.t0_wall + after,
            None => self
                .t0_wall
                .checked_sub(self.t0.duration_since(at))
                .unwrap_or(self.t0_wall),
        }
    }

    /// One admin call under the drain's own timeout; tracks refusals.
    pub(super) async fn call<T>(
        &mut self,
        what: &str,
        f: impl Future<Output = Result<T, AdminFailure>>,
    ) -> Result<T, AdminFailure> {
        let result = match tokio::time::timeout(self.settings.admin_timeout, f).await {
            Ok(r) => r,
            Err(_) => Err(AdminFailure {
                refused: false,
                message: format!(
                    "Envoy admin: {what} timed out after {}",
                    crate::config::format_duration(self.settings.admin_timeout)
                ),
            }),
        };
        match &result {
            Ok(_) => self.refusals = 0,
            Err(f) if f.refused => self.refusals += 1,
            Err(_) => {}
        }
        result
    }

    /// Whether Envoy's health check is failed now ([`ProxyAdmin::health_check_failed`]); an
    /// unanswered question counts as not failed (nothing is undone on a guess).
    pub(super) async fn health_check_failed_now(&mut self) -> bool {
        let admin = self.admin;
        matches!(
            self.call("GET /ready", admin.health_check_failed()).await,
            Ok(true)
        )
    }

    /// `POST path`, retried up to `admin_attempts` times; stops early once Envoy is known gone.
    pub(super) async fn post_retrying(&mut self, path: &str) -> bool {
        let attempts = self.settings.admin_attempts.max(1);
        for attempt in 1..=attempts {
            let admin = self.admin;
            match self.call(path, admin.admin_post(path)).await {
                Ok(()) => {
                    tracing::debug!(path, attempt, "admin POST ok");
                    return true;
                }
                Err(e) => {
                    if self.envoy_gone() {
                        // Nothing listens: Envoy has exited. Not an error in itself; the drain
                        // judges it (proxy gone early, or gone with the app).
                        tracing::debug!(path, error = %e, "admin refused; Envoy has exited");
                        return false;
                    }
                    if attempt == attempts {
                        self.errors.push(format!(
                            "POST {path} failed after {attempt} attempt(s): {e}"
                        ));
                        return false;
                    }
                    tracing::debug!(path, attempt, error = %e, "admin POST failed; retrying");
                    tokio::time::sleep(self.settings.retry_backoff).await;
                }
            }
        }
        false
    }

    /// The Envoy version from `/server_info`, once per drain; `None` when it cannot be read or
    /// parsed (logged, not an error of the drain: the call for a current Envoy follows).
    pub(super) async fn envoy_version(&mut self) -> Option<envoy_version::EnvoyVersion> {
        let admin = self.admin;
        match self.call("GET /server_info", admin.server_info()).await {
            Ok(body) => {
                let version = envoy_version::EnvoyVersion::from_server_info(&body);
                if version.is_none() {
                    tracing::debug!(
                        "no Envoy version in /server_info; draining as for a current Envoy"
                    );
                }
                version
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot read /server_info; draining as for a current Envoy");
                None
            }
        }
    }

    /// One sample of the counts, with the kernel's send queues when `send_queues` (only what
    /// is judged needs them: once the app is gone; while it runs the samples only give the
    /// judge its byte history, and the queues' dump walks the node's whole TCP hash: 14 % of
    /// the agent's CPU beside the issue 29 many-processes attacker's drain, every 100 ms).
    /// `Err(())` when it failed (already recorded).
    pub(super) async fn sample(&mut self, send_queues: bool) -> Result<DrainSample, ()> {
        let admin = self.admin;
        let prefix = self.settings.stat_prefix.as_str();
        match self.call("GET /stats", admin.drain_sample(prefix)).await {
            Ok(c) if !send_queues => Ok(c),
            // Then the kernel's send queues, which Envoy's counts cannot see: after them, so
            // bytes Envoy wrote during the `/stats` request are seen queued, not lost between.
            Ok(mut c) => {
                c.send_queued =
                    tokio::time::timeout(self.settings.admin_timeout, admin.send_queued())
                        .await
                        .ok()
                        .flatten();
                Ok(c)
            }
            Err(e) if e.refused => {
                tracing::debug!(error = %e, "admin refused the connection");
                Err(())
            }
            Err(e) => {
                self.errors
                    .push(format!("reading the proxy's counts failed: {e}"));
                Err(())
            }
        }
    }

    /// `POST /quitquitquit`, then watches the admin API go away (bounded by `quit_confirm`).
    /// Returns when the quit was sent and when the proxy was seen gone.
    pub(super) async fn quit(
        &mut self,
        reason: QuitReason,
    ) -> (Option<SystemTime>, Option<SystemTime>) {
        self.tell(DrainStep::Quitting(reason));
        let attempts = self.settings.admin_attempts.max(1);
        let mut sent = None;
        for attempt in 1..=attempts {
            let before = Instant::now();
            let admin = self.admin;
            match self.call(QUIT_PATH, admin.admin_post(QUIT_PATH)).await {
                Ok(()) => {
                    sent = Some(before);
                    break;
                }
                Err(e) if e.refused => {
                    // Nothing listens: Envoy has exited already (on its own, or an earlier
                    // attempt worked and its answer was lost).
                    if sent.is_none() {
                        tracing::info!("the proxy had already exited when asked to quit");
                    }
                    return (sent.map(|s| self.wall(s)), Some(self.wall(Instant::now())));
                }
                Err(e) => {
                    // Envoy may exit before it finishes answering: retry only while it still
                    // answers.
                    sent = Some(before);
                    if attempt == attempts {
                        self.errors.push(format!("POST {QUIT_PATH}: {e}"));
                    } else {
                        tracing::debug!(error = %e, "quit request failed; checking whether the proxy exits");
                        if let Some(gone) = self
                            .wait_gone(self.settings.retry_backoff.max(Duration::from_millis(50)))
                            .await
                        {
                            return (sent.map(|s| self.wall(s)), Some(self.wall(gone)));
                        }
                    }
                }
            }
        }
        let sent_at = sent.map(|s| self.wall(s));
        match self.wait_gone(self.settings.quit_confirm).await {
            Some(gone) => (sent_at, Some(self.wall(gone))),
            None => {
                self.errors.push(format!(
                    "the proxy still answered {} after /quitquitquit",
                    crate::config::format_duration(self.settings.quit_confirm)
                ));
                (sent_at, None)
            }
        }
    }

    /// Polls the admin API until it refuses connections; returns when, or `None` after `limit`.
    pub(super) async fn wait_gone(&mut self, limit: Duration) -> Option<Instant> {
        let until = Instant::now() + limit;
        let poll = self.settings.settle_poll.max(Duration::from_millis(1));
        while Instant::now() < until {
            let admin = self.admin;
            if let Err(e) = self.call("GET /ready", admin.probe()).await {
                if e.refused {
                    return Some(Instant::now());
                }
            }
            tokio::time::sleep(poll).await;
        }
        None
    }
}
