//! The hold's effects: removing a leftover rule, installing, releasing and marking the hold in
//! the pod's netns (blocking iptables and netlink work, run off the async runtime), and the
//! machine inputs they answer with.

use std::time::Duration;

use tokio::time::Instant;

use super::Driver;
use crate::effects::hold::{Error as HoldError, HoldConfig, HoldQueue};
use crate::effects::netns::PodNetns;
use crate::lifecycle::machine::{Input, Released};

impl Driver {
    /// Why the hold in force stopped holding on its own, as the machine's input: forged
    /// messages on its queue (a broken bound) or its reader thread's failure.
    pub(super) fn hold_stopped_input(&self) -> Option<Input> {
        let q = self.queue.as_ref()?;
        q.tampered()
            .map(Input::OverBound)
            .or_else(|| q.failure().map(Input::HoldBroken))
    }

    pub(super) fn hold_config(&self) -> Option<HoldConfig> {
        self.hold_cfg.clone()
    }

    pub(super) async fn remove_leftover(&mut self) {
        let (Some(netns), Some(cfg)) = (&self.netns, self.hold_config()) else {
            return;
        };
        match blocking(netns, cfg, |ns, c| HoldQueue::remove_leftover(&ns, &c)).await {
            Ok(true) => tracing::info!("removed a hold rule left by a previous agent"),
            Ok(false) => {}
            Err(e) => {
                if !self.child_over_bound(&e) {
                    self.rec
                        .problem(format!("removing a leftover hold rule failed: {e}"));
                }
            }
        }
    }

    /// Tells the machine when a hold command broke its bounds (`Input::ChildOverBound`, fed
    /// before the effect's own answer). Whether it did is the error's.
    pub(super) fn child_over_bound(&mut self, e: &HoldError) -> bool {
        let Some(remembered) = e.over_bound() else {
            return false;
        };
        self.pending.push_back(Input::ChildOverBound {
            why: e.to_string(),
            remembered,
        });
        true
    }

    pub(super) async fn disarm_and_mark(&mut self) {
        let (Some(netns), Some(cfg)) = (&self.netns, self.hold_config()) else {
            return;
        };
        if let Err(e) = blocking(netns, cfg, |ns, c| HoldQueue::disarm_and_mark(&ns, &c)).await {
            self.rec.problem(format!(
                "cannot mark the pod's network namespace as over its bounds: {e}"
            ));
        }
    }

    pub(super) async fn install_hold(&mut self, fresh: bool) -> Input {
        let (Some(netns), Some(cfg)) = (&self.netns, self.hold_config()) else {
            return Input::HoldFailed("the pod's network namespace is not known".into());
        };
        let id = netns.id();
        let result = blocking(netns, cfg, move |ns, c| {
            if fresh {
                HoldQueue::start_fresh(&ns, &c).map(|q| (q, false))
            } else {
                HoldQueue::start_or_adopt(&ns, &c)
            }
        })
        .await;
        match result {
            Ok((queue, adopted)) => {
                // Checked once the hold is in (a proxy's restart must not wait for this look:
                // the app's calls are refused meanwhile): a netns no process of the pod is in
                // any more is dead (our handle keeps it), and a hold there holds nothing of the
                // pod's. It is released at once and the machine looks for the pod's new one.
                if !self.netns_in_use(id).await {
                    tracing::info!(netns = ?id, "no process of the pod is in its network namespace any more: no hold there");
                    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || queue.release()).await {
                        tracing::warn!(error = %e, "releasing the hold in a dead network namespace failed");
                    }
                    return Input::NetnsGone;
                }
                let age = if adopted {
                    std::time::SystemTime::now()
                        .duration_since(queue.since())
                        .unwrap_or_default()
                } else {
                    Duration::ZERO
                };
                self.queue = Some(queue);
                let app_running = self.app_running().await;
                Input::HoldSetUp {
                    adopted,
                    app_running,
                    age,
                }
            }
            Err(e) => {
                self.child_over_bound(&e);
                Input::HoldFailed(e.to_string())
            }
        }
    }

    pub(super) async fn release(&mut self, ready_at: Option<std::time::Instant>) -> Input {
        let Some(queue) = self.queue.take() else {
            return Input::ReleaseFailed("no hold to release".into());
        };
        let release_started = Instant::now().into_std();
        match tokio::task::spawn_blocking(move || queue.release()).await {
            Ok(Ok(report)) => Input::HoldReleased(Released {
                connections: report.stats.connections,
                packets: report.stats.packets,
                first_held_at: report.stats.first_held_at,
                // Held connections go at the accept verdict; the rule removal follows it.
                ready_to_release: ready_at
                    .map(|t| release_started.saturating_duration_since(t) + report.verdict_after),
            }),
            Ok(Err(e)) => {
                self.child_over_bound(&e);
                Input::ReleaseFailed(e.to_string())
            }
            Err(e) => Input::ReleaseFailed(format!("the release task failed: {e}")),
        }
    }

    /// Whether a process of an app container (not the sandbox, not the proxy) exists now.
    pub(super) async fn app_running(&mut self) -> bool {
        let Some(view) = self.view.borrow().clone() else {
            return false;
        };
        let app_ids: Vec<String> = view.app_containers().filter_map(|c| c.id.clone()).collect();
        let procs = self.shared.procs.of_pod(&self.key.uid).await;
        procs.iter().any(|p| {
            p.container_id
                .as_ref()
                .is_some_and(|id| app_ids.iter().any(|a| a == id))
        })
    }
}

/// Runs blocking hold work (iptables, netlink) off the async runtime.
async fn blocking<T: Send + 'static>(
    netns: &PodNetns,
    cfg: HoldConfig,
    f: impl FnOnce(PodNetns, HoldConfig) -> crate::effects::hold::Result<T> + Send + 'static,
) -> Result<T, HoldError> {
    let ns = netns.try_clone().map_err(HoldError::Netns)?;
    tokio::task::spawn_blocking(move || f(ns, cfg))
        .await
        .map_err(|e| HoldError::Holder(netns.id(), format!("the hold task failed: {e}")))?
}
