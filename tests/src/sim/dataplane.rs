//! Stand-ins for the proxy containers' main processes of Kuma and Consul (`sim-app kuma-dp`,
//! `sim-app consul-dataplane`), like [`super::pilot_agent`] for Istio: each starts the real
//! Envoy as its mesh's uid and does on SIGTERM, SIGUSR2, its own HTTP endpoints and Envoy's exit
//! what the real program's source does.
//!
//! **kuma-dp** (kumahq/kuma v2.14.3, app/kuma-dp/cmd/run.go, app/kuma-dp/pkg/dataplane/envoy/
//! envoy.go, app/kuma-dp/pkg/dataplane/readiness/component.go):
//! - makes its workdir `kuma-dp-<random>` under `$TMPDIR` (`os.MkdirTemp`, then mode 0711); with
//!   the admin on a Unix socket Envoy's bootstrap has `admin.address.pipe` =
//!   `<workdir>/kuma-envoy-admin.sock`, mode 0600 (pkg/xds/bootstrap/template_v3.go); the
//!   bootstrap is written into the workdir and Envoy started with `--config-path` it,
//!   `--drain-time-s <drainTime>`, `--drain-strategy immediate`, `--disable-hot-restart`;
//! - serves `/ready` on 9902 (the readiness reporter): `TERMINATING` 503 once SIGTERM came,
//!   else Envoy's own `/ready` through the admin API;
//! - on SIGUSR2 (the native sidecar's preStop `killall -USR2 kuma-dp`): `POST
//!   /drain_listeners?inboundonly&graceful&skip_exit` (`DrainForever`), once;
//! - on SIGTERM: if it drained already, "exit immediately"; else readiness TERMINATING, `POST
//!   /healthcheck/fail` and, if that answered 200, wait `drainTime` (30 s by default,
//!   `--drain-time`; here `--drain-time-ms`), ended early only by a second SIGTERM/SIGINT (the
//!   `secondStopSignalReceived` context) — not by Envoy's exit; then stop Envoy (the Go command
//!   context kills it: SIGKILL) and exit 0;
//! - when Envoy exits by itself (outside that wait) kuma-dp exits: 0 if Envoy exited 0, else 1
//!   (the component manager returns Envoy's error).
//!
//! **consul-dataplane** (hashicorp/consul-dataplane v2.0.1, cmd/consul-dataplane/main.go,
//! pkg/consuldp/consul_dataplane.go, pkg/consuldp/lifecycle.go, pkg/envoy/proxy.go):
//! - starts Envoy in its own process group (a SIGTERM to the container's group does not reach
//!   it); admin on 127.0.0.1:19000;
//! - serves the lifecycle endpoints on 127.0.0.1:`-graceful-port` (20600 as consul-k8s injects
//!   it): `/graceful_shutdown` starts the graceful shutdown and answers 200 at once,
//!   `/graceful_startup` answers once Envoy is ready (startup grace 0: at once);
//! - on SIGTERM (and on `/graceful_shutdown`): with `-shutdown-drain-listeners` (consul-k8s
//!   injects it by default) `POST /drain_listeners?inboundonly&graceful&skip_exit` (2.0;
//!   `--no-skip-exit` for 1.9's URL without `&skip_exit`), then waits the FIXED
//!   `-shutdown-grace-period-seconds` (30 as injected; here `--shutdown-grace-period-ms`, so a
//!   test can shorten it) whatever happens meanwhile, then `POST /quitquitquit`;
//! - exits when Envoy exits, 0 if Envoy exited 0 (`Run` returns nil), else 1 (`log.Fatal`).
//!   So a `/quitquitquit` from anyone ends the container with 0 — what a Job's pod needs
//!   (hashicorp/consul-k8s#1791: nothing calls it when the Job's app is done, the Job never
//!   completes).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::apps::{TermSignal, Woken};
use super::mesh::{AdminAddr, KUMA_ADMIN_SOCKET};
use super::pilot_agent::{dechunk, exit_code, notify_on_exit, try_wait};

/// Longest wait between checks of Envoy's exit (the exit watcher's nudge normally ends it).
const POLL: Duration = Duration::from_secs(1);

fn log(who: &str, msg: &str) {
    eprintln!("{} {who}: {msg}", super::report::now_ms());
}

/// One HTTP/1.1 request to Envoy's admin API over TCP or a Unix socket; returns the status and
/// the body.
pub fn admin_call(admin: &AdminAddr, method: &str, path: &str) -> io::Result<(u16, String)> {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let resp = match admin {
        AdminAddr::Tcp(a) => {
            let mut s = TcpStream::connect_timeout(a, Duration::from_secs(1))?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(req.as_bytes())?;
            let mut r = String::new();
            s.read_to_string(&mut r)?;
            r
        }
        AdminAddr::Unix(p) => {
            let mut s = UnixStream::connect(p)?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(req.as_bytes())?;
            let mut r = String::new();
            s.read_to_string(&mut r)?;
            r
        }
    };
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| io::Error::other(format!("{method} {path}: no HTTP status")))?;
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((resp.as_str(), ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

/// [`admin_call`] that wants a 200.
fn admin_ok(admin: &AdminAddr, method: &str, path: &str) -> io::Result<String> {
    let (status, body) = admin_call(admin, method, path)?;
    if status != 200 {
        return Err(io::Error::other(format!(
            "{method} {path}: HTTP status {status}"
        )));
    }
    Ok(body)
}

/// Serves tiny HTTP endpoints on `listener` (one thread per connection): `handler(path)`
/// returns the status and body.
fn serve_http(
    listener: TcpListener,
    name: &str,
    handler: impl Fn(&str) -> (u16, String) + Send + Sync + 'static,
) -> io::Result<()> {
    let handler = Arc::new(handler);
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let handler = handler.clone();
                let _ = std::thread::Builder::new().spawn(move || {
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                    let mut buf = [0u8; 2048];
                    let n = conn.read(&mut buf).unwrap_or(0);
                    let text = String::from_utf8_lossy(&buf[..n]);
                    let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
                    let (status, body) = handler(&path);
                    let reason = if status == 200 { "OK" } else { "Error" };
                    let _ = write!(
                        conn,
                        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                });
            }
        })?;
    Ok(())
}

/// Envoy, started and watched: `term` is nudged when it exits.
struct Envoy {
    child: Arc<Mutex<Child>>,
}

impl Envoy {
    fn start(cmd: &mut Command, who: &str, term: &TermSignal) -> io::Result<Envoy> {
        let child = cmd.spawn()?;
        log(who, &format!("started Envoy pid {}", child.id()));
        notify_on_exit(child.id(), term);
        Ok(Envoy {
            child: Arc::new(Mutex::new(child)),
        })
    }

    fn exited(&self) -> io::Result<Option<i32>> {
        Ok(try_wait(&self.child)?.map(exit_code))
    }

    fn kill(&self) {
        let mut c = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Sets `flag` and nudges `term` on every `signal` (blocked in every thread of sim-app, see
/// `sim-app`'s main), from a thread of its own.
fn on_signal(signal: nix::sys::signal::Signal, flag: Arc<AtomicBool>, term: &TermSignal) {
    let term = term.clone();
    let _ = std::thread::Builder::new()
        .name(format!("{signal}"))
        .spawn(move || {
            let mut set = nix::sys::signal::SigSet::empty();
            set.add(signal);
            while set.wait().is_ok() {
                flag.store(true, Ordering::SeqCst);
                term.nudge();
            }
        });
}

/// `sim-app kuma-dp` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct KumaDpArgs {
    /// The Envoy binary.
    #[arg(long)]
    pub envoy: PathBuf,
    /// The bootstrap as the control plane returns it (JSON); kuma-dp writes it into its workdir.
    #[arg(long)]
    pub bootstrap: PathBuf,
    /// The sidecar's `/tmp` emptyDir on the host (kuma-dp's workdir is made in it).
    #[arg(long)]
    pub tmpdir: PathBuf,
    /// `/tmp` is the emptyDir already (a real container): no mount namespace of its own.
    #[arg(long)]
    pub tmp_is_mounted: bool,
    /// Envoy's admin on `<workdir>/kuma-envoy-admin.sock` (Kuma 2.14's default) instead of TCP.
    #[arg(long)]
    pub admin_socket: bool,
    /// The TCP admin address (without --admin-socket).
    #[arg(long, default_value = "127.0.0.1:9901")]
    pub admin: SocketAddr,
    /// kuma-dp's `--drain-time` in ms (30 s by default).
    #[arg(long, default_value_t = 30_000)]
    pub drain_time_ms: u64,
    /// The readiness reporter's port.
    #[arg(long, default_value_t = super::mesh::KUMA_READINESS_PORT)]
    pub readiness_port: u16,
    /// The proxy uid Envoy runs as.
    #[arg(long, default_value_t = super::mesh::KUMA_UID)]
    pub uid: u32,
    /// Start Envoy this many ms after the container starts (the bootstrap fetch and xDS).
    #[arg(long, default_value_t = 0)]
    pub start_delay_ms: u64,
    /// Envoy's --concurrency.
    #[arg(long, default_value_t = 2)]
    pub concurrency: u32,
    /// The builtin DNS (`KUMA_DNS_ENABLED`): kuma-dp's DNS proxy on this port, UDP only.
    #[arg(long, requires = "dns_delay_ms")]
    pub dns_port: Option<u16>,
    /// ... bound this many ms after the container starts (kuma-dp starts it with its other
    /// components, before Envoy is ready).
    #[arg(long, requires = "dns_port")]
    pub dns_delay_ms: Option<u64>,
    /// After `--`: the container's `args` as Kuma's injector writes them (`run
    /// --log-level=info --concurrency=2`), kept on the real cluster's pods so the pod object
    /// is the injector's (tests/src/cluster.rs); not read.
    #[arg(last = true)]
    pub injector_args: Vec<String>,
}

/// The container's view of its `/tmp`: kuma-dp and its Envoy get a mount namespace of their
/// own (the calling thread's, inherited by Envoy) in which `--tmpdir` (the sidecar's
/// `kuma-sidecar-tmp` emptyDir, a directory of the pod on the host) is bind-mounted on `/tmp`,
/// as the injector mounts it (injector.go, volume `kuma-sidecar-tmp`). So the admin socket is
/// `/tmp/kuma-dp-<random>/kuma-envoy-admin.sock` inside the container, and
/// `/proc/<envoy pid>/root/tmp/...` from the host, as on a real node. The rest of the
/// filesystem is the host's; the bootstrap and its LDS/CDS files are read before `/tmp` is
/// covered and written into the workdir.
fn enter_container_tmp(tmpdir: &Path) -> io::Result<()> {
    use nix::mount::{mount, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(io::Error::from)?;
    // Private, so the bind mount stays in this namespace.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(io::Error::from)?;
    mount(
        Some(tmpdir),
        "/tmp",
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(io::Error::from)
}

/// Makes kuma-dp's workdir (`os.MkdirTemp("", "kuma-dp-")` under the container's `/tmp`, then
/// mode 0711) and writes the bootstrap into it (the admin on the socket if asked, mode 0600),
/// with the LDS/CDS files it names; returns the workdir, the bootstrap's path and the admin
/// address, all as paths inside the container.
fn kuma_workdir(args: &KumaDpArgs) -> io::Result<(PathBuf, PathBuf, AdminAddr)> {
    use std::os::unix::fs::PermissionsExt;
    // Read what the control plane's answer stands for before /tmp is covered.
    let text = std::fs::read_to_string(&args.bootstrap)?;
    let mut b: serde_json::Value = serde_json::from_str(&text).map_err(io::Error::other)?;
    let mut xds_files = Vec::new();
    for key in ["lds_config", "cds_config"] {
        if let Some(p) = b["dynamic_resources"][key]["path_config_source"]["path"].as_str() {
            let p = PathBuf::from(p);
            let body = std::fs::read(&p)?;
            let name = p.file_name().map(PathBuf::from).unwrap_or_default();
            xds_files.push((key, name, body));
        }
    }
    if !args.tmp_is_mounted {
        enter_container_tmp(&args.tmpdir)?;
    }
    let workdir = PathBuf::from("/tmp").join(format!("kuma-dp-{}", &super::random_hex(5)[..9]));
    std::fs::create_dir_all(&workdir)?;
    std::fs::set_permissions(&workdir, std::fs::Permissions::from_mode(0o711))?;
    // The whole container runs as the kuma-dp user, so the workdir is that user's.
    nix::unistd::chown(
        &workdir,
        Some(nix::unistd::Uid::from_raw(args.uid)),
        Some(nix::unistd::Gid::from_raw(args.uid)),
    )
    .map_err(io::Error::from)?;
    for (key, name, body) in xds_files {
        let p = workdir.join(name);
        std::fs::write(&p, body)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644))?;
        b["dynamic_resources"][key]["path_config_source"]["path"] =
            serde_json::Value::String(p.to_string_lossy().into_owned());
    }
    let admin = if args.admin_socket {
        let sock = workdir.join(KUMA_ADMIN_SOCKET);
        b["admin"]["address"] = serde_json::json!({
            "pipe": { "path": sock.to_string_lossy(), "mode": 0o600 }
        });
        AdminAddr::Unix(sock)
    } else {
        AdminAddr::Tcp(args.admin)
    };
    let path = workdir.join("bootstrap.yaml");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&b).map_err(io::Error::other)?,
    )?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    Ok((workdir, path, admin))
}

/// Runs kuma-dp; returns the exit code.
pub fn run_kuma_dp(args: &KumaDpArgs, term: &TermSignal) -> io::Result<i32> {
    const WHO: &str = "kuma-dp";
    let usr2 = Arc::new(AtomicBool::new(false));
    on_signal(nix::sys::signal::Signal::SIGUSR2, usr2.clone(), term);
    let (workdir, bootstrap, admin) = kuma_workdir(args)?;
    if let (Some(port), Some(ms)) = (args.dns_port, args.dns_delay_ms) {
        start_kuma_dns_later(port, Duration::from_millis(ms), term);
    }
    let terminating = Arc::new(AtomicBool::new(false));
    {
        // run.go: `readinessAddr` is the admin's address (TCP admin), else the wildcard in
        // Kubernetes (the kubelet probes the pod IP).
        let ip = match &admin {
            AdminAddr::Tcp(a) => a.ip(),
            AdminAddr::Unix(_) => std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        };
        let listener = TcpListener::bind(SocketAddr::from((ip, args.readiness_port)))?;
        let admin = admin.clone();
        let terminating = terminating.clone();
        serve_http(listener, "readiness", move |path| {
            if path != "/ready" {
                return (404, String::new());
            }
            if terminating.load(Ordering::SeqCst) {
                return (503, "TERMINATING".into());
            }
            match admin_call(&admin, "GET", "/ready") {
                Ok((status, body)) => (status, body),
                Err(_) => (503, "envoy not ready".into()),
            }
        })?;
    }
    let cleanup = || {
        let _ = std::fs::remove_dir_all(&workdir);
    };
    if term.sleep(Duration::from_millis(args.start_delay_ms)) {
        log(WHO, "SIGTERM before Envoy started");
        cleanup();
        return Ok(0);
    }
    let mut cmd = Command::new(&args.envoy);
    cmd.arg("--config-path")
        .arg(&bootstrap)
        .args([
            "--drain-time-s",
            &(args.drain_time_ms / 1000).max(1).to_string(),
        ])
        .args(["--drain-strategy", "immediate", "--disable-hot-restart"])
        .args(["--log-level", "warning", "--concurrency"])
        .arg(args.concurrency.to_string())
        .uid(args.uid)
        .gid(args.uid);
    let envoy = Envoy::start(&mut cmd, WHO, term)?;
    let mut draining = false;
    loop {
        let seen = term.nudges();
        if let Some(code) = envoy.exited()? {
            log(WHO, &format!("Envoy exited by itself ({code}): stopping"));
            cleanup();
            return Ok(if code == 0 { 0 } else { 1 });
        }
        if usr2.swap(false, Ordering::SeqCst) && !draining {
            log(WHO, "SIGUSR2: draining Envoy connections (forever)");
            if let Err(e) = admin_ok(
                &admin,
                "POST",
                "/drain_listeners?inboundonly&graceful&skip_exit",
            ) {
                log(WHO, &format!("could not drain connections: {e}"));
            }
            draining = true;
            continue;
        }
        if term.sleep_or_event(seen, POLL) == Woken::Signal {
            break;
        }
    }
    // The native preStop hook's SIGUSR2 is sent before the kubelet's SIGTERM (the hook has
    // returned by then), but two threads take them here: give the SIGUSR2 thread a moment so
    // kuma-dp handles them in the order they were sent, as Go's runtime delivers them.
    std::thread::sleep(Duration::from_millis(5));
    if usr2.swap(false, Ordering::SeqCst) && !draining {
        log(WHO, "SIGUSR2: draining Envoy connections (forever)");
        if let Err(e) = admin_ok(
            &admin,
            "POST",
            "/drain_listeners?inboundonly&graceful&skip_exit",
        ) {
            log(WHO, &format!("could not drain connections: {e}"));
        }
        draining = true;
    }
    if draining {
        log(WHO, "SIGTERM: already drained, exit immediately");
    } else {
        terminating.store(true, Ordering::SeqCst);
        log(WHO, "SIGTERM: /healthcheck/fail");
        // A second SIGTERM/SIGINT ends the wait (the first was taken by TermSignal's thread).
        let second = Arc::new(AtomicBool::new(false));
        on_signal(nix::sys::signal::Signal::SIGTERM, second.clone(), term);
        on_signal(nix::sys::signal::Signal::SIGINT, second.clone(), term);
        match admin_ok(&admin, "POST", "/healthcheck/fail") {
            Err(e) => log(WHO, &format!("could not drain connections: {e}")),
            Ok(_) => {
                log(
                    WHO,
                    &format!(
                        "waiting {} ms for connections to be drained",
                        args.drain_time_ms
                    ),
                );
                let end = Instant::now() + Duration::from_millis(args.drain_time_ms);
                loop {
                    let seen = term.nudges();
                    if second.load(Ordering::SeqCst) {
                        log(WHO, "second signal: stop waiting");
                        break;
                    }
                    // Envoy failing (not exiting 0) ends kuma-dp with an error at once.
                    if let Some(code) = envoy.exited()? {
                        if code != 0 {
                            log(WHO, &format!("Envoy exited with {code} during the drain"));
                            cleanup();
                            return Ok(1);
                        }
                    }
                    let now = Instant::now();
                    if now >= end {
                        break;
                    }
                    term.wait_event(seen, (end - now).min(POLL));
                }
            }
        }
    }
    log(WHO, "stopping all Kuma DP components");
    envoy.kill();
    cleanup();
    Ok(0)
}

/// `sim-app consul-dataplane` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ConsulDataplaneArgs {
    /// The Envoy binary.
    #[arg(long)]
    pub envoy: PathBuf,
    /// Envoy's bootstrap file.
    #[arg(long)]
    pub bootstrap: PathBuf,
    /// `-envoy-admin-bind-address`/`-envoy-admin-bind-port`.
    #[arg(long, default_value = "127.0.0.1:19000")]
    pub admin: SocketAddr,
    /// `-graceful-port` (the lifecycle server on 127.0.0.1).
    #[arg(long, default_value_t = super::mesh::CONSUL_GRACEFUL_PORT)]
    pub graceful_port: u16,
    /// `-shutdown-grace-period-seconds`, in ms here (30 s as consul-k8s injects it).
    #[arg(long, default_value_t = 30_000)]
    pub shutdown_grace_period_ms: u64,
    /// `-shutdown-drain-listeners` off (consul-k8s injects it on by default).
    #[arg(long)]
    pub no_drain_listeners: bool,
    /// consul-dataplane 1.9's drain URL (without `&skip_exit`, added in 2.0).
    #[arg(long)]
    pub no_skip_exit: bool,
    /// The proxy uid Envoy runs as.
    #[arg(long, default_value_t = super::mesh::CONSUL_UID)]
    pub uid: u32,
    /// Start Envoy this many ms after the container starts (the xDS wait).
    #[arg(long, default_value_t = 0)]
    pub start_delay_ms: u64,
    /// Envoy's --concurrency.
    #[arg(long, default_value_t = 2)]
    pub concurrency: u32,
    /// After `--`: the container's `args` as consul-k8s writes them (`-envoy-admin-bind-address=`,
    /// `-shutdown-grace-period-seconds=`, ...), kept on the real cluster's pods so the agent
    /// reads the injector's flags from the pod object (tests/src/cluster.rs); not read here (the
    /// flags above say the same).
    #[arg(last = true)]
    pub injector_args: Vec<String>,
}

/// consul-dataplane's `gracefulShutdown`: drain (if on), the fixed wait, `/quitquitquit`. Runs
/// at most once (`Drain`/`Quit` do nothing in a later state).
fn consul_graceful_shutdown(args: &ConsulDataplaneArgs, started: &AtomicBool) {
    const WHO: &str = "consul-dataplane";
    if started.swap(true, Ordering::SeqCst) {
        // lifecycle.go: a second call waits again and quits again; Envoy is draining or gone
        // by then, so Drain and Quit are no-ops. Nothing to add.
        return;
    }
    let admin = AdminAddr::Tcp(args.admin);
    log(
        WHO,
        &format!(
            "initiating shutdown: waiting {} ms before terminating dataplane proxy",
            args.shutdown_grace_period_ms
        ),
    );
    if !args.no_drain_listeners {
        let url = if args.no_skip_exit {
            "/drain_listeners?inboundonly&graceful"
        } else {
            "/drain_listeners?inboundonly&graceful&skip_exit"
        };
        if let Err(e) = admin_ok(&admin, "POST", url) {
            log(WHO, &format!("error while draining Envoy listeners: {e}"));
        }
    }
    std::thread::sleep(Duration::from_millis(args.shutdown_grace_period_ms));
    log(WHO, "shutdown grace period timeout reached");
    if let Err(e) = admin_ok(&admin, "POST", "/quitquitquit") {
        log(WHO, &format!("error while shutting down Envoy: {e}"));
    }
}

/// Runs consul-dataplane; returns the exit code.
pub fn run_consul_dataplane(args: &ConsulDataplaneArgs, term: &TermSignal) -> io::Result<i32> {
    const WHO: &str = "consul-dataplane";
    let shutdown_started = Arc::new(AtomicBool::new(false));
    {
        let listener = TcpListener::bind(SocketAddr::from((
            std::net::Ipv4Addr::LOCALHOST,
            args.graceful_port,
        )))?;
        let a = args.clone();
        let started = shutdown_started.clone();
        let admin = AdminAddr::Tcp(args.admin);
        serve_http(listener, "lifecycle", move |path| match path {
            "/graceful_shutdown" => {
                let a = a.clone();
                let started = started.clone();
                let _ = std::thread::Builder::new()
                    .spawn(move || consul_graceful_shutdown(&a, &started));
                (200, String::new())
            }
            "/graceful_startup" => {
                // startupGracePeriodSeconds 0 (consul-k8s's default): answer at once.
                let _ = admin_call(&admin, "GET", "/ready");
                (200, String::new())
            }
            _ => (404, String::new()),
        })?;
    }
    if term.sleep(Duration::from_millis(args.start_delay_ms)) {
        // Run has not started the proxy: the signal goroutine's GracefulShutdown waits out the
        // grace period, then the process ends. Keep it simple: exit.
        log(WHO, "SIGTERM before Envoy started");
        return Ok(0);
    }
    let mut cmd = Command::new(&args.envoy);
    cmd.arg("--config-path")
        .arg(&args.bootstrap)
        .args([
            "--disable-hot-restart",
            "--log-level",
            "warning",
            "--concurrency",
        ])
        .arg(args.concurrency.to_string())
        .uid(args.uid)
        .gid(args.uid)
        // pkg/envoy/proxy.go: "Start Envoy in its own process group".
        .process_group(0);
    let envoy = Envoy::start(&mut cmd, WHO, term)?;
    let mut signalled = false;
    loop {
        let seen = term.nudges();
        if let Some(code) = envoy.exited()? {
            log(WHO, &format!("envoy process exited ({code})"));
            return Ok(if code == 0 { 0 } else { 1 });
        }
        if !signalled && term.received_at_ms().is_some() {
            signalled = true;
            let a = args.clone();
            let started = shutdown_started.clone();
            let _ = std::thread::Builder::new()
                .name("graceful-shutdown".into())
                .spawn(move || consul_graceful_shutdown(&a, &started));
        }
        if signalled {
            term.wait_event(seen, POLL);
        } else {
            term.sleep_or_event(seen, POLL);
        }
    }
}

/// The native Kuma sidecar's preStop hook `killall -USR2 kuma-dp`, as the kubelet execs it in
/// the container: SIGUSR2 to every process of the container whose command is kuma-dp (here:
/// `sim-app kuma-dp`). Returns how many it signalled.
///
/// Which processes are the container's: in its own PID namespace (a real container, as the real
/// kubelet runs the hook), every process `/proc` shows, as `killall` sees them; on the simulated
/// node's netns backend (no PID namespace), the processes of the caller's cgroup.
pub fn killall_usr2_kuma_dp() -> io::Result<usize> {
    let (procs, scope) = if own_pid_namespace() {
        let pids: Vec<String> = std::fs::read_dir("/proc")?
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(String::from))
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
            .collect();
        (pids.join("\n"), "the container's PID namespace".to_string())
    } else {
        let cgroup = std::fs::read_to_string("/proc/self/cgroup")?;
        let rel = cgroup
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .ok_or_else(|| io::Error::other("no cgroup v2 line in /proc/self/cgroup"))?
            .to_string();
        let root = super::cgroup::cgroup2_root().map_err(|e| io::Error::other(e.to_string()))?;
        let procs = std::fs::read_to_string(
            Path::new(&root)
                .join(rel.trim_start_matches('/'))
                .join("cgroup.procs"),
        )?;
        (procs, format!("cgroup {rel}"))
    };
    let mut n = 0;
    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let mut words = cmdline.split(|b| *b == 0);
        let _exe = words.next();
        if words.next() == Some(b"kuma-dp".as_slice()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGUSR2,
            );
            n += 1;
        }
    }
    eprintln!(
        "{} killall -USR2 kuma-dp: {scope}, {n} signalled",
        super::report::now_ms()
    );
    if n == 0 {
        // killall exits 1 when no process matched.
        return Err(io::Error::other(format!(
            "kuma-dp: no process found in {scope} ({})",
            procs.split_whitespace().collect::<Vec<_>>().join(" ")
        )));
    }
    Ok(n)
}

/// Whether this process runs in the sidecar container's own PID namespace, as the real kubelet
/// execs the hook: there pid 1 is the container's entrypoint, kuma-dp itself. (On the netns
/// backend there is no PID namespace: pid 1 is the machine's init.) `NSpid` cannot tell: a
/// container's own procfs shows one level.
fn own_pid_namespace() -> bool {
    let cmdline = std::fs::read("/proc/1/cmdline").unwrap_or_default();
    cmdline.split(|b| *b == 0).nth(1) == Some(b"kuma-dp".as_slice())
}

/// kuma-dp's embedded DNS proxy (app/kuma-dp/pkg/dataplane/dnsproxy/component.go, v2.14.3):
/// UDP only, on 127.0.0.1 and, where the pod has it, ::1; started `delay` after kuma-dp on a
/// thread of its own. Its answers come from the sim's name table (the real one answers from
/// the control plane's DNS table and forwards the rest upstream as uid 5678, which kuma-init
/// RETURNs).
fn start_kuma_dns_later(port: u16, delay: Duration, term: &TermSignal) {
    let term = term.clone();
    let spawned = std::thread::Builder::new()
        .name("kuma-dns-start".into())
        .spawn(move || {
            if term.sleep(delay) {
                return;
            }
            let table = Arc::new(super::dns::NameTable::sim_cluster());
            let v4 = SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
            match super::dns::serve_udp_only(v4, table.clone()) {
                Ok(()) => log("kuma-dp", &format!("DNS proxy on udp {v4}")),
                Err(e) => log("kuma-dp", &format!("DNS proxy cannot bind udp {v4}: {e}")),
            }
            let v6 = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
            if let Err(e) = super::dns::serve_udp_only(v6, table) {
                log("kuma-dp", &format!("DNS proxy not on udp {v6}: {e}"));
            }
        });
    if let Err(e) = spawned {
        log(
            "kuma-dp",
            &format!("cannot start the DNS proxy thread: {e}"),
        );
    }
}
