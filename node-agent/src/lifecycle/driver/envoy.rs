//! Reaching the pod's Envoy: its admin client (TCP in the pod's netns or the mesh's Unix
//! socket), the readiness probe made from it, and one readiness check as the machine's input.

use tokio::time::Instant;

use super::Driver;
use crate::effects::envoy_admin::AdminClient;
use crate::effects::netns::PodNetns;
use crate::lifecycle::machine::{Input, Seen};
use crate::lifecycle::readiness::{Readiness, ReadinessProbe};
use crate::mesh::{AdminAt, MeshProfile};

use super::STATUS_EVERY;

impl Driver {
    pub(super) fn make_probe(&self, netns: &PodNetns) -> Result<ReadinessProbe, String> {
        let cfg = &self.shared.config;
        let admin_addr = self.admin;
        let dns_port = self.hold_cfg.as_ref().and_then(|c| c.rules.dns_port);
        let options = crate::lifecycle::readiness::ProbeOptions {
            stat_prefix: cfg.drain.stat_prefix.clone(),
            dns_port,
            on_admin_error: Some(crate::lifecycle::readiness::count_admin_errors(
                &self.shared.metrics,
            )),
        };
        let profile = self.current_profile();
        let client = self
            .admin_client(netns)
            .map_err(|e| format!("cannot reach the pod's network namespace: {e}"))?;
        let admin_port = matches!(profile.admin, AdminAt::Tcp(_)).then_some(admin_addr.port());
        ReadinessProbe::with_admin(netns, client, admin_port, &profile, &cfg.hold, options)
            .map_err(|e| format!("cannot reach the pod's network namespace: {e}"))
    }

    /// The pod's mesh profile: the current view's, else the one the pod was first seen with.
    pub(super) fn current_profile(&self) -> MeshProfile {
        self.view
            .borrow()
            .as_ref()
            .map(|v| v.profile.clone())
            .unwrap_or_else(|| self.profile.clone())
    }

    /// The pod's Envoy admin client: TCP inside its netns, or the mesh's Unix socket in the
    /// proxy's filesystem ([`crate::effects::admin_socket`]), found anew from the proxy
    /// container's current processes whenever the one found last stops answering.
    pub(super) fn admin_client(
        &self,
        netns: &PodNetns,
    ) -> crate::effects::netns::Result<AdminClient> {
        let profile = self.current_profile();
        let AdminAt::UnixSocket {
            parent,
            dir_prefix,
            name,
        } = profile.admin
        else {
            return Ok(AdminClient::in_netns(netns.try_clone()?, self.admin));
        };
        let view = self.view.clone();
        let connector = crate::effects::admin_socket::connector(
            self.shared.procs.clone(),
            self.key.uid.clone(),
            crate::effects::admin_socket::SocketAt {
                proxy_uid: profile.proxy_uid,
                parent,
                dir_prefix,
                name,
            },
            move || {
                view.borrow()
                    .as_ref()
                    .and_then(|v| v.proxy_container().and_then(|c| c.id.clone()))
            },
        );
        Ok(AdminClient::unix(
            &format!("{parent}/{dir_prefix}*/{name}"),
            connector,
        ))
    }

    pub(super) async fn check_readiness(&mut self) -> Input {
        if let Some(input) = self.hold_stopped_input() {
            return input;
        }
        if let Some(q) = &self.queue {
            if self.last_progress.elapsed() >= STATUS_EVERY {
                self.last_progress = Instant::now();
                let held = q.held();
                self.rec
                    .hold_progress(held.packets, held.connections, held.first_held_at);
            }
        }
        // Made when first needed, and dropped once the machine is past the hold (see
        // `drive`): an idle pod keeps no admin connection, netlink socket or netns fd open.
        if self.probe.is_none() {
            let made = match self.netns.as_ref().map(PodNetns::try_clone) {
                Some(Ok(netns)) => self.make_probe(&netns),
                Some(Err(e)) => Err(format!(
                    "cannot keep a handle on the pod's network namespace: {e}"
                )),
                None => Err("the pod's network namespace is not known".to_string()),
            };
            match made {
                Ok(p) => self.probe = Some(p),
                // No way to look: the machine decides what that means (as without the agent).
                Err(why) => return Input::CannotLook(why),
            }
        }
        let seen = match &self.probe {
            None => return Input::CannotLook("no readiness probe".to_string()),
            Some(p) => match p.check().await {
                Readiness::Ready => Seen::Ready,
                Readiness::PortsClosed => Seen::Down,
                Readiness::Starting => Seen::Starting,
                Readiness::NotLive => Seen::Up,
                Readiness::FilterNotLoaded => Seen::Live,
                Readiness::OverBound => {
                    let why = p
                        .take_violation()
                        .unwrap_or_else(|| "the admin answer broke a bound".into());
                    return Input::OverBound(why);
                }
                Readiness::CannotReach => {
                    let why = p
                        .take_violation()
                        .unwrap_or_else(|| "the admin API cannot be reached".into());
                    // Not asked again: a new probe (and a new look) comes with the next start.
                    self.probe = None;
                    return Input::CannotLook(why);
                }
            },
        };
        self.pacing.seen(seen, Instant::now());
        Input::Readiness(seen)
    }
}
