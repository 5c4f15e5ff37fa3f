//! pilot-agent's status server (port 15020) as the native-sidecar path uses it, and its
//! `pilot-agent request` command (`sim-app request`), which Istio's preStop hook runs.
//!
//! From istio/istio 1.28 `pilot/cmd/pilot-agent/status/server.go`:
//! - `GET /healthz/ready` → 200 once Envoy has its first config and is LIVE with its workers
//!   started (`status/ready/probe.go`: `cds.update_success > 0` and `lds.update_success > 0`,
//!   then `server.state == 0` and `listener_manager.workers_started == 1`; once ready, the
//!   answer is cached for the life of the agent), 503 before. The injected startup and
//!   readiness probes reach it through Envoy's `0.0.0.0_15021` listener (bootstrap), which
//!   routes `/healthz/ready` to this port ([`super::bootstrap`]).
//! - `POST /drain` (from localhost only) → `DrainNow` (pkg/envoy/agent.go): Envoy's
//!   `drain_listeners?inboundonly&graceful&skip_exit` (pkg/envoy/admin.go `DrainListeners` with
//!   `skipExit`), and from then on a SIGTERM ends the agent at once ("Agent already drained,
//!   exiting immediately", `terminate`).
//!
//! Everything else answers 404: the sim needs no metrics merging, app probes or pprof.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::pilot_agent::admin_request;

/// What the status server shares with the agent's main loop.
#[derive(Debug, Default)]
pub struct AgentState {
    /// `/drain` was called: SIGTERM exits at once.
    pub drained: AtomicBool,
    /// Envoy was ready once (pilot-agent caches it: `atleastOnceReady`, `receivedFirstUpdate`).
    ready_once: AtomicBool,
}

fn log(msg: &str) {
    eprintln!("{} pilot-agent: {msg}", super::report::now_ms());
}

/// Starts the status server on `port` (all addresses of the admin address's family, as
/// pilot-agent listens on `:15020`) on a thread of its own; Envoy's admin is at `admin`.
pub fn serve(port: u16, admin: SocketAddr, state: Arc<AgentState>) -> io::Result<()> {
    let any: IpAddr = if admin.is_ipv6() {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    };
    let listener = TcpListener::bind((any, port))
        .map_err(|e| io::Error::new(e.kind(), format!("status port {port}: {e}")))?;
    log(&format!("status server on {}", listener.local_addr()?));
    std::thread::Builder::new()
        .name("status".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let state = state.clone();
                let _ = std::thread::Builder::new()
                    .name("status-conn".into())
                    .spawn(move || {
                        if let Err(e) = handle(conn, admin, &state) {
                            log(&format!("status request: {e}"));
                        }
                    });
            }
        })?;
    Ok(())
}

/// One request, then the connection is closed (`Connection: close`).
fn handle(conn: TcpStream, admin: SocketAddr, state: &AgentState) -> io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let peer = conn.peer_addr()?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Headers up to the blank line (bodies are not used by these endpoints).
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (code, body) = match (method, path) {
        (_, "/healthz/ready") => match ready(admin, state) {
            Ok(()) => (200, String::new()),
            Err(why) => (503, why),
        },
        (_, "/drain") if !peer.ip().is_loopback() => {
            (403, "Only requests from localhost are allowed".into())
        }
        ("POST", "/drain") => {
            log("handling /drain, starting drain");
            drain_now(admin, state);
            (200, "OK".into())
        }
        (_, "/drain") => (405, "Method Not Allowed".into()),
        _ => (404, "404 page not found".into()),
    };
    let reason = match code {
        200 => "OK",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let mut w = conn;
    write!(
        w,
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    w.flush()
}

/// `DrainNow`: drain inbound listeners without letting Envoy exit, and skip the drain on SIGTERM.
fn drain_now(admin: SocketAddr, state: &AgentState) {
    if let Err(e) = admin_request(
        admin,
        "POST",
        "/drain_listeners?inboundonly&graceful&skip_exit",
    ) {
        log(&format!("Error in invoking drain listeners endpoint: {e}"));
    }
    state.drained.store(true, Ordering::SeqCst);
}

/// pilot-agent's readiness probe, read from Envoy's admin stats.
fn ready(admin: SocketAddr, state: &AgentState) -> Result<(), String> {
    if state.ready_once.load(Ordering::SeqCst) {
        return Ok(());
    }
    let body = admin_request(
        admin,
        "GET",
        "/stats?usedonly&filter=^(server\\.state|listener_manager\\.workers_started|cluster_manager\\.cds\\.update_success|listener_manager\\.lds\\.update_success)$",
    )
    .map_err(|e| format!("cannot read Envoy's stats: {e}"))?;
    let verdict = readiness_from_stats(&body);
    if verdict.is_ok() {
        state.ready_once.store(true, Ordering::SeqCst);
    }
    verdict
}

/// The readiness verdict from `name: value` stat lines (see the module docs).
pub fn readiness_from_stats(body: &str) -> Result<(), String> {
    let stat = |name: &str| {
        body.lines()
            .filter_map(|l| l.split_once(": "))
            .find(|(n, _)| n.trim() == name)
            .and_then(|(_, v)| v.trim().parse::<u64>().ok())
    };
    let cds = stat("cluster_manager.cds.update_success").unwrap_or(0);
    let lds = stat("listener_manager.lds.update_success").unwrap_or(0);
    if cds == 0 || lds == 0 {
        return Err(format!(
            "config not received from XDS server (is Istiod running?): cds updates: {cds} lds updates: {lds}"
        ));
    }
    match (
        stat("server.state"),
        stat("listener_manager.workers_started"),
    ) {
        (Some(0), Some(1)) => Ok(()),
        (state, workers) => Err(format!(
            "server is not live, current state is: {state:?}, workers started: {workers:?}"
        )),
    }
}

/// `sim-app request` flags: pilot-agent's `request <method> <path>` command.
#[derive(Debug, Clone, clap::Args)]
pub struct RequestArgs {
    /// The local port (pilot-agent allows 15000, 15004, 15020, 15021).
    #[arg(long, default_value_t = 15000)]
    pub debug_port: u16,
    /// HTTP method.
    pub method: String,
    /// Path, without the leading `/` (as Istio's hook writes `drain`).
    pub path: String,
}

/// Runs `pilot-agent request`: one request to `localhost:<debug-port>/<path>`; prints the body.
/// A non-2xx answer is an error (exit 1), as the real command returns one.
pub fn request(args: &RequestArgs) -> io::Result<()> {
    if ![15000, 15004, 15020, 15021].contains(&args.debug_port) {
        return Err(io::Error::other(format!(
            "debug port {} is not in allowed list [15000 15004 15020 15021]",
            args.debug_port
        )));
    }
    let addr = SocketAddr::from(([127, 0, 0, 1], args.debug_port));
    let path = format!("/{}", args.path.trim_start_matches('/'));
    let body = admin_request(addr, &args.method, &path)?;
    print!("{body}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_needs_config_then_live_workers() {
        let not_yet = "cluster_manager.cds.update_success: 0\nlistener_manager.lds.update_success: 0\nserver.state: 2\nlistener_manager.workers_started: 0\n";
        assert!(readiness_from_stats(not_yet)
            .expect_err("no config")
            .contains("config not received"));
        let configured_not_live = "cluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: 1\nserver.state: 3\nlistener_manager.workers_started: 0\n";
        assert!(readiness_from_stats(configured_not_live).is_err());
        let ready = "cluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: 2\nserver.state: 0\nlistener_manager.workers_started: 1\n";
        assert_eq!(readiness_from_stats(ready), Ok(()));
        // A stat Envoy did not report is not a yes.
        assert!(readiness_from_stats(
            "cluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: 1\n"
        )
        .is_err());
    }
}
