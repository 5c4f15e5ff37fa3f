//! The containerd kubelet stand-in's native-sidecar paths, the same rules as the netns
//! backend's ([`crate::sim::native`]) over the CRI: the proxy container created and started
//! after `istio-init`, the app once the proxy's startup probe passed (probed from the node, as
//! the kubelet probes the pod IP), restarts with back-off, Istio's preStop hook as a real
//! `ExecSync` in the proxy container, and `StopContainer` with what is left of the grace
//! period once the sidecar's turn has come.

use std::time::{Duration, Instant};

use k8s_cri::v1::{ExecSyncRequest, StopContainerRequest};

use super::{CriPodWorker, Slot};
use crate::sim::kubelet::pod_core::PodCore;
use crate::sim::kubelet::PodEvent;
use crate::sim::native::{
    pre_stop_sim_args, record_sidecar_start, record_sidecar_start_error, start_proxy_prober,
    NativeKubelet,
};
use crate::sim::pod_object::{now_ts, Terminated};
use crate::sim::PROXY_CONTAINER;

/// `finishedAt` as an `Instant` of this process (the back-off counts from it).
fn instant_of(t: &Terminated) -> Instant {
    let ago_ns = now_ts().as_nanosecond() - t.finished_at.as_nanosecond();
    let ago = Duration::from_nanos(u64::try_from(ago_ns.max(0)).unwrap_or(0));
    Instant::now().checked_sub(ago).unwrap_or_else(Instant::now)
}

impl CriPodWorker {
    /// Starts the proxy's prober (once per pod, its tickers from the pod's admission), from the
    /// node's netns to the pod IP, as the kubelet probes.
    pub(super) fn start_prober(&mut self) {
        if self.core.probe.is_some() || !self.core.view(|v| v.spec.proxy_probes) {
            return;
        }
        let (name, admitted, tx) = (self.core.name.clone(), self.core.admitted, self.tx.clone());
        self.core.probe = Some(
            self.core
                .view(|v| start_proxy_prober(v, &name, None, admitted, tx)),
        );
    }

    pub(super) fn probe_running(&self, id: &str) {
        if let Some(p) = &self.core.probe {
            p.running(id);
        }
    }

    pub(super) fn probe_stopped(&self) {
        if let Some(p) = &self.core.probe {
            p.stopped();
        }
    }

    /// Creates and starts the sidecar's container (a new attempt on a restart).
    fn create_sidecar(&mut self) {
        let restarting = self.sidecar_attempts > 0;
        if !restarting {
            if let Err(e) = self.argv.write_sidecar_config() {
                eprintln!("sim: pod {}: {e}", self.core.name);
            }
        }
        let attempt = self.sidecar_attempts;
        self.sidecar_attempts += 1;
        let args = self.argv.proxy_args();
        match self.create_and_start(PROXY_CONTAINER, attempt, args, None) {
            Ok((cid, pid)) => {
                self.running.insert(cid.clone(), Slot::Sidecar);
                self.core
                    .update(|v| record_sidecar_start(v, &cid, pid, restarting));
                self.probe_running(&cid);
            }
            Err(e) => {
                eprintln!("sim: pod {}: cannot start the sidecar: {e}", self.core.name);
                self.core.update(|v| record_sidecar_start_error(v, &e));
            }
        }
    }

    /// The sidecar's container exited: restart it with back-off while the pod runs
    /// ([`NativeKubelet::sidecar_exited`]).
    pub(super) fn on_sidecar_exit(&mut self, t: Terminated) {
        self.probe_stopped();
        let finished = instant_of(&t);
        self.sidecar_exited(t, finished);
    }

    fn sidecar_cid(&self) -> Option<String> {
        self.running
            .iter()
            .find(|(_, s)| **s == Slot::Sidecar)
            .map(|(id, _)| id.clone())
    }

    /// `StopContainer(timeout)` on a thread of its own (it returns once the container is gone).
    fn stop_container(&self, cid: String, timeout: u64) {
        let (rt, name) = (self.rt, self.core.name.clone());
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

    /// The next native timer, to bound the worker's wait.
    pub(super) fn native_deadline(&self) -> Option<Instant> {
        self.core.native.deadline()
    }
}

/// The containerd backend's containers are CRI containers: `StopContainer` with a timeout, the
/// preStop hook an `ExecSync` in the sidecar's container.
impl NativeKubelet for CriPodWorker {
    fn core(&self) -> &PodCore {
        &self.core
    }

    fn core_mut(&mut self) -> &mut PodCore {
        &mut self.core
    }

    fn sidecar_running(&self) -> bool {
        self.sidecar_cid().is_some()
    }

    fn others_running(&self) -> bool {
        self.running.values().any(|s| *s != Slot::Sidecar)
    }

    fn start_sidecar(&mut self) {
        self.create_sidecar();
    }

    fn start_regular_containers(&mut self) {
        CriPodWorker::start_regular_containers(self);
    }

    fn stop_regular(&mut self, grace: u64) {
        let regular: Vec<String> = self
            .running
            .iter()
            .filter(|(_, s)| **s != Slot::Sidecar)
            .map(|(id, _)| id.clone())
            .collect();
        for cid in regular {
            self.stop_container(cid, grace);
        }
    }

    fn stop_sidecar(&mut self, timeout: u64) {
        if let Some(cid) = self.sidecar_cid() {
            self.stop_container(cid, timeout);
        }
    }

    /// The kubelet's exec hook: `ExecSync` in the container, bounded by the grace period.
    fn run_pre_stop(&mut self, grace: u64) {
        let Some(cid) = self.sidecar_cid() else {
            self.core.native.hook_done();
            return;
        };
        let (rt, tx, name) = (self.rt, self.tx.clone(), self.core.name.clone());
        let hook = self
            .core
            .view(|v| v.spec.pre_stop_command())
            .unwrap_or_default();
        let mut cmd = vec![self.core.env.sim_app.to_string_lossy().into_owned()];
        cmd.extend(pre_stop_sim_args(&hook));
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
}
