//! What both kubelet stand-ins' pod workers are alike (issue 40 item 6: one place, so the two
//! backends cannot drift): the pod's name and node, its Pod object ([`PodView`], written to the
//! pods directory on every change), whether it is being deleted or the node torn down, the
//! native sidecar's kubelet state, and the start and end of a worker's run. What differs — a
//! container is a process ([`super::PodWorker`]) or a CRI container
//! ([`crate::cri::kubelet::CriPodWorker`]) — stays in each worker.

use std::fmt::Display;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Restart;
use crate::sim::prober::ProbeTarget;

use crate::sim::native::NativeState;
use crate::sim::node::{NodeEnv, Shared};
use crate::sim::pod_object::PodView;

/// One pod's worker state that both backends share.
pub(crate) struct PodCore {
    pub name: String,
    pub env: Arc<NodeEnv>,
    pub shared: Arc<Shared>,
    /// The pod was deleted through the API.
    pub deleting: bool,
    /// The node is being torn down: everything is killed now.
    pub shutting_down: bool,
    /// A native sidecar's kubelet state ([`crate::sim::native`]).
    pub native: NativeState,
    /// When the kubelet admitted the pod: its probes tick from here.
    pub admitted: Instant,
    /// The proxy's prober, when the spec asks for probes.
    pub probe: Option<ProbeTarget>,
    /// A restart of every container in progress ([`Restart`]): its old containers are being
    /// killed; the worker goes on once they are gone.
    pub restart: Option<Restart>,
    /// After a restart: start the proxy container this long after the app.
    pub proxy_late: Option<Duration>,
}

impl PodCore {
    pub(crate) fn new(name: String, env: Arc<NodeEnv>, shared: Arc<Shared>) -> PodCore {
        let native = NativeState::new(env.restart_backoff);
        PodCore {
            name,
            env,
            shared,
            deleting: false,
            shutting_down: false,
            native,
            admitted: Instant::now(),
            probe: None,
            restart: None,
            proxy_late: None,
        }
    }

    /// Applies `f` to the pod's view, rewrites the pod file and wakes waiters.
    pub(crate) fn update<R>(&self, f: impl FnOnce(&mut PodView) -> R) -> R {
        self.shared.update_pod(&self.env.pods_dir, &self.name, f)
    }

    pub(crate) fn view<R>(&self, f: impl FnOnce(&PodView) -> R) -> R {
        self.shared.view_pod(&self.name, f)
    }

    /// The pod has a native sidecar (an init container with `restartPolicy: Always`).
    pub(crate) fn is_native(&self) -> bool {
        self.view(|v| v.sidecar.is_some())
    }

    /// The pod is deleted or the node shuts down.
    pub(crate) fn pod_stopping(&self) -> bool {
        self.deleting || self.shutting_down
    }

    /// A worker's run starts: the pod is scheduled (its object appears, Pending, no statuses).
    pub(crate) fn scheduled(&self) {
        self.update(|_| ());
    }

    /// The pod's sandbox and init containers were set up, or not: a failure is the pod's
    /// `failed_reason`, as the kubelet's event would say it.
    pub(crate) fn started<E: Display>(&self, setup: Result<(), E>) {
        if let Err(e) = setup {
            eprintln!("sim: pod {}: {e}", self.name);
            let reason = e.to_string();
            self.update(|v| v.failed_reason = Some(reason));
        }
    }

    /// The kubelet restarts every container ([`Restart`]): not while the pod stops or another
    /// restart is under way, and only a classic pod (the stand-ins restart no native one).
    /// Returns whether the restart begins.
    pub(crate) fn begin_restart(&mut self, r: Restart) -> bool {
        if self.pod_stopping() || self.restart.is_some() || self.is_native() {
            eprintln!("sim: pod {}: restart {r:?} ignored", self.name);
            return false;
        }
        self.restart = Some(r);
        true
    }

    /// The end of a worker's run: the pod is gone and its file removed, under the lock, so
    /// whoever sees `gone` also sees the file gone.
    pub(crate) fn gone(&self) {
        let pods_dir = self.env.pods_dir.clone();
        self.update(|v| {
            v.gone = true;
            let _ = std::fs::remove_file(pods_dir.join(v.file_name()));
        });
    }
}
