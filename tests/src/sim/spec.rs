//! What a test asks for: a pod's spec (builder) and its app's script.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// Kubernetes `restartPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::Always => "Always",
            RestartPolicy::OnFailure => "OnFailure",
            RestartPolicy::Never => "Never",
        }
    }

    /// Whether kubelet restarts a container that exited with `code`.
    pub fn restarts(self, code: i32) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => code != 0,
            RestartPolicy::Never => false,
        }
    }
}

/// The pod's IP families, in `status.podIPs` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IpFamilies {
    /// IPv4 only (the default).
    #[default]
    V4,
    /// IPv6 only.
    V6,
    /// Dual-stack with IPv6 first (Istio with `ISTIO_DUAL_STACK`: admin on `::1`, listeners on
    /// `::` plus `0.0.0.0`, IPv6 and IPv4 redirects).
    DualV6First,
}

impl IpFamilies {
    pub fn has_ipv4(self) -> bool {
        matches!(self, IpFamilies::V4 | IpFamilies::DualV6First)
    }
    pub fn has_ipv6(self) -> bool {
        matches!(self, IpFamilies::V6 | IpFamilies::DualV6First)
    }
    /// Whether the first pod IP is IPv6 (it decides Envoy's admin and the app's calls).
    pub fn ipv6_first(self) -> bool {
        matches!(self, IpFamilies::V6 | IpFamilies::DualV6First)
    }
}

/// How Istio injects the proxy ([`PodSpec::sidecar`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SidecarMode {
    /// `istio-proxy` is a regular container after the app (Istio ≤ 1.26, or
    /// `sidecar.istio.io/nativeSidecar: "false"`).
    #[default]
    Classic,
    /// `istio-proxy` is an init container with `restartPolicy: Always` after `istio-init`, as
    /// Istio 1.27+ injects it on nodes with kubelet ≥ 1.33 (see [`super::pod_object`] for the
    /// golden file it follows): the kubelet starts the app only once the proxy's startup probe
    /// succeeded, runs Istio's preStop drain on deletion and stops the proxy after the app
    /// ([`super::native`]).
    Native,
}

/// A user init container that calls the remote services, as vault-agent-init and the like do
/// (`sim-app app` with one startup call, exit 1 if it fails).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInit {
    /// The container's name.
    pub name: String,
    /// Per-call timeout (connect + response).
    pub call_timeout: Duration,
}

/// What the app container does (`sim-app app` flags; see [`super::apps`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppScript {
    /// Like an app that fetches its config at boot: `calls` calls right at start, each on a new
    /// connection; if any fails the app exits 1. Then it idles until SIGTERM and exits 0.
    CallAtStart { calls: u32 },
    /// A service that calls out every `every` over a keep-alive pool of `pool` connections while
    /// running (failures are recorded, not fatal), and keeps calling for `after_sigterm` after
    /// SIGTERM (flushing, deregistering), then exits 0.
    CallThroughShutdown {
        every: Duration,
        pool: usize,
        after_sigterm: Duration,
    },
    /// A service whose HTTP client pools its connections: one HTTP/1.1 keep-alive connection and
    /// one HTTP/2 connection to the remote's HTTP service (through the sidecar's outbound HTTP
    /// listener `0.0.0.0_8080`), a call on each every `every`, through SIGTERM and for
    /// `after_sigterm` after it, then exit 0 ([`super::http_calls`]).
    HttpThroughShutdown {
        every: Duration,
        after_sigterm: Duration,
    },
    /// A service that fetches its config at boot (one call on a new connection; exit 1 if it
    /// fails) and then calls out every `every` over a keep-alive pool of `pool` connections,
    /// through SIGTERM and for `after_sigterm` after it, then exits 0: the app of the lifecycle
    /// benchmark (first call, a sidecar crash, deletion in one pod).
    BootThenCall {
        every: Duration,
        pool: usize,
        after_sigterm: Duration,
    },
    /// A batch job: `calls` calls (each retried for up to 10 s, as job runners retry), then exit
    /// with `exit_code`.
    Batch { calls: u32, exit_code: i32 },
    /// A batch job retried by its pod: `calls` calls, then exit `first_exit` on its first run in
    /// the pod and 0 on every later one (a run is later when the app's report already has one).
    BatchRetried { calls: u32, first_exit: i32 },
    /// Only serve inbound requests (see [`PodSpec::serve`]) until SIGTERM.
    Idle,
    /// A graceful download server on the served port ([`PodSpec::serve`]): each request
    /// (`get\n`) is answered with `bytes` bytes, written whole into the socket, then the
    /// connection is closed. On SIGTERM it stops accepting, waits until every response it
    /// started is written (into the kernel: what Envoy and the client have not read yet is
    /// still on its way), and exits 0 (issue 28: a response still being sent).
    ServeDownload { bytes: u64 },
    /// A hostile pod's app: runs the attack, then idles until SIGTERM (issue 25).
    Attack(super::attacks::Attack),
}

impl AppScript {
    /// The `sim-app app` arguments for this script.
    pub fn args(&self, report: &Path, remote: SocketAddr, serve: Option<u16>) -> Vec<String> {
        let mut a = vec![
            "app".to_string(),
            "--report".into(),
            report.to_string_lossy().into_owned(),
            "--remote".into(),
            remote.to_string(),
        ];
        let ms = |d: &Duration| d.as_millis().to_string();
        match self {
            AppScript::CallAtStart { calls } => {
                a.extend(["--startup-calls".into(), calls.to_string()]);
            }
            AppScript::CallThroughShutdown {
                every,
                pool,
                after_sigterm,
            } => {
                a.extend([
                    "--every-ms".into(),
                    ms(every),
                    "--pool".into(),
                    pool.to_string(),
                    "--after-sigterm-ms".into(),
                    ms(after_sigterm),
                ]);
            }
            AppScript::BootThenCall {
                every,
                pool,
                after_sigterm,
            } => {
                a.extend([
                    "--startup-calls".into(),
                    "1".into(),
                    "--every-ms".into(),
                    ms(every),
                    "--pool".into(),
                    pool.to_string(),
                    "--after-sigterm-ms".into(),
                    ms(after_sigterm),
                ]);
            }
            AppScript::HttpThroughShutdown {
                every,
                after_sigterm,
            } => {
                a.extend([
                    "--http-every-ms".into(),
                    ms(every),
                    "--after-sigterm-ms".into(),
                    ms(after_sigterm),
                ]);
            }
            AppScript::Batch { calls, exit_code } => {
                a.extend([
                    "--batch-calls".into(),
                    calls.to_string(),
                    "--exit-code".into(),
                    exit_code.to_string(),
                    "--retry-for-ms".into(),
                    "10000".into(),
                ]);
            }
            AppScript::BatchRetried { calls, first_exit } => {
                a.extend([
                    "--batch-calls".into(),
                    calls.to_string(),
                    "--first-exit-code".into(),
                    first_exit.to_string(),
                    "--retry-for-ms".into(),
                    "10000".into(),
                ]);
            }
            AppScript::Idle => {}
            AppScript::ServeDownload { bytes } => {
                a.extend(["--download-bytes".into(), bytes.to_string()]);
            }
            AppScript::Attack(attack) => a.extend(attack.args()),
        }
        if let Some(port) = serve {
            a.extend(["--serve".into(), port.to_string()]);
        }
        a
    }
}

/// A pod to run on the simulated node: one app container and the `istio-proxy` sidecar, with
/// the `istio-init` init container. Defaults follow Kubernetes and Istio.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSpec {
    pub name: String,
    pub namespace: String,
    /// The app container's name.
    pub app_name: String,
    pub app: AppScript,
    /// Inbound port the app serves (echo), if any.
    pub serve: Option<u16>,
    /// How long after the proxy container starts Envoy gets going (stands in for the wait for
    /// xDS config). Default 0.
    pub proxy_delay: Duration,
    /// pilot-agent's `terminationDrainDuration`. Default 5 s.
    pub drain: Duration,
    /// pilot-agent's `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`. Default off.
    pub exit_on_zero_active: bool,
    /// Envoy's `--drain-time-s` (pilot-agent passes `drainDuration`, 45 s by default): how long
    /// after `/drain_listeners?inboundonly&graceful` the inbound listeners close. Default 45 s.
    pub envoy_drain_time: Duration,
    /// `terminationGracePeriodSeconds` (whole seconds in the API). Default 30 s.
    pub grace: Duration,
    pub restart_policy: RestartPolicy,
    /// Kubernetes 1.35's container restart rules (KEP-5307) on the app container: with codes,
    /// it gets `restartPolicy: Never` and one rule, `Restart` on `exitCodes: In [codes]`.
    /// Default none.
    pub app_restart_on: Vec<i32>,
    /// A Job's pod (labels `job-name`, owner Job; use with `RestartPolicy::Never`/`OnFailure`).
    pub job: bool,
    /// Load the holdfast wasm filter into the sidecar. Default on.
    pub with_filter: bool,
    /// The filter's plugin configuration (JSON; empty: the defaults, `stat_prefix` holdfast).
    pub filter_config: String,
    /// How long the istio-init step takes at least. Default 150 ms.
    pub init_duration: Duration,
    /// The app's per-call timeout (connect + response). Default 2 s.
    pub call_timeout: Duration,
    /// Make the startup calls all at once, each on its own connection. Default off (in turn).
    pub startup_parallel: bool,
    /// How long the app initialises (after its process starts) before its startup calls.
    /// Default 0.
    pub app_init: Duration,
    /// Start the containers serially, as Istio's `holdApplicationUntilProxyStarts` does: the
    /// proxy first, and the app only once a postStart hook polling the proxy's readiness every
    /// 500 ms (`pilot-agent wait`) has succeeded. Default off.
    pub serial_start: bool,
    /// Baseline for the startup hold: DROP the app's SYNs to the capture ports (iptables, filter
    /// table) from before the init container runs until Envoy's `/ready` says LIVE (polled every
    /// 1 ms), so the app's SYNs are retransmitted by TCP. Default off.
    pub drop_until_ready: bool,
    /// Envoy's `--concurrency` (worker threads). Default 2, Istio's default.
    pub proxy_concurrency: u32,
    /// The pod's IP families. Default IPv4 only.
    pub ip_families: IpFamilies,
    /// DNS capture (`ISTIO_META_DNS_CAPTURE=true` on istio-init and istio-proxy): DNS to the
    /// pod's nameserver is redirected to pilot-agent's 15053, which starts this long after the
    /// proxy container. `None` (default): no capture, DNS goes to the cluster DNS.
    pub dns_capture: Option<Duration>,
    /// The app looks the remote services up by name (`remote`, through the pod's resolv.conf)
    /// before its startup calls. Default off (it calls the address).
    pub lookup_remote: bool,
    /// A Consul pod of a dual-stack install (Helm's `global.dualStack.enabled`, the injector's
    /// `CONSUL_DUAL_STACK`): consul-dataplane's `-envoy-admin-bind-address=::1`
    /// (hashicorp/consul-k8s control-plane/connect-inject/webhook/consul_dataplane_sidecar.go,
    /// v1.9.0). Default off (`127.0.0.1`).
    pub consul_dual_stack: bool,
    /// A user init container that calls out. Default none.
    pub user_init: Option<UserInit>,
    /// Istio CNI mode: the rules are installed when the sandbox is created (by the CNI plugin),
    /// the injected init step is `istio-validation`, and user init containers run after it,
    /// redirected. Default off (istio-init, which Istio orders last among init containers, so
    /// user init containers run before any redirect).
    pub cni: bool,
    /// `false`: the pod carries `holdfast.io/enabled: "false"`, so the agent leaves it alone and
    /// it runs as with Istio alone (a side-by-side baseline on the same node). Default true.
    pub holdfast_enabled: bool,
    /// The pod's `holdfast.io/hold-timeout` annotation (its own hold deadline). Default none:
    /// the agent's `--hold-timeout`.
    pub hold_timeout: Option<Duration>,
    /// More annotations, as the pod's author writes them (the hostile suite's pod text).
    pub annotations: Vec<(String, String)>,
    /// Start the app container this long after the proxy container (as a slow image pull
    /// does: the kubelet pulls and starts containers one after another); until then it is
    /// `waiting` (ContainerCreating). Default 0. Added for issue 10 item 1 (an app is done only
    /// after it ran).
    pub app_start_delay: Duration,
    /// Classic or native sidecar. Default classic.
    pub sidecar: SidecarMode,
    /// The mesh sets `global.proxy.lifecycle` (Helm values): the injection template then puts
    /// that lifecycle on `istio-proxy` instead of its own, so a native sidecar has no Istio
    /// preStop drain and pilot-agent drains `terminationDrainDuration` after SIGTERM. The sim
    /// renders it as an empty lifecycle (no hooks). Default off.
    pub lifecycle_override: bool,
    /// The kubelet stand-in probes `istio-proxy` as the injected probes say (startupProbe every
    /// 1 s, then readinessProbe every 15 s, both `GET /healthz/ready` on 15021 through Envoy to
    /// pilot-agent's status port), and its `started`/`ready` and the pod's Ready condition
    /// follow the probes. Always on for native sidecars (the app's start waits for the startup
    /// probe); for classic pods off by default (`ready` = running, as before), on where a
    /// comparison with native needs the same meaning of Ready (the lifecycle benchmark).
    pub proxy_probes: bool,
    /// Envoy gets its listeners and clusters from pilot-agent's xDS stand-in (REST, on a unix
    /// socket in the pod's directory) which answers the first request only this long after
    /// pilot-agent started, as istiod's first push arrives late; Envoy itself starts at once
    /// and its admin API answers meanwhile (PRE_INITIALIZING). `None` (default): Envoy reads
    /// LDS/CDS from files and has them at once (delay its start with `proxy_delay`).
    pub xds_delay: Option<Duration>,
    /// The mesh that injected the pod ([`super::mesh`]): Istio (default), Kuma or Consul, each
    /// with its containers, init step, uid, ports, admin and proxy process.
    pub mesh: super::mesh::Mesh,
    /// Kuma's and Consul's fixed wait on SIGTERM: kuma-dp's `drainTime`, consul-dataplane's
    /// `-shutdown-grace-period-seconds`. Default 30 s, both meshes' default. (Istio's is
    /// [`PodSpec::drain`].)
    pub mesh_drain: Duration,
}

impl PodSpec {
    /// A Deployment-like pod named `name` in namespace `default` running `AppScript::Idle`.
    pub fn new(name: &str) -> PodSpec {
        PodSpec {
            name: name.to_string(),
            namespace: "default".to_string(),
            app_name: "app".to_string(),
            app: AppScript::Idle,
            serve: None,
            proxy_delay: Duration::ZERO,
            drain: Duration::from_secs(5),
            exit_on_zero_active: false,
            envoy_drain_time: Duration::from_secs(45),
            grace: Duration::from_secs(30),
            restart_policy: RestartPolicy::Always,
            app_restart_on: Vec::new(),
            job: false,
            with_filter: true,
            filter_config: String::new(),
            init_duration: Duration::from_millis(150),
            call_timeout: Duration::from_secs(2),
            startup_parallel: false,
            app_init: Duration::ZERO,
            serial_start: false,
            holdfast_enabled: true,
            hold_timeout: None,
            annotations: Vec::new(),
            drop_until_ready: false,
            proxy_concurrency: 2,
            ip_families: IpFamilies::V4,
            dns_capture: None,
            lookup_remote: false,
            consul_dual_stack: false,
            user_init: None,
            cni: false,
            app_start_delay: Duration::ZERO,
            sidecar: SidecarMode::Classic,
            lifecycle_override: false,
            proxy_probes: false,
            xds_delay: None,
            mesh: super::mesh::Mesh::Istio,
            mesh_drain: Duration::from_secs(30),
        }
    }

    /// See [`PodSpec::mesh`].
    pub fn mesh(mut self, mesh: super::mesh::Mesh) -> Self {
        self.mesh = mesh;
        self
    }
    /// See [`PodSpec::mesh_drain`].
    pub fn mesh_drain(mut self, d: Duration) -> Self {
        self.mesh_drain = d;
        self
    }
    /// The proxy container's name (`istio-proxy`, `kuma-sidecar`, `consul-dataplane`).
    pub fn proxy_container(&self) -> &'static str {
        self.mesh.proxy_container()
    }

    /// Envoy's worker threads (`--concurrency`).
    pub fn proxy_concurrency(mut self, n: u32) -> Self {
        self.proxy_concurrency = n.max(1);
        self
    }

    pub fn namespace(mut self, ns: &str) -> Self {
        self.namespace = ns.to_string();
        self
    }
    pub fn app(mut self, script: AppScript) -> Self {
        self.app = script;
        self
    }
    pub fn app_name(mut self, name: &str) -> Self {
        self.app_name = name.to_string();
        self
    }
    pub fn serve(mut self, port: u16) -> Self {
        self.serve = Some(port);
        self
    }
    pub fn proxy_delay(mut self, d: Duration) -> Self {
        self.proxy_delay = d;
        self
    }
    pub fn drain(mut self, d: Duration) -> Self {
        self.drain = d;
        self
    }
    pub fn exit_on_zero_active(mut self, on: bool) -> Self {
        self.exit_on_zero_active = on;
        self
    }
    /// Envoy's `--drain-time-s` (whole seconds, at least 1).
    pub fn envoy_drain_time(mut self, d: Duration) -> Self {
        self.envoy_drain_time = d.max(Duration::from_secs(1));
        self
    }

    pub fn grace(mut self, d: Duration) -> Self {
        self.grace = d;
        self
    }
    pub fn restart_policy(mut self, p: RestartPolicy) -> Self {
        self.restart_policy = p;
        self
    }
    /// See [`PodSpec::app_restart_on`].
    pub fn app_restart_on(mut self, exit_codes: &[i32]) -> Self {
        self.app_restart_on = exit_codes.to_vec();
        self
    }
    /// Whether the kubelet restarts container `name` after it exited with `code`: the app's own
    /// rules first (kubernetes v1.35.4 pkg/api/v1/pod/util.go `ContainerShouldRestart`: a
    /// matching `Restart` rule, else the container's own policy), else the pod's policy.
    pub fn restarts(&self, name: &str, code: i32) -> bool {
        if name == self.app_name && !self.app_restart_on.is_empty() {
            return self.app_restart_on.contains(&code);
        }
        self.restart_policy.restarts(code)
    }
    /// A Job's pod: `restartPolicy: Never`, labelled and owned like one.
    pub fn job(mut self) -> Self {
        self.job = true;
        self.restart_policy = RestartPolicy::Never;
        self
    }
    /// See [`PodSpec::filter_config`].
    pub fn filter_config(mut self, json: &str) -> Self {
        self.filter_config = json.to_string();
        self
    }

    pub fn with_filter(mut self, on: bool) -> Self {
        self.with_filter = on;
        self
    }
    pub fn init_duration(mut self, d: Duration) -> Self {
        self.init_duration = d;
        self
    }
    pub fn call_timeout(mut self, d: Duration) -> Self {
        self.call_timeout = d;
        self
    }
    /// Make the startup calls all at once (an app that opens many connections at boot).
    pub fn parallel_startup_calls(mut self) -> Self {
        self.startup_parallel = true;
        self
    }
    /// The app works for `d` after it starts before its first (startup) call.
    pub fn app_init(mut self, d: Duration) -> Self {
        self.app_init = d;
        self
    }
    /// See [`PodSpec::app_start_delay`].
    pub fn app_start_delay(mut self, d: Duration) -> Self {
        self.app_start_delay = d;
        self
    }
    /// See [`PodSpec::hold_timeout`].
    pub fn hold_timeout(mut self, d: Duration) -> Self {
        self.hold_timeout = Some(d);
        self
    }

    /// See [`PodSpec::annotations`]; written last, so it wins over the ones the spec sets.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.push((key.to_string(), value.to_string()));
        self
    }

    /// See [`PodSpec::holdfast_enabled`].
    pub fn holdfast_enabled(mut self, on: bool) -> Self {
        self.holdfast_enabled = on;
        self
    }

    /// See [`PodSpec::serial_start`].
    pub fn serial_start(mut self, on: bool) -> Self {
        self.serial_start = on;
        self
    }
    /// See [`PodSpec::drop_until_ready`].
    pub fn drop_until_ready(mut self, on: bool) -> Self {
        self.drop_until_ready = on;
        self
    }
    /// See [`PodSpec::ip_families`].
    pub fn ip_families(mut self, families: IpFamilies) -> Self {
        self.ip_families = families;
        self
    }
    /// DNS capture on, pilot-agent's DNS proxy listening `late` after the proxy container starts.
    pub fn dns_capture(mut self, late: Duration) -> Self {
        self.dns_capture = Some(late);
        self
    }
    /// See [`PodSpec::lookup_remote`].
    pub fn lookup_remote(mut self, on: bool) -> Self {
        self.lookup_remote = on;
        self
    }
    /// See [`PodSpec::consul_dual_stack`].
    pub fn consul_dual_stack(mut self) -> Self {
        self.consul_dual_stack = true;
        self
    }
    /// A user init container named `name` that calls the remote services once (timeout
    /// `call_timeout`) and fails if the call fails.
    pub fn user_init(mut self, name: &str, call_timeout: Duration) -> Self {
        self.user_init = Some(UserInit {
            name: name.to_string(),
            call_timeout,
        });
        self
    }
    /// See [`PodSpec::cni`].
    pub fn cni(mut self, on: bool) -> Self {
        self.cni = on;
        self
    }
    /// A native sidecar ([`SidecarMode::Native`]): the proxy is a restartable init container
    /// and is probed ([`PodSpec::proxy_probes`]).
    pub fn native(mut self) -> Self {
        self.sidecar = SidecarMode::Native;
        self.proxy_probes = true;
        self
    }
    /// Whether the proxy is a native sidecar.
    pub fn is_native(&self) -> bool {
        self.sidecar == SidecarMode::Native
    }
    /// See [`PodSpec::lifecycle_override`].
    pub fn lifecycle_override(mut self, on: bool) -> Self {
        self.lifecycle_override = on;
        self
    }
    /// See [`PodSpec::proxy_probes`] (a native sidecar is always probed).
    pub fn proxy_probes(mut self, on: bool) -> Self {
        self.proxy_probes = on || self.is_native();
        self
    }
    /// See [`PodSpec::xds_delay`].
    pub fn xds_delay(mut self, d: Duration) -> Self {
        self.xds_delay = Some(d);
        self
    }
    /// Whether Istio's native-sidecar preStop (`pilot-agent request --debug-port=15020 POST
    /// drain`) is on the proxy: native, and no `global.proxy.lifecycle` override.
    pub fn istio_pre_stop(&self) -> bool {
        self.mesh == super::mesh::Mesh::Istio && self.is_native() && !self.lifecycle_override
    }
    /// The native sidecar's preStop hook command, if it has one: Istio's `pilot-agent request
    /// --debug-port=15020 POST drain`, Kuma's `killall -USR2 kuma-dp`.
    pub fn pre_stop_command(&self) -> Option<Vec<String>> {
        if !self.is_native() {
            return None;
        }
        match self.mesh {
            super::mesh::Mesh::Istio => self
                .istio_pre_stop()
                .then(|| super::pod_object::PRE_STOP_DRAIN.map(String::from).to_vec()),
            super::mesh::Mesh::Kuma(_) => {
                Some(["killall", "-USR2", "kuma-dp"].map(String::from).to_vec())
            }
            super::mesh::Mesh::Consul => None,
        }
    }
    /// What this spec asks for that the simulated node cannot combine, or `None`: Istio never
    /// injects `holdApplicationUntilProxyStarts` (a postStart hook) on a native sidecar
    /// (injection-template.yaml: `$holdProxy` requires `not $nativeSidecar`).
    pub fn conflict(&self) -> Option<&'static str> {
        if self.is_native() && self.serial_start {
            return Some("serial_start (holdApplicationUntilProxyStarts) with a native sidecar: Istio injects no postStart hook on native sidecars");
        }
        if self.is_native() && (self.user_init.is_some() || self.cni) {
            // Istio orders them "{istio-init/istio-validation} => proxy => rest"; the sim's
            // kubelet stand-ins do not run that order yet.
            return Some("a user init container or CNI mode with a native sidecar (not simulated)");
        }
        if self.mesh != super::mesh::Mesh::Istio {
            if let Some(why) = self.mesh_conflict() {
                return Some(why);
            }
        }
        if self.proxy_delay > Duration::ZERO && self.xds_delay.is_some() {
            return Some("both proxy_delay and xds_delay: pick one way for the proxy to be late");
        }
        None
    }
    /// What a Kuma or Consul pod cannot have on the simulated node (Istio's own options, and
    /// the shapes [`super::mesh`] leaves out).
    fn mesh_conflict(&self) -> Option<&'static str> {
        use super::mesh::{KumaAdmin, Mesh};
        let kuma = matches!(self.mesh, Mesh::Kuma(_));
        // Kuma's builtin DNS (kuma-init's redirect, kuma-dp's UDP-only proxy) and its IPv6
        // rules are simulated; Consul's DNS redirection and IPv6 rules are not (a Consul
        // dual-stack pod's IPv6 traffic is not redirected: only its `::1` admin is modelled).
        let istio_only = self.cni
            || (self.ip_families != IpFamilies::V4 && !kuma && !self.consul_dual_stack)
            || (self.dns_capture.is_some() && !kuma)
            || (self.consul_dual_stack && self.mesh != Mesh::Consul)
            || self.user_init.is_some()
            || self.serial_start
            || self.xds_delay.is_some()
            || self.lifecycle_override
            || self.exit_on_zero_active
            || self.drop_until_ready;
        if istio_only {
            return Some("an Istio option (CNI, IPv6, DNS capture, user init, serial start, xDS delay, lifecycle override, EXIT_ON_ZERO_ACTIVE_CONNECTIONS, DROP baseline) on a Kuma or Consul pod (not simulated)");
        }
        match (self.mesh, self.is_native()) {
            // consul-dataplane's `-check-proxy-health` asks 127.0.0.1 whatever
            // `-envoy-admin-bind-address` says, so with the admin on `::1` the startup probe
            // would never pass ([`super::mesh::CONSUL_NATIVE_STARTUP_PROBE`]).
            (Mesh::Consul, true) if self.consul_dual_stack => Some("a native Consul sidecar on a dual-stack install (its startup probe asks 127.0.0.1, its admin is on ::1; not simulated)"),
            (Mesh::Kuma(KumaAdmin::Tcp), true) => Some("a native Kuma sidecar with the TCP admin (its probes would go to the pod IP's 9901, where the admin does not listen; not simulated)"),
            (Mesh::Kuma(_) | Mesh::Consul, false) if self.proxy_probes => {
                Some("probes of a classic Kuma or Consul proxy (not simulated)")
            }
            _ => None,
        }
    }

    /// Envoy's admin address in this pod: `::1` when the first pod IP is IPv6, as Istio binds
    /// it (pkg/bootstrap/config.go: `option.Localhost(option.LocalhostIPv6)`).
    /// For Kuma and Consul: their TCP admin (a Kuma Unix-socket admin has none: its
    /// `/ready` is reached through kuma-dp's readiness port instead).
    pub fn admin_addr(&self) -> SocketAddr {
        if self.mesh == super::mesh::Mesh::Consul && self.consul_dual_stack {
            // consul-k8s with CONSUL_DUAL_STACK: `-envoy-admin-bind-address=::1`.
            return SocketAddr::from((
                std::net::Ipv6Addr::LOCALHOST,
                super::mesh::CONSUL_ADMIN_PORT,
            ));
        }
        if self.mesh != super::mesh::Mesh::Istio {
            return self.mesh.admin_tcp().unwrap_or(SocketAddr::from((
                std::net::Ipv4Addr::LOCALHOST,
                super::mesh::KUMA_READINESS_PORT,
            )));
        }
        let port = super::istio_init::ADMIN_PORT;
        if self.ip_families.ipv6_first() {
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port))
        } else {
            SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_args_round_trip_through_sim_app_parser() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(subcommand)]
            cmd: Cmd,
        }
        #[derive(clap::Subcommand)]
        enum Cmd {
            App(crate::sim::apps::AppArgs),
        }
        let remote: SocketAddr = "198.18.0.1:7000".parse().expect("addr");
        let script = AppScript::CallThroughShutdown {
            every: Duration::from_millis(200),
            pool: 3,
            after_sigterm: Duration::from_secs(8),
        };
        let mut argv = vec!["sim-app".to_string()];
        argv.extend(script.args(Path::new("/r.jsonl"), remote, Some(8080)));
        let Cmd::App(a) = Cli::try_parse_from(argv).expect("parses").cmd;
        assert_eq!(a.every_ms, Some(200));
        assert_eq!(a.pool, 3);
        assert_eq!(a.after_sigterm_ms, 8000);
        assert_eq!(a.serve, Some(8080));
        assert_eq!(a.remote, remote);
    }

    #[test]
    fn job_implies_never_restart() {
        let p = PodSpec::new("j").job();
        assert_eq!(p.restart_policy, RestartPolicy::Never);
        assert!(!RestartPolicy::Never.restarts(1));
        assert!(RestartPolicy::OnFailure.restarts(1));
        assert!(!RestartPolicy::OnFailure.restarts(0));
    }
}
