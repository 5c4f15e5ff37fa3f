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
        Self::start_with(name, nofile, &[])
    }

    /// As [`start`](Self::start), with more flags.
    fn start_with(name: &str, nofile: u64, extra: &[String]) -> Agent {
        let ip: std::net::IpAddr = std::net::Ipv4Addr::LOCALHOST.into();
        let dir = std::env::temp_dir().join(format!("hf-statusapi-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pods = dir.join("pods");
        std::fs::create_dir_all(&pods).unwrap();
        let addr = SocketAddr::new(ip, free_port());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
        cmd.args(["agent", "--node-name", "node-a", "--pods-dir"])
            .arg(&pods)
            .args(["--status-listen", &addr.to_string()])
            .args(extra)
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
    procfs::process::Process::new(pid as i32)
        .and_then(|p| p.status())
        .ok()
        .and_then(|s| s.vmrss)
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

/// The three listeners: `/status` and `/config` only on the loopback one (a public
/// `--status-listen` is refused at start), the probes alone on the health listener, `/metrics`
/// alone on the metrics listener — both reachable from outside the agent's pod.
#[test]
fn status_stays_on_loopback_and_each_listener_serves_its_own() {
    let (health_port, metrics_port) = (free_port(), free_port());
    let agent = Agent::start_with(
        "access",
        1024,
        &[
            "--health-listen".into(),
            format!("0.0.0.0:{health_port}"),
            "--metrics-listen".into(),
            format!("0.0.0.0:{metrics_port}"),
        ],
    );
    let ip = non_loopback_local_ip();
    for path in ["/status", "/config", "/metrics", "/healthz"] {
        assert_eq!(
            get(agent.addr, path).map(|r| r.0),
            Ok(200),
            "{path} on loopback"
        );
    }
    // The loopback listener cannot be reached through another address at all.
    assert!(
        TcpStream::connect_timeout(
            &SocketAddr::new(ip, agent.addr.port()),
            Duration::from_secs(1)
        )
        .is_err(),
        "the status listener answers on {ip}"
    );
    let health = SocketAddr::new(ip, health_port);
    let metrics = SocketAddr::new(ip, metrics_port);
    for path in ["/healthz", "/readyz"] {
        assert_eq!(
            get(health, path).map(|r| r.0),
            Ok(200),
            "{path} on {health}"
        );
    }
    assert_eq!(get(metrics, "/metrics").map(|r| r.0), Ok(200));
    for (addr, path) in [
        (health, "/status"),
        (health, "/metrics"),
        (metrics, "/status"),
        (metrics, "/config"),
        (metrics, "/healthz"),
    ] {
        let (code, body) = get(addr, path).unwrap();
        assert_eq!(code, 404, "{path} on {addr}: {body}");
    }
    let (_, body) = get(metrics, "/status").unwrap();
    assert!(body.contains("port-forward"), "{body}");

    // A public --status-listen is refused with the fix.
    let out = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(["agent", "--node-name", "n", "--pods-dir", "/nonexistent"])
        .args(["--status-listen", "0.0.0.0:15300"])
        .output()
        .expect("run the agent");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not a loopback address") && stderr.contains("--health-listen"),
        "{stderr}"
    );
}

/// A keep-alive client that sends one request every `every` until `stop`, from `source`.
fn slot_holder(
    target: SocketAddr,
    source: std::net::Ipv4Addr,
    every: Duration,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u32> {
    std::thread::spawn(move || {
        let mut answered = 0u32;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok(sock) = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            else {
                return answered;
            };
            let _ = sock.bind(&SocketAddr::new(source.into(), 0).into());
            if sock
                .connect_timeout(&target.into(), Duration::from_secs(1))
                .is_err()
            {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            let mut s: TcpStream = sock.into();
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            loop {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return answered;
                }
                if write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").is_err() {
                    break;
                }
                let mut buf = [0u8; 64 * 1024];
                match s.read(&mut buf) {
                    Ok(n) if n > 0 => answered += 1,
                    _ => {
                        // Closed at the limit: back off as a real client's retry would. Without
                        // it 70 threads reconnect in a hot loop and starve a 2-core machine (the
                        // other tests' agents then miss their start deadline).
                        std::thread::sleep(Duration::from_millis(200));
                        break;
                    }
                }
                let t = Instant::now();
                while t.elapsed() < every && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        answered
    })
}

/// The issue's second row: 70 keep-alive clients of the status API (one request every 4 s
/// each) took every slot and the kubelet-style liveness probe (`GET /healthz` on a new
/// connection, once a second) was answered 0 of 10. Now the probe has its own listener: with
/// 70 busy clients of the metrics listener from one address, then from 70 addresses, and 70
/// of the health listener itself from one address, the probe is answered every time.
#[test]
fn liveness_is_answered_beside_seventy_busy_clients() {
    let (health_port, metrics_port) = (free_port(), free_port());
    let _agent = Agent::start_with(
        "slots",
        4096,
        &[
            "--health-listen".into(),
            format!("127.0.0.1:{health_port}"),
            "--metrics-listen".into(),
            format!("127.0.0.1:{metrics_port}"),
        ],
    );
    let health = SocketAddr::from(([127, 0, 0, 1], health_port));
    let metrics = SocketAddr::from(([127, 0, 0, 1], metrics_port));
    // The kubelet's probe: a new connection from 127.0.0.1, one request, once a second.
    let probe = |rounds: u32| -> u32 {
        let mut ok = 0;
        for _ in 0..rounds {
            let t = Instant::now();
            if get(health, "/healthz").map(|r| r.0) == Ok(200) {
                ok += 1;
            }
            std::thread::sleep(Duration::from_secs(1).saturating_sub(t.elapsed()));
        }
        ok
    };
    // Each load names how many of its clients must have been answered at least once (proof the
    // listener's slots were really taken: a per-peer or a whole-listener limit full), and for the
    // metrics listener a control: the same kubelet-style probe sent to the busy listener itself
    // fails, so the load would have starved a shared listener (the state before the split).
    use holdfast::report::server::{MAX_CONNECTIONS, PER_PEER_CONNECTIONS};
    let from = |n: u8| std::net::Ipv4Addr::new(127, 0, 0, n);
    for (what, targets, min_served_clients, control) in [
        (
            "70 clients of /metrics from 127.0.0.2",
            (0..70).map(|_| (metrics, from(2))).collect::<Vec<_>>(),
            PER_PEER_CONNECTIONS,
            None,
        ),
        (
            "70 clients of /metrics from 70 addresses",
            (0..70)
                .map(|i| (metrics, std::net::Ipv4Addr::new(127, 0, 1, i + 1)))
                .collect(),
            MAX_CONNECTIONS,
            Some(metrics),
        ),
        (
            "70 clients of the health listener from 127.0.0.3",
            (0..70).map(|_| (health, from(3))).collect(),
            PER_PEER_CONNECTIONS,
            None,
        ),
    ] {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let holders: Vec<_> = targets
            .into_iter()
            .map(|(t, src)| slot_holder(t, src, Duration::from_secs(4), stop.clone()))
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        // The control probes the busy listener at the same time, from its own address.
        let control = control.map(|busy| {
            std::thread::spawn(move || {
                let mut ok = 0;
                for _ in 0..10 {
                    let t = Instant::now();
                    if get(busy, "/healthz").is_ok() {
                        ok += 1;
                    }
                    std::thread::sleep(Duration::from_secs(1).saturating_sub(t.elapsed()));
                }
                ok
            })
        });
        let answered = probe(10);
        let control = control.map(|c| c.join().unwrap_or(10));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let served: Vec<u32> = holders.into_iter().map(|h| h.join().unwrap_or(0)).collect();
        let served_clients = served.iter().filter(|&&n| n > 0).count();
        let requests: u32 = served.iter().sum();
        println!(
            "{what}: liveness answered {answered} of 10; clients answered at least once: \
             {served_clients}, their requests answered: {requests}; control (a probe of the busy \
             listener): {control:?} of 10"
        );
        assert!(answered >= 9, "{what}: liveness answered {answered} of 10");
        assert!(
            served_clients >= min_served_clients,
            "{what}: only {served_clients} clients were ever answered (at least \
             {min_served_clients} must hold a slot, or the load proves nothing)"
        );
        if let Some(control) = control {
            assert!(
                control <= 2,
                "{what}: the busy listener itself answered {control} of 10 probes: the load did \
                 not take its slots, so the liveness figure proves nothing"
            );
        }
    }
    // The same 70 clients against a baseline build with one listener for everything (the
    // figure before this change, for docs/benchmarks.md): HOLDFAST_BASELINE_BIN=path.
    if let Some(baseline) = std::env::var_os("HOLDFAST_BASELINE_BIN") {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("hf-statusapi-base-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let _cleanup = TempDir(dir.clone());
        let child = Command::new(baseline)
            .args(["agent", "--node-name", "n", "--pods-dir"])
            .arg(&dir)
            .args(["--status-listen", &format!("127.0.0.1:{port}")])
            .args(["--proc-root"])
            .arg(&dir)
            .stderr(Stdio::null())
            .spawn()
            .expect("baseline agent");
        struct Kill(Child);
        impl Drop for Kill {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let _child = Kill(child);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        while get(addr, "/healthz").is_err() {
            std::thread::sleep(Duration::from_millis(50));
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let holders: Vec<_> = (0..70)
            .map(|_| {
                slot_holder(
                    addr,
                    std::net::Ipv4Addr::new(127, 0, 0, 2),
                    Duration::from_secs(4),
                    stop.clone(),
                )
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        let mut answered = 0;
        for _ in 0..10 {
            let t = Instant::now();
            if get(addr, "/healthz").map(|r| r.0) == Ok(200) {
                answered += 1;
            }
            std::thread::sleep(Duration::from_secs(1).saturating_sub(t.elapsed()));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for h in holders {
            let _ = h.join();
        }
        println!("baseline (one listener): liveness answered {answered} of 10 beside 70 clients");
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
