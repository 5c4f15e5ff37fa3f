//! The read-only status API: `/status` (JSON, what `holdfast status` shows), `/metrics`
//! (Prometheus text), `/healthz` (liveness), `/readyz` (readiness: the first pod list is loaded),
//! `/config` (the effective configuration). No endpoint changes state; anything but GET/HEAD gets
//! 405.
//!
//! **Three listeners, so no client can take another's place** (`Role`):
//!
//! - **local** (`--status-listen`, a loopback address only, `127.0.0.1:15300`): every endpoint.
//!   `/status` and `/config` (pod names, namespaces, errors, the configuration) exist only here:
//!   bound to loopback, nothing outside the agent's pod can connect, whatever its source address
//!   (Istio's inbound passthrough connects from 127.0.0.6, itself loopback: a "peer is loopback"
//!   test on a public listener would let it in; a loopback *listener* cannot be reached through
//!   the pod IP). Reached by `kubectl port-forward` (the API server authorizes it as
//!   `pods/portforward` in holdfast-system; the kubelet connects to 127.0.0.1 inside the pod) or
//!   `kubectl exec`. Why not bearer tokens (TokenReview + SubjectAccessReview): the API server's
//!   pod proxy, the only way to reach a pod "through the API server", deletes the
//!   `Authorization` header after authenticating the caller (k8s.io/apiserver
//!   pkg/endpoints/filters/authentication.go), so a token never reaches the agent that way. See
//!   docs/install.md, "Reaching the status API".
//! - **health** (`--health-listen`, `[::]:15301` dual-stack in the DaemonSet, `bind_listener`): `/healthz` and `/readyz`
//!   only, for the kubelet. One request per connection (no keep-alive), a short head timeout,
//!   a per-peer limit: a slot is held for at most `HEALTH_HEAD_TIMEOUT`, so the probes cannot
//!   be starved by clients of the other listeners (they have their own slots) nor by a few peers
//!   of this one. The shipped NetworkPolicy admits nobody to it: the kubelet's probes come from
//!   the node, which NetworkPolicy always admits.
//! - **metrics** (`--metrics-listen`, `[::]:15302`): `/metrics` only, for Prometheus; counts
//!   and durations, no pod names. Keep-alive, with a per-peer limit.
//!
//! **No client can starve the agent.** Each listener serves at most its `Limits`'
//! `max_connections` at once, and at most `per_peer` from one IP address; past either a new
//! connection is accepted and closed at once (so it takes no fd for longer than that). A
//! connection must send its request head within the head timeout — hyper starts that timer
//! whenever it waits for a head, so it also ends an idle keep-alive connection — and lives at
//! most `CONNECTION_LIFETIME`; request heads are capped at [`MAX_HEADER_BYTES`]. At start the
//! open-files limit is raised to its hard limit
//! (`crate::report::process_metrics::raise_fd_limit`); the three listeners' share stays
//! the sum of their `max_connections` + 3.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::config::Config;
use crate::report::board::{NodeStatus, StatusBoard};

/// Connections the local listener serves at once; far below any open-files limit (the soft
/// default is 1024).
pub const MAX_CONNECTIONS: usize = 64;
/// Time to send a request head, and the longest idle wait between keep-alive requests.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The health listener's head timeout: the kubelet writes its probe at once after connecting;
/// a connection that sends nothing for this long loses its slot.
pub(crate) const HEALTH_HEAD_TIMEOUT: Duration = Duration::from_secs(1);
/// Connections from one IP address at once, on the health and metrics listeners. The kubelet
/// probes with one connection at a time, Prometheus scrapes with one: 8 leaves room for
/// retries and a second scraper, and keeps 70 connections of one client from taking the rest.
pub const PER_PEER_CONNECTIONS: usize = 8;
/// The longest one connection is kept, whatever it does.
pub(crate) const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);
/// The largest request head (request line and headers); a larger one gets 431.
pub const MAX_HEADER_BYTES: usize = 8 * 1024;
/// hyper's read buffer per connection (its minimum is 8 KiB).
const READ_BUFFER_BYTES: usize = 16 * 1024;
/// Headers per request.
const MAX_HEADERS: usize = 32;
/// How often a rejected connection is logged at most.
const REJECT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Which endpoints a listener serves (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Every endpoint; bound to loopback.
    Local,
    /// `/healthz` and `/readyz`, one request per connection.
    Health,
    /// `/metrics`.
    Metrics,
}

impl Role {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Local => "status",
            Role::Health => "health",
            Role::Metrics => "metrics",
        }
    }

    /// What a listener of this role allows.
    pub(crate) fn limits(self) -> Limits {
        match self {
            Role::Local => Limits {
                max_connections: MAX_CONNECTIONS,
                per_peer: None,
                head_timeout: HEADER_READ_TIMEOUT,
                keep_alive: true,
            },
            // Cheap slots (no keep-alive, 1 s to send the head): many, so that only a client
            // with dozens of addresses could hold them all, and the NetworkPolicy admits none.
            Role::Health => Limits {
                max_connections: 256,
                per_peer: Some(PER_PEER_CONNECTIONS),
                head_timeout: HEALTH_HEAD_TIMEOUT,
                keep_alive: false,
            },
            Role::Metrics => Limits {
                max_connections: MAX_CONNECTIONS,
                per_peer: Some(PER_PEER_CONNECTIONS),
                head_timeout: HEADER_READ_TIMEOUT,
                keep_alive: true,
            },
        }
    }
}

/// A listener's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) max_connections: usize,
    /// Connections from one IP address at once (`None`: no per-peer limit; the loopback
    /// listener's clients all come from 127.0.0.1).
    pub(crate) per_peer: Option<usize>,
    pub(crate) head_timeout: Duration,
    pub(crate) keep_alive: bool,
}

/// Open connections per peer address; a [`PeerSlot`] gives its place back on drop.
#[derive(Debug, Default, Clone)]
struct Peers(Arc<std::sync::Mutex<HashMap<IpAddr, usize>>>);

struct PeerSlot {
    peers: Peers,
    ip: IpAddr,
}

impl Peers {
    fn enter(&self, ip: IpAddr, limit: usize) -> Option<PeerSlot> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(ip).or_insert(0);
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: self.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut map = self.peers.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// Binds a status API listener. `[::]` (the DaemonSet's health and metrics listeners) is bound
/// dual-stack whatever the node's `net.ipv6.bindv6only` says (`IPV6_V6ONLY` off): IPv6 peers,
/// and IPv4 peers (as IPv4-mapped addresses, `canonical` per peer) where the pod has IPv4 —
/// one listener for IPv4-only, dual-stack and IPv6-only clusters, where the kubelet probes the
/// pod's IPv6 address (issue 30: `0.0.0.0` alone restarted the agent forever there). A kernel
/// without IPv6 (`ipv6.disable=1`: no AF_INET6 sockets) gets `0.0.0.0` on the same port, said
/// in a warning. Every other address is bound as given.
pub(crate) fn bind_listener(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let std::net::SocketAddr::V6(v6) = addr else {
        return bind_plain(addr);
    };
    if !v6.ip().is_unspecified() {
        return bind_plain(addr);
    }
    let socket = match tokio::net::TcpSocket::new_v6() {
        Ok(s) => s,
        Err(e) => match ipv4_fallback(addr, &e) {
            Some(v4) => {
                tracing::warn!(%addr, listening = %v4, error = %e, "the node's kernel has no IPv6: listening on IPv4 only");
                return bind_plain(v4);
            }
            None => return Err(e),
        },
    };
    nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::Ipv6V6Only, &false)
        .map_err(std::io::Error::from)?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

fn bind_plain(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// `0.0.0.0:<port>` when creating an IPv6 socket for `[::]:<port>` failed because the kernel has
/// no IPv6 at all; any other failure is the caller's.
fn ipv4_fallback(addr: std::net::SocketAddr, e: &std::io::Error) -> Option<std::net::SocketAddr> {
    (addr.ip().is_unspecified() && e.raw_os_error() == Some(libc::EAFNOSUPPORT))
        .then(|| std::net::SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), addr.port()))
}

/// An IPv4-mapped IPv6 peer as its IPv4 address (one peer, one count).
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// What the API serves.
#[derive(Clone)]
pub struct StatusApi {
    pub board: StatusBoard,
    pub config: Arc<Config>,
    pub metrics: crate::report::metrics::MetricsHandle,
    /// Entries the pod source rejected or ignored.
    pub source_problems: crate::source::SourceProblems,
    /// Set once the pod source delivered its first full list (`PodEvent::Synced`).
    pub synced: Arc<std::sync::atomic::AtomicBool>,
}

impl StatusApi {
    /// Serves every endpoint on `listener` (the local listener) until `shutdown` completes.
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        if let Some((soft, hard)) = crate::report::process_metrics::raise_fd_limit() {
            tracing::info!(
                open_files_limit = soft,
                hard_limit = hard,
                status_api_connections = MAX_CONNECTIONS,
                "open-files budget"
            );
        }
        self.serve_role(listener, Role::Local, shutdown).await
    }

    /// Serves `role`'s endpoints on `listener` until `shutdown` completes.
    pub(crate) async fn serve_role(
        self,
        listener: TcpListener,
        role: Role,
        shutdown: impl Future<Output = ()>,
    ) {
        let limits = role.limits();
        let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
        let peers = Peers::default();
        let mut last_reject_log: Option<Instant> = None;
        let mut rejected_since_log = 0u64;
        tokio::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                _ = &mut shutdown => return,
                accepted = listener.accept() => match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        // EMFILE/ENFILE: the connection stays in the backlog; wait rather than spin.
                        tracing::warn!(error = %e, listener = role.as_str(), "status API accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let peer_ip = canonical(peer.ip());
            let admitted =
                slots
                    .clone()
                    .try_acquire_owned()
                    .ok()
                    .and_then(|slot| match limits.per_peer {
                        Some(limit) => peers.enter(peer_ip, limit).map(|p| (slot, Some(p))),
                        None => Some((slot, None)),
                    });
            let Some((slot, peer_slot)) = admitted else {
                // Full, or this peer has its share: close at once (dropping the stream), so a
                // flood holds no fds.
                drop(stream);
                self.metrics.metrics.status_api_rejected.inc();
                rejected_since_log += 1;
                if last_reject_log.is_none_or(|t| t.elapsed() >= REJECT_LOG_INTERVAL) {
                    tracing::warn!(
                        listener = role.as_str(),
                        limit = limits.max_connections,
                        per_peer = limits.per_peer,
                        peer = %peer_ip,
                        rejected = rejected_since_log,
                        "status API at a connection limit; closing new connections"
                    );
                    last_reject_log = Some(Instant::now());
                    rejected_since_log = 0;
                }
                continue;
            };
            let api = self.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let _peer_slot = peer_slot;
                let svc = hyper::service::service_fn(move |req| {
                    let api = api.clone();
                    async move { Ok::<_, Infallible>(api.handle(req, role)) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(limits.head_timeout)
                    .keep_alive(limits.keep_alive)
                    .max_buf_size(READ_BUFFER_BYTES)
                    .max_header_size(MAX_HEADER_BYTES)
                    .max_headers(MAX_HEADERS)
                    .serve_connection(TokioIo::new(stream), svc);
                let _ = tokio::time::timeout(CONNECTION_LIFETIME, conn).await;
            });
        }
    }

    fn handle(&self, req: Request<Incoming>, role: Role) -> Response<Full<Bytes>> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                "the status API is read-only\n",
            );
        }
        let path = req.uri().path();
        let served = match role {
            Role::Local => true,
            Role::Health => matches!(path, "/healthz" | "/readyz"),
            Role::Metrics => path == "/metrics",
        };
        if !served {
            return text(
                StatusCode::NOT_FOUND,
                match role {
                    Role::Health => "this listener serves /healthz and /readyz only\n",
                    _ => "this listener serves /metrics only; /status and /config answer on 127.0.0.1:15300 inside the agent's pod: `kubectl -n holdfast-system port-forward <agent pod> 15300` and `holdfast status`\n",
                },
            );
        }
        match path {
            "/status" => json(&NodeStatus {
                node: self.config.node_name.clone(),
                agent_version: env!("CARGO_PKG_VERSION").to_string(),
                pods: self.board.snapshot(),
                source_problems: self.source_problems.snapshot(),
                startup_taint: self.metrics.metrics.startup_taint.found(),
            }),
            "/config" => json(&*self.config),
            "/metrics" => {
                let ready = self.synced.load(std::sync::atomic::Ordering::Relaxed);
                self.metrics.metrics.ready.set(i64::from(ready));
                let problems = i64::try_from(self.source_problems.len()).unwrap_or(i64::MAX);
                self.metrics.metrics.source_problems.set(problems);
                let mut r = Response::new(Full::new(Bytes::from(self.metrics.encode(&self.board))));
                r.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static(
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    ),
                );
                r
            }
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/readyz" if self.synced.load(std::sync::atomic::Ordering::Relaxed) => {
                text(StatusCode::OK, "ok\n")
            }
            "/readyz" => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: the first pod list has not been loaded\n",
            ),
            _ => text(
                StatusCode::NOT_FOUND,
                "not found; endpoints: /status /metrics /config /healthz /readyz\n",
            ),
        }
    }
}

fn text(code: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = code;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn json<T: serde::Serialize>(value: &T) -> Response<Full<Bytes>> {
    match serde_json::to_string_pretty(value) {
        Ok(body) => {
            // Rows quote pods: C1 and bidi controls, which serde_json leaves raw, go out as
            // `\uXXXX` so neither `curl` nor `holdfast status --json` prints them raw.
            let body = match crate::api::text::escape_json_document(&body) {
                std::borrow::Cow::Borrowed(_) => body,
                std::borrow::Cow::Owned(escaped) => escaped,
            };
            let mut r = Response::new(Full::new(Bytes::from(body)));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "serialization failed\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_kernel_without_ipv6_falls_back_to_ipv4() {
        let any6: std::net::SocketAddr = "[::]:15301".parse().unwrap();
        let no_v6 = std::io::Error::from_raw_os_error(libc::EAFNOSUPPORT);
        assert_eq!(
            ipv4_fallback(any6, &no_v6),
            Some("0.0.0.0:15301".parse().unwrap())
        );
        // A port in use, or no permission, is the caller's error, not a reason to go IPv4-only.
        let in_use = std::io::Error::from_raw_os_error(libc::EADDRINUSE);
        assert_eq!(ipv4_fallback(any6, &in_use), None);
        assert_eq!(ipv4_fallback("[::1]:1".parse().unwrap(), &no_v6), None);
    }

    /// `[::]` takes IPv4 peers too, whatever `net.ipv6.bindv6only` says, and they count as
    /// their IPv4 address.
    #[tokio::test]
    async fn unspecified_ipv6_is_dual_stack() {
        let l = bind_listener("[::]:0".parse().unwrap()).expect("bind [::]:0");
        let port = l.local_addr().unwrap().port();
        let (c4, a4) = tokio::join!(
            tokio::net::TcpStream::connect(("127.0.0.1", port)),
            l.accept()
        );
        c4.expect("IPv4 client");
        assert_eq!(canonical(a4.unwrap().1.ip()), IpAddr::from([127, 0, 0, 1]));
        let (c6, a6) = tokio::join!(tokio::net::TcpStream::connect(("::1", port)), l.accept());
        c6.expect("IPv6 client");
        assert_eq!(
            a6.unwrap().1.ip(),
            IpAddr::from(std::net::Ipv6Addr::LOCALHOST)
        );
    }
}
