//! The kubelet stand-in: one worker thread per pod runs the pod's lifecycle in kubelet's order.
//!
//! 1. Sandbox: the pod's netns (lo up, veth to the remote services' bridge), its cgroup
//!    `kubepods/pod<uid>`, and the pause process in both.
//! 2. The `istio-init` init container (Istio's nat rules, then a short wait as istio-init takes),
//!    after the user init container if the spec has one (Istio orders istio-init last). In CNI
//!    mode ([`super::spec::PodSpec::cni`]) the rules go in with the sandbox, and the user init
//!    container runs after `istio-validation`, redirected.
//! 3. The containers in spec order (the app, then `istio-proxy`) WITHOUT waiting for readiness,
//!    as kubelet does when no postStart hook is set. With [`super::spec::PodSpec::serial_start`] (Istio's
//!    `holdApplicationUntilProxyStarts`) the proxy goes first and the app starts only once the
//!    proxy's postStart hook (`pilot-agent wait`: poll readiness every 500 ms) has returned.
//!    With [`super::spec::PodSpec::drop_until_ready`] the sandbox gets DROP rules for the app's SYNs to the
//!    capture ports before the init container runs, removed as soon as Envoy is LIVE (a
//!    baseline for the startup hold).
//! 4. Exits are reaped and recorded; containers restart per `restartPolicy` with back-off.
//! 5. Deletion: deletionTimestamp, SIGTERM to every container at once, SIGKILL (of the whole
//!    container cgroup) after terminationGracePeriodSeconds; once all are gone the sandbox is
//!    stopped, the netns and cgroups removed and the pod file deleted.
//!
//! Every change is written to the pods directory as the Pod object (see [`super::pod_object`]).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

pub(crate) mod pod_core;
mod sidecar;

use pod_core::PodCore;

use super::bootstrap::{IstioStatsMatcher, SidecarConfig, XdsRest, SHIPPED_MESH_CONFIG};
use super::cgroup::Cgroup;
use super::istio_init::{INBOUND_PORT, OUTBOUND_PORT, PROXY_UID};
use super::native::{
    record_container_start, record_container_start_error, restarts_due, NativeKubelet,
};
use super::netns::{NetNs, REMOTE_IP6};
use super::node::{NodeEnv, Shared};
use super::pod_object::{now_ts, CState, ContainerView, Terminated, PROXY_IMAGE};
use super::prober::ProbeResult;
use super::process::{notify_exit, reap, spawn_in, Exit};
use super::{random_hex, SimError};

/// Which process of the pod an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Slot {
    Sandbox,
    Init,
    /// The user init container ([`super::spec::PodSpec::user_init`]).
    UserInit,
    Container(usize),
    /// The native sidecar (`istio-proxy` as a restartable init container).
    Sidecar,
}

/// What the pod worker reacts to.
#[derive(Debug)]
pub(crate) enum PodEvent {
    /// A process exited (not yet reaped).
    Exited { slot: Slot, pid: u32 },
    /// The pod was deleted through the API.
    Delete,
    /// The node is being torn down: kill everything now.
    Shutdown,
    /// The postStart hook of container `i` returned (serial start): start the containers after it.
    PostStarted(usize),
    /// The prober's result for the proxy ([`super::prober`]).
    Probe(ProbeResult),
    /// The native sidecar's preStop hook process exited (not yet reaped).
    HookDone { pid: u32 },
    /// The kubelet restarts every container: a recreated sandbox or an in-place restart.
    Restart(Restart),
}

/// A restart of every container of a (classic) pod, as the kubelet does it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restart {
    pub kind: RestartKind,
    /// How long after the app the new proxy container starts (a late Envoy).
    pub proxy_late: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartKind {
    /// The sandbox dies (its pause process killed: a node or runtime problem): the kubelet
    /// kills every container, stops the sandbox (CNI DEL, the netns goes) and creates a new one
    /// — a new netns, init containers again, every container with a new id and restartCount + 1
    /// (pkg/kubelet/kuberuntime/kuberuntime_manager.go `computePodActions`: `createPodSandbox`
    /// with `KillPod`, attempt + 1).
    Sandbox,
    /// KEP-5532 `RestartAllContainers` (Kubernetes 1.35 alpha, 1.36 beta): the condition
    /// `AllContainersRestarting` True, every container killed without preStop hooks, the
    /// condition False once they are cleaned up, then init containers and containers again in
    /// the same sandbox and netns (kubernetes/enhancements keps/sig-node/5532-restart-pod-on-
    /// container-exits; pkg/kubelet/status/generate.go
    /// `GenerateAllContainersRestartingCondition`).
    InPlace,
}

/// One pod's worker.
pub(crate) struct PodWorker {
    /// What both backends' workers share ([`pod_core`]).
    pub core: PodCore,
    pub index: usize,
    pub rx: Receiver<PodEvent>,
    pub tx: Sender<PodEvent>,
    netns: Option<NetNs>,
    netns_file: Option<File>,
    pod_cg: Option<Cgroup>,
    cgroups: HashMap<Slot, Cgroup>,
    live: HashMap<u32, Slot>,
    restart_at: HashMap<usize, Instant>,
    grace_deadline: Option<Instant>,
    pod_dir: PathBuf,
    /// Set when the pod stops: helper threads polling its proxy (postStart hook, DROP remover)
    /// give up.
    stopping: Arc<AtomicBool>,
    /// The native sidecar's preStop hook process, while it runs.
    pre_stop_pid: Option<u32>,
    /// A native pod's stop: when each stopped container gets SIGKILL (its own timeout).
    kill_at: HashMap<Slot, Instant>,
}

impl PodWorker {
    pub(crate) fn new(
        name: String,
        index: usize,
        env: Arc<NodeEnv>,
        shared: Arc<Shared>,
        rx: Receiver<PodEvent>,
        tx: Sender<PodEvent>,
    ) -> PodWorker {
        let pod_dir = env.work_dir.join(&name);
        PodWorker {
            core: PodCore::new(name, env, shared),
            index,
            rx,
            tx,
            netns: None,
            netns_file: None,
            pod_cg: None,
            cgroups: HashMap::new(),
            live: HashMap::new(),
            restart_at: HashMap::new(),
            grace_deadline: None,
            pre_stop_pid: None,
            pod_dir,
            stopping: Arc::new(AtomicBool::new(false)),
            kill_at: HashMap::new(),
        }
    }

    /// Runs the pod until it is deleted (or the node shuts down), then cleans up.
    pub(crate) fn run(mut self) {
        self.core.scheduled();
        let setup = self.start_sandbox_and_init();
        self.core.started(setup);
        self.start_prober();
        loop {
            if self.core.pod_stopping() && self.only_sandbox_left() {
                break;
            }
            let timeout = self.next_timer().saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(timeout) {
                Ok(PodEvent::Exited { slot, pid }) => self.on_exit(slot, pid),
                Ok(PodEvent::Delete) => self.on_delete(),
                Ok(PodEvent::Shutdown) | Err(RecvTimeoutError::Disconnected) => self.on_shutdown(),
                Ok(PodEvent::PostStarted(i)) => self.on_post_started(i),
                Ok(PodEvent::Probe(r)) => self.on_probe(r),
                Ok(PodEvent::HookDone { pid }) => self.on_hook_done(pid),
                Ok(PodEvent::Restart(r)) => self.on_restart(r),
                Err(RecvTimeoutError::Timeout) => self.on_timer(),
            }
        }
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(p) = &self.core.probe {
            p.stop();
        }
        self.stop_sandbox();
        self.core.gone();
    }

    fn only_sandbox_left(&self) -> bool {
        self.live.values().all(|s| *s == Slot::Sandbox)
    }

    fn next_timer(&self) -> Instant {
        let far = Instant::now() + Duration::from_secs(3600);
        self.restart_at
            .values()
            .copied()
            .chain(self.grace_deadline)
            .chain(self.core.native.deadline())
            .chain(self.kill_at.values().copied())
            .min()
            .unwrap_or(far)
    }

    fn start_sandbox_and_init(&mut self) -> Result<(), SimError> {
        let (uid, pod_ip, ns_name) = self.core.view(|v| {
            (
                v.uid.clone(),
                v.pod_ip,
                self.core.env.netns_name(&v.spec.name),
            )
        });
        std::fs::create_dir_all(&self.pod_dir).map_err(|source| SimError::Io {
            what: format!("cannot create {}", self.pod_dir.display()),
            source,
        })?;
        let ns = NetNs::create(&ns_name)?;
        let file = ns.open()?;
        self.netns = Some(ns);
        let ns = self
            .netns
            .as_ref()
            .ok_or_else(|| SimError::Setup("netns".into()))?;
        ns.link_to(
            &self.core.env.remote_ns,
            &format!("vp{}", self.index),
            pod_ip,
        )?;
        if let Some(ip6) = self.core.view(|v| v.pod_ip6) {
            ns.add_ipv6(ip6)?;
        }
        self.netns_file = Some(file);
        // The resolv.conf kubelet writes for the pod (ClusterFirst), naming the cluster DNS of
        // the pod's first family.
        let (namespace, v6_first) = self
            .core
            .view(|v| (v.spec.namespace.clone(), v.spec.ip_families.ipv6_first()));
        let nameserver = if v6_first {
            std::net::IpAddr::V6(REMOTE_IP6)
        } else {
            std::net::IpAddr::V4(self.core.env.remote_ip)
        };
        let resolv = self.pod_dir.join("resolv.conf");
        std::fs::write(&resolv, super::dns::pod_resolv_conf(&namespace, nameserver)).map_err(
            |source| SimError::Io {
                what: format!("cannot write {}", resolv.display()),
                source,
            },
        )?;
        if self.core.view(|v| v.spec.cni) {
            // The CNI plugin writes Istio's rules while the sandbox is set up, before any init
            // container runs.
            let opts = self.init_options();
            let path = PathBuf::from("/run/netns").join(&ns_name);
            super::netns::run_in(&path, || {
                super::istio_init::run_with(
                    "iptables",
                    "ip6tables",
                    &opts,
                    Duration::ZERO,
                    Instant::now(),
                )
            })?
            .map_err(|e| SimError::Setup(format!("CNI rules: {e}")))?;
        }
        if self.core.view(|v| v.spec.drop_until_ready) {
            self.drop_syns_until_ready(&ns_name)?;
        }

        self.pod_cg = Some(Cgroup::create(
            &self.core.env.cgroup_root,
            &format!("kubepods/pod{uid}"),
        )?);
        let sandbox_id = random_hex(32);
        let pid = self.spawn(Slot::Sandbox, &sandbox_id, &["pause".to_string()], "pause")?;
        self.core.update(|v| {
            v.sandbox_ready = true;
            v.sandbox_pid = Some(pid);
            v.start_time = Some(now_ts());
        });

        // Istio's order: istio-init last (after user init containers), istio-validation first.
        let (user_first, has_user) = self
            .core
            .view(|v| (!v.spec.cni, v.spec.user_init.is_some()));
        if user_first && has_user {
            self.start_user_init()
        } else {
            self.start_injected_init()
        }
    }

    /// What istio-init (or the CNI plugin) installs for this pod beyond the IPv4 TCP capture.
    fn init_options(&self) -> super::istio_init::InitOptions {
        let resolv = self.pod_dir.join("resolv.conf");
        self.core.view(|v| super::istio_init::InitOptions {
            ipv6: v.spec.ip_families.has_ipv6(),
            dns_servers: if v.spec.dns_capture.is_some() {
                std::fs::read_to_string(&resolv)
                    .map(|t| super::istio_init::nameservers(&t))
                    .unwrap_or_default()
            } else {
                Vec::new()
            },
        })
    }

    /// Starts istio-init (istio-validation in CNI mode: the rules are already in).
    fn start_injected_init(&mut self) -> Result<(), SimError> {
        let init_id = random_hex(32);
        let mesh = self.core.view(|v| v.spec.mesh);
        if mesh != super::mesh::Mesh::Istio {
            // kuma-init / consul-connect-inject-init: the mesh's nat rules ([`super::mesh`]).
            let (min_ms, name, dns, ipv6) = self.core.view(|v| {
                (
                    v.spec.init_duration.as_millis().to_string(),
                    v.init_name(),
                    v.spec.dns_capture.is_some(),
                    v.spec.ip_families.has_ipv6(),
                )
            });
            let mut args = vec![
                "mesh-init".to_string(),
                "--mesh".into(),
                mesh.to_string(),
                "--min-duration-ms".into(),
                min_ms,
            ];
            if dns {
                // Kuma's builtin DNS: kuma-init redirects DNS to kuma-dp's port.
                args.extend([
                    "--redirect-dns-port".into(),
                    super::mesh::KUMA_DNS_PORT.to_string(),
                ]);
            }
            if ipv6 {
                args.push("--ipv6".into());
            }
            let pid = self.spawn(Slot::Init, &init_id, &args, name)?;
            self.core.update(|v| {
                let mut c = ContainerView::new(name, mesh.init_image(), "");
                c.id = Some(init_id);
                c.pid = Some(pid);
                c.state = CState::Running {
                    started_at: now_ts(),
                };
                v.init = Some(c);
            });
            return Ok(());
        }
        let (min_ms, name, cni, ipv6, dns) = self.core.view(|v| {
            (
                v.spec.init_duration.as_millis().to_string(),
                v.init_name(),
                v.spec.cni,
                v.spec.ip_families.has_ipv6(),
                v.spec.dns_capture.is_some(),
            )
        });
        let mut args = vec!["istio-init".to_string(), "--min-duration-ms".into(), min_ms];
        if cni {
            args.push("--skip-rule-apply".into());
        }
        if ipv6 {
            args.push("--ipv6".into());
        }
        if dns {
            args.extend([
                "--redirect-dns".into(),
                "--resolv-conf".into(),
                self.pod_dir
                    .join("resolv.conf")
                    .to_string_lossy()
                    .into_owned(),
            ]);
        }
        let pid = self.spawn(Slot::Init, &init_id, &args, name)?;
        self.core.update(|v| {
            let mut c = ContainerView::new(name, PROXY_IMAGE, "");
            c.id = Some(init_id);
            c.pid = Some(pid);
            c.state = CState::Running {
                started_at: now_ts(),
            };
            v.init = Some(c);
        });
        Ok(())
    }

    /// Starts the user init container: one call to the remote services, exit 1 if it fails.
    fn start_user_init(&mut self) -> Result<(), SimError> {
        let Some(user) = self.core.view(|v| v.spec.user_init.clone()) else {
            return Ok(());
        };
        let id = random_hex(32);
        let remote = self.remote_addr();
        let args = vec![
            "app".to_string(),
            "--report".into(),
            self.pod_dir
                .join(format!("{}-report.jsonl", user.name))
                .to_string_lossy()
                .into_owned(),
            "--remote".into(),
            remote.to_string(),
            "--startup-calls".into(),
            "1".into(),
            "--batch-calls".into(),
            "0".into(),
            "--call-timeout-ms".into(),
            user.call_timeout.as_millis().to_string(),
        ];
        let pid = self.spawn(Slot::UserInit, &id, &args, &user.name)?;
        self.core.update(|v| {
            let mut c = ContainerView::new(&user.name, super::pod_object::APP_IMAGE, "");
            c.id = Some(id);
            c.pid = Some(pid);
            c.state = CState::Running {
                started_at: now_ts(),
            };
            v.user_init = Some(c);
        });
        Ok(())
    }

    /// The remote services' address of the pod's first family.
    fn remote_addr(&self) -> std::net::SocketAddr {
        let port = self.core.env.remote_port;
        if self.core.view(|v| v.spec.ip_families.ipv6_first()) {
            std::net::SocketAddr::from((REMOTE_IP6, port))
        } else {
            std::net::SocketAddr::from((self.core.env.remote_ip, port))
        }
    }

    /// Starts a process of the pod in its netns and a new cgroup `pod<uid>/<id>`; returns its pid.
    fn spawn(&mut self, slot: Slot, id: &str, args: &[String], log: &str) -> Result<u32, SimError> {
        let pod_cg = self
            .pod_cg
            .as_ref()
            .ok_or_else(|| SimError::Setup("pod cgroup missing".into()))?;
        let rel = pod_cg
            .path()
            .strip_prefix(&self.core.env.cgroup_root)
            .map(|p| p.join(id))
            .map_err(|_| SimError::Setup("pod cgroup outside the cgroup root".into()))?;
        let cg = Cgroup::create(&self.core.env.cgroup_root, &rel.to_string_lossy())?;
        let netns = self
            .netns_file
            .as_ref()
            .ok_or_else(|| SimError::Setup("netns missing".into()))?;
        let log_path = self.pod_dir.join(format!("{log}.log"));
        let open_log = || {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .map_err(|source| SimError::Io {
                    what: format!("cannot open {}", log_path.display()),
                    source,
                })
        };
        let mut cmd = Command::new(&self.core.env.sim_app);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(open_log()?)
            .stderr(open_log()?)
            .current_dir(&self.pod_dir);
        let child = spawn_in(&mut cmd, netns, Some(&cg.procs_file()));
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                let _ = cg.remove();
                return Err(e);
            }
        };
        let pid = child.id();
        // The Child handle is dropped without waiting: this worker reaps by pid (see process.rs).
        drop(child);
        self.cgroups.insert(slot, cg);
        self.live.insert(pid, slot);
        notify_exit(pid, self.tx.clone(), PodEvent::Exited { slot, pid });
        Ok(pid)
    }

    pub(crate) fn container_args(&self, i: usize) -> Vec<String> {
        self.core.view(|v| {
            let spec = &v.spec;
            let remote = if spec.ip_families.ipv6_first() {
                std::net::SocketAddr::from((REMOTE_IP6, self.core.env.remote_port))
            } else {
                std::net::SocketAddr::from((self.core.env.remote_ip, self.core.env.remote_port))
            };
            if i == 0 {
                let mut a =
                    spec.app
                        .args(&self.pod_dir.join("app-report.jsonl"), remote, spec.serve);
                a.extend([
                    "--call-timeout-ms".into(),
                    spec.call_timeout.as_millis().to_string(),
                ]);
                if spec.startup_parallel {
                    a.push("--startup-parallel".into());
                }
                if !spec.app_init.is_zero() {
                    a.extend(["--init-ms".into(), spec.app_init.as_millis().to_string()]);
                }
                if spec.lookup_remote {
                    a.extend([
                        "--lookup".into(),
                        super::dns::REMOTE_SHORT_NAME.into(),
                        "--resolv-conf".into(),
                        self.pod_dir
                            .join("resolv.conf")
                            .to_string_lossy()
                            .into_owned(),
                    ]);
                }
                return a;
            }
            self.proxy_args_of(spec)
        })
    }

    /// The proxy container's command line (pilot-agent).
    pub(crate) fn proxy_args(&self) -> Vec<String> {
        self.core.view(|v| self.proxy_args_of(&v.spec))
    }

    fn proxy_args_of(&self, spec: &super::spec::PodSpec) -> Vec<String> {
        use super::mesh::{KumaAdmin, Mesh};
        let path = |p: PathBuf| p.to_string_lossy().into_owned();
        let envoy = path(self.core.env.envoy.clone());
        let bootstrap = path(self.pod_dir.join(super::bootstrap::BOOTSTRAP_FILE));
        match spec.mesh {
            Mesh::Istio => {}
            Mesh::Kuma(admin) => {
                let mut a = vec![
                    "kuma-dp".to_string(),
                    "--envoy".into(),
                    envoy,
                    "--bootstrap".into(),
                    bootstrap,
                    "--tmpdir".into(),
                    path(self.pod_dir.join(KUMA_SIDECAR_TMP)),
                    "--drain-time-ms".into(),
                    spec.mesh_drain.as_millis().to_string(),
                    "--start-delay-ms".into(),
                    spec.proxy_delay.as_millis().to_string(),
                    "--concurrency".into(),
                    spec.proxy_concurrency.to_string(),
                ];
                if admin == KumaAdmin::UnixSocket {
                    a.push("--admin-socket".into());
                }
                if let Some(late) = spec.dns_capture {
                    // The builtin DNS (KUMA_DNS_ENABLED): kuma-dp's DNS proxy, `late` after
                    // the container starts.
                    a.extend([
                        "--dns-port".into(),
                        super::mesh::KUMA_DNS_PORT.to_string(),
                        "--dns-delay-ms".into(),
                        late.as_millis().to_string(),
                    ]);
                }
                if self.core.env.cri.is_some() {
                    // A real container: its /tmp is the emptyDir already (the containerd
                    // kubelet stand-in mounts it).
                    a.push("--tmp-is-mounted".into());
                }
                return a;
            }
            Mesh::Consul => {
                return vec![
                    "consul-dataplane".to_string(),
                    "--admin".into(),
                    spec.admin_addr().to_string(),
                    "--envoy".into(),
                    envoy,
                    "--bootstrap".into(),
                    bootstrap,
                    "--shutdown-grace-period-ms".into(),
                    spec.mesh_drain.as_millis().to_string(),
                    "--start-delay-ms".into(),
                    spec.proxy_delay.as_millis().to_string(),
                    "--concurrency".into(),
                    spec.proxy_concurrency.to_string(),
                ];
            }
        }
        {
            let mut a = vec![
                "pilot-agent".to_string(),
                "--envoy".into(),
                self.core.env.envoy.to_string_lossy().into_owned(),
                "--bootstrap".into(),
                self.pod_dir
                    .join(super::bootstrap::BOOTSTRAP_FILE)
                    .to_string_lossy()
                    .into_owned(),
                "--start-delay-ms".into(),
                spec.proxy_delay.as_millis().to_string(),
                "--drain-ms".into(),
                spec.drain.as_millis().to_string(),
                "--envoy-drain-time-s".into(),
                spec.envoy_drain_time.as_secs().to_string(),
                "--concurrency".into(),
                spec.proxy_concurrency.to_string(),
            ];
            if spec.exit_on_zero_active {
                a.push("--exit-on-zero-active".into());
            }
            a.extend(["--admin".into(), spec.admin_addr().to_string()]);
            if let Some(late) = spec.dns_capture {
                a.extend(["--dns-delay-ms".into(), late.as_millis().to_string()]);
            }
            if spec.proxy_probes {
                a.extend([
                    "--status-port".into(),
                    super::istio_init::STATUS_PORT.to_string(),
                ]);
            }
            if let Some(delay) = spec.xds_delay {
                a.extend([
                    "--xds-socket".into(),
                    self.pod_dir
                        .join(super::xds::XDS_SOCKET)
                        .to_string_lossy()
                        .into_owned(),
                    "--xds-delay-ms".into(),
                    delay.as_millis().to_string(),
                ]);
            }
            a
        }
    }

    pub(crate) fn write_sidecar_config(&self) -> Result<(), SimError> {
        let exit_on_zero = self.core.view(|v| v.spec.exit_on_zero_active);
        if matches!(self.core.view(|v| v.spec.mesh), super::mesh::Mesh::Kuma(_)) {
            // The sidecar's `/tmp` (the `kuma-sidecar-tmp` emptyDir), where kuma-dp makes its
            // workdir: world-writable and sticky, as /tmp is.
            use std::os::unix::fs::PermissionsExt;
            let tmp = self.pod_dir.join(KUMA_SIDECAR_TMP);
            let made = std::fs::create_dir_all(&tmp).and_then(|()| {
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777))
            });
            made.map_err(|source| SimError::Io {
                what: format!("cannot make {}", tmp.display()),
                source,
            })?;
        }
        let stats_matcher =
            IstioStatsMatcher::shipped(exit_on_zero).map_err(|source| SimError::Io {
                what: format!(
                    "cannot read the mesh config's proxyStatsMatcher ({SHIPPED_MESH_CONFIG})"
                ),
                source,
            })?;
        let cfg = self.core.view(|v| SidecarConfig {
            node_id: format!(
                "sidecar~{}~{}.{}~{}.svc.cluster.local",
                v.pod_ip, v.spec.name, v.spec.namespace, v.spec.namespace
            ),
            node_cluster: format!("{}.{}", v.spec.name, v.spec.namespace),
            filter: if v.spec.with_filter {
                self.core.env.filter.clone()
            } else {
                None
            },
            filter_config: v.spec.filter_config.clone(),
            families: v.spec.ip_families,
            // Istio's stats matcher is Istio's: Kuma's bootstrap keeps every stat (kumahq/kuma
            // v2.14.3 pkg/xds/bootstrap/template_v3.go: stats tags, no matcher); Consul's is
            // taken to keep every stat too (not checked against its bootstrap template).
            stats_matcher: (v.spec.mesh == super::mesh::Mesh::Istio).then(|| stats_matcher.clone()),
            health_listener: v.spec.proxy_probes && v.spec.mesh == super::mesh::Mesh::Istio,
            mesh: v.spec.mesh,
            admin_ip: (v.spec.mesh != super::mesh::Mesh::Istio).then(|| v.spec.admin_addr().ip()),
            xds: v.spec.xds_delay.map(|delay| XdsRest {
                socket: self.pod_dir.join(super::xds::XDS_SOCKET),
                delay,
            }),
        });
        cfg.write(&self.pod_dir).map_err(|source| SimError::Io {
            what: format!("cannot write Envoy config to {}", self.pod_dir.display()),
            source,
        })?;
        Ok(())
    }

    fn start_container(&mut self, i: usize) {
        let id = random_hex(32);
        let (name, restarting) = self.core.view(|v| {
            let c = &v.containers[i];
            (c.name.clone(), c.id.is_some())
        });
        let is_proxy = self.core.view(|v| name == v.spec.proxy_container());
        if is_proxy && !restarting {
            if let Err(e) = self.write_sidecar_config() {
                eprintln!("sim: pod {}: {e}", self.core.name);
            }
        }
        let args = self.container_args(i);
        match self.spawn(Slot::Container(i), &id, &args, &name) {
            Ok(pid) => {
                if self
                    .core
                    .update(|v| record_container_start(v, i, &id, Some(pid), restarting))
                {
                    self.probe_running(&id);
                }
            }
            Err(e) => {
                eprintln!("sim: pod {}: cannot start {name}: {e}", self.core.name);
                self.core.update(|v| record_container_start_error(v, i, &e));
            }
        }
    }

    fn on_exit(&mut self, slot: Slot, pid: u32) {
        let exit = reap(pid);
        self.live.remove(&pid);
        self.kill_at.remove(&slot);
        if let Some(cg) = self.cgroups.remove(&slot) {
            // The container's main process is gone: the runtime tears the container down, so
            // anything it left behind (e.g. Envoy under pilot-agent) dies with it.
            cg.kill_all();
            if let Err(e) = cg.remove() {
                eprintln!("sim: pod {}: {e}", self.core.name);
            }
        }
        if self.core.restart.is_some() {
            // Killed by the restart: terminated, not restarted on its own.
            self.core.update(|v| {
                let c = match slot {
                    Slot::Container(i) => v.containers.get_mut(i),
                    Slot::Init => v.init.as_mut(),
                    Slot::UserInit => v.user_init.as_mut(),
                    Slot::Sidecar => v.sidecar.as_mut(),
                    Slot::Sandbox => None,
                };
                if let Some(c) = c {
                    c.state = CState::Terminated(terminated(c, exit));
                    c.pid = None;
                }
            });
            self.finish_restart();
            return;
        }
        match slot {
            Slot::Sandbox => {}
            Slot::Sidecar => self.on_sidecar_exit(exit),
            Slot::UserInit => {
                let ok = exit.code == 0;
                let cni = self.core.update(|v| {
                    if let Some(c) = v.user_init.as_mut() {
                        c.state = CState::Terminated(terminated(c, exit));
                        c.pid = None;
                    }
                    if !ok {
                        v.failed_reason = Some(format!("Init:Error (exit {})", exit.code));
                    }
                    v.spec.cni
                });
                if ok && !self.core.deleting && !self.core.shutting_down {
                    if cni {
                        self.start_app_containers();
                    } else if let Err(e) = self.start_injected_init() {
                        eprintln!("sim: pod {}: {e}", self.core.name);
                        let reason = e.to_string();
                        self.core.update(|v| v.failed_reason = Some(reason));
                    }
                }
            }
            Slot::Init => {
                let ok = exit.code == 0;
                self.core.update(|v| {
                    if let Some(c) = v.init.as_mut() {
                        c.state = CState::Terminated(terminated(c, exit));
                        c.pid = None;
                    }
                    if !ok {
                        v.failed_reason = Some(format!("Init:Error (exit {})", exit.code));
                    }
                });
                let user_next = self.core.view(|v| v.spec.cni && v.spec.user_init.is_some());
                if ok && user_next && !self.core.deleting && !self.core.shutting_down {
                    if let Err(e) = self.start_user_init() {
                        eprintln!("sim: pod {}: {e}", self.core.name);
                        let reason = e.to_string();
                        self.core.update(|v| v.failed_reason = Some(reason));
                    }
                } else if ok && !self.core.deleting && !self.core.shutting_down {
                    self.start_app_containers();
                }
            }
            Slot::Container(i) => {
                let deleting = self.core.deleting || self.core.shutting_down;
                if !deleting && !self.core.env.status_lag.is_zero() {
                    // The kubelet sees the exit only at its next PLEG relist (NodeOptions).
                    std::thread::sleep(self.core.env.status_lag);
                }
                let base = self.core.env.restart_backoff;
                let (backoff, probed_proxy) = self.core.update(|v| {
                    let t = terminated(&v.containers[i], exit);
                    let probed_proxy = v.containers[i].probed.is_some();
                    (v.container_exited(i, t, deleting, base), probed_proxy)
                });
                if let (true, Some(p)) = (probed_proxy, &self.core.probe) {
                    p.stopped();
                }
                if let Some(b) = backoff {
                    self.restart_at.insert(i, Instant::now() + b);
                }
                if self.core.is_native() {
                    self.after_regular_exit();
                }
            }
        }
    }

    /// The init phase is over: start the containers in spec order (serially with
    /// `holdApplicationUntilProxyStarts`).
    fn start_app_containers(&mut self) {
        if self.core.is_native() {
            // The next init container is the sidecar; the regular containers follow once its
            // startup probe passed (`on_probe`).
            self.start_sidecar();
            return;
        }
        let serial = self.core.view(|v| v.spec.serial_start);
        let proxy = self.core.view(|v| {
            v.containers
                .iter()
                .position(|c| c.name == v.spec.proxy_container())
        });
        match (serial, proxy) {
            (true, Some(p)) => {
                // holdApplicationUntilProxyStarts: the proxy is moved first and its postStart
                // hook blocks the next container's start.
                self.start_container(p);
                self.run_post_start_wait(p);
            }
            _ => self.start_regular_containers(),
        }
    }

    /// Starts the regular containers in spec order, without waiting for readiness.
    fn start_regular_containers(&mut self) {
        let n = self.core.view(|v| v.containers.len());
        let proxy = self.core.view(|v| {
            v.containers
                .iter()
                .position(|c| c.name == v.spec.proxy_container())
        });
        let delay = self.core.view(|v| v.spec.app_start_delay);
        let proxy_late = self.core.proxy_late.take().filter(|d| !d.is_zero());
        // Spec order: Kuma's injector puts its classic sidecar first.
        let mut order: Vec<usize> = (0..n).collect();
        if let (true, Some(p)) = (
            self.core
                .view(|v| matches!(v.spec.mesh, super::mesh::Mesh::Kuma(_))),
            proxy,
        ) {
            order.retain(|i| *i != p);
            order.insert(0, p);
        }
        for i in order {
            if let (true, Some(late)) = (Some(i) == proxy, proxy_late) {
                // After a restart of every container: the new Envoy comes late.
                self.restart_at.insert(i, Instant::now() + late);
            } else if Some(i) != proxy && !delay.is_zero() {
                // A slow image pull: the app container starts later (the timer that
                // restarts containers starts it).
                self.restart_at.insert(i, Instant::now() + delay);
            } else {
                self.start_container(i);
            }
        }
    }

    fn on_timer(&mut self) {
        let now = Instant::now();
        self.on_native_timer(now);
        if self.grace_deadline.is_some_and(|d| d <= now) {
            self.grace_deadline = None;
            // Grace period over: SIGKILL whatever is left of every container.
            for (slot, cg) in &self.cgroups {
                if *slot != Slot::Sandbox {
                    cg.kill_all();
                }
            }
        }
        for i in restarts_due(&mut self.restart_at, now) {
            self.start_container(i);
        }
    }

    fn on_delete(&mut self) {
        if self.core.deleting {
            return;
        }
        self.core.deleting = true;
        self.restart_at.clear();
        let grace = self.core.view(|v| v.spec.grace);
        if self.core.is_native() {
            self.core.update(|v| {
                v.deletion_at = Some(jiff_add(now_ts(), v.spec.grace));
                for c in v.containers.iter_mut().chain(v.sidecar.iter_mut()) {
                    if let (CState::Waiting { .. }, Some(last)) = (&c.state, &c.last) {
                        c.state = CState::Terminated(last.clone());
                    }
                }
            });
            self.on_native_delete();
            return;
        }
        self.grace_deadline = Some(Instant::now() + grace);
        self.core.update(|v| {
            let due = jiff_add(now_ts(), v.spec.grace);
            v.deletion_at = Some(due);
            // Containers in back-off will not start again.
            for c in &mut v.containers {
                if let (CState::Waiting { .. }, Some(last)) = (&c.state, &c.last) {
                    c.state = CState::Terminated(last.clone());
                }
            }
        });
        // SIGTERM to every container's main process at once (the init container too, if
        // it is still running).
        for (pid, slot) in &self.live {
            if *slot != Slot::Sandbox {
                super::process::signal(*pid, Signal::SIGTERM);
            }
        }
    }

    /// The proxy's postStart hook returned: start every container not started yet, in order.
    fn on_post_started(&mut self, hooked: usize) {
        if self.core.deleting || self.core.shutting_down {
            return;
        }
        let n = self.core.view(|v| v.containers.len());
        for i in (0..n).filter(|i| *i != hooked) {
            if self.core.view(|v| v.containers[i].id.is_none()) {
                self.start_container(i);
            }
        }
    }

    /// The postStart hook `pilot-agent wait` on the proxy container: poll the proxy's readiness
    /// every 500 ms (its `--periodMillis` default) for up to 60 s (`--timeoutSeconds`), then
    /// report [`PodEvent::PostStarted`]. It asks Envoy's admin `/ready` directly where pilot-agent
    /// asks its own `:15020/healthz/ready` (which checks the same Envoy state); kubelet's exec
    /// overhead is not simulated, which favours this baseline slightly. On timeout kubelet would
    /// kill the proxy; here the app is started anyway, with a line in the proxy's log.
    fn run_post_start_wait(&self, proxy: usize) {
        const PERIOD: Duration = Duration::from_millis(500);
        const TIMEOUT: Duration = Duration::from_secs(60);
        let tx = self.tx.clone();
        let stopping = self.stopping.clone();
        let name = self.core.name.clone();
        let started = Instant::now();
        self.poll_proxy_in_netns("poststart", PERIOD, move |live| {
            if stopping.load(Ordering::SeqCst) {
                return true;
            }
            let timed_out = started.elapsed() >= TIMEOUT;
            if timed_out {
                eprintln!("sim: pod {name}: postStart `pilot-agent wait` timed out after {TIMEOUT:?}; starting the app anyway");
            }
            if live || timed_out {
                let _ = tx.send(PodEvent::PostStarted(proxy));
                return true;
            }
            false
        });
    }

    /// The DROP baseline: before any container of the pod starts, drop the app's SYNs to the
    /// capture ports (the same packets the holdfast agent queues), and remove the rules as soon
    /// as Envoy's `/ready` says LIVE (polled every 1 ms). Dropped SYNs are retransmitted by the
    /// app's kernel (after 1 s, then 2 s, 4 s...).
    fn drop_syns_until_ready(&self, ns_name: &str) -> Result<(), SimError> {
        let path = PathBuf::from("/run/netns").join(ns_name);
        super::netns::run_in(&path, || iptables_restore(&drop_rules(true)))??;
        let stopping = self.stopping.clone();
        let name = self.core.name.clone();
        self.poll_proxy_in_netns("drop-remover", Duration::from_millis(1), move |live| {
            if stopping.load(Ordering::SeqCst) {
                return true;
            }
            if live {
                // This thread is in the pod's netns, so iptables (a child) is too.
                if let Err(e) = iptables_restore(&drop_rules(false)) {
                    eprintln!("sim: pod {name}: cannot remove the DROP rules: {e}");
                }
                return true;
            }
            false
        });
        Ok(())
    }

    /// Runs `step(proxy is LIVE)` every `period` on a thread inside the pod's netns until it
    /// returns true.
    fn poll_proxy_in_netns(
        &self,
        what: &str,
        period: Duration,
        mut step: impl FnMut(bool) -> bool + Send + 'static,
    ) {
        let Some(file) = self.netns_file.as_ref().and_then(|f| f.try_clone().ok()) else {
            eprintln!(
                "sim: pod {}: no netns for the {what} poller",
                self.core.name
            );
            return;
        };
        let name = self.core.name.clone();
        let admin = self.core.view(|v| v.spec.admin_addr());
        let spawned = std::thread::Builder::new()
            .name(format!("{what}-{name}"))
            .spawn(move || {
                if let Err(e) = nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET) {
                    eprintln!("sim: pod {name}: cannot enter the pod's netns: {e}");
                    return;
                }
                loop {
                    let live = super::pilot_agent::admin_request(admin, "GET", "/ready")
                        .is_ok_and(|b| b.trim() == "LIVE");
                    if step(live) {
                        return;
                    }
                    std::thread::sleep(period);
                }
            });
        if let Err(e) = spawned {
            eprintln!(
                "sim: pod {}: cannot start the {what} poller: {e}",
                self.core.name
            );
        }
    }

    /// The kubelet restarts every container ([`Restart`]): kill them (and for a recreated
    /// sandbox the pause process too); [`PodWorker::finish_restart`] goes on once they are gone.
    fn on_restart(&mut self, r: Restart) {
        if !self.core.begin_restart(r) {
            return;
        }
        self.restart_at.clear();
        if r.kind == RestartKind::InPlace {
            self.core
                .update(|v| v.all_containers_restarting = Some(true));
        }
        for (slot, cg) in &self.cgroups {
            if *slot != Slot::Sandbox || r.kind == RestartKind::Sandbox {
                cg.kill_all();
            }
        }
        self.finish_restart();
    }

    /// Once the restart's old processes are all gone: a new sandbox (new netns), or the same
    /// one with the condition `AllContainersRestarting` back to False; then the init containers
    /// and the containers again, each with a new id and restartCount + 1 (`start_container`).
    fn finish_restart(&mut self) {
        let Some(r) = self.core.restart else { return };
        let left = match r.kind {
            RestartKind::Sandbox => !self.live.is_empty(),
            RestartKind::InPlace => !self.only_sandbox_left(),
        };
        if left {
            return;
        }
        self.core.restart = None;
        self.core.proxy_late = Some(r.proxy_late);
        let started = match r.kind {
            RestartKind::Sandbox => {
                for (_, cg) in self.cgroups.drain() {
                    let _ = cg.remove();
                }
                if let Some(cg) = self.pod_cg.take() {
                    if let Err(e) = cg.remove() {
                        eprintln!("sim: pod {}: {e}", self.core.name);
                    }
                }
                if let Some(ns) = &self.netns {
                    if let Err(e) = ns.unlink() {
                        eprintln!("sim: pod {}: {e}", self.core.name);
                    }
                }
                self.netns_file = None;
                self.netns = None;
                self.core.update(|v| {
                    v.sandbox_ready = false;
                    v.sandbox_pid = None;
                });
                self.start_sandbox_and_init()
            }
            RestartKind::InPlace => {
                self.core
                    .update(|v| v.all_containers_restarting = Some(false));
                let (user_first, has_user) = self
                    .core
                    .view(|v| (!v.spec.cni, v.spec.user_init.is_some()));
                if user_first && has_user {
                    self.start_user_init()
                } else {
                    self.start_injected_init()
                }
            }
        };
        if let Err(e) = started {
            eprintln!("sim: pod {}: restart: {e}", self.core.name);
            let reason = e.to_string();
            self.core.update(|v| v.failed_reason = Some(reason));
        }
    }

    fn on_shutdown(&mut self) {
        self.core.shutting_down = true;
        self.restart_at.clear();
        if let Some(p) = &self.core.probe {
            p.stop();
        }
        for (slot, cg) in &self.cgroups {
            if *slot != Slot::Sandbox {
                cg.kill_all();
            }
        }
    }

    /// Stops the sandbox and removes the pod's cgroups and netns.
    fn stop_sandbox(&mut self) {
        if let Some(cg) = self.cgroups.get(&Slot::Sandbox) {
            cg.kill_all();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.live.is_empty() && Instant::now() < deadline {
            match self.rx.recv_timeout(Duration::from_millis(100)) {
                Ok(PodEvent::Exited { slot, pid }) => self.on_exit(slot, pid),
                Ok(PodEvent::HookDone { pid }) => {
                    reap(pid);
                }
                Ok(_) | Err(RecvTimeoutError::Timeout) => {
                    // Keep killing: a process may have been between fork and the cgroup move.
                    for cg in self.cgroups.values() {
                        cg.kill_all();
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        if !self.live.is_empty() {
            eprintln!(
                "sim: pod {}: processes left after teardown: {:?}",
                self.core.name, self.live
            );
        }
        self.core.update(|v| v.sandbox_pid = None);
        for (_, cg) in self.cgroups.drain() {
            let _ = cg.remove();
        }
        if let Some(cg) = self.pod_cg.take() {
            if let Err(e) = cg.remove() {
                eprintln!("sim: pod {}: {e}", self.core.name);
            }
        }
        self.netns_file = None;
        self.netns = None; // Drop deletes the namespace (and its veth and rules).
    }
}

/// The Kuma sidecar's `/tmp` in the pod's directory (its `kuma-sidecar-tmp` emptyDir).
pub(crate) const KUMA_SIDECAR_TMP: &str = "kuma-sidecar-tmp";

/// Comment on the DROP baseline's rules.
const DROP_COMMENT: &str = "hf-drop-until-ready";

/// The DROP baseline's rules as an `iptables-restore --noflush` input: inserted at the top of
/// their chains (`insert`) or deleted. Same packets as the holdfast hold: outbound SYNs to 127.0.0.1:15001
/// (after Istio's REDIRECT) from any uid but the proxy's, inbound SYNs to 15006 not on `lo`.
pub(crate) fn drop_rules(insert: bool) -> String {
    let (op, pos) = if insert { ('I', " 1") } else { ('D', "") };
    format!(
        "*filter\n\
         -{op} OUTPUT{pos} -d 127.0.0.1/32 -p tcp -m tcp --dport {OUTBOUND_PORT} --syn -m owner ! --uid-owner {PROXY_UID} -m comment --comment {DROP_COMMENT} -j DROP\n\
         -{op} INPUT{pos} ! -i lo -p tcp -m tcp --dport {INBOUND_PORT} --syn -m comment --comment {DROP_COMMENT} -j DROP\n\
         COMMIT\n"
    )
}

/// `iptables-restore -w --noflush` with `input`, in the calling thread's netns.
pub(crate) fn iptables_restore(input: &str) -> Result<(), SimError> {
    use std::io::Write as _;
    let mut child = Command::new("iptables-restore")
        .args(["-w", "--noflush"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| SimError::Io {
            what: "cannot run iptables-restore (`just setup` installs it)".into(),
            source,
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(|source| SimError::Io {
                what: "cannot write to iptables-restore".into(),
                source,
            })?;
    }
    let out = child.wait_with_output().map_err(|source| SimError::Io {
        what: "waiting for iptables-restore".into(),
        source,
    })?;
    if !out.status.success() {
        return Err(SimError::Command {
            cmd: format!("iptables-restore --noflush <<< {input:?}"),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// `t + d`, saturating at `t` (jiff is built without `std` here: add via the Unix time).
fn jiff_add(t: k8s_openapi::jiff::Timestamp, d: Duration) -> k8s_openapi::jiff::Timestamp {
    let nanos = t.as_nanosecond() + d.as_nanos() as i128;
    k8s_openapi::jiff::Timestamp::from_nanosecond(nanos).unwrap_or(t)
}

fn terminated(c: &ContainerView, exit: Exit) -> Terminated {
    let started_at = match &c.state {
        CState::Running { started_at } => *started_at,
        _ => now_ts(),
    };
    Terminated {
        container_id: c.id.clone().unwrap_or_default(),
        exit_code: exit.code,
        signal: exit.signal,
        reason: if exit.code == 0 { "Completed" } else { "Error" }.into(),
        started_at,
        finished_at: now_ts(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_rules_match_the_held_syns_and_delete_what_they_insert() {
        let ins = drop_rules(true);
        let del = drop_rules(false);
        assert!(ins.starts_with("*filter\n") && ins.ends_with("COMMIT\n"));
        assert!(ins.contains(
            "-I OUTPUT 1 -d 127.0.0.1/32 -p tcp -m tcp --dport 15001 --syn -m owner ! --uid-owner 1337"
        ));
        assert!(ins.contains("-I INPUT 1 ! -i lo -p tcp -m tcp --dport 15006 --syn"));
        // The delete spec is the insert spec without the position.
        assert_eq!(
            del.replace("-D OUTPUT", "-I OUTPUT 1")
                .replace("-D INPUT", "-I INPUT 1"),
            ins
        );
    }
}
