//! Starting the effect executors (`lifecycle::drain`): the drain on deletion and the Job watch,
//! each run as the driver's one executor future, its result the machine's input.

use super::Driver;
use crate::effects::envoy_admin::AdminClient;
use crate::effects::netns::PodNetns;
use crate::lifecycle::drain::{self, DrainCtx, PodProcsSource};
use crate::lifecycle::machine::Input;

impl Driver {
    /// Starts the drain (`drain`) or the Job watch as the running executor.
    pub(super) fn start_executor(&mut self, drain: bool) {
        let admin = match self.netns.as_ref().map(PodNetns::try_clone) {
            Some(Ok(ns)) => {
                let t = self.shared.config.drain.admin_timeout;
                // The pod's sockets, asked in its netns too (the kernel's send queues).
                let sockets = drain::PodProxy::open_sockets(&ns);
                let client = match self.admin_client(&ns) {
                    Ok(client) => client,
                    Err(_) => AdminClient::in_netns(ns, self.admin),
                }
                .with_timeouts(t, t)
                .with_error_callback({
                    let count =
                        crate::lifecycle::readiness::count_admin_errors(&self.shared.metrics);
                    move |kind| count(kind)
                });
                drain::PodProxy::new(client, sockets, &self.current_profile())
            }
            other => {
                let why = match other {
                    Some(Err(e)) => {
                        format!("cannot keep a handle on the pod's network namespace: {e}")
                    }
                    _ => "the pod's network namespace is not known".into(),
                };
                // The machine decides what a drain or Job watch that cannot start means.
                self.pending.push_back(Input::ExecutorNotStarted(why));
                return;
            }
        };
        let key = self.key.clone();
        let shared = self.shared.clone();
        let view = self.view.clone();
        let steps = self.steps_tx.clone();
        self.executor = Some(Box::pin(async move {
            let ctx = DrainCtx {
                key: &key,
                admin: &admin,
                processes: PodProcsSource::new(shared.procs.clone(), key.uid.clone()),
                view,
                stop: shared.stop.clone(),
                settings: &shared.config.drain,
                steps: Some(steps),
            };
            if drain {
                Input::DrainFinished(Box::new(drain::drain(ctx).await))
            } else {
                Input::JobFinished(Box::new(drain::finish_job(ctx).await))
            }
        }));
    }
}
