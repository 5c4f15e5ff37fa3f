//! [`SimNode`]: the simulated node a test builds — remote services, pods, pods directory — and
//! the scenario API tests, benchmarks and the demo drive it with.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::cgroup::cgroup2_root;
use super::kubelet::{PodEvent, PodWorker};
use super::netns::{self, pod_ip, NetNs, REMOTE_IP};
use super::pod_object::{PodPhase, PodView};
use super::process::{alive, spawn_in};
use super::reach;
use super::report::AppReport;
use super::spec::PodSpec;
use super::{random_hex, random_uuid, SimError};

/// Port of the remote services (echo) in the remote namespace.
pub const REMOTE_PORT: u16 = 7000;

/// What every pod worker of a node shares (read-only).
#[derive(Debug)]
pub(crate) struct NodeEnv {
    pub test_name: String,
    pub sim_app: PathBuf,
    pub envoy: PathBuf,
    pub filter: Option<PathBuf>,
    pub pods_dir: PathBuf,
    pub work_dir: PathBuf,
    pub cgroup_root: PathBuf,
    pub remote_ns: String,
    /// The remote services' IPv4 address: [`REMOTE_IP`] in the node's remote netns, or on the
    /// containerd backend an address of the runtime's bridge leased to this node.
    pub remote_ip: Ipv4Addr,
    pub remote_port: u16,
    pub restart_backoff: Duration,
    /// How long after a container's exit the kubelet stand-in updates the Pod status.
    pub status_lag: Duration,
    /// The containerd backend's runtime (`None`: pods are hand-made namespaces).
    pub cri: Option<&'static crate::cri::Containerd>,
}

impl NodeEnv {
    pub(crate) fn netns_name(&self, pod: &str) -> String {
        format!("hf-{}-{pod}", self.test_name)
    }
}

/// The pods' views, shared between the workers and the test; `changed` is notified on every update.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pods: Mutex<BTreeMap<String, PodView>>,
    pub changed: Condvar,
    /// Pods whose netns is not `/run/netns/hf-<test>-<pod>` (the containerd backend's CNI
    /// names them `cni-<uuid>`).
    netns_paths: Mutex<BTreeMap<String, PathBuf>>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, BTreeMap<String, PodView>> {
        // A worker that panicked leaves consistent data (updates are single assignments).
        self.pods.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `f` to pod `name`'s view, rewrites its pod file in `pods_dir` (unless the pod is
    /// gone) and wakes waiters: the one way a kubelet stand-in (either backend) changes a pod.
    pub(crate) fn update_pod<R>(
        &self,
        pods_dir: &std::path::Path,
        name: &str,
        f: impl FnOnce(&mut PodView) -> R,
    ) -> R {
        let mut pods = self.lock();
        let Some(view) = pods.get_mut(name) else {
            // The view is created before the worker starts and never removed while it runs.
            unreachable!("pod {name} has no view");
        };
        let r = f(view);
        if !view.gone {
            let file = view.file_name();
            if let Err(e) = super::pod_object::write_atomic(pods_dir, &file, &view.to_pod()) {
                eprintln!("sim: cannot write pod file for {name}: {e}");
            }
        }
        drop(pods);
        self.changed.notify_all();
        r
    }

    /// Reads pod `name`'s view.
    pub(crate) fn view_pod<R>(&self, name: &str, f: impl FnOnce(&PodView) -> R) -> R {
        let pods = self.lock();
        match pods.get(name) {
            Some(v) => f(v),
            None => unreachable!("pod {name} has no view"),
        }
    }

    pub(crate) fn set_netns_path(&self, pod: &str, path: PathBuf) {
        let mut m = self.netns_paths.lock().unwrap_or_else(|p| p.into_inner());
        m.insert(pod.to_string(), path);
    }

    fn netns_path(&self, pod: &str) -> Option<PathBuf> {
        let m = self.netns_paths.lock().unwrap_or_else(|p| p.into_inner());
        m.get(pod).cloned()
    }
}

/// What runs the simulated node's pods.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Runtime {
    /// Network namespaces, cgroups and processes made by hand ([`super::kubelet`]).
    #[default]
    Netns,
    /// Real containers: a private containerd over the CRI, runc, the CNI bridge plugin
    /// ([`crate::cri`]). Remote services listen in the host's netns on an address of the CNI
    /// bridge of their own per node ([`crate::cri::Containerd::lease_remote_ip`]).
    Containerd,
}

/// Options of a simulated node; [`NodeOptions::default`] finds everything in the workspace.
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    /// The `sim-app` binary (default: [`sim_app_binary`]). Integration tests pass
    /// `env!("CARGO_BIN_EXE_sim-app")`.
    pub sim_app: Option<PathBuf>,
    /// The Envoy binary (default: [`crate::envoy::envoy_binary`]).
    pub envoy: Option<PathBuf>,
    /// The filter module (default: [`crate::envoy::filter_wasm`] if it exists). Pods load it
    /// unless their spec says `with_filter(false)`.
    pub filter: Option<PathBuf>,
    /// kubelet's first restart back-off (default 10 s, doubling up to 5 min).
    pub restart_backoff: Option<Duration>,
    /// How late a container's exit reaches the Pod status (default: at once). The real kubelet
    /// learns of a container's exit from its PLEG relist, every second
    /// (`genericPlegRelistPeriod = time.Second * 1`, kubernetes pkg/kubelet/kubelet.go), and
    /// the status then goes through the status manager and the API server's watch.
    pub status_lag: Option<Duration>,
    /// The backend (default: hand-made namespaces; `HOLDFAST_SIM_RUNTIME=containerd` in the
    /// environment overrides it for every node).
    pub runtime: Runtime,
}

/// Finds `sim-app`: `$HOLDFAST_SIM_APP`, else next to the running binary, else one directory up
/// (test binaries live in `target/<profile>/deps`).
pub fn sim_app_binary() -> Result<PathBuf, SimError> {
    if let Some(p) = std::env::var_os("HOLDFAST_SIM_APP") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|source| SimError::Io {
        what: "cannot find the running binary".into(),
        source,
    })?;
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    for cand in [dir.join("sim-app"), dir.join("../sim-app")] {
        if cand.exists() {
            return Ok(cand);
        }
    }
    Err(SimError::Setup(format!(
        "no sim-app binary next to {}: build it (`cargo build -p holdfast-tests --bins`) or set HOLDFAST_SIM_APP",
        exe.display()
    )))
}

struct Worker {
    name: String,
    tx: Sender<PodEvent>,
    join: Option<JoinHandle<()>>,
}

/// Sets one pod's annotations while the node runs ([`SimNode::annotator`]).
#[derive(Clone)]
pub struct Annotator {
    shared: Arc<Shared>,
    pods_dir: PathBuf,
    pod: String,
}

impl Annotator {
    /// Sets `key` to `value` (replacing its value if it is there); `false` once the pod is gone
    /// (a pod's view stays after it is gone; its file is no longer written).
    pub fn set(&self, key: &str, value: &str) -> bool {
        self.shared.update_pod(&self.pods_dir, &self.pod, |v| {
            match v.spec.annotations.iter_mut().find(|(k, _)| k == key) {
                Some(entry) => entry.1 = value.to_string(),
                None => v
                    .spec
                    .annotations
                    .push((key.to_string(), value.to_string())),
            }
            !v.gone
        })
    }
}

/// A simulated Kubernetes node. Build it, add pods, start them, delete them, read reports;
/// everything it created is removed on [`SimNode::finish`] or drop, even when a test panics.
///
/// ```no_run
/// use holdfast_tests::sim::{AppScript, PodSpec, SimNode};
/// use std::time::Duration;
/// let mut node = SimNode::new("demo")?;
/// node.add_pod(PodSpec::new("web").app(AppScript::CallAtStart { calls: 1 }).proxy_delay(Duration::from_secs(2)))?;
/// // A node agent would be started here, before the pods: node.spawn_host_process(cmd)?
/// node.start_pods()?;
/// node.wait_for("web", Duration::from_secs(10), "app exited", |p| p.app().is_some_and(|c| c.exit_code().is_some()))?;
/// let report = node.report("web")?;
/// assert!(node.finish().is_empty());
/// # Ok::<(), holdfast_tests::sim::SimError>(())
/// ```
pub struct SimNode {
    env: Arc<NodeEnv>,
    shared: Arc<Shared>,
    node_name: String,
    remote_ns: Option<NetNs>,
    remote: Option<Child>,
    /// The containerd backend's remote-service address (removed after the services stop).
    remote_lease: Option<crate::cri::runtime::RemoteIpLease>,
    workers: Vec<Worker>,
    added: usize,
    indices: BTreeMap<String, usize>,
    uids: Vec<String>,
    host_processes: Vec<Child>,
    torn_down: bool,
}

impl SimNode {
    /// A node named after the test (namespaces `hf-<test>-*`), with default options.
    pub fn new(test_name: &str) -> Result<SimNode, SimError> {
        SimNode::with_options(test_name, NodeOptions::default())
    }

    /// A test's node: as [`SimNode::with_options`], panicking with the test's name if the node
    /// cannot be built (a test cannot go on without it).
    pub fn for_test(test_name: &str, opts: NodeOptions) -> SimNode {
        SimNode::with_options(test_name, opts)
            .unwrap_or_else(|e| panic!("{test_name}: cannot build the simulated node: {e}"))
    }

    /// A node with explicit options.
    pub fn with_options(test_name: &str, opts: NodeOptions) -> Result<SimNode, SimError> {
        if test_name.is_empty()
            || !test_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(SimError::Setup(format!(
                "test name {test_name:?}: use letters, digits and '-' (it names namespaces and files)"
            )));
        }
        // Parallel checkouts on one machine (several worktrees running tests at once) set
        // HOLDFAST_SIM_TAG so their namespaces and files never collide.
        let tagged;
        let test_name = match std::env::var("HOLDFAST_SIM_TAG") {
            Ok(tag) if !tag.is_empty() && tag.chars().all(|c| c.is_ascii_alphanumeric()) => {
                tagged = format!("{test_name}-{tag}");
                tagged.as_str()
            }
            _ => test_name,
        };
        let sim_app = match opts.sim_app {
            Some(p) => p,
            None => sim_app_binary()?,
        };
        let envoy = match opts.envoy {
            Some(p) => p,
            None => crate::envoy::envoy_binary().map_err(|e| SimError::Setup(e.to_string()))?,
        };
        let filter = opts.filter.or_else(|| crate::envoy::filter_wasm().ok());
        if filter.is_none() {
            eprintln!("sim: no filter module (run `just filter`): sidecars run without the holdfast filter");
        }
        // The pods' own uids run Envoy and sim-app and read the filter: hand them over from where
        // those uids reach them, or say why not before any pod starts (reach.rs).
        let reach::PodFiles {
            sim_app,
            envoy,
            filter,
        } = reach::pod_files(&sim_app, &envoy, filter.as_deref(), &std::env::temp_dir())?;
        // `HOLDFAST_SIM_RUNTIME=containerd` runs a whole test binary written for the default
        // backend on the containerd one (`just test` runs the end-to-end files both ways).
        let runtime = match std::env::var("HOLDFAST_SIM_RUNTIME").as_deref() {
            Ok("containerd") => Runtime::Containerd,
            _ => opts.runtime,
        };
        let cri = match runtime {
            Runtime::Netns => None,
            Runtime::Containerd => Some(crate::cri::shared().map_err(SimError::Setup)?),
        };
        if cri.is_some() && opts.status_lag.is_some_and(|l| !l.is_zero()) {
            return Err(SimError::Setup(
                "status_lag is not implemented on the containerd backend (see docs/containerd-backend.md)".into(),
            ));
        }
        // Nodes on the containerd backend have their remote services in the host's netns, each
        // on an address of its own on the runtime's bridge (the cluster DNS needs port 53 of it).
        let remote_lease = match cri {
            None => None,
            Some(rt) => Some(rt.lease_remote_ip()?),
        };
        let remote_ip = remote_lease.as_ref().map_or(REMOTE_IP, |l| l.ip);
        let remote_port = REMOTE_PORT;
        let cgroup_root = cgroup2_root()?;
        let work_dir = std::env::temp_dir().join(format!("hf-{test_name}-{}", random_hex(4)));
        let pods_dir = work_dir.join("pods");
        std::fs::create_dir_all(&pods_dir).map_err(|source| SimError::Io {
            what: format!("cannot create {}", pods_dir.display()),
            source,
        })?;
        // Envoy runs as uid 1337 and reads its config from here.
        set_mode_755(&work_dir)?;
        let remote_ns_name = format!("hf-{test_name}-remote");
        let env = Arc::new(NodeEnv {
            test_name: test_name.to_string(),
            sim_app,
            envoy,
            filter,
            pods_dir,
            work_dir,
            cgroup_root,
            remote_ns: remote_ns_name.clone(),
            remote_ip,
            remote_port,
            restart_backoff: opts.restart_backoff.unwrap_or(Duration::from_secs(10)),
            status_lag: opts.status_lag.unwrap_or_default(),
            cri,
        });
        let mut node = SimNode {
            env,
            shared: Arc::new(Shared::default()),
            node_name: format!("sim-{test_name}"),
            remote_ns: None,
            remote: None,
            remote_lease,
            workers: Vec::new(),
            added: 0,
            indices: BTreeMap::new(),
            uids: Vec::new(),
            host_processes: Vec::new(),
            torn_down: false,
        };
        // From here on, Drop cleans up whatever was created.
        let mut cmd = Command::new(&node.env.sim_app);
        cmd.args(["remote", "--listen", &format!("{remote_ip}:{remote_port}")])
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        let mut child = if node.env.cri.is_some() {
            // The host's netns, where the CNI bridge carries the node's address.
            cmd.arg("--ipv4-only");
            cmd.spawn().map_err(|source| SimError::Io {
                what: "cannot start the remote services".into(),
                source,
            })?
        } else {
            let ns = NetNs::create(&remote_ns_name)?;
            ns.add_bridge()?;
            let file = ns.open()?;
            node.remote_ns = Some(ns);
            spawn_in(&mut cmd, &file, None)?
        };
        let stdout = child.stdout.take();
        node.remote = Some(child);
        // The remote services print one line once they listen.
        let mut line = String::new();
        if let Some(out) = stdout {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        if line.trim() != "ready" {
            return Err(SimError::Setup(format!(
                "remote services did not start (said {line:?}); see stderr above"
            )));
        }
        Ok(node)
    }

    /// The node's test name (`hf-<it>-*` namespaces; the containerd backend labels its
    /// sandboxes with it).
    pub fn test_name(&self) -> &str {
        &self.env.test_name
    }

    /// The node's name (`--node-name` for the agent).
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The pods directory (`--pods-dir` for the agent): one `<namespace>_<name>.json` per pod.
    pub fn pods_dir(&self) -> &Path {
        &self.env.pods_dir
    }

    /// The node's scratch directory (Envoy config, logs, reports per pod).
    pub fn work_dir(&self) -> &Path {
        &self.env.work_dir
    }

    /// The filter module pods load (unless their spec turns it off), if the node has one.
    pub fn filter(&self) -> Option<&Path> {
        self.env.filter.as_deref()
    }

    /// The network namespace name of pod `name` (`/run/netns/<it>`): `hf-<test>-<pod>`, or on
    /// the containerd backend the name CNI gave it (`cni-<uuid>`, once the sandbox runs).
    pub fn netns_name(&self, pod: &str) -> String {
        let cni = self.shared.netns_path(pod).and_then(|p| {
            let in_run_netns = p
                .parent()
                .is_some_and(|d| d == Path::new("/run/netns") || d == Path::new("/var/run/netns"));
            in_run_netns
                .then(|| p.file_name().map(|f| f.to_string_lossy().into_owned()))
                .flatten()
        });
        cni.unwrap_or_else(|| self.env.netns_name(pod))
    }

    /// The backend running this node's pods.
    pub fn runtime(&self) -> Runtime {
        if self.env.cri.is_some() {
            Runtime::Containerd
        } else {
            Runtime::Netns
        }
    }

    /// Runs `f` inside pod `pod`'s network namespace (on a dedicated thread).
    pub fn in_pod_netns<R: Send>(
        &self,
        pod: &str,
        f: impl FnOnce() -> R + Send,
    ) -> Result<R, SimError> {
        let path = self
            .shared
            .netns_path(pod)
            .unwrap_or_else(|| PathBuf::from("/run/netns").join(self.netns_name(pod)));
        netns::run_in(&path, f)
    }

    /// Runs `f` inside the remote services' namespace, where traffic INTO pods comes from.
    pub fn in_remote_netns<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R, SimError> {
        if self.env.cri.is_some() {
            // The containerd backend's remote services live in the host's netns.
            return Ok(f());
        }
        netns::run_in(&PathBuf::from("/run/netns").join(&self.env.remote_ns), f)
    }

    /// One request to pod `pod`'s Envoy admin API (127.0.0.1:15000 in its netns; a Kuma or
    /// Consul pod's: 9901, 19000, or Kuma's Unix socket); returns the body.
    pub fn admin(&self, pod: &str, method: &str, path: &str) -> Result<String, SimError> {
        let mesh = self.pod(pod).map(|v| v.spec.mesh).unwrap_or_default();
        if mesh != super::mesh::Mesh::Istio {
            // The pod's own TCP admin (a dual-stack Consul pod's is on ::1).
            let tcp = self.pod(pod).map(|v| v.spec.admin_addr());
            let addr =
                match mesh.admin_tcp().and(tcp) {
                    Some(a) => super::mesh::AdminAddr::Tcp(a),
                    None => super::mesh::AdminAddr::Unix(self.kuma_admin_socket(pod).ok_or_else(
                        || SimError::Setup(format!("pod {pod}: no kuma-envoy-admin.sock yet")),
                    )?),
                };
            let io = |source| SimError::Io {
                what: format!("pod {pod}: Envoy admin {method} {path}"),
                source,
            };
            let (status, body) = self
                .in_pod_netns(pod, || super::dataplane::admin_call(&addr, method, path))?
                .map_err(io)?;
            if status != 200 {
                return Err(io(std::io::Error::other(format!("HTTP status {status}"))));
            }
            return Ok(body);
        }
        let admin = std::net::SocketAddr::from(([127, 0, 0, 1], super::istio_init::ADMIN_PORT));
        self.in_pod_netns(pod, || {
            super::pilot_agent::admin_request(admin, method, path)
        })?
        .map_err(|source| SimError::Io {
            what: format!("pod {pod}: Envoy admin {method} {path}"),
            source,
        })
    }

    /// A Kuma pod's Envoy admin socket, by its host path: `<pod dir>/kuma-sidecar-tmp/kuma-dp-*/
    /// kuma-envoy-admin.sock` (the sidecar's `/tmp` emptyDir, which kuma-dp and Envoy see on
    /// `/tmp`: [`super::dataplane`]), once kuma-dp made it and Envoy bound it.
    pub fn kuma_admin_socket(&self, pod: &str) -> Option<PathBuf> {
        let tmp = self.env.work_dir.join(pod).join("kuma-sidecar-tmp");
        std::fs::read_dir(tmp)
            .ok()?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("kuma-dp-"))
            .map(|e| e.path().join(super::mesh::KUMA_ADMIN_SOCKET))
            .find(|p| p.exists())
    }

    /// Waits until the pod's Envoy answers `/ready` with `LIVE` (polls every 50 ms).
    pub fn wait_proxy_live(&self, pod: &str, timeout: Duration) -> Result<(), SimError> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.admin(pod, "GET", "/ready") {
                Ok(body) if body.trim() == "LIVE" => return Ok(()),
                Ok(body) => body.trim().to_string(),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(SimError::Timeout {
                    what: format!("pod {pod}: Envoy LIVE"),
                    waited: timeout,
                    last,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The pod's IP.
    pub fn pod_ip(&self, pod: &str) -> Option<Ipv4Addr> {
        self.pod(pod).map(|v| v.pod_ip)
    }

    /// Adds a pod (not started yet). Names must be unique on the node.
    pub fn add_pod(&mut self, spec: PodSpec) -> Result<(), SimError> {
        let dns_label = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        for (what, value) in [("name", &spec.name), ("namespace", &spec.namespace)] {
            if !dns_label(value) {
                return Err(SimError::Setup(format!(
                    "pod {what} {value:?}: use a DNS label (a-z, 0-9, '-', at most 63), as Kubernetes requires"
                )));
            }
        }
        if let Some(why) = spec.conflict() {
            return Err(SimError::Setup(format!("pod {}: {why}", spec.name)));
        }
        if self.env.cri.is_some() {
            if let Some(why) = crate::cri::kubelet::unsupported(&spec) {
                return Err(SimError::Setup(format!(
                    "pod {}: {why} is not implemented on the containerd backend (see docs/containerd-backend.md)",
                    spec.name
                )));
            }
        }
        let mut pods = self.shared.lock();
        if pods.contains_key(&spec.name) {
            return Err(SimError::Setup(format!("pod {} added twice", spec.name)));
        }
        let uid = random_uuid();
        self.uids.push(uid.clone());
        let name = spec.name.clone();
        // hostIP is informational: the node's processes stay in the host's own namespace.
        let view = PodView::new(
            spec,
            uid,
            &self.node_name,
            Ipv4Addr::new(198, 18, 0, 254),
            pod_ip(self.added),
        );
        pods.insert(name.clone(), view);
        self.indices.insert(name, self.added);
        self.added += 1;
        Ok(())
    }

    /// Starts every added pod that has not started yet, all at once (one kubelet worker each).
    pub fn start_pods(&mut self) -> Result<(), SimError> {
        let names: Vec<String> = {
            let pods = self.shared.lock();
            pods.keys()
                .filter(|n| !self.workers.iter().any(|w| &w.name == *n))
                .cloned()
                .collect()
        };
        for name in names {
            let index = self.index_of(&name);
            let (tx, rx) = channel();
            let run: Box<dyn FnOnce() + Send> = match self.env.cri {
                Some(rt) => {
                    let w = crate::cri::kubelet::CriPodWorker::new(
                        name.clone(),
                        self.env.clone(),
                        self.shared.clone(),
                        rx,
                        tx.clone(),
                        rt,
                    );
                    Box::new(move || w.run())
                }
                None => {
                    let w = PodWorker::new(
                        name.clone(),
                        index,
                        self.env.clone(),
                        self.shared.clone(),
                        rx,
                        tx.clone(),
                    );
                    Box::new(move || w.run())
                }
            };
            let join = std::thread::Builder::new()
                .name(format!("kubelet-{name}"))
                .spawn(run)
                .map_err(|source| SimError::Io {
                    what: "cannot start a pod worker thread".into(),
                    source,
                })?;
            self.workers.push(Worker {
                name,
                tx,
                join: Some(join),
            });
        }
        Ok(())
    }

    fn index_of(&self, name: &str) -> usize {
        self.indices.get(name).copied().unwrap_or(0)
    }

    /// Deletes a pod through the "API": deletionTimestamp, SIGTERM, SIGKILL after the grace period.
    pub fn delete_pod(&self, name: &str) -> Result<(), SimError> {
        let w = self
            .workers
            .iter()
            .find(|w| w.name == name)
            .ok_or_else(|| SimError::UnknownPod(name.to_string()))?;
        w.tx.send(PodEvent::Delete)
            .map_err(|_| SimError::Setup(format!("pod {name} is already gone")))
    }

    /// The pod's sandbox dies and the kubelet recreates it: every container killed, a new netns,
    /// init containers and containers again with new ids; the new proxy container starts
    /// `proxy_late` after the app (classic pods; see [`super::kubelet::RestartKind::Sandbox`]).
    pub fn recreate_sandbox(&self, name: &str, proxy_late: Duration) -> Result<(), SimError> {
        self.restart(name, super::kubelet::RestartKind::Sandbox, proxy_late)
    }

    /// The kubelet restarts every container in place (KEP-5532 `RestartAllContainers`): same
    /// sandbox and netns, istio-init runs again, the new proxy container starts `proxy_late`
    /// after the app (classic pods; see [`super::kubelet::RestartKind::InPlace`]).
    pub fn restart_in_place(&self, name: &str, proxy_late: Duration) -> Result<(), SimError> {
        self.restart(name, super::kubelet::RestartKind::InPlace, proxy_late)
    }

    fn restart(
        &self,
        name: &str,
        kind: super::kubelet::RestartKind,
        proxy_late: Duration,
    ) -> Result<(), SimError> {
        let w = self
            .workers
            .iter()
            .find(|w| w.name == name)
            .ok_or_else(|| SimError::UnknownPod(name.to_string()))?;
        w.tx.send(PodEvent::Restart(super::kubelet::Restart {
            kind,
            proxy_late,
        }))
        .map_err(|_| SimError::Setup(format!("pod {name} is already gone")))
    }

    /// The remote services' IPv4 address: what an IPv4 pod's app calls (through its Envoy).
    pub fn remote_addr_v4(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from((REMOTE_IP, self.env.remote_port))
    }

    /// A snapshot of a pod's state.
    pub fn pod(&self, name: &str) -> Option<PodView> {
        self.shared.lock().get(name).cloned()
    }

    /// The phase of a pod.
    pub fn phase(&self, name: &str) -> Option<PodPhase> {
        self.pod(name).map(|p| p.phase())
    }

    /// Waits until `pred` holds for the pod (checked on every change), or fails after `timeout`
    /// with `what` and the pod's last state.
    pub fn wait_for(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&PodView) -> bool,
    ) -> Result<PodView, SimError> {
        let deadline = Instant::now() + timeout;
        let mut pods = self.shared.lock();
        loop {
            let view = pods
                .get(name)
                .ok_or_else(|| SimError::UnknownPod(name.to_string()))?;
            if pred(view) {
                return Ok(view.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(SimError::Timeout {
                    what: format!("pod {name}: {what}"),
                    waited: timeout,
                    last: summary(view),
                });
            }
            pods = self
                .shared
                .changed
                .wait_timeout(pods, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// Waits for a phase.
    pub fn wait_phase(
        &self,
        name: &str,
        phase: PodPhase,
        timeout: Duration,
    ) -> Result<PodView, SimError> {
        self.wait_for(name, timeout, &format!("phase {}", phase.as_str()), |p| {
            p.phase() == phase
        })
    }

    /// The Envoy of `pod`: the child of its pilot-agent (the proxy container's main process),
    /// if it runs.
    pub fn envoy_pid(&self, pod: &str) -> Option<u32> {
        let pilot = self.pod(pod)?.proxy()?.pid?;
        crate::sim::process::children(pilot).first().copied()
    }

    /// SIGKILLs the Envoy of `pod`, as an OOM kill or a crash would end it: pilot-agent exits
    /// with it, and the kubelet stand-in restarts the proxy container (or not, as the kubelet
    /// would). Returns the pid it killed.
    pub fn kill_envoy(&self, pod: &str) -> Result<u32, SimError> {
        let pid = self.envoy_pid(pod).ok_or_else(|| {
            SimError::Setup(format!("pod {pod}: no Envoy runs under its pilot-agent"))
        })?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .map_err(|e| SimError::Setup(format!("pod {pod}: kill Envoy {pid}: {e}")))?;
        Ok(pid)
    }

    /// Runs `cmd` in pod `pod`'s proxy container as `kubectl exec` (and an exec probe) does:
    /// `runc exec` puts the new process in the container's cgroup and namespaces, and its
    /// parent is the runtime's shim, not the container's main process (here: this test
    /// process). Joins the network namespace and cgroup of the proxy container's main process;
    /// the process is SIGKILLed at teardown (and the container's cgroup is killed with the pod).
    /// Returns its pid.
    pub fn exec_in_proxy(&mut self, pod: &str, cmd: Command) -> Result<u32, SimError> {
        let main = self
            .pod(pod)
            .and_then(|v| v.proxy().and_then(|c| c.pid))
            .ok_or_else(|| SimError::Setup(format!("pod {pod}: no running proxy container")))?;
        let io = |what: String| move |source| SimError::Io { what, source };
        let cgroup = std::fs::read_to_string(format!("/proc/{main}/cgroup"))
            .map_err(io(format!("read /proc/{main}/cgroup")))?;
        let rel = cgroup
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .ok_or_else(|| SimError::Setup(format!("pid {main}: no cgroup v2 line")))?;
        let procs = self
            .env
            .cgroup_root
            .join(rel.trim_start_matches('/'))
            .join("cgroup.procs");
        let netns = std::fs::File::open(format!("/proc/{main}/ns/net"))
            .map_err(io(format!("open /proc/{main}/ns/net")))?;
        let mut cmd = cmd;
        let child = super::process::spawn_in(&mut cmd, &netns, Some(&procs))?;
        let pid = child.id();
        self.host_processes.push(child);
        Ok(pid)
    }

    /// A handle that sets pod `pod`'s annotations through the "API" (`kubectl annotate
    /// --overwrite`: the object's next revision, written as the kubelet stand-in writes its
    /// updates), usable from another thread while the node runs.
    pub fn annotator(&self, pod: &str) -> Result<Annotator, SimError> {
        if self.pod(pod).is_none() {
            return Err(SimError::UnknownPod(pod.to_string()));
        }
        Ok(Annotator {
            shared: self.shared.clone(),
            pods_dir: self.env.pods_dir.clone(),
            pod: pod.to_string(),
        })
    }

    /// Waits until the pod has been removed (deleted and every process gone).
    pub fn wait_gone(&self, name: &str, timeout: Duration) -> Result<PodView, SimError> {
        self.wait_for(name, timeout, "removed", |p| p.gone)
    }

    /// Waits until the app container has exited (at least once).
    pub fn wait_app_exited(&self, name: &str, timeout: Duration) -> Result<PodView, SimError> {
        self.wait_for(name, timeout, "app container exited", |p| {
            p.app().is_some_and(|c| c.exit_code().is_some())
        })
    }

    /// Path of the app's report.
    pub fn report_path(&self, name: &str) -> PathBuf {
        self.env.work_dir.join(name).join("app-report.jsonl")
    }

    /// The app's report as it is now.
    pub fn report(&self, name: &str) -> Result<AppReport, SimError> {
        Ok(AppReport::read(&self.report_path(name))?)
    }

    /// Polls the app's report (every 50 ms) until `pred` holds.
    pub fn wait_report(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&AppReport) -> bool,
    ) -> Result<AppReport, SimError> {
        let deadline = Instant::now() + timeout;
        loop {
            let r = self.report(name)?;
            if pred(&r) {
                return Ok(r);
            }
            if Instant::now() >= deadline {
                return Err(SimError::Timeout {
                    what: format!("pod {name} report: {what}"),
                    waited: timeout,
                    last: format!("{} events", r.events.len()),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The node agent's command line for this node: `<holdfast> agent --node-name <node>
    /// --pods-dir <dir>`. Add flags, then start it with [`SimNode::spawn_host_process`] before
    /// [`SimNode::start_pods`] so it sees every pod from its first state.
    pub fn agent_command(&self, holdfast: &Path) -> Command {
        let mut cmd = Command::new(holdfast);
        cmd.arg("agent")
            .arg("--node-name")
            .arg(&self.node_name)
            .arg("--pods-dir")
            .arg(&self.env.pods_dir);
        cmd
    }

    /// Starts a process on the host side of the node (e.g. `holdfast agent --node-name N
    /// --pods-dir DIR`), before or after the pods. The node SIGKILLs it by PID at teardown.
    pub fn spawn_host_process(&mut self, mut cmd: Command) -> Result<u32, SimError> {
        let child = cmd.spawn().map_err(|source| SimError::Io {
            what: format!("cannot start {cmd:?}"),
            source,
        })?;
        let pid = child.id();
        self.host_processes.push(child);
        Ok(pid)
    }

    /// Stops a process started with [`SimNode::spawn_host_process`]: SIGTERM, then SIGKILL if it
    /// is still running after `grace`. Returns its exit status.
    pub fn stop_host_process(
        &mut self,
        pid: u32,
        grace: Duration,
    ) -> Result<std::process::ExitStatus, SimError> {
        let i = self
            .host_processes
            .iter()
            .position(|c| c.id() == pid)
            .ok_or_else(|| {
                SimError::Setup(format!("pid {pid} is not a host process of this node"))
            })?;
        let mut child = self.host_processes.remove(i);
        let io = |source| SimError::Io {
            what: format!("waiting for host process {pid}"),
            source,
        };
        // Not reaped yet (we hold the Child), so the pid cannot have been reused.
        super::process::signal(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        loop {
            if let Some(st) = child.try_wait().map_err(io)? {
                return Ok(st);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                return child.wait().map_err(io);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Tears the node down and returns what is left of it (empty when clean).
    pub fn finish(mut self) -> Vec<String> {
        self.teardown();
        self.leftovers()
    }

    /// What remains of this node on the machine: namespaces, cgroups, processes, pod files.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for ns in netns::list_with_prefix(&format!("hf-{}-", self.env.test_name)) {
            left.push(format!("netns {ns}"));
        }
        for uid in &self.uids {
            for qos in ["", "besteffort"] {
                let cg = self
                    .env
                    .cgroup_root
                    .join("kubepods")
                    .join(qos)
                    .join(format!("pod{uid}"));
                if cg.exists() {
                    left.push(format!("cgroup {}", cg.display()));
                }
            }
        }
        if let Some(rt) = self.env.cri {
            left.extend(
                rt.sandboxes_labelled(crate::cri::kubelet::NODE_LABEL, &self.env.test_name),
            );
            // On a real runtime a pod's first process sits in the pod's cgroup before it joins
            // the pod's netns (runc's `runc init` is placed in the cgroup, then does setns): an
            // agent that takes that moment's netns would act on the node's own. Nothing of the
            // agent may ever be in the host's netns.
            left.extend(crate::cri::host_netns_holdfast_rules());
        }
        left.extend(processes_in_pods(&self.uids));
        let tracked = self.remote.iter().chain(self.host_processes.iter());
        for c in tracked {
            if alive(c.id()) {
                left.push(format!("process {}", c.id()));
            }
        }
        if let Ok(dir) = std::fs::read_dir(&self.env.pods_dir) {
            for e in dir.flatten() {
                left.push(format!("pod file {}", e.path().display()));
            }
        }
        left
    }

    fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        for w in &self.workers {
            let _ = w.tx.send(PodEvent::Shutdown);
        }
        for w in &mut self.workers {
            if let Some(j) = w.join.take() {
                if j.join().is_err() {
                    eprintln!("sim: pod worker {} panicked", w.name);
                }
            }
        }
        for c in self.host_processes.iter_mut().chain(self.remote.iter_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.remote_ns = None;
        self.remote_lease = None;
        if let Some(rt) = self.env.cri {
            // Sandboxes a worker could not remove (it panicked, or the runtime was slow).
            for e in
                rt.remove_sandboxes(Some((crate::cri::kubelet::NODE_LABEL, &self.env.test_name)))
            {
                eprintln!("sim: {e}");
            }
        }
        // Pods that were added but never started have no worker: their files never existed.
        if std::thread::panicking() || std::env::var_os("HOLDFAST_KEEP_SIM").is_some() {
            eprintln!(
                "sim: keeping {} for inspection (logs, Envoy config, reports)",
                self.env.work_dir.display()
            );
            let _ = std::fs::remove_dir_all(&self.env.pods_dir);
        } else {
            let _ = std::fs::remove_dir_all(&self.env.work_dir);
        }
        // `kubepods` is shared with other nodes of this machine; remove it only if empty.
        let _ = std::fs::remove_dir(self.env.cgroup_root.join("kubepods"));
    }
}

impl Drop for SimNode {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Processes whose cgroup names one of the pod uids.
fn processes_in_pods(uids: &[String]) -> Vec<String> {
    let mut left = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return left;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cg) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        if uids.iter().any(|u| cg.contains(&format!("pod{u}"))) && alive(pid) {
            left.push(format!("process {pid} ({})", cg.trim()));
        }
    }
    left
}

/// A pod's phase and container states, for failure messages.
pub fn summary(v: &PodView) -> String {
    let cs: Vec<String> = v
        .containers
        .iter()
        .map(|c| format!("{}={:?}", c.name, c.state))
        .collect();
    format!(
        "phase {} deleting {} gone {} [{}]",
        v.phase().as_str(),
        v.deletion_at.is_some(),
        v.gone,
        cs.join(", ")
    )
}

fn set_mode_755(p: &Path) -> Result<(), SimError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).map_err(|source| {
        SimError::Io {
            what: format!("cannot chmod 0755 {}", p.display()),
            source,
        }
    })
}
