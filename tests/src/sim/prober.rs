//! The kubelet's prober, stand-in: the injected startup and readiness probes of `istio-proxy`
//! (`GET /healthz/ready` on 15021), one thread per probed container.
//!
//! As kubernetes/kubernetes `pkg/kubelet/prober/worker.go` runs them: each probe type has a
//! worker created when the pod is admitted, with a ticker of `periodSeconds` from then (no
//! jitter: the kubelet has been up for long); at each tick it probes only if the container
//! runs, a startup probe only until it succeeded once per container run, a readiness probe only
//! once the container has started. A new container id (a restart) resets both results. When the
//! startup probe succeeds, the prober manager triggers a readiness probe at once
//! (`prober_manager.go` `UpdatePodStatus`: "Trigger an immediate run of the readinessProbe")
//! rather than waiting up to 15 s. Readiness turns false after `failureThreshold` (4) failures
//! in a row and true on one success. The HTTP probe (`pkg/probe/http`) is a GET with a 3 s
//! timeout (`timeoutSeconds`), `User-Agent: kube-probe/<version>`; 2xx and 3xx pass.
//!
//! The probe connects to the pod IP from the netns the caller gives (the pod's own on the
//! netns backend, where the node cannot route to pods; the host's on the containerd backend, as
//! the kubelet does). Startup's `failureThreshold` (600: ten minutes) kills and restarts the
//! container in the kubelet; no test runs that long, and the stand-in only logs it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The injected startup probe: every 1 s, 600 failures.
pub const STARTUP_PERIOD: Duration = Duration::from_secs(1);
const STARTUP_FAILURES: u32 = 600;
/// The injected readiness probe: every 15 s, 4 failures.
pub const READINESS_PERIOD: Duration = Duration::from_secs(15);
const READINESS_FAILURES: u32 = 4;
/// `timeoutSeconds: 3` on both.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// What a probe found, for one run of the container (its id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeResult {
    /// The startup probe succeeded (`status.started`).
    Started { container_id: String },
    /// The readiness verdict changed (`status.ready`).
    Ready { container_id: String, ready: bool },
}

/// The container the prober watches: the kubelet stand-in sets the running container's id
/// (or none) and stops the prober when the pod goes.
#[derive(Debug, Clone, Default)]
pub struct ProbeTarget {
    inner: Arc<(Mutex<Option<String>>, Condvar)>,
    stop: Arc<AtomicBool>,
}

impl ProbeTarget {
    /// The container runs as `id` (a new id: a new run, results reset).
    pub fn running(&self, id: &str) {
        let (lock, cv) = &*self.inner;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = Some(id.to_string());
        cv.notify_all();
    }

    /// The container does not run.
    pub fn stopped(&self) {
        let (lock, _) = &*self.inner;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Ends the prober thread.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.inner.1.notify_all();
    }

    fn current(&self) -> Option<String> {
        self.inner
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Sleeps until `until` or [`ProbeTarget::stop`]; true when stopped.
    fn sleep_until(&self, until: Instant) -> bool {
        let (lock, cv) = &*self.inner;
        let mut g = lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            g = cv
                .wait_timeout(g, until - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

/// The first tick at or after `now` of a ticker started at `anchor` with `period`.
pub fn next_tick(anchor: Instant, period: Duration, now: Instant) -> Instant {
    if now <= anchor {
        return anchor;
    }
    let since = now - anchor;
    let n = since.as_nanos().div_ceil(period.as_nanos().max(1));
    anchor + period * u32::try_from(n).unwrap_or(u32::MAX)
}

/// Starts the probes of one container on a thread of its own (in `netns` when given), their
/// tickers anchored at `admitted`; results go to `report`.
pub fn spawn(
    pod: &str,
    netns: Option<std::fs::File>,
    target_addr: SocketAddr,
    admitted: Instant,
    target: ProbeTarget,
    report: impl Fn(ProbeResult) + Send + 'static,
) {
    spawn_path(
        "/healthz/ready",
        pod,
        netns,
        target_addr,
        admitted,
        target,
        report,
    )
}

/// [`spawn`] with the probes' HTTP path (`/ready` for Kuma's sidecar).
pub fn spawn_path(
    path: &'static str,
    pod: &str,
    netns: Option<std::fs::File>,
    target_addr: SocketAddr,
    admitted: Instant,
    target: ProbeTarget,
    report: impl Fn(ProbeResult) + Send + 'static,
) {
    let name = pod.to_string();
    let spawned = std::thread::Builder::new()
        .name(format!("prober-{pod}"))
        .spawn(move || {
            if let Some(f) = &netns {
                if let Err(e) = nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET) {
                    eprintln!("sim: pod {name}: the prober cannot enter the pod's netns: {e}");
                    return;
                }
            }
            run(&name, path, target_addr, admitted, &target, &report);
        });
    if let Err(e) = spawned {
        eprintln!("sim: pod {pod}: cannot start the prober: {e}");
    }
}

fn run(
    pod: &str,
    path: &str,
    addr: SocketAddr,
    admitted: Instant,
    target: &ProbeTarget,
    report: &impl Fn(ProbeResult),
) {
    let mut run_id: Option<String> = None;
    let mut started = false;
    let mut startup_failures = 0u32;
    let mut ready = false;
    let mut readiness_failures = 0u32;
    let mut next_startup = admitted;
    let mut next_readiness = admitted;
    loop {
        if target.sleep_until(next_startup.min(next_readiness)) {
            return;
        }
        let now = Instant::now();
        let current = target.current();
        if current != run_id {
            // A new run (or none): both results start over (worker.go: the initial values).
            run_id = current.clone();
            started = false;
            startup_failures = 0;
            ready = false;
            readiness_failures = 0;
        }
        let Some(id) = current else {
            next_startup = next_tick(admitted, STARTUP_PERIOD, now + Duration::from_millis(1));
            next_readiness = next_tick(admitted, READINESS_PERIOD, now + Duration::from_millis(1));
            continue;
        };
        let mut readiness_now = now >= next_readiness && started;
        if now >= next_startup && !started {
            if http_probe_path(addr, path) {
                started = true;
                report(ProbeResult::Started {
                    container_id: id.clone(),
                });
                // The manager's manual trigger of the readiness probe.
                readiness_now = true;
            } else {
                startup_failures += 1;
                if startup_failures == STARTUP_FAILURES {
                    eprintln!("sim: pod {pod}: startup probe failed {STARTUP_FAILURES} times (the kubelet would restart the container)");
                }
            }
        }
        if readiness_now {
            // successThreshold 1, failureThreshold 4.
            let verdict = if http_probe_path(addr, path) {
                readiness_failures = 0;
                true
            } else {
                readiness_failures += 1;
                ready && readiness_failures < READINESS_FAILURES
            };
            if verdict != ready {
                ready = verdict;
                report(ProbeResult::Ready {
                    container_id: id.clone(),
                    ready,
                });
            }
        }
        let after = Instant::now() + Duration::from_millis(1);
        next_startup = next_tick(admitted, STARTUP_PERIOD, after.max(now));
        next_readiness = next_tick(admitted, READINESS_PERIOD, after.max(now));
    }
}

/// One HTTP probe of `GET /healthz/ready`: true for a 2xx or 3xx answer within the timeout.
pub fn http_probe(addr: SocketAddr) -> bool {
    http_probe_path(addr, "/healthz/ready")
}

/// One HTTP probe of `GET <path>`.
pub fn http_probe_path(addr: SocketAddr, path: &str) -> bool {
    let attempt = || -> std::io::Result<bool> {
        let mut s = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
        s.set_read_timeout(Some(PROBE_TIMEOUT))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        )?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head)?;
        let code = std::str::from_utf8(&head[9..12])
            .ok()
            .and_then(|c| c.parse::<u16>().ok())
            .unwrap_or(0);
        Ok((200..400).contains(&code))
    };
    attempt().unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_keep_the_admission_phase() {
        let a = Instant::now();
        let s = Duration::from_secs(1);
        assert_eq!(next_tick(a, s, a), a);
        assert_eq!(next_tick(a, s, a + Duration::from_millis(1)), a + s);
        assert_eq!(next_tick(a, s, a + s), a + s);
        assert_eq!(next_tick(a, s, a + Duration::from_millis(2300)), a + 3 * s);
    }

    #[test]
    fn probe_passes_on_2xx_3xx_only_and_fails_when_refused() {
        let serve = |status: &'static str| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            let addr = l.local_addr().expect("addr");
            std::thread::spawn(move || {
                if let Ok((mut c, _)) = l.accept() {
                    // Read the whole request head before answering, as a server does: closing
                    // with request bytes unread makes the kernel send RST instead of FIN, and the
                    // probe's read of the answer then fails (seen once on a fresh clone, when the
                    // request arrived in two segments).
                    let mut req = Vec::new();
                    let mut buf = [0u8; 512];
                    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                        match c.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => req.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = write!(c, "HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
                }
            });
            addr
        };
        assert!(http_probe(serve("200 OK")));
        assert!(http_probe(serve("302 Found")));
        assert!(!http_probe(serve("503 Service Unavailable")));
        // Nothing listening: refused, a failure.
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let closed = l.local_addr().expect("addr");
        drop(l);
        assert!(!http_probe(closed));
    }
}
