//! The Envoy admin client against a fake server on 127.0.0.1 (garbage, truncated, huge, slow,
//! chunked, 426 for HTTP/1.0) and against real Envoy (admin listener only; also inside a netns
//! through `PodNetns`).

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use holdfast::effects::envoy_admin::{AdminClient, Error, ServerState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the fake server does after reading a request.
#[derive(Clone)]
enum Behavior {
    /// Writes these pieces (with a pause between them), then closes.
    Write(Vec<Vec<u8>>, Duration),
    /// Reads the request and never answers.
    Silent,
    /// 426 to HTTP/1.0 requests, as Envoy's admin does; `LIVE` to HTTP/1.1.
    RejectHttp10,
    /// `LIVE` to every request, on the same connection (HTTP/1.1 keep-alive, as Envoy's admin).
    KeepAlive,
}

struct FakeServer {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
    connections: Arc<AtomicUsize>,
}

async fn fake(behavior: Behavior) -> Result<FakeServer> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let requests = Arc::new(Mutex::new(Vec::new()));
    let connections = Arc::new(AtomicUsize::new(0));
    let seen = requests.clone();
    let accepted = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            accepted.fetch_add(1, Ordering::SeqCst);
            let behavior = behavior.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                if let Behavior::KeepAlive = behavior {
                    let mut pending = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                            let request: Vec<u8> = pending.drain(..end + 4).collect();
                            seen.lock()
                                .expect("lock")
                                .push(String::from_utf8_lossy(&request).into_owned());
                            if stream
                                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nLIVE\n")
                                .await
                                .is_err()
                            {
                                return;
                            }
                        }
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => pending.extend_from_slice(&buf[..n]),
                        }
                    }
                }
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let request = String::from_utf8_lossy(&request).into_owned();
                seen.lock().expect("lock").push(request.clone());
                match behavior {
                    Behavior::Write(pieces, pause) => {
                        for piece in pieces {
                            if stream.write_all(&piece).await.is_err() {
                                return;
                            }
                            let _ = stream.flush().await;
                            tokio::time::sleep(pause).await;
                        }
                    }
                    Behavior::Silent => tokio::time::sleep(Duration::from_secs(30)).await,
                    Behavior::RejectHttp10 => {
                        let response: &[u8] = if request
                            .lines()
                            .next()
                            .is_some_and(|l| l.ends_with("HTTP/1.0"))
                        {
                            b"HTTP/1.1 426 Upgrade Required\r\ncontent-length: 0\r\n\r\n"
                        } else {
                            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nLIVE\n"
                        };
                        let _ = stream.write_all(response).await;
                    }
                    Behavior::KeepAlive => {}
                }
            });
        }
    });
    Ok(FakeServer {
        addr,
        requests,
        connections,
    })
}

fn client(addr: SocketAddr) -> AdminClient {
    AdminClient::local(addr).with_timeouts(Duration::from_millis(500), Duration::from_millis(500))
}

fn once(bytes: &[u8]) -> Behavior {
    Behavior::Write(vec![bytes.to_vec()], Duration::ZERO)
}

#[tokio::test]
async fn ready_states_and_request_shape() -> Result<()> {
    let live = fake(once(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\nLIVE\n",
    ))
    .await?;
    ensure!(client(live.addr).ready().await? == ServerState::Live);
    let request = live.requests.lock().expect("lock")[0].clone();
    ensure!(
        request.starts_with("GET /ready HTTP/1.1\r\n"),
        "request: {request:?}"
    );
    ensure!(
        !request.to_ascii_lowercase().contains("connection: close"),
        "the client keeps its connection: {request:?}"
    );

    let draining = fake(once(
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 9\r\n\r\nDRAINING\n",
    ))
    .await?;
    ensure!(client(draining.addr).ready().await? == ServerState::Draining);
    let init = fake(once(
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 17\r\n\r\nPRE_INITIALIZING\n",
    ))
    .await?;
    ensure!(client(init.addr).ready().await? == ServerState::PreInitializing);

    let post = fake(once(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nOK\n")).await?;
    let response = client(post.addr).post("/healthcheck/fail").await?;
    ensure!(response.status == 200 && response.text() == "OK\n");
    let request = post.requests.lock().expect("lock")[0].clone();
    ensure!(
        request.starts_with("POST /healthcheck/fail HTTP/1.1\r\n"),
        "request: {request:?}"
    );
    ensure!(
        request.contains("Content-Length: 0\r\n"),
        "request: {request:?}"
    );
    Ok(())
}

#[tokio::test]
async fn one_kept_alive_connection_and_a_new_one_when_it_closes() -> Result<()> {
    let server = fake(Behavior::KeepAlive).await?;
    let admin = client(server.addr);
    let clone = admin.clone();
    for _ in 0..5 {
        ensure!(admin.ready().await? == ServerState::Live);
        ensure!(clone.ready().await? == ServerState::Live);
    }
    ensure!(server.requests.lock().expect("lock").len() == 10);
    ensure!(
        server.connections.load(Ordering::SeqCst) == 1,
        "{} connections for 10 requests",
        server.connections.load(Ordering::SeqCst)
    );

    // A server that closes after each answer: every request still succeeds, on a new connection.
    let closing = fake(once(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nLIVE\n")).await?;
    let admin = client(closing.addr);
    for _ in 0..3 {
        ensure!(admin.ready().await? == ServerState::Live);
        // Give the close time to arrive, and also test the race where it has not yet.
    }
    ensure!(closing.connections.load(Ordering::SeqCst) >= 3);
    Ok(())
}

#[tokio::test]
async fn quit_answered_by_a_close_is_success_and_not_an_error() -> Result<()> {
    let kinds = Arc::new(Mutex::new(Vec::<&'static str>::new()));
    let counted = |admin: holdfast::effects::envoy_admin::AdminClient| {
        let kinds = kinds.clone();
        admin.with_error_callback(move |kind| kinds.lock().expect("lock").push(kind))
    };
    // Reads the request, closes without a word (Envoy exiting before its 200 is written).
    let closes = fake(once(b"")).await?;
    let admin = counted(client(closes.addr));
    let response = admin.post("/quitquitquit").await?;
    ensure!(response.closed_early, "{response:?}");
    ensure!(kinds.lock().expect("lock").is_empty(), "{kinds:?}");
    ensure!(closes.requests.lock().expect("lock")[0].starts_with("POST /quitquitquit HTTP/1.1\r\n"));

    // The same close for another request (on a client that sent no quit) is a failure,
    // counted once by kind.
    let err = counted(client(closes.addr))
        .post("/healthcheck/fail")
        .await
        .expect_err("no answer");
    ensure!(err.kind() == "malformed", "{err}");
    ensure!(*kinds.lock().expect("lock") == ["malformed"], "{kinds:?}");

    // After the quit, Envoy gone (refused) is what was asked for: returned, not counted.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let gone = counted(client(port));
    let err = gone.ready().await.expect_err("refused");
    ensure!(err.is_refused());
    ensure!(
        kinds.lock().expect("lock").len() == 2,
        "refused before a quit counts: {kinds:?}"
    );
    let err = gone.post("/quitquitquit").await.expect_err("refused quit");
    ensure!(err.is_refused(), "{err}");
    let err = gone.ready().await.expect_err("refused");
    ensure!(err.is_refused());
    ensure!(
        *kinds.lock().expect("lock") == ["malformed", "connect"],
        "only the refusal before the quit counts: {kinds:?}"
    );
    Ok(())
}

#[tokio::test]
async fn http10_gets_426_but_we_speak_11() -> Result<()> {
    let server = fake(Behavior::RejectHttp10).await?;
    ensure!(client(server.addr).ready().await? == ServerState::Live);
    let always_426 = fake(once(
        b"HTTP/1.1 426 Upgrade Required\r\ncontent-length: 0\r\n\r\n",
    ))
    .await?;
    let err = client(always_426.addr)
        .post("/quitquitquit")
        .await
        .expect_err("426 is an error");
    ensure!(err.kind() == "http" && err.status() == Some(426), "{err}");
    let err = client(always_426.addr)
        .ready()
        .await
        .expect_err("426 on /ready is an error");
    ensure!(err.status() == Some(426), "{err}");
    Ok(())
}

#[tokio::test]
async fn garbage_and_truncated_are_malformed() -> Result<()> {
    let cases: Vec<(&str, Behavior)> = vec![
        ("garbage", once(b"\x00\x01\x02 this is not http\r\n\r\n")),
        ("no status code", once(b"HTTP/1.1 OK\r\n\r\n")),
        ("closed at once", once(b"")),
        ("closed in headers", once(b"HTTP/1.1 200 OK\r\ncontent-le")),
        (
            "truncated body",
            once(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nLIVE"),
        ),
        (
            "bad content-length",
            once(b"HTTP/1.1 200 OK\r\ncontent-length: lots\r\n\r\nLIVE"),
        ),
        (
            "truncated chunk",
            once(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n10\r\nLIVE"),
        ),
        (
            "bad chunk size",
            once(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nLIVE\r\n0\r\n\r\n"),
        ),
        (
            "header without colon",
            once(b"HTTP/1.1 200 OK\r\nnonsense\r\n\r\n"),
        ),
    ];
    for (name, behavior) in cases {
        let server = fake(behavior).await?;
        let err = client(server.addr).ready().await.expect_err(name);
        ensure!(
            err.kind() == "malformed",
            "{name}: expected malformed, got {err}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn huge_bodies_are_capped() -> Result<()> {
    let cap = 64 * 1024;
    let declared = fake(once(
        b"HTTP/1.1 200 OK\r\ncontent-length: 104857600\r\n\r\n",
    ))
    .await?;
    let err = client(declared.addr)
        .with_max_body(cap)
        .stats(None)
        .await
        .expect_err("declared huge");
    // Over the cap is its own kind (issue 25): what answers broke a bound, and readiness
    // fails the pod open on it.
    ensure!(
        err.kind() == "too-large" && err.is_too_large() && err.to_string().contains("cap"),
        "{err}"
    );

    let mut close_delimited = b"HTTP/1.1 200 OK\r\n\r\n".to_vec();
    close_delimited.extend(std::iter::repeat_n(b'a', cap * 2));
    let server = fake(once(&close_delimited)).await?;
    let err = client(server.addr)
        .with_max_body(cap)
        .stats(None)
        .await
        .expect_err("huge unframed");
    ensure!(err.kind() == "too-large", "{err}");

    let chunk = vec![b'x'; 32 * 1024];
    let mut chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..4 {
        chunked.extend(format!("{:x}\r\n", chunk.len()).as_bytes());
        chunked.extend(&chunk);
        chunked.extend(b"\r\n");
    }
    chunked.extend(b"0\r\n\r\n");
    let server = fake(once(&chunked)).await?;
    let err = client(server.addr)
        .with_max_body(cap)
        .stats(None)
        .await
        .expect_err("huge chunked");
    ensure!(err.kind() == "too-large", "{err}");

    // `/ready` and the POSTs are capped at a few KiB whatever the client's cap: their answers
    // are a word.
    let server = fake(once(&chunked)).await?;
    let err = client(server.addr).ready().await.expect_err("huge /ready");
    ensure!(err.is_too_large(), "{err}");
    Ok(())
}

#[tokio::test]
async fn slow_and_unreachable_time_out_or_fail_to_connect() -> Result<()> {
    let silent = fake(Behavior::Silent).await?;
    let started = Instant::now();
    let err = client(silent.addr)
        .ready()
        .await
        .expect_err("silent server");
    let took = started.elapsed();
    ensure!(err.kind() == "timeout", "{err}");
    ensure!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(3),
        "took {took:?}"
    );

    // Slow but within the timeout: a dribbled response still parses.
    let dribble = Behavior::Write(
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nLIVE\n"
            .chunks(7)
            .map(<[u8]>::to_vec)
            .collect(),
        Duration::from_millis(20),
    );
    let server = fake(dribble).await?;
    ensure!(client(server.addr).ready().await? == ServerState::Live);

    // Nothing listening: connect error.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let err = client(port).ready().await.expect_err("refused");
    ensure!(err.kind() == "connect" && err.is_refused(), "{err}");

    // A connector that hangs (e.g. a netns that never answers): connect timeout.
    let hanging = AdminClient::with_connector(
        port,
        Arc::new(|_, _| {
            std::thread::sleep(Duration::from_secs(2));
            Err(std::io::Error::other("too late"))
        }),
    )
    .with_timeouts(Duration::from_millis(100), Duration::from_millis(100));
    let started = Instant::now();
    let err = hanging.ready().await.expect_err("hanging connector");
    ensure!(
        matches!(
            err,
            Error::Timeout {
                what: "connect",
                ..
            }
        ),
        "{err}"
    );
    ensure!(
        started.elapsed() < Duration::from_millis(1500),
        "took {:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn chunked_stats_with_garbage_lines() -> Result<()> {
    let body = "server.state: 0\nlistener_manager.workers_started: 1\n\
                cluster.x.upstream_rq_time: P0(nan,0) P25(nan,0) P50(nan,0)\n\
                ???garbage\ncluster_manager.cds.update_success: 2\n";
    let mut pieces = vec![b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec()];
    for part in body.as_bytes().chunks(13) {
        pieces.push(format!("{:X};ext=1\r\n", part.len()).into_bytes());
        pieces.push(part.to_vec());
        pieces.push(b"\r\n".to_vec());
    }
    pieces.push(b"0\r\nx-trailer: 1\r\n\r\n".to_vec());
    let server = fake(Behavior::Write(pieces, Duration::from_millis(1))).await?;
    let stats = client(server.addr)
        .stats(Some("^(server|listener_manager)\\."))
        .await?;
    ensure!(stats.get("server.state") == Some(0), "{stats:?}");
    ensure!(
        stats.get("listener_manager.workers_started") == Some(1),
        "{stats:?}"
    );
    ensure!(
        stats.get("cluster_manager.cds.update_success") == Some(2),
        "{stats:?}"
    );
    ensure!(
        stats.skipped == 1 && stats.malformed_count == 1,
        "{stats:?}"
    );
    let request = server.requests.lock().expect("lock")[0].clone();
    ensure!(
        request.starts_with("GET /stats?filter=%5E%28server%7Clistener_manager%29%5C. HTTP/1.1"),
        "request: {request:?}"
    );
    Ok(())
}

// ---- real Envoy ------------------------------------------------------------------------------

fn envoy_binary() -> Option<PathBuf> {
    let path = std::env::var_os("HOLDFAST_ENVOY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bin/envoy"));
    if path.exists() {
        return Some(path);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "no Envoy at {} and CI is set: run `just setup`",
            path.display()
        );
    }
    eprintln!(
        "SKIP: no Envoy at {}: run `just setup` or set HOLDFAST_ENVOY",
        path.display()
    );
    None
}

/// Envoy with only an admin listener; killed on drop if still running.
struct Envoy {
    child: Child,
    dir: PathBuf,
}

impl Envoy {
    /// Starts Envoy (optionally via `ip netns exec <netns>`) with admin on `admin_port` (0 = any)
    /// and returns it with the admin address it bound.
    fn start(
        binary: &PathBuf,
        label: &str,
        netns: Option<&str>,
        admin_port: u16,
    ) -> Result<(Envoy, SocketAddr)> {
        let dir = std::env::temp_dir().join(format!("hf-admin-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("envoy.yaml");
        std::fs::write(
            &config,
            format!("admin:\n  address:\n    socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }}\n"),
        )?;
        let address_path = dir.join("admin-address");
        let mut command = match netns {
            Some(name) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", name]).arg(binary);
                c
            }
            None => Command::new(binary),
        };
        command
            .arg("-c")
            .arg(&config)
            .arg("--admin-address-path")
            .arg(&address_path)
            .args([
                "--disable-hot-restart",
                "-l",
                "warning",
                "--concurrency",
                "1",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command.spawn().context("starting envoy")?;
        let envoy = Envoy { child, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(text) = std::fs::read_to_string(&address_path) {
                if let Ok(addr) = text.trim().parse::<SocketAddr>() {
                    return Ok((envoy, addr));
                }
            }
            ensure!(
                Instant::now() < deadline,
                "envoy did not write its admin address"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn wait_exit(child: &mut Child, timeout: Duration) -> Result<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        ensure!(
            Instant::now() < deadline,
            "envoy still running after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[tokio::test]
async fn real_envoy_ready_stats_healthcheck_quit() -> Result<()> {
    let Some(binary) = envoy_binary() else {
        return Ok(());
    };
    let (mut envoy, addr) = Envoy::start(&binary, "local", None, 0)?;
    // A normal life (ready, stats, health check failed, quit, gone) counts no admin error:
    // neither the quit's own close nor the refusal that confirms Envoy exited.
    let counted = Arc::new(AtomicUsize::new(0));
    let errors = counted.clone();
    let admin = AdminClient::local(addr).with_error_callback(move |kind| {
        eprintln!("admin error counted: {kind}");
        errors.fetch_add(1, Ordering::SeqCst);
    });
    let mut state = admin.ready().await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !state.is_live() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        state = admin.ready().await?;
    }
    ensure!(state.is_live(), "state {state:?}");

    let stats = admin.stats(Some("^server\\.(state|live)$")).await?;
    ensure!(stats.get("server.state") == Some(0), "{stats:?}");
    ensure!(stats.get("server.live") == Some(1), "{stats:?}");
    ensure!(
        stats.values.len() == 2 && stats.malformed_count == 0,
        "{stats:?}"
    );
    let used = admin.stats_with(Some("^server\\."), true).await?;
    ensure!(
        used.get("server.live") == Some(1) && used.malformed_count == 0,
        "{used:?}"
    );
    let all = admin.stats(None).await?;
    ensure!(
        all.values.len() > 50 && all.malformed_count == 0,
        "{} values, malformed {:?}",
        all.values.len(),
        all.malformed
    );
    println!(
        "real envoy /stats: {} values, {} skipped",
        all.values.len(),
        all.skipped
    );

    admin.post("/healthcheck/fail").await?;
    ensure!(admin.ready().await? == ServerState::Draining);

    let asked = Instant::now();
    admin.post("/quitquitquit").await?;
    let status = wait_exit(&mut envoy.child, Duration::from_secs(5))?;
    println!(
        "envoy exited {status} {:?} after /quitquitquit",
        asked.elapsed()
    );
    ensure!(status.success(), "envoy exit {status}");
    let err = admin.ready().await.expect_err("envoy is gone");
    ensure!(err.is_refused(), "{err}");
    ensure!(
        counted.load(Ordering::SeqCst) == 0,
        "admin errors counted on a normal life"
    );
    Ok(())
}

#[tokio::test]
async fn real_envoy_inside_a_netns() -> Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        if std::env::var_os("CI").is_some() {
            panic!("real_envoy_inside_a_netns needs root and CI is set");
        }
        eprintln!("SKIP real_envoy_inside_a_netns: needs root");
        return Ok(());
    }
    let Some(binary) = envoy_binary() else {
        return Ok(());
    };
    struct Netns(String);
    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
        }
    }
    let name = format!(
        "hf-admin-ns{}",
        std::env::var("HOLDFAST_SIM_TAG").unwrap_or_default()
    );
    let name = name.as_str();
    let _ = Command::new("ip").args(["netns", "del", name]).output();
    ensure!(Command::new("ip")
        .args(["netns", "add", name])
        .status()?
        .success());
    let _guard = Netns(name.to_string());
    ensure!(Command::new("ip")
        .args(["-n", name, "link", "set", "lo", "up"])
        .status()?
        .success());

    // Port 15000 inside the netns: the host's 127.0.0.1:15000 is a different socket.
    let (mut envoy, addr) = Envoy::start(&binary, "netns", Some(name), 15000)?;
    ensure!(addr.port() == 15000);
    let netns =
        holdfast::effects::netns::PodNetns::open_path(&PathBuf::from("/run/netns").join(name))?;
    let admin = AdminClient::in_netns(netns, holdfast::effects::envoy_admin::DEFAULT_ADMIN_ADDR);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match admin.ready().await {
            Ok(ServerState::Live) => break,
            other => ensure!(Instant::now() < deadline, "not live: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The host's own loopback does not reach it.
    if let Ok(state) = AdminClient::local(addr).ready().await {
        println!("note: something else answers on the host's {addr}: {state:?}");
    }
    admin.post("/quitquitquit").await?;
    let status = wait_exit(&mut envoy.child, Duration::from_secs(5))?;
    ensure!(status.success(), "envoy exit {status}");
    // Through the netns connector too, a closed admin port is told apart as a refusal.
    let err = admin.ready().await.expect_err("envoy is gone");
    ensure!(err.is_refused(), "{err}");
    Ok(())
}

/// Envoy's admin on a Unix socket (mode 0600) in a `kuma-dp-*` work directory, as Kuma 2.14
/// bootstraps it (`admin.address.pipe.path`: kumahq/kuma pkg/xds/bootstrap template,
/// pkg/core/xds/sockets.go `AdminSocketName`): found through `/proc/<envoy pid>/root` and
/// reached with the same client as the TCP admin — ready, stats, quit, and a gone Envoy.
#[tokio::test]
async fn real_envoy_admin_on_a_unix_socket() -> Result<()> {
    use holdfast::effects::admin_socket::AdminSocket;
    let Some(binary) = envoy_binary() else {
        return Ok(());
    };
    let dir = std::env::temp_dir().join(format!("hf-admin-uds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let work = dir.join("kuma-dp-3141");
    std::fs::create_dir_all(&work)?;
    let socket = work.join("kuma-envoy-admin.sock");
    let config = dir.join("envoy.yaml");
    std::fs::write(
        &config,
        format!(
            "admin:\n  address:\n    pipe: {{ path: {}, mode: 384 }}\n",
            socket.display()
        ),
    )?;
    let child = Command::new(&binary)
        .arg("-c")
        .arg(&config)
        .args([
            "--disable-hot-restart",
            "-l",
            "warning",
            "--concurrency",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting envoy")?;
    let mut envoy = Envoy {
        child,
        dir: dir.clone(),
    };
    let pid = envoy.child.id() as i32;
    let uid = nix::unistd::Uid::effective().as_raw();
    let deadline = Instant::now() + Duration::from_secs(20);
    // Envoy binds the socket, then sets its mode: wait for both (the socket is the proxy's
    // alone, as Kuma's).
    let mode = || {
        std::fs::metadata(&socket)
            .map(|m| m.permissions().mode() & 0o777)
            .ok()
    };
    while mode() != Some(0o600) {
        ensure!(
            Instant::now() < deadline,
            "envoy did not make its admin socket with mode 0600: {:?}",
            mode()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let found = AdminSocket::find(
        std::path::Path::new("/proc"),
        pid,
        &[pid],
        uid,
        dir.to_str().context("utf-8 dir")?,
        "kuma-dp-",
        "kuma-envoy-admin.sock",
    )?;
    ensure!(found
        .shown()
        .ends_with("kuma-dp-3141/kuma-envoy-admin.sock"));
    let found = Arc::new(found);
    let admin = AdminClient::unix(found.shown(), {
        let found = found.clone();
        Arc::new(move |timeout| found.connect(timeout).map_err(|e| e.into_io()))
    });
    let mut state = admin.ready().await?;
    while !state.is_live() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        state = admin.ready().await?;
    }
    ensure!(state.is_live(), "state {state:?}");
    let stats = admin.stats(Some("^server\\.state$")).await?;
    ensure!(stats.get("server.state") == Some(0), "{stats:?}");
    admin.post("/quitquitquit").await?;
    let status = wait_exit(&mut envoy.child, Duration::from_secs(5))?;
    ensure!(status.success(), "envoy exit {status}");
    let err = admin.ready().await.expect_err("envoy is gone");
    ensure!(err.to_string().contains("unix:"), "{err}");
    Ok(())
}

/// A Unix admin socket the agent may not connect to (Kuma's is 0600 for uid 5678: the agent
/// without CAP_DAC_OVERRIDE gets EACCES) is `denied`, which readiness turns into "cannot look"
/// (the hold released, as without holdfast) instead of asking until the deadline.
#[tokio::test]
async fn a_denied_unix_socket_is_told_apart() -> Result<()> {
    let admin = AdminClient::unix(
        "/tmp/kuma-dp-1/kuma-envoy-admin.sock",
        Arc::new(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "permission denied",
            ))
        }),
    );
    let err = admin.ready().await.expect_err("denied");
    ensure!(err.is_denied() && !err.is_refused(), "{err}");
    ensure!(
        err.to_string()
            .contains("unix:/tmp/kuma-dp-1/kuma-envoy-admin.sock"),
        "{err}"
    );
    let gone = AdminClient::unix(
        "/tmp/kuma-dp-1/kuma-envoy-admin.sock",
        Arc::new(|_| Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))),
    );
    let err = gone.ready().await.expect_err("refused");
    ensure!(err.is_refused() && !err.is_denied(), "{err}");
    Ok(())
}
