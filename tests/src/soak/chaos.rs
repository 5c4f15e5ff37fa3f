//! The soak's chaos: the agent ended (SIGKILL or SIGTERM) and restarted after a gap, a pod's
//! Envoy killed or frozen, and the status API flooded. Every signal goes to a PID this process
//! started (the agent) or read from the simulated pod it owns (Envoy under its pilot-agent).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::plan::AgentEnd;
use crate::agent::AgentProcess;
use crate::sim::process::signal;
use crate::sim::report::now_us;
use crate::sim::SimNode;

/// One time the agent was away: from the signal to the successor's status API answering.
#[derive(Debug, Clone)]
pub struct Outage {
    pub end: AgentEnd,
    pub gap: Duration,
    /// Wall clock, µs (comparable with the apps' reports).
    pub down_us: u64,
    /// When the successor answered `/healthz`; `None` if it never did.
    pub up_us: Option<u64>,
    /// SIGTERM: the agent did not exit within 10 s.
    pub slow_exit: bool,
}

impl std::fmt::Display for Outage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = |us: u64| {
            let ms = us / 1000;
            format!(
                "{:02}:{:02}.{:03}",
                (ms / 60_000) % 60,
                (ms / 1000) % 60,
                ms % 1000
            )
        };
        write!(
            f,
            "{:?} at {}, successor after {:?} up at {}",
            self.end,
            t(self.down_us),
            self.gap,
            self.up_us.map_or("never".into(), t)
        )
    }
}

struct Restart {
    end: AgentEnd,
    gap: Duration,
}

/// Owns the agent on its own thread and restarts it on request, one restart at a time.
pub struct AgentSupervisor {
    tx: Option<Sender<Restart>>,
    busy: Arc<AtomicBool>,
    outages: Arc<Mutex<Vec<Outage>>>,
    join: Option<JoinHandle<AgentProcess>>,
    pub status_addr: SocketAddr,
}

impl AgentSupervisor {
    pub fn new(agent: AgentProcess) -> std::io::Result<AgentSupervisor> {
        let (tx, rx) = channel::<Restart>();
        let busy = Arc::new(AtomicBool::new(false));
        let outages = Arc::new(Mutex::new(Vec::new()));
        let status_addr = agent.status_addr();
        let join = {
            let (busy, outages) = (busy.clone(), outages.clone());
            std::thread::Builder::new()
                .name("soak-agent".into())
                .spawn(move || supervise(agent, rx, &busy, &outages))?
        };
        Ok(AgentSupervisor {
            tx: Some(tx),
            busy,
            outages,
            join: Some(join),
            status_addr,
        })
    }

    /// Ends the agent now and restarts it `gap` later; false (nothing done) while a restart is
    /// still under way.
    pub fn restart(&self, end: AgentEnd, gap: Duration) -> bool {
        if self.busy.swap(true, Ordering::SeqCst) {
            return false;
        }
        let sent = self
            .tx
            .as_ref()
            .is_some_and(|tx| tx.send(Restart { end, gap }).is_ok());
        if !sent {
            self.busy.store(false, Ordering::SeqCst);
        }
        sent
    }

    /// Whether the agent is down or starting now.
    pub fn restarting(&self) -> bool {
        self.busy.load(Ordering::SeqCst)
    }

    /// Every outage so far.
    pub fn outages(&self) -> Vec<Outage> {
        self.outages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits for a restart under way, and hands the agent back.
    pub fn finish(mut self) -> (AgentProcess, Vec<Outage>) {
        drop(self.tx.take());
        let agent = match self.join.take().map(JoinHandle::join) {
            Some(Ok(a)) => a,
            _ => panic!("the agent supervisor thread panicked"),
        };
        (agent, self.outages())
    }
}

fn supervise(
    mut agent: AgentProcess,
    rx: Receiver<Restart>,
    busy: &AtomicBool,
    outages: &Mutex<Vec<Outage>>,
) -> AgentProcess {
    for r in rx {
        let down_us = now_us();
        let mut slow_exit = false;
        match r.end {
            AgentEnd::Sigkill => agent.kill(),
            AgentEnd::Sigterm => slow_exit = agent.terminate().is_err(),
        }
        std::thread::sleep(r.gap);
        // The flood may take the status API's every slot for a moment: try a few times.
        let mut up_us = None;
        for attempt in 1..=3 {
            match agent.restart() {
                Ok(()) => {
                    up_us = Some(now_us());
                    break;
                }
                Err(e) => eprintln!("soak: agent restart attempt {attempt}: {e:#}"),
            }
        }
        outages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Outage {
                end: r.end,
                gap: r.gap,
                down_us,
                up_us,
                slow_exit,
            });
        busy.store(false, Ordering::SeqCst);
    }
    agent
}

/// Sends `sig` to the Envoy of `pod`; returns its pid when there was one.
pub fn signal_envoy(node: &SimNode, pod: &str, sig: Signal) -> Option<u32> {
    let pid = node.envoy_pid(pod)?;
    signal(pid, sig);
    Some(pid)
}

/// What the flood did, and what the agent answered.
#[derive(Debug, Default)]
pub struct FloodCounts {
    /// Connections opened (idle, slow, burst and request connections).
    pub connections: AtomicU64,
    /// Idle or slow connections the agent closed (header timeout, lifetime, or the cap).
    pub closed_by_agent: AtomicU64,
    /// Requests answered 200.
    pub answered: AtomicU64,
    /// Requests that failed (refused while the agent was down, closed at the cap, timed out).
    pub failed: AtomicU64,
}

/// Connections that stay open: idle ones (never send a byte) and slow ones (a byte a second).
const IDLE_CONNECTIONS: usize = 40;
const SLOW_CONNECTIONS: usize = 8;
/// Every 10 s a burst of this many connections held for a second: past the agent's cap (64).
const BURST_CONNECTIONS: usize = 150;
/// Threads sending requests back to back (a little pause between, the machine has 2 cores).
const REQUEST_THREADS: usize = 2;

/// Floods the agent's status API until dropped: idle and slow connections, bursts past the
/// connection cap, and requests for `/status` and `/metrics` back to back.
pub struct Flood {
    stop: Arc<AtomicBool>,
    joins: Vec<JoinHandle<()>>,
    pub counts: Arc<FloodCounts>,
}

impl Flood {
    pub fn start(addr: SocketAddr) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(FloodCounts::default());
        let mut joins = Vec::new();
        let mut spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            if let Ok(j) = std::thread::Builder::new().name(name.into()).spawn(f) {
                joins.push(j);
            }
        };
        let (s, c) = (stop.clone(), counts.clone());
        spawn("flood-hold", Box::new(move || hold_open(addr, &s, &c)));
        for i in 0..REQUEST_THREADS {
            let (s, c) = (stop.clone(), counts.clone());
            let path = if i % 2 == 0 { "/status" } else { "/metrics" };
            spawn(
                "flood-req",
                Box::new(move || request_loop(addr, path, &s, &c)),
            );
        }
        Flood {
            stop,
            joins,
            counts,
        }
    }
}

impl Flood {
    /// Connections, closed by the agent, requests answered, requests failed (so far).
    pub fn totals(&self) -> [u64; 4] {
        let c = &self.counts;
        [&c.connections, &c.closed_by_agent, &c.answered, &c.failed]
            .map(|a| a.load(Ordering::Relaxed))
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for j in self.joins.drain(..) {
            let _ = j.join();
        }
    }
}

fn connect(addr: SocketAddr, counts: &FloodCounts) -> Option<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    counts.connections.fetch_add(1, Ordering::Relaxed);
    s.set_nonblocking(true).ok()?;
    Some(s)
}

/// True when the peer closed (EOF or reset); false while it is open and silent.
fn closed(mut s: &TcpStream) -> bool {
    let mut buf = [0u8; 512];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// Keeps the idle and slow connections topped up; every 10 s a burst past the cap.
fn hold_open(addr: SocketAddr, stop: &AtomicBool, counts: &FloodCounts) {
    let head = b"GET /status HTTP/1.1\r\nHost: holdfast\r\n";
    let mut idle: Vec<TcpStream> = Vec::new();
    let mut slow: Vec<(TcpStream, usize)> = Vec::new();
    let mut next_burst = Instant::now() + Duration::from_secs(10);
    let mut next_drip = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let before = idle.len() + slow.len();
        idle.retain(|s| !closed(s));
        slow.retain(|(s, _)| !closed(s));
        let gone = before - idle.len() - slow.len();
        counts
            .closed_by_agent
            .fetch_add(gone as u64, Ordering::Relaxed);
        while idle.len() < IDLE_CONNECTIONS {
            let Some(s) = connect(addr, counts) else {
                break;
            };
            idle.push(s);
        }
        while slow.len() < SLOW_CONNECTIONS {
            let Some(s) = connect(addr, counts) else {
                break;
            };
            slow.push((s, 0));
        }
        if Instant::now() >= next_drip {
            next_drip += Duration::from_secs(1);
            for (s, sent) in &mut slow {
                // One byte of a request head that never ends.
                let _ = s.write(&head[*sent % head.len()..*sent % head.len() + 1]);
                *sent += 1;
            }
        }
        if Instant::now() >= next_burst {
            next_burst += Duration::from_secs(10);
            let burst: Vec<TcpStream> = (0..BURST_CONNECTIONS)
                .filter_map(|_| connect(addr, counts))
                .collect();
            std::thread::sleep(Duration::from_secs(1));
            let closed_now = burst.iter().filter(|s| closed(s)).count();
            counts
                .closed_by_agent
                .fetch_add(closed_now as u64, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Requests `path` over and over, each on a new connection.
fn request_loop(addr: SocketAddr, path: &str, stop: &AtomicBool, counts: &FloodCounts) {
    while !stop.load(Ordering::SeqCst) {
        let ok = TcpStream::connect_timeout(&addr, Duration::from_millis(200))
            .and_then(|mut s| {
                counts.connections.fetch_add(1, Ordering::Relaxed);
                s.set_read_timeout(Some(Duration::from_secs(2)))?;
                write!(
                    s,
                    "GET {path} HTTP/1.1\r\nHost: holdfast\r\nConnection: close\r\n\r\n"
                )?;
                let mut head = [0u8; 12];
                s.read_exact(&mut head)?;
                Ok(head.starts_with(b"HTTP/1.1 200"))
            })
            .unwrap_or(false);
        let c = if ok { &counts.answered } else { &counts.failed };
        c.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(if ok { 5 } else { 50 }));
    }
}
