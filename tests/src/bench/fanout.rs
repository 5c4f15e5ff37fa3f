//! `holdfast-bench fanout`: what `kubectl holdfast status` costs on a cluster of N agents (1,000
//! by default), simulated on loopback. A fake API server (hyper, real HTTP/1.1 and real
//! WebSocket upgrades) lists N agent pods and N nodes and plays the kubelet's side of every
//! port-forward (the protocol of node-agent/tests/status_portforward.rs: channel bytes, the port
//! in each channel's first frame), piping each to a simulated agent that answers `GET /status`
//! with a status document of `rows` pods. The client is the real one:
//! `holdfast::cli::cluster_status::gather` with a kube client on a kubeconfig-less
//! `http://` URL, so every agent costs a real WebSocket port-forward through the API server.
//!
//! Measured per run: the wall time of the whole read, the API server's requests (counted by the
//! fake), and the agents answered. Variants: the concurrency cap (8, 32, 128), and 1% of the
//! agents hung (port-forward open, nothing answers) to show the per-agent deadline bounding the
//! read. The fake API server, the agents and the client share the machine's cores, so the
//! figures are an upper bound of the client's own cost; no network latency is added.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::{self, protocol::Role, Message};

use holdfast::api::{HoldOutcome, HoldRecord, Mesh, NodeStatus, Phase, PodStatus, SidecarMode};
use holdfast::cli::cluster::FanOut;
use holdfast::cli::cluster_status::{self, Filters};

const NS: &str = "holdfast-system";
const STATUS_PORT: u16 = 15300;

/// The section's knobs.
#[derive(Debug, Clone)]
pub struct FanoutOpts {
    pub agents: usize,
    /// Pod rows per agent.
    pub rows: usize,
    /// Runs per variant.
    pub runs: u32,
    pub concurrencies: Vec<usize>,
    pub per_agent: Duration,
}

struct Fake {
    agents: usize,
    /// Every `hang_every`-th agent's port-forward never answers (0: none).
    hang_every: usize,
    agent: SocketAddr,
    requests: AtomicU64,
    pods: String,
    nodes: String,
}

fn list(kind: &str, items: Vec<Value>) -> String {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items})
        .to_string()
}

impl Fake {
    fn new(agents: usize, hang_every: usize, agent: SocketAddr) -> Fake {
        let pods = (0..agents)
            .map(|i| {
                json!({
                    "metadata": {"name": format!("holdfast-{i:05}"), "namespace": NS},
                    "spec": {"nodeName": format!("node-{i:05}"), "containers": [{"name": "agent", "image": "x"}]},
                    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
                })
            })
            .collect();
        let nodes = (0..agents)
            .map(|i| {
                json!({"metadata": {"name": format!("node-{i:05}"), "labels": {"kubernetes.io/os": "linux"}},
                       "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
            })
            .collect();
        Fake {
            agents,
            hang_every,
            agent,
            requests: AtomicU64::new(0),
            pods: list("PodList", pods),
            nodes: list("NodeList", nodes),
        }
    }

    fn answer(self: &Arc<Self>, mut req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let path = req.uri().path().to_string();
        if path == "/api/v1/nodes" {
            return Response::new(Full::new(Bytes::from(self.nodes.clone())));
        }
        if path == format!("/api/v1/namespaces/{NS}/pods") {
            return Response::new(Full::new(Bytes::from(self.pods.clone())));
        }
        let index = path
            .strip_prefix(&format!("/api/v1/namespaces/{NS}/pods/holdfast-"))
            .and_then(|rest| rest.strip_suffix("/portforward"))
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|i| *i < self.agents);
        let key = req
            .headers()
            .get("sec-websocket-key")
            .map(|k| k.as_bytes().to_vec());
        let (Some(index), Some(key)) = (index, key) else {
            return Response::builder()
                .status(StatusCode::NOT_FOUND)
                .body(Full::new(Bytes::from_static(b"{}")))
                .expect("response");
        };
        let hang = self.hang_every > 0 && index % self.hang_every == 0;
        let agent = self.agent;
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(upgraded) = upgrade.await {
                let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    None,
                )
                .await;
                kubelet_side(ws, if hang { None } else { Some(agent) }).await;
            }
        });
        Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("upgrade", "websocket")
            .header("connection", "Upgrade")
            .header(
                "sec-websocket-accept",
                tungstenite::handshake::derive_accept_key(&key),
            )
            .header("sec-websocket-protocol", "v4.channel.k8s.io")
            .body(Full::new(Bytes::new()))
            .expect("response")
    }
}

/// The kubelet's half of one port-forward: pipes the data channel to `agent` (`None`: holds the
/// stream open, answering nothing).
async fn kubelet_side<S>(mut ws: tokio_tungstenite::WebSocketStream<S>, agent: Option<SocketAddr>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let [lo, hi] = STATUS_PORT.to_le_bytes();
    for channel in [0u8, 1] {
        if ws
            .send(Message::binary(vec![channel, lo, hi]))
            .await
            .is_err()
        {
            return;
        }
    }
    let Some(addr) = agent else {
        while let Some(Ok(_)) = ws.next().await {}
        return;
    };
    let Ok(mut pod) = tokio::net::TcpStream::connect(addr).await else {
        return;
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            msg = ws.next() => match msg {
                Some(Ok(Message::Binary(data))) if data.len() > 1 && data[0] == 0 => {
                    if pod.write_all(&data[1..]).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            read = pod.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut frame = Vec::with_capacity(n + 1);
                    frame.push(0u8);
                    frame.extend_from_slice(&buf[..n]);
                    if ws.send(Message::binary(frame)).await.is_err() {
                        break;
                    }
                }
            },
        }
    }
    let _ = ws.close(None).await;
}

async fn serve_api(listener: tokio::net::TcpListener, fake: Arc<Fake>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        let fake = fake.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let fake = fake.clone();
                async move { Ok::<_, std::convert::Infallible>(fake.answer(req)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .with_upgrades()
                .await;
        });
    }
}

/// A status document of `rows` ready pods, each held and released (what a busy node's agent
/// serves).
fn status_doc(rows: usize) -> String {
    let t = SystemTime::now();
    let pods = (0..rows)
        .map(|i| PodStatus {
            namespace: "shop".into(),
            name: format!("web-{i}"),
            uid: format!("5a7e2c1b-0000-4000-8000-{i:012}"),
            phase: Phase::Ready,
            mode: Some(SidecarMode::Classic),
            mesh: Some(Mesh::Istio),
            tracked_since: t,
            hold: Some(HoldRecord {
                started_at: Some(t),
                released_at: Some(t),
                packets_held: 2,
                connections_held: 2,
                ready_to_release_ms: Some(0.4),
                outcome: Some(HoldOutcome::Ready),
                ..HoldRecord::default()
            }),
            drain: None,
            job: None,
            last_error: None,
            skipped_reason: None,
            timeline: None,
        })
        .collect();
    serde_json::to_string(&NodeStatus {
        node: "node".into(),
        agent_version: env!("CARGO_PKG_VERSION").into(),
        pods,
        source_problems: vec![],
        startup_taint: None,
    })
    .expect("a status document")
}

async fn serve_agent(listener: tokio::net::TcpListener, body: Arc<String>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        let body = body.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |_req: Request<hyper::body::Incoming>| {
                    let body = body.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(
                            body.as_bytes().to_vec(),
                        ))))
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

/// p50 and p95 (nearest rank) of `v`.
fn percentiles(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    (at(0.50), at(0.95))
}

/// Runs the section and prints its table.
pub fn run(opts: &FanoutOpts) -> Result<()> {
    // The fake cluster on a runtime of its own, the client on another: as in life, the client
    // does not share its scheduler with the API server.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("the fake cluster's runtime")?;
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("the client's runtime")?;
    let body = Arc::new(status_doc(opts.rows));
    println!(
        "fanout: {} agents, {} rows each ({} bytes of /status), {} runs per variant, per-agent deadline {} ms",
        opts.agents,
        opts.rows,
        body.len(),
        opts.runs,
        opts.per_agent.as_millis()
    );
    let agent = server_rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let a = l.local_addr()?;
        tokio::spawn(serve_agent(l, body.clone()));
        anyhow::Ok(a)
    })?;
    println!(
        "{:<28} {:>10} {:>10} {:>10} {:>14} {:>9}",
        "variant", "p50 wall", "p95 wall", "max wall", "API requests", "answered"
    );
    let mut variants: Vec<(String, usize, usize)> = opts
        .concurrencies
        .iter()
        .map(|c| (format!("concurrency {c}"), *c, 0))
        .collect();
    if let Some(c) = opts
        .concurrencies
        .iter()
        .copied()
        .find(|c| *c == 32)
        .or(opts.concurrencies.first().copied())
    {
        variants.push((format!("concurrency {c}, 1% hung"), c, 100));
    }
    for (name, concurrency, hang_every) in variants {
        let fake = Arc::new(Fake::new(opts.agents, hang_every, agent));
        let api: SocketAddr = server_rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let a = l.local_addr()?;
            tokio::spawn(serve_api(l, fake.clone()));
            anyhow::Ok(a)
        })?;
        let url: http::Uri = format!("http://{api}").parse().context("url")?;
        let fan = FanOut {
            concurrency,
            per_agent: opts.per_agent,
            ..FanOut::default()
        };
        let mut walls = Vec::new();
        let mut requests = Vec::new();
        let mut answered = 0;
        for _ in 0..opts.runs {
            let before = fake.requests.load(Ordering::Relaxed);
            // kube's client spawns its buffer task: made inside the client's runtime.
            let config = kube::Config::new(url.clone());
            let client = client_rt
                .block_on(async { kube::Client::try_from(config) })
                .context("a kube client")?;
            let started = Instant::now();
            let rows = client_rt
                .block_on(cluster_status::gather(
                    &client,
                    NS,
                    &Filters::default(),
                    fan,
                ))
                .context("the read")?;
            walls.push(started.elapsed().as_secs_f64() * 1000.0);
            requests.push(fake.requests.load(Ordering::Relaxed) - before);
            answered = rows.iter().filter(|r| r.error.is_none()).count();
        }
        let max = walls.iter().copied().fold(0.0, f64::max);
        let (p50, p95) = percentiles(&mut walls);
        println!(
            "{:<28} {:>8.0}ms {:>8.0}ms {:>8.0}ms {:>14} {:>9}",
            name,
            p50,
            p95,
            max,
            requests.iter().max().copied().unwrap_or(0),
            format!("{answered}/{}", opts.agents)
        );
    }
    Ok(())
}
