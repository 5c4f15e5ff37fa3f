//! Finding the pod's network namespace (claimed in the node's `NetnsOwners`, so no two tracked
//! pods share one) and checking that a process of the pod is still in it.

use super::Driver;
use crate::effects::netns::PodNetns;
use crate::effects::procfs::pod_procs::NetnsLookup;
use crate::lifecycle::machine::Input;

impl Driver {
    pub(super) async fn look_for_netns(&mut self) -> Input {
        match self.shared.procs.find_netns(&self.key.uid).await {
            NetnsLookup::NotYet => Input::NetnsNotYet,
            NetnsLookup::Refused(why) => Input::NetnsRefused(why),
            NetnsLookup::Found { pid, netns } => {
                let id = netns.id();
                if self.netns.as_ref().map(PodNetns::id) != Some(id) {
                    match self.shared.netns_owners.claim(id, &self.key) {
                        Ok(claim) => self.netns_claim = Some(claim),
                        Err(owner) => {
                            // Looked up again at the next poll; the row says so if it lasts.
                            return Input::NetnsRefused(format!(
                                "pid {pid} is in network namespace {id:?}, which belongs to tracked pod {owner}: a stale or reused pid, not this pod's"
                            ));
                        }
                    }
                    tracing::info!(pid, netns = ?id, "found the pod's network namespace");
                    // A probe of the old netns asks the wrong Envoy: made anew at the next check.
                    self.probe = None;
                    self.netns = Some(netns);
                }
                Input::NetnsFound { netns: id }
            }
        }
    }

    /// Whether a process of the pod's sandbox or containers is in netns `id` now (a sandbox that
    /// died leaves none: the kubelet recreates it with a new netns).
    pub(super) async fn netns_in_use(&mut self, id: crate::effects::netns::NetnsId) -> bool {
        let source = self.shared.procs.clone();
        let uid = self.key.uid.clone();
        let procs = source.of_pod(&uid).await;
        let root = source.proc_root();
        procs.iter().filter(|p| p.container_id.is_some()).any(|p| {
            crate::effects::netns::NetnsId::of_path(&root.join(p.pid.to_string()).join("ns/net"))
                .is_ok_and(|ns| ns == id)
        })
    }
}
