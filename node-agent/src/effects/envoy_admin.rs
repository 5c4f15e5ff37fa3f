//! A small async client for Envoy's admin API, reached inside a pod's network namespace.
//!
//! Owns the agent's conversation with Envoy: `GET /ready`, `GET /stats?filter=...`,
//! `GET /server_info` (the drain's Envoy version), and the `POST`s of the drain (the inbound
//! drain `lifecycle::drain::envoy_version` picks, `/healthcheck/ok`, `/quitquitquit`). A TCP
//! admin's socket is created in the pod's netns ([`PodNetns::connect_tcp`]), a Unix-socket
//! admin's is connected by the caller's `UnixConnector` ([`AdminClient::unix`]); either is
//! handed to tokio, so the runtime stays in the host's netns. Tests plug in another connector to
//! reach a fake server on 127.0.0.1 without a netns.
//!
//! HTTP/1.1 on hyper (`crate::effects::http1_client`; Envoy's admin answers HTTP/1.0 with 426) over one
//! kept-alive connection per client: a readiness poll every few milliseconds costs one request,
//! not a connection (and a thread to enter the netns) each time. A closed connection is
//! replaced on the next request. Bodies are capped to what the agent reads — `/ready` and the
//! `POST`s at `SMALL_ANSWER_MAX`, `/stats` at the client's cap (`DEFAULT_MAX_BODY`, set
//! lower by readiness) — and an answer over its cap is [`Error::TooLarge`], read no further:
//! a pod's Envoy (or whatever listens on its admin port) cannot make the agent read megabytes.
//! Every exchange has a connect and a response timeout. Failures are reported by kind through a callback
//! ([`AdminClient::with_error_callback`]), so this module knows nothing of metrics.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use crate::effects::http1_client::{Connection, Failure};
use crate::effects::netns::PodNetns;

/// The reference mesh's Envoy admin address (`crate::mesh::REFERENCE_ADMIN`), for tests and
/// tools: the agent asks each pod's own (`MeshProfile::admin`).
pub const DEFAULT_ADMIN_ADDR: SocketAddr = crate::mesh::REFERENCE_ADMIN;

/// The cap of an answer that is a word or two (`/ready`: `LIVE`; the `POST`s: `OK`): Envoy's
/// admin handlers write a status word (source/server/admin/admin.cc, server_cmd_handler.cc).
pub(crate) const SMALL_ANSWER_MAX: usize = 4 * 1024;

/// The default cap of a `/stats` answer: the drain's sample, the largest the agent asks for,
/// lists its filter's stats and two byte counters per HTTP or TCP listener prefix that carried
/// traffic (`usedonly`). Measured on the simulated sidecar (Envoy 1.40 with Istio's listeners and
/// stats matcher, docs/benchmarks.md, "Hostile pods"): 352 bytes; a sidecar whose TCP routes each name their cluster (`tcp.outbound|port||host.`)
/// adds ~180 bytes per used route, so 1 MiB is ~5,000 used routes: far past any pod's.
pub(crate) const DEFAULT_MAX_BODY: usize = 1 << 20;

/// Where an admin client connects, as its errors and logs name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminAddr {
    Tcp(SocketAddr),
    /// A Unix socket, as the proxy's filesystem names it.
    Unix(Arc<str>),
}

impl std::fmt::Display for AdminAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminAddr::Tcp(a) => write!(f, "{a}"),
            AdminAddr::Unix(p) => write!(f, "unix:{p}"),
        }
    }
}

impl From<SocketAddr> for AdminAddr {
    fn from(a: SocketAddr) -> AdminAddr {
        AdminAddr::Tcp(a)
    }
}

/// Errors of this module, by kind.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot connect to Envoy admin at {addr}: {reason}")]
    Connect {
        addr: AdminAddr,
        reason: String,
        /// The connection was refused: nothing listens on the admin port.
        refused: bool,
        /// The agent may not connect (a Unix socket it lacks the permission for): asking
        /// again will not help.
        denied: bool,
    },
    #[error("Envoy admin at {addr}: {what} timed out after {after:?}")]
    Timeout {
        addr: AdminAddr,
        what: &'static str,
        after: Duration,
    },
    #[error("Envoy admin at {addr}: {path} answered HTTP {status}: {body}")]
    Http {
        addr: AdminAddr,
        path: String,
        status: u16,
        /// The start of the body, for the log.
        body: String,
    },
    #[error("Envoy admin at {addr}: malformed response: {reason}")]
    Malformed { addr: AdminAddr, reason: String },
    #[error("Envoy admin at {addr}: {path} answered more than the agent reads: {reason}")]
    TooLarge {
        addr: AdminAddr,
        path: String,
        reason: String,
    },
    #[error("Envoy admin at {addr}: {}connection closed: {reason}", if *.sent { "no complete response, " } else { "" })]
    Closed {
        addr: AdminAddr,
        reason: String,
        /// The request was written: the answer is missing or cut short (kind `malformed`, as
        /// for any response that is not a whole HTTP answer); otherwise kind `io`.
        sent: bool,
    },
    #[error("Envoy admin at {addr}: I/O error: {source}")]
    Io {
        addr: AdminAddr,
        source: std::io::Error,
    },
}

impl Error {
    /// A short label, usable as a metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Connect { .. } => "connect",
            Error::Timeout { .. } => "timeout",
            Error::Http { .. } => "http",
            Error::Malformed { .. } => "malformed",
            Error::TooLarge { .. } => "too-large",
            Error::Closed { sent: true, .. } => "malformed",
            Error::Io { .. } | Error::Closed { .. } => "io",
        }
    }

    /// Whether the admin port refused the connection (nothing listens: Envoy not started yet,
    /// or gone). Other connect failures (entering the netns failed) say nothing about Envoy.
    pub fn is_refused(&self) -> bool {
        matches!(self, Error::Connect { refused: true, .. })
    }

    /// Whether the agent may not connect at all (permission denied): asking again will not help.
    pub fn is_denied(&self) -> bool {
        matches!(self, Error::Connect { denied: true, .. })
    }

    /// Whether the answer broke the body cap: not a fault of the agent or the network, but of
    /// what answers on the pod's admin port.
    pub fn is_too_large(&self) -> bool {
        matches!(self, Error::TooLarge { .. })
    }

    /// The HTTP status, for `Http` errors.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Http { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Result of this module.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// Envoy's server state, as `/ready` reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum ServerState {
    /// 200 `LIVE`.
    Live,
    /// 503 `DRAINING` (after `/healthcheck/fail`, or while draining).
    Draining,
    /// 503 `PRE_INITIALIZING`.
    PreInitializing,
    /// 503 `INITIALIZING`.
    Initializing,
    /// Any other body with status 200 or 503.
    Other { status: u16, body: String },
}

impl ServerState {
    pub fn is_live(&self) -> bool {
        *self == ServerState::Live
    }
}

/// Parsed `/stats` text output.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Counters and gauges, by name.
    pub values: BTreeMap<String, u64>,
    /// Histogram and text-readout lines, skipped.
    pub skipped: usize,
    /// Lines that could not be parsed (at most [`Stats::MAX_MALFORMED_KEPT`] kept; counted in
    /// `malformed_count`).
    pub malformed: Vec<String>,
    pub malformed_count: usize,
}

impl Stats {
    pub const MAX_MALFORMED_KEPT: usize = 10;

    pub fn get(&self, name: &str) -> Option<u64> {
        self.values.get(name).copied()
    }

    /// Parses Envoy's text stats (`name: value` per line). Never fails: bad lines are reported
    /// in `malformed`, histograms and text readouts are skipped.
    pub fn parse(text: &str) -> Stats {
        Stats::parse_keeping(text, |_| true)
    }

    /// [`parse`](Self::parse), keeping only the values whose name `keep` accepts (the others
    /// count as `skipped`): what answers on a pod's admin port may list anything, and only
    /// what the agent reads takes memory.
    pub(crate) fn parse_keeping(text: &str, keep: impl Fn(&str) -> bool) -> Stats {
        let mut stats = Stats::default();
        for line in text.lines() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() {
                continue;
            }
            let parsed = line.split_once(": ").and_then(|(name, value)| {
                let name = name.trim();
                (!name.is_empty() && !name.contains(char::is_whitespace))
                    .then_some((name, value.trim()))
            });
            let Some((name, value)) = parsed else {
                stats.note_malformed(line);
                continue;
            };
            if !keep(name) {
                stats.skipped += 1;
            } else if let Ok(number) = value.parse::<u64>() {
                stats.values.insert(name.to_string(), number);
            } else if value.starts_with("P0(")
                || value.starts_with("No recorded values")
                || value.starts_with('"')
            {
                stats.skipped += 1;
            } else {
                stats.note_malformed(line);
            }
        }
        stats
    }

    fn note_malformed(&mut self, line: &str) {
        self.malformed_count += 1;
        if self.malformed.len() < Self::MAX_MALFORMED_KEPT {
            self.malformed.push(line.chars().take(200).collect());
        }
    }
}

/// An HTTP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
    /// No answer came: the connection closed after the request was written. Only
    /// `POST /quitquitquit` turns that into a success (Envoy exits as asked), with status 0.
    pub closed_early: bool,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Makes a connected, blocking TCP stream to an address within a timeout. Called on a blocking
/// thread.
pub(crate) type Connector =
    Arc<dyn Fn(SocketAddr, Duration) -> std::io::Result<std::net::TcpStream> + Send + Sync>;

/// Makes a connected, blocking Unix stream to Envoy's admin socket within a timeout. Called on a
/// blocking thread.
pub(crate) type UnixConnector =
    Arc<dyn Fn(Duration) -> std::io::Result<std::os::unix::net::UnixStream> + Send + Sync>;

/// How a client reaches the admin API.
#[derive(Clone)]
enum Dial {
    Tcp(Connector),
    Unix(UnixConnector),
}

/// A connected admin stream, TCP or Unix.
trait AdminIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> AdminIo for T {}

/// Told the [`Error::kind`] of every failed request that is a real failure (see
/// [`AdminClient::with_error_callback`]).
pub(crate) type ErrorCallback = Arc<dyn Fn(&'static str) + Send + Sync>;

/// The path that asks Envoy to exit (one definition, the mesh layer's).
pub(crate) use crate::mesh::QUIT_PATH;

/// State shared by a client and its clones: the kept-alive connection.
struct Shared {
    connection: tokio::sync::Mutex<Option<Connection>>,
    /// `/quitquitquit` was sent: from then on a refused or closed connection is Envoy doing as
    /// asked, not a failure to count.
    quit_sent: AtomicBool,
}

/// A client for one Envoy's admin API. Clones share one kept-alive connection (requests take
/// turns on it); a closed or failed connection is replaced on the next request.
#[derive(Clone)]
pub struct AdminClient {
    addr: SocketAddr,
    /// What errors and logs name (`addr`, or the Unix socket's path).
    shown: AdminAddr,
    dial: Dial,
    connect_timeout: Duration,
    response_timeout: Duration,
    max_body: usize,
    on_error: Option<ErrorCallback>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminClient")
            .field("addr", &self.shown)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("max_body", &self.max_body)
            .finish()
    }
}

impl AdminClient {
    /// Envoy's admin inside a pod's netns (sockets are created in the netns). Takes a
    /// `PodNetns` or an `Arc<PodNetns>`.
    pub fn in_netns(netns: impl Into<Arc<PodNetns>>, addr: SocketAddr) -> AdminClient {
        let netns: Arc<PodNetns> = netns.into();
        AdminClient::with_connector(
            addr,
            Arc::new(move |addr, timeout| {
                netns.connect_tcp(addr, timeout).map_err(|e| match e {
                    // Keep the kind (TimedOut, ConnectionRefused) for the error mapping.
                    crate::effects::netns::Error::Connect { source, .. } => source,
                    other => std::io::Error::other(other.to_string()),
                })
            }),
        )
    }

    /// Envoy's admin reachable from the agent's own netns (tests, local runs).
    pub fn local(addr: SocketAddr) -> AdminClient {
        AdminClient::with_connector(
            addr,
            Arc::new(|addr, timeout| std::net::TcpStream::connect_timeout(&addr, timeout)),
        )
    }

    /// Any way of connecting (tests).
    pub fn with_connector(addr: SocketAddr, connector: Connector) -> AdminClient {
        AdminClient {
            addr,
            shown: AdminAddr::Tcp(addr),
            dial: Dial::Tcp(connector),
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(5),
            max_body: DEFAULT_MAX_BODY,
            on_error: None,
            shared: Arc::new(Shared {
                connection: tokio::sync::Mutex::new(None),
                quit_sent: AtomicBool::new(false),
            }),
        }
    }

    /// Sets the connect and response timeouts.
    pub fn with_timeouts(mut self, connect: Duration, response: Duration) -> AdminClient {
        self.connect_timeout = connect;
        self.response_timeout = response;
        self
    }

    /// Sets both the connect and the response timeout.
    pub(crate) fn with_timeout(self, timeout: Duration) -> AdminClient {
        self.with_timeouts(timeout, timeout)
    }

    /// Sets the body cap.
    pub fn with_max_body(mut self, max_body: usize) -> AdminClient {
        self.max_body = max_body;
        self
    }

    /// Calls `on_error(kind)` for every failed request that is a real failure, with
    /// [`Error::kind`] (`connect`, `timeout`, `http`, `malformed`, `io`). Not told: a refused or
    /// closed connection once `/quitquitquit` was sent (Envoy exiting as asked), and the close
    /// that answers `/quitquitquit` itself (a success).
    pub fn with_error_callback(
        mut self,
        on_error: impl Fn(&'static str) + Send + Sync + 'static,
    ) -> AdminClient {
        self.on_error = Some(Arc::new(on_error));
        self
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `GET /ready`: 200 `LIVE`, 503 with the state otherwise.
    pub async fn ready(&self) -> Result<ServerState> {
        let response = self
            .request_capped("GET", "/ready", SMALL_ANSWER_MAX)
            .await?;
        let body = response.text();
        let body = body.trim();
        match (response.status, body) {
            (200, "LIVE") => Ok(ServerState::Live),
            (503, "DRAINING") => Ok(ServerState::Draining),
            (503, "PRE_INITIALIZING") => Ok(ServerState::PreInitializing),
            (503, "INITIALIZING") => Ok(ServerState::Initializing),
            (200 | 503, other) => Ok(ServerState::Other {
                status: response.status,
                body: other.chars().take(200).collect(),
            }),
            (status, _) => Err(self.http_error("/ready", status, &response.body)),
        }
    }

    /// `GET /stats[?filter=<regex>]`, parsed. The filter (an RE2 regex) is percent-encoded here;
    /// text matched literally goes through [`regex_escape`].
    pub async fn stats(&self, filter: Option<&str>) -> Result<Stats> {
        self.stats_with(filter, false).await
    }

    /// Like [`stats`](Self::stats); `used_only` adds `usedonly` (stats that were ever updated),
    /// as pilot-agent's drain poll does.
    pub async fn stats_with(&self, filter: Option<&str>, used_only: bool) -> Result<Stats> {
        self.stats_keeping(filter, used_only, |_| true).await
    }

    /// Like [`stats_with`](Self::stats_with), keeping only the values `keep` accepts (see
    /// [`Stats::parse_keeping`]).
    pub(crate) async fn stats_keeping(
        &self,
        filter: Option<&str>,
        used_only: bool,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Stats> {
        self.stats_keeping_capped(filter, used_only, self.max_body, keep)
            .await
    }

    /// Like [`stats_keeping`](Self::stats_keeping), with the answer capped at `cap` bytes
    /// (never above the client's cap): more is [`Error::TooLarge`], read no further.
    pub(crate) async fn stats_keeping_capped(
        &self,
        filter: Option<&str>,
        used_only: bool,
        cap: usize,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Stats> {
        let mut query = Vec::new();
        if used_only {
            query.push("usedonly".to_string());
        }
        if let Some(regex) = filter {
            query.push(format!("filter={}", percent_encode(regex)));
        }
        let path = if query.is_empty() {
            "/stats".to_string()
        } else {
            format!("/stats?{}", query.join("&"))
        };
        let response = self.request_capped("GET", &path, cap).await?;
        if response.status != 200 {
            return Err(self.http_error(&path, response.status, &response.body));
        }
        let text = std::str::from_utf8(&response.body).map_err(|e| Error::Malformed {
            addr: self.shown.clone(),
            reason: format!("/stats body is not UTF-8: {e}"),
        })?;
        let stats = Stats::parse_keeping(text, keep);
        if stats.malformed_count > 0 {
            tracing::debug!(addr = %self.shown, count = stats.malformed_count, first = ?stats.malformed.first(), "unparsable /stats lines skipped");
        }
        Ok(stats)
    }

    /// `POST <path>` (e.g. `/drain_listeners?inboundonly&graceful`, `/quitquitquit`); any non-2xx status is an error. For `/quitquitquit`, a connection closed
    /// or reset after the request was written is success (`closed_early`): Envoy exits as asked,
    /// and may do so before its `200 OK` reaches us.
    pub async fn post(&self, path: &str) -> Result<Response> {
        let response = self.request_capped("POST", path, SMALL_ANSWER_MAX).await?;
        if response.closed_early {
            return Ok(response);
        }
        if !(200..300).contains(&response.status) {
            return Err(self.http_error(path, response.status, &response.body));
        }
        Ok(response)
    }

    /// One request on the kept-alive connection (a new one if there is none, or it closed);
    /// any status is returned.
    pub async fn request(&self, method: &str, path: &str) -> Result<Response> {
        self.request_capped(method, path, self.max_body).await
    }

    /// [`request`](Self::request) with a body cap of at most `cap` (never above the client's).
    pub(crate) async fn request_capped(
        &self,
        method: &str,
        path: &str,
        cap: usize,
    ) -> Result<Response> {
        let quit = method == "POST" && path == QUIT_PATH;
        let cap = cap.min(self.max_body);
        let result = self.request_uncounted(method, path, quit, cap).await;
        if let (Err(e), Some(on_error)) = (&result, &self.on_error) {
            let after_quit = self.shared.quit_sent.load(Ordering::Relaxed)
                && (e.is_refused() || matches!(e, Error::Io { .. } | Error::Closed { .. }));
            if !after_quit {
                on_error(e.kind());
            }
        }
        result
    }

    /// Envoy's admin on a Unix socket (`shown`: its path, for errors and logs), connected by
    /// `connector` ([`crate::effects::admin_socket`]). `AdminClient::addr` is then
    /// `127.0.0.1:0` (no TCP port is the admin's).
    pub fn unix(shown: &str, connector: UnixConnector) -> AdminClient {
        let mut client = AdminClient::with_connector(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            Arc::new(|_, _| Err(std::io::Error::other("not a TCP admin"))),
        );
        client.shown = AdminAddr::Unix(shown.into());
        client.dial = Dial::Unix(connector);
        client
    }

    /// Opens the kept-alive connection now if there is none, without a request, so that the
    /// next request does not wait for entering the netns and connecting (readiness does this
    /// while Envoy starts, to take the connect off the release's critical path). A failure is
    /// not counted: the next request connects again, and counts its own failure.
    pub(crate) async fn connect_ahead(&self) {
        let mut slot = self.shared.connection.lock().await;
        if slot.as_ref().is_some_and(|c| !c.is_closed()) {
            return;
        }
        *slot = None;
        if let Ok(stream) = self.connect().await {
            *slot = Connection::handshake(stream).await.ok();
        }
    }

    async fn request_uncounted(
        &self,
        method: &str,
        path: &str,
        quit: bool,
        cap: usize,
    ) -> Result<Response> {
        let method =
            hyper::Method::from_bytes(method.as_bytes()).map_err(|e| Error::Malformed {
                addr: self.shown.clone(),
                reason: format!("bad method {method:?}: {e}"),
            })?;
        if quit {
            // From the moment Envoy is asked to exit, its absence (a refused or closed
            // connection, also for this very request) is the outcome asked for.
            self.shared.quit_sent.store(true, Ordering::Relaxed);
        }
        let mut slot = self.shared.connection.lock().await;
        // At most one retry: a kept-alive connection the peer closed while idle. Only when the
        // request was not written, or it is a GET (repeating it changes nothing).
        for attempt in 0..2 {
            let reused = match slot.as_ref() {
                Some(c) if !c.is_closed() => true,
                _ => {
                    *slot = None;
                    let stream = self.connect().await?;
                    let connection = Connection::handshake(stream)
                        .await
                        .map_err(|f| self.failure(f, false))?;
                    *slot = Some(connection);
                    false
                }
            };
            let Some(connection) = slot.as_mut() else {
                break;
            };
            let host = host_header(self.addr);
            let exchange = connection.exchange(
                method.clone(),
                path,
                &host,
                &[("user-agent", "holdfast"), ("accept", "*/*")],
                cap,
            );
            let outcome = tokio::time::timeout(self.response_timeout, exchange).await;
            let failure = match outcome {
                Ok(Ok(answer)) => {
                    return Ok(Response {
                        status: answer.status.as_u16(),
                        body: answer.body,
                        closed_early: false,
                    })
                }
                Ok(Err(failure)) => failure,
                Err(_) => {
                    *slot = None;
                    return Err(Error::Timeout {
                        addr: self.shown.clone(),
                        what: "response",
                        after: self.response_timeout,
                    });
                }
            };
            *slot = None;
            let retry = attempt == 0
                && reused
                && match &failure {
                    Failure::NotSent(_) => true,
                    Failure::Closed(_) | Failure::Io(_) => method == hyper::Method::GET && !quit,
                    Failure::Malformed(_) | Failure::TooLarge(_) => false,
                };
            if retry {
                tracing::debug!(addr = %self.shown, %failure, "kept-alive admin connection was closed; retrying on a new one");
                continue;
            }
            if quit && matches!(failure, Failure::Closed(_)) {
                return Ok(Response {
                    status: 0,
                    body: Vec::new(),
                    closed_early: true,
                });
            }
            if let Failure::TooLarge(reason) = failure {
                return Err(Error::TooLarge {
                    addr: self.shown.clone(),
                    // The path without its query (a filter regex says nothing to a reader).
                    path: path.split('?').next().unwrap_or(path).to_string(),
                    reason,
                });
            }
            return Err(self.failure(failure, true));
        }
        Err(Error::Closed {
            addr: self.shown.clone(),
            reason: "the admin connection closed twice in a row".into(),
            sent: false,
        })
    }

    fn failure(&self, failure: Failure, sent: bool) -> Error {
        let addr = self.shown.clone();
        match failure {
            Failure::Malformed(reason) | Failure::TooLarge(reason) => {
                Error::Malformed { addr, reason }
            }
            Failure::Closed(reason) => Error::Closed { addr, reason, sent },
            Failure::NotSent(reason) => Error::Closed {
                addr,
                reason,
                sent: false,
            },
            Failure::Io(source) => Error::Io { addr, source },
        }
    }

    fn http_error(&self, path: &str, status: u16, body: &[u8]) -> Error {
        Error::Http {
            addr: self.shown.clone(),
            path: path.to_string(),
            status,
            body: String::from_utf8_lossy(&body[..body.len().min(200)])
                .trim()
                .to_string(),
        }
    }

    async fn connect(&self) -> Result<Box<dyn AdminIo>> {
        let (tcp, shown, timeout) = (self.addr, self.shown.clone(), self.connect_timeout);
        let dial = self.dial.clone();
        let blocking = tokio::task::spawn_blocking(move || match dial {
            Dial::Tcp(connector) => connector(tcp, timeout).map(Stream::Tcp),
            Dial::Unix(connector) => connector(timeout).map(Stream::Unix),
        });
        // The connector honours the timeout itself; the margin covers entering the netns.
        let joined = tokio::time::timeout(timeout + Duration::from_millis(500), blocking)
            .await
            .map_err(|_| Error::Timeout {
                addr: shown.clone(),
                what: "connect",
                after: timeout,
            })?;
        let connected = joined.map_err(|e| Error::Connect {
            addr: shown.clone(),
            reason: format!("connector task failed: {e}"),
            refused: false,
            denied: false,
        })?;
        let std_stream = connected.map_err(|e| {
            if e.kind() == std::io::ErrorKind::TimedOut {
                Error::Timeout {
                    addr: shown.clone(),
                    what: "connect",
                    after: timeout,
                }
            } else {
                Error::Connect {
                    addr: shown.clone(),
                    reason: e.to_string(),
                    refused: e.kind() == std::io::ErrorKind::ConnectionRefused,
                    denied: e.kind() == std::io::ErrorKind::PermissionDenied,
                }
            }
        })?;
        let io = |source| Error::Io {
            addr: shown.clone(),
            source,
        };
        match std_stream {
            Stream::Tcp(s) => {
                s.set_nonblocking(true).map_err(io)?;
                // Requests are small and answered at once: no Nagle delay on the request.
                let _ = s.set_nodelay(true);
                Ok(Box::new(tokio::net::TcpStream::from_std(s).map_err(io)?))
            }
            Stream::Unix(s) => {
                s.set_nonblocking(true).map_err(io)?;
                Ok(Box::new(tokio::net::UnixStream::from_std(s).map_err(io)?))
            }
        }
    }
}

/// A connected blocking stream, before it is handed to tokio.
enum Stream {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

/// The `Host` header for an address.
fn host_header(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(v4) => format!("{}:{}", v4.ip(), v4.port()),
        SocketAddr::V6(v6) => format!("[{}]:{}", v6.ip(), v6.port()),
    }
}

/// Percent-encodes a query value (everything but RFC 3986 unreserved characters).
pub fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len() * 3);
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Escapes RE2 metacharacters, for text a `/stats?filter=` regex must match literally (a stat
/// prefix such as `wasmcustom.holdfast`).
pub fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 4);
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regex_escape_escapes_dots() {
        assert_eq!(regex_escape("wasmcustom.holdfast"), "wasmcustom\\.holdfast");
        assert_eq!(regex_escape("a+b(c)"), "a\\+b\\(c\\)");
    }

    #[test]
    fn stats_parse_tolerates_garbage() {
        let text = "cluster_manager.cds.update_success: 3\n\
                    server.state: 0\n\
                    listener_manager.workers_started: 1\n\
                    cluster.x.upstream_cx_length_ms: P0(nan,0) P25(nan,0)\n\
                    http.admin.downstream_rq_time: No recorded values\n\
                    server.version_text: \"1.40.0\"\n\
                    garbage without colon\n\
                    bad.value: -1\n\
                    : 5\n\
                    \n";
        let stats = Stats::parse(text);
        assert_eq!(stats.get("cluster_manager.cds.update_success"), Some(3));
        assert_eq!(stats.get("server.state"), Some(0));
        assert_eq!(stats.values.len(), 3);
        assert_eq!(stats.skipped, 3);
        assert_eq!(stats.malformed_count, 3, "{stats:?}");
    }

    #[test]
    fn percent_encoding() {
        assert_eq!(
            percent_encode("downstream_cx_active$"),
            "downstream_cx_active%24"
        );
        assert_eq!(percent_encode("^a.b|c"), "%5Ea.b%7Cc");
    }
}
