//! `holdfast status --node` end to end through a port-forward: a loopback API server (hyper,
//! real HTTP/1.1 and a real WebSocket upgrade, which kube's `tower_test` mock cannot do) answers
//! the pod list, upgrades `pods/<agent>/portforward?ports=15300`, and plays the kubelet's side
//! of the port-forward protocol, connecting to the real status API ([`StatusApi`]) on loopback.
//!
//! The kubelet's side, as kube-client 5 (`src/api/portforward.rs`) expects it and
//! `pkg/kubelet/cri/streaming/portforward/websocket.go` writes it: binary messages whose first
//! byte is the channel (0 data and 1 error for the first port); each channel opens with a frame
//! carrying the port, little endian; an error on the port is a text on channel 1.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use holdfast::cli::remote::{fetch_status_body, RemoteError, AGENT_NAMESPACE, STATUS_PORT};
use holdfast::config::{Config, SourceConfig};
use holdfast::report::server::StatusApi;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::{self, protocol::Role, Message};
use tokio_util::sync::CancellationToken;

const AGENT_POD: &str = "holdfast-abcde";

/// What the fake kubelet forwards the pod's port to.
#[derive(Clone, Copy)]
enum Target {
    /// A listening address (the agent's status API).
    Listening(SocketAddr),
    /// Nothing listens: the kubelet reports the failed dial on the error channel.
    Refused,
    /// The caller may list pods but not port-forward: 403 on the upgrade.
    Forbidden,
}

/// Requests the fake API server saw, as `METHOD path?query`.
type Seen = Arc<Mutex<Vec<String>>>;

/// Serves the fake API server on `listener` until the test ends (the task is aborted).
async fn api_server(listener: tokio::net::TcpListener, target: Target, seen: Seen) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        let seen = seen.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let seen = seen.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(req, target, &seen)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .with_upgrades()
                .await;
        });
    }
}

fn answer(
    mut req: Request<hyper::body::Incoming>,
    target: Target,
    seen: &Seen,
) -> Response<Full<Bytes>> {
    let line = format!("{} {}", req.method(), req.uri());
    seen.lock().expect("lock").push(line);
    let path = req.uri().path().to_string();
    if path == "/api/v1/namespaces/holdfast-system/pods" {
        let list = serde_json::json!({
            "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"},
            "items": [{"metadata": {"name": AGENT_POD, "namespace": AGENT_NAMESPACE},
                       "status": {"phase": "Running"}}]
        });
        return Response::new(Full::new(Bytes::from(list.to_string())));
    }
    let key = req
        .headers()
        .get("sec-websocket-key")
        .map(|k| k.as_bytes().to_vec());
    if matches!(target, Target::Forbidden) && path.ends_with("/portforward") {
        let status = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
            "code": 403,
            "message": format!("pods \"{AGENT_POD}\" is forbidden: User \"dev\" cannot get resource \"pods/portforward\" in API group \"\" in the namespace \"holdfast-system\""),
        });
        return Response::builder()
            .status(StatusCode::FORBIDDEN)
            .body(Full::new(Bytes::from(status.to_string())))
            .expect("response");
    }
    let Some(key) = key.filter(|_| path.ends_with("/portforward")) else {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(b"{}")))
            .expect("response");
    };
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        if let Ok(upgraded) = upgrade.await {
            let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                TokioIo::new(upgraded),
                Role::Server,
                None,
            )
            .await;
            kubelet_side(ws, target).await;
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

/// The kubelet's half of one port-forward of [`STATUS_PORT`].
async fn kubelet_side<S>(mut ws: tokio_tungstenite::WebSocketStream<S>, target: Target)
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
    let addr = match target {
        Target::Listening(addr) => addr,
        Target::Forbidden => return,
        Target::Refused => {
            let why = format!("error forwarding port {STATUS_PORT} to pod 0123, uid : failed to execute portforward in network namespace \"/var/run/netns/cni-1\": failed to connect to localhost:{STATUS_PORT} inside namespace \"0123\", IPv4: dial tcp4 127.0.0.1:{STATUS_PORT}: connect: connection refused IPv6 dial tcp6: address localhost: no suitable address found ");
            let mut frame = vec![1u8];
            frame.extend_from_slice(why.as_bytes());
            let _ = ws.send(Message::binary(frame)).await;
            let _ = ws.close(None).await;
            return;
        }
    };
    let Ok(mut pod) = tokio::net::TcpStream::connect(addr).await else {
        return;
    };
    let mut buf = vec![0u8; 16 * 1024];
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

/// A kube client for the fake API server, as from a kubeconfig without credentials.
fn client_for(addr: SocketAddr) -> kube::Client {
    let url = format!("http://{addr}").parse().expect("url");
    kube::Client::try_from(kube::Config::new(url)).expect("client")
}

async fn start_api(target: Target) -> (SocketAddr, Seen, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Seen::default();
    let server = tokio::spawn(api_server(listener, target, seen.clone()));
    (addr, seen, server)
}

/// The agent's real status API (node `worker-1`, an empty board) on a loopback port: its
/// address, the token that stops it, and its task.
async fn start_agent_status_api() -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let agent_addr = listener.local_addr().expect("addr");
    let agent = StatusApi {
        board: holdfast::report::board::StatusBoard::default(),
        config: Arc::new(Config {
            node_name: "worker-1".into(),
            source: SourceConfig::PodsDir(std::env::temp_dir().join("hf-portforward-unused")),
            status_listen: agent_addr,
            health_listen: None,
            metrics_listen: None,
            proc_root: "/proc".into(),
            proxy: Default::default(),
            hold: Default::default(),
            drain: Default::default(),
        }),
        metrics: holdfast::report::metrics::MetricsHandle::new(),
        source_problems: Default::default(),
        synced: Default::default(),
    };
    let stop = CancellationToken::new();
    let agent_task = tokio::spawn(agent.serve(listener, stop.clone().cancelled_owned()));
    (agent_addr, stop, agent_task)
}

#[tokio::test]
async fn status_is_read_through_a_portforward_from_the_real_status_api() {
    let (agent_addr, stop, agent_task) = start_agent_status_api().await;
    let (api_addr, seen, api_task) = start_api(Target::Listening(agent_addr)).await;

    let fetched = tokio::time::timeout(
        Duration::from_secs(10),
        fetch_status_body(client_for(api_addr), "worker-1", AGENT_NAMESPACE, 1 << 20),
    )
    .await;
    stop.cancel();
    api_task.abort();
    let _ = agent_task.await;

    let body = fetched
        .expect("an answer within 10 s")
        .expect("status body");
    let status: holdfast::api::NodeStatus = serde_json::from_str(&body).expect("a status document");
    assert_eq!(status.node, "worker-1");
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen[0].starts_with("GET /api/v1/namespaces/holdfast-system/pods?"),
        "{seen:?}"
    );
    assert!(
        seen[0].contains("fieldSelector=spec.nodeName%3Dworker-1"),
        "{seen:?}"
    );
    assert!(
        seen[1].starts_with(&format!(
            "GET /api/v1/namespaces/holdfast-system/pods/{AGENT_POD}/portforward?"
        )),
        "{seen:?}"
    );
    assert!(seen[1].contains("ports=15300"), "{seen:?}");
}

/// Nothing listens on the agent's port in the pod: the kubelet's message on the error channel
/// is what the user sees, not a bare "connection closed".
#[tokio::test]
async fn kubelet_error_on_the_port_is_reported() {
    let (api_addr, _seen, api_task) = start_api(Target::Refused).await;
    let fetched = tokio::time::timeout(
        Duration::from_secs(10),
        fetch_status_body(client_for(api_addr), "worker-1", AGENT_NAMESPACE, 1 << 20),
    )
    .await;
    api_task.abort();
    let e = fetched
        .expect("an answer within 10 s")
        .expect_err("refused");
    assert!(matches!(e, RemoteError::Api { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains(&format!(
            "port-forward to holdfast-system/{AGENT_POD}:15300"
        )),
        "{text}"
    );
    assert!(text.contains("connection refused"), "{text}");
}

/// A kubeconfig for the fake API server, without credentials, in a directory removed on drop.
struct Kubeconfig(std::path::PathBuf);

impl Kubeconfig {
    fn new(api: SocketAddr, name: &str) -> Kubeconfig {
        let dir =
            std::env::temp_dir().join(format!("hf-portforward-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let text = format!(
            "apiVersion: v1\nkind: Config\n\
             clusters:\n- name: fake\n  cluster:\n    server: http://{api}\n\
             users:\n- name: dev\n  user: {{}}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: dev\n\
             current-context: fake\n"
        );
        std::fs::write(dir.join("config"), text).expect("kubeconfig");
        Kubeconfig(dir)
    }

    fn path(&self) -> std::path::PathBuf {
        self.0.join("config")
    }
}

impl Drop for Kubeconfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the `holdfast` binary with `args` and the fake API server's kubeconfig: (exit code,
/// stdout, stderr).
async fn holdfast_cli(kubeconfig: &Kubeconfig, args: &[&str]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_holdfast"));
    cmd.args(args)
        .env("KUBECONFIG", kubeconfig.path())
        .env_remove("KUBERNETES_SERVICE_HOST");
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .expect("run holdfast");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The CLI as a user runs it: `holdfast status --node` with a kubeconfig prints the agent's
/// table; a 403 on the port-forward exits 6 and names the Role to ask for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holdfast_status_node_prints_the_table_and_exits_6_when_forbidden() {
    let (agent_addr, stop, agent_task) = start_agent_status_api().await;
    let (api_addr, _seen, api_task) = start_api(Target::Listening(agent_addr)).await;
    let (forbidding_addr, _seen2, forbidding_task) = start_api(Target::Forbidden).await;
    let ok_config = Kubeconfig::new(api_addr, "ok");
    let forbidden_config = Kubeconfig::new(forbidding_addr, "forbidden");

    let args = ["status", "--node", "worker-1", "--timeout", "10s"];
    let ok = holdfast_cli(&ok_config, &args).await;
    let forbidden = holdfast_cli(&forbidden_config, &args).await;
    stop.cancel();
    api_task.abort();
    forbidding_task.abort();
    let _ = agent_task.await;

    let (code, stdout, stderr) = ok;
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stdout.starts_with("node worker-1, holdfast "),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    let (code, stdout, stderr) = forbidden;
    assert_eq!(code, 6, "stdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.contains("--node worker-1"), "{stderr}");
    assert!(
        stderr.contains("get and create pods/portforward"),
        "{stderr}"
    );
    assert!(stderr.contains("holdfast-status-reader"), "{stderr}");
}

/// A pod port that answers every connection with `answer` and closes.
async fn canned_pod(answer: &'static [u8]) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let mut head = vec![0u8; 4096];
            // The request head (a GET without a body) arrives in one read on loopback.
            let _ = tcp.read(&mut head).await;
            let _ = tcp.write_all(answer).await;
            let _ = tcp.shutdown().await;
        }
    });
    (addr, task)
}

/// The agent's own answers through the forward are sorted as `--agent` sorts them: an error
/// status (exit 4) with its body, and bytes that are not HTTP (exit 5).
#[tokio::test]
async fn agent_error_status_and_garbage_through_the_forward_are_told_apart() {
    /// What the pod port answers, whether the error is of the right kind, what it must say.
    type Case = (&'static [u8], fn(&RemoteError) -> bool, &'static str);
    let cases: [Case; 2] = [
        (
            b"HTTP/1.1 403 Forbidden\r\nContent-Length: 31\r\n\r\n/status answers loopback only\r\n",
            |e| matches!(e, RemoteError::AgentStatus { .. }),
            "403 Forbidden to GET /status: /status answers loopback only",
        ),
        (
            b"SSH-2.0-OpenSSH_9.6\r\n",
            |e| matches!(e, RemoteError::BadAnswer { .. }),
            "is not HTTP the agent serves",
        ),
    ];
    for (answer, kind, text) in cases {
        let (pod_addr, pod_task) = canned_pod(answer).await;
        let (api_addr, _seen, api_task) = start_api(Target::Listening(pod_addr)).await;
        let fetched = tokio::time::timeout(
            Duration::from_secs(10),
            fetch_status_body(client_for(api_addr), "worker-1", AGENT_NAMESPACE, 1 << 20),
        )
        .await;
        api_task.abort();
        pod_task.abort();
        let e = fetched
            .expect("an answer within 10 s")
            .expect_err("not a status");
        assert!(kind(&e), "{e:?}");
        assert!(e.to_string().contains(text), "{e}");
    }
}
