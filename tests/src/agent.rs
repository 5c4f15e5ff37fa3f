//! The holdfast node agent as the tests run it: the real `holdfast` binary, read through its
//! status API the way an operator would. On the netns backend it is a process of the host; on
//! the containerd backend ([`AgentProcess::for_node`]) it is the DaemonSet's pod as rendered
//! from `manifests/`, its image pulled from a registry ([`crate::cri::agent_pod`]), and
//! `/status` is read from inside that pod's network namespace, as `kubectl port-forward` reaches
//! it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use holdfast::api::{NodeStatus, PodStatus};

/// The `holdfast` binary cargo built next to this test executable (`target/<profile>/holdfast`),
/// or `$HOLDFAST_BIN`.
pub fn holdfast_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("HOLDFAST_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("locating the test executable")?;
    // target/<profile>/deps/<test> or target/<profile>/<bin>
    near(&exe, 1, 3, "holdfast").with_context(|| {
        format!(
            "no holdfast binary near {}: build it with `cargo build -p holdfast` (cargo test --workspace does) or set HOLDFAST_BIN",
            exe.display()
        )
    })
}

/// `rel` in one of the `take` directories above `exe` from the `skip`th up, the nearest first.
fn near(exe: &Path, skip: usize, take: usize, rel: &str) -> Option<PathBuf> {
    exe.ancestors()
        .skip(skip)
        .take(take)
        .map(|dir| dir.join(rel))
        .find(|candidate| candidate.is_file())
}

/// The agent built with the `quota` profile (optimised as `release`, without its fat LTO:
/// Cargo.toml), which the hostile suite's short form runs under the DaemonSet's CPU quota:
/// `$HOLDFAST_QUOTA_BIN`, else `<target>/quota/holdfast` beside the test executable's
/// `<target>/<profile>/`. `just test-all` and `just test-containerd` build it (`cargo build --profile quota -p holdfast`).
pub fn holdfast_quota_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("HOLDFAST_QUOTA_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("locating the test executable")?;
    // target/<profile>/deps/<test> or target/<profile>/<bin>: the target dir is 2 or 3 up.
    near(&exe, 2, 2, "quota/holdfast").with_context(|| {
        format!(
            "no optimised holdfast binary (target/quota/holdfast) near {}: build it with \
             `cargo build --profile quota -p holdfast --bin holdfast` (`just test-all` does) or set \
             HOLDFAST_QUOTA_BIN",
            exe.display()
        )
    })
}

/// The binary the containerd backend's DaemonSet pod runs: `$HOLDFAST_BIN`, else the `quota`
/// profile's ([`holdfast_quota_binary`]). That pod runs under the DaemonSet's CPU quota (200m),
/// where a debug build is not the program a node runs: it spends 3–4× the CPU on the same work
/// (20 pods booting at once: 0.16 cores for 11 s, throttled every period, against 0.05 for the
/// optimised build), and CI once saw its netns lookups of 8 of those 20 pods fall seconds
/// behind their apps' first calls (5b55501, `hold::startup_hold_twenty_pods_at_once`).
///
/// Without the `quota` binary: an error in CI (`CI` set), and outside CI the test profile's
/// binary with a warning naming the build command.
pub fn holdfast_pod_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("HOLDFAST_BIN") {
        return Ok(PathBuf::from(p));
    }
    match holdfast_quota_binary() {
        Ok(p) => Ok(p),
        Err(e) if std::env::var_os("CI").is_some() => Err(e),
        Err(e) => {
            eprintln!(
                "holdfast-tests: the agent's pod runs the debug build under the DaemonSet's CPU quota, slower than a node's: {e:#}"
            );
            holdfast_binary()
        }
    }
}

/// A running agent. Killed (SIGKILL) on drop; its pod, if it runs in one, removed.
pub struct AgentProcess {
    child: Option<Child>,
    /// On the containerd backend: the agent's DaemonSet pod.
    pod: Option<crate::cri::agent_pod::AgentPod>,
    status_addr: SocketAddr,
    log: PathBuf,
    args: Vec<String>,
    /// The binary to run; `None` = [`holdfast_binary`].
    binary: Option<PathBuf>,
}

impl AgentProcess {
    /// Starts `holdfast agent --node-name NODE --pods-dir DIR` with a free status port, logging
    /// to `log`, and waits until its status API answers.
    pub fn start(
        node_name: &str,
        pods_dir: &Path,
        log: &Path,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_binary(None, node_name, pods_dir, log, extra)
    }

    /// The agent of a simulated node, with default flags, its log in the node's work dir.
    pub fn for_node(node: &crate::sim::SimNode) -> anyhow::Result<Self> {
        Self::for_node_with(node, &[])
    }

    /// The agent of a simulated node with `extra` flags, its log at `<work dir>/agent.log`: a
    /// host process on the netns backend; on the containerd backend the DaemonSet's pod, pulled
    /// and rendered from `manifests/` (the flags appended to its args, as a patch would).
    pub fn for_node_with(node: &crate::sim::SimNode, extra: &[&str]) -> anyhow::Result<Self> {
        let log = node.work_dir().join("agent.log");
        if node.runtime() != crate::sim::Runtime::Containerd {
            return Self::start(node.node_name(), node.pods_dir(), &log, extra);
        }
        let rt = crate::cri::shared().map_err(anyhow::Error::msg)?;
        let pulled = crate::cri::agent_image::pulled(rt)?;
        let ctx = crate::cri::agent_pod::PodContext {
            node_label: node.test_name().to_string(),
            node_name: node.node_name().to_string(),
            pods_dir: node.pods_dir().to_path_buf(),
            log_dir: node.work_dir().to_path_buf(),
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
        };
        let pod =
            crate::cri::agent_pod::AgentPod::start(rt, pulled.spec, &ctx, Duration::from_secs(30))?;
        let ip: std::net::IpAddr = pod.pod_ip.parse().context("the agent pod's IP")?;
        Ok(Self {
            child: None,
            status_addr: SocketAddr::new(ip, pod.status_port),
            log,
            args: Vec::new(),
            binary: None,
            pod: Some(pod),
        })
    }

    /// The agent's pod, on the containerd backend.
    pub fn pod_handle(&self) -> Option<&crate::cri::agent_pod::AgentPod> {
        self.pod.as_ref()
    }

    /// Like [`AgentProcess::start`] with a given `holdfast` binary (a benchmark's baseline build).
    pub fn start_binary(
        binary: Option<&Path>,
        node_name: &str,
        pods_dir: &Path,
        log: &Path,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let port = free_port()?;
        let mut args = vec![
            "agent".to_string(),
            "--node-name".into(),
            node_name.into(),
            "--pods-dir".into(),
            pods_dir.display().to_string(),
            "--status-listen".into(),
            format!("127.0.0.1:{port}"),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut agent = Self {
            child: None,
            pod: None,
            status_addr: SocketAddr::from(([127, 0, 0, 1], port)),
            log: log.to_path_buf(),
            args,
            binary: binary.map(Path::to_path_buf),
        };
        agent.spawn()?;
        Ok(agent)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening agent log {}", self.log.display()))?;
        let binary = match &self.binary {
            Some(b) => b.clone(),
            None => holdfast_binary()?,
        };
        let child = Command::new(binary)
            .args(&self.args)
            .env("HOLDFAST_LOG", "holdfast=debug,info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting holdfast agent")?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.get("/healthz").is_ok() {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!(
                    "holdfast agent exited with {status}; log:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        bail!(
            "holdfast agent status API did not answer in 10 s; log:\n{}",
            self.log_tail()
        )
    }

    /// The status API's address (the same across restarts; in a pod, the pod IP's, where
    /// `/status` answers 403: read it with [`AgentProcess::get`]).
    pub fn status_addr(&self) -> SocketAddr {
        self.status_addr
    }

    /// The agent's pid.
    pub fn pid(&self) -> Option<u32> {
        if let Some(p) = &self.pod {
            return p.pid();
        }
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL, as when the node OOM-kills the agent. The agent cannot clean up.
    pub fn kill(&mut self) {
        if let Some(p) = self.pod.as_mut() {
            if let Err(e) = p.kill() {
                eprintln!("agent pod: cannot kill the agent: {e}");
            }
            return;
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait, as on a rolling update.
    pub fn terminate(&mut self) -> anyhow::Result<()> {
        if let Some(p) = self.pod.as_mut() {
            return p.terminate().map_err(Into::into);
        }
        if let Some(mut c) = self.child.take() {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            )?;
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if c.try_wait()?.is_some() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    bail!("agent did not stop within 10 s of SIGTERM");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(())
    }

    /// Starts the agent again with the same arguments (after `kill` or `terminate`); in a pod,
    /// a new container in the same sandbox, as the kubelet restarts one.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        if let Some(p) = self.pod.as_mut() {
            return p.restart(Duration::from_secs(30)).map_err(Into::into);
        }
        self.kill();
        self.spawn()
    }

    /// The node status from `/status`.
    pub fn status(&self) -> anyhow::Result<NodeStatus> {
        let body = self.get("/status")?;
        serde_json::from_str(&body).context("parsing /status")
    }

    /// One pod's row, if tracked.
    pub fn pod(&self, namespace: &str, name: &str) -> anyhow::Result<Option<PodStatus>> {
        Ok(self
            .status()?
            .pods
            .into_iter()
            .find(|p| p.namespace == namespace && p.name == name))
    }

    /// Waits until pod `namespace/name`'s hold has ended (any outcome) and returns its row.
    pub fn wait_hold_ended(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> anyhow::Result<PodStatus> {
        self.wait_pod(namespace, name, timeout, "hold ended", |row| {
            row.hold.as_ref().is_some_and(|h| h.outcome.is_some())
        })
    }

    /// Polls `/status` until `pred` holds for the pod's row, or fails after `timeout` with the
    /// last row and the agent's log.
    pub fn wait_pod(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&PodStatus) -> bool,
    ) -> anyhow::Result<PodStatus> {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        while Instant::now() < deadline {
            if let Ok(Some(row)) = self.pod(namespace, name) {
                if pred(&row) {
                    return Ok(row);
                }
                last = Some(row);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        bail!(
            "pod {namespace}/{name}: {what} not seen within {timeout:?}; last status: {last:?}\nagent log:\n{}",
            self.log_tail()
        )
    }

    /// GET a path of the status API (HTTP/1.1, connection close): at its address on the host,
    /// or from inside the agent's pod (its loopback, as a port-forward reaches it).
    pub fn get(&self, path: &str) -> anyhow::Result<String> {
        let mut s = match &self.pod {
            Some(p) => p.connect_local(p.status_port, Duration::from_secs(1))?,
            None => TcpStream::connect_timeout(&self.status_addr, Duration::from_secs(1))?,
        };
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: holdfast\r\nConnection: close\r\n\r\n"
        )?;
        let mut raw = String::new();
        s.read_to_string(&mut raw)?;
        let (head, body) = raw.split_once("\r\n\r\n").context("no HTTP header end")?;
        if !head.starts_with("HTTP/1.1 200") {
            bail!("GET {path}: {}", head.lines().next().unwrap_or(""));
        }
        Ok(body.to_string())
    }

    /// The agent's whole log so far (to look for an Event: without an API server the agent
    /// logs each one with its reason).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The machine inputs the agents of this log recorded for `pod` (`namespace/name`), one
    /// sequence per agent that followed it, each replayed through the machine (issue 28 item 6;
    /// `holdfast::lifecycle::replay`). Panics when a sequence breaks a rule every sequence keeps,
    /// or when a host agent (netns backend: it logs at debug) recorded nothing. The DaemonSet's
    /// pod (containerd backend) logs at info, as shipped: no sequence, nothing replayed. With
    /// `HOLDFAST_RECORD_INPUTS=<dir>` the sequences are also written to `<dir>/<file>.log`: a
    /// corpus file for the machine's tests (`node-agent/tests/corpus/inputs/`).
    pub fn replay_inputs(
        &self,
        pod: &str,
        file: &str,
    ) -> Vec<(
        holdfast::lifecycle::replay::Recording,
        holdfast::lifecycle::replay::Replayed,
    )> {
        use holdfast::lifecycle::replay::Recording;
        let recordings = Recording::from_log(&self.log_text(), pod)
            .unwrap_or_else(|e| panic!("the agent log's recorded inputs of {pod}: {e}"));
        if self.pod.is_none() {
            assert!(
                !recordings.is_empty(),
                "the agent recorded no input of {pod} (HOLDFAST_LOG holdfast=debug)"
            );
        }
        if let Some(dir) = std::env::var_os("HOLDFAST_RECORD_INPUTS") {
            let text: String = recordings.iter().map(|r| r.to_log(pod)).collect();
            let path = PathBuf::from(dir).join(format!("{file}.log"));
            if let Err(e) = std::fs::write(&path, text) {
                eprintln!("cannot record the inputs to {}: {e}", path.display());
            }
        }
        let ready_poll = holdfast::config::HoldSettings::default().ready_poll;
        recordings
            .into_iter()
            .map(|r| {
                let replayed = r.replay(ready_poll);
                if let Err(e) = replayed.check() {
                    panic!("{pod}'s recorded inputs, replayed: {e}");
                }
                (r, replayed)
            })
            .collect()
    }

    /// The last lines of the agent's log (for failure messages).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}
