//! The scale section's outside observer: when did a pod's proxy become fully ready, and how long
//! does a connection that is *not* held take through that Envoy at that moment (the floor)?
//!
//! Cheap on purpose, so it does not cause the latency it measures (one thread per pod, 110 pods
//! on 2 cores): until both capture ports listen it asks the kernel only (`sock_diag` in the pod's
//! netns: a netlink dump of the LISTEN sockets, microseconds); only in the short window between
//! "ports listen" and "fully ready" does it poll Envoy's admin `/stats`, over one kept-alive
//! connection. The poll period is the same in both phases (`--observe-poll-ms`); the section's
//! table shows how many admin requests that made, and a run with the period doubled shows
//! whether the observer perturbs the figures.
//!
//! Floor: once the app's held call is done (its report), the observer makes the same call
//! itself — connect through Istio's REDIRECT to Envoy, `ping`/`pong` with the remote service —
//! and times it. The hold has been released by then, so the call waits for nothing but the
//! machine: `release − floor` is what waiting for the agent added.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use holdfast::effects::procfs::sock_diag::SockDiag;

use crate::sim::istio_init::{ADMIN_PORT, INBOUND_PORT, OUTBOUND_PORT};
use crate::sim::pod_object::CState;
use crate::sim::report::{now_us, AppEvent};
use crate::sim::{Phase, SimNode};

/// What the observer saw of one pod (times in µs since the epoch).
#[derive(Debug, Clone, Copy, Default)]
pub struct Observation {
    /// Both capture ports first seen listening.
    pub ports_at: Option<u64>,
    /// First poll that saw the proxy fully ready (when its `/stats` request was sent).
    pub ready_at: Option<u64>,
    /// When that poll's answer arrived. Envoy's admin answers on its main thread, which is
    /// busiest right when Envoy goes LIVE (workers starting, the filter configuring on each):
    /// the state was read somewhere between `ready_at` and this, so measured from here the
    /// release is a lower bound.
    pub ready_answered_at: Option<u64>,
    /// The last observation before it that saw it not ready (ports closed, or `/stats` not
    /// ready): readiness came after this. On a starved machine the observer's own polls come
    /// late, and `ready_at` with them; measured from here the release is an upper bound.
    pub not_ready_at: Option<u64>,
    /// The un-held call right after the app's held one: connect → reply, ms.
    pub floor_ms: Option<f64>,
    /// Its `connect()` alone, ms.
    pub floor_connect_ms: Option<f64>,
    /// Admin requests the observer made.
    pub admin_requests: u64,
}

/// Watches one pod until it is fully ready (or `stop`/`give_up`), then measures the floor once
/// the app's held call is done and `hold_over` says the agent has finished the release (the hold
/// rules are gone: a SYN sent while they are being removed would be queued and counted in the
/// floor).
pub fn observe(
    node: &SimNode,
    pod: &str,
    proxy_delay: Duration,
    poll: Duration,
    give_up: Instant,
    stop: &AtomicBool,
    hold_over: &(dyn Fn(&str) -> bool + Sync),
) -> Observation {
    let mut seen = Observation::default();
    let ended = || stop.load(Ordering::SeqCst) || Instant::now() >= give_up;
    // Envoy cannot listen before pilot-agent launches it: start shortly before that.
    let started_us = loop {
        let t = node.pod(pod).and_then(|v| {
            v.proxy().and_then(|c| match &c.state {
                CState::Running { started_at } => u64::try_from(started_at.as_microsecond()).ok(),
                _ => None,
            })
        });
        if let Some(t) = t {
            break t;
        }
        if ended() {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let begin = (started_us + proxy_delay.as_micros() as u64).saturating_sub(50_000);
    let now = now_us();
    if begin > now {
        std::thread::sleep(Duration::from_micros(begin - now));
    }
    let remote = node.remote_addr_v4();
    let inside = node.in_pod_netns(pod, || {
        let Ok(diag) = SockDiag::open_current() else {
            eprintln!("scale: {pod}: cannot open sock_diag in the pod's netns");
            return seen;
        };
        loop {
            let at = now_us();
            if diag
                .tcp_listening_all(&[OUTBOUND_PORT, INBOUND_PORT])
                .unwrap_or(false)
            {
                seen.ports_at = Some(at);
                break;
            }
            seen.not_ready_at = Some(at);
            if ended() {
                return seen;
            }
            std::thread::sleep(poll);
        }
        let admin = SocketAddr::from(([127, 0, 0, 1], ADMIN_PORT));
        let query = format!(
            "/stats?filter={}",
            holdfast::effects::envoy_admin::percent_encode(READY_STATS)
        );
        let mut conn: Option<BufReader<TcpStream>> = None;
        loop {
            let at = now_us();
            seen.admin_requests += 1;
            match get_kept_alive(&mut conn, admin, &query) {
                Ok(body) if fully_ready(&body) => {
                    seen.ready_at = Some(at);
                    seen.ready_answered_at = Some(now_us());
                    break;
                }
                Ok(_) => seen.not_ready_at = Some(at),
                Err(_) => conn = None,
            }
            if ended() {
                return seen;
            }
            std::thread::sleep(poll);
        }
        seen
    });
    let Ok(inside) = inside else { return seen };
    seen = inside;
    if seen.ready_at.is_none() {
        return seen;
    }
    // The floor: after the app's held call and the end of the hold, the same call, un-held.
    loop {
        let done = node.report(pod).is_ok_and(|r| {
            r.events.iter().any(|e| {
                matches!(
                    e,
                    AppEvent::Call {
                        phase: Phase::Startup,
                        ok: true,
                        ..
                    }
                )
            })
        });
        if done && hold_over(pod) {
            break;
        }
        if ended() {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if let Ok(Some((connect, call))) = node.in_pod_netns(pod, || floor_call(remote)) {
        seen.floor_connect_ms = Some(connect);
        seen.floor_ms = Some(call);
    }
    seen
}

/// The app's call (see `sim::apps`): connect, `ping`, `pong`, close. The connect's and the
/// whole call's durations, ms.
fn floor_call(remote: SocketAddr) -> Option<(f64, f64)> {
    let t = Instant::now();
    let s = TcpStream::connect_timeout(&remote, Duration::from_secs(5)).ok()?;
    let connect_ms = t.elapsed().as_secs_f64() * 1e3;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.set_nodelay(true).ok()?;
    let mut conn = BufReader::new(s);
    conn.get_mut().write_all(b"ping\n").ok()?;
    let mut line = String::new();
    conn.read_line(&mut line).ok()?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let _ = conn.get_ref().shutdown(Shutdown::Both);
    (line == "pong\n").then_some((connect_ms, ms))
}

/// One `GET` on a kept-alive HTTP/1.1 connection (opened when there is none). Envoy's admin
/// answers with a `Content-Length` or chunked body.
fn get_kept_alive(
    conn: &mut Option<BufReader<TcpStream>>,
    addr: SocketAddr,
    path: &str,
) -> std::io::Result<String> {
    if conn.is_none() {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.set_nodelay(true)?;
        *conn = Some(BufReader::new(s));
    }
    let Some(c) = conn.as_mut() else {
        return Err(std::io::Error::other("no connection"));
    };
    write!(
        c.get_mut(),
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: holdfast-bench\r\n\r\n"
    )?;
    let mut status = String::new();
    c.read_line(&mut status)?;
    let ok = status.split_whitespace().nth(1) == Some("200");
    let (mut length, mut chunked, mut close) = (None, false, false);
    loop {
        let mut line = String::new();
        if c.read_line(&mut line)? == 0 {
            return Err(std::io::Error::other("closed in the headers"));
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        match k.as_str() {
            "content-length" => length = v.parse::<usize>().ok(),
            "transfer-encoding" => chunked = v.eq_ignore_ascii_case("chunked"),
            "connection" => close = v.eq_ignore_ascii_case("close"),
            _ => {}
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            c.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|e| std::io::Error::other(format!("chunk size {size:?}: {e}")))?;
            let mut chunk = vec![0u8; n + 2];
            c.read_exact(&mut chunk)?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(n) = length {
        body.resize(n, 0);
        c.read_exact(&mut body)?;
    } else {
        c.read_to_end(&mut body)?;
        close = true;
    }
    if close {
        *conn = None;
    }
    if !ok {
        return Err(std::io::Error::other(format!("status {}", status.trim())));
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The stats the observer reads in one request.
///
/// `server.state` alone is not enough: Envoy refreshes that gauge on its stats flush, so it reads
/// 0 (LIVE) while `/ready` still says PRE_INITIALIZING (seen here with Envoy 1.40). The
/// `listener_manager.workers_started` gauge is set when the workers start, which happens when
/// initialisation is done — pilot-agent's readiness check reads both for this reason.
pub const READY_STATS: &str = r"^(server\.state|server\.concurrency|listener_manager\.workers_started|wasmcustom\.holdfast\.(loaded|workers_ready))$";

/// LIVE, and the filter configured (on every worker where the filter says so).
pub fn fully_ready(stats: &str) -> bool {
    let mut state = None;
    let mut concurrency = None;
    let mut loaded = None;
    let mut workers = None;
    let mut started = None;
    for line in stats.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let Ok(v) = v.trim().parse::<u64>() else {
            continue;
        };
        match k.trim() {
            "server.state" => state = Some(v),
            "server.concurrency" => concurrency = Some(v),
            "listener_manager.workers_started" => started = Some(v),
            "wasmcustom.holdfast.loaded" => loaded = Some(v),
            "wasmcustom.holdfast.workers_ready" => workers = Some(v),
            _ => {}
        }
    }
    let filter = match (workers, concurrency) {
        (Some(w), Some(c)) => w >= c,
        _ => loaded == Some(1),
    };
    state == Some(0) && started == Some(1) && filter
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_needs_live_and_every_worker() {
        let base = "server.state: 0\nlistener_manager.workers_started: 1\nserver.concurrency: 2\n";
        assert!(!fully_ready(base), "no filter stat: not fully ready");
        assert!(fully_ready(&format!(
            "{base}wasmcustom.holdfast.loaded: 1\n"
        )));
        assert!(!fully_ready(&format!(
            "{base}wasmcustom.holdfast.loaded: 1\nwasmcustom.holdfast.workers_ready: 1\n"
        )));
        assert!(fully_ready(&format!(
            "{base}wasmcustom.holdfast.loaded: 1\nwasmcustom.holdfast.workers_ready: 2\n"
        )));
        assert!(!fully_ready(
            "server.state: 1\nlistener_manager.workers_started: 1\nserver.concurrency: 1\nwasmcustom.holdfast.loaded: 1\n"
        ));
        // state 0 before initialisation (the gauge is refreshed on stats flush): not ready.
        assert!(!fully_ready(
            "server.state: 0\nlistener_manager.workers_started: 0\nserver.concurrency: 1\nwasmcustom.holdfast.loaded: 1\n"
        ));
    }

    #[test]
    fn query_is_encoded() {
        assert_eq!(
            holdfast::effects::envoy_admin::percent_encode(r"^a\.b$"),
            "%5Ea%5C.b%24"
        );
    }
}
