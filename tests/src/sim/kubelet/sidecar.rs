//! The netns kubelet stand-in's native-sidecar paths (the rules are in [`crate::sim::native`]):
//! the proxy as a restartable init container after `istio-init`, the app started once its
//! startup probe passed, its restart with back-off while the pod runs, Istio's preStop hook and
//! the ordered stop on deletion and at a Job's end. Also the prober of a probed classic proxy.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::{terminated, PodEvent, PodWorker, Slot};
use crate::sim::native::{
    apply_probe, grace_secs, record_sidecar_exit, record_sidecar_start, record_sidecar_start_error,
    regular_done_for_good, AfterExit, Probed, MIN_GRACE_SECS,
};
use crate::sim::prober::{self, ProbeResult, ProbeTarget};
use crate::sim::process::{notify_exit, reap, spawn_in, Exit};
use crate::sim::random_hex;

impl PodWorker {
    pub(super) fn is_native(&self) -> bool {
        self.view(|v| v.sidecar.is_some())
    }

    /// Starts the prober of the proxy if the spec asks for probes (once per pod: its tickers
    /// run from the pod's admission).
    pub(super) fn start_prober(&mut self) {
        if self.probe.is_some() || !self.view(|v| v.spec.proxy_probes) {
            return;
        }
        let Some(netns) = self.netns_file.as_ref().and_then(|f| f.try_clone().ok()) else {
            return;
        };
        let target = ProbeTarget::default();
        let (addr, path) = self.view(crate::sim::native::proxy_probe);
        let tx = self.tx.clone();
        prober::spawn_path(
            path,
            &self.name,
            Some(netns),
            addr,
            self.admitted,
            target.clone(),
            move |r| {
                let _ = tx.send(PodEvent::Probe(r));
            },
        );
        self.probe = Some(target);
    }

    /// Tells the prober which proxy container runs now.
    pub(super) fn probe_running(&self, id: &str) {
        if let Some(p) = &self.probe {
            p.running(id);
        }
    }

    /// A probe result: update the container's `started`/`ready`; a native sidecar's first
    /// startup success lets the regular containers start.
    pub(super) fn on_probe(&mut self, r: ProbeResult) {
        let probed = self.update(|v| apply_probe(v, &r));
        if probed == Probed::SidecarStarted && !self.pod_stopping() && !self.native.killing() {
            self.start_regular_containers();
        }
    }

    /// The pod is deleted or the node shuts down.
    fn pod_stopping(&self) -> bool {
        self.deleting || self.shutting_down
    }

    /// Starts (or restarts) the native sidecar: pilot-agent and Envoy, in a new container.
    pub(super) fn start_sidecar(&mut self) {
        let id = random_hex(32);
        let restarting = self.view(|v| v.sidecar.as_ref().is_some_and(|c| c.id.is_some()));
        if !restarting {
            if let Err(e) = self.write_sidecar_config() {
                eprintln!("sim: pod {}: {e}", self.name);
            }
        }
        let args = self.proxy_args();
        let name = self.view(|v| v.spec.proxy_container());
        match self.spawn(Slot::Sidecar, &id, &args, name) {
            Ok(pid) => {
                self.update(|v| record_sidecar_start(v, &id, Some(pid), restarting));
                self.probe_running(&id);
            }
            Err(e) => {
                eprintln!("sim: pod {}: cannot start the sidecar: {e}", self.name);
                self.update(|v| record_sidecar_start_error(v, &e));
            }
        }
    }

    /// The sidecar's process exited: restart it with back-off while the pod runs; during the
    /// pod's termination it stays terminated.
    pub(super) fn on_sidecar_exit(&mut self, exit: Exit) {
        if let Some(p) = &self.probe {
            p.stopped();
        }
        let finished = Instant::now();
        let t = self.view(|v| v.sidecar.as_ref().map(|c| terminated(c, exit)));
        let Some(t) = t else { return };
        let killing = self.pod_stopping() || self.native.killing();
        if !killing && !self.env.status_lag.is_zero() {
            // The kubelet sees the exit at its next PLEG relist (NodeOptions::status_lag).
            std::thread::sleep(self.env.status_lag);
        }
        self.pre_stop_pid = None;
        let next = self
            .native
            .exited(finished, Instant::now(), self.pod_stopping());
        self.update(|v| record_sidecar_exit(v, t, next));
        if next == AfterExit::StartNow {
            self.start_sidecar();
        }
    }

    /// A regular container exited (already recorded): while the pod is deleted the sidecar may
    /// now have its turn; otherwise a Job whose regular containers are all done for good is
    /// killed, sidecar included.
    pub(super) fn after_regular_exit(&mut self) {
        if self.deleting || self.native.killing() {
            self.advance_sidecar_stop();
            return;
        }
        if self.shutting_down {
            return;
        }
        if self.view(regular_done_for_good) {
            self.native.kill();
            self.begin_sidecar_stop();
        }
    }

    /// Deletion of a native pod: SIGTERM to the regular containers at once (SIGKILL after the
    /// grace period, at least 2 s), the sidecar's hook and ordered stop.
    pub(super) fn on_native_delete(&mut self) {
        self.native.kill();
        let grace = self.view(|v| grace_secs(v.spec.grace)).max(MIN_GRACE_SECS);
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
        if !self.native.stopping() {
            self.begin_sidecar_stop();
        }
    }

    /// Begins the sidecar's stop (if it runs): its preStop hook now, then its turn.
    fn begin_sidecar_stop(&mut self) {
        let running = self.live.values().any(|s| *s == Slot::Sidecar);
        if !running {
            return;
        }
        let (grace, hook) = self.view(|v| {
            (
                grace_secs(v.spec.grace),
                v.spec.pre_stop_command().is_some(),
            )
        });
        self.native.begin_stop(grace, hook, Instant::now());
        if hook {
            self.run_pre_stop();
        }
        self.advance_sidecar_stop();
    }

    /// Istio's preStop hook, as the kubelet execs it in the container: `pilot-agent request
    /// --debug-port=15020 POST drain` (`sim-app request ...`) in the pod's netns and the
    /// sidecar's cgroup.
    fn run_pre_stop(&mut self) {
        let (Some(netns), Some(cg)) = (self.netns_file.as_ref(), self.cgroups.get(&Slot::Sidecar))
        else {
            self.native.hook_done();
            return;
        };
        // The hook as the stand-ins run it: `pilot-agent request ...` is `sim-app request ...`,
        // `killall -USR2 kuma-dp` is `sim-app killall-usr2-kuma-dp`.
        let hook = self.view(|v| v.spec.pre_stop_command()).unwrap_or_default();
        let args: Vec<String> = if hook.first().map(String::as_str) == Some("killall") {
            vec!["killall-usr2-kuma-dp".into()]
        } else {
            hook.iter().skip(1).cloned().collect()
        };
        // The hook's output goes to `prestop.log` in the pod's directory (the kubelet keeps it
        // for a FailedPreStopHook event).
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.pod_dir.join("prestop.log"));
        let mut cmd = Command::new(&self.env.sim_app);
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
                eprintln!("sim: pod {}: preStop hook: {e}", self.name);
                self.native.hook_done();
            }
        }
    }

    /// The preStop hook's process exited.
    pub(super) fn on_hook_done(&mut self, pid: u32) {
        let exit = reap(pid);
        if self.pre_stop_pid == Some(pid) {
            self.pre_stop_pid = None;
            self.native.hook_done();
            if exit.code != 0 {
                // kubelet records a FailedPreStopHook event and goes on.
                eprintln!("sim: pod {}: preStop hook exited {}", self.name, exit.code);
            }
            self.advance_sidecar_stop();
        }
    }

    /// Moves the sidecar's stop on: SIGTERM once its hook returned and every regular container
    /// has exited (or the grace period ran out), SIGKILL after the rest of it.
    pub(super) fn advance_sidecar_stop(&mut self) {
        let turn = !self
            .live
            .values()
            .any(|s| matches!(s, Slot::Container(_) | Slot::Init | Slot::UserInit));
        let Some(timeout) = self.native.advance_stop(Instant::now(), turn) else {
            return;
        };
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

    /// Timers of a native pod: the sidecar's restart after its back-off, its stop's deadlines,
    /// and SIGKILL of containers whose stop timeout ran out.
    pub(super) fn on_native_timer(&mut self, now: Instant) {
        if self.native.restart_due(now, self.pod_stopping()) {
            self.start_sidecar();
        }
        if self.native.stop_due(now) {
            self.advance_sidecar_stop();
        }
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
