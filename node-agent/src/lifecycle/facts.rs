//! What the lifecycle machine knows about a pod (from its latest `PodView`), and the pure rules
//! read from it: Job or not, finished, pass-through while init containers run, the netns poll
//! backoff.

use std::time::Duration;

pub use crate::api::SidecarMode;
pub(crate) use crate::effects::hold::HoldScope;
pub(crate) use crate::pod::RestartPolicy;
use crate::pod::{
    app_end, AppEnd, ContainerRestart, ContainerState, ContainerView, Deletion, PodView,
};

/// What the machine needs to know about the pod, from its latest [`PodView`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodFacts {
    pub(crate) deletion: Option<Deletion>,
    pub(crate) restart_policy: RestartPolicy,
    /// The regular app (non-proxy) containers: runtime id and state.
    pub(crate) apps: Vec<(Option<String>, ContainerState)>,
    /// Each app container's own restart policy and rules, in the order of `apps` (Kubernetes
    /// 1.35's container restart rules); empty when none has any: the pod's policy decides.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) app_restarts: Vec<ContainerRestart>,
    /// The proxy container: runtime id and state (`None`: not in the spec).
    pub(crate) proxy: Option<(Option<String>, ContainerState)>,
    /// A user init container (not Istio's own step, not a native sidecar) is running now, as the
    /// Pod status says.
    pub(crate) user_init_running: bool,
    /// This pod's hold deadline (annotation or flag).
    pub(crate) hold_timeout: Duration,
    /// The pod's phase is terminal (`PodView::is_terminal`): nothing will run in it again.
    pub(crate) terminal: bool,
    /// Classic or native sidecar (see [`SidecarMode`]).
    pub(crate) mode: SidecarMode,
    /// The kubelet restarts every container in place (KEP-5532, `PodView::restarting_in_place`):
    /// nothing is finished while it does.
    pub(crate) restarting_in_place: bool,
    /// The proxy has a startup probe (`PodView::proxy_startup_probe`): for a native sidecar the
    /// kubelet then starts the app only once the proxy is ready.
    pub(crate) proxy_startup_probe: bool,
}

impl PodFacts {
    pub(crate) fn of(view: &PodView) -> PodFacts {
        PodFacts {
            deletion: view.deletion,
            restart_policy: view.restart_policy,
            // Regular containers only: native sidecars end after the proxy (pod/app_end.rs).
            apps: view
                .regular_app_containers()
                .map(|c| (c.id.clone(), c.state))
                .collect(),
            app_restarts: if view
                .regular_app_containers()
                .all(|c| c.restart == ContainerRestart::default())
            {
                Vec::new()
            } else {
                view.regular_app_containers()
                    .map(|c| c.restart.clone())
                    .collect()
            },
            proxy: view.proxy_container().map(|c| (c.id.clone(), c.state)),
            user_init_running: view.init_containers.iter().any(|c| {
                !c.restartable
                    && !view.profile.init_steps.contains(&c.name.as_str())
                    && c.state == ContainerState::Running
            }),
            hold_timeout: view.overrides.hold_timeout,
            terminal: view.is_terminal(),
            mode: view.mode,
            restarting_in_place: view.restarting_in_place,
            proxy_startup_probe: view.proxy_startup_probe,
        }
    }

    /// A Job-like pod: the kubelet does not restart an app that finished (well).
    pub(crate) fn is_job(&self) -> bool {
        self.restart_policy.is_job()
    }

    /// The proxy is a native sidecar: the kubelet starts the app only after the proxy's startup
    /// probe passed, and stops the proxy after the app (and for a Job once the app is done), so
    /// holdfast neither holds the first start nor watches a Job.
    pub(crate) fn native(&self) -> bool {
        self.mode == SidecarMode::Native
    }

    /// How far the app is from finished by the status ([`app_end()`], the one rule).
    pub(crate) fn app_end(&self) -> AppEnd {
        app_end(
            self.restart_policy,
            // A state other than `waiting` implies the container ran; a `waiting` one is not
            // done whether it ran before or not.
            self.apps.iter().enumerate().map(|(i, (_, state))| {
                ContainerView {
                    state: *state,
                    restart: self.app_restarts.get(i).cloned().unwrap_or_default(),
                    ..ContainerView::default()
                }
                .app_end()
            }),
        )
    }

    /// The pod is finished: nothing will run in it again, so there is nothing left to hold,
    /// drain or quit. A terminal phase; or every app container ended for good and the proxy
    /// too, by the one rule ([`app_end()`]) — never while the kubelet will run a container
    /// again: an exited app or proxy of a `restartPolicy: Always` pod (a sandbox being
    /// recreated kills them all), a failed one under `OnFailure`, or every container of a pod
    /// being restarted in place (`restarting_in_place`, whatever the policy).
    pub(crate) fn finished(&self) -> bool {
        if self.terminal {
            return true;
        }
        if self.restarting_in_place || self.app_end() != AppEnd::ForGood {
            return false;
        }
        match &self.proxy {
            None => true,
            // A native sidecar is stopped by the kubelet once every regular container ended
            // for good, and not started again (pkg/kubelet/kuberuntime `computePodActions`).
            Some((_, state)) if self.native() => {
                matches!(state, ContainerState::Terminated { .. })
            }
            // A classic proxy is a regular container: the same rule as the app's.
            Some((_, state)) => {
                app_end(
                    self.restart_policy,
                    [ContainerView {
                        state: *state,
                        ..ContainerView::default()
                    }
                    .app_end()],
                ) == AppEnd::ForGood
            }
        }
    }

    /// Whether a container of the pod was restarted since `before`: the same container (app
    /// or proxy) now runs with another runtime id (the kubelet's restart, a recreated sandbox,
    /// an in-place restart of every container). A first start (no id before) is not one.
    pub(crate) fn restarted_since(&self, before: &PodFacts) -> bool {
        let changed = |was: &(Option<String>, ContainerState),
                       now: &(Option<String>, ContainerState)| {
            matches!((&was.0, now), (Some(a), (Some(b), ContainerState::Running)) if a != b)
        };
        before
            .apps
            .iter()
            .zip(&self.apps)
            .any(|(was, now)| changed(was, now))
            || before
                .proxy
                .as_ref()
                .zip(self.proxy.as_ref())
                .is_some_and(|(was, now)| changed(was, now))
    }

    /// The proxy's container id while it runs.
    pub(crate) fn running_proxy(&self) -> Option<&str> {
        match &self.proxy {
            Some((Some(id), ContainerState::Running)) => Some(id),
            _ => None,
        }
    }

    /// The proxy container runs by the pod's status (Envoy runs or is about to).
    pub(crate) fn proxy_running(&self) -> bool {
        matches!(self.proxy, Some((_, ContainerState::Running)))
    }

    /// Some app container runs, waits to run, or has not run yet: the app is not finished.
    pub(crate) fn app_may_run(&self) -> bool {
        self.app_end() == AppEnd::Running
    }
}

/// What the startup hold covers for this pod, beyond the capture ports.
///
/// - **IPv6** whenever the pod may have an IPv6 address: its IPs are often not in its status yet
///   when its netns appears (the CNI plugin assigns them while the sandbox is set up, and the
///   status follows), so only a pod known to be IPv4-only gets IPv4 rules alone. In a netns
///   without IPv6 the rules never match; ip6tables failing fails open for IPv6 alone.
/// - **DNS** when Istio captures the pod's DNS (`PodView::dns_capture`): then DNS goes to
///   pilot-agent's DNS proxy, which must be held like Envoy's ports until it listens.
pub(crate) fn hold_scope(view: &PodView) -> HoldScope {
    HoldScope {
        ipv6: view.has_ipv6() || view.pod_ips.is_empty(),
        dns: view.dns_capture(),
    }
}

/// Held packets pass (are accepted at once) while a user init container runs (vault-agent-init
/// and the like): what it sends is never held, since the proxy cannot start before it ends
/// (issue 10 item 4).
///
/// Only while one is *running* by the Pod status, not "until every init container is done":
/// the status reaches the agent with a lag, and the app's first SYN can come right after the last
/// init container ends. Keyed on "init not done", a lagging status would let the app's SYNs pass
/// to a closed port — seen as a refused call in the 20-pods-at-once test. Without Istio CNI,
/// istio-init runs last (Istio's injector orders it so), so a user init container's traffic is
/// not even redirected and istio-init's own run separates it from the app's start; with CNI the
/// redirect exists from the sandbox on, and the window between the last user init container and
/// the app is the status lag (documented in docs/reference.md, "Where holdfast acts").
pub(crate) fn pass_through(pod: &PodFacts) -> bool {
    pod.user_init_running
}

/// How long to wait before looking for the netns of a pod with no process yet: every 5 ms for
/// the first second after the pod was (re)seen (a new sandbox appears within that), then backing
/// off gently (20 ms to 5 s, 100 ms to 30 s) to 500 ms, so a pod whose sandbox does not come
/// (CNI trouble, a stuck node) costs ~nothing while one that is merely slow on a loaded node is
/// still found well before its init containers end. Any pod update resets it.
pub(crate) fn netns_poll_after(waiting: Duration) -> Duration {
    match waiting.as_millis() {
        0..1_000 => Duration::from_millis(5),
        1_000..5_000 => Duration::from_millis(20),
        5_000..30_000 => Duration::from_millis(100),
        _ => Duration::from_millis(500),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hold_covers_ipv6_unless_the_pod_is_known_ipv4_only_and_dns_when_captured() {
        let view = |ips: &[&str], dns: bool| PodView {
            pod_ips: ips.iter().map(|ip| ip.parse().expect("an IP")).collect(),
            switches: crate::mesh::PodSwitches {
                dns_capture: dns,
                ..Default::default()
            },
            ..PodView::blank(crate::mesh::istio::profile(
                &crate::config::ProxyConfig::default(),
            ))
        };
        for (ips, dns, want) in [
            // No IPs in the status yet: IPv6 too (the CNI may give it one).
            (
                &[][..],
                false,
                HoldScope {
                    ipv6: true,
                    dns: false,
                },
            ),
            (
                &["10.0.0.7"][..],
                false,
                HoldScope {
                    ipv6: false,
                    dns: false,
                },
            ),
            (
                &["fd00::7"][..],
                false,
                HoldScope {
                    ipv6: true,
                    dns: false,
                },
            ),
            (
                &["10.0.0.7", "fd00::7"][..],
                true,
                HoldScope {
                    ipv6: true,
                    dns: true,
                },
            ),
            (
                &["10.0.0.7"][..],
                true,
                HoldScope {
                    ipv6: false,
                    dns: true,
                },
            ),
        ] {
            assert_eq!(hold_scope(&view(ips, dns)), want, "{ips:?} dns {dns}");
        }
    }
}
