//! The read-only status API: `/status` (JSON, what `holdfast status` shows), `/metrics`
//! (Prometheus text), `/healthz` (liveness), `/readyz` (readiness: the first pod list is loaded),
//! `/config` (the effective configuration). No endpoint changes
//! state; anything but GET/HEAD gets 405.
//!
//! **Who may read what.** `/healthz`, `/readyz` and `/metrics` answer any client: the kubelet
//! probes the first two, Prometheus scrapes the second, and neither names a pod. `/status` and `/config` (pod
//! names, namespaces, errors, the configuration) answer loopback clients only: in the shipped
//! DaemonSet that is `kubectl port-forward` (which the API server authorizes as `pods/portforward`
//! in holdfast-system, and which connects to 127.0.0.1 inside the agent's pod) or a process in the
//! agent's pod; anyone else gets 403. Why not bearer tokens (TokenReview + SubjectAccessReview):
//! the API server's pod proxy, the only way to reach a pod "through the API server", deletes the
//! `Authorization` header after authenticating the caller (k8s.io/apiserver
//! pkg/endpoints/filters/authentication.go: "authorization header is not required anymore in case
//! of a successful authentication"), so a token never reaches the agent that way. See
//! docs/install.md, "Reaching the status API".
//!
//! **No client can starve the agent.** At most [`MAX_CONNECTIONS`] connections are served at
//! once; past it a new connection is accepted and closed at once (so it takes no fd for longer
//! than that). A connection must send its request head within [`HEADER_READ_TIMEOUT`] — hyper
//! starts that timer whenever it waits for a head, so it also ends an idle keep-alive connection —
//! and lives at most [`CONNECTION_LIFETIME`]; request heads are capped at [`MAX_HEADER_BYTES`].
//! At start the open-files limit is raised to its hard limit
//! ([`crate::report::process_metrics::raise_fd_limit`]); the API's share stays [`MAX_CONNECTIONS`] + 1.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::config::Config;
use crate::report::board::{NodeStatus, StatusBoard};

/// Connections served at once; far below any open-files limit (the soft default is 1024).
pub const MAX_CONNECTIONS: usize = 64;
/// Time to send a request head, and the longest idle wait between keep-alive requests.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest one connection is kept, whatever it does.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);
/// The largest request head (request line and headers); a larger one gets 431.
pub const MAX_HEADER_BYTES: usize = 8 * 1024;
/// hyper's read buffer per connection (its minimum is 8 KiB).
const READ_BUFFER_BYTES: usize = 16 * 1024;
/// Headers per request.
const MAX_HEADERS: usize = 32;
/// How often a rejected connection is logged at most.
const REJECT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Connections closed at accept because [`MAX_CONNECTIONS`] were open (since start).
pub(crate) static REJECTED_CONNECTIONS: AtomicU64 = AtomicU64::new(0);

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
    /// Serves on `listener` until `shutdown` completes.
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        if let Some((soft, hard)) = crate::report::process_metrics::raise_fd_limit() {
            tracing::info!(
                open_files_limit = soft,
                hard_limit = hard,
                status_api_connections = MAX_CONNECTIONS,
                "open-files budget"
            );
        }
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
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
                        tracing::warn!(error = %e, "status API accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                // Full: close at once (dropping the stream), so a flood holds no fds.
                drop(stream);
                REJECTED_CONNECTIONS.fetch_add(1, Ordering::Relaxed);
                rejected_since_log += 1;
                if last_reject_log.is_none_or(|t| t.elapsed() >= REJECT_LOG_INTERVAL) {
                    tracing::warn!(
                        limit = MAX_CONNECTIONS,
                        rejected = rejected_since_log,
                        "status API at its connection limit; closing new connections"
                    );
                    last_reject_log = Some(Instant::now());
                    rejected_since_log = 0;
                }
                continue;
            };
            let api = self.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let local = is_loopback(peer);
                let svc = hyper::service::service_fn(move |req| {
                    let api = api.clone();
                    async move { Ok::<_, Infallible>(api.handle(req, local)) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .max_buf_size(READ_BUFFER_BYTES)
                    .max_header_size(MAX_HEADER_BYTES)
                    .max_headers(MAX_HEADERS)
                    .serve_connection(TokioIo::new(stream), svc);
                let _ = tokio::time::timeout(CONNECTION_LIFETIME, conn).await;
            });
        }
    }

    fn handle(&self, req: Request<Incoming>, local: bool) -> Response<Full<Bytes>> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                "the status API is read-only\n",
            );
        }
        let path = req.uri().path();
        if matches!(path, "/status" | "/config") && !local {
            return text(
                StatusCode::FORBIDDEN,
                "/status and /config answer local clients only; use `kubectl -n holdfast-system port-forward <agent pod> 15300` and `holdfast status`\n",
            );
        }
        match path {
            "/status" => json(&NodeStatus {
                node: self.config.node_name.clone(),
                agent_version: env!("CARGO_PKG_VERSION").to_string(),
                pods: self.board.snapshot(),
                source_problems: self.source_problems.snapshot(),
            }),
            "/config" => json(&*self.config),
            "/metrics" => {
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

/// A loopback peer (also as an IPv4-mapped IPv6 address).
fn is_loopback(peer: SocketAddr) -> bool {
    match peer.ip() {
        IpAddr::V4(a) => a.is_loopback(),
        IpAddr::V6(a) => a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
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
    match serde_json::to_vec_pretty(value) {
        Ok(body) => {
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
