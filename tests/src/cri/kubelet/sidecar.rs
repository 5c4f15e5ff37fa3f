//! The containerd kubelet stand-in's native-sidecar paths, the same rules as the netns
//! backend's ([`crate::sim::native`]) over the CRI: the proxy container created and started
//! after `istio-init`, the app once the proxy's startup probe passed (probed from the node, as
//! the kubelet probes the pod IP), restarts with back-off, Istio's preStop hook as a real
//! `ExecSync` in the proxy container, and `StopContainer` with what is left of the grace
//! period once the sidecar's turn has come.

use std::time::{Duration, Instant};

use k8s_cri::v1::{ExecSyncRequest, StopContainerRequest};

use super::{CriPodWorker, Slot};
use crate::sim::kubelet::PodEvent;
use crate::sim::native::{
    apply_probe, grace_secs, record_sidecar_exit, record_sidecar_start, record_sidecar_start_error,
    regular_done_for_good, AfterExit, Probed, MIN_GRACE_SECS,
};
use crate::sim::pod_object::{now_ts, Terminated, PRE_STOP_DRAIN};
use crate::sim::prober::{self, ProbeResult, ProbeTarget};
use crate::sim::PROXY_CONTAINER;

/// `finishedAt` as an `Instant` of this process (the back-off counts from it).
fn instant_of(t: &Terminated) -> Instant {
    let ago_ns = now_ts().as_nanosecond() - t.finished_at.as_nanosecond();
    let ago = Duration::from_nanos(u64::try_from(ago_ns.max(0)).unwrap_or(0));
    Instant::now().checked_sub(ago).unwrap_or_else(Instant::now)
}

impl CriPodWorker {
    pub(super) fn is_native(&self) -> bool {
        self.view(|v| v.sidecar.is_some())
    }

    /// Starts the proxy's prober (once per pod, its tickers from the pod's admission), from the
    /// node's netns to the pod IP, as the kubelet probes.
    pub(super) fn start_prober(&mut self) {
        if self.probe.is_some() || !self.view(|v| v.spec.proxy_probes) {
            return;
        }
        let target = ProbeTarget::default();
        let (addr, path) = self.view(crate::sim::native::proxy_probe);
        let tx = self.tx.clone();
        prober::spawn_path(
            path,
            &self.name,
            None,
            addr,
            self.admitted,
            target.clone(),
            move |r| {
                let _ = tx.send(PodEvent::Probe(r));
            },
        );
        self.probe = Some(target);
    }

    pub(super) fn probe_running(&self, id: &str) {
        if let Some(p) = &self.probe {
            p.running(id);
        }
    }

    pub(super) fn probe_stopped(&self) {
        if let Some(p) = &self.probe {
            p.stopped();
        }
    }

    /// A probe result (see the netns backend's `on_probe`).
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

    /// Creates and starts the sidecar's container (a new attempt on a restart).
    pub(super) fn start_sidecar(&mut self) {
        let restarting = self.sidecar_attempts > 0;
        if !restarting {
            if let Err(e) = self.argv.write_sidecar_config() {
                eprintln!("sim: pod {}: {e}", self.name);
            }
        }
        let attempt = self.sidecar_attempts;
        self.sidecar_attempts += 1;
        let args = self.argv.proxy_args();
        match self.create_and_start(PROXY_CONTAINER, attempt, args, None) {
            Ok((cid, pid)) => {
                self.running.insert(cid.clone(), Slot::Sidecar);
                self.update(|v| record_sidecar_start(v, &cid, pid, restarting));
                self.probe_running(&cid);
            }
            Err(e) => {
                eprintln!("sim: pod {}: cannot start the sidecar: {e}", self.name);
                self.update(|v| record_sidecar_start_error(v, &e));
            }
        }
    }

    /// The sidecar's container exited: restart it with back-off while the pod runs.
    pub(super) fn on_sidecar_exit(&mut self, t: Terminated) {
        self.probe_stopped();
        let next = self
            .native
            .exited(instant_of(&t), Instant::now(), self.pod_stopping());
        self.update(|v| record_sidecar_exit(v, t, next));
        if next == AfterExit::StartNow {
            self.start_sidecar();
        }
    }

    /// A regular container exited (recorded): the sidecar's turn, or a Job's end.
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

    /// Deletion: `StopContainer(grace)` for the regular containers at once, the sidecar's hook
    /// and ordered stop.
    pub(super) fn on_native_delete(&mut self) {
        self.native.kill();
        let grace = self.view(|v| grace_secs(v.spec.grace)).max(MIN_GRACE_SECS);
        let regular: Vec<String> = self
            .running
            .iter()
            .filter(|(_, s)| **s != Slot::Sidecar)
            .map(|(id, _)| id.clone())
            .collect();
        for cid in regular {
            self.stop_container(cid, grace);
        }
        if !self.native.stopping() {
            self.begin_sidecar_stop();
        }
    }

    fn sidecar_cid(&self) -> Option<String> {
        self.running
            .iter()
            .find(|(_, s)| **s == Slot::Sidecar)
            .map(|(id, _)| id.clone())
    }

    fn begin_sidecar_stop(&mut self) {
        let Some(cid) = self.sidecar_cid() else {
            return;
        };
        let (grace, hook) = self.view(|v| (grace_secs(v.spec.grace), v.spec.istio_pre_stop()));
        self.native.begin_stop(grace, hook, Instant::now());
        if hook {
            // The kubelet's exec hook: ExecSync in the container, bounded by the grace period.
            let (rt, tx, name) = (self.rt, self.tx.clone(), self.name.clone());
            let mut cmd = vec![self.env.sim_app.to_string_lossy().into_owned()];
            cmd.extend(PRE_STOP_DRAIN[1..].iter().map(|s| s.to_string()));
            std::thread::spawn(move || {
                let mut c = rt.client.clone();
                match rt.call(c.exec_sync(ExecSyncRequest {
                    container_id: cid,
                    cmd,
                    timeout: grace as i64,
                })) {
                    Ok(r) if r.exit_code != 0 => {
                        eprintln!("sim: pod {name}: preStop hook exited {}", r.exit_code)
                    }
                    Ok(_) => {}
                    Err(e) => eprintln!("sim: pod {name}: preStop hook: {e}"),
                }
                let _ = tx.send(PodEvent::HookDone { pid: 0 });
            });
        }
        self.advance_sidecar_stop();
    }

    pub(super) fn on_hook_done(&mut self) {
        self.native.hook_done();
        self.advance_sidecar_stop();
    }

    /// `StopContainer` for the sidecar once its hook returned and its turn came.
    fn advance_sidecar_stop(&mut self) {
        let turn = !self.running.values().any(|s| *s != Slot::Sidecar);
        let Some(timeout) = self.native.advance_stop(Instant::now(), turn) else {
            return;
        };
        if let Some(cid) = self.sidecar_cid() {
            self.stop_container(cid, timeout);
        }
    }

    /// `StopContainer(timeout)` on a thread of its own (it returns once the container is gone).
    fn stop_container(&self, cid: String, timeout: u64) {
        let (rt, name) = (self.rt, self.name.clone());
        std::thread::spawn(move || {
            let mut c = rt.client.clone();
            if let Err(e) = rt.call(c.stop_container(StopContainerRequest {
                container_id: cid.clone(),
                timeout: timeout as i64,
            })) {
                eprintln!("sim: pod {name}: StopContainer {cid}: {e}");
            }
        });
    }

    /// Every turn of the worker's loop: a back-off that ended, a stop deadline that passed.
    pub(super) fn on_native_tick(&mut self) {
        let now = Instant::now();
        if self.native.restart_due(now, self.pod_stopping()) {
            self.start_sidecar();
        }
        if self.native.stop_due(now) {
            self.advance_sidecar_stop();
        }
    }

    /// The next native timer, to bound the worker's wait.
    pub(super) fn native_deadline(&self) -> Option<Instant> {
        self.native.deadline()
    }
}
