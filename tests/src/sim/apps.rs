//! The app containers, the remote services and the pause process: the programs `sim-app` runs.
//!
//! Every app writes a report ([`super::report`]) so tests count what the app itself saw. Calls use
//! a line protocol: the app sends `ping\n`, the remote services answer `pong\n`.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal};

use super::report::{now_ms, now_us, AppEvent, CallError, Phase, ReportWriter};

/// Termination signals (SIGTERM, SIGINT) delivered to a dedicated thread.
///
/// [`TermSignal::install`] blocks them in the calling thread; threads spawned afterwards inherit
/// the mask, so only the waiter thread takes them (no async-signal-safety concerns, no unsafe).
/// Sleepers wait on a condition variable the waiter thread notifies: no polling, so a node of
/// 110 idle pods (pause, app and pilot-agent processes) does not wake 100 times a second per
/// process and load the machine the benchmarks measure.
#[derive(Debug, Clone)]
pub struct TermSignal {
    at_ms: Arc<AtomicU64>,
    /// Counts [`TermSignal::nudge`]s; notified on each and on the signal.
    wake: Arc<(std::sync::Mutex<u64>, std::sync::Condvar)>,
}

impl TermSignal {
    /// Call first in `main`, before any thread exists.
    pub fn install() -> io::Result<TermSignal> {
        let mut set = SigSet::empty();
        set.add(Signal::SIGTERM);
        set.add(Signal::SIGINT);
        set.thread_block().map_err(io::Error::from)?;
        let at_ms = Arc::new(AtomicU64::new(0));
        let wake = Arc::new((std::sync::Mutex::new(0u64), std::sync::Condvar::new()));
        let this = TermSignal { at_ms, wake };
        let signalled = this.clone();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                if set.wait().is_ok() {
                    signalled.at_ms.store(now_ms().max(1), Ordering::SeqCst);
                    // Under the lock, so a sleeper between its check and its wait is not missed.
                    let (lock, cv) = &*signalled.wake;
                    let _guard = lock.lock().unwrap_or_else(|e| e.into_inner());
                    cv.notify_all();
                }
            })?;
        Ok(this)
    }

    /// Wakes every [`TermSignal::wait_event`] and [`TermSignal::sleep_or_event`] (not plain
    /// `sleep`s): for another event a sleeper waits for, such as a child's exit.
    pub fn nudge(&self) {
        let (lock, cv) = &*self.wake;
        let mut n = lock.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.wrapping_add(1);
        cv.notify_all();
    }

    /// How many nudges so far: pass it to [`TermSignal::wait_event`] so that a nudge between
    /// reading it and waiting is not missed.
    pub fn nudges(&self) -> u64 {
        *self.wake.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sleeps up to `d` or until there have been more nudges than `seen` (from
    /// [`TermSignal::nudges`]); not woken by the signal. True if nudged.
    pub fn wait_event(&self, seen: u64, d: Duration) -> bool {
        self.wait(d, false, Some(seen)) == Woken::Nudged
    }

    /// Like [`TermSignal::sleep`], also ended by a nudge after `seen`: [`Woken`] says which.
    pub fn sleep_or_event(&self, seen: u64, d: Duration) -> Woken {
        self.wait(d, true, Some(seen))
    }

    fn wait(&self, d: Duration, on_signal: bool, seen: Option<u64>) -> Woken {
        let end = Instant::now() + d;
        let (lock, cv) = &*self.wake;
        let mut n = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if on_signal && self.received_at_ms().is_some() {
                return Woken::Signal;
            }
            if seen.is_some_and(|start| *n != start) {
                return Woken::Nudged;
            }
            let now = Instant::now();
            if now >= end {
                return Woken::Timeout;
            }
            n = cv
                .wait_timeout(n, end - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// When the signal arrived (wall-clock ms), if it has.
    pub fn received_at_ms(&self) -> Option<u64> {
        match self.at_ms.load(Ordering::SeqCst) {
            0 => None,
            t => Some(t),
        }
    }

    /// Sleeps up to `d`; returns early (true) when the signal arrives.
    pub fn sleep(&self, d: Duration) -> bool {
        self.wait(d, true, None) == Woken::Signal
    }
}

/// Why a [`TermSignal`] wait ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Woken {
    Signal,
    Nudged,
    Timeout,
}

/// `sim-app app` flags. See [`super::spec::AppScript`] for the scripts tests use.
#[derive(Debug, Clone, clap::Args)]
pub struct AppArgs {
    /// Report file (JSON lines, appended).
    #[arg(long)]
    pub report: PathBuf,
    /// Remote service to call (`ip:port`).
    #[arg(long)]
    pub remote: SocketAddr,
    /// Calls at start, each on a new connection; exit 1 if any fails.
    #[arg(long, default_value_t = 0)]
    pub startup_calls: u32,
    /// Call every N ms while running (over the keep-alive pool).
    #[arg(long)]
    pub every_ms: Option<u64>,
    /// Keep-alive pool size.
    #[arg(long, default_value_t = 2)]
    pub pool: usize,
    /// Call the remote's HTTP service (port 8080 on --remote's address) every N ms over one
    /// pooled HTTP/1.1 and one HTTP/2 connection ([`super::http_calls`]), through SIGTERM and
    /// --after-sigterm-ms past it, then exit 0 (instead of the ping calls).
    #[arg(long)]
    pub http_every_ms: Option<u64>,
    /// After SIGTERM keep calling for N ms, then exit 0.
    #[arg(long, default_value_t = 0)]
    pub after_sigterm_ms: u64,
    /// After SIGTERM (and the calls of --after-sigterm-ms), idle N ms before exiting: an app
    /// that takes its time to shut down (the hostile suite's many-processes attacker).
    #[arg(long, default_value_t = 0)]
    pub exit_delay_ms: u64,
    /// Batch job: make N calls, then exit with --exit-code.
    #[arg(long)]
    pub batch_calls: Option<u32>,
    /// Exit code of a batch job.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub exit_code: i32,
    /// Batch job: exit with this code instead on the app's first run in the pod (its report
    /// empty when it starts); later runs (the kubelet's restarts) exit with --exit-code.
    #[arg(long, allow_negative_numbers = true)]
    pub first_exit_code: Option<i32>,
    /// Batch job: retry a failed call for up to N ms.
    #[arg(long, default_value_t = 0)]
    pub retry_for_ms: u64,
    /// Serve inbound `ping` requests on this port (all addresses).
    #[arg(long)]
    pub serve: Option<u16>,
    /// With --serve: answer each `get` request with this many bytes instead (a download), and
    /// on SIGTERM exit only once every response begun is written (`serve_downloads`).
    #[arg(long, requires = "serve")]
    pub download_bytes: Option<u64>,
    /// Make the startup calls concurrently, each on its own connection.
    #[arg(long)]
    pub startup_parallel: bool,
    /// Per-call timeout in ms.
    #[arg(long, default_value_t = 2000)]
    pub call_timeout_ms: u64,
    /// Work (sleep) this many ms after starting, before the startup calls.
    #[arg(long, default_value_t = 0)]
    pub init_ms: u64,
    /// Before the startup calls, look this name up through the system resolver (getaddrinfo:
    /// UDP to the nameserver of the pod's resolv.conf) and call the address found, of the same
    /// family as --remote, on --remote's port. A failed lookup exits 1, as an app that cannot
    /// find its config server crashes.
    #[arg(long)]
    pub lookup: Option<String>,
    /// The pod's resolv.conf, bind-mounted over /etc/resolv.conf in a mount namespace of the
    /// app's own (as the container runtime mounts the one kubelet writes).
    #[arg(long)]
    pub resolv_conf: Option<PathBuf>,
    /// Run a hostile pod's attack first (see `sim::attacks`), then idle until SIGTERM.
    #[arg(long, requires = "attack_size")]
    pub attack: Option<String>,
    /// The attack's size (bytes, rules or milliseconds).
    #[arg(long)]
    pub attack_size: Option<u64>,
}

/// Makes `path` this process's `/etc/resolv.conf`: a private mount namespace (for the calling
/// thread and the threads it starts afterwards) with a bind mount. Call before resolving.
fn use_resolv_conf(path: &std::path::Path) -> io::Result<()> {
    use nix::mount::{mount, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(io::Error::from)?;
    // Keep the bind mount from propagating back to the node's mount namespace.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(io::Error::from)?;
    mount(
        Some(path),
        "/etc/resolv.conf",
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| {
        io::Error::other(format!(
            "bind-mount {} on /etc/resolv.conf: {e}",
            path.display()
        ))
    })
}

/// Looks `name` up with getaddrinfo (std's `ToSocketAddrs`) and picks the first address of
/// `remote`'s family, on `remote`'s port. Records the lookup.
fn lookup(report: &ReportWriter, name: &str, remote: SocketAddr) -> Option<SocketAddr> {
    use std::net::ToSocketAddrs;
    let started = Instant::now();
    let result = (name, remote.port())
        .to_socket_addrs()
        .map(|addrs| addrs.into_iter().find(|a| a.is_ipv6() == remote.is_ipv6()));
    let latency_ms = started.elapsed().as_millis() as u64;
    let (found, error) = match result {
        Ok(Some(a)) => (Some(a), None),
        Ok(None) => (None, Some(format!("no address of {remote}'s family"))),
        Err(e) => (None, Some(e.to_string())),
    };
    report.record(&AppEvent::Lookup {
        at_ms: now_ms(),
        name: name.to_string(),
        ok: found.is_some(),
        addr: found.map(|a| a.ip().to_string()),
        error,
        latency_ms,
    });
    found
}

/// A keep-alive connection pool to one remote service.
struct Pool {
    remote: SocketAddr,
    timeout: Duration,
    conns: Vec<Option<BufReader<TcpStream>>>,
    next: usize,
}

impl Pool {
    fn new(remote: SocketAddr, size: usize, timeout: Duration) -> Pool {
        Pool {
            remote,
            timeout,
            conns: (0..size.max(1)).map(|_| None).collect(),
            next: 0,
        }
    }

    /// One call on the next pooled connection (opened if needed; dropped on error).
    fn call(&mut self) -> Result<(), CallError> {
        let i = self.next % self.conns.len();
        self.next = self.next.wrapping_add(1);
        let mut conn = match self.conns[i].take() {
            Some(c) => c,
            None => BufReader::new(connect(self.remote, self.timeout)?),
        };
        exchange(&mut conn)?;
        self.conns[i] = Some(conn);
        Ok(())
    }
}

fn connect(remote: SocketAddr, timeout: Duration) -> Result<TcpStream, CallError> {
    let s = TcpStream::connect_timeout(&remote, timeout).map_err(|e| CallError::from_io(&e))?;
    s.set_read_timeout(Some(timeout))
        .and_then(|()| s.set_write_timeout(Some(timeout)))
        .and_then(|()| s.set_nodelay(true))
        .map_err(|e| CallError::from_io(&e))?;
    Ok(s)
}

fn exchange(conn: &mut BufReader<TcpStream>) -> Result<(), CallError> {
    conn.get_mut()
        .write_all(b"ping\n")
        .map_err(|e| CallError::from_io(&e))?;
    let mut line = String::new();
    match conn.read_line(&mut line) {
        Ok(0) => Err(CallError::Closed),
        Ok(_) if line == "pong\n" => Ok(()),
        Ok(_) => Err(CallError::BadResponse),
        Err(e) => Err(CallError::from_io(&e)),
    }
}

/// A call's result, and when its `connect()` returned (µs since the epoch).
type CallOutcome = (Result<(), CallError>, Option<u64>);

/// One call on a fresh connection, closed afterwards; also when `connect()` returned (µs).
fn call_once(remote: SocketAddr, timeout: Duration) -> CallOutcome {
    let mut conn = match connect(remote, timeout) {
        Ok(s) => BufReader::new(s),
        Err(e) => return (Err(e), None),
    };
    let connected = now_us();
    let r = exchange(&mut conn);
    let _ = conn.get_ref().shutdown(Shutdown::Both);
    (r, Some(connected))
}

fn record_call(report: &ReportWriter, phase: Phase, started: Instant, r: Result<(), CallError>) {
    record_call_connected(report, phase, started, r, None);
}

fn record_call_connected(
    report: &ReportWriter,
    phase: Phase,
    started: Instant,
    r: Result<(), CallError>,
    connected_us: Option<u64>,
) {
    let at_us = now_us();
    report.record(&AppEvent::Call {
        at_ms: at_us / 1000,
        at_us: Some(at_us),
        phase,
        ok: r.is_ok(),
        error: r.err(),
        latency_ms: started.elapsed().as_millis() as u64,
        connected_us,
    });
}

/// Runs the app; returns its exit code (after recording it).
pub fn run_app(args: &AppArgs, term: &TermSignal) -> io::Result<i32> {
    if let Some(path) = &args.resolv_conf {
        use_resolv_conf(path)?;
    }
    if let (Some(name), Some(size)) = (&args.attack, args.attack_size) {
        let attack = super::attacks::Attack::parse(name, size)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // On a thread: the app goes on (idles until SIGTERM) whatever the attack does.
        std::thread::Builder::new()
            .name("attack".into())
            .spawn(move || match attack.run() {
                Ok(line) => eprintln!("sim-app: {line}"),
                Err(e) => eprintln!("sim-app: attack {attack:?} failed: {e}"),
            })?;
    }
    // A run after the first in this pod finds the earlier run's report (the pod's directory
    // outlives container restarts).
    let first_run = std::fs::metadata(&args.report).map_or(true, |m| m.len() == 0);
    let report = Arc::new(ReportWriter::open(&args.report)?);
    let at_us = now_us();
    report.record(&AppEvent::Start {
        at_ms: at_us / 1000,
        at_us: Some(at_us),
        pid: std::process::id(),
    });
    let exit = |code: i32| {
        report.record(&AppEvent::Exit {
            at_ms: now_ms(),
            code,
        });
        Ok(code)
    };
    let downloads = Arc::new(Downloads::default());
    if let Some(port) = args.serve {
        let listener = TcpListener::bind(("0.0.0.0", port))?;
        let report = report.clone();
        let (bytes, downloads) = (args.download_bytes, downloads.clone());
        std::thread::Builder::new()
            .name("serve".into())
            .spawn(move || match bytes {
                Some(n) => serve_downloads(listener, n, &downloads, &report),
                None => serve(listener, Some(report)),
            })?;
    }
    let timeout = Duration::from_millis(args.call_timeout_ms);
    // The app's own initialisation before it needs the network (parsing config, warming caches).
    if term.sleep(Duration::from_millis(args.init_ms)) {
        report.record(&AppEvent::Sigterm {
            at_ms: term.received_at_ms().unwrap_or_else(now_ms),
        });
        return exit(0);
    }

    let remote = match &args.lookup {
        None => args.remote,
        Some(name) => match lookup(&report, name, args.remote) {
            Some(addr) => addr,
            // Like an app that cannot find its config server: crash, and let kubelet restart it.
            None => return exit(1),
        },
    };
    let mut startup_failed = false;
    if args.startup_parallel {
        let results: Vec<(Instant, CallOutcome)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..args.startup_calls)
                .map(|_| {
                    s.spawn(|| {
                        let t = Instant::now();
                        (t, call_once(remote, timeout))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| (Instant::now(), (Err(CallError::Other), None)))
                })
                .collect()
        });
        for (t, (r, connected)) in results {
            startup_failed |= r.is_err();
            record_call_connected(&report, Phase::Startup, t, r, connected);
        }
    } else {
        for _ in 0..args.startup_calls {
            let t = Instant::now();
            let (r, connected) = call_once(remote, timeout);
            startup_failed |= r.is_err();
            record_call_connected(&report, Phase::Startup, t, r, connected);
        }
    }
    if startup_failed {
        // Like an app that cannot fetch its config: crash, and let kubelet restart it.
        return exit(1);
    }

    if let Some(every) = args.http_every_ms {
        let http = SocketAddr::new(remote.ip(), super::http_calls::REMOTE_HTTP_PORT);
        super::http_calls::call_through_shutdown(
            &report,
            term,
            http,
            Duration::from_millis(every),
            Duration::from_millis(args.after_sigterm_ms),
            timeout,
        )?;
        if let Some(at_ms) = term.received_at_ms() {
            report.record(&AppEvent::Sigterm { at_ms });
        }
        return exit(0);
    }

    let mut pool = Pool::new(remote, args.pool, timeout);
    if let Some(n) = args.batch_calls {
        for _ in 0..n {
            let deadline = Instant::now() + Duration::from_millis(args.retry_for_ms);
            loop {
                let t = Instant::now();
                let r = pool.call();
                let ok = r.is_ok();
                record_call(&report, Phase::Running, t, r);
                if ok || Instant::now() >= deadline || term.received_at_ms().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        return exit(match args.first_exit_code {
            Some(code) if first_run => code,
            _ => args.exit_code,
        });
    }

    // Run until SIGTERM, calling out periodically if asked to.
    let every = args.every_ms.map(Duration::from_millis);
    loop {
        if let Some(every) = every {
            let t = Instant::now();
            let r = pool.call();
            record_call(&report, Phase::Running, t, r);
            if term.sleep(every.saturating_sub(t.elapsed())) {
                break;
            }
        } else if term.sleep(Duration::from_secs(3600)) {
            break;
        }
    }
    let term_at = term.received_at_ms().unwrap_or_else(now_ms);
    report.record(&AppEvent::Sigterm { at_ms: term_at });
    if args.download_bytes.is_some() {
        // A graceful server: no new requests are taken (the accept loop checks the flag);
        // the responses begun are written whole before the process exits.
        downloads.stopping.store(true, Ordering::SeqCst);
        let until = Instant::now() + Duration::from_secs(120);
        while downloads.writing.load(Ordering::SeqCst) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        eprintln!("{} sim-app: every download written; exiting", now_ms());
    }

    // Keep calling after SIGTERM (flush, deregister) for the scripted time.
    let until = Instant::now() + Duration::from_millis(args.after_sigterm_ms);
    let every = every.unwrap_or(Duration::from_millis(200));
    while Instant::now() < until {
        let t = Instant::now();
        let r = pool.call();
        record_call(&report, Phase::AfterSigterm, t, r);
        std::thread::sleep(every.saturating_sub(t.elapsed()));
    }
    std::thread::sleep(Duration::from_millis(args.exit_delay_ms));
    exit(0)
}

/// Serves `ping\n` → `pong\n` on every connection, one thread per connection, until the process
/// exits. With a report, every request served is recorded.
pub fn serve(listener: TcpListener, report: Option<Arc<ReportWriter>>) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let report = report.clone();
        let _ = std::thread::Builder::new()
            .name("conn".into())
            .spawn(move || {
                let mut w = match conn.try_clone() {
                    Ok(w) => w,
                    Err(_) => return,
                };
                let mut r = BufReader::new(conn);
                let mut line = String::new();
                loop {
                    line.clear();
                    match r.read_line(&mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                    let answer: &[u8] = if line == "ping\n" { b"pong\n" } else { b"?\n" };
                    if w.write_all(answer).is_err() {
                        return;
                    }
                    if let Some(rep) = &report {
                        rep.record(&AppEvent::Served { at_ms: now_ms() });
                    }
                }
            });
    }
}

/// The download server's state, shared by its connections and the main thread.
#[derive(Debug, Default)]
struct Downloads {
    /// Responses begun and not yet written whole.
    writing: AtomicU64,
    /// SIGTERM came: take no new request.
    stopping: std::sync::atomic::AtomicBool,
}

/// Serves downloads: each connection's `get\n` is answered with `bytes` bytes (written whole,
/// blocking as Envoy and the client read), then the connection is closed. Recorded as served
/// once written.
fn serve_downloads(
    listener: TcpListener,
    bytes: u64,
    state: &Arc<Downloads>,
    report: &Arc<ReportWriter>,
) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if state.stopping.load(Ordering::SeqCst) {
            continue;
        }
        let (state, report) = (state.clone(), report.clone());
        let _ = std::thread::Builder::new()
            .name("download".into())
            .spawn(move || {
                let mut r = BufReader::new(match conn.try_clone() {
                    Ok(c) => c,
                    Err(_) => return,
                });
                let mut line = String::new();
                if !matches!(r.read_line(&mut line), Ok(n) if n > 0) || line != "get\n" {
                    return;
                }
                state.writing.fetch_add(1, Ordering::SeqCst);
                let mut w = conn;
                let chunk = vec![b'x'; 64 * 1024];
                let mut left = bytes;
                let mut ok = true;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    if w.write_all(&chunk[..n]).is_err() {
                        ok = false;
                        break;
                    }
                    left -= n as u64;
                }
                let _ = w.shutdown(Shutdown::Write);
                if ok {
                    report.record(&AppEvent::Served { at_ms: now_ms() });
                }
                state.writing.fetch_sub(1, Ordering::SeqCst);
            });
    }
}

/// The pod sandbox's pause process: holds the pod's namespaces and exits on SIGTERM/SIGINT.
/// (kubelet's pause also reaps zombies; our containers are not its children, so there are none.)
pub fn run_pause(term: &TermSignal) {
    while !term.sleep(Duration::from_secs(3600)) {}
}
