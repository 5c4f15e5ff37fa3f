//! The drain's parts against the real system:
//!
//! - the pidfd exit watcher with real child processes (no root needed);
//! - the whole drain against a real Envoy 1.40 (with the holdfast filter when it is built) in a
//!   test-made network namespace, with a real app holding an outbound connection through Envoy
//!   (needs root: skips with a message when not root, fails under CI).
//!
//! Figures (`cargo test -p holdfast --test drain_parts -- --nocapture`) are printed; the
//! ignored `drain_lag_figures` runs the drain 20 times for a p50/p99 of app exit → Envoy exit.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, ensure, Context, Result};
use holdfast::config::{HoldSettings, PodOverrides, ProxyConfig};
use holdfast::effects::envoy_admin::{AdminClient, ServerState};
use holdfast::effects::procfs::pod_procs::{PodProcess, PodProcs};
use holdfast::lifecycle::drain::{
    self, AppContainer, AppTracker, DrainCtx, DrainOutcome, DrainSettings, DrainStep, ExitWatcher,
    IdleReason, PodProcessSource, PodProcsSource, PodProxy, QuitReason, Watch,
};
use holdfast::mesh::istio;
use holdfast::pod::{
    AppEnd, ContainerState, ContainerView, Deletion, PodKey, PodView, RestartPolicy,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------------------------
// The pidfd exit watcher
// ---------------------------------------------------------------------------------------------

/// A child process, SIGKILLed (by pid) and reaped on drop.
struct Proc(Child);

impl Proc {
    fn spawn(cmd: &mut Command) -> Result<Proc> {
        Ok(Proc(
            cmd.spawn().with_context(|| format!("spawning {cmd:?}"))?,
        ))
    }
    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[tokio::test]
async fn exit_notification_arrives_within_milliseconds() -> Result<()> {
    let mut lags = Vec::new();
    for _ in 0..20 {
        let mut child = Proc::spawn(Command::new("sleep").arg("60"))?;
        let mut watcher = ExitWatcher::new();
        ensure!(
            watcher.watch(child.pid()) == Watch::Watching,
            "a live child must be watched"
        );
        ensure!(watcher.live() == 1);
        // Not before the exit.
        ensure!(
            tokio::time::timeout(Duration::from_millis(20), watcher.next_exit())
                .await
                .is_err(),
            "an exit was reported for a live process"
        );
        let killed = tokio::time::Instant::now();
        child.0.kill()?; // not reaped: the notification must come at exit, not at reaping
        let (pid, at) = tokio::time::timeout(Duration::from_secs(2), watcher.next_exit())
            .await
            .context("no exit notification within 2 s")?;
        ensure!(
            pid == child.pid(),
            "notified pid {pid}, expected {}",
            child.pid()
        );
        ensure!(watcher.live() == 0);
        lags.push(at.duration_since(killed));
    }
    lags.sort();
    let (p50, p99) = (percentile(&lags, 50.0), percentile(&lags, 99.0));
    println!(
        "pidfd exit notification after SIGKILL: p50 {p50:?}, p99 {p99:?}, max {:?} (n={})",
        lags[lags.len() - 1],
        lags.len()
    );
    // Typically well under 1 ms; the bounds leave room for a loaded 2-core test machine
    // (other tests start Envoys meanwhile). Polling at the drain's 100 ms re-scan would be ~50 ms.
    ensure!(
        p50 < Duration::from_millis(5),
        "exit notifications too slow: p50 {p50:?}"
    );
    ensure!(
        lags[lags.len() - 1] < Duration::from_millis(50),
        "an exit notification took {:?}",
        lags[lags.len() - 1]
    );
    Ok(())
}

#[tokio::test]
async fn exited_processes_are_not_watched() -> Result<()> {
    let mut watcher = ExitWatcher::new();
    // Reaped: the pid is free.
    let mut done = Command::new("true").spawn()?;
    let pid = done.id() as i32;
    done.wait()?;
    ensure!(
        watcher.watch(pid) == Watch::AlreadyExited,
        "a reaped pid was watched"
    );
    // A zombie (exited, not reaped) has exited too.
    let mut zombie = Proc::spawn(Command::new("sleep").arg("60"))?;
    zombie.0.kill()?;
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", zombie.pid()))?;
        if stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        {
            break;
        }
        ensure!(Instant::now() < deadline, "the child never became a zombie");
        std::thread::sleep(Duration::from_millis(1));
    }
    ensure!(
        watcher.watch(zombie.pid()) == Watch::AlreadyExited,
        "a zombie was watched"
    );
    ensure!(watcher.live() == 0);
    Ok(())
}

#[tokio::test]
async fn many_processes_each_reported_once() -> Result<()> {
    let mut children = Vec::new();
    let mut watcher = ExitWatcher::new();
    for _ in 0..10 {
        let c = Proc::spawn(Command::new("sleep").arg("60"))?;
        ensure!(watcher.watch(c.pid()) == Watch::Watching);
        ensure!(
            watcher.watch(c.pid()) == Watch::Watching,
            "re-watching must be harmless"
        );
        children.push(c);
    }
    ensure!(watcher.live() == 10, "live {}", watcher.live());
    for c in &mut children {
        c.0.kill()?;
    }
    let mut seen = Vec::new();
    for _ in 0..10 {
        let (pid, _) = tokio::time::timeout(Duration::from_secs(2), watcher.next_exit()).await?;
        seen.push(pid);
    }
    seen.sort();
    let mut want: Vec<i32> = children.iter().map(Proc::pid).collect();
    want.sort();
    ensure!(seen == want, "reported {seen:?}, expected {want:?}");
    ensure!(
        tokio::time::timeout(Duration::from_millis(20), watcher.next_exit())
            .await
            .is_err()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The app's processes found by cgroup, as on a node
// ---------------------------------------------------------------------------------------------

/// The cgroup v2 mount point, from mountinfo (fstype `cgroup2`).
fn cgroup2_root() -> Result<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        if right.split_whitespace().next() == Some("cgroup2") {
            if let Some(mount_point) = left.split_whitespace().nth(4) {
                return Ok(PathBuf::from(mount_point));
            }
        }
    }
    bail!("no cgroup2 mount in /proc/self/mountinfo")
}

/// Kubelet-shaped cgroups (`<base>/kubepods/pod<uid>/<container id>`), removed on drop after
/// their processes are killed.
struct PodCgroups {
    base: PathBuf,
    dirs: Vec<PathBuf>,
    procs: Vec<Proc>,
}

impl PodCgroups {
    fn new(test: &str, uid: &str) -> Result<PodCgroups> {
        let base = cgroup2_root()?.join(format!("{test}-{}", std::process::id()));
        Ok(PodCgroups {
            dirs: vec![
                base.clone(),
                base.join("kubepods"),
                base.join(format!("kubepods/pod{uid}")),
            ],
            base,
            procs: Vec::new(),
        })
    }

    /// Starts `sleep` in container `cid`'s cgroup (`None`: the pod's own cgroup); returns its pid.
    fn start_in(&mut self, cid: Option<&str>) -> Result<i32> {
        for d in &self.dirs {
            std::fs::create_dir_all(d)
                .with_context(|| format!("creating cgroup {}", d.display()))?;
        }
        let pod_dir = self.dirs[2].clone();
        let dir = match cid {
            Some(c) => {
                let d = pod_dir.join(c);
                std::fs::create_dir_all(&d)?;
                if !self.dirs.contains(&d) {
                    self.dirs.push(d.clone());
                }
                d
            }
            None => pod_dir,
        };
        let p = Proc::spawn(Command::new("sleep").arg("60"))?;
        let pid = p.pid();
        self.procs.push(p);
        std::fs::write(dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("moving {pid} into {}", dir.display()))?;
        Ok(pid)
    }

    fn kill(&mut self, pid: i32) -> Result<()> {
        let p = self
            .procs
            .iter_mut()
            .find(|p| p.pid() == pid)
            .context("not our process")?;
        p.0.kill()?;
        Ok(())
    }
}

impl Drop for PodCgroups {
    fn drop(&mut self) {
        self.procs.clear(); // kills and reaps them
        for d in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
        let _ = std::fs::remove_dir(&self.base);
    }
}

#[tokio::test]
async fn tracker_finds_the_app_by_cgroup() -> Result<()> {
    if !privileged("tracker_finds_the_app_by_cgroup") {
        return Ok(());
    }
    const APP_CID: &str = "a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0";
    const PROXY_CID: &str = "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0";
    const PAUSE_CID: &str = "c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0";
    let key = PodKey {
        uid: "7d1c0e7a-1111-4000-8000-00000000c6c6".into(),
        ..key()
    };
    let mut cg = PodCgroups::new("hf-drain-cg", &key.uid)?;
    let pause = cg.start_in(Some(PAUSE_CID))?;
    let proxy = cg.start_in(Some(PROXY_CID))?;
    let app = cg.start_in(Some(APP_CID))?;
    let helper = cg.start_in(Some(APP_CID))?;

    let mut view = pod_view(Duration::from_secs(30));
    view.key = key.clone();
    view.containers[0].id = Some(APP_CID.into());
    view.containers[1].id = Some(PROXY_CID.into());
    let source = PodProcsSource::new(PodProcs::new(PathBuf::from("/proc")), key.uid.clone());
    let mut tracker = AppTracker::new(&key, source);
    let snap = tracker.refresh(&view).await;
    // The app's two processes, not the pause's nor the proxy's.
    ensure!(
        snap.live == 2,
        "live {} (pause {pause}, proxy {proxy}, app {app}, helper {helper}): {snap:?}",
        snap.live
    );
    ensure!(
        snap.containers == vec![("app".to_string(), AppContainer::Live { pids: 2 })],
        "{snap:?}"
    );
    ensure!(!snap.gone_for_drain());

    for pid in [app, helper] {
        let killed = tokio::time::Instant::now();
        cg.kill(pid)?;
        let (exited, at) =
            tokio::time::timeout(Duration::from_secs(2), tracker.next_exit()).await?;
        ensure!(exited == pid, "exit of {exited}, expected {pid}");
        println!(
            "app process {pid}: exit noticed {:?} after SIGKILL",
            at.duration_since(killed)
        );
    }
    let snap = tracker.refresh(&view).await;
    ensure!(
        snap.live == 0
            && snap.gone_for_drain()
            && snap.end(RestartPolicy::Never, |_| Default::default()) == AppEnd::ForGood,
        "{snap:?}"
    );
    ensure!(
        snap.containers == vec![("app".to_string(), AppContainer::Exited)],
        "{snap:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The drain against a real Envoy in a test-made netns
// ---------------------------------------------------------------------------------------------

mod support;
use support::{privileged, TestNetns};

/// A directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(label: &str) -> Result<Scratch> {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!("hf-{label}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn workspace_file(env: &str, rel: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Some(PathBuf::from(p));
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    p.exists().then_some(p)
}

const ADMIN: &str = "127.0.0.1:15000";
const OUTBOUND: &str = "127.0.0.1:15001";
const BACKEND: &str = "127.0.0.1:8080";
const APP_ID: &str = "a1a1";
const PROXY_ID: &str = "b2b2";

/// Envoy's configuration: the outbound and inbound capture listeners (`tcp_proxy` to an echo
/// backend, with the filter first when it is built), and Istio's bootstrap listeners that move
/// bytes in every pod without carrying its traffic, as istio/istio
/// `tools/packaging/common/envoy_bootstrap.json` (86c9f01fd73) defines them: 15021 (HCM
/// `stat_prefix: agent`, `/healthz/ready` routed to pilot-agent's status port 15020 through
/// cluster `agent`: where kubelet's probes go) and 15090 (`stat_prefix: stats`,
/// `/stats/prometheus` routed to the admin API through cluster `prometheus_stats`: where
/// Prometheus scrapes).
fn bootstrap(filter: Option<&Path>, stats: StatsMatcher) -> Result<String> {
    let wasm = filter.map(|p| {
        format!(
            r#"
      - name: envoy.filters.network.wasm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm
          config:
            name: holdfast
            root_id: holdfast
            vm_config:
              runtime: envoy.wasm.runtime.v8
              code: {{ local: {{ filename: "{}" }} }}"#,
            p.display()
        )
    });
    let wasm = wasm.unwrap_or_default();
    let listener = |name: &str, dir: &str, port: u16| {
        format!(
            r#"
  - name: {name}
    traffic_direction: {dir}
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:{wasm}
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: {name}
          cluster: backend"#
        )
    };
    let istio_static = |port: u16, stat_prefix: &str, path: &str, cluster: &str| {
        format!(
            r#"
  - name: 0.0.0.0_{port}
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          codec_type: AUTO
          stat_prefix: {stat_prefix}
          route_config:
            virtual_hosts:
            - name: backend
              domains: ["*"]
              routes:
              - match: {{ prefix: "{path}" }}
                route: {{ cluster: {cluster} }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"#
        )
    };
    let cluster = |name: &str, port: u16| {
        format!(
            r#"
  - name: {name}
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }}"#
        )
    };
    Ok(format!(
        r#"admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: 15000 }} }}{}
static_resources:
  listeners:{}{}{}{}
  clusters:{}{}{}
"#,
        stats.yaml()?,
        listener("inbound", "INBOUND", 15006),
        listener("outbound", "OUTBOUND", 15001),
        istio_static(STATUS_PORT, "agent", "/healthz/ready", "agent"),
        istio_static(
            PROMETHEUS_PORT,
            "stats",
            "/stats/prometheus",
            "prometheus_stats"
        ),
        cluster("backend", 8080),
        cluster("agent", PILOT_AGENT_STATUS_PORT),
        cluster("prometheus_stats", 15000),
    ))
}

/// Which stats Envoy keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatsMatcher {
    /// Every stat (Envoy's default).
    All,
    /// Istio's default (`tests/corpus/istio-stats-matcher.json`, with its sources): Envoy's
    /// byte counters are not kept.
    IstioDefault,
    /// Istio's default plus holdfast's mesh config (manifests/mesh-config, whose content the
    /// manifests test checks): the filter's prefix and the two byte-counter suffixes.
    IstioWithHoldfastMeshConfig,
}

impl StatsMatcher {
    /// The bootstrap's `stats_config` line (JSON, which YAML reads), or nothing for `All`.
    fn yaml(self) -> Result<String> {
        let mesh: &[serde_json::Value] = match self {
            StatsMatcher::All => return Ok(String::new()),
            StatsMatcher::IstioDefault => &[],
            StatsMatcher::IstioWithHoldfastMeshConfig => &[
                serde_json::json!({ "prefix": "wasmcustom.holdfast." }),
                serde_json::json!({ "suffix": "downstream_cx_rx_bytes_total" }),
                serde_json::json!({ "suffix": "downstream_cx_tx_bytes_total" }),
                serde_json::json!({ "suffix": "downstream_cx_tx_bytes_buffered" }),
            ],
        };
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/istio-stats-matcher.json");
        let istio: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)
            .with_context(|| format!("{}", path.display()))?;
        let mut patterns = istio["patterns"]
            .as_array()
            .with_context(|| format!("{}: no patterns", path.display()))?
            .clone();
        patterns.extend_from_slice(mesh);
        let config =
            serde_json::json!({ "stats_matcher": { "inclusion_list": { "patterns": patterns } } });
        Ok(format!("\nstats_config: {config}"))
    }
}

/// Istio's Envoy status port (kubelet probes), Prometheus port, and pilot-agent's status port.
const STATUS_PORT: u16 = 15021;
const PROMETHEUS_PORT: u16 = 15090;
const PILOT_AGENT_STATUS_PORT: u16 = 15020;

/// The fake pod's processes: the app's and Envoy's pids under their container ids.
#[derive(Clone)]
struct Procs(Vec<PodProcess>);

impl PodProcessSource for Procs {
    async fn processes(&self) -> Vec<PodProcess> {
        self.0.clone()
    }
}

fn pod_view(grace: Duration) -> PodView {
    PodView {
        key: key(),
        overrides: PodOverrides::from_annotations([], &HoldSettings::default()),
        containers: vec![
            ContainerView {
                name: "app".into(),
                id: Some(APP_ID.into()),
                is_proxy: false,
                state: ContainerState::Running,
                ..ContainerView::default()
            },
            ContainerView {
                name: "istio-proxy".into(),
                id: Some(PROXY_ID.into()),
                is_proxy: true,
                state: ContainerState::Running,
                ..ContainerView::default()
            },
        ],
        restart_policy: RestartPolicy::Always,
        deletion: Some(Deletion {
            timestamp: holdfast::lifecycle::drain::plan::timestamp(SystemTime::now()),
            grace,
        }),
        ..PodView::blank(holdfast::mesh::istio::profile(
            &holdfast::config::ProxyConfig::default(),
        ))
    }
}

fn key() -> PodKey {
    PodKey {
        uid: "5d1c0e7a-0000-4000-8000-00000000d1a1".into(),
        namespace: "test".into(),
        name: "drain".into(),
    }
}

/// A pod in a netns: Envoy (with the filter when built), a backend that echoes, and an app that
/// holds one outbound connection through Envoy until it is killed.
struct RealPod {
    // Drop order: processes first, then the netns, then the scratch dir.
    app: Option<Proc>,
    envoy: Proc,
    admin: AdminClient,
    filter: bool,
    netns: TestNetns,
    _dir: Scratch,
}

impl RealPod {
    async fn start(name: &str) -> Result<RealPod> {
        RealPod::start_with(name, StatsMatcher::All).await
    }

    async fn start_with(name: &str, stats: StatsMatcher) -> Result<RealPod> {
        let envoy_bin = workspace_file("HOLDFAST_ENVOY", "target/bin/envoy")
            .context("no Envoy: run `just setup` or set HOLDFAST_ENVOY")?;
        let filter = workspace_file("HOLDFAST_FILTER_WASM", "target/holdfast_filter.wasm");
        let dir = Scratch::new(name)?;
        let netns = TestNetns::new(name)?;

        // Backend inside the netns: a listener made there, served from a plain thread.
        let backend: TcpListener = netns
            .ns
            .run(|| TcpListener::bind(BACKEND))?
            .context("binding the backend in the netns")?;
        std::thread::spawn(move || {
            for conn in backend.incoming() {
                let Ok(mut conn) = conn else { break };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = conn.read(&mut buf) {
                        if n == 0 || conn.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });

        let config = dir.0.join("envoy.yaml");
        std::fs::write(&config, bootstrap(filter.as_deref(), stats)?)?;
        let log = std::fs::File::create(dir.0.join("envoy.log"))?;
        let envoy = Proc::spawn(
            netns
                .command(&envoy_bin)
                .arg("-c")
                .arg(&config)
                .args([
                    "--use-dynamic-base-id",
                    "--concurrency",
                    "1",
                    "--drain-time-s",
                    "30",
                    "--log-level",
                    "warn",
                ])
                .stdout(Stdio::null())
                .stderr(log),
        )?;
        let admin = AdminClient::in_netns(netns.ns.clone(), ADMIN.parse()?)
            .with_timeouts(Duration::from_millis(500), Duration::from_secs(2));
        let started = Instant::now();
        loop {
            if let Ok(ServerState::Live) = admin.ready().await {
                break;
            }
            if started.elapsed() > Duration::from_secs(30) {
                let log = std::fs::read_to_string(dir.0.join("envoy.log")).unwrap_or_default();
                bail!("Envoy not LIVE after 30 s; log:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut pod = RealPod {
            app: None,
            envoy,
            admin,
            filter: filter.is_some(),
            netns,
            _dir: dir,
        };
        pod.start_app().await?;
        Ok(pod)
    }

    /// The app: bash opens a connection to Envoy's outbound listener, sends a byte, and execs
    /// `sleep` with the connection still open (same pid: `ip netns exec` and bash both exec).
    async fn start_app(&mut self) -> Result<()> {
        let app = Proc::spawn(self.netns.command(Path::new("bash")).args([
            "-c",
            &format!(
                "exec 3<>/dev/tcp/{}/{}; printf x >&3; exec sleep 60",
                "127.0.0.1", 15001
            ),
        ]))?;
        self.app = Some(app);
        if self.filter {
            let started = Instant::now();
            while self.outbound_active().await != Some(1) {
                ensure!(
                    started.elapsed() < Duration::from_secs(5),
                    "the app's outbound connection never showed in the filter's counts"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// A drain of this pod, started now: deletion with a 30 s grace period, default settings.
    /// Returns the task and the pod view's sender, which must live as long as the drain (the
    /// drain reads a closed view as the pod gone).
    fn start_drain(&self) -> RunningDrain {
        let (tx, rx) = watch::channel(Some(pod_view(Duration::from_secs(30))));
        let (steps_tx, steps) = tokio::sync::mpsc::unbounded_channel();
        let (procs, admin) = (self.procs(), istio_proxy(self.admin.clone()));
        let task = tokio::spawn(async move {
            let (key, settings) = (key(), DrainSettings::default());
            let ctx = DrainCtx {
                steps: Some(steps_tx),
                ..ctx(&key, &admin, &settings, procs, rx, CancellationToken::new())
            };
            drain::drain(ctx).await
        });
        RunningDrain {
            task,
            _view: tx,
            steps,
        }
    }

    /// Whether the filter is built (else `test` skips with a message; under CI that is an error).
    fn has_filter(&self, test: &str) -> Result<bool> {
        if !self.filter {
            ensure!(
                std::env::var_os("CI").is_none(),
                "{test}: the filter is not built (target/holdfast_filter.wasm) and CI is set"
            );
            eprintln!("SKIP {test}: needs the filter (`just filter`)");
        }
        Ok(self.filter)
    }

    /// Another container's outbound connection through Envoy (not the app's: it outlives the
    /// app), echoed once by the backend, and seen in the filter's counts next to the app's.
    async fn open_other_outbound(&self) -> Result<TcpStream> {
        let mut other = self
            .netns
            .ns
            .connect_tcp(OUTBOUND.parse()?, Duration::from_secs(1))?;
        other.set_read_timeout(Some(Duration::from_secs(2)))?;
        other.write_all(b"hello")?;
        let mut five = [0u8; 5];
        other.read_exact(&mut five)?;
        let started = Instant::now();
        while self.outbound_active().await != Some(2) {
            ensure!(
                started.elapsed() < Duration::from_secs(5),
                "the second outbound connection never showed in the filter's counts"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(other)
    }

    /// Bytes Envoy's status (15021) and Prometheus (15090) listeners have moved.
    async fn own_listener_bytes(&self) -> Result<u64> {
        let stats = self
            .admin
            .stats(Some(
                "^http\\.(agent|stats)\\.downstream_cx_(rx|tx)_bytes_total$",
            ))
            .await?;
        Ok(stats.values.values().sum())
    }

    async fn outbound_active(&self) -> Option<u64> {
        self.admin
            .stats(Some("^wasmcustom\\.holdfast\\."))
            .await
            .ok()?
            .get("wasmcustom.holdfast.outbound.cx_active")
    }

    fn procs(&self) -> Procs {
        let mut v = vec![PodProcess {
            pid: self.envoy.pid(),
            container_id: Some(PROXY_ID.into()),
        }];
        if let Some(app) = &self.app {
            v.push(PodProcess {
                pid: app.pid(),
                container_id: Some(APP_ID.into()),
            });
        }
        Procs(v)
    }

    /// A fresh connection through Envoy's outbound listener, echoed by the backend.
    fn outbound_round_trip(&self) -> Result<()> {
        let mut s: TcpStream = self
            .netns
            .ns
            .connect_tcp(OUTBOUND.parse()?, Duration::from_secs(1))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"ping")?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf)?;
        ensure!(&buf == b"ping", "echo returned {buf:?}");
        Ok(())
    }

    /// Waits for Envoy to exit; returns when it was seen exited and its status.
    async fn envoy_exit(&mut self, limit: Duration) -> Result<(Instant, std::process::ExitStatus)> {
        let until = Instant::now() + limit;
        loop {
            if let Some(status) = self.envoy.0.try_wait()? {
                return Ok((Instant::now(), status));
            }
            ensure!(
                Instant::now() < until,
                "Envoy still running after {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// A [`RealPod`]'s admin as the drain reaches an Istio pod's (its own listeners left out of the
/// idle test), without a sock_diag socket.
fn istio_proxy(admin: AdminClient) -> PodProxy {
    PodProxy::new(admin, None, &istio::profile(&ProxyConfig::default()))
}

/// The drain's (or Job wait's) context for a [`RealPod`]'s processes and admin.
fn ctx<'a>(
    key: &'a PodKey,
    admin: &'a PodProxy,
    settings: &'a DrainSettings,
    procs: Procs,
    rx: watch::Receiver<Option<PodView>>,
    stop: CancellationToken,
) -> DrainCtx<'a, PodProxy, Procs> {
    DrainCtx {
        key,
        admin,
        processes: procs,
        view: rx,
        stop,
        settings,
        steps: None,
    }
}

/// A drain running as a task, with the steps it tells.
struct RunningDrain {
    task: tokio::task::JoinHandle<drain::DrainReport>,
    /// The pod's view (dropping it would read as the pod gone).
    _view: watch::Sender<Option<PodView>>,
    steps: tokio::sync::mpsc::UnboundedReceiver<DrainStep>,
}

impl RunningDrain {
    /// Waits until the drain has asked Envoy to drain inbound (the drain has begun: what the
    /// tests check next happens during it, not before).
    async fn begun(&mut self) -> Result<()> {
        let wait = async {
            while let Some(step) = self.steps.recv().await {
                if let DrainStep::InboundDrained { drained, .. } = step {
                    ensure!(drained, "Envoy refused the inbound drain");
                    return Ok(());
                }
            }
            bail!("the drain ended before it asked Envoy to drain inbound")
        };
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .context("the drain did not begin within 5 s")?
    }

    fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    async fn report(self, limit: Duration) -> Result<drain::DrainReport> {
        Ok(tokio::time::timeout(limit, self.task).await??)
    }
}

/// One full drain: deletion, checks during the drain, app killed, Envoy's exit timed.
/// Returns (app kill → Envoy exit, the report).
async fn one_drain(name: &str, check_during: bool) -> Result<(Duration, drain::DrainReport)> {
    let mut pod = RealPod::start(name).await?;
    let mut drain_task = pod.start_drain();
    drain_task.begun().await?;
    ensure!(
        !drain_task.is_finished(),
        "the drain ended while the app ran"
    );
    if check_during {
        // Inbound drained, nothing else: Envoy's health stays LIVE (a failed health check would
        // drain-close outbound too), and outbound works for the app's last calls.
        let state = pod.admin.ready().await?;
        ensure!(
            state == ServerState::Live,
            "/ready says {state:?} during the drain"
        );
        pod.outbound_round_trip()
            .context("outbound during the drain")?;
        println!("during the drain: /ready {state:?}, outbound works");
    }

    let killed = Instant::now();
    drop(pod.app.take()); // SIGKILL the app (its connection closes with it)
    let (exited, status) = pod.envoy_exit(Duration::from_secs(5)).await?;
    let report = drain_task.report(Duration::from_secs(5)).await?;
    ensure!(status.success(), "Envoy exited with {status}");
    Ok((exited.duration_since(killed), report))
}

#[tokio::test]
async fn drain_against_real_envoy() -> Result<()> {
    if !privileged("drain_against_real_envoy") {
        return Ok(());
    }
    let (lag, report) = one_drain("hf-drain", true).await?;
    println!(
        "app exit → Envoy exit: {lag:?}; report: {}",
        serde_json::to_string(&report)?
    );
    ensure!(
        report.outcome == DrainOutcome::AppDone,
        "outcome {:?}: {:?}",
        report.outcome,
        report.errors
    );
    ensure!(report.inbound_drained, "{report:?}");
    // The version the drain read from /server_info is the binary's (the decision's input).
    let version = support::envoy_version_of(&support::envoy_binary())?;
    ensure!(
        report.envoy_version.as_deref() == Some(version.as_str()),
        "drain read Envoy {:?}, the binary is {version}",
        report.envoy_version
    );
    let filter = workspace_file("HOLDFAST_FILTER_WASM", "target/holdfast_filter.wasm").is_some();
    ensure!(
        report.filter_present == Some(filter),
        "filter_present {:?}, filter configured {filter}",
        report.filter_present
    );
    // Envoy keeps every stat here, its byte counters too: with or without the filter, the
    // bytes decide (issue 28: no outbound connection is not enough, a response may still be
    // going out inbound).
    ensure!(
        matches!(
            report.quit_reason,
            Some(QuitReason::Idle(IdleReason::NoBytesMoved { .. }))
        ),
        "quit reason {:?}",
        report.quit_reason
    );
    ensure!(report.proxy_exit_seen_at.is_some());
    ensure!(report.error_count == 0, "errors: {:?}", report.errors);
    // The app's last round trip moved bytes just before its exit, so the quit waits one idle
    // window (100 ms) after it: the goal is the window plus ≤ 50 ms at p99 (see
    // drain_lag_figures); one run on a busy 2-core test machine
    // gets a looser bound so the test fails on real regressions (a fixed sleep, a missed exit),
    // not on scheduling noise.
    ensure!(
        lag < Duration::from_millis(250),
        "app exit → Envoy exit took {lag:?}"
    );
    Ok(())
}

/// pilot-agent's status server, standing in on 15020 in the netns: answers every HTTP/1.1
/// request with 200 (pilot-agent's `/healthz/ready` does once Envoy is ready), keep-alive, until
/// dropped.
struct StatusStandIn {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StatusStandIn {
    fn start(netns: &TestNetns) -> Result<StatusStandIn> {
        let addr = format!("127.0.0.1:{PILOT_AGENT_STATUS_PORT}");
        let listener: TcpListener = netns
            .ns
            .run(move || TcpListener::bind(addr))?
            .context("binding the status stand-in")?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                let Ok((conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                };
                let flag = flag.clone();
                std::thread::spawn(move || serve_http_200(conn, &flag));
            }
        });
        Ok(StatusStandIn {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for StatusStandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve_http_200(mut conn: TcpStream, stop: &AtomicBool) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_millis(50)));
    let mut pending = Vec::new();
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::SeqCst) {
        match conn.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => return,
        }
        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            pending.drain(..end + 4);
            if conn
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .is_err()
            {
                return;
            }
        }
    }
}

/// Kubelet's probes (15021) and Prometheus's scrapes (15090), every `every`, from inside the
/// netns (through the agent's own HTTP/1 client, one kept-alive connection per port) until
/// dropped; counts the 200s of each.
struct ProbesAndScrapes {
    ok: Arc<[AtomicU64; 2]>,
    task: tokio::task::JoinHandle<()>,
}

impl ProbesAndScrapes {
    fn start(netns: &TestNetns, every: Duration) -> ProbesAndScrapes {
        let ok: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let client = |port: u16| {
            AdminClient::in_netns(netns.ns.clone(), SocketAddr::from(([127, 0, 0, 1], port)))
                .with_timeouts(Duration::from_millis(500), Duration::from_secs(2))
        };
        let targets = [
            (client(STATUS_PORT), "/healthz/ready"),
            (client(PROMETHEUS_PORT), "/stats/prometheus"),
        ];
        let counts = ok.clone();
        let task = tokio::spawn(async move {
            loop {
                for (i, (c, path)) in targets.iter().enumerate() {
                    if c.request("GET", path).await.is_ok_and(|r| r.status == 200) {
                        counts[i].fetch_add(1, Ordering::SeqCst);
                    }
                }
                tokio::time::sleep(every).await;
            }
        });
        ProbesAndScrapes { ok, task }
    }

    /// 200s so far: (probes, scrapes).
    fn ok(&self) -> (u64, u64) {
        (
            self.ok[0].load(Ordering::SeqCst),
            self.ok[1].load(Ordering::SeqCst),
        )
    }
}

impl Drop for ProbesAndScrapes {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Sends 64 bytes and reads their echo every 5 ms on `conn` until stopped.
fn stream_until(mut conn: TcpStream, stop: Arc<AtomicBool>) -> Result<(TcpStream, u64)> {
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    let chunk = [b'z'; 64];
    let mut back = [0u8; 64];
    let mut rounds = 0u64;
    while !stop.load(Ordering::SeqCst) {
        conn.write_all(&chunk)?;
        conn.read_exact(&mut back)?;
        rounds += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok((conn, rounds))
}

/// What the drain's idle test watches, against a real Envoy: Envoy's own byte counters. After
/// the app is gone an outbound connection stays open (another container's, here the test's),
/// so the filter's `outbound.cx_active` is 1 and only the bytes can say whether it is idle.
/// While kubelet-style probes hit 15021 and Prometheus-style scrapes hit 15090 every 10 ms (and
/// the agent polls the admin API every 5 ms), the drain waits exactly as long as the connection
/// carries bytes and quits about one idle window (100 ms) after it stops: the bytes of the
/// proxy's own listeners do not count, the bytes of a traffic listener do.
#[tokio::test]
async fn drain_waits_for_moving_bytes_not_for_probes_or_scrapes() -> Result<()> {
    const TEST: &str = "drain_waits_for_moving_bytes_not_for_probes_or_scrapes";
    if !privileged(TEST) {
        return Ok(());
    }
    let mut pod =
        RealPod::start_with("hf-drain-bytes", StatsMatcher::IstioWithHoldfastMeshConfig).await?;
    if !pod.has_filter(TEST)? {
        return Ok(());
    }
    let _status = StatusStandIn::start(&pod.netns)?;
    let probes = ProbesAndScrapes::start(&pod.netns, Duration::from_millis(10));
    let other = pod.open_other_outbound().await?;
    let mut drain_task = pod.start_drain();
    drain_task.begun().await?;

    let stop_streaming = Arc::new(AtomicBool::new(false));
    let streamer = {
        let (conn, stop) = (other, stop_streaming.clone());
        std::thread::spawn(move || stream_until(conn, stop))
    };
    let probes_before = probes.ok();
    let own_bytes_before = pod.own_listener_bytes().await?;
    let killed = Instant::now();
    drop(pod.app.take()); // the app is gone; the other connection streams on
    const STREAMING: Duration = Duration::from_millis(800);
    tokio::time::sleep(STREAMING).await;
    let own_bytes_after = pod.own_listener_bytes().await?;
    ensure!(
        pod.envoy.0.try_wait()?.is_none() && !drain_task.is_finished(),
        "the proxy quit while a connection was still moving bytes, {:?} after the app's exit",
        killed.elapsed()
    );
    stop_streaming.store(true, Ordering::SeqCst);
    let stopped = Instant::now();
    let (idle_conn, rounds) = streamer.join().expect("streamer thread")?;
    let (exited, status) = pod.envoy_exit(Duration::from_secs(10)).await?;
    let report = drain_task.report(Duration::from_secs(5)).await?;
    let probes_after = probes.ok();
    drop(idle_conn);
    let after_stop = exited.duration_since(stopped);
    println!(
        "bytes: {rounds} echoes in {STREAMING:?} after the app's exit; Envoy exited {after_stop:?} \
         after they stopped; probes/scrapes answered 200 during the drain: {} / {}; the proxy's \
         own listeners moved {} bytes meanwhile; report: {}",
        probes_after.0 - probes_before.0,
        probes_after.1 - probes_before.1,
        own_bytes_after - own_bytes_before,
        serde_json::to_string(&report)?
    );
    ensure!(status.success(), "Envoy exited with {status}");
    ensure!(report.outcome == DrainOutcome::AppDone, "{report:?}");
    ensure!(
        matches!(
            report.quit_reason,
            Some(QuitReason::Idle(IdleReason::NoBytesMoved { .. }))
        ),
        "quit reason {:?}",
        report.quit_reason
    );
    ensure!(rounds >= 20, "only {rounds} echoes while streaming");
    // The idle window is 100 ms; samples every 5 ms; Envoy's exit after the quit is tens of ms.
    ensure!(
        after_stop < Duration::from_millis(1500),
        "Envoy exited {after_stop:?} after the bytes stopped: something else kept the drain busy"
    );
    ensure!(
        probes_after.0 - probes_before.0 >= 10 && probes_after.1 - probes_before.1 >= 10,
        "probes and scrapes did not run during the drain: {probes_before:?} → {probes_after:?}"
    );
    ensure!(
        own_bytes_after > own_bytes_before,
        "the proxy's own listeners moved no bytes: the test did not test their exclusion"
    );
    Ok(())
}

/// The same shape under Istio's default stats matcher, which keeps none of Envoy's byte
/// counters (holdfast's mesh config not applied): the drain cannot tell an idle connection
/// from traffic, so an outbound connection left open after the app's exit holds it — never a
/// quit on bytes it cannot see — until the connection closes; the report says which mesh
/// config fixes it.
#[tokio::test]
async fn without_envoys_byte_counters_the_drain_waits_for_the_connection_and_says_why() -> Result<()>
{
    const TEST: &str =
        "without_envoys_byte_counters_the_drain_waits_for_the_connection_and_says_why";
    if !privileged(TEST) {
        return Ok(());
    }
    let mut pod = RealPod::start_with("hf-drain-nobytes", StatsMatcher::IstioDefault).await?;
    if !pod.has_filter(TEST)? {
        return Ok(());
    }
    let other = pod.open_other_outbound().await?;
    // Istio's matcher really dropped them, the admin API's own included.
    let bytes = pod
        .admin
        .stats(Some("downstream_cx_(rx|tx)_bytes_total$"))
        .await?;
    ensure!(
        bytes.values.is_empty(),
        "byte counters kept: {:?}",
        bytes.values
    );

    let mut drain_task = pod.start_drain();
    drain_task.begun().await?;
    drop(pod.app.take());
    tokio::time::sleep(Duration::from_millis(600)).await;
    ensure!(
        pod.envoy.0.try_wait()?.is_none() && !drain_task.is_finished(),
        "the proxy quit with an outbound connection open and no byte counters to judge it by"
    );
    let closed = Instant::now();
    drop(other);
    let (exited, status) = pod.envoy_exit(Duration::from_secs(10)).await?;
    let report = drain_task.report(Duration::from_secs(5)).await?;
    println!(
        "no byte counters: Envoy exited {:?} after the other connection closed; report: {}",
        exited.duration_since(closed),
        serde_json::to_string(&report)?
    );
    ensure!(status.success(), "Envoy exited with {status}");
    ensure!(report.outcome == DrainOutcome::AppDone, "{report:?}");
    ensure!(
        report.quit_reason == Some(QuitReason::Idle(IdleReason::NoConnections)),
        "quit reason {:?}",
        report.quit_reason
    );
    ensure!(report.last_traffic_bytes.is_none(), "{report:?}");
    ensure!(
        report
            .advice
            .as_deref()
            .is_some_and(|a| a.contains("proxyStatsMatcher")),
        "advice {:?}",
        report.advice
    );
    ensure!(
        exited.duration_since(closed) < Duration::from_secs(2),
        "Envoy exited {:?} after the connection closed",
        exited.duration_since(closed)
    );
    Ok(())
}

#[tokio::test]
async fn proxy_gone_early_against_real_envoy() -> Result<()> {
    if !privileged("proxy_gone_early_against_real_envoy") {
        return Ok(());
    }
    let mut pod = RealPod::start("hf-drain-early").await?;
    let mut drain_task = pod.start_drain();
    drain_task.begun().await?;
    // pilot-agent's terminationDrainDuration ran out: it SIGKILLs Envoy while the app runs.
    let killed = Instant::now();
    pod.envoy.0.kill()?;
    let report = drain_task.report(Duration::from_secs(5)).await?;
    println!(
        "Envoy killed → drain noticed: {:?}; advice: {:?}",
        killed.elapsed(),
        report.advice
    );
    ensure!(
        report.outcome == DrainOutcome::ProxyGoneEarly,
        "outcome {:?}",
        report.outcome
    );
    ensure!(report
        .advice
        .as_deref()
        .is_some_and(|a| a.contains("terminationDrainDuration")));
    ensure!(report.app_processes_left == 1);
    Ok(())
}

#[tokio::test]
async fn job_completes_against_real_envoy() -> Result<()> {
    if !privileged("job_completes_against_real_envoy") {
        return Ok(());
    }
    let mut pod = RealPod::start("hf-drain-job").await?;
    let settings = DrainSettings::default();
    let mut view = pod_view(Duration::from_secs(30));
    view.deletion = None;
    view.restart_policy = RestartPolicy::Never;
    let (_tx, rx) = watch::channel(Some(view));
    let key = key();
    let procs = pod.procs();
    let admin = istio_proxy(pod.admin.clone());
    let job_task = tokio::spawn(async move {
        drain::finish_job(ctx(
            &key,
            &admin,
            &settings,
            procs,
            rx,
            CancellationToken::new(),
        ))
        .await
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    ensure!(
        !job_task.is_finished(),
        "the job watch ended while the app ran"
    );
    ensure!(
        pod.admin.ready().await? == ServerState::Live,
        "the proxy must stay untouched while the job runs"
    );
    let killed = Instant::now();
    drop(pod.app.take());
    let (exited, status) = pod.envoy_exit(Duration::from_secs(5)).await?;
    let report = tokio::time::timeout(Duration::from_secs(5), job_task).await??;
    let lag = exited.duration_since(killed);
    println!(
        "job: app exit → Envoy exit {lag:?}; report: {}",
        serde_json::to_string(&report)?
    );
    ensure!(status.success(), "Envoy exited with {status}");
    ensure!(report.outcome == drain::JobOutcome::Completed, "{report:?}");
    ensure!(
        report.finished_by == Some(drain::FinishedBy::Procfs),
        "{report:?}"
    );
    // Target: the pod completes within 1 s of the app's exit; the proxy's part is this lag.
    // The Job's in-flight wait starts at the app's end with no sample before it, so the bytes
    // must stand still for one idle window (100 ms) first (issue 28: "no outbound connection"
    // alone could cut a response still going out): 170–180 ms measured on an idle machine,
    // the bound keeps the 150 ms of slack it had over the earlier ~0–70 ms.
    ensure!(
        lag < Duration::from_millis(350),
        "app exit → Envoy exit took {lag:?}"
    );
    Ok(())
}

/// p50/p99 of app exit → Envoy exit over 20 drains. Run with
/// `cargo test -p holdfast --test drain_parts drain_lag_figures -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "figures for the report: 20 Envoy starts, about a minute"]
async fn drain_lag_figures() -> Result<()> {
    if !privileged("drain_lag_figures") {
        return Ok(());
    }
    let mut lags = Vec::new();
    let mut quit = Vec::new();
    for _ in 0..20 {
        let (lag, report) = one_drain("hf-drain-fig", false).await?;
        ensure!(report.outcome == DrainOutcome::AppDone, "{report:?}");
        lags.push(lag);
        quit.extend(report.app_gone_to_quit);
    }
    lags.sort();
    quit.sort();
    println!(
        "app exit → Envoy exit over {} drains: p50 {:?}, p99 {:?}, max {:?}; app exit → quit sent: p50 {:?}, p99 {:?}",
        lags.len(),
        percentile(&lags, 50.0),
        percentile(&lags, 99.0),
        lags[lags.len() - 1],
        percentile(&quit, 50.0),
        percentile(&quit, 99.0)
    );
    ensure!(
        percentile(&lags, 99.0) <= Duration::from_millis(50),
        "p99 over the 50 ms goal"
    );
    Ok(())
}
