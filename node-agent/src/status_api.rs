//! The read-only status API: `/status` (JSON, what `holdfast status` shows), `/metrics`
//! (Prometheus text), `/healthz` (liveness), `/readyz` (readiness: the first pod list is
//! loaded), `/config` (the effective configuration). No endpoint changes state; anything but GET/HEAD gets 405.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::status::{NodeStatus, StatusBoard};

/// What the API serves.
#[derive(Clone)]
pub struct StatusApi {
    pub board: StatusBoard,
    pub config: Arc<Config>,
    pub metrics: crate::metrics::MetricsHandle,
    /// Entries the pod source rejected or ignored.
    pub source_problems: crate::source::SourceProblems,
    /// Set once the pod source delivered its first full list (`PodEvent::Synced`).
    pub synced: Arc<std::sync::atomic::AtomicBool>,
}

impl StatusApi {
    /// Serves on `listener` until `shutdown` completes.
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            let (stream, _) = tokio::select! {
                _ = &mut shutdown => return,
                accepted = listener.accept() => match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "status API accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let api = self.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let api = api.clone();
                    async move { Ok::<_, Infallible>(api.handle(req)) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc);
                // Bound how long one client can hold a connection open.
                let _ = tokio::time::timeout(std::time::Duration::from_secs(60), conn).await;
            });
        }
    }

    fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                "the status API is read-only\n",
            );
        }
        match req.uri().path() {
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
