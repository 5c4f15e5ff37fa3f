//! Is anything still in flight through the pod's proxy? Judged from one `/stats` sample: the
//! holdfast filter's connection counts and Envoy's own byte counters.
//!
//! The filter publishes, per direction (`inbound`, `outbound`, `unknown`), a `cx_active` gauge
//! (connections open now) as `wasmcustom.holdfast.<dir>.cx_active`. Envoy counts, for every
//! `http_connection_manager` and `tcp_proxy`, the bytes it read from and wrote to downstream
//! connections (`http.<stat_prefix>.downstream_cx_{rx,tx}_bytes_total`, `tcp.<stat_prefix>.…`),
//! updated on every read and write of a live connection. Nothing is in flight when either
//!
//! - no outbound connection is open (`outbound.cx_active == 0`): the app's calls to other
//!   services are finished, or
//! - no byte moved through the pod's traffic listeners over an idle window: whatever
//!   connections remain are idle keep-alives (a remote client's pooled connection *into* the
//!   pod, say), which must not hold the drain, unlike pilot-agent's
//!   `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`.
//!
//! The byte test leaves out the listeners that move bytes during every drain without carrying
//! the pod's traffic ([`PROXY_OWN_HTTP_PREFIXES`]): Envoy's admin (this agent's own polling,
//! pilot-agent's stats merge) and Istio's bootstrap listeners for kubelet probes and Prometheus
//! scrapes. Any other listener that moves a byte in the window keeps the drain waiting, which
//! errs towards waiting: a listener missing from the list can only delay an idle verdict, and
//! only if it moves bytes at least every idle window (100 ms), which probes and scrapes (seconds
//! apart) do not.
//!
//! Istio's default stats matcher keeps none of Envoy's byte counters; holdfast's mesh config
//! adds them ([`TrafficBytes::exposed`]). Without them the bytes never call anything idle: an
//! outbound connection left open after the app's exit then holds the drain until it closes or
//! the deadline (never a quit on what cannot be seen), and the drain says why
//! ([`UNEXPOSED_BYTES_ADVICE`]).
//!
//! (Earlier builds had the filter count the bytes itself, in a data callback on every chunk.
//! Envoy's counters see the same bytes, and more — a response Envoy still flushes to a slow
//! client after the app exited — without a VM entry per chunk, which cost 3–6 % of the request
//! rate: docs/benchmarks.md.)
//!
//! Everything here is pure: samples in, judgement out, with the clock passed in.

use std::time::{Duration, Instant};

use crate::effects::envoy_admin::regex_escape;

pub use crate::api::{DirectionCounts, FilterCounts, IdleReason, DEFAULT_STAT_PREFIX};

/// Gauges above this are taken as garbage (an underflowed gauge reads near 2^64), not as counts.
const MAX_SANE_GAUGE: u64 = 1 << 48;

/// `http.<stat_prefix>` scopes whose bytes are not the pod's traffic, so the idle test skips
/// them. `admin` is Envoy's admin API (its HCM's fixed stat prefix): this agent polls it through
/// the drain, and pilot-agent scrapes it for its merged metrics. The others are Istio's
/// bootstrap listeners, by their HCM `stat_prefix` in istio/istio
/// `tools/packaging/common/envoy_bootstrap.json` (checked at 86c9f01fd73, master 2026-08):
/// `agent` (the 15021 status port, routed to pilot-agent: the istio-proxy container's own
/// readiness probe, `/healthz/ready` every 15 s by default per the injection template, and on
/// gateways the cloud load balancers' health checks, which can come from many sources at once),
/// `stats` (15090: Prometheus scrapes, routed to the admin API), `secure_stats` and
/// `secure_merged_stats` (the TLS metrics ports, when enabled). Gateways use the same template.
/// (The app containers' own probes, rewritten by the injector, go to pilot-agent on 15020
/// without passing through Envoy.)
pub const PROXY_OWN_HTTP_PREFIXES: [&str; 5] = [
    "admin",
    "agent",
    "stats",
    "secure_stats",
    "secure_merged_stats",
];

const BYTE_COUNTERS: [&str; 2] = [
    ".downstream_cx_rx_bytes_total",
    ".downstream_cx_tx_bytes_total",
];

/// The `/stats?filter=` regex (RE2) of one sample: the filter's stats under `prefix`, and every
/// HCM and `tcp_proxy` downstream byte counter. Asked with `usedonly`, so a sidecar with
/// thousands of configured `tcp_proxy` routes lists only those that carried traffic.
pub fn sample_regex(prefix: &str) -> String {
    format!(
        "^(?:{}\\.|(?:http|tcp)\\..+\\.downstream_cx_(?:rx|tx)_bytes_total$)",
        regex_escape(prefix)
    )
}

/// The sum of Envoy's downstream byte counters of the pod's traffic listeners, and how many
/// counters went into it (a counter that appears or goes away is a change too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrafficBytes {
    pub total: u64,
    pub counters: u32,
    /// Envoy keeps these counters at all. A stats matcher can drop them, and Istio's default one
    /// does: its bootstrap includes only a few prefixes and suffixes (istio/istio
    /// pkg/bootstrap/config.go, `requiredEnvoyStatsMatcherInclusionPrefixes` and the
    /// `stats_matcher` of tools/packaging/common/envoy_bootstrap.json), unless the mesh config
    /// adds `inclusionSuffixes` (manifests/mesh-config). Told by the admin API's own counters:
    /// the sample's request itself moves them, so they are listed whenever Envoy keeps them.
    pub exposed: bool,
}

impl TrafficBytes {
    /// Sums the byte counters among `(name, value)` stats; every other name is ignored.
    pub fn from_stats<K: AsRef<str>>(stats: impl IntoIterator<Item = (K, u64)>) -> TrafficBytes {
        let mut t = TrafficBytes::default();
        for (name, value) in stats {
            let name = name.as_ref();
            if counts_as_traffic(name) {
                t.total = t.total.wrapping_add(value);
                t.counters = t.counters.saturating_add(1);
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

/// What the drain (or Job quit) says, once, when only the bytes could tell idle from busy and
/// Envoy does not keep them.
pub const UNEXPOSED_BYTES_ADVICE: &str = "an outbound connection is still open after the app \
     exited, and Envoy does not keep its downstream byte counters (a stats matcher drops them: \
     Istio's default), so an idle keep-alive cannot be told from traffic in flight: holdfast \
     waits for the connection to close or for its deadline. Add inclusionSuffixes \
     [downstream_cx_rx_bytes_total, downstream_cx_tx_bytes_total] to \
     meshConfig.defaultConfig.proxyStatsMatcher (manifests/mesh-config) so holdfast can end it \
     once no byte moves.";

/// Whether `name` is a downstream byte counter of a listener that carries the pod's traffic.
fn counts_as_traffic(name: &str) -> bool {
    let Some(scope) = BYTE_COUNTERS.iter().find_map(|s| name.strip_suffix(s)) else {
        return false;
    };
    if let Some(stat_prefix) = scope.strip_prefix("http.") {
        !stat_prefix.is_empty() && !PROXY_OWN_HTTP_PREFIXES.contains(&stat_prefix)
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
    pub fn from_stats<K: AsRef<str>>(
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
}

impl DrainSample {
    /// Reads a sample from the answer to `/stats?usedonly&filter=<sample_regex(prefix)>`.
    pub fn from_stats<K: AsRef<str>>(
        prefix: &str,
        stats: impl IntoIterator<Item = (K, u64)> + Clone,
    ) -> DrainSample {
        DrainSample {
            filter: FilterCounts::from_stats(prefix, stats.clone()),
            traffic: TrafficBytes::from_stats(stats),
        }
    }
}

/// One judgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlight {
    /// The filter is not installed: its counts cannot say; the caller decides without them.
    NoFilter,
    /// Nothing is in flight.
    Idle(IdleReason),
    /// Something may still be in flight.
    Busy { outbound_active: Option<u64> },
}

/// Judges successive samples.
#[derive(Debug, Clone)]
pub struct InFlightJudge {
    idle_window: Duration,
    last_bytes: Option<TrafficBytes>,
    /// Time of the first sample in the current run of samples with unchanged bytes.
    unchanged_since: Option<Instant>,
}

impl InFlightJudge {
    /// A judge that calls connections idle once no byte moved for `idle_window`.
    pub fn new(idle_window: Duration) -> InFlightJudge {
        InFlightJudge {
            idle_window,
            last_bytes: None,
            unchanged_since: None,
        }
    }

    /// Takes the sample taken at `now` and judges. Samples must come in time order; a failed
    /// `/stats` request is no sample (call nothing).
    pub fn observe(&mut self, now: Instant, sample: &DrainSample) -> InFlight {
        let Some(counts) = sample.filter else {
            self.last_bytes = None;
            self.unchanged_since = None;
            return InFlight::NoFilter;
        };
        if !sample.traffic.exposed {
            // Envoy keeps no byte counters: never idle by bytes.
            self.unchanged_since = None;
        } else if self.last_bytes != Some(sample.traffic) {
            // Changed, or the first sample: a run of unchanged samples starts here.
            self.unchanged_since = Some(now);
        }
        self.last_bytes = Some(sample.traffic);

        if counts.outbound.cx_active == Some(0) {
            return InFlight::Idle(IdleReason::NoOutboundConnections);
        }
        if let Some(since) = self.unchanged_since {
            let idle_for = now.saturating_duration_since(since);
            if idle_for >= self.idle_window {
                return InFlight::Idle(IdleReason::NoBytesMoved { idle_for });
            }
        }
        InFlight::Busy {
            outbound_active: counts.outbound.cx_active,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(pairs: &[(&str, u64)]) -> Option<FilterCounts> {
        FilterCounts::from_stats(DEFAULT_STAT_PREFIX, pairs.iter().map(|(k, v)| (*k, *v)))
    }

    /// A sample with the filter present, `outbound_active` outbound connections and `bytes`
    /// moved in all.
    fn sample(outbound_active: u64, bytes: u64) -> DrainSample {
        DrainSample {
            filter: Some(FilterCounts {
                inbound: DirectionCounts { cx_active: Some(1) },
                outbound: DirectionCounts {
                    cx_active: Some(outbound_active),
                },
                unknown: DirectionCounts { cx_active: Some(0) },
            }),
            traffic: TrafficBytes {
                total: bytes,
                counters: 2,
                exposed: true,
            },
        }
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
        // Not byte counters, or not downstream ones: ignored.
        (
            "http.inbound_0.0.0.0_8080.downstream_cx_rx_bytes_buffered",
            7,
        ),
        ("cluster.PassthroughCluster.upstream_cx_rx_bytes_total", 7),
        ("listener.0.0.0.0_15006.downstream_cx_total", 7),
        ("tcp.downstream_cx_rx_bytes_total", 7),
        ("http..downstream_cx_rx_bytes_total", 7),
        ("udp.dns.downstream_cx_rx_bytes_total", 7),
        ("wasmcustom.holdfast.workers_ready", 1),
    ];

    #[test]
    fn traffic_bytes_leave_out_the_proxys_own_listeners() {
        let t = TrafficBytes::from_stats(SIDECAR_STATS.iter().map(|(k, v)| (*k, *v)));
        assert_eq!(
            t,
            TrafficBytes {
                total: 100 + 200 + 30 + 4 + 5000,
                counters: 5,
                exposed: true,
            }
        );
        // A tcp_proxy whose stat prefix is `admin` is traffic: only Envoy's admin HCM is `http.admin`.
        let t = TrafficBytes::from_stats([("tcp.admin.downstream_cx_rx_bytes_total", 3u64)]);
        assert_eq!(t.total, 3);
        let s = DrainSample::from_stats(
            DEFAULT_STAT_PREFIX,
            SIDECAR_STATS.iter().map(|(k, v)| (*k, *v)),
        );
        assert_eq!(s.filter.map(|f| f.outbound.cx_active), Some(Some(0)));
    }

    #[test]
    fn sample_regex_asks_for_both_and_escapes_the_prefix() {
        assert_eq!(
            sample_regex("wasmcustom.holdfast"),
            "^(?:wasmcustom\\.holdfast\\.|(?:http|tcp)\\..+\\.downstream_cx_(?:rx|tx)_bytes_total$)"
        );
        assert!(sample_regex("wasmcustom.a+b").starts_with("^(?:wasmcustom\\.a\\+b\\.|"));
    }

    #[test]
    fn zero_outbound_is_idle_at_once() {
        let mut j = InFlightJudge::new(Duration::from_millis(100));
        let t = Instant::now();
        assert_eq!(
            j.observe(t, &sample(0, 10)),
            InFlight::Idle(IdleReason::NoOutboundConnections)
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
                outbound_active: Some(1)
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
    fn without_envoys_byte_counters_never_idle_by_bytes() {
        // Istio's default stats matcher: only the filter's stats and a few of Envoy's are kept.
        let istio_default: &[(&str, u64)] = &[
            ("wasmcustom.holdfast.workers_ready", 1),
            ("wasmcustom.holdfast.outbound.cx_active", 1),
        ];
        let s = DrainSample::from_stats(
            DEFAULT_STAT_PREFIX,
            istio_default.iter().map(|(k, v)| (*k, *v)),
        );
        assert!(!s.traffic.exposed);
        let mut j = InFlightJudge::new(Duration::from_millis(10));
        let t = Instant::now();
        for ms in [0, 50, 500] {
            assert!(matches!(
                j.observe(t + Duration::from_millis(ms), &s),
                InFlight::Busy {
                    outbound_active: Some(1)
                }
            ));
        }
        // The outbound connection closes: idle by the filter's count alone.
        let mut closed = s;
        if let Some(f) = closed.filter.as_mut() {
            f.outbound.cx_active = Some(0);
        }
        assert_eq!(
            j.observe(t + Duration::from_millis(600), &closed),
            InFlight::Idle(IdleReason::NoOutboundConnections)
        );
        // Only the admin API's counters kept: exposed, nothing of the pod's traffic moved yet.
        let t = TrafficBytes::from_stats([("http.admin.downstream_cx_tx_bytes_total", 9u64)]);
        assert_eq!(
            t,
            TrafficBytes {
                total: 0,
                counters: 0,
                exposed: true
            }
        );
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
    }

    #[test]
    fn a_garbage_outbound_gauge_leaves_the_bytes_to_decide() {
        let mut j = InFlightJudge::new(Duration::from_millis(10));
        let t = Instant::now();
        let mut g = sample(0, 9);
        if let Some(f) = g.filter.as_mut() {
            f.outbound.cx_active = None;
        }
        assert!(matches!(
            j.observe(t, &g),
            InFlight::Busy {
                outbound_active: None
            }
        ));
        assert!(matches!(
            j.observe(t + Duration::from_millis(10), &g),
            InFlight::Idle(IdleReason::NoBytesMoved { .. })
        ));
    }

    #[test]
    fn filter_gone_resets_history() {
        let mut j = InFlightJudge::new(Duration::from_millis(10));
        let t = Instant::now();
        j.observe(t, &sample(1, 3));
        let no_filter = DrainSample {
            filter: None,
            traffic: sample(1, 3).traffic,
        };
        assert_eq!(
            j.observe(t + Duration::from_millis(5), &no_filter),
            InFlight::NoFilter
        );
        assert!(matches!(
            j.observe(t + Duration::from_millis(20), &sample(1, 3)),
            InFlight::Busy { .. }
        ));
    }
}
/// Notices a drain (or Job quit) that has waited a whole idle window only because Envoy keeps
/// no byte counters: an outbound connection stays open, and the bytes, which could have said it
/// is idle, are not there. Not at the first such sample: the app's own connections close a few
/// milliseconds after its exit, and that wait costs nothing.
#[derive(Debug, Default)]
pub(super) struct UnexposedBytes {
    since: Option<Instant>,
    said: bool,
}

impl UnexposedBytes {
    /// True once, the first time it has mattered for `window`.
    pub(super) fn notice(
        &mut self,
        now: Instant,
        sample: &DrainSample,
        judgement: InFlight,
        window: Duration,
    ) -> bool {
        let waits = !sample.traffic.exposed
            && matches!(judgement, InFlight::Busy { outbound_active: Some(n) } if n > 0);
        if !waits {
            self.since = None;
            return false;
        }
        let since = *self.since.get_or_insert(now);
        if self.said || now.saturating_duration_since(since) < window {
            return false;
        }
        self.said = true;
        true
    }
}
