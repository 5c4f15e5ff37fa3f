//! `holdfast check` end to end against a fake cluster: a loopback API server (hyper, real
//! HTTP/1.1 and real WebSocket upgrades) that lists nodes, agent pods and ResourceQuotas, and
//! plays the kubelet's side of each agent's port-forward (the protocol as in
//! tests/status_portforward.rs, whose fake this follows), connecting to a simulated agent: a
//! loopback HTTP server answering `GET /status` with a planted status document. The real
//! `holdfast` binary runs with a kubeconfig naming the fake API server.
//!
//! A clean install (every node with a Ready agent, healthy rows, the quota on GKE) finds
//! nothing and exits 0; a cluster with a node without an agent, an agent that does not answer,
//! GKE without the quota, a hold run to its deadline and a sidecar without the filter finds
//! each, names the objects, and exits 1.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::{self, protocol::Role, Message};

const NS: &str = "holdfast-system";
const STATUS_PORT: u16 = 15300;

/// Where the fake kubelet forwards an agent pod's status port.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// A simulated agent listening here.
    Listening(SocketAddr),
    /// Nothing listens: the kubelet reports the failed dial on the error channel.
    Refused,
    /// The port-forward opens but nothing ever answers (a hung agent).
    Silent,
}

/// The fake cluster's objects.
#[derive(Clone, Default)]
struct Cluster {
    nodes: Vec<Value>,
    /// Agent pods, and where each one's port-forward goes.
    agents: Vec<(Value, Target)>,
    quotas: Vec<Value>,
    seen: Arc<Mutex<Vec<String>>>,
}

fn node(name: &str, gke: bool) -> Value {
    let mut labels = json!({"kubernetes.io/os": "linux", "kubernetes.io/hostname": name});
    if gke {
        labels["cloud.google.com/gke-nodepool"] = json!("default-pool");
    }
    json!({
        "metadata": {"name": name, "labels": labels},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}
    })
}

fn agent_pod(name: &str, node: &str, ready: bool) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NS,
                     "labels": {"app.kubernetes.io/name": "holdfast", "app.kubernetes.io/component": "agent"}},
        "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "x"}]},
        "status": {"phase": "Running",
                   "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
    })
}

fn quota() -> Value {
    json!({
        "metadata": {"name": "holdfast-critical-pods", "namespace": NS},
        "spec": {"hard": {"pods": "5000"}, "scopeSelector": {"matchExpressions": [
            {"operator": "In", "scopeName": "PriorityClass", "values": ["system-node-critical"]}]}}
    })
}

fn list(kind: &str, items: Vec<Value>) -> String {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items})
        .to_string()
}

fn answer(mut req: Request<hyper::body::Incoming>, cluster: &Cluster) -> Response<Full<Bytes>> {
    cluster
        .seen
        .lock()
        .expect("lock")
        .push(format!("{} {}", req.method(), req.uri()));
    let path = req.uri().path().to_string();
    let ok = |body: String| Response::new(Full::new(Bytes::from(body)));
    if path == "/api/v1/nodes" {
        return ok(list("NodeList", cluster.nodes.clone()));
    }
    if path == format!("/api/v1/namespaces/{NS}/pods") {
        let q = req.uri().query().unwrap_or_default();
        assert!(
            q.contains("labelSelector=app.kubernetes.io%2Fname%3Dholdfast"),
            "the agents are listed by their labels: {q}"
        );
        return ok(list(
            "PodList",
            cluster.agents.iter().map(|(p, _)| p.clone()).collect(),
        ));
    }
    if path == format!("/api/v1/namespaces/{NS}/resourcequotas") {
        return ok(list("ResourceQuotaList", cluster.quotas.clone()));
    }
    let target = cluster.agents.iter().find_map(|(p, t)| {
        let name = p["metadata"]["name"].as_str()?;
        (path == format!("/api/v1/namespaces/{NS}/pods/{name}/portforward")).then_some(*t)
    });
    let key = req
        .headers()
        .get("sec-websocket-key")
        .map(|k| k.as_bytes().to_vec());
    let (Some(target), Some(key)) = (target, key) else {
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

/// The kubelet's half of one port-forward of the status port (tests/status_portforward.rs).
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
        Target::Silent => {
            // Hold the stream open without a byte until the client gives up.
            while let Some(Ok(_)) = ws.next().await {}
            return;
        }
        Target::Refused => {
            let why = format!("error forwarding port {STATUS_PORT} to pod 0123: dial tcp4 127.0.0.1:{STATUS_PORT}: connect: connection refused");
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

/// Serves `cluster` on a loopback port until the returned task is aborted.
async fn start_api(cluster: Cluster) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let cluster = cluster.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let cluster = cluster.clone();
                        async move { Ok::<_, std::convert::Infallible>(answer(req, &cluster)) }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .with_upgrades()
                    .await;
            });
        }
    });
    (addr, task)
}

/// A simulated agent: answers every `GET /status` on its loopback port with `doc`.
async fn simulated_agent(doc: Value) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let body = doc.to_string();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let body = body.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let body = body.clone();
                        async move {
                            assert_eq!(req.uri().path(), "/status");
                            Ok::<_, std::convert::Infallible>(
                                Response::builder()
                                    .header("content-type", "application/json")
                                    .body(Full::new(Bytes::from(body)))
                                    .expect("response"),
                            )
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    (addr, task)
}

fn rfc3339(t: SystemTime) -> String {
    holdfast::api::time::rfc3339::format(t)
}

/// A status row (as the agent serves it) of a pod held and released on time.
fn row(name: &str, hold_outcome: &str) -> Value {
    let now = SystemTime::now();
    json!({
        "namespace": "shop", "name": name, "uid": format!("uid-{name}"), "phase": "ready",
        "mode": "classic", "mesh": "istio",
        "tracked_since": rfc3339(now - Duration::from_secs(60)),
        "hold": {"started_at": rfc3339(now - Duration::from_secs(59)),
                 "released_at": rfc3339(now - Duration::from_secs(58)),
                 "packets_held": 1, "connections_held": 1, "ready_to_release_ms": 0.5,
                 "adopted": false, "late": false, "outcome": hold_outcome},
        "drain": null, "job": null, "last_error": null, "skipped_reason": null
    })
}

fn status_doc(node: &str, pods: Vec<Value>) -> Value {
    json!({"node": node, "agent_version": "0.1.0", "pods": pods, "source_problems": []})
}

/// A kubeconfig for the fake API server, without credentials, in a directory removed on drop.
struct Kubeconfig(std::path::PathBuf);

impl Kubeconfig {
    fn new(api: SocketAddr, name: &str) -> Kubeconfig {
        let dir =
            std::env::temp_dir().join(format!("hf-cluster-cli-{name}-{}", std::process::id()));
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
}

impl Drop for Kubeconfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `program` (the holdfast binary, or a link to it named otherwise) with `args` against
/// the kubeconfig: (exit code, stdout, stderr).
async fn run(
    program: std::path::PathBuf,
    kubeconfig: &Kubeconfig,
    args: &[&str],
) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .env("KUBECONFIG", kubeconfig.0.join("config"))
        .env_remove("KUBERNETES_SERVICE_HOST");
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::task::spawn_blocking(move || cmd.output()),
    )
    .await
    .expect("the CLI ends within 30 s")
    .expect("join")
    .expect("run the CLI");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn holdfast() -> std::path::PathBuf {
    env!("CARGO_BIN_EXE_holdfast").into()
}

/// Two GKE nodes, each with a Ready agent answering healthy rows, the quota in place.
async fn clean_cluster() -> (Cluster, Vec<tokio::task::JoinHandle<()>>) {
    let mut tasks = vec![];
    let mut cluster = Cluster {
        nodes: vec![node("node-a", true), node("node-b", true)],
        quotas: vec![quota()],
        ..Default::default()
    };
    for (pod, n) in [("holdfast-aaaaa", "node-a"), ("holdfast-bbbbb", "node-b")] {
        let (addr, task) =
            simulated_agent(status_doc(n, vec![row(&format!("web-{n}"), "ready")])).await;
        tasks.push(task);
        cluster
            .agents
            .push((agent_pod(pod, n, true), Target::Listening(addr)));
    }
    (cluster, tasks)
}

#[tokio::test]
async fn check_finds_nothing_on_a_clean_install() {
    let (cluster, tasks) = clean_cluster().await;
    let seen = cluster.seen.clone();
    let (api, api_task) = start_api(cluster).await;
    let kc = Kubeconfig::new(api, "clean");
    let (code, out, err) = run(holdfast(), &kc, &["check"]).await;
    api_task.abort();
    tasks.iter().for_each(|t| t.abort());
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(
        out.contains("0 error(s), 0 warning(s); 2 node(s), 2 agent(s), 2 answered"),
        "{out}"
    );
    let seen = seen.lock().expect("lock").clone();
    // One list each, one port-forward per agent: nothing more.
    assert_eq!(seen.len(), 5, "{seen:#?}");
}

/// Each problem planted at once, each found with its code and objects; exit 1 for the errors.
#[tokio::test]
async fn check_finds_each_planted_problem() {
    let mut tasks = vec![];
    // node-a: answers rows with a hold run to its deadline and a drained sidecar without the
    // filter; node-b: its agent's port refuses; node-c: a hung agent; node-d: no agent at all;
    // GKE, and no quota.
    let mut unfiltered = row("no-filter", "ready");
    unfiltered["phase"] = json!("done");
    let started = rfc3339(SystemTime::now() - Duration::from_secs(30));
    unfiltered["drain"] = json!({
        "outcome": "app-done", "started_at": started, "deadline_at": null,
        "deadline_meaning": "kill-time", "inbound_drained": true, "health_checks_restored": 0,
        "agent_signalled": false, "envoy_version": "1.40.0", "app_gone_at": null,
        "quit_sent_at": null, "quit_reason": null, "proxy_exit_seen_at": null,
        "app_gone_to_quit_ms": null, "app_gone_to_proxy_exit_ms": null, "elapsed_ms": 1000,
        "app_processes_seen": 1, "app_processes_left": 0, "filter_present": false,
        "last_counts": null, "last_traffic_bytes": 0, "errors": [], "error_count": 0, "advice": null
    });
    let (addr, task) = simulated_agent(status_doc(
        "node-a",
        vec![
            row("web-1", "ready"),
            row("slow-config", "deadline"),
            unfiltered,
        ],
    ))
    .await;
    tasks.push(task);
    let cluster = Cluster {
        nodes: ["node-a", "node-b", "node-c", "node-d"]
            .iter()
            .map(|n| node(n, true))
            .collect(),
        agents: vec![
            (
                agent_pod("holdfast-aaaaa", "node-a", true),
                Target::Listening(addr),
            ),
            (agent_pod("holdfast-bbbbb", "node-b", true), Target::Refused),
            (agent_pod("holdfast-ccccc", "node-c", true), Target::Silent),
        ],
        quotas: vec![],
        ..Default::default()
    };
    let (api, api_task) = start_api(cluster).await;
    let kc = Kubeconfig::new(api, "planted");
    let started = std::time::Instant::now();
    let (code, out, err) = run(holdfast(), &kc, &["check", "--timeout", "2s"]).await;
    let (json_code, json_out, _) =
        run(holdfast(), &kc, &["check", "-o", "json", "--timeout", "1s"]).await;
    api_task.abort();
    tasks.iter().for_each(|t| t.abort());
    eprintln!("{out}");
    assert_eq!(code, 1, "errors exit 1\nstdout: {out}\nstderr: {err}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the hung agent is bounded by --timeout"
    );
    let expect = [
        ("HF0101", "node/node-d"),
        // node-d has no startup taint either: meshed pods would start there unheld.
        ("HF0105", "node/node-d"),
        ("HF0103", "namespace/holdfast-system"),
        ("HF0102", "pod/holdfast-system/holdfast-bbbbb"),
        ("HF0102", "pod/holdfast-system/holdfast-ccccc"),
        ("HF0201", "pod/shop/slow-config"),
        ("HF0203", "pod/shop/no-filter"),
    ];
    for (code, object) in expect {
        assert!(
            out.lines()
                .any(|l| l.starts_with(code) && l.contains(object)),
            "{code} {object} not found:\n{out}"
        );
    }
    assert!(
        out.contains("port-forward to holdfast-system/holdfast-bbbbb:15300 failed"),
        "the failed port-forward is shown:\n{out}"
    );
    assert!(
        out.contains("within 2000 ms"),
        "the deadline is shown:\n{out}"
    );
    assert!(
        !out.contains("web-1"),
        "a healthy pod is not a finding:\n{out}"
    );
    assert!(out.contains("2 error(s), 5 warning(s)"), "{out}");

    assert_eq!(json_code, 1);
    let doc: Value = serde_json::from_str(&json_out).expect("JSON");
    let mut codes: BTreeMap<String, usize> = BTreeMap::new();
    for f in doc["findings"].as_array().expect("findings") {
        *codes
            .entry(f["code"].as_str().unwrap().to_string())
            .or_default() += 1;
        assert!(f["fix"].as_str().is_some_and(|s| !s.is_empty()));
    }
    assert_eq!(
        codes,
        [
            ("HF0101", 1),
            ("HF0105", 1),
            ("HF0102", 2),
            ("HF0103", 1),
            ("HF0201", 1),
            ("HF0203", 1)
        ]
        .into_iter()
        .map(|(c, n)| (c.to_string(), n))
        .collect()
    );
}

/// The agents cannot be listed (no API server): exit 3 with the reason on stderr.
#[tokio::test]
async fn check_without_an_api_server_says_so() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let kc = Kubeconfig::new(addr, "none");
    let (code, out, err) = run(holdfast(), &kc, &["check"]).await;
    assert_eq!(code, 3, "stdout: {out}\nstderr: {err}");
    assert!(err.contains("list pods in holdfast-system"), "{err}");
}

/// The binary under the name krew installs it as: a symbolic link `kubectl-holdfast` in a
/// directory removed on drop.
struct PluginLink(std::path::PathBuf);

impl PluginLink {
    fn new(name: &str) -> PluginLink {
        let dir = std::env::temp_dir().join(format!("hf-plugin-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::os::unix::fs::symlink(holdfast(), dir.join("kubectl-holdfast")).expect("link");
        PluginLink(dir)
    }

    fn path(&self) -> std::path::PathBuf {
        self.0.join("kubectl-holdfast")
    }
}

impl Drop for PluginLink {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `kubectl holdfast status` (the binary as `kubectl-holdfast`) reads every node: each answering
/// agent's rows with its node, an agent that refuses and one that hangs as rows saying so, a
/// node without an agent as a row; filters narrow the pods but never hide a silent node.
#[tokio::test]
async fn kubectl_holdfast_status_shows_every_node() {
    let mut tasks = vec![];
    let (a, t) = simulated_agent(status_doc(
        "node-a",
        vec![row("web-1", "ready"), row("slow-config", "deadline")],
    ))
    .await;
    tasks.push(t);
    let mut kuma = row("pay-1", "ready");
    kuma["namespace"] = json!("pay");
    kuma["mesh"] = json!("kuma");
    let (b, t) = simulated_agent(status_doc("node-b", vec![kuma])).await;
    tasks.push(t);
    let cluster = Cluster {
        nodes: ["node-a", "node-b", "node-c", "node-d", "node-e"]
            .iter()
            .map(|n| node(n, false))
            .collect(),
        agents: vec![
            (
                agent_pod("holdfast-aaaaa", "node-a", true),
                Target::Listening(a),
            ),
            (
                agent_pod("holdfast-bbbbb", "node-b", true),
                Target::Listening(b),
            ),
            (agent_pod("holdfast-ccccc", "node-c", true), Target::Refused),
            (agent_pod("holdfast-ddddd", "node-d", true), Target::Silent),
        ],
        ..Default::default()
    };
    let (api, api_task) = start_api(cluster).await;
    let kc = Kubeconfig::new(api, "status");
    let plugin = PluginLink::new("status");
    let (code, out, err) = run(plugin.path(), &kc, &["status", "--timeout", "1s"]).await;
    let (_, filtered, _) = run(
        plugin.path(),
        &kc,
        &["status", "--timeout", "1s", "--mesh", "kuma"],
    )
    .await;
    let (_, json_out, _) = run(
        plugin.path(),
        &kc,
        &["status", "--timeout", "1s", "-o", "json", "-n", "shop"],
    )
    .await;
    let (_, help, _) = run(plugin.path(), &kc, &["status", "--help"]).await;
    // The same binary as `holdfast` reads the local agent unless told --all-nodes.
    let (_, local, _) = run(
        holdfast(),
        &kc,
        &["status", "-A", "--timeout", "1s", "--phase", "ready"],
    )
    .await;
    api_task.abort();
    tasks.iter().for_each(|t| t.abort());
    eprintln!("{out}");
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    for (node, what) in [
        ("node-a", "shop/web-1"),
        ("node-a", "shop/slow-config"),
        ("node-b", "pay/pay-1"),
        // The kubelet's "connection refused" when its error frame wins the race with the closed
        // stream in kube's demultiplexer, "connection closed" otherwise (seen under load): the
        // row says the port-forward failed either way.
        (
            "node-c",
            "port-forward to holdfast-system/holdfast-ccccc:15300 failed",
        ),
        (
            "node-d",
            "no answer from holdfast-system/holdfast-ddddd within 1000 ms",
        ),
        ("node-e", "no holdfast agent pod on this node"),
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(node) && l.contains(what)),
            "{node}: {what} missing:\n{out}"
        );
    }
    assert!(
        out.contains("3 pod(s) on 5 node(s); 3 node(s) without an answer"),
        "{out}"
    );
    assert!(
        filtered.contains("pay/pay-1") && !filtered.contains("shop/web-1"),
        "{filtered}"
    );
    assert!(
        filtered.contains("node-d"),
        "a filter never hides a silent node:\n{filtered}"
    );
    let doc: Value = serde_json::from_str(&json_out).expect("JSON");
    let rows = doc.as_array().expect("rows");
    assert_eq!(rows.len(), 5, "{json_out}");
    assert_eq!(
        rows[0]["pods"].as_array().map(Vec::len),
        Some(2),
        "{json_out}"
    );
    assert_eq!(
        rows[1]["pods"].as_array().map(Vec::len),
        Some(0),
        "-n shop: {json_out}"
    );
    assert!(
        rows[2]["error"]
            .as_str()
            .is_some_and(|e| e.contains("port-forward")),
        "{json_out}"
    );
    assert!(help.contains("kubectl holdfast status"), "{help}");
    assert!(
        local.contains("shop/web-1") && local.contains("node-c"),
        "{local}"
    );
}

/// plugins/holdfast.yaml is a krew manifest (krew.sigs.k8s.io "Writing Krew plugin manifests":
/// the file named as the plugin, a `v`-prefixed semantic version, one platform per os/arch
/// whose `bin` is among its files) for this version, for the Linux builds there are.
#[test]
fn the_krew_manifest_installs_this_binary() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/holdfast.yaml");
    let text = std::fs::read_to_string(&path).expect("plugins/holdfast.yaml");
    let m: Value = serde_saphyr::from_str(&text).expect("YAML");
    assert_eq!(
        m["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(m["kind"], "Plugin");
    assert_eq!(m["metadata"]["name"], "holdfast", "the name is the file's");
    assert_eq!(
        m["spec"]["version"],
        format!("v{}", env!("CARGO_PKG_VERSION"))
    );
    let platforms = m["spec"]["platforms"].as_array().expect("platforms");
    let mut seen = vec![];
    for p in platforms {
        let labels = &p["selector"]["matchLabels"];
        let (os, arch) = (
            labels["os"].as_str().unwrap(),
            labels["arch"].as_str().unwrap(),
        );
        seen.push(format!("{os}/{arch}"));
        let uri = p["uri"].as_str().expect("uri");
        assert!(
            uri.starts_with("https://") && uri.ends_with(&format!("_{os}_{arch}.tar.gz")),
            "{uri}"
        );
        assert!(
            uri.contains(&format!("/v{}/", env!("CARGO_PKG_VERSION"))),
            "{uri} is this version's"
        );
        assert!(p["sha256"].as_str().is_some());
        let bin = p["bin"].as_str().expect("bin");
        assert!(
            p["files"]
                .as_array()
                .expect("files")
                .iter()
                .any(|f| f["from"] == bin),
            "{bin} is not among the files"
        );
    }
    assert_eq!(seen, ["linux/amd64", "linux/arm64"]);
}
