//! Is anything still in flight through the pod's proxy, in either direction? Judged from one
//! `/stats` sample: the holdfast filter's connection counts and Envoy's own byte counters.
//!
//! The filter publishes, per direction (`inbound`, `outbound`, `unknown`), a `cx_active` gauge
//! (connections open now) as `wasmcustom.holdfast.<dir>.cx_active`. Envoy counts, for every
//! `http_connection_manager` and `tcp_proxy`, the bytes it wrote to and read from downstream
//! connections (`http.<stat_prefix>.downstream_cx_{rx,tx}_bytes_total`, `tcp.<stat_prefix>.…`,
//! counted as they reach the socket) and the bytes it holds to write
//! (`…downstream_cx_tx_bytes_buffered`, a gauge): envoyproxy/envoy
//! `docs/root/configuration/http/http_conn_man/stats.rst` and
//! `docs/root/configuration/listeners/network_filters/tcp_proxy_filter.rst`. Nothing is in
//! flight when
//!
//! - Envoy keeps its byte counters, and no byte moved through the pod's traffic listeners, in
//!   either direction, over an idle window, with none buffered: whatever connections remain
//!   are idle keep-alives (a remote client's pooled connection *into* the pod, say), which must
//!   not hold the drain, unlike pilot-agent's `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`. The filter's
//!   counts do not shorten this: it does not see every connection (Istio builds the outbound
//!   catch-all chain without WasmPlugin filters, docs/install.md "Passthrough traffic");
//! - Envoy keeps no byte counters, and no connection is open through the proxy in any
//!   direction by the filter's counts: a response still being sent keeps its downstream
//!   connection open until Envoy has written its last byte (a connection closed with
//!   `FlushWrite` is counted open until the flush ends).
//!
//! "No outbound connection" alone (the rule before issue 28) is not enough: after the app wrote
//! a large response and exited, Envoy still sends it to a slow client from its buffers and the
//! kernel's, inbound, for seconds — quitting then cut a 4 MiB download at 1.6 MB.
//!
//! The byte test leaves out the listeners that move bytes during every drain without carrying
//! the pod's traffic (its mesh's, `MeshProfile::own_http_prefixes`): Envoy's admin (this agent's
//! own polling, pilot-agent's stats merge) and, for Istio, its bootstrap listeners for kubelet probes and Prometheus
//! scrapes. Any other listener that moves a byte in the window keeps the drain waiting, which
//! errs towards waiting: a listener missing from the list can only delay an idle verdict, and
//! only if it moves bytes at least every idle window (100 ms), which probes and scrapes (seconds
//! apart) do not.
//!
//! What Envoy keeps decides which rule can speak. Istio's default stats matcher keeps the
//! filter's stats (its `wasm` prefix) and none of Envoy's byte counters; holdfast's mesh config
//! adds them ([`TrafficBytes::exposed`]). Without them only "no connection at all" calls the pod
//! idle: a connection left open (a client's keep-alive into the pod) then holds the drain until
//! it closes, pilot-agent's own drain ends Envoy, or the deadline — never a quit on what cannot
//! be seen — and the drain says why (`crate::mesh::unexposed_bytes_advice`, in the pod's mesh's
//! words). Without the filter and without
//! the byte counters nothing can be seen at all ([`InFlight::Unseen`]): the drain never quits
//! then, and Envoy ends as with Istio alone. Either way holdfast never makes a drain longer than
//! Istio's: pilot-agent still kills Envoy at the end of its `terminationDrainDuration`.
//!
//! (Earlier builds had the filter count the bytes itself, in a data callback on every chunk.
//! Envoy's counters see the same bytes, and more — a response Envoy still flushes to a slow
//! client after the app exited — without a VM entry per chunk, which cost 3–6 % of the request
//! rate: docs/benchmarks.md.)
//!
//! Envoy's counters and its buffered gauge stop at the kernel: a byte counts as written once it
//! is in the socket's send queue. What still sits there (unsent, or sent and not acknowledged)
//! the kernel would send after Envoy exits — but the runtime deletes the pod's network
//! namespace as soon as its containers have exited (the kubelet's `StopPodSandbox`), and those
//! bytes are lost: a slow client got 3.77 of 4.19 MB through a containerd-run pod. So a sample
//! also carries the bytes the pod's TCP sockets still hold for their peers, asked of the kernel
//! in the pod's netns ([`DrainSample::send_queued`], sock_diag's `idiag_wqueue`); while any is
//! held nothing is idle ([`InFlight::Sending`]), by either rule. An idle keep-alive holds none.
//! Istio alone never quits early, so its drain lets the kernel flush.
//!
//! Everything here is pure: samples in, judgement out, with the clock passed in.

use std::time::{Duration, Instant};

use crate::effects::envoy_admin::regex_escape;

pub use crate::api::{DirectionCounts, FilterCounts, IdleReason, DEFAULT_STAT_PREFIX};

/// Gauges above this are taken as garbage (an underflowed gauge reads near 2^64), not as counts.
const MAX_SANE_GAUGE: u64 = 1 << 48;

const BYTE_COUNTERS: [&str; 2] = [
    ".downstream_cx_rx_bytes_total",
    ".downstream_cx_tx_bytes_total",
];

/// Only the write side: Envoy updates `…_tx_bytes_buffered` after every write, so it reads 0
/// once a connection's output is flushed. `…_rx_bytes_buffered` is updated only when bytes are
/// read, not when a filter drains them, and stays above 0 on an idle connection (seen on Envoy
/// 1.40: 64 on an idle `tcp_proxy` connection, 328 on the admin's keep-alive), so it cannot say
/// "nothing held".
const BUFFERED_GAUGES: [&str; 1] = [".downstream_cx_tx_bytes_buffered"];

/// Envoy's server state (0 LIVE, 1 DRAINING: its health check failed, `POST
/// /healthcheck/fail`; envoyproxy/envoy envoy/admin/v3/server_info.proto `State`).
pub(crate) const SERVER_STATE: &str = "server.state";

/// The filter's stats a drain sample reads (the rest of its stats are not asked for).
const FILTER_STATS: [&str; 5] = [
    "inbound.cx_active",
    "outbound.cx_active",
    "unknown.cx_active",
    "loaded",
    "workers_ready",
];

/// The `/stats?filter=` regex (RE2) of one sample: the filter's stats the judge reads under
/// `prefix` (`FILTER_STATS`), and every HCM and `tcp_proxy` downstream byte counter and
/// buffered gauge. Asked with `usedonly`, so a sidecar with thousands of configured `tcp_proxy`
/// routes lists only those that carried traffic.
pub fn sample_regex(prefix: &str) -> String {
    format!(
        "^(?:server\\.state|{}\\.(?:(?:inbound|outbound|unknown)\\.cx_active|loaded|workers_ready)|(?:http|tcp)\\..+\\.downstream_cx_(?:(?:rx|tx)_bytes_total|tx_bytes_buffered))$",
        regex_escape(prefix)
    )
}

/// Whether a sample keeps the line named `name`: what [`sample_regex`] asks for, so a pod's
/// Envoy that answers more than it was asked costs the agent no memory for it.
pub(crate) fn sample_keeps(prefix: &str, name: &str) -> bool {
    if name == SERVER_STATE {
        return true;
    }
    if let Some(rest) = name.strip_prefix(prefix).and_then(|r| r.strip_prefix('.')) {
        return FILTER_STATS.contains(&rest);
    }
    (name.starts_with("http.") || name.starts_with("tcp."))
        && BYTE_COUNTERS
            .iter()
            .chain(BUFFERED_GAUGES.iter())
            .any(|s| name.ends_with(s))
}

/// The sum of Envoy's downstream byte counters of the pod's traffic listeners, and how many
/// counters went into it (a counter that appears or goes away is a change too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrafficBytes {
    pub total: u64,
    pub counters: u32,
    /// Bytes Envoy holds to write to the pod's traffic listeners' downstream connections (the
    /// `downstream_cx_tx_bytes_buffered` gauges; 0 when Envoy does not keep them).
    pub buffered: u64,
    /// Envoy keeps these counters at all. A stats matcher can drop them, and Istio's default one
    /// does: its bootstrap includes only a few prefixes and suffixes (istio/istio
    /// pkg/bootstrap/config.go, `requiredEnvoyStatsMatcherInclusionPrefixes` and the
    /// `stats_matcher` of tools/packaging/common/envoy_bootstrap.json), unless the mesh config
    /// adds `inclusionSuffixes` (manifests/mesh-config). Told by the admin API's own counters:
    /// the sample's request itself moves them, so they are listed whenever Envoy keeps them.
    pub exposed: bool,
}

impl TrafficBytes {
    /// Sums the byte counters among `(name, value)` stats, leaving out the HTTP listeners whose
    /// stat prefix is in `own` (the pod's mesh's own listeners, `MeshProfile::own_http_prefixes`:
    /// there is no default mesh); every other name is ignored.
    pub fn from_stats_skipping<K: AsRef<str>>(
        own: &[&str],
        stats: impl IntoIterator<Item = (K, u64)>,
    ) -> TrafficBytes {
        let mut t = TrafficBytes::default();
        for (name, value) in stats {
            let name = name.as_ref();
            if counts_as_traffic(name, &BYTE_COUNTERS, own) {
                t.total = t.total.wrapping_add(value);
                t.counters = t.counters.saturating_add(1);
            } else if counts_as_traffic(name, &BUFFERED_GAUGES, own) {
                // An underflowed gauge reads near 2^64: taken as garbage, not as bytes held.
                if value <= MAX_SANE_GAUGE {
                    t.buffered = t.buffered.saturating_add(value);
                }
            } else if BYTE_COUNTERS
                .iter()
                .any(|s| name.strip_suffix(s) == Some("http.admin"))
            {
                t.exposed = true;
            }
        }
        t
    }
}

/// Whether `name` is one of `stats` (a byte counter or a buffered gauge) of a listener that
/// carries the pod's traffic.
fn counts_as_traffic(name: &str, stats: &[&str], own: &[&str]) -> bool {
    let Some(scope) = stats.iter().find_map(|s| name.strip_suffix(s)) else {
        return false;
    };
    if let Some(stat_prefix) = scope.strip_prefix("http.") {
        !stat_prefix.is_empty() && !own.contains(&stat_prefix)
    } else if let Some(stat_prefix) = scope.strip_prefix("tcp.") {
        !stat_prefix.is_empty()
    } else {
        false
    }
}

impl FilterCounts {
    /// Reads the filter's counts from `(name, value)` stats, as `/stats?usedonly` lists them.
    /// Names outside `prefix`, unknown directions or stats, and insane gauge values are ignored.
    /// Returns `None` when no stat of the filter is present at all: the filter is not installed.
    ///
    /// The filter sets `loaded` and `workers_ready` when it is configured, so an installed
    /// filter always lists something; a `cx_active` gauge it never moved is not listed under
    /// `usedonly` (Envoy lists a gauge once it was set, added to or subtracted from) and reads 0.
    pub(crate) fn from_stats<K: AsRef<str>>(
        prefix: &str,
        stats: impl IntoIterator<Item = (K, u64)>,
    ) -> Option<FilterCounts> {
        let zero = DirectionCounts { cx_active: Some(0) };
        let mut counts = FilterCounts {
            inbound: zero,
            outbound: zero,
            unknown: zero,
        };
        let mut found = false;
        for (name, value) in stats {
            let Some(rest) = name
                .as_ref()
                .strip_prefix(prefix)
                .and_then(|r| r.strip_prefix('.'))
            else {
                continue;
            };
            if matches!(rest, "loaded" | "workers_ready") {
                found = true;
                continue;
            }
            let Some((dir, stat)) = rest.split_once('.') else {
                continue;
            };
            let Some(slot) = counts.direction_mut(dir) else {
                continue;
            };
            match stat {
                "cx_active" => {
                    found = true;
                    slot.cx_active = (value <= MAX_SANE_GAUGE).then_some(value);
                }
                // `bytes_total`: published by earlier builds of the filter, unused now.
                "cx_total" | "bytes_total" => found = true,
                _ => {}
            }
        }
        found.then_some(counts)
    }

    fn direction_mut(&mut self, dir: &str) -> Option<&mut DirectionCounts> {
        match dir {
            "inbound" => Some(&mut self.inbound),
            "outbound" => Some(&mut self.outbound),
            "unknown" => Some(&mut self.unknown),
            _ => None,
        }
    }
}

/// One `/stats` sample of a drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainSample {
    /// The filter's counts (`None`: the filter is not installed).
    pub filter: Option<FilterCounts>,
    pub traffic: TrafficBytes,
    /// Bytes the pod's TCP sockets still hold for their peers (the kernel's send queues, in
    /// states that can still send: `Send-Q` in `ss`), read with sock_diag in the pod's netns.
    /// `None`: not known (no sock_diag socket, or the query failed): judged as before, by
    /// Envoy's counts alone.
    pub send_queued: Option<u64>,
    /// Envoy's health check is failed (`server.state` DRAINING): every listener of the default
    /// drain type, outbound too, drain-closes its connections.
    pub health_check_failed: bool,
    /// The directional counts read from Envoy's own capture listeners
    /// (`listener.<address>_<port>.downstream_cx_active`), for a mesh whose capture listeners
    /// carry every connection (`MeshProfile::listener_counts`: Consul, which cannot load the
    /// filter): used where the filter's counts are missing. `None`: not asked, or not there.
    pub listener_counts: Option<FilterCounts>,
}

impl DrainSample {
    /// Reads a sample from the answer to `/stats?usedonly&filter=<sample_regex(prefix)>` of a pod
    /// whose mesh's own listeners are `own` (`MeshProfile::own_http_prefixes`).
    pub fn from_stats_skipping<K: AsRef<str>>(
        prefix: &str,
        own: &[&str],
        stats: impl IntoIterator<Item = (K, u64)> + Clone,
    ) -> DrainSample {
        let health_check_failed = stats
            .clone()
            .into_iter()
            .any(|(name, value)| name.as_ref() == SERVER_STATE && value == 1);
        DrainSample {
            filter: FilterCounts::from_stats(prefix, stats.clone()),
            traffic: TrafficBytes::from_stats_skipping(own, stats),
            send_queued: None,
            health_check_failed,
            listener_counts: None,
        }
    }

    /// [`DrainSample::from_stats_skipping`] that also reads the directional counts of the
    /// capture listeners on `ports` (outbound, inbound) ([`listener_counts`]).
    pub(crate) fn from_stats_with_listeners<K: AsRef<str>>(
        prefix: &str,
        own: &[&str],
        ports: Option<ListenerPorts>,
        stats: impl IntoIterator<Item = (K, u64)> + Clone,
    ) -> DrainSample {
        let mut sample = DrainSample::from_stats_skipping(prefix, own, stats.clone());
        sample.listener_counts = ports.and_then(|p| listener_counts(p, stats));
        sample
    }

    /// The counts a judgement and the row use: the filter's, else the capture listeners'.
    pub(crate) fn counts(&self) -> Option<FilterCounts> {
        self.filter.or(self.listener_counts)
    }
}

/// The capture ports whose listeners' `downstream_cx_active` give the directional counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ListenerPorts {
    pub(crate) outbound: u16,
    pub(crate) inbound: u16,
}

/// Whether `name` is `listener.<address>_<port>.downstream_cx_active` (Envoy's per-listener
/// gauge, envoyproxy/envoy docs/root/configuration/listeners/stats.rst; the scope is the
/// listener's address, `127.0.0.1_15001`, `10.1.2.3_20000`, `[::]_20000`), and its port.
fn listener_active_port(name: &str) -> Option<u16> {
    let scope = name
        .strip_prefix("listener.")?
        .strip_suffix(".downstream_cx_active")?;
    let (_, port) = scope.rsplit_once('_')?;
    port.parse().ok()
}

/// The directional counts of Consul's capture listeners: its transparent proxy's one outbound
/// listener (`outbound_listener:127.0.0.1:15001`, a filter chain per upstream) and its public
/// listener on 20000 carry every connection of their direction (hashicorp/consul
/// agent/xds/listeners.go), and its bootstrap keeps every stat (consul-dataplane
/// pkg/consuldp/testdata/TestBootstrapConfig/*.golden: no `stats_matcher`). Summed over the
/// listeners on each port (one per address family). `None` when neither port's gauge is there.
pub(crate) fn listener_counts<K: AsRef<str>>(
    ports: ListenerPorts,
    stats: impl IntoIterator<Item = (K, u64)>,
) -> Option<FilterCounts> {
    // Per direction: not seen (`None`), or the sum (`Some(None)`: a garbage gauge among them).
    let mut inbound: Option<Option<u64>> = None;
    let mut outbound: Option<Option<u64>> = None;
    for (name, value) in stats {
        let Some(port) = listener_active_port(name.as_ref()) else {
            continue;
        };
        let slot = if port == ports.outbound {
            &mut outbound
        } else if port == ports.inbound {
            &mut inbound
        } else {
            continue;
        };
        let value = (value <= MAX_SANE_GAUGE).then_some(value);
        let sum = slot.unwrap_or(Some(0));
        *slot = Some(sum.zip(value).map(|(a, b)| a.saturating_add(b)));
    }
    if inbound.is_none() && outbound.is_none() {
        return None;
    }
    let dir = |n: Option<Option<u64>>| DirectionCounts {
        cx_active: n.unwrap_or(Some(0)),
    };
    Some(FilterCounts {
        inbound: dir(inbound),
        outbound: dir(outbound),
        unknown: DirectionCounts { cx_active: Some(0) },
    })
}

/// [`sample_regex`] that also asks for the capture listeners' `downstream_cx_active`.
pub(crate) fn sample_regex_with_listeners(prefix: &str, ports: Option<ListenerPorts>) -> String {
    let base = sample_regex(prefix);
    match ports {
        None => base,
        Some(p) => format!(
            "{}|^listener\\..+_(?:{}|{})\\.downstream_cx_active$",
            base, p.outbound, p.inbound
        ),
    }
}

/// [`sample_keeps`] that also keeps the capture listeners' `downstream_cx_active`.
pub(crate) fn sample_keeps_with_listeners(
    prefix: &str,
    ports: Option<ListenerPorts>,
    name: &str,
) -> bool {
    sample_keeps(prefix, name)
        || ports.is_some_and(|p| {
            listener_active_port(name).is_some_and(|port| port == p.outbound || port == p.inbound)
        })
}

/// One judgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlight {
    /// Neither the filter's counts nor Envoy's byte counters are there: nothing can tell a
    /// response still being sent from an idle connection, so nothing is ever called idle.
    Unseen,
    /// Nothing is in flight.
    Idle(IdleReason),
    /// Something may still be in flight; `connections`: open through the proxy in every
    /// direction by the filter's counts (`None`: no filter, or a count is garbage).
    Busy { connections: Option<u64> },
    /// Envoy's counts say idle, but the pod's sockets still
    /// hold `bytes` for their peers in the kernel: quitting now would lose them with the
    /// namespace.
    Sending { bytes: u64 },
}

impl FilterCounts {
    /// Connections open through the proxy in every direction (`None`: a count is garbage).
    pub(crate) fn open(&self) -> Option<u64> {
        [self.inbound, self.outbound, self.unknown]
            .iter()
            .try_fold(0u64, |sum, d| d.cx_active.map(|n| sum.saturating_add(n)))
    }
}

/// Judges successive samples.
#[derive(Debug, Clone)]
pub struct InFlightJudge {
    idle_window: Duration,
    last_bytes: Option<TrafficBytes>,
    /// Time of the first sample in the current run of samples with unchanged bytes and nothing
    /// buffered.
    unchanged_since: Option<Instant>,
}

impl InFlightJudge {
    /// A judge that calls connections idle once no byte moved for `idle_window`.
    pub(crate) fn new(idle_window: Duration) -> InFlightJudge {
        InFlightJudge {
            idle_window,
            last_bytes: None,
            unchanged_since: None,
        }
    }

    /// Takes the sample taken at `now` and judges. Samples must come in time order; a failed
    /// `/stats` request is no sample (call nothing).
    pub(crate) fn observe(&mut self, now: Instant, sample: &DrainSample) -> InFlight {
        let bytes = sample.traffic;
        let queued = sample.send_queued.unwrap_or(0);
        if !bytes.exposed {
            // Envoy keeps no byte counters: never idle by bytes.
            self.unchanged_since = None;
            self.last_bytes = None;
        } else if self.last_bytes != Some(bytes) || bytes.buffered > 0 {
            // Changed, bytes still held in Envoy's buffers, or the first sample: a run of
            // unchanged samples (at best) starts here. (Bytes in the kernel's queues do not
            // restart it: they were counted when written; once the peer has acknowledged them
            // nothing of them is left to wait for.)
            self.unchanged_since = Some(now);
            self.last_bytes = Some(bytes);
        }

        let counts = sample.counts();
        let open = counts.and_then(|f| f.open());
        let judgement = self.by_counts(now, bytes, counts, open);
        match judgement {
            // Idle by Envoy's counts, yet the kernel still holds bytes for a peer.
            InFlight::Idle(_) if queued > 0 => InFlight::Sending { bytes: queued },
            j => j,
        }
    }

    /// The judgement by Envoy's counts and the filter's alone.
    fn by_counts(
        &self,
        now: Instant,
        bytes: TrafficBytes,
        filter: Option<FilterCounts>,
        open: Option<u64>,
    ) -> InFlight {
        if bytes.exposed {
            // The bytes decide, even when the filter counts no connection: it does not count
            // every connection (Istio builds the outbound catch-all chain, PassthroughCluster,
            // without WasmPlugin filters), Envoy's counters see them all.
            if let Some(since) = self.unchanged_since {
                let idle_for = now.saturating_duration_since(since);
                if idle_for >= self.idle_window && bytes.buffered == 0 {
                    return InFlight::Idle(IdleReason::NoBytesMoved { idle_for });
                }
            }
            return InFlight::Busy { connections: open };
        }
        match (filter, open) {
            (None, _) => InFlight::Unseen,
            (Some(_), Some(0)) => InFlight::Idle(IdleReason::NoConnections),
            (Some(_), open) => InFlight::Busy { connections: open },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The own listeners of these tests' pods: Istio's.
    const OWN: &[&str] = &crate::mesh::istio::OWN_HTTP_PREFIXES;

    fn stats(pairs: &[(&str, u64)]) -> Option<FilterCounts> {
        FilterCounts::from_stats(DEFAULT_STAT_PREFIX, pairs.iter().map(|(k, v)| (*k, *v)))
    }

    /// A sample with the filter present, `inbound_active` and `outbound_active` connections
    /// open, `bytes` moved in all and `buffered` held, Envoy keeping its byte counters.
    fn sample_io(
        inbound_active: u64,
        outbound_active: u64,
        bytes: u64,
        buffered: u64,
    ) -> DrainSample {
        DrainSample {
            filter: Some(FilterCounts {
                inbound: DirectionCounts {
                    cx_active: Some(inbound_active),
                },
                outbound: DirectionCounts {
                    cx_active: Some(outbound_active),
                },
                unknown: DirectionCounts { cx_active: Some(0) },
            }),
            traffic: TrafficBytes {
                total: bytes,
                counters: 2,
                buffered,
                exposed: true,
            },
            send_queued: None,
            health_check_failed: false,
            listener_counts: None,
        }
    }

    /// One inbound connection open, `outbound_active` outbound, `bytes` moved.
    fn sample(outbound_active: u64, bytes: u64) -> DrainSample {
        sample_io(1, outbound_active, bytes, 0)
    }

    #[test]
    fn parses_every_direction() {
        let c = stats(&[
            ("wasmcustom.holdfast.inbound.cx_active", 2),
            ("wasmcustom.holdfast.outbound.cx_active", 1),
            ("wasmcustom.holdfast.unknown.cx_active", 0),
            ("wasmcustom.holdfast.loaded", 1),
            ("wasmcustom.holdfast.outbound.cx_total", 9),
        ])
        .expect("filter present");
        assert_eq!(c.inbound.cx_active, Some(2));
        assert_eq!(c.outbound.cx_active, Some(1));
        assert_eq!(c.unknown.cx_active, Some(0));
    }

    #[test]
    fn gauges_usedonly_leaves_out_read_zero() {
        // A filter that never saw an outbound connection: `usedonly` lists its other stats only.
        let c = stats(&[
            ("wasmcustom.holdfast.loaded", 1),
            ("wasmcustom.holdfast.workers_ready", 2),
            ("wasmcustom.holdfast.inbound.cx_active", 3),
        ])
        .expect("filter present");
        assert_eq!(c.outbound.cx_active, Some(0));
        assert_eq!(c.inbound.cx_active, Some(3));
        // Configured, no connection at all yet.
        let c = stats(&[("wasmcustom.holdfast.workers_ready", 1)]).expect("filter present");
        assert_eq!(c.outbound.cx_active, Some(0));
    }

    #[test]
    fn garbage_is_ignored() {
        let c = stats(&[
            ("wasmcustom.holdfast.sideways.cx_active", 5),
            ("wasmcustom.holdfast.outbound", 5),
            ("wasmcustom.holdfast.outbound.cx_active.extra", 5),
            ("wasmcustom.holdfastish.outbound.cx_active", 5),
            ("holdfast.outbound.cx_active", 5),
            ("", 5),
            ("wasmcustom.holdfast.outbound.cx_active", u64::MAX), // underflowed gauge
            ("wasmcustom.holdfast.inbound.bytes_total", 3),       // an earlier build's
        ])
        .expect("one real stat is there");
        assert_eq!(c.outbound.cx_active, None);
        assert_eq!(c.inbound.cx_active, Some(0));
    }

    #[test]
    fn no_filter_stats_means_no_filter() {
        assert_eq!(stats(&[]), None);
        assert_eq!(
            stats(&[("server.live", 1), ("cluster.x.upstream_cx_active", 3)]),
            None
        );
        assert_eq!(stats(&[("wasmcustom.holdfastish.loaded", 1)]), None);
    }

    #[test]
    fn custom_prefix() {
        let c = FilterCounts::from_stats(
            "wasmcustom.hf",
            [("wasmcustom.hf.outbound.cx_active", 0u64)],
        );
        assert_eq!(c.map(|c| c.outbound.cx_active), Some(Some(0)));
        let c = FilterCounts::from_stats(
            "wasmcustom.hf",
            [("wasmcustom.holdfast.outbound.cx_active", 0u64)],
        );
        assert_eq!(c, None);
    }

    /// Lines as a sidecar's `/stats?usedonly&filter=<sample_regex>` lists them (names as Envoy
    /// 1.40 prints them; Istio's stat prefixes: `inbound_0.0.0.0_8080` for an inbound HTTP
    /// port, `outbound_0.0.0.0_80` for outbound HTTP, the cluster name for `tcp_proxy`).
    const SIDECAR_STATS: &[(&str, u64)] = &[
        ("http.admin.downstream_cx_rx_bytes_total", 90_000),
        ("http.admin.downstream_cx_tx_bytes_total", 800_000),
        ("http.agent.downstream_cx_rx_bytes_total", 4_000),
        ("http.agent.downstream_cx_tx_bytes_total", 6_000),
        ("http.stats.downstream_cx_rx_bytes_total", 300),
        ("http.stats.downstream_cx_tx_bytes_total", 700_000),
        ("http.secure_stats.downstream_cx_tx_bytes_total", 1),
        ("http.secure_merged_stats.downstream_cx_tx_bytes_total", 1),
        (
            "http.inbound_0.0.0.0_8080.downstream_cx_rx_bytes_total",
            100,
        ),
        (
            "http.inbound_0.0.0.0_8080.downstream_cx_tx_bytes_total",
            200,
        ),
        ("http.outbound_0.0.0.0_80.downstream_cx_tx_bytes_total", 30),
        (
            "tcp.outbound|9080||reviews.default.svc.cluster.local.downstream_cx_rx_bytes_total",
            4,
        ),
        ("tcp.PassthroughCluster.downstream_cx_tx_bytes_total", 5000),
        // Bytes held to write on a traffic listener: counted; the read side is stale (ignored).
        (
            "http.inbound_0.0.0.0_8080.downstream_cx_rx_bytes_buffered",
            7,
        ),
        (
            "tcp.InboundPassthroughCluster.downstream_cx_tx_bytes_buffered",
            65_536,
        ),
        ("http.admin.downstream_cx_tx_bytes_buffered", 900),
        // Not byte counters, or not downstream ones: ignored.
        ("cluster.PassthroughCluster.upstream_cx_rx_bytes_total", 7),
        ("listener.0.0.0.0_15006.downstream_cx_total", 7),
        ("tcp.downstream_cx_rx_bytes_total", 7),
        ("http..downstream_cx_rx_bytes_total", 7),
        ("udp.dns.downstream_cx_rx_bytes_total", 7),
        ("wasmcustom.holdfast.workers_ready", 1),
    ];

    /// Bytes still in the kernel's send queues keep the pod busy, whatever Envoy's counts say:
    /// Envoy counted them as written when they reached the socket. Once the queues are empty
    /// an idle window must pass again; an empty queue (an idle keep-alive's) holds nothing, and
    /// an unknown one (`None`) is judged as before.
    #[test]
    fn bytes_queued_in_the_kernel_keep_the_pod_busy() {
        let queued = |mut s: DrainSample, q: Option<u64>| {
            s.send_queued = q;
            s
        };
        let t = Instant::now();
        let ms = Duration::from_millis;
        let mut j = InFlightJudge::new(Duration::from_millis(100));
        // Envoy's bytes no longer move (it wrote the whole response into the socket), but the
        // kernel still holds 420 KB for the slow client.
        for at in [0, 100, 200, 500] {
            assert_eq!(
                j.observe(t + ms(at), &queued(sample(0, 4_194_304), Some(419_808))),
                if at == 0 {
                    InFlight::Busy {
                        connections: Some(1),
                    }
                } else {
                    InFlight::Sending { bytes: 419_808 }
                },
                "at {at} ms"
            );
        }
        // Flushed (the client acknowledged every byte): idle at once, the bytes having stood
        // still since the first sample.
        assert_eq!(
            j.observe(t + ms(550), &queued(sample(0, 4_194_304), Some(0))),
            InFlight::Idle(IdleReason::NoBytesMoved {
                idle_for: Duration::from_millis(550)
            })
        );
        // Envoy writing more restarts the window, queued or not.
        assert!(matches!(
            j.observe(t + ms(600), &queued(sample(0, 4_194_305), Some(0))),
            InFlight::Busy { .. }
        ));

        // The filter's rule (Envoy keeps no byte counters): no connection open by the filter's
        // counts (Envoy closed it after its last write), yet the kernel still sends.
        let mut j = InFlightJudge::new(Duration::from_millis(100));
        let mut closed = sample_io(0, 0, 0, 0);
        closed.traffic.exposed = false;
        assert_eq!(
            j.observe(t, &queued(closed, Some(1))),
            InFlight::Sending { bytes: 1 }
        );
        assert_eq!(
            j.observe(t + ms(10), &queued(closed, Some(0))),
            InFlight::Idle(IdleReason::NoConnections)
        );
        assert_eq!(
            j.observe(t + ms(20), &queued(closed, None)),
            InFlight::Idle(IdleReason::NoConnections)
        );
        // An idle keep-alive: a connection open, nothing moves, nothing queued: idle after the
        // window, as before.
        let mut j = InFlightJudge::new(Duration::from_millis(100));
        j.observe(t, &queued(sample(0, 7), Some(0)));
        assert!(matches!(
            j.observe(t + ms(100), &queued(sample(0, 7), Some(0))),
            InFlight::Idle(IdleReason::NoBytesMoved { .. })
        ));
    }

    #[test]
    fn traffic_bytes_leave_out_the_proxys_own_listeners() {
        let t = TrafficBytes::from_stats_skipping(OWN, SIDECAR_STATS.iter().map(|(k, v)| (*k, *v)));
        assert_eq!(
            t,
            TrafficBytes {
                total: 100 + 200 + 30 + 4 + 5000,
                counters: 5,
                buffered: 65_536,
                exposed: true,
            }
        );
        // A tcp_proxy whose stat prefix is `admin` is traffic: only Envoy's admin HCM is `http.admin`.
        let t = TrafficBytes::from_stats_skipping(
            OWN,
            [("tcp.admin.downstream_cx_rx_bytes_total", 3u64)],
        );
        assert_eq!(t.total, 3);
        let s = DrainSample::from_stats_skipping(
            DEFAULT_STAT_PREFIX,
            OWN,
            SIDECAR_STATS.iter().map(|(k, v)| (*k, *v)),
        );
        assert_eq!(s.filter.map(|f| f.outbound.cx_active), Some(Some(0)));
    }

    #[test]
    fn sample_regex_asks_for_what_the_judge_reads_and_escapes_the_prefix() {
        assert_eq!(
            sample_regex("wasmcustom.holdfast"),
            "^(?:server\\.state|wasmcustom\\.holdfast\\.(?:(?:inbound|outbound|unknown)\\.cx_active|loaded|workers_ready)|(?:http|tcp)\\..+\\.downstream_cx_(?:(?:rx|tx)_bytes_total|tx_bytes_buffered))$"
        );
        assert!(sample_regex("wasmcustom.a+b")
            .starts_with("^(?:server\\.state|wasmcustom\\.a\\+b\\.(?:"));
        // What is kept of an answer is what was asked for.
        for (name, kept) in [
            ("wasmcustom.holdfast.inbound.cx_active", true),
            ("wasmcustom.holdfast.workers_ready", true),
            ("wasmcustom.holdfast.inbound.cx_total", false),
            (
                "http.inbound_0.0.0.0_8080.downstream_cx_tx_bytes_total",
                true,
            ),
            (
                "tcp.InboundPassthroughCluster.downstream_cx_tx_bytes_buffered",
                true,
            ),
            (
                "tcp.InboundPassthroughCluster.downstream_cx_rx_bytes_buffered",
                false,
            ),
            ("http.admin.downstream_cx_rx_bytes_total", true),
            ("cluster.x.upstream_cx_rx_bytes_total", false),
            ("server.state", true),
            ("server.live", false),
            ("x".repeat(300).as_str(), false),
        ] {
            assert_eq!(sample_keeps(DEFAULT_STAT_PREFIX, name), kept, "{name}");
        }
    }

    #[test]
    fn with_byte_counters_no_connection_still_waits_for_the_window() {
        // The filter does not see passthrough connections; Envoy's counters do.
        let mut j = InFlightJudge::new(Duration::from_millis(100));
        let t = Instant::now();
        assert_eq!(
            j.observe(t, &sample_io(0, 0, 10, 0)),
            InFlight::Busy {
                connections: Some(0)
            }
        );
        assert_eq!(
            j.observe(t + Duration::from_millis(100), &sample_io(0, 0, 10, 0)),
            InFlight::Idle(IdleReason::NoBytesMoved {
                idle_for: Duration::from_millis(100)
            })
        );
    }

    /// Issue 28: the app wrote a 4 MiB response and exited; Envoy still sends it to a slow
    /// client through the inbound connection. No outbound connection is open, which the rule
    /// before called idle at once; the bytes moving (or held in Envoy's buffers) keep it busy
    /// until the last one went out and the window passed.
    #[test]
    fn a_response_still_sent_inbound_is_busy_until_its_last_byte() {
        let window = Duration::from_millis(100);
        let mut j = InFlightJudge::new(window);
        let t = Instant::now();
        let ms = |n| t + Duration::from_millis(n);
        // Flushing at ~1.3 MB/s: 130 KB per 100 ms.
        for (i, at) in (0..20u64).map(|i| (i, ms(i * 50))) {
            assert!(
                matches!(
                    j.observe(at, &sample_io(1, 0, 1_000 + i * 65_000, 0)),
                    InFlight::Busy {
                        connections: Some(1)
                    }
                ),
                "sample {i}"
            );
        }
        // The client stalls for 300 ms with 200 KB still in Envoy's buffers: no byte moves, but
        // something is held: busy.
        let stalled = sample_io(1, 0, 1_000 + 19 * 65_000, 200_000);
        for at in [1000, 1100, 1200, 1300] {
            assert!(
                matches!(j.observe(ms(at), &stalled), InFlight::Busy { .. }),
                "{at}"
            );
        }
        // The buffers drain, the last byte goes at 1350: idle once the window has passed.
        let done = sample_io(1, 0, 1_000 + 19 * 65_000 + 200_000, 0);
        assert!(matches!(j.observe(ms(1350), &done), InFlight::Busy { .. }));
        assert!(matches!(j.observe(ms(1400), &done), InFlight::Busy { .. }));
        assert_eq!(
            j.observe(ms(1450), &done),
            InFlight::Idle(IdleReason::NoBytesMoved {
                idle_for: Duration::from_millis(100)
            })
        );
    }

    #[test]
    fn idle_keepalive_stops_holding_after_the_window() {
        let window = Duration::from_millis(100);
        let mut j = InFlightJudge::new(window);
        let t = Instant::now();
        // An outbound connection is open and bytes move: busy.
        assert!(matches!(
            j.observe(t, &sample(1, 20)),
            InFlight::Busy {
                connections: Some(2)
            }
        ));
        assert!(matches!(
            j.observe(t + Duration::from_millis(50), &sample(1, 30)),
            InFlight::Busy { .. }
        ));
        // Bytes stop at t+50: still busy until the window has passed since then.
        assert!(matches!(
            j.observe(t + Duration::from_millis(100), &sample(1, 30)),
            InFlight::Busy { .. }
        ));
        assert_eq!(
            j.observe(t + Duration::from_millis(150), &sample(1, 30)),
            InFlight::Idle(IdleReason::NoBytesMoved {
                idle_for: Duration::from_millis(100)
            })
        );
        // A byte moves again: busy again.
        assert!(matches!(
            j.observe(t + Duration::from_millis(160), &sample(1, 31)),
            InFlight::Busy { .. }
        ));
    }

    #[test]
    fn a_counter_that_appears_or_goes_is_a_change() {
        let mut j = InFlightJudge::new(Duration::from_millis(10));
        let t = Instant::now();
        let mut s = sample(1, 30);
        j.observe(t, &s);
        // Same total, one more counter (a listener's first byte offsets another's removal).
        s.traffic.counters += 1;
        assert!(matches!(
            j.observe(t + Duration::from_millis(20), &s),
            InFlight::Busy { .. }
        ));
        assert!(matches!(
            j.observe(t + Duration::from_millis(40), &s),
            InFlight::Idle(IdleReason::NoBytesMoved { .. })
        ));
    }

    #[test]
    fn without_envoys_byte_counters_only_no_connection_is_idle() {
        // Istio's default stats matcher: only the filter's stats and a few of Envoy's are kept.
        let istio_default: &[(&str, u64)] = &[
            ("wasmcustom.holdfast.workers_ready", 1),
            ("wasmcustom.holdfast.inbound.cx_active", 1),
        ];
        let s = DrainSample::from_stats_skipping(
            DEFAULT_STAT_PREFIX,
            OWN,
            istio_default.iter().map(|(k, v)| (*k, *v)),
        );
        assert!(!s.traffic.exposed);
        let mut j = InFlightJudge::new(Duration::from_millis(10));
        let t = Instant::now();
        // An inbound connection stays open (a response being sent, or a keep-alive: cannot be
        // told): busy, however long.
        for ms in [0, 50, 500] {
            assert!(matches!(
                j.observe(t + Duration::from_millis(ms), &s),
                InFlight::Busy {
                    connections: Some(1)
                }
            ));
        }
        // It closes: idle by the filter's counts alone.
        let mut closed = s;
        if let Some(f) = closed.filter.as_mut() {
            f.inbound.cx_active = Some(0);
        }
        assert_eq!(
            j.observe(t + Duration::from_millis(600), &closed),
            InFlight::Idle(IdleReason::NoConnections)
        );
        // Only the admin API's counters kept: exposed, nothing of the pod's traffic moved yet.
        let t = TrafficBytes::from_stats_skipping(
            OWN,
            [("http.admin.downstream_cx_tx_bytes_total", 9u64)],
        );
        assert_eq!(
            t,
            TrafficBytes {
                total: 0,
                counters: 0,
                buffered: 0,
                exposed: true
            }
        );
    }

    #[test]
    fn without_the_filter_the_bytes_decide_and_without_both_nothing_does() {
        let mut j = InFlightJudge::new(Duration::from_millis(10));
        let t = Instant::now();
        let no_filter = |bytes, exposed| DrainSample {
            filter: None,
            traffic: TrafficBytes {
                total: bytes,
                counters: 1,
                buffered: 0,
                exposed,
            },
            send_queued: None,
            health_check_failed: false,
            listener_counts: None,
        };
        assert!(matches!(
            j.observe(t, &no_filter(5, true)),
            InFlight::Busy { connections: None }
        ));
        assert!(matches!(
            j.observe(t + Duration::from_millis(20), &no_filter(5, true)),
            InFlight::Idle(IdleReason::NoBytesMoved { .. })
        ));
        // Neither the filter nor the counters: never idle.
        let mut j = InFlightJudge::new(Duration::ZERO);
        for ms in [0, 10, 10_000] {
            assert_eq!(
                j.observe(t + Duration::from_millis(ms), &no_filter(0, false)),
                InFlight::Unseen
            );
        }
    }

    #[test]
    fn a_single_sample_is_not_idle_by_bytes() {
        let mut j = InFlightJudge::new(Duration::from_millis(100));
        assert!(matches!(
            j.observe(Instant::now(), &sample(2, 0)),
            InFlight::Busy { .. }
        ));
    }

    #[test]
    fn zero_window_is_idle_on_the_first_sample() {
        let mut j = InFlightJudge::new(Duration::ZERO);
        // Zero window: an unchanged run of one sample already counts.
        assert!(matches!(
            j.observe(Instant::now(), &sample(1, 3)),
            InFlight::Idle(_)
        ));
        // Not with bytes held in Envoy's buffers.
        let mut j = InFlightJudge::new(Duration::ZERO);
        assert!(matches!(
            j.observe(Instant::now(), &sample_io(1, 0, 3, 1)),
            InFlight::Busy { .. }
        ));
    }

    #[test]
    fn a_garbage_gauge_leaves_the_bytes_to_decide() {
        let mut j = InFlightJudge::new(Duration::from_millis(10));
        let t = Instant::now();
        let mut g = sample_io(0, 0, 9, 0);
        if let Some(f) = g.filter.as_mut() {
            f.outbound.cx_active = None;
        }
        assert!(matches!(
            j.observe(t, &g),
            InFlight::Busy { connections: None }
        ));
        assert!(matches!(
            j.observe(t + Duration::from_millis(10), &g),
            InFlight::Idle(IdleReason::NoBytesMoved { .. })
        ));
        // An underflowed buffered gauge is garbage, not bytes held.
        let t2 = TrafficBytes::from_stats_skipping(
            OWN,
            [("tcp.x.downstream_cx_tx_bytes_buffered", u64::MAX)],
        );
        assert_eq!(t2.buffered, 0);
    }

    #[test]
    fn filter_gone_keeps_the_bytes_history() {
        let mut j = InFlightJudge::new(Duration::from_millis(10));
        let t = Instant::now();
        j.observe(t, &sample(1, 3));
        let no_filter = DrainSample {
            filter: None,
            traffic: sample(1, 3).traffic,
            send_queued: None,
            health_check_failed: false,
            listener_counts: None,
        };
        assert!(matches!(
            j.observe(t + Duration::from_millis(5), &no_filter),
            InFlight::Busy { connections: None }
        ));
        assert!(matches!(
            j.observe(t + Duration::from_millis(20), &sample(1, 3)),
            InFlight::Idle(IdleReason::NoBytesMoved { .. })
        ));
    }
}
/// Notices a drain (or Job quit) that has waited a whole idle window only because what could
/// tell idle from busy is not there: Envoy keeps no byte counters and a connection stays open,
/// or neither the filter nor the counters are there. Not at the first such sample: the app's
/// own connections close a few milliseconds after its exit, and that wait costs nothing.
#[derive(Debug)]
pub(super) struct UnexposedBytes {
    since: Option<Instant>,
    said: bool,
    /// The pod's mesh's words (its agent, its own drain, its settings).
    texts: &'static crate::mesh::MeshTexts,
}

impl UnexposedBytes {
    /// For a pod of the mesh whose texts are `texts`.
    pub(super) fn new(texts: &'static crate::mesh::MeshTexts) -> UnexposedBytes {
        UnexposedBytes {
            since: None,
            said: false,
            texts,
        }
    }

    /// The advice, once, the first time it has mattered for `window`.
    pub(super) fn notice(
        &mut self,
        now: Instant,
        sample: &DrainSample,
        judgement: InFlight,
        window: Duration,
    ) -> Option<String> {
        let advice = match judgement {
            InFlight::Unseen => crate::mesh::unseen_advice(self.texts),
            InFlight::Busy {
                connections: Some(n),
            } if n > 0 && !sample.traffic.exposed => {
                crate::mesh::unexposed_bytes_advice(self.texts)
            }
            _ => {
                self.since = None;
                return None;
            }
        };
        let since = *self.since.get_or_insert(now);
        if self.said || now.saturating_duration_since(since) < window {
            return None;
        }
        self.said = true;
        Some(advice)
    }
}
