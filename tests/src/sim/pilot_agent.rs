//! The pilot-agent stand-in (`sim-app pilot-agent`), the istio-proxy container's main process.
//!
//! It applies pilot-agent's documented behaviour: start Envoy (as the proxy uid, after a delay
//! standing in for the wait for xDS config); on SIGTERM `POST /drain_listeners?inboundonly&graceful`,
//! wait `terminationDrainDuration` (or, with `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`, wait
//! `MINIMUM_DRAIN_DURATION` then poll the active downstream connections every second until 0),
//! then SIGKILL Envoy. If Envoy exits by itself (e.g. `/quitquitquit`), exit with its status.
//!
//! With `--status-port` it serves pilot-agent's status port, whose `POST /drain` (Istio's
//! native-sidecar preStop) drains Envoy's inbound listeners at once and makes a later SIGTERM
//! end the agent immediately ([`super::pilot_status`]). With `--xds-socket` Envoy starts at
//! once and gets its listeners and clusters late from the xDS stand-in ([`super::xds`]).
//!
//! With `--dns-delay-ms` (DNS capture on) it also starts its DNS proxy, after that delay: a
//! child `sim-app dns-proxy` running as the proxy uid (the whole istio-proxy container runs as
//! 1337; Istio's conntrack-zone rules match the DNS answers by that owner, so a DNS proxy of
//! another uid would have its answers miss the app's NATed flow). It listens on
//! `127.0.0.1:15053` and `[::1]:15053`, UDP and TCP, as pilot-agent does for `localhost:15053`
//! with IPv4 and IPv6 nameservers (pkg/dns/client/dns.go, `NewLocalDNSServer`).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::sync::atomic::Ordering;

use super::apps::{TermSignal, Woken};
use super::istio_init::{ADMIN_PORT, DNS_PORT, PROXY_UID};
use super::pilot_status::AgentState;

/// `sim-app pilot-agent` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct PilotAgentArgs {
    /// The Envoy binary.
    #[arg(long)]
    pub envoy: PathBuf,
    /// Envoy bootstrap file.
    #[arg(long)]
    pub bootstrap: PathBuf,
    /// Start Envoy this many ms after the container starts (stands in for the xDS wait).
    #[arg(long, default_value_t = 0)]
    pub start_delay_ms: u64,
    /// terminationDrainDuration in ms.
    #[arg(long, default_value_t = 5000)]
    pub drain_ms: u64,
    /// Envoy's `--drain-time-s` (pilot-agent passes its `drainDuration`, 45 s by default).
    #[arg(long, default_value_t = 45)]
    pub envoy_drain_time_s: u64,
    /// EXIT_ON_ZERO_ACTIVE_CONNECTIONS.
    #[arg(long)]
    pub exit_on_zero_active: bool,
    /// MINIMUM_DRAIN_DURATION in ms (with --exit-on-zero-active).
    #[arg(long, default_value_t = 5000)]
    pub minimum_drain_ms: u64,
    /// Envoy's --concurrency (Istio's default is 2).
    #[arg(long, default_value_t = 2)]
    pub concurrency: u32,
    /// Envoy's admin address (Istio: `[::1]:15000` when the pod's first IP is IPv6).
    #[arg(long, default_value_t = SocketAddr::from(([127, 0, 0, 1], ADMIN_PORT)))]
    pub admin: SocketAddr,
    /// DNS capture: start the DNS proxy on 15053 this many ms after the container starts.
    #[arg(long)]
    pub dns_delay_ms: Option<u64>,
    /// Serve pilot-agent's status port (`/healthz/ready`, `/drain`: [`super::pilot_status`]).
    #[arg(long)]
    pub status_port: Option<u16>,
    /// Serve Envoy's LDS/CDS over REST on this unix socket ([`super::xds`]), from the files
    /// next to --bootstrap.
    #[arg(long, requires = "xds_delay_ms")]
    pub xds_socket: Option<PathBuf>,
    /// ... answering the first request this many ms after the agent started (istiod's push).
    #[arg(long, requires = "xds_socket")]
    pub xds_delay_ms: Option<u64>,
}

/// Starts the DNS proxy child (as the proxy uid) after `delay`, on a background thread; it dies
/// with the container (the kubelet stand-in kills the container's cgroup).
fn start_dns_proxy_later(delay: Duration, term: &TermSignal) {
    let term = term.clone();
    let spawned = std::thread::Builder::new()
        .name("dns-proxy-start".into())
        .spawn(move || {
            if term.sleep(delay) {
                return;
            }
            let exe = match std::env::current_exe() {
                Ok(e) => e,
                Err(e) => return log(&format!("cannot find sim-app for the DNS proxy: {e}")),
            };
            match Command::new(exe)
                .args(["dns-proxy", "--port", &DNS_PORT.to_string()])
                .uid(PROXY_UID)
                .gid(PROXY_UID)
                .spawn()
            {
                Ok(child) => log(&format!("started the DNS proxy pid {}", child.id())),
                Err(e) => log(&format!("cannot start the DNS proxy: {e}")),
            }
        });
    if let Err(e) = spawned {
        log(&format!("cannot start the DNS proxy thread: {e}"));
    }
}

/// Longest wait between checks of Envoy's exit (the exit watcher's nudge normally ends it).
const ENVOY_EXIT_POLL: Duration = Duration::from_secs(1);

fn log(msg: &str) {
    eprintln!("{} pilot-agent: {msg}", super::report::now_ms());
}

/// Runs the agent; returns the exit code.
pub fn run(args: &PilotAgentArgs, term: &TermSignal) -> io::Result<i32> {
    let started = Instant::now();
    if let Some(ms) = args.dns_delay_ms {
        start_dns_proxy_later(Duration::from_millis(ms), term);
    }
    let state = Arc::new(AgentState::default());
    if let Some(port) = args.status_port {
        super::pilot_status::serve(port, args.admin, state.clone())?;
    }
    if let (Some(socket), Some(ms)) = (&args.xds_socket, args.xds_delay_ms) {
        let dir = args
            .bootstrap
            .parent()
            .map(PathBuf::from)
            .unwrap_or_default();
        super::xds::serve(socket, dir, started + Duration::from_millis(ms))?;
    }
    if term.sleep(Duration::from_millis(args.start_delay_ms)) {
        log("SIGTERM before Envoy started");
        return Ok(0);
    }
    let child = Command::new(&args.envoy)
        .args(["-c".as_ref(), args.bootstrap.as_os_str()])
        .args([
            "--disable-hot-restart",
            "--drain-time-s",
            args.envoy_drain_time_s.to_string().as_str(),
            "--drain-strategy",
            "immediate",
            "--parent-shutdown-time-s",
            "60",
            "--local-address-ip-version",
            if args.admin.is_ipv6() { "v6" } else { "v4" },
            "--log-level",
            "warning",
            "--concurrency",
        ])
        .arg(args.concurrency.to_string())
        .uid(PROXY_UID)
        .gid(PROXY_UID)
        .spawn()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot start Envoy {}: {e}", args.envoy.display()),
            )
        })?;
    log(&format!("started Envoy pid {}", child.id()));
    notify_on_exit(child.id(), term);
    let envoy = Arc::new(Mutex::new(child));

    // Wait for SIGTERM or Envoy's own exit (a nudge from the exit watcher), like pilot-agent's
    // `cmd.Wait()`: no polling.
    loop {
        let seen = term.nudges();
        if let Some(status) = try_wait(&envoy)? {
            log(&format!("Envoy exited by itself: {status}"));
            return Ok(exit_code(status));
        }
        if term.sleep_or_event(seen, ENVOY_EXIT_POLL) == Woken::Signal {
            break;
        }
    }
    if state.drained.load(Ordering::SeqCst) {
        // The native sidecar's shutdown: Istio's preStop called /drain when the pod's
        // termination began, and the kubelet sends SIGTERM once the app containers are gone.
        // pkg/envoy/agent.go `terminate`: abort, which kills Envoy (`cmd.Process.Kill()`).
        log("Agent already drained, exiting immediately");
        let mut child = match envoy.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        let _ = child.kill();
        let _ = child.wait();
        return Ok(0);
    }
    log("SIGTERM: draining inbound listeners");
    let admin = args.admin;
    if let Err(e) = admin_request(admin, "POST", "/drain_listeners?inboundonly&graceful") {
        log(&format!("drain_listeners failed: {e}"));
    }

    let drain_end = if args.exit_on_zero_active {
        None
    } else {
        Some(Instant::now() + Duration::from_millis(args.drain_ms))
    };
    let min_end = Instant::now() + Duration::from_millis(args.minimum_drain_ms);
    let mut next_poll = min_end;
    loop {
        let seen = term.nudges();
        if let Some(status) = try_wait(&envoy)? {
            log(&format!("Envoy exited during drain: {status}"));
            return Ok(exit_code(status));
        }
        let now = Instant::now();
        match drain_end {
            Some(end) if now >= end => break,
            Some(_) => {}
            None if now >= next_poll => {
                next_poll = now + Duration::from_secs(1);
                match active_connections(admin) {
                    Ok(0) => {
                        log("no active connections");
                        break;
                    }
                    Ok(n) => log(&format!("{n} active connections")),
                    Err(e) => log(&format!("stats poll failed: {e}")),
                }
            }
            None => {}
        }
        let wait = drain_end.unwrap_or(next_poll);
        term.wait_event(
            seen,
            wait.saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), ENVOY_EXIT_POLL),
        );
    }
    log("drain over: killing Envoy");
    let mut child = match envoy.lock() {
        Ok(c) => c,
        Err(p) => p.into_inner(),
    };
    // Child::kill does nothing harmful if Envoy has already been reaped.
    let _ = child.kill();
    let _ = child.wait();
    Ok(0)
}

/// Nudges `term` when Envoy exits: a thread blocked in `waitid(WEXITED | WNOWAIT)`, which
/// leaves the exit status for `try_wait` to reap.
pub(crate) fn notify_on_exit(pid: u32, term: &TermSignal) {
    let term = term.clone();
    let spawned = std::thread::Builder::new()
        .name("envoy-exit".into())
        .spawn(move || {
            use nix::sys::wait::{waitid, Id, WaitPidFlag};
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            while let Err(nix::errno::Errno::EINTR) =
                waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT)
            {}
            term.nudge();
        });
    if let Err(e) = spawned {
        log(&format!("cannot watch Envoy's exit ({e}): polling"));
    }
}

pub(crate) fn try_wait(envoy: &Mutex<Child>) -> io::Result<Option<ExitStatus>> {
    match envoy.lock() {
        Ok(mut c) => c.try_wait(),
        Err(p) => p.into_inner().try_wait(),
    }
}

pub(crate) fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// One HTTP/1.1 request to Envoy's admin API (it answers HTTP/1.0 with 426); returns the body.
pub fn admin_request(admin: SocketAddr, method: &str, path: &str) -> io::Result<String> {
    let mut s = TcpStream::connect_timeout(&admin, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let status = resp.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(io::Error::other(format!(
            "{method} {path}: HTTP status {status:?}"
        )));
    }
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((resp.as_str(), ""));
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Ok(dechunk(body));
    }
    Ok(body.to_string())
}

/// Decodes an HTTP/1.1 chunked body (Envoy's admin API streams some handlers that way).
pub(crate) fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        let (Some(chunk), Some(tail)) = (rest.get(..n), rest.get(n..)) else {
            break;
        };
        if n == 0 {
            break;
        }
        out.push_str(chunk);
        body = tail.trim_start_matches("\r\n");
    }
    out
}

/// Sum of `downstream_cx_active` over listeners, as pilot-agent computes it.
fn active_connections(admin: SocketAddr) -> io::Result<u64> {
    let body = admin_request(admin, "GET", "/stats?usedonly&filter=downstream_cx_active$")?;
    Ok(sum_stat_values(&body))
}

/// Sums the values of `name: value` lines, leaving out the admin listener (our own poll is one
/// of its connections). Lines that do not parse are ignored.
pub fn sum_stat_values(body: &str) -> u64 {
    body.lines()
        .filter(|l| !l.contains("admin"))
        .filter_map(|l| l.rsplit_once(": "))
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dechunks_admin_bodies() {
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
    }

    #[test]
    fn sums_active_connections() {
        let body = "http.admin.downstream_cx_active: 1\nlistener.0.0.0.0_15001.downstream_cx_active: 3\n1a\nnoise\n";
        assert_eq!(sum_stat_values(body), 3);
    }
}
