//! A private containerd (Debian's 1.6, CRI plugin built in) under a scratch directory: its own
//! root, state, socket and CNI config, never the machine's `/run/containerd`. Checked by hand in
//! `shared/reference/containerd-cri.md`: `restrict_oom_score_adj = true` is required here (the
//! sandbox asks runc for oom_score_adj -998, which this machine refuses).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ImageSpec, ListPodSandboxRequest, PodSandboxFilter, PullImageRequest, RemovePodSandboxRequest,
    StopPodSandboxRequest, VersionRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

use super::image::build_busybox_image;
use crate::sim::netns::run_output as run;
use crate::sim::{random_hex, SimError};

/// The one image every container runs (busybox; the pause process is its default command).
pub const BASE_IMAGE: &str = "localhost/hf-base:local";
/// The CRI plugin's Kubernetes namespace in containerd.
const CTR_NAMESPACE: &str = "k8s.io";
/// CNI plugins from Debian's containernetworking-plugins.
const CNI_BIN: &str = "/usr/lib/cni";

/// A running private containerd and a CRI client to it. Dropping it removes every pod sandbox
/// (their containers and netns with them), stops containerd by its PID, unmounts what it left
/// and deletes the scratch directory and the CNI bridge.
pub struct Containerd {
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// The CNI bridge in the host netns (its address is the pods' gateway).
    pub bridge: String,
    /// The pods' gateway, on the bridge: where the remote services listen.
    pub gateway: std::net::Ipv4Addr,
    pub rt: tokio::runtime::Runtime,
    pub client: RuntimeServiceClient<Channel>,
    /// The CRI image service (PullImage), on the same connection.
    pub images: ImageServiceClient<Channel>,
    /// The registry on loopback the agent's image is pulled from ([`super::agent_image`]),
    /// started on first use and stopped with the runtime.
    pub registry: std::sync::Mutex<Option<holdfast_image::registry::LocalRegistry>>,
    child: std::sync::Mutex<Option<Daemon>>,
    torn_down: std::sync::atomic::AtomicBool,
    /// Last octets of the remote-service addresses leased to nodes ([`Containerd::lease_remote_ip`]).
    remote_leases: std::sync::Mutex<std::collections::BTreeSet<u8>>,
}

/// The host-local IPAM range of the pods: `.2`–`.199` of the runtime's /24 (`.1` is the gateway).
const POD_RANGE: (u8, u8) = (2, 199);
/// The nodes' remote-service addresses: `.200`–`.254` of the runtime's /24, outside the pods'
/// range, one per node (so each node's cluster DNS can have port 53 of its own address).
const REMOTE_RANGE: (u8, u8) = (200, 254);

/// A remote-service address on the runtime's bridge, held by one simulated node; the address is
/// removed from the bridge when the lease is dropped.
#[derive(Debug)]
pub struct RemoteIpLease {
    pub ip: std::net::Ipv4Addr,
    rt: &'static Containerd,
}

impl Drop for RemoteIpLease {
    fn drop(&mut self) {
        let addr = format!("{}/32", self.ip);
        if let Err(e) = run("ip", &["addr", "del", &addr, "dev", &self.rt.bridge]) {
            eprintln!("cri: cannot remove {addr} from {}: {e}", self.rt.bridge);
        }
        let last = self.ip.octets()[3];
        self.rt
            .remote_leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&last);
    }
}

impl std::fmt::Debug for Containerd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Containerd")
            .field("dir", &self.dir)
            .field("bridge", &self.bridge)
            .finish_non_exhaustive()
    }
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> SimError {
    move |source| SimError::Io { what, source }
}

/// Why the runtime cannot be used here, or `None` when it can.
pub fn missing_pieces() -> Option<String> {
    let mut missing = Vec::new();
    for (bin, pkg) in [
        ("/usr/bin/containerd", "containerd"),
        ("/usr/bin/ctr", "containerd"),
        ("/usr/sbin/runc", "runc"),
        ("/usr/lib/cni/bridge", "containernetworking-plugins"),
        (super::image::BUSYBOX, "busybox-static"),
    ] {
        if !Path::new(bin).exists() {
            missing.push(format!("{bin} ({pkg})"));
        }
    }
    let overlay = std::fs::read_to_string("/proc/filesystems")
        .map(|f| f.lines().any(|l| l.trim_end().ends_with("overlay")))
        .unwrap_or(false);
    if !overlay {
        missing.push("overlayfs in the kernel (modprobe overlay)".into());
    }
    (!missing.is_empty()).then(|| format!("missing {}: run `just setup`", missing.join(", ")))
}

/// The containerd process of a runtime: started by this process, or adopted from a dead test
/// binary ([`Containerd::adopt`]; not our child, so it is watched through `/proc`).
#[derive(Debug)]
enum Daemon {
    Child(Child),
    Adopted(u32),
}

/// A CRI connection: the runtime and image services' clients.
type CriClients = (
    tokio::runtime::Runtime,
    RuntimeServiceClient<Channel>,
    ImageServiceClient<Channel>,
);

/// A tokio runtime and CRI clients connecting (lazily) to `socket`.
fn cri_client(socket: &Path) -> Result<CriClients, SimError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(io("cannot build a tokio runtime".into()))?;
    let sock = socket.to_path_buf();
    // tonic spawns the connection's task on the current runtime.
    let entered = rt.enter();
    let channel = Endpoint::try_from("http://[::]:50051")
        .map_err(|e| SimError::Setup(format!("endpoint: {e}")))?
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let sock = sock.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(sock).await?,
                ))
            }
        }));
    let client = RuntimeServiceClient::new(channel.clone());
    let images = ImageServiceClient::new(channel);
    drop(entered);
    Ok((rt, client, images))
}

/// Starts containerd with `config`, logging to `dir/containerd.log`; its pid goes to
/// `dir/containerd.pid` (for [`Containerd::adopt`]).
fn spawn_containerd(dir: &Path, config: &Path) -> Result<Child, SimError> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("containerd.log"))
        .map_err(io("cannot open containerd.log".into()))?;
    let log2 = log.try_clone().map_err(io("containerd.log".into()))?;
    let child = Command::new("/usr/bin/containerd")
        .arg("--config")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .spawn()
        .map_err(io("cannot start containerd".into()))?;
    if let Err(e) = std::fs::write(dir.join("containerd.pid"), format!("{}\n", child.id())) {
        eprintln!("cri: cannot write containerd.pid: {e}");
    }
    Ok(child)
}

/// Whether `pid` is the containerd serving `config` (its command line names it).
fn is_containerd_of(pid: u32, config: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let want = config.as_os_str().as_encoded_bytes();
    args.first().is_some_and(|a| a.ends_with(b"containerd"))
        && args.contains(&want)
        && crate::sim::process::alive(pid)
}

impl Containerd {
    /// Takes over the runtime in `dir` left by a test binary that died (see [`super::stale`]):
    /// its containerd if it still runs, else a new one on the same config and state (containerd
    /// reconnects to the shims that still run), so [`Containerd::teardown`] can remove its
    /// sandboxes, containers, mounts and bridge as if its owner had.
    pub fn adopt(dir: &Path) -> Result<Containerd, SimError> {
        let socket = dir.join("containerd.sock");
        let cfg_path = dir.join("config.toml");
        let conflist: serde_json::Value = std::fs::read(dir.join("cni/10-hf.conflist"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(serde_json::Value::Null);
        let bridge = conflist
            .pointer("/plugins/0/bridge")
            .and_then(|b| b.as_str())
            .filter(|b| b.starts_with("hfcri"))
            .unwrap_or_default()
            .to_string();
        let gateway = conflist
            .pointer("/plugins/0/ipam/ranges/0/0/gateway")
            .and_then(|g| g.as_str())
            .and_then(|g| g.parse().ok())
            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED);
        let (rt, client, images) = cri_client(&socket)?;
        let running = std::fs::read_to_string(dir.join("containerd.pid"))
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok())
            .filter(|pid| is_containerd_of(*pid, &cfg_path));
        let daemon = match running {
            Some(pid) => Some(Daemon::Adopted(pid)),
            // Its owner died before it started containerd: nothing but files to remove.
            None if !cfg_path.exists() => None,
            None => Some(Daemon::Child(spawn_containerd(dir, &cfg_path)?)),
        };
        let me = Containerd {
            dir: dir.to_path_buf(),
            socket,
            bridge,
            gateway,
            rt,
            client,
            images,
            registry: Default::default(),
            child: std::sync::Mutex::new(daemon),
            torn_down: Default::default(),
            remote_leases: std::sync::Mutex::new(Default::default()),
        };
        if me.child.lock().map(|d| d.is_some()).unwrap_or(false) {
            if let Err(e) = me.wait_ready(Duration::from_secs(10)) {
                // A runtime that cannot come back must not cost every later start 10 s: its
                // files, mounts and bridge go anyway (its sandboxes' netns may stay).
                eprintln!(
                    "cri: {}: containerd does not answer ({e}); removing what it left without it",
                    dir.display()
                );
                let daemon = me.child.lock().ok().and_then(|mut c| c.take());
                match daemon {
                    Some(Daemon::Child(mut c)) => {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                    Some(Daemon::Adopted(pid)) if is_containerd_of(pid, &cfg_path) => {
                        crate::sim::process::signal(pid, nix::sys::signal::Signal::SIGKILL);
                    }
                    _ => {}
                }
            }
        }
        Ok(me)
    }

    /// Starts containerd under a new scratch directory and imports the base image.
    pub fn start(tag: &str) -> Result<Containerd, SimError> {
        if let Some(why) = missing_pieces() {
            return Err(SimError::Setup(why));
        }
        // What killed test binaries left behind (see `stale`), before we add to it.
        for line in super::stale::clean_stale_runtimes() {
            eprintln!("cri: {line}");
        }
        let id = random_hex(3);
        let dir = PathBuf::from(format!("/tmp/hf-cri-{tag}-{id}"));
        let cni = dir.join("cni");
        std::fs::create_dir_all(&cni).map_err(io(format!("cannot create {}", cni.display())))?;
        super::stale::write_owner(&dir).map_err(io(format!("cannot mark {}", dir.display())))?;
        let socket = dir.join("containerd.sock");
        // A private /24 of 198.19.0.0/16 (benchmarking range, RFC 2544) per runtime, and a
        // bridge name of our own, so two runtimes on one machine never share either.
        let octet = 1 + (u8::from_str_radix(&id[..2], 16).unwrap_or(0) % 250);
        let gateway = std::net::Ipv4Addr::new(198, 19, octet, 1);
        let bridge = format!("hfcri{id}");
        let config = format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[debug]
  level = "warn"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{BASE_IMAGE}"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{d}/certs.d"
"#,
            d = dir.display(),
            sock = socket.display(),
            cni = cni.display(),
        );
        let conflist = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": format!("hf-cri-{id}"),
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": bridge,
                    "isGateway": true,
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{
                            "subnet": format!("198.19.{octet}.0/24"),
                            "rangeStart": format!("198.19.{octet}.{}", POD_RANGE.0),
                            "rangeEnd": format!("198.19.{octet}.{}", POD_RANGE.1),
                            "gateway": gateway.to_string(),
                        }]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": dir.join("cni-ipam").to_string_lossy(),
                    },
                },
                {"type": "loopback"},
            ],
        });
        let cfg_path = dir.join("config.toml");
        std::fs::write(&cfg_path, config).map_err(io("cannot write config.toml".into()))?;
        std::fs::write(cni.join("10-hf.conflist"), conflist.to_string())
            .map_err(io("cannot write the CNI config".into()))?;
        let (rt, client, images) = cri_client(&socket)?;
        // Spawned last, right before the guard that stops it exists: nothing can fail between.
        let child = spawn_containerd(&dir, &cfg_path)?;
        let me = Containerd {
            dir,
            socket,
            bridge,
            gateway,
            rt,
            client,
            images,
            registry: Default::default(),
            child: std::sync::Mutex::new(Some(Daemon::Child(child))),
            torn_down: Default::default(),
            remote_leases: std::sync::Mutex::new(Default::default()),
        };
        // From here on, Drop cleans up.
        me.wait_ready(Duration::from_secs(30))?;
        // The bridge is made before CNI (which adopts it) so it can carry the nodes' remote
        // service addresses too ([`Containerd::lease_remote_ip`]). The gateway address goes
        // first: the bridge plugin's `ensureAddr` (containernetworking plugins,
        // main/bridge/bridge.go) accepts a bridge whose addresses match its gateway before any
        // other IPv4 address, and fails on the first one that differs.
        // A fixed (locally administered) MAC, as on the netns backend's bridge: a bridge without
        // one takes the lowest of its ports' and changes it as pods' veths come and go, which
        // left the other pods' neighbour entries for the gateway and the remote services stale
        // and stalled their open connections for seconds (seen here: a pooled call timing out
        // at 2 s while another test's pod was removed; kubernetes/kubernetes#30783,
        // containernetworking/cni#285).
        let mac = format!("02:00:c6:13:{octet:02x}:01");
        run(
            "ip",
            &["link", "add", &me.bridge, "address", &mac, "type", "bridge"],
        )?;
        let gw = format!("{}/24", me.gateway);
        run("ip", &["addr", "add", &gw, "dev", &me.bridge])?;
        run("ip", &["link", "set", &me.bridge, "up"])?;
        let tar = build_busybox_image(&me.dir, BASE_IMAGE, &["/bin/sleep", "2147483647"])?;
        me.ctr(&["images", "import", &tar.to_string_lossy()])?;
        Ok(me)
    }

    /// A remote-service address of its own for one simulated node: an address of the runtime's
    /// /24 outside the pods' IPAM range, added to the CNI bridge in the host's netns, so pods
    /// reach it on-link and every node's services (echo, and the cluster DNS, which must be on
    /// port 53) listen on an address no other node of this runtime uses.
    pub fn lease_remote_ip(&'static self) -> Result<RemoteIpLease, SimError> {
        let last = {
            let mut leases = self.remote_leases.lock().unwrap_or_else(|p| p.into_inner());
            let free = (REMOTE_RANGE.0..=REMOTE_RANGE.1).find(|o| !leases.contains(o));
            let Some(o) = free else {
                return Err(SimError::Setup(format!(
                    "more than {} simulated nodes at once on one containerd",
                    REMOTE_RANGE.1 - REMOTE_RANGE.0 + 1
                )));
            };
            leases.insert(o);
            o
        };
        let g = self.gateway.octets();
        let ip = std::net::Ipv4Addr::new(g[0], g[1], g[2], last);
        let addr = format!("{ip}/32");
        if let Err(e) = run("ip", &["addr", "add", &addr, "dev", &self.bridge]) {
            let mut leases = self.remote_leases.lock().unwrap_or_else(|p| p.into_inner());
            leases.remove(&last);
            return Err(e);
        }
        Ok(RemoteIpLease { ip, rt: self })
    }

    /// Lets the CRI plugin pull from `host` (a registry on loopback) over plain HTTP: a
    /// `hosts.toml` under the plugin's `config_path` (containerd docs/hosts.md), read at each
    /// pull, so a registry started after containerd is usable at once.
    pub fn allow_plain_http(&self, host: &str) -> Result<(), SimError> {
        let dir = self.dir.join("certs.d").join(host);
        std::fs::create_dir_all(&dir).map_err(io(format!("cannot create {}", dir.display())))?;
        let text = format!(
            "server = \"http://{host}\"\n\n[host.\"http://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        );
        std::fs::write(dir.join("hosts.toml"), text)
            .map_err(io(format!("cannot write {}/hosts.toml", dir.display())))
    }

    /// CRI `PullImage`, as the kubelet calls it for an image not present
    /// (`imagePullPolicy: IfNotPresent`); returns the image's id.
    pub fn pull(&self, image: &str) -> Result<String, SimError> {
        let mut c = self.images.clone();
        self.call(c.pull_image(PullImageRequest {
            image: Some(ImageSpec {
                image: image.to_string(),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        }))
        .map(|r| r.image_ref)
        .map_err(|e| SimError::Setup(format!("pulling {image}: {e}")))
    }

    /// `ctr` against this containerd, in the CRI plugin's namespace.
    pub fn ctr(&self, args: &[&str]) -> Result<String, SimError> {
        let sock = self.socket.to_string_lossy().into_owned();
        let mut all = vec!["--address", &sock, "--namespace", CTR_NAMESPACE];
        all.extend_from_slice(args);
        run("/usr/bin/ctr", &all)
    }

    fn wait_ready(&self, timeout: Duration) -> Result<(), SimError> {
        let deadline = Instant::now() + timeout;
        loop {
            let exited = self.child.lock().ok().and_then(|mut c| match c.as_mut() {
                Some(Daemon::Child(c)) => c.try_wait().ok().flatten().map(|st| st.to_string()),
                Some(Daemon::Adopted(pid)) => {
                    (!crate::sim::process::alive(*pid)).then(|| "gone".to_string())
                }
                None => None,
            });
            if let Some(st) = exited {
                return Err(SimError::Setup(format!(
                    "containerd exited ({st}); see {}",
                    self.dir.join("containerd.log").display()
                )));
            }
            let mut c = self.client.clone();
            let v = self.rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(2), c.version(VersionRequest::default()))
                    .await
            });
            match v {
                Ok(Ok(_)) => return Ok(()),
                _ if Instant::now() >= deadline => {
                    return Err(SimError::Timeout {
                        what: "containerd's CRI socket".into(),
                        waited: timeout,
                        last: format!("see {}", self.dir.join("containerd.log").display()),
                    })
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Runs a CRI call on the runtime's executor (from any thread).
    pub fn call<T>(
        &self,
        f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, SimError> {
        self.rt
            .block_on(f)
            .map(tonic::Response::into_inner)
            .map_err(|s| SimError::Setup(format!("CRI: {:?}: {}", s.code(), s.message())))
    }

    /// Stops and removes every pod sandbox whose labels include `key=value` (or all when `None`).
    pub fn remove_sandboxes(&self, label: Option<(&str, &str)>) -> Vec<String> {
        let mut errors = Vec::new();
        let filter = label.map(|(k, v)| PodSandboxFilter {
            label_selector: [(k.to_string(), v.to_string())].into(),
            ..Default::default()
        });
        let mut c = self.client.clone();
        let list = match self.call(c.list_pod_sandbox(ListPodSandboxRequest { filter })) {
            Ok(l) => l.items,
            Err(e) => return vec![e.to_string()],
        };
        for sb in list {
            let mut c = self.client.clone();
            let id = sb.id.clone();
            if let Err(e) = self.call(c.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })) {
                errors.push(format!("stop sandbox {id}: {e}"));
            }
            let mut c = self.client.clone();
            if let Err(e) = self.call(c.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })) {
                errors.push(format!("remove sandbox {id}: {e}"));
            }
            // The pod-level cgroup is the kubelet's to remove (see `remove_pod_cgroups`).
            if let Some(uid) = sb.metadata.as_ref().map(|m| m.uid.as_str()) {
                errors.extend(super::kubelet::remove_pod_cgroups(uid));
            }
        }
        errors
    }

    /// The sandboxes (name and id) labelled `key=value`, as leftover descriptions.
    pub fn sandboxes_labelled(&self, key: &str, value: &str) -> Vec<String> {
        let filter = PodSandboxFilter {
            label_selector: [(key.to_string(), value.to_string())].into(),
            ..Default::default()
        };
        let mut c = self.client.clone();
        match self.call(c.list_pod_sandbox(ListPodSandboxRequest {
            filter: Some(filter),
        })) {
            Ok(l) => l
                .items
                .into_iter()
                .map(|sb| {
                    let name = sb.metadata.map(|m| m.name).unwrap_or_default();
                    format!("sandbox {name} ({})", sb.id)
                })
                .collect(),
            Err(e) => vec![format!("cannot list sandboxes: {e}")],
        }
    }

    /// Tears everything down; returns what could not be removed. Runs once.
    pub fn teardown(&self) -> Vec<String> {
        if self
            .torn_down
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return Vec::new();
        }
        let daemon = self.child.lock().ok().and_then(|mut c| c.take());
        let mut left = Vec::new();
        // The registry the agent's image came from: our child, killed by its pid; one a killed
        // test binary left (this runtime adopted) is found by its config under our directory.
        drop(self.registry.lock().ok().and_then(|mut r| r.take()));
        left.extend(kill_registries_under(&self.dir));
        if daemon.is_some() {
            left.extend(self.remove_sandboxes(None));
            let _ = self.ctr(&["images", "rm", BASE_IMAGE]);
        }
        let cfg_path = self.dir.join("config.toml");
        match daemon {
            Some(Daemon::Child(mut child)) => {
                // Our child, not reaped yet: its PID cannot have been reused.
                crate::sim::process::signal(child.id(), nix::sys::signal::Signal::SIGTERM);
                let deadline = Instant::now() + Duration::from_secs(10);
                while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
            Some(Daemon::Adopted(pid)) => {
                // Not our child: checked to still be that containerd before each signal.
                let deadline = Instant::now() + Duration::from_secs(10);
                let mut sig = nix::sys::signal::Signal::SIGTERM;
                while is_containerd_of(pid, &cfg_path) {
                    crate::sim::process::signal(pid, sig);
                    if Instant::now() >= deadline {
                        sig = nix::sys::signal::Signal::SIGKILL;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    if Instant::now() >= deadline + Duration::from_secs(5) {
                        left.push(format!("containerd {pid}"));
                        break;
                    }
                }
            }
            None => {}
        }
        // Mounts containerd leaves under its root/state (snapshots, sandbox shm) if a shim died.
        if let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") {
            let dir = self.dir.to_string_lossy().into_owned();
            let under = format!("{dir}/");
            let mut points: Vec<&str> = mounts
                .lines()
                .filter_map(|l| l.split(' ').nth(4))
                .filter(|m| *m == dir || m.starts_with(&under))
                .collect();
            points.sort_by_key(|p| std::cmp::Reverse(p.len()));
            for p in points {
                if let Err(e) = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH) {
                    left.push(format!("mount {p}: {e}"));
                }
            }
        }
        if !self.bridge.is_empty() {
            let _ = run("ip", &["link", "del", &self.bridge]);
            if Path::new("/sys/class/net").join(&self.bridge).exists() {
                left.push(format!("bridge {}", self.bridge));
            }
        }
        if std::env::var_os("HOLDFAST_KEEP_SIM").is_none() {
            if let Err(e) = std::fs::remove_dir_all(&self.dir) {
                left.push(format!("{}: {e}", self.dir.display()));
            }
        }
        left
    }
}

/// SIGKILLs every `docker-registry` whose command line names a file under `dir` (a registry
/// started for this runtime by a test binary that was killed before it could stop it); returns
/// those still alive after.
fn kill_registries_under(dir: &Path) -> Vec<String> {
    let under = format!("{}/", dir.display());
    let ours = |pid: u32| -> bool {
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            return false;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        args.first()
            .is_some_and(|a| a.ends_with(holdfast_image::registry::REGISTRY_BINARY))
            && args.iter().any(|a| a.starts_with(&under))
    };
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|pid| ours(*pid))
        .collect();
    let mut left = Vec::new();
    for pid in pids {
        // Checked again right before the signal: the pid still names that registry.
        if ours(pid) {
            crate::sim::process::signal(pid, nix::sys::signal::Signal::SIGKILL);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while ours(pid) && crate::sim::process::alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if ours(pid) && crate::sim::process::alive(pid) {
            left.push(format!("docker-registry {pid}"));
        }
    }
    left
}

impl Drop for Containerd {
    fn drop(&mut self) {
        for l in self.teardown() {
            eprintln!("cri: left after teardown: {l}");
        }
    }
}
