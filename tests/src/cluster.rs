//! The promise scenarios on the real cluster of `scripts/cluster/` (issue 38 item 4): pods written
//! as Istio's injector writes them, run by the real kubelet, with the containerd backend's own
//! commands (`sim-app istio-init`, the pilot-agent stand-in starting real Envoy as uid 1337, the
//! scripted apps of [`crate::sim::spec::AppScript`]) and its host files given as `hostPath`
//! volumes where the containerd backend gives them as bind mounts (`src/cri/kubelet.rs`,
//! `mounts`). Objects are `serde_json` values applied with the cluster's own `kubectl`.
//!
//! Used by `tests/tests/cluster_promises.rs`, which `scripts/cluster/test-install.sh` runs once
//! the agent is installed and Ready.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::sim::bootstrap::{IstioStatsMatcher, SidecarConfig, BOOTSTRAP_FILE};
use crate::sim::istio_init::{ADMIN_PORT, HEALTH_PORT, STATUS_PORT};
use crate::sim::reach;
use crate::sim::{AppScript, IpFamilies, Mesh};

/// The cluster's bridge gateway (scripts/cluster/cluster.sh `POD_GW`): the node as its pods reach
/// it. The remote service the apps call listens here.
pub const NODE_GW: [u8; 4] = [10, 213, 0, 1];
/// The remote service's port (the simulated node's [`crate::sim::REMOTE_PORT`]).
pub const REMOTE_PORT: u16 = crate::sim::REMOTE_PORT;
/// The base image every container runs (scripts/cluster/cluster.sh `PAUSE_IMAGE`: busybox laid
/// out as `src/cri/image.rs` lays out the containerd backend's base image).
pub const IMAGE: &str = "localhost/holdfast/busybox:local";
/// The agent's namespace and pods (manifests/agent/daemonset.yaml).
pub const AGENT_NS: &str = "holdfast-system";
pub const AGENT_SELECTOR: &str = "app.kubernetes.io/name=holdfast";

/// Says why the scenarios cannot run: a skip outside CI, a failure with `CI=true`.
pub fn skip_or_fail(test: &str, why: &str) {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: cannot run: {why} (CI=true)");
    }
    eprintln!("SKIPPED {test}: {why} (`just test-cluster` runs it on the real cluster)");
}

/// The cluster through its `kubectl` (from `eval "$(just cluster env)"`: KUBECONFIG and PATH).
#[derive(Debug, Clone)]
pub struct Kube {
    kubectl: PathBuf,
}

impl Kube {
    /// The cluster if one answers `/readyz` within 10 s, else why not.
    pub fn reachable() -> Result<Kube, String> {
        if std::env::var_os("KUBECONFIG").is_none() {
            return Err("no KUBECONFIG (eval \"$(just cluster env)\")".into());
        }
        let kube = Kube {
            kubectl: PathBuf::from("kubectl"),
        };
        kube.run(&["get", "--raw", "/readyz", "--request-timeout=10s"])
            .map_err(|e| format!("no cluster answers: {e}"))?;
        Ok(kube)
    }

    /// `kubectl ARGS`; its stdout, or its stderr as the error.
    pub fn run(&self, args: &[&str]) -> Result<String, String> {
        self.run_stdin(args, None)
    }

    fn run_stdin(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        let mut child = Command::new(&self.kubectl)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run kubectl: {e}"))?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes())
                .map_err(|e| format!("kubectl stdin: {e}"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("kubectl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// `kubectl apply -f -` of one object.
    pub fn apply(&self, obj: &Value) -> Result<(), String> {
        self.run_stdin(&["apply", "-f", "-"], Some(&obj.to_string()))
            .map(|_| ())
    }

    /// `kubectl get ARGS -o json`.
    pub fn get(&self, args: &[&str]) -> Result<Value, String> {
        let mut a = vec!["get"];
        a.extend_from_slice(args);
        a.extend(["-o", "json"]);
        let text = self.run(&a)?;
        serde_json::from_str(&text).map_err(|e| format!("kubectl get {}: {e}", args.join(" ")))
    }

    /// Whether the agent's DaemonSet has every pod ready.
    pub fn agent_ready(&self) -> Result<(), String> {
        let ds = self.get(&["-n", AGENT_NS, "daemonset", "holdfast-agent"])?;
        let want = ds["status"]["desiredNumberScheduled"].as_i64().unwrap_or(0);
        let ready = ds["status"]["numberReady"].as_i64().unwrap_or(0);
        if want > 0 && ready == want {
            Ok(())
        } else {
            Err(format!(
                "the holdfast agent is not installed and Ready ({ready}/{want} pods)"
            ))
        }
    }

    /// The agent's log (every container of every agent pod, all lines, also of restarted ones).
    pub fn agent_log(&self) -> String {
        self.run(&[
            "-n",
            AGENT_NS,
            "logs",
            "-l",
            AGENT_SELECTOR,
            "--tail=-1",
            "--prefix",
        ])
        .unwrap_or_default()
    }

    /// A namespace of the scenarios' own (Pod Security `privileged`: hostPath and NET_ADMIN, as
    /// Istio without its CNI plugin needs), once its `default` ServiceAccount exists.
    pub fn namespace(&self, name: &str) -> Result<Namespace, String> {
        self.apply(&json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {
                "pod-security.kubernetes.io/enforce": "privileged",
                "holdfast.io/test": "cluster-promises",
            }},
        }))?;
        let ns = Namespace {
            kube: self.clone(),
            name: name.to_string(),
        };
        // The ServiceAccount admission refuses pods until the controller-manager made it
        // (docs/real-cluster.md, "What the real kubelet did differently").
        wait(
            Duration::from_secs(20),
            "the default ServiceAccount",
            || {
                self.run(&["-n", name, "get", "serviceaccount", "default"])
                    .ok()
                    .map(|_| ())
            },
        )?;
        Ok(ns)
    }
}

/// A namespace deleted (with everything in it) when dropped, also when a scenario panics.
pub struct Namespace {
    pub kube: Kube,
    pub name: String,
}

impl Namespace {
    /// `kubectl -n NS ARGS`.
    pub fn run(&self, args: &[&str]) -> Result<String, String> {
        let mut a = vec!["-n", self.name.as_str()];
        a.extend_from_slice(args);
        self.kube.run(&a)
    }

    pub fn get(&self, args: &[&str]) -> Result<Value, String> {
        let mut a = vec!["-n", self.name.as_str()];
        a.extend_from_slice(args);
        self.kube.get(&a)
    }

    pub fn apply(&self, obj: &Value) -> Result<(), String> {
        self.kube.apply(obj)
    }

    /// The pods matching a label selector.
    pub fn pods(&self, selector: &str) -> Vec<Value> {
        self.get(&["pods", "-l", selector])
            .ok()
            .and_then(|v| v["items"].as_array().cloned())
            .unwrap_or_default()
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        // Grace 0: the scenarios are over; what matters is that nothing is left.
        let _ = self.kube.run(&[
            "delete",
            "namespace",
            &self.name,
            "--wait=true",
            "--timeout=90s",
        ]);
    }
}

/// Polls `f` every 200 ms until it gives a value, or `timeout`.
pub fn wait<T>(
    timeout: Duration,
    what: &str,
    mut f: impl FnMut() -> Option<T>,
) -> Result<T, String> {
    let until = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() >= until {
            return Err(format!("{what}: not within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The host files the pods run and read, at paths every pod uid reaches ([`reach`]), and a work
/// directory (Envoy's bootstrap, the apps' reports) removed when dropped.
pub struct Files {
    pub sim_app: PathBuf,
    /// A copy of `sim_app` named `pilot-agent`: Istio's native-sidecar preStop hook runs
    /// `pilot-agent request ... POST drain`, and the agent knows that hook by its first word
    /// ending in `pilot-agent` (node-agent/src/mesh/istio.rs), as the injector writes it.
    pub pilot_agent: PathBuf,
    /// A copy of `sim_app` named `kuma-dp`: the kuma-dp stand-in runs as it, so its process is
    /// named `kuma-dp` and Kuma's native preStop hook, the injector's own `killall -USR2
    /// kuma-dp` (the node's psmisc killall, through the mounted `/usr`), finds it by name.
    pub kuma_dp: PathBuf,
    pub envoy: PathBuf,
    pub filter: Option<PathBuf>,
    pub work: PathBuf,
}

impl Files {
    pub fn stage(sim_app: &Path, run: &str) -> Result<Files, String> {
        let envoy = crate::envoy::envoy_binary().map_err(|e| e.to_string())?;
        let filter = crate::envoy::filter_wasm().ok();
        let root = PathBuf::from("/var/lib/holdfast-tests/cluster");
        let work = root.join(run);
        for d in [&root, &work] {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
            set_mode(d, 0o755)?;
        }
        let staged = reach::pod_files(sim_app, &envoy, filter.as_deref(), &work)
            .map_err(|e| e.to_string())?;
        let bin = work.join("bin");
        std::fs::create_dir_all(&bin).map_err(|e| format!("{}: {e}", bin.display()))?;
        set_mode(&bin, 0o755)?;
        let copy_as = |name: &str| -> Result<PathBuf, String> {
            let to = bin.join(name);
            std::fs::copy(&staged.sim_app, &to).map_err(|e| format!("{}: {e}", to.display()))?;
            set_mode(&to, 0o755)?;
            Ok(to)
        };
        Ok(Files {
            pilot_agent: copy_as("pilot-agent")?,
            kuma_dp: copy_as("kuma-dp")?,
            sim_app: staged.sim_app,
            envoy: staged.envoy,
            filter: staged.filter,
            work,
        })
    }

    /// A directory of the work dir, every uid may read it (the proxy's 1337).
    pub fn dir(&self, name: &str) -> Result<PathBuf, String> {
        let d = self.work.join(name);
        std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        set_mode(&d, 0o755)?;
        Ok(d)
    }

    /// Writes an Istio sidecar's Envoy configuration (src/sim/bootstrap.rs, as the simulated
    /// node's pods get it) into a directory of its own; returns that directory.
    pub fn sidecar_config(&self, name: &str, health: bool, mesh: Mesh) -> Result<PathBuf, String> {
        let dir = self.dir(&format!("envoy-{name}"))?;
        // Istio's stats matcher is Istio's: Kuma's and Consul's bootstraps keep every stat (as
        // the simulated node writes them, src/sim/kubelet.rs `write_sidecar_config`).
        let stats = match mesh {
            Mesh::Istio => Some(IstioStatsMatcher::shipped(false).map_err(|e| e.to_string())?),
            _ => None,
        };
        let cfg = SidecarConfig {
            // pilot-agent names the node from the pod's IP, unknown before the pod runs; Envoy
            // does not read it.
            node_id: format!("sidecar~0.0.0.0~{name}.promises~promises.svc.cluster.local"),
            node_cluster: format!("{name}.promises"),
            filter: self.filter.clone(),
            filter_config: String::new(),
            families: IpFamilies::V4,
            stats_matcher: stats,
            health_listener: health,
            mesh,
            admin_ip: None,
            xds: None,
        };
        cfg.write(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(dir)
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

fn set_mode(p: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {}: {e}", p.display()))
}

/// The remote services (`sim-app remote`) on the node's bridge address, killed when dropped.
pub struct Remote {
    child: Child,
    pub addr: SocketAddr,
}

impl Remote {
    pub fn start(sim_app: &Path) -> Result<Remote, String> {
        let addr = SocketAddr::from((NODE_GW, REMOTE_PORT));
        let mut child = Command::new(sim_app)
            .args(["remote", "--listen", &addr.to_string(), "--ipv4-only"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("sim-app remote: {e}"))?;
        let mut line = String::new();
        let out = child.stdout.take().ok_or("no stdout")?;
        let mut out = BufReader::new(out);
        let _ = out.read_line(&mut line);
        if !line.contains("ready") {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("sim-app remote on {addr} did not start: {line:?}"));
        }
        // Keep reading (and dropping) what it prints, so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in out.lines() {});
        Ok(Remote { child, addr })
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What every mesh's pod template shares ([`MeshedPod::parts`]).
struct Parts {
    sim_app: String,
    /// The pod's Envoy config directory (bootstrap and LDS/CDS files).
    config: PathBuf,
    volumes: Vec<Value>,
    /// The read-only host paths, as every container mounts them.
    mounts: Vec<Value>,
    /// The app container.
    app: Value,
}

/// How the proxy container is injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sidecar {
    /// `istio-proxy` a regular container after the app (Istio's default).
    Classic,
    /// `istio-proxy` an init container with `restartPolicy: Always` and Istio's startupProbe
    /// (`values.pilot.env.ENABLE_NATIVE_SIDECARS`).
    Native,
}

/// One meshed pod template, as Istio's injector leaves it, running the stand-ins.
#[derive(Debug, Clone)]
pub struct MeshedPod {
    pub name: String,
    pub app: AppScript,
    pub call_timeout: Duration,
    /// The pilot-agent stand-in starts Envoy this late (the xDS wait).
    pub proxy_delay: Duration,
    /// pilot-agent's `terminationDrainDuration`.
    pub drain: Duration,
    pub grace_s: i64,
    /// `false`: the opt-out annotation `holdfast.io/enabled: "false"` (the control).
    pub holdfast: bool,
    pub restart_policy: &'static str,
    /// KEP-5307 container restart rules on the app: restart it in place on these exit codes.
    pub app_restart_on: Vec<i32>,
    pub sidecar: Sidecar,
    /// The app serves inbound `ping` on this port.
    pub serve: Option<u16>,
    /// Istio's startup and readiness probes on the proxy (`/healthz/ready` on 15021) for a
    /// classic sidecar too (the injection template renders them for both); a native one always
    /// has them.
    pub proxy_probes: bool,
    pub labels: Vec<(String, String)>,
    /// A native `istio-proxy` gets Istio's preStop drain hook (`pilot-agent request
    /// --debug-port=15020 POST drain`, injection-template.yaml's default for native sidecars);
    /// off, the shape of `global.proxy.lifecycle` set (no hook).
    pub pre_stop_drain: bool,
    /// The mesh whose injector shaped the pod: Istio (default), or Kuma and Consul as their
    /// default installs inject them ([`MeshedPod::other_mesh_template`]).
    pub mesh: Mesh,
}

impl MeshedPod {
    pub fn new(name: &str, app: AppScript, holdfast: bool) -> MeshedPod {
        MeshedPod {
            name: name.to_string(),
            app,
            call_timeout: Duration::from_secs(10),
            proxy_delay: Duration::ZERO,
            drain: Duration::from_secs(5),
            grace_s: 30,
            holdfast,
            restart_policy: "Never",
            app_restart_on: Vec::new(),
            sidecar: Sidecar::Classic,
            serve: None,
            proxy_probes: false,
            labels: Vec::new(),
            pre_stop_drain: false,
            mesh: Mesh::Istio,
        }
    }

    /// The report the app writes (per pod: `reports` is mounted with `subPathExpr: $(POD_NAME)`,
    /// so the replicas of a Deployment each get theirs).
    pub fn report(files: &Files, pod_name: &str) -> PathBuf {
        files
            .work
            .join("reports")
            .join(pod_name)
            .join("app-report.jsonl")
    }

    /// The pod template (metadata and spec).
    pub fn template(&self, files: &Files, remote: SocketAddr) -> Result<Value, String> {
        if self.mesh != Mesh::Istio {
            return self.other_mesh_template(files, remote);
        }
        let probed = self.proxy_probes || self.sidecar == Sidecar::Native;
        let Parts {
            sim_app,
            config,
            volumes,
            mounts,
            app,
        } = self.parts(files, remote, probed)?;
        let path = |p: &Path| p.to_string_lossy().into_owned();
        // The pilot-agent stand-in as the simulated node runs it (src/sim/kubelet.rs
        // `proxy_args_of`, Istio).
        let mut proxy_args = vec![
            "pilot-agent".to_string(),
            "--envoy".into(),
            path(&files.envoy),
            "--bootstrap".into(),
            path(&config.join(BOOTSTRAP_FILE)),
            "--start-delay-ms".into(),
            self.proxy_delay.as_millis().to_string(),
            "--drain-ms".into(),
            self.drain.as_millis().to_string(),
            "--envoy-drain-time-s".into(),
            "45".into(),
            "--concurrency".into(),
            "2".into(),
            "--admin".into(),
            format!("127.0.0.1:{ADMIN_PORT}"),
        ];
        if probed {
            proxy_args.extend(["--status-port".into(), STATUS_PORT.to_string()]);
        }

        // Istio 1.28's injection template (src/sim/pod_object.rs `init_specs`, `proxy_spec`):
        // istio-init root with NET_ADMIN and NET_RAW only; the proxy as uid 1337.
        let init = json!({
            "name": "istio-init",
            "image": IMAGE, "imagePullPolicy": "Never",
            "command": [sim_app],
            "args": ["istio-init", "--min-duration-ms", "150"],
            "securityContext": {
                "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": false,
                "allowPrivilegeEscalation": false, "privileged": false,
                "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]},
            },
            "volumeMounts": mounts,
        });
        let probe = |period: i64, failures: i64| {
            json!({"httpGet": {"path": "/healthz/ready", "port": HEALTH_PORT},
                   "periodSeconds": period, "timeoutSeconds": 3, "failureThreshold": failures})
        };
        let mut proxy = json!({
            "name": "istio-proxy",
            "image": IMAGE, "imagePullPolicy": "Never",
            "command": [sim_app],
            "args": proxy_args,
            "ports": [{"containerPort": 15090, "name": "http-envoy-prom", "protocol": "TCP"}],
            "securityContext": {"runAsUser": 1337, "runAsGroup": 1337},
            "volumeMounts": mounts,
        });
        if probed {
            proxy["startupProbe"] = probe(1, 600);
            proxy["readinessProbe"] = probe(15, 4);
        }
        if self.sidecar == Sidecar::Native {
            proxy["restartPolicy"] = json!("Always");
            if self.pre_stop_drain {
                // src/sim/pod_object.rs PRE_STOP_DRAIN, with the staged `pilot-agent`.
                let mut hook = crate::sim::pod_object::PRE_STOP_DRAIN
                    .map(String::from)
                    .to_vec();
                hook[0] = path(&files.pilot_agent);
                proxy["lifecycle"] = json!({"preStop": {"exec": {"command": hook}}});
            }
        }
        let (inits, containers) = match self.sidecar {
            Sidecar::Classic => (vec![init], vec![app, proxy]),
            // reorderPod with a native sidecar: istio-init, then the proxy, then the rest.
            Sidecar::Native => (vec![init, proxy], vec![app]),
        };
        let status = match self.sidecar {
            Sidecar::Classic => {
                r#"{"initContainers":["istio-init"],"containers":["istio-proxy"],"volumes":[],"imagePullSecrets":null,"revision":"default"}"#
            }
            Sidecar::Native => {
                r#"{"initContainers":["istio-init","istio-proxy"],"containers":null,"volumes":[],"imagePullSecrets":null,"revision":"default"}"#
            }
        };
        let annotations = vec![("sidecar.istio.io/status".to_string(), status.to_string())];
        let labels = vec![("security.istio.io/tlsMode".to_string(), "istio".to_string())];
        Ok(self.finish(annotations, labels, inits, containers, volumes))
    }

    /// A Kuma or Consul pod as its injector writes it: the containers, annotations and labels
    /// of the simulated node's shapes (src/sim/mesh.rs `init_container`, `proxy_container`,
    /// `injected_metadata`, each citing its injector's source), with the containerd backend's
    /// commands (src/sim/kubelet.rs `proxy_args_of`): `sim-app mesh-init` for the init step,
    /// the kuma-dp or consul-dataplane stand-in for the proxy. The proxy keeps the injector's
    /// `args` after `--` (the agent reads Consul's admin flags there); the init container's
    /// command and args are the stand-in's.
    ///
    /// The defaults of each install: Kuma with its builtin DNS on (`KUMA_DNS_ENABLED`,
    /// kuma-init redirecting DNS to kuma-dp's UDP-only proxy on 15053), classic with the TCP
    /// admin as 2.13 injects it, or native with the Unix-socket admin as 2.14 does
    /// ([`Sidecar::Native`]); Consul classic with `-envoy-admin-bind-address=127.0.0.1`.
    ///
    /// Left out on purpose: Kuma's probes with the TCP admin (`GET /ready` on the pod IP's
    /// 9901, which a real Kuma serves through the control plane's `kuma:envoy:admin` listener,
    /// not in the stand-in's bootstrap); the kubelet's Ready does not decide any scenario here.
    pub fn other_mesh_template(&self, files: &Files, remote: SocketAddr) -> Result<Value, String> {
        use crate::sim::mesh::{self as sim_mesh, KumaAdmin, KUMA_DNS_PORT};
        let native = self.sidecar == Sidecar::Native;
        let mut spec = crate::sim::PodSpec::new(&self.name)
            .mesh(self.mesh)
            .mesh_drain(self.drain);
        if matches!(self.mesh, Mesh::Kuma(_)) {
            spec = spec.dns_capture(Duration::ZERO);
        }
        if native {
            spec = spec.native();
        }
        let Parts {
            sim_app,
            config,
            volumes: mut vols,
            mounts,
            app,
        } = self.parts(files, remote, false)?;
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let to_json = |c| serde_json::to_value(c).map_err(|e| e.to_string());

        let mut init = to_json(sim_mesh::init_container(&spec))?;
        let mut init_args = vec![
            "mesh-init".to_string(),
            "--mesh".into(),
            self.mesh.to_string(),
            "--min-duration-ms".into(),
            "150".into(),
        ];
        if spec.dns_capture.is_some() {
            init_args.extend(["--redirect-dns-port".into(), KUMA_DNS_PORT.to_string()]);
        }
        init["command"] = json!([sim_app]);
        init["args"] = json!(init_args);
        init["image"] = json!(IMAGE);
        init["imagePullPolicy"] = json!("Never");
        init["volumeMounts"] = json!(mounts);
        if self.mesh == Mesh::Consul {
            // consul-k8s container_init.go: with transparent proxy and without the CNI plugin
            // the init container runs `connect-init` as root with NET_ADMIN ("requires both
            // being a root user and having NET_ADMIN capability"); the sim's spec keeps only
            // the uid the agent excludes (5996). NET_RAW beside it as the containerd backend
            // grants it.
            init["securityContext"] = json!({
                "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": false, "privileged": false,
                "capabilities": {"add": ["NET_ADMIN", "NET_RAW"]},
            });
        }

        let mut proxy = to_json(sim_mesh::proxy_container(&spec))?;
        let bootstrap = path(&config.join(BOOTSTRAP_FILE));
        let mut command = vec![sim_app.clone()];
        let mut proxy_mounts = mounts.clone();
        match self.mesh {
            Mesh::Kuma(admin) => {
                command[0] = path(&files.kuma_dp);
                command.extend([
                    "kuma-dp".to_string(),
                    "--envoy".into(),
                    path(&files.envoy),
                    "--bootstrap".into(),
                    bootstrap,
                    "--tmpdir".into(),
                    "/tmp".into(),
                    "--tmp-is-mounted".into(),
                    "--drain-time-ms".into(),
                    self.drain.as_millis().to_string(),
                    "--start-delay-ms".into(),
                    self.proxy_delay.as_millis().to_string(),
                    "--concurrency".into(),
                    "2".into(),
                    "--dns-port".into(),
                    KUMA_DNS_PORT.to_string(),
                    "--dns-delay-ms".into(),
                    "0".into(),
                ]);
                if admin == KumaAdmin::UnixSocket {
                    command.push("--admin-socket".into());
                } else if let Some(p) = proxy.as_object_mut() {
                    p.remove("readinessProbe");
                    p.remove("livenessProbe");
                    p.remove("startupProbe");
                }
                // injector.go: the `kuma-sidecar-tmp` emptyDir on the sidecar's /tmp, where
                // kuma-dp makes its workdir (and 2.14 its admin socket).
                vols.push(json!({"name": "kuma-sidecar-tmp", "emptyDir": {}}));
                proxy_mounts.push(json!({"name": "kuma-sidecar-tmp", "mountPath": "/tmp"}));
                // A native sidecar keeps the injector's preStop `killall -USR2 kuma-dp` (from
                // `proxy_container`), run by the real kubelet in the container with the node's
                // killall; the stand-in runs as `kuma-dp` (`Files::kuma_dp`) for it to match.
            }
            Mesh::Consul => {
                if native {
                    // consul-k8s's exec startup probe (`consul-dataplane -check-proxy-health`,
                    // tests/src/sim/mesh.rs CONSUL_NATIVE_STARTUP_PROBE), run by the real
                    // kubelet in the container as the stand-in's same check.
                    proxy["startupProbe"]["exec"]["command"] =
                        json!([sim_app, "consul-check-proxy-health"]);
                }
                command.extend([
                    "consul-dataplane".to_string(),
                    "--admin".into(),
                    spec.admin_addr().to_string(),
                    "--envoy".into(),
                    path(&files.envoy),
                    "--bootstrap".into(),
                    bootstrap,
                    "--shutdown-grace-period-ms".into(),
                    self.drain.as_millis().to_string(),
                    "--start-delay-ms".into(),
                    self.proxy_delay.as_millis().to_string(),
                    "--concurrency".into(),
                    "2".into(),
                ]);
            }
            Mesh::Istio => unreachable!("Istio pods are `template`'s"),
        }
        command.push("--".into());
        proxy["command"] = json!(command);
        proxy["image"] = json!(IMAGE);
        proxy["imagePullPolicy"] = json!("Never");
        proxy["volumeMounts"] = json!(proxy_mounts);

        let (inits, containers) = match (self.mesh, native) {
            (_, true) => (vec![init, proxy], vec![app]),
            // Kuma's injector puts the classic sidecar first (injector.go).
            (Mesh::Kuma(_), false) => (vec![init], vec![proxy, app]),
            (_, false) => (vec![init], vec![app, proxy]),
        };
        let (a, l) = sim_mesh::injected_metadata(&spec);
        let own = |m: Vec<(&str, String)>| -> Vec<(String, String)> {
            m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
        };
        Ok(self.finish(own(a), own(l), inits, containers, vols))
    }

    /// What every mesh's template shares: the Envoy config (the bootstrap of the pod's mesh,
    /// Istio's health listener when `health`), the host paths every container gets read-only
    /// at the same path (src/cri/kubelet.rs `mounts`) and the app container, which writes its
    /// report to a `hostPath` of its own (`subPathExpr: $(POD_NAME)`).
    fn parts(&self, files: &Files, remote: SocketAddr, health: bool) -> Result<Parts, String> {
        let config = files.sidecar_config(&self.name, health, self.mesh)?;
        let reports = files.dir("reports")?;
        let report_in = PathBuf::from("/var/run/holdfast-report");
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let sim_app = path(&files.sim_app);

        let mut app_args = self
            .app
            .args(&report_in.join("app-report.jsonl"), remote, self.serve);
        app_args.extend([
            "--call-timeout-ms".into(),
            self.call_timeout.as_millis().to_string(),
        ]);

        let mut ro: Vec<(String, PathBuf, &str)> = vec![
            ("host-usr".into(), "/usr".into(), "Directory"),
            (
                "host-alternatives".into(),
                "/etc/alternatives".into(),
                "Directory",
            ),
            ("sim-app".into(), files.sim_app.clone(), "File"),
            ("pilot-agent".into(), files.pilot_agent.clone(), "File"),
            ("kuma-dp".into(), files.kuma_dp.clone(), "File"),
            ("envoy".into(), files.envoy.clone(), "File"),
            ("envoy-config".into(), config.clone(), "Directory"),
        ];
        if let Some(f) = &files.filter {
            ro.push(("filter".into(), f.clone(), "File"));
        }
        let mut volumes: Vec<Value> = ro
            .iter()
            .map(|(n, p, t)| json!({"name": n, "hostPath": {"path": path(p), "type": t}}))
            .collect();
        volumes.push(
            json!({"name": "reports", "hostPath": {"path": path(&reports), "type": "Directory"}}),
        );
        let mounts: Vec<Value> = ro
            .iter()
            .map(|(n, p, _)| json!({"name": n, "mountPath": path(p), "readOnly": true}))
            .collect();
        let mut app_mounts = mounts.clone();
        app_mounts.push(
            json!({"name": "reports", "mountPath": path(&report_in), "subPathExpr": "$(POD_NAME)"}),
        );
        let mut app = json!({
            "name": "app",
            "image": IMAGE, "imagePullPolicy": "Never",
            "command": [sim_app],
            "args": app_args,
            "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "volumeMounts": app_mounts,
        });
        if let Some(port) = self.serve {
            app["ports"] = json!([{"containerPort": port, "name": "ping", "protocol": "TCP"}]);
        }
        if !self.app_restart_on.is_empty() {
            // KEP-5307 (k8s.io/api v0.35 core/v1 types.go `ContainerRestartRule`): a regular
            // container's own restartPolicy and rules; beta and on by default in 1.35
            // (feature gate ContainerRestartRules).
            app["restartPolicy"] = json!("Never");
            app["restartPolicyRules"] = json!([{
                "action": "Restart",
                "exitCodes": {"operator": "In", "values": self.app_restart_on},
            }]);
        }
        Ok(Parts {
            sim_app,
            config,
            volumes,
            mounts,
            app,
        })
    }

    /// The template from its parts: the injector's annotations and labels beside the pod's own
    /// (`app`, the opt-out annotation of a control, [`MeshedPod::labels`]).
    fn finish(
        &self,
        injected_annotations: Vec<(String, String)>,
        injected_labels: Vec<(String, String)>,
        inits: Vec<Value>,
        containers: Vec<Value>,
        volumes: Vec<Value>,
    ) -> Value {
        let mut annotations = serde_json::Map::new();
        for (k, v) in injected_annotations {
            annotations.insert(k, json!(v));
        }
        if !self.holdfast {
            annotations.insert(holdfast::config::ANNOTATION_ENABLED.into(), json!("false"));
        }
        let mut labels = serde_json::Map::new();
        labels.insert("app".into(), json!(self.name));
        for (k, v) in injected_labels
            .into_iter()
            .chain(self.labels.iter().cloned())
        {
            labels.insert(k, json!(v));
        }
        json!({
            "metadata": {"labels": labels, "annotations": annotations},
            "spec": {
                "restartPolicy": self.restart_policy,
                "terminationGracePeriodSeconds": self.grace_s,
                "automountServiceAccountToken": false,
                "enableServiceLinks": false,
                "initContainers": inits,
                "containers": containers,
                "volumes": volumes,
            },
        })
    }

    /// A bare Pod of this template.
    pub fn pod(&self, ns: &str, files: &Files, remote: SocketAddr) -> Result<Value, String> {
        let mut t = self.template(files, remote)?;
        t["metadata"]["name"] = json!(self.name);
        t["metadata"]["namespace"] = json!(ns);
        Ok(json!({"apiVersion": "v1", "kind": "Pod", "metadata": t["metadata"], "spec": t["spec"]}))
    }
}

/// A container's status by name (regular or init), from a Pod object.
pub fn container_status<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    ["containerStatuses", "initContainerStatuses"]
        .iter()
        .filter_map(|k| pod["status"][k].as_array())
        .flatten()
        .find(|c| c["name"] == name)
}
