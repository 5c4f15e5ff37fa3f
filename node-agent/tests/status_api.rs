//! The status API against hostile clients, with the real agent binary: a flood of idle
//! connections larger than its open-files limit must not take the agent's fds (it keeps reading
//! its pods directory and answers again once the flood's connections time out), idle and slow
//! connections are closed, request heads are bounded.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The agent process, killed on drop (also on panic).
struct Agent {
    child: Child,
    addr: SocketAddr,
    _dir: TempDir,
    pods: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Agent {
    /// Starts the agent on a fresh pods directory with `RLIMIT_NOFILE` soft = hard = `nofile`
    /// (so the agent cannot raise it), and waits for `/healthz`.
    fn start(name: &str, nofile: u64) -> Agent {
        Self::start_on(name, nofile, std::net::Ipv4Addr::LOCALHOST.into())
    }

    /// As [`start`](Self::start), listening on `ip`.
    fn start_on(name: &str, nofile: u64, ip: std::net::IpAddr) -> Agent {
        let dir = std::env::temp_dir().join(format!("hf-statusapi-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pods = dir.join("pods");
        std::fs::create_dir_all(&pods).unwrap();
        let addr = SocketAddr::new(ip, free_port());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
        cmd.args(["agent", "--node-name", "node-a", "--pods-dir"])
            .arg(&pods)
            .args(["--status-listen", &addr.to_string()])
            // An empty proc root: pods wait for their netns, nothing else is touched.
            .args(["--proc-root"])
            .arg(&dir)
            .env("HOLDFAST_LOG", "holdfast=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // SAFETY: only setrlimit (async-signal-safe) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::resource::setrlimit(
                    nix::sys::resource::Resource::RLIMIT_NOFILE,
                    nofile,
                    nofile,
                )
                .map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().expect("starting the agent");
        let agent = Agent {
            child,
            addr,
            _dir: TempDir(dir),
            pods,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let addr = SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port());
        while get(addr, "/healthz").map(|r| r.0) != Ok(200) {
            assert!(
                Instant::now() < deadline,
                "the agent never answered /healthz"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        agent
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// `GET path` on a new connection: (status code, body).
fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(3)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    let code = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line in {out:?}"))?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|b| b.1)
        .unwrap_or("")
        .to_string();
    Ok((code, body))
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    holdfast::report::process_metrics::parse_status(&status)
        .0
        .unwrap_or(0)
}

fn meshed_pod(dir: &Path, name: &str) {
    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                     // As Istio's injector writes it (pkg/kube/inject/webhook.go): a classic
                     // sidecar pod, which the agent tracks.
                     "annotations": {"sidecar.istio.io/status":
                        r#"{"initContainers":["istio-init"],"containers":["istio-proxy"],"volumes":["istio-envoy"],"imagePullSecrets":null}"#}},
        "spec": {"nodeName": "node-a",
                 "initContainers": [{"name": "istio-init"}],
                 "containers": [{"name": "app"}, {"name": "istio-proxy"}]}});
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, pod.to_string()).unwrap();
    std::fs::rename(&tmp, dir.join(format!("{name}.json"))).unwrap();
}

/// ~2000 idle connections against an agent whose open-files limit is 1024: the agent keeps its
/// fds (its count stays far below the limit), reads a pod written during the flood, answers
/// `/status` again while the flood's sockets are still open (once its own idle ones time out),
/// and `/healthz` after; its RSS returns near where it started. The old API kept each idle
/// connection 60 s with no cap: accept failed with EMFILE and the pods directory became
/// unreadable.
#[test]
fn a_connection_flood_cannot_take_the_agents_fds() {
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    // This test process holds the flood: it needs more than 2000 fds itself.
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    assert!(
        hard >= 4096,
        "this test needs a hard open-files limit of at least 4096"
    );
    let agent = Agent::start("flood", 1024);
    let pid = agent.pid();
    let fds_start = open_fds(pid);
    let rss_start = rss_kib(pid);

    let flood_start = Instant::now();
    let mut flood = Vec::new();
    let mut max_fds = 0;
    for i in 0..2000 {
        match TcpStream::connect_timeout(&agent.addr, Duration::from_secs(2)) {
            Ok(s) => flood.push(s),
            Err(e) => panic!("connection {i} failed: {e}"),
        }
        if i % 100 == 0 {
            max_fds = max_fds.max(open_fds(pid));
        }
    }
    let open_time = flood_start.elapsed();
    meshed_pod(&agent.pods, "during-flood");
    max_fds = max_fds.max(open_fds(pid));
    let rss_peak = rss_kib(pid);
    println!(
        "flood: 2000 connections opened in {open_time:?}; agent fds {fds_start} at start, at most {max_fds} during; RSS {rss_start} KiB at start, {rss_peak} KiB in the flood"
    );
    assert!(
        max_fds < fds_start + holdfast::report::server::MAX_CONNECTIONS + 16,
        "the API took more fds than its cap: {max_fds} (start {fds_start})"
    );

    // While the flood's sockets are all still open: once the API's own idle connections time
    // out (5 s), /status answers, and shows the pod written during the flood.
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        match get(agent.addr, "/status") {
            Ok((200, body)) if body.contains("during-flood") => break body,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            other => panic!("/status during the flood: {other:?}"),
        }
    };
    println!(
        "/status answered {:?} after the flood started, with the pod written during it ({} bytes)",
        flood_start.elapsed(),
        status.len()
    );
    drop(flood);
    assert_eq!(get(agent.addr, "/healthz").map(|r| r.0), Ok(200));
    meshed_pod(&agent.pods, "after-flood");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !get(agent.addr, "/status").is_ok_and(|(_, b)| b.contains("after-flood")) {
        assert!(
            Instant::now() < deadline,
            "a pod written after the flood was not read"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let rss_end = rss_kib(pid);
    let fds_end = open_fds(pid);
    println!("after the flood: agent fds {fds_end}, RSS {rss_end} KiB");
    assert!(
        fds_end <= fds_start + 4,
        "fds leaked: {fds_start} -> {fds_end}"
    );
    assert!(
        rss_end < rss_start + 8 * 1024,
        "RSS did not come back: {rss_start} KiB -> {rss_end} KiB"
    );
    let (code, metrics) = get(agent.addr, "/metrics").unwrap();
    assert_eq!(code, 200);
    let rejected = metrics
        .lines()
        .find_map(|l| l.strip_prefix("holdfast_status_api_rejected_connections_total "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    // Every connection the API did not serve was closed at accept and counted. It serves at most
    // MAX_CONNECTIONS per header timeout (idle ones are closed then and free their slots).
    let rounds =
        open_time.as_secs_f64() / holdfast::report::server::HEADER_READ_TIMEOUT.as_secs_f64();
    let served_at_most =
        holdfast::report::server::MAX_CONNECTIONS as u64 * (rounds.ceil() as u64 + 1);
    println!("rejected at accept: {rejected} of 2000 (opened in {open_time:?})");
    assert!(
        rejected >= 2000 - served_at_most,
        "rejected connections not counted: {rejected} (at most {served_at_most} served)\n{metrics}"
    );
    for name in [
        "holdfast_process_open_fds",
        "holdfast_process_max_fds",
        "holdfast_process_resident_memory_bytes",
        "holdfast_process_threads",
        "holdfast_source_problems",
    ] {
        assert!(
            metrics.contains(&format!("\n{name} ")),
            "{name} missing:\n{metrics}"
        );
    }
}

/// An idle connection (nothing sent, or idle after a keep-alive response) is closed after the
/// header timeout; an oversized request head gets 431; a POST gets 405.
#[test]
fn idle_slow_and_oversized_requests_are_cut_off() {
    let agent = Agent::start("limits", 1024);
    let timeout = holdfast::report::server::HEADER_READ_TIMEOUT;

    let mut silent = TcpStream::connect(agent.addr).unwrap();
    silent.set_read_timeout(Some(timeout * 3)).unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 256];
    let n = silent.read(&mut buf).unwrap_or(0);
    let waited = t.elapsed();
    assert!(
        waited >= timeout - Duration::from_millis(200) && waited < timeout * 2,
        "a silent connection was closed after {waited:?} ({n} bytes)"
    );

    let mut keepalive = TcpStream::connect(agent.addr).unwrap();
    keepalive.set_read_timeout(Some(timeout * 3)).unwrap();
    write!(keepalive, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let n = keepalive.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let t = Instant::now();
    // The next read is the close (0 bytes) once the idle keep-alive times out.
    let n = keepalive.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0);
    assert!(
        t.elapsed() < timeout * 2,
        "idle keep-alive lasted {:?}",
        t.elapsed()
    );

    let mut big = TcpStream::connect(agent.addr).unwrap();
    big.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let long = "x".repeat(holdfast::report::server::MAX_HEADER_BYTES * 2);
    let _ = write!(
        big,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: {long}\r\n\r\n"
    );
    let mut out = String::new();
    let _ = big.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 431"), "{out:?}");

    let mut post = TcpStream::connect(agent.addr).unwrap();
    post.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    write!(
        post,
        "POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    post.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 405"), "{out:?}");
}

/// A local address that is not loopback (the host's own, so traffic stays on this machine).
fn non_loopback_local_ip() -> std::net::IpAddr {
    nix::ifaddrs::getifaddrs()
        .unwrap()
        .filter_map(|a| a.address?.as_sockaddr_in().map(|s| s.ip()))
        .find(|ip| !ip.is_loopback() && !ip.is_unspecified())
        .map(std::net::IpAddr::V4)
        .expect("this test needs a non-loopback IPv4 address on some interface")
}

/// `/status` and `/config` answer loopback clients only (port-forward, the agent's own pod);
/// `/healthz` (kubelet probes) and `/metrics` (Prometheus) answer anyone.
#[test]
fn status_and_config_answer_local_clients_only() {
    let agent = Agent::start_on("access", 1024, std::net::Ipv4Addr::UNSPECIFIED.into());
    let local = SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), agent.addr.port());
    let remote = SocketAddr::new(non_loopback_local_ip(), agent.addr.port());
    for path in ["/status", "/config"] {
        assert_eq!(
            get(local, path).map(|r| r.0),
            Ok(200),
            "{path} from loopback"
        );
        let (code, body) = get(remote, path).unwrap();
        assert_eq!(code, 403, "{path} from {remote}: {body}");
        assert!(body.contains("port-forward"), "{body}");
    }
    for path in ["/healthz", "/metrics"] {
        assert_eq!(
            get(remote, path).map(|r| r.0),
            Ok(200),
            "{path} from {remote}"
        );
    }
}

/// A pods-dir source that shares its `SourceProblems` with the API (`PodsDir::with_problems`):
/// a rejected entry is on `/status` as `source_problems` and counted in
/// `holdfast_source_problems`, not only logged.
#[tokio::test]
async fn source_problems_are_served_on_status_and_counted() {
    use holdfast::config::{Config, SourceConfig};
    let dir = std::env::temp_dir().join(format!("hf-statusapi-problems-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = TempDir(dir.clone());
    std::os::unix::fs::symlink("loop.json", dir.join("loop.json")).unwrap();

    let problems = holdfast::source::SourceProblems::default();
    let mut src = holdfast::source::dir::PodsDir::new(&dir)
        .unwrap()
        .with_problems(problems.clone());
    src.poll().unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let api = holdfast::report::server::StatusApi {
        board: holdfast::report::board::StatusBoard::default(),
        config: std::sync::Arc::new(Config {
            node_name: "node-a".into(),
            source: SourceConfig::PodsDir(dir.clone()),
            status_listen: addr,
            health_listen: None,
            metrics_listen: None,
            proc_root: "/proc".into(),
            proxy: Default::default(),
            hold: Default::default(),
            drain: Default::default(),
        }),
        metrics: holdfast::report::metrics::MetricsHandle::new(),
        source_problems: problems,
        synced: Default::default(),
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(api.serve(listener, stop.clone().cancelled_owned()));

    let (status, metrics) = tokio::task::spawn_blocking(move || {
        (
            get(addr, "/status").unwrap(),
            get(addr, "/metrics").unwrap(),
        )
    })
    .await
    .unwrap();
    stop.cancel();
    let _ = server.await;

    assert_eq!(status.0, 200);
    let doc: serde_json::Value = serde_json::from_str(&status.1).unwrap();
    let listed = doc["source_problems"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(listed.len(), 1, "{doc}");
    assert!(
        listed[0]["entry"]
            .as_str()
            .unwrap_or("")
            .ends_with("loop.json"),
        "{doc}"
    );
    assert!(
        listed[0]["problem"]
            .as_str()
            .unwrap_or("")
            .contains("symlink loop"),
        "{doc}"
    );
    assert!(
        metrics.1.contains("\nholdfast_source_problems 1\n"),
        "{}",
        metrics.1
    );
}
