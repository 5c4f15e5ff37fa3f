//! The netns kubelet stand-in's native-sidecar paths (the rules are in [`crate::sim::native`]):
//! the proxy as a restartable init container after `istio-init`, the app started once its
//! startup probe passed, its restart with back-off while the pod runs, Istio's preStop hook and
//! the ordered stop on deletion and at a Job's end. Also the prober of a probed classic proxy.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::{terminated, PodCore, PodEvent, PodWorker, Slot};
use crate::sim::native::{
    pre_stop_sim_args, record_sidecar_start, record_sidecar_start_error, start_proxy_prober,
    NativeKubelet,
};
use crate::sim::process::{notify_exit, reap, spawn_in, Exit};
use crate::sim::random_hex;

impl PodWorker {
    /// Starts the prober of the proxy if the spec asks for probes (once per pod: its tickers
    /// run from the pod's admission), in the pod's netns.
    pub(super) fn start_prober(&mut self) {
        if self.core.probe.is_some() || !self.core.view(|v| v.spec.proxy_probes) {
            return;
        }
        let Some(netns) = self.netns_file.as_ref().and_then(|f| f.try_clone().ok()) else {
            return;
        };
        let (name, admitted, tx) = (self.core.name.clone(), self.core.admitted, self.tx.clone());
        self.core.probe = Some(
            self.core
                .view(|v| start_proxy_prober(v, &name, Some(netns), admitted, tx)),
        );
    }

    /// Tells the prober which proxy container runs now.
    pub(super) fn probe_running(&self, id: &str) {
        if let Some(p) = &self.core.probe {
            p.running(id);
        }
    }

    /// Starts (or restarts) the native sidecar: pilot-agent and Envoy, in a new container.
    fn spawn_sidecar(&mut self) {
        let id = random_hex(32);
        let restarting = self
            .core
            .view(|v| v.sidecar.as_ref().is_some_and(|c| c.id.is_some()));
        if !restarting {
            if let Err(e) = self.write_sidecar_config() {
                eprintln!("sim: pod {}: {e}", self.core.name);
            }
        }
        let args = self.proxy_args();
        let name = self.core.view(|v| v.spec.proxy_container());
        match self.spawn(Slot::Sidecar, &id, &args, name) {
            Ok(pid) => {
                self.core
                    .update(|v| record_sidecar_start(v, &id, Some(pid), restarting));
                self.probe_running(&id);
            }
            Err(e) => {
                eprintln!("sim: pod {}: cannot start the sidecar: {e}", self.core.name);
                self.core.update(|v| record_sidecar_start_error(v, &e));
            }
        }
    }

    /// The sidecar's process exited: restart it with back-off while the pod runs; during the
    /// pod's termination it stays terminated ([`NativeKubelet::sidecar_exited`]).
    pub(super) fn on_sidecar_exit(&mut self, exit: Exit) {
        if let Some(p) = &self.core.probe {
            p.stopped();
        }
        let finished = Instant::now();
        let t = self
            .core
            .view(|v| v.sidecar.as_ref().map(|c| terminated(c, exit)));
        let Some(t) = t else { return };
        let killing = self.pod_stopping() || self.core.native.killing();
        if !killing && !self.core.env.status_lag.is_zero() {
            // The kubelet sees the exit at its next PLEG relist (NodeOptions::status_lag).
            std::thread::sleep(self.core.env.status_lag);
        }
        self.pre_stop_pid = None;
        self.sidecar_exited(t, finished);
    }

    /// Istio's preStop hook, as the kubelet execs it in the container: `pilot-agent request
    /// --debug-port=15020 POST drain` (`sim-app request ...`) in the pod's netns and the
    /// sidecar's cgroup.
    fn spawn_pre_stop(&mut self) {
        let (Some(netns), Some(cg)) = (self.netns_file.as_ref(), self.cgroups.get(&Slot::Sidecar))
        else {
            self.core.native.hook_done();
            return;
        };
        let hook = self
            .core
            .view(|v| v.spec.pre_stop_command())
            .unwrap_or_default();
        let args = pre_stop_sim_args(&hook);
        // The hook's output goes to `prestop.log` in the pod's directory (the kubelet keeps it
        // for a FailedPreStopHook event).
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.pod_dir.join("prestop.log"));
        let mut cmd = Command::new(&self.core.env.sim_app);
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.map_or_else(|_| Stdio::null(), Stdio::from));
        match spawn_in(&mut cmd, netns, Some(&cg.procs_file())) {
            Ok(child) => {
                let pid = child.id();
                drop(child); // Reaped by pid on its exit event.
                self.pre_stop_pid = Some(pid);
                notify_exit(pid, self.tx.clone(), PodEvent::HookDone { pid });
            }
            Err(e) => {
                eprintln!("sim: pod {}: preStop hook: {e}", self.core.name);
                self.core.native.hook_done();
            }
        }
    }

    /// The preStop hook's process exited.
    pub(super) fn on_hook_done(&mut self, pid: u32) {
        let exit = reap(pid);
        if self.pre_stop_pid == Some(pid) {
            self.pre_stop_pid = None;
            if exit.code != 0 {
                // kubelet records a FailedPreStopHook event and goes on.
                eprintln!(
                    "sim: pod {}: preStop hook exited {}",
                    self.core.name, exit.code
                );
            }
            self.hook_returned();
        }
    }

    /// Timers of a native pod: the sidecar's restart after its back-off, its stop's deadlines,
    /// and SIGKILL of containers whose stop timeout ran out.
    pub(super) fn on_native_timer(&mut self, now: Instant) {
        self.native_timers(now);
        let due: Vec<Slot> = self
            .kill_at
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(s, _)| *s)
            .collect();
        for slot in due {
            self.kill_at.remove(&slot);
            if let Some(cg) = self.cgroups.get(&slot) {
                cg.kill_all();
            }
        }
    }
}

/// The netns backend's containers are processes: SIGTERM, and SIGKILL of the container's cgroup
/// at its timeout (`kill_at`, [`PodWorker::on_native_timer`]).
impl NativeKubelet for PodWorker {
    fn core(&self) -> &PodCore {
        &self.core
    }

    fn core_mut(&mut self) -> &mut PodCore {
        &mut self.core
    }

    fn sidecar_running(&self) -> bool {
        self.live.values().any(|s| *s == Slot::Sidecar)
    }

    fn others_running(&self) -> bool {
        self.live
            .values()
            .any(|s| matches!(s, Slot::Container(_) | Slot::Init | Slot::UserInit))
    }

    fn start_sidecar(&mut self) {
        self.spawn_sidecar();
    }

    fn start_regular_containers(&mut self) {
        PodWorker::start_regular_containers(self);
    }

    fn stop_regular(&mut self, grace: u64) {
        let kill_at = Instant::now() + Duration::from_secs(grace);
        let regular: Vec<(u32, Slot)> = self
            .live
            .iter()
            .filter(|(_, s)| !matches!(s, Slot::Sandbox | Slot::Sidecar))
            .map(|(p, s)| (*p, *s))
            .collect();
        for (pid, slot) in regular {
            crate::sim::process::signal(pid, Signal::SIGTERM);
            self.kill_at.insert(slot, kill_at);
        }
    }

    fn stop_sidecar(&mut self, timeout: u64) {
        let pid = self
            .live
            .iter()
            .find(|(_, s)| **s == Slot::Sidecar)
            .map(|(p, _)| *p);
        if let Some(pid) = pid {
            crate::sim::process::signal(pid, Signal::SIGTERM);
            self.kill_at
                .insert(Slot::Sidecar, Instant::now() + Duration::from_secs(timeout));
        }
    }

    fn run_pre_stop(&mut self, _grace: u64) {
        self.spawn_pre_stop();
    }
}
