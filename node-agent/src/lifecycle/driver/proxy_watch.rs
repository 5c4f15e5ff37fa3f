//! The proxy watch: while the machine `watches_proxy`, pidfds of the ready proxy's own processes
//! (pilot-agent and Envoy), whose first exit is `Input::ProxyGone`. No polling: a pidfd turns
//! readable on exit.

use super::Driver;
use crate::effects::procfs::proxy_procs::proxy_pids_of;
use crate::lifecycle::drain::app_exit::ExitWatcher;
use crate::lifecycle::machine::State;

/// The watch of one proxy container's processes, armed once per container id.
#[derive(Default)]
pub(super) struct ProxyWatch {
    watcher: Option<ExitWatcher>,
    /// The proxy container id the watch was armed for.
    armed_for: Option<String>,
}

impl ProxyWatch {
    pub(super) fn is_armed(&self) -> bool {
        self.watcher.is_some()
    }

    /// The first exit of a watched process (pending forever when not armed: guard with
    /// [`Self::is_armed`]).
    pub(super) async fn next_exit(&mut self) -> i32 {
        match self.watcher.as_mut() {
            Some(w) => w.next_exit().await.0,
            None => std::future::pending().await,
        }
    }

    /// Disarms the watch; the next [`Driver::sync_proxy_watch`] arms it anew.
    pub(super) fn clear(&mut self) {
        self.watcher = None;
        self.armed_for = None;
    }
}

impl Driver {
    /// Arms the proxy watch while the machine wants it (once per proxy container id), drops it
    /// otherwise. The container's processes are found by container id in the pod's cgroup, and
    /// of those only the proxy's own are watched: the container's main process (pilot-agent)
    /// and its children (Envoy), see `effects::procfs::proxy_procs`; an OOM-kill of either ends
    /// the container.
    pub(super) async fn sync_proxy_watch(&mut self, state: &State) {
        if !state.watches_proxy() {
            self.proxy_watch.clear();
            return;
        }
        let proxy_id = self
            .view
            .borrow()
            .as_ref()
            .and_then(|v| v.proxy_container().and_then(|c| c.id.clone()));
        let Some(proxy_id) = proxy_id else {
            return;
        };
        if self.proxy_watch.armed_for.as_deref() == Some(proxy_id.as_str()) {
            return;
        }
        self.proxy_watch.armed_for = Some(proxy_id.clone());
        let container: Vec<i32> = self
            .shared
            .procs
            .of_pod(&self.key.uid)
            .await
            .iter()
            .filter(|p| p.container_id.as_deref() == Some(proxy_id.as_str()))
            .map(|p| p.pid)
            .collect();
        // Only the proxy itself (pilot-agent and Envoy), not every process of its container:
        // an exec session or probe ending is not the proxy going (issue 29).
        let proc_root = self.shared.procs.proc_root();
        let proxy = tokio::task::spawn_blocking(move || proxy_pids_of(&proc_root, &container))
            .await
            .unwrap_or_default();
        let mut watcher = ExitWatcher::for_pod(&self.key, &self.shared.procs.proc_root());
        // A pid already gone is skipped, not taken as an exit: the process list can lag, and
        // the Pod status path (a new or no running proxy id) covers a container already down.
        for pid in proxy {
            let _ = watcher.watch(pid);
        }
        if watcher.live() > 0 {
            tracing::debug!(processes = watcher.live(), "watching the proxy's processes");
            self.proxy_watch.watcher = Some(watcher);
        }
    }
}
