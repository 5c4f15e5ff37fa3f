//! The kubelet stand-in over the CRI: one worker thread per pod drives the private containerd in
//! kubelet's order, the order the sidecar failures depend on (kubelet's `kuberuntime_manager.go`
//! `SyncPod`: sandbox, init containers one at a time, then every regular container started in
//! spec order without waiting for readiness; `killContainersWithSyncResult` stops them all in
//! parallel with the grace period).
//!
//! 1. `RunPodSandbox` with `cgroup_parent = /kubepods/besteffort/pod<uid>` (the cgroupfs driver's
//!    place for a BestEffort pod); the CNI bridge plugin makes the netns and gives the pod IP.
//! 2. `istio-init` as a real init container: `drop: ALL`, `add: NET_ADMIN, NET_RAW`, root, as
//!    Istio injects it; it runs `iptables` (the host's, from the read-only `/usr` bind mount)
//!    inside the pod's netns.
//! 3. The containers in spec order; the proxy container runs the pilot-agent stand-in, which
//!    starts Envoy as uid 1337 in the container's own pid namespace.
//! 4. Exits are seen by polling `ContainerStatus` (containerd 1.6 has no CRI event stream); a
//!    container's `finishedAt` is the moment its init process exited (a pidfd, see
//!    [`super::exit_watch`]) when that is earlier than the runtime's. Restarts create a new
//!    container (attempt + 1) after kubelet's back-off.
//! 5. Deletion: `StopContainer(timeout = grace)` on every container at once (containerd sends
//!    SIGTERM, SIGKILL after the timeout), then `StopPodSandbox` + `RemovePodSandbox`.
//! 6. Restarts of every container of a classic pod (`PodEvent::Restart`, as on the netns
//!    backend): a recreated sandbox (the old one dies, `StopPodSandbox` + `RemovePodSandbox`,
//!    `RunPodSandbox` with attempt + 1: a new netns) or KEP-5532's in-place restart
//!    (`AllContainersRestarting`, `StopContainer(0)` and `RemoveContainer` on every container,
//!    the same sandbox); then init and containers again with new ids (`on_restart`,
//!    `finish_restart`).
//!
//! What the pods see and the agent reads is the same as on the netns backend: the Pod objects in
//! the pods directory (ids `containerd://<64 hex>` from the runtime), processes in
//! `kubepods/besteffort/pod<uid>/<id>`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_cri::v1::{
    Capability, ContainerConfig, ContainerMetadata, ContainerState, ContainerStatusRequest,
    CreateContainerRequest, DnsConfig, ImageSpec, LinuxContainerConfig,
    LinuxContainerSecurityContext, LinuxPodSandboxConfig, Mount, PodSandboxConfig,
    PodSandboxMetadata, PodSandboxState, PodSandboxStatusRequest, RemoveContainerRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StopContainerRequest,
    StopPodSandboxRequest,
};
use k8s_openapi::jiff::Timestamp;

use super::exit_watch::ExitTimes;
use super::runtime::{Containerd, BASE_IMAGE};
use super::status::{info_netns, info_pid, parse_info};
use crate::sim::kubelet::pod_core::PodCore;
use crate::sim::kubelet::{PodEvent, PodWorker, Restart, RestartKind};
use crate::sim::native::{
    record_container_start, record_container_start_error, restarts_due, NativeKubelet,
};
use crate::sim::node::{NodeEnv, Shared};
use crate::sim::pod_object::{now_ts, CState, ContainerView, Terminated};
use crate::sim::SimError;

mod sidecar;

/// Label on every sandbox of a simulated node (leftover checks and teardown select by it).
pub const NODE_LABEL: &str = "holdfast.sim/node";
/// How often running containers' states are polled.
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Init,
    Container(usize),
    /// The native sidecar ([`sidecar`]).
    Sidecar,
}

/// One pod's worker on the containerd backend.
pub(crate) struct CriPodWorker {
    /// What both backends' workers share ([`crate::sim::kubelet::pod_core`]).
    core: PodCore,
    rx: Receiver<PodEvent>,
    rt: &'static Containerd,
    /// The netns backend's worker, used only for what both share: the containers' command
    /// lines and the sidecar's Envoy configuration.
    argv: PodWorker,
    sandbox: Option<(String, PodSandboxConfig)>,
    running: HashMap<String, Slot>,
    attempts: HashMap<usize, u32>,
    restart_at: HashMap<usize, Instant>,
    pod_dir: PathBuf,
    /// When each container's init process exited (pidfd), more exact than the runtime's time.
    exits: ExitTimes,
    /// Set when the pod is being deleted or torn down: the baselines' pollers stop.
    stopping: Arc<AtomicBool>,
    /// `serial_start`: the proxy's postStart hook has returned ...
    post_started: Arc<AtomicBool>,
    /// ... and the other containers wait for it.
    serial_pending: bool,
    /// The sandbox's netns (from its verbose status).
    netns_path: Option<PathBuf>,
    /// The worker's own events (probe results, hook ends) come back through the node's channel.
    tx: Sender<PodEvent>,
    /// Container starts of the native sidecar so far (its CRI `attempt`).
    sidecar_attempts: u32,
    /// Starts of the injected init container so far (its CRI `attempt`).
    init_attempts: u32,
    /// The sandbox's `PodSandboxMetadata.attempt`: + 1 for each recreation.
    sandbox_attempt: u32,
}

/// With `HOLDFAST_SIM_TRACE` set, prints one line per runtime step (wall clock in ms, the pod,
/// the step, how long the CRI call took): where a pod's time goes on this backend.
fn trace(pod: &str, step: &str, took: Option<Duration>) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*ON.get_or_init(|| std::env::var_os("HOLDFAST_SIM_TRACE").is_some()) {
        return;
    }
    let now = crate::sim::report::now_ms();
    match took {
        Some(d) => eprintln!(
            "cri-trace {now} {pod} {step} took {:.1} ms",
            d.as_secs_f64() * 1e3
        ),
        None => eprintln!("cri-trace {now} {pod} {step}"),
    }
}

fn ts(nanos: i64) -> Timestamp {
    Timestamp::from_nanosecond(i128::from(nanos)).unwrap_or_else(|_| now_ts())
}

impl CriPodWorker {
    pub(crate) fn new(
        name: String,
        env: Arc<NodeEnv>,
        shared: Arc<Shared>,
        rx: Receiver<PodEvent>,
        tx: Sender<PodEvent>,
        rt: &'static Containerd,
    ) -> CriPodWorker {
        let (unused_tx, unused_rx) = std::sync::mpsc::channel();
        let argv = PodWorker::new(
            name.clone(),
            0,
            env.clone(),
            shared.clone(),
            unused_rx,
            unused_tx,
        );
        let pod_dir = env.work_dir.join(&name);
        CriPodWorker {
            core: PodCore::new(name, env, shared),
            rx,
            rt,
            argv,
            sandbox: None,
            running: HashMap::new(),
            attempts: HashMap::new(),
            restart_at: HashMap::new(),
            pod_dir,
            exits: ExitTimes::default(),
            stopping: Arc::new(AtomicBool::new(false)),
            post_started: Arc::new(AtomicBool::new(false)),
            serial_pending: false,
            netns_path: None,
            tx,
            sidecar_attempts: 0,
            init_attempts: 0,
            sandbox_attempt: 0,
        }
    }

    /// Runs the pod until it is deleted (or the node shuts down), then removes its sandbox.
    pub(crate) fn run(mut self) {
        self.core.scheduled();
        let setup = self.start_sandbox_and_init();
        self.core.started(setup);
        self.start_prober();
        loop {
            if self.core.pod_stopping() && self.running.is_empty() {
                break;
            }
            let next = self
                .restart_at
                .values()
                .copied()
                .chain(self.native_deadline())
                .min();
            let wait = next.map_or(POLL, |t| {
                t.saturating_duration_since(Instant::now()).min(POLL)
            });
            match self.rx.recv_timeout(wait) {
                Ok(PodEvent::Delete) => self.on_delete(),
                Ok(PodEvent::Shutdown) | Err(RecvTimeoutError::Disconnected) => self.on_shutdown(),
                Ok(PodEvent::Probe(r)) => self.on_probe(r),
                Ok(PodEvent::HookDone { .. }) => self.hook_returned(),
                Ok(PodEvent::Restart(r)) => self.on_restart(r),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {}
            }
            self.poll_exits();
            self.finish_restart();
            self.restart_due();
            self.native_timers(Instant::now());
            if self.serial_pending && self.post_started.load(Ordering::SeqCst) {
                self.serial_pending = false;
                if !self.core.deleting && !self.core.shutting_down {
                    // The proxy's postStart hook returned: every container not started yet.
                    for i in 0..self.core.view(|v| v.containers.len()) {
                        if self.core.view(|v| v.containers[i].id.is_none()) {
                            self.start_container(i);
                        }
                    }
                }
            }
        }
        if let Some(p) = &self.core.probe {
            p.stop();
        }
        self.remove_sandbox();
        trace(&self.core.name, "gone", None);
        self.core.gone();
    }

    fn start_sandbox_and_init(&mut self) -> Result<(), SimError> {
        self.start_sandbox()?;
        self.start_init()
    }

    /// `RunPodSandbox` (attempt `sandbox_attempt`): the pod's netns from CNI, its IP.
    fn start_sandbox(&mut self) -> Result<(), SimError> {
        let (uid, name, namespace) = self
            .core
            .view(|v| (v.uid.clone(), v.spec.name.clone(), v.spec.namespace.clone()));
        std::fs::create_dir_all(&self.pod_dir).map_err(|source| SimError::Io {
            what: format!("cannot create {}", self.pod_dir.display()),
            source,
        })?;
        let config_namespace = namespace.clone();
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name,
                uid: uid.clone(),
                namespace,
                attempt: self.sandbox_attempt,
            }),
            hostname: self.core.name.clone(),
            log_directory: self.pod_dir.to_string_lossy().into_owned(),
            labels: [(NODE_LABEL.to_string(), self.core.env.test_name.clone())].into(),
            // The resolv.conf kubelet asks for with `dnsPolicy: ClusterFirst` (kubelet
            // `pkg/kubelet/network/dns/dns.go`, `GetPodDNS`): the cluster DNS (here the node's
            // remote-services address), the namespace's search list, ndots:5.
            dns_config: Some(DnsConfig {
                servers: vec![self.core.env.remote_ip.to_string()],
                searches: vec![
                    format!("{}.svc.cluster.local", config_namespace),
                    "svc.cluster.local".into(),
                    "cluster.local".into(),
                ],
                options: vec!["ndots:5".into()],
            }),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: format!("/kubepods/besteffort/pod{uid}"),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut c = self.rt.client.clone();
        let t = Instant::now();
        let id = self
            .rt
            .call(c.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            }))?
            .pod_sandbox_id;
        trace(&self.core.name, "RunPodSandbox", Some(t.elapsed()));
        set_node_allocatable_cpu();
        self.sandbox = Some((id.clone(), config));
        let st = self.rt.call(c.pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: id,
            verbose: true,
        }))?;
        let ip = st.status.and_then(|s| s.network).map(|n| n.ip);
        let info = parse_info(&st.info);
        let pid = info_pid(&info);
        if let Some(path) = info_netns(&info) {
            self.core
                .shared
                .set_netns_path(&self.core.name, path.clone());
            self.netns_path = Some(path);
        }
        let pod_ip = ip.as_deref().and_then(|s| s.parse().ok()).ok_or_else(|| {
            SimError::Setup(format!("the sandbox has no IPv4 pod IP (CNI said {ip:?})"))
        })?;
        self.core.update(|v| {
            v.pod_ip = pod_ip;
            v.sandbox_ready = true;
            v.sandbox_pid = pid;
            v.start_time = Some(now_ts());
        });

        if self.core.view(|v| v.spec.drop_until_ready) {
            let path = self.shared_netns_path()?;
            let admin = self.core.view(|v| v.spec.admin_addr());
            super::baselines::drop_until_ready(
                &self.core.name,
                &path,
                admin,
                self.stopping.clone(),
            )?;
        }
        Ok(())
    }

    /// The injected init container (istio-init, or the other meshes' init), a new attempt each
    /// time (kubelet names a container `<name>_<sandbox>_<namespace>_<uid>_<attempt>`).
    fn start_init(&mut self) -> Result<(), SimError> {
        let (min_ms, mesh) = self
            .core
            .view(|v| (v.spec.init_duration.as_millis().to_string(), v.spec.mesh));
        let init_name = mesh.init_container();
        let args = if mesh == crate::sim::Mesh::Istio {
            vec!["istio-init".to_string(), "--min-duration-ms".into(), min_ms]
        } else {
            // kuma-init / consul-connect-inject-init (crate::sim::mesh): as Istio's, root with
            // NET_ADMIN and NET_RAW (Consul's runs as 5996 with the same capabilities).
            vec![
                "mesh-init".to_string(),
                "--mesh".into(),
                mesh.to_string(),
                "--min-duration-ms".into(),
                min_ms,
            ]
        };
        // Istio's injected istio-init: root, drop ALL, add NET_ADMIN and NET_RAW.
        let caps = Capability {
            add_capabilities: vec!["NET_ADMIN".into(), "NET_RAW".into()],
            drop_capabilities: vec!["ALL".into()],
            ..Default::default()
        };
        let attempt = self.init_attempts;
        self.init_attempts += 1;
        let (cid, pid) = self.create_and_start(init_name, attempt, args, Some(caps))?;
        self.running.insert(cid.clone(), Slot::Init);
        self.core.update(|v| {
            let mut c = ContainerView::new(init_name, mesh.init_image(), "");
            c.id = Some(cid);
            c.pid = pid;
            c.state = CState::Running {
                started_at: now_ts(),
            };
            v.init = Some(c);
        });
        Ok(())
    }

    /// The sandbox's netns path (set once the sandbox runs).
    fn shared_netns_path(&self) -> Result<PathBuf, SimError> {
        self.sandbox
            .as_ref()
            .and(self.netns_path.clone())
            .ok_or_else(|| SimError::Setup(format!("pod {}: no sandbox netns", self.core.name)))
    }

    /// The read-only host paths every container gets at the same path: `/usr` (glibc, iptables,
    /// everything the host binaries link), Debian's alternatives (`iptables` is a link through
    /// `/etc/alternatives`), `sim-app`, Envoy, the filter; and the pod's directory read-write
    /// (reports, Envoy config, logs).
    fn mounts(&self) -> Vec<Mount> {
        let mut ro: Vec<&Path> = vec![
            Path::new("/usr"),
            Path::new("/etc/alternatives"),
            &self.core.env.sim_app,
            &self.core.env.envoy,
        ];
        if let Some(f) = &self.core.env.filter {
            ro.push(f);
        }
        let mount = |p: &Path, readonly: bool| Mount {
            container_path: p.to_string_lossy().into_owned(),
            host_path: p.to_string_lossy().into_owned(),
            readonly,
            ..Default::default()
        };
        let mut all: Vec<Mount> = ro.into_iter().map(|p| mount(p, true)).collect();
        all.push(mount(&self.pod_dir, false));
        all
    }

    /// The container's own mounts beyond [`Self::mounts`]: Kuma's sidecar gets its
    /// `kuma-sidecar-tmp` emptyDir on `/tmp`, as the injector mounts it (kuma-dp makes its
    /// workdir and Envoy's admin socket there).
    fn own_mounts(&self, name: &str) -> Vec<Mount> {
        let kuma = self
            .core
            .view(|v| matches!(v.spec.mesh, crate::sim::Mesh::Kuma(_)));
        if !kuma || name != crate::sim::Mesh::Kuma(crate::sim::KumaAdmin::Tcp).proxy_container() {
            return Vec::new();
        }
        vec![Mount {
            container_path: "/tmp".into(),
            host_path: self
                .pod_dir
                .join(crate::sim::kubelet::KUMA_SIDECAR_TMP)
                .to_string_lossy()
                .into_owned(),
            readonly: false,
            ..Default::default()
        }]
    }

    /// CreateContainer + StartContainer; returns the container id and its pid (on the host).
    fn create_and_start(
        &self,
        name: &str,
        attempt: u32,
        args: Vec<String>,
        caps: Option<Capability>,
    ) -> Result<(String, Option<u32>), SimError> {
        let Some((sandbox_id, sandbox_config)) = self.sandbox.clone() else {
            return Err(SimError::Setup("no sandbox".into()));
        };
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: name.to_string(),
                attempt,
            }),
            image: Some(ImageSpec {
                image: BASE_IMAGE.into(),
                ..Default::default()
            }),
            command: vec![self.core.env.sim_app.to_string_lossy().into_owned()],
            args,
            working_dir: self.pod_dir.to_string_lossy().into_owned(),
            mounts: {
                let mut m = self.mounts();
                m.extend(self.own_mounts(name));
                m
            },
            // kubelet's layout under the sandbox's log directory: <container>/<attempt>.log.
            log_path: format!("{name}/{attempt}.log"),
            linux: Some(LinuxContainerConfig {
                security_context: Some(LinuxContainerSecurityContext {
                    capabilities: caps,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut c = self.rt.client.clone();
        let t = Instant::now();
        let cid = self
            .rt
            .call(c.create_container(CreateContainerRequest {
                pod_sandbox_id: sandbox_id,
                config: Some(config),
                sandbox_config: Some(sandbox_config),
            }))?
            .container_id;
        trace(
            &self.core.name,
            &format!("CreateContainer {name}"),
            Some(t.elapsed()),
        );
        let t = Instant::now();
        self.rt.call(c.start_container(StartContainerRequest {
            container_id: cid.clone(),
        }))?;
        trace(
            &self.core.name,
            &format!("StartContainer {name}"),
            Some(t.elapsed()),
        );
        let st = self.rt.call(c.container_status(ContainerStatusRequest {
            container_id: cid.clone(),
            verbose: true,
        }))?;
        let pid = info_pid(&parse_info(&st.info));
        if let Some(pid) = pid {
            self.exits.watch(&cid, pid);
        }
        Ok((cid, pid))
    }

    fn start_container(&mut self, i: usize) {
        let (name, restarting) = self.core.view(|v| {
            let c = &v.containers[i];
            (c.name.clone(), c.id.is_some())
        });
        let is_proxy = self.core.view(|v| name == v.spec.proxy_container());
        if is_proxy && !restarting {
            if let Err(e) = self.argv.write_sidecar_config() {
                eprintln!("sim: pod {}: {e}", self.core.name);
            }
        }
        let attempt = *self.attempts.entry(i).and_modify(|a| *a += 1).or_insert(0);
        let args = self.argv.container_args(i);
        match self.create_and_start(&name, attempt, args, None) {
            Ok((cid, pid)) => {
                self.running.insert(cid.clone(), Slot::Container(i));
                if self
                    .core
                    .update(|v| record_container_start(v, i, &cid, pid, restarting))
                {
                    self.probe_running(&cid);
                }
            }
            Err(e) => {
                eprintln!("sim: pod {}: cannot start {name}: {e}", self.core.name);
                self.core.update(|v| record_container_start_error(v, i, &e));
            }
        }
    }

    /// Reads the state of every running container; handles the ones that exited.
    fn poll_exits(&mut self) {
        let ids: Vec<(String, Slot)> = self.running.iter().map(|(k, v)| (k.clone(), *v)).collect();
        for (cid, slot) in ids {
            let mut c = self.rt.client.clone();
            let st = match self.rt.call(c.container_status(ContainerStatusRequest {
                container_id: cid.clone(),
                verbose: false,
            })) {
                Ok(r) => r.status,
                Err(e) => {
                    eprintln!("sim: pod {}: ContainerStatus {cid}: {e}", self.core.name);
                    None
                }
            };
            let Some(st) = st else { continue };
            if st.state() != ContainerState::ContainerExited {
                continue;
            }
            self.running.remove(&cid);
            let runtime_at = ts(st.finished_at);
            // Both the shim's stamp and the pidfd watcher's are taken after the exit, each
            // once its observer got the CPU: the earlier one is the closer (see `exit_watch`).
            let exited_at = self
                .exits
                .take(&cid)
                .and_then(|t| Timestamp::try_from(t).ok())
                .map_or(runtime_at, |t| t.min(runtime_at));
            let ms =
                |a: Timestamp, b: Timestamp| (a.as_nanosecond() - b.as_nanosecond()) as f64 / 1e6;
            trace(
                &self.core.name,
                &format!(
                    "exit of {slot:?} seen {:.1} ms after the process exited; finishedAt {:.1} ms after",
                    ms(now_ts(), exited_at),
                    ms(runtime_at, exited_at)
                ),
                None,
            );
            let t = Terminated {
                container_id: cid,
                exit_code: st.exit_code,
                // The CRI reports no signal; kubelet leaves `signal` unset too.
                signal: None,
                reason: st.reason,
                started_at: ts(st.started_at),
                finished_at: exited_at,
            };
            self.on_exit(slot, t);
        }
    }

    fn on_exit(&mut self, slot: Slot, t: Terminated) {
        if self.core.restart.is_some() {
            // Killed by the restart: terminated, not restarted on its own (`finish_restart`
            // starts the pod again).
            let probed = self.core.update(|v| {
                let c = match slot {
                    Slot::Init => v.init.as_mut(),
                    Slot::Container(i) => v.containers.get_mut(i),
                    Slot::Sidecar => v.sidecar.as_mut(),
                };
                let probed = c.as_ref().is_some_and(|c| c.probed.is_some());
                if let Some(c) = c {
                    c.state = CState::Terminated(t);
                    c.pid = None;
                }
                probed
            });
            if probed {
                self.probe_stopped();
            }
            return;
        }
        match slot {
            Slot::Init => {
                let ok = t.exit_code == 0;
                let code = t.exit_code;
                self.core.update(|v| {
                    if let Some(c) = v.init.as_mut() {
                        c.state = CState::Terminated(t);
                        c.pid = None;
                    }
                    if !ok {
                        v.failed_reason = Some(format!("Init:Error (exit {code})"));
                    }
                });
                if ok && !self.core.deleting && !self.core.shutting_down && self.core.is_native() {
                    // The next init container: the sidecar; the app once its startup probe
                    // passed (`on_probe`).
                    self.start_sidecar();
                    return;
                }
                if ok && !self.core.deleting && !self.core.shutting_down {
                    let proxy = self.core.view(|v| {
                        v.containers
                            .iter()
                            .position(|c| c.name == v.spec.proxy_container())
                    });
                    if let (true, Some(p)) = (self.core.view(|v| v.spec.serial_start), proxy) {
                        // holdApplicationUntilProxyStarts: the proxy first; its postStart hook
                        // holds back the others (see `baselines`).
                        self.start_container(p);
                        self.serial_pending = true;
                        match self.shared_netns_path() {
                            Ok(path) => super::baselines::post_start_wait(
                                &self.core.name,
                                path,
                                self.core.view(|v| v.spec.admin_addr()),
                                self.stopping.clone(),
                                self.post_started.clone(),
                            ),
                            Err(e) => {
                                eprintln!(
                                    "sim: pod {}: {e}; starting the app anyway",
                                    self.core.name
                                );
                                self.post_started.store(true, Ordering::SeqCst);
                            }
                        }
                        return;
                    }
                    self.start_regular_containers();
                }
            }
            Slot::Container(i) => {
                let deleting = self.core.deleting || self.core.shutting_down;
                let base = self.core.env.restart_backoff;
                let (backoff, probed) = self.core.update(|v| {
                    let probed = v.containers[i].probed.is_some();
                    (v.container_exited(i, t, deleting, base), probed)
                });
                if probed {
                    self.probe_stopped();
                }
                if let Some(b) = backoff {
                    self.restart_at.insert(i, Instant::now() + b);
                }
                if self.core.is_native() {
                    self.after_regular_exit();
                }
            }
            Slot::Sidecar => self.on_sidecar_exit(t),
        }
    }

    /// Starts the regular containers in spec order, without waiting for readiness.
    fn start_regular_containers(&mut self) {
        let delay = self.core.view(|v| v.spec.app_start_delay);
        let proxy_late = self.core.proxy_late.take().filter(|d| !d.is_zero());
        // Spec order: Kuma's injector puts its classic sidecar first.
        let mut order: Vec<usize> = (0..self.core.view(|v| v.containers.len())).collect();
        if self
            .core
            .view(|v| matches!(v.spec.mesh, crate::sim::Mesh::Kuma(_)))
        {
            order.reverse();
        }
        for i in order {
            let is_proxy = self
                .core
                .view(|v| v.containers[i].name == v.spec.proxy_container());
            if let (true, Some(late)) = (is_proxy, proxy_late) {
                // After a restart of every container: the new Envoy comes late (as on the
                // netns backend; the restart timer starts it).
                self.restart_at.insert(i, Instant::now() + late);
            } else if !is_proxy && !delay.is_zero() {
                // A slow image pull: the app container starts later (the restart
                // timer starts it), as on the netns backend.
                self.restart_at.insert(i, Instant::now() + delay);
            } else {
                self.start_container(i);
            }
        }
    }

    fn restart_due(&mut self) {
        for i in restarts_due(&mut self.restart_at, Instant::now()) {
            if !self.core.deleting && !self.core.shutting_down {
                self.start_container(i);
            }
        }
    }

    /// `StopContainer` on every running container at once, each on its own thread (as kubelet
    /// kills containers in parallel goroutines); the CRI timeout is whole seconds.
    fn stop_all(&self, grace: Duration) {
        let timeout = grace.as_secs() + u64::from(grace.subsec_nanos() > 0);
        for cid in self.running.keys() {
            let (rt, cid) = (self.rt, cid.clone());
            let name = self.core.name.clone();
            std::thread::spawn(move || {
                let mut c = rt.client.clone();
                let t = Instant::now();
                if let Err(e) = rt.call(c.stop_container(StopContainerRequest {
                    container_id: cid.clone(),
                    timeout: timeout as i64,
                })) {
                    eprintln!("sim: pod {name}: StopContainer {cid}: {e}");
                }
                trace(
                    &name,
                    &format!("StopContainer {}", &cid[..12.min(cid.len())]),
                    Some(t.elapsed()),
                );
            });
        }
    }

    fn on_delete(&mut self) {
        if self.core.deleting {
            return;
        }
        self.core.deleting = true;
        self.stopping.store(true, Ordering::SeqCst);
        trace(&self.core.name, "deleted", None);
        self.restart_at.clear();
        let grace = self.core.view(|v| v.spec.grace);
        self.core.update(|v| {
            let due = now_ts().as_nanosecond() + grace.as_nanos() as i128;
            v.deletion_at = Some(Timestamp::from_nanosecond(due).unwrap_or_else(|_| now_ts()));
            for c in v.containers.iter_mut().chain(v.sidecar.iter_mut()) {
                if let (CState::Waiting { .. }, Some(last)) = (&c.state, &c.last) {
                    c.state = CState::Terminated(last.clone());
                }
            }
        });
        if self.core.is_native() {
            self.on_native_delete();
            return;
        }
        self.stop_all(grace);
    }

    fn on_shutdown(&mut self) {
        if self.core.shutting_down {
            return;
        }
        self.core.shutting_down = true;
        self.stopping.store(true, Ordering::SeqCst);
        self.restart_at.clear();
        if let Some(p) = &self.core.probe {
            p.stop();
        }
        self.stop_all(Duration::ZERO);
    }

    /// The kubelet restarts every container ([`Restart`]), as on the netns backend
    /// ([`crate::sim::kubelet::RestartKind`]), over the CRI:
    ///
    /// - A recreated sandbox: first the sandbox dies as a node or runtime failure leaves it —
    ///   its pause process and every container's init process SIGKILLed (the containers' own pid
    ///   namespaces go with them). The runtime then reports the sandbox not ready, and
    ///   [`Self::finish_restart`] does what kubelet's `SyncPod` does for a changed sandbox.
    /// - In place (KEP-5532 `RestartAllContainers`): the condition `AllContainersRestarting`
    ///   True, then `StopContainer` with no grace on every running container, in parallel:
    ///   kubelet's `SyncPod` kills the `containersToReset` with a grace-period override of 0
    ///   (the KEP: "Termination grace periods are not respected", preStop hooks best effort).
    fn on_restart(&mut self, r: Restart) {
        if !self.core.begin_restart(r) {
            return;
        }
        trace(&self.core.name, &format!("restart {:?}", r.kind), None);
        self.restart_at.clear();
        self.serial_pending = false;
        self.post_started.store(false, Ordering::SeqCst);
        match r.kind {
            RestartKind::Sandbox => {
                let pids: Vec<u32> = self.core.view(|v| {
                    v.sandbox_pid
                        .into_iter()
                        .chain(v.containers.iter().filter_map(|c| c.pid))
                        .collect()
                });
                for pid in pids {
                    if let Err(e) = sigkill(pid) {
                        eprintln!("sim: pod {}: cannot kill {pid}: {e}", self.core.name);
                    }
                }
            }
            RestartKind::InPlace => {
                self.core
                    .update(|v| v.all_containers_restarting = Some(true));
                self.stop_all(Duration::ZERO);
            }
        }
    }

    /// Once the restart's old containers have all exited, kubelet's next `SyncPod`
    /// (kubernetes/kubernetes pkg/kubelet/kuberuntime/kuberuntime_manager.go):
    ///
    /// - A recreated sandbox, once `PodSandboxStatus` says it is not ready (`computePodActions`:
    ///   `PodSandboxChanged` → `KillPod` and `CreateSandbox` with attempt + 1): `StopPodSandbox`
    ///   (CNI DEL, the netns goes) and `RemovePodSandbox` of the old one (kubelet's container
    ///   GC removes it later; at once here, nothing reads it), then `RunPodSandbox` (a new netns
    ///   and IP), the init container again, the containers with new ids and restartCount + 1.
    /// - In place: `RemoveContainer` on every container of the pod (the KEP's
    ///   `AllContainersRestartCleanedUp`: "Remove all init and regular containers from
    ///   container runtime"), the condition back to False, then the normal startup in the same
    ///   sandbox: init container, containers (new ids, restartCount + 1).
    ///
    /// The new proxy container starts `proxy_late` after the app (`start_regular_containers`).
    fn finish_restart(&mut self) {
        let Some(r) = self.core.restart else { return };
        if self.core.deleting || self.core.shutting_down {
            self.core.restart = None;
            return;
        }
        if !self.running.is_empty() {
            return;
        }
        let started = match r.kind {
            RestartKind::Sandbox => {
                if self.sandbox_ready_in_runtime() {
                    // kubelet acts on what the runtime reports: not yet (its event loop).
                    return;
                }
                self.core.restart = None;
                self.core.proxy_late = Some(r.proxy_late);
                if let Some(p) = self.core.probe.take() {
                    // The prober probes the pod IP, which the new sandbox changes.
                    p.stop();
                }
                self.stop_and_remove_sandbox();
                self.core.update(|v| {
                    v.sandbox_ready = false;
                    v.sandbox_pid = None;
                });
                self.sandbox_attempt += 1;
                let started = self.start_sandbox().and_then(|()| {
                    // The proxy's bootstrap names the pod IP (its node id), as pilot-agent's
                    // does from INSTANCE_IP.
                    self.argv.write_sidecar_config()?;
                    self.start_init()
                });
                self.start_prober();
                started
            }
            RestartKind::InPlace => {
                self.core.restart = None;
                self.core.proxy_late = Some(r.proxy_late);
                let ids: Vec<String> = self.core.view(|v| {
                    v.init
                        .iter()
                        .chain(v.containers.iter())
                        .filter_map(|c| c.id.clone())
                        .collect()
                });
                let mut c = self.rt.client.clone();
                for id in ids {
                    if let Err(e) = self.rt.call(c.remove_container(RemoveContainerRequest {
                        container_id: id.clone(),
                    })) {
                        eprintln!("sim: pod {}: RemoveContainer {id}: {e}", self.core.name);
                    }
                }
                self.core
                    .update(|v| v.all_containers_restarting = Some(false));
                self.start_init()
            }
        };
        trace(&self.core.name, &format!("restarted {:?}", r.kind), None);
        if let Err(e) = started {
            eprintln!("sim: pod {}: restart: {e}", self.core.name);
            let reason = e.to_string();
            self.core.update(|v| v.failed_reason = Some(reason));
        }
    }

    /// Whether the runtime still reports the pod's sandbox ready (false once it is not, or
    /// when it cannot say).
    fn sandbox_ready_in_runtime(&self) -> bool {
        let Some((id, _)) = &self.sandbox else {
            return false;
        };
        let mut c = self.rt.client.clone();
        self.rt
            .call(c.pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: false,
            }))
            .ok()
            .and_then(|r| r.status)
            .is_some_and(|s| s.state() == PodSandboxState::SandboxReady)
    }

    fn remove_sandbox(&mut self) {
        self.stop_and_remove_sandbox();
        self.core.update(|v| v.sandbox_pid = None);
        let uid = self.core.view(|v| v.uid.clone());
        for e in remove_pod_cgroups(&uid) {
            eprintln!("sim: pod {}: {e}", self.core.name);
        }
    }

    /// `StopPodSandbox` (CNI DEL, the netns removed) and `RemovePodSandbox` (its containers
    /// too); the pod's cgroup stays (kubelet's, see [`remove_pod_cgroups`]).
    fn stop_and_remove_sandbox(&mut self) {
        if let Some((id, _)) = self.sandbox.take() {
            let mut c = self.rt.client.clone();
            let t = Instant::now();
            if let Err(e) = self.rt.call(c.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })) {
                eprintln!("sim: pod {}: StopPodSandbox: {e}", self.core.name);
            }
            trace(&self.core.name, "StopPodSandbox", Some(t.elapsed()));
            let t = Instant::now();
            if let Err(e) = self
                .rt
                .call(c.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id }))
            {
                eprintln!("sim: pod {}: RemovePodSandbox: {e}", self.core.name);
            }
            trace(&self.core.name, "RemovePodSandbox", Some(t.elapsed()));
        }
        self.netns_path = None;
    }
}

/// SIGKILL to `pid` through a pidfd (a pid reused between the look-up and the signal is not hit
/// once the pidfd is open).
fn sigkill(pid: u32) -> std::io::Result<()> {
    use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| std::io::Error::other(format!("not a pid: {pid}")))?;
    let fd = pidfd_open(pid, PidfdFlags::empty())?;
    pidfd_send_signal(&fd, Signal::KILL)?;
    Ok(())
}

/// Gives the `kubepods` cgroup the CPU weight kubelet gives it: the node's allocatable CPU as
/// shares (kubelet `pkg/kubelet/cm/node_container_manager_linux.go`, `getCgroupConfig`:
/// `MilliCPUToShares(allocatable)`, 1024 per core; "the default limits for cpu shares can be very
/// low which can lead to CPU starvation for pods"). runc creates `kubepods` with the default
/// 1024, one core's weight for every pod of the node together against each busy process outside
/// it; on this shared machine that slowed the containers' Envoys (docs/containerd-backend.md).
/// Set after every sandbox because `kubepods` goes when its last pod does. Best effort: v1
/// `cpu.shares`, or v2 `cpu.weight` converted as kubelet converts it.
fn set_node_allocatable_cpu() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let shares = (cores * 1024).clamp(2, 262_144);
    let weight = 1 + ((shares - 2) * 9999) / 262_142;
    for (file, value) in [
        ("/sys/fs/cgroup/cpu/kubepods/cpu.shares", shares),
        ("/sys/fs/cgroup/kubepods/cpu.weight", weight),
    ] {
        if Path::new(file).exists() {
            if let Err(e) = std::fs::write(file, value.to_string()) {
                eprintln!("sim: cannot set {file} to {value}: {e}");
            }
        }
    }
}

/// What a pod spec asks for that this backend does not do (the netns backend does), or `None`.
/// A test that needs it fails with this reason rather than passing without it.
pub(crate) fn unsupported(spec: &crate::sim::PodSpec) -> Option<&'static str> {
    use crate::sim::IpFamilies;
    let checks = [
        (
            spec.ip_families != IpFamilies::V4,
            "IPv6 (the CNI config is IPv4 only)",
        ),
        (spec.dns_capture.is_some(), "DNS capture"),
        (spec.user_init.is_some(), "a user init container"),
        (spec.cni, "Istio CNI mode"),
        (
            spec.mesh != crate::sim::Mesh::Istio && spec.is_native(),
            "a native Kuma or Consul sidecar (not tried on this backend: Kuma's preStop `killall` in the container, Consul's exec startup probe of the pod's loopback, which the node's prober cannot reach)",
        ),
    ];
    checks.into_iter().find(|(on, _)| *on).map(|(_, what)| what)
}

/// Removes the pod-level cgroup `kubepods[/<qos>]/pod<uid>` (BestEffort, Burstable or
/// Guaranteed) from every hierarchy (the v1 controllers and the unified one). runc removes only
/// the containers' cgroups; the pod's is kubelet's to remove (kubelet
/// `pod_container_manager_linux.go`, `Destroy`), so a stand-in that skipped this would leave one
/// directory per pod and controller behind.
pub fn remove_pod_cgroups(uid: &str) -> Vec<String> {
    let base = Path::new("/sys/fs/cgroup");
    let mut roots = vec![base.to_path_buf()];
    if let Ok(dir) = std::fs::read_dir(base) {
        roots.extend(dir.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    let mut errors = Vec::new();
    for root in roots {
        for qos in ["besteffort", "burstable", ""] {
            let class = root.join("kubepods").join(qos);
            let pod = class.join(format!("pod{uid}"));
            if pod.is_dir() {
                if let Err(e) = std::fs::remove_dir(&pod) {
                    errors.push(format!("cannot remove {}: {e}", pod.display()));
                }
                // Shared with other pods and nodes: only if empty.
                if !qos.is_empty() {
                    let _ = std::fs::remove_dir(&class);
                }
                let _ = std::fs::remove_dir(root.join("kubepods"));
            }
        }
    }
    errors
}
