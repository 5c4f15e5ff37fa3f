//! When is a pod's proxy ready to take the app's connections?
//!
//! Ready means all of: both capture ports are in LISTEN state in the pod's network namespace
//! (read from procfs, which costs Envoy nothing — checked first, every poll), Envoy's `/ready`
//! says LIVE, and — when the holdfast filter is required or present — the filter reports
//! `loaded`. The admin API is only asked once the ports listen, so a waiting pod does not load
//! its starting Envoy with requests.

use std::time::Duration;

use crate::config::{HoldSettings, ProxyConfig};
use crate::envoy_admin::{AdminClient, ServerState};
use crate::netns::PodNetns;
use crate::procfs_pods::sockets::listening_ports_in_netns;

/// Stat the filter sets to 1 once configured (`holdfast.loaded` in the filter's namespace).
pub const FILTER_LOADED_STAT: &str = "wasmcustom.holdfast.loaded";

/// Timeout of one admin request during the hold; the next poll retries.
const ADMIN_TIMEOUT: Duration = Duration::from_millis(500);

/// One readiness observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Capture ports are not listening yet.
    PortsClosed,
    /// Ports listen but Envoy is not LIVE (or its admin did not answer).
    NotLive,
    /// LIVE, but the holdfast filter has not reported `loaded`.
    FilterNotLoaded,
    /// Ready for traffic.
    Ready,
}

/// Probes one pod's proxy.
pub struct ReadinessProbe {
    admin: AdminClient,
    netns: std::sync::Arc<PodNetns>,
    proxy: ProxyConfig,
    require_filter: bool,
}

impl ReadinessProbe {
    pub fn new(
        netns: &PodNetns,
        admin_addr: std::net::SocketAddr,
        proxy: &ProxyConfig,
        hold: &HoldSettings,
        metrics: &crate::metrics::Metrics,
    ) -> crate::netns::Result<Self> {
        Ok(Self {
            admin: AdminClient::in_netns(netns.try_clone()?, admin_addr)
                .with_timeout(ADMIN_TIMEOUT)
                .with_error_metric(metrics.admin_errors.clone()),
            netns: std::sync::Arc::new(netns.try_clone()?),
            proxy: proxy.clone(),
            require_filter: hold.require_filter,
        })
    }

    /// The admin client this probe uses.
    pub fn admin(&self) -> &AdminClient {
        &self.admin
    }

    /// One observation, made through the pod's network namespace (no pid is pinned: the
    /// process the netns was found through may be gone).
    pub async fn check(&self) -> Readiness {
        let (netns, outbound, inbound) = (
            self.netns.clone(),
            self.proxy.outbound_port,
            self.proxy.inbound_port,
        );
        let listening = tokio::task::spawn_blocking(move || {
            listening_ports_in_netns(&netns)
                .map(|ports| ports.contains(&outbound) && ports.contains(&inbound))
                .unwrap_or(false)
        })
        .await
        .unwrap_or(false);
        if !listening {
            return Readiness::PortsClosed;
        }
        match self.admin.ready().await {
            Ok(ServerState::Live) => {}
            _ => return Readiness::NotLive,
        }
        match self
            .admin
            .stats(Some("^wasmcustom\\.holdfast\\.loaded$"))
            .await
        {
            Ok(stats) => match stats.get(FILTER_LOADED_STAT) {
                Some(1) => Readiness::Ready,
                // The filter is installed but not configured yet.
                Some(_) => Readiness::FilterNotLoaded,
                None if self.require_filter => Readiness::FilterNotLoaded,
                None => Readiness::Ready,
            },
            Err(_) if self.require_filter => Readiness::FilterNotLoaded,
            // LIVE and listening: a stats hiccup must not keep the app's connections waiting.
            Err(_) => Readiness::Ready,
        }
    }
}
