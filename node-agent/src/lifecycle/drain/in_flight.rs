//! Is anything still in flight through the pod's proxy? Judged from the holdfast filter's counts,
//! read from Envoy's admin `/stats`.
//!
//! The filter publishes, per direction (`inbound`, `outbound`, `unknown`), a `cx_active` gauge
//! (connections open now) and a `bytes_total` counter (bytes moved, both ways), as
//! `wasmcustom.holdfast.<dir>.<stat>`. Nothing is in flight when either
//!
//! - no outbound connection is open (`outbound.cx_active == 0`): the app's calls to other
//!   services are finished, or
//! - no byte moved in any direction over an idle window: whatever connections remain are idle
//!   keep-alives (a remote client's pooled connection *into* the pod, say), which must not hold
//!   the drain, unlike pilot-agent's `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`.
//!
//! Everything here is pure: samples in, judgement out, with the clock passed in.

use std::time::{Duration, Instant};

pub use crate::api::{DirectionCounts, FilterCounts, IdleReason, DEFAULT_STAT_PREFIX};

/// Gauges above this are taken as garbage (an underflowed gauge reads near 2^64), not as counts.
const MAX_SANE_GAUGE: u64 = 1 << 48;

impl FilterCounts {
    /// Reads the filter's counts from `(name, value)` stats. Names outside `prefix`, unknown
    /// directions or stats, and insane gauge values are ignored. Returns `None` when no
    /// per-direction stat of the filter is present at all: the filter is not installed.
    pub fn from_stats<K: AsRef<str>>(
        prefix: &str,
        stats: impl IntoIterator<Item = (K, u64)>,
    ) -> Option<FilterCounts> {
        let mut counts = FilterCounts::default();
        let mut found = false;
        for (name, value) in stats {
            let Some(rest) = name
                .as_ref()
                .strip_prefix(prefix)
                .and_then(|r| r.strip_prefix('.'))
            else {
                continue;
            };
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
                "bytes_total" => {
                    found = true;
                    slot.bytes_total = Some(value);
                }
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

    /// Bytes moved so far: inbound, outbound, unknown.
    fn bytes(&self) -> [Option<u64>; 3] {
        [
            self.inbound.bytes_total,
            self.outbound.bytes_total,
            self.unknown.bytes_total,
        ]
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

/// Judges successive samples of the filter's counts.
#[derive(Debug, Clone)]
pub struct InFlightJudge {
    idle_window: Duration,
    last_bytes: Option<[Option<u64>; 3]>,
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

    /// Takes the sample taken at `now` (`None`: `/stats` answered but without the filter's
    /// stats) and judges. Samples must come in time order; a failed `/stats` request is no
    /// sample (call nothing).
    pub fn observe(&mut self, now: Instant, sample: Option<&FilterCounts>) -> InFlight {
        let Some(counts) = sample else {
            self.last_bytes = None;
            self.unchanged_since = None;
            return InFlight::NoFilter;
        };
        let bytes = counts.bytes();
        let known = bytes.iter().any(Option::is_some);
        if known && self.last_bytes == Some(bytes) {
            // Unchanged: keep the start of the run.
        } else {
            // Changed, first sample, or no byte counts at all (then never idle by bytes).
            self.unchanged_since = known.then_some(now);
        }
        self.last_bytes = Some(bytes);

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

    fn sample(outbound_active: u64, bytes: [u64; 3]) -> FilterCounts {
        FilterCounts {
            inbound: DirectionCounts {
                cx_active: Some(1),
                bytes_total: Some(bytes[0]),
            },
            outbound: DirectionCounts {
                cx_active: Some(outbound_active),
                bytes_total: Some(bytes[1]),
            },
            unknown: DirectionCounts {
                cx_active: Some(0),
                bytes_total: Some(bytes[2]),
            },
        }
    }

    #[test]
    fn parses_every_direction() {
        let c = stats(&[
            ("wasmcustom.holdfast.inbound.cx_active", 2),
            ("wasmcustom.holdfast.inbound.bytes_total", 100),
            ("wasmcustom.holdfast.outbound.cx_active", 1),
            ("wasmcustom.holdfast.outbound.bytes_total", 7),
            ("wasmcustom.holdfast.unknown.cx_active", 0),
            ("wasmcustom.holdfast.unknown.bytes_total", 0),
            ("wasmcustom.holdfast.loaded", 1),
            ("wasmcustom.holdfast.outbound.cx_total", 9),
        ])
        .expect("filter present");
        assert_eq!(c.inbound.cx_active, Some(2));
        assert_eq!(c.inbound.bytes_total, Some(100));
        assert_eq!(c.outbound.cx_active, Some(1));
        assert_eq!(c.outbound.bytes_total, Some(7));
        assert_eq!(c.unknown.cx_active, Some(0));
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
            ("wasmcustom.holdfast.inbound.bytes_total", 3),
        ])
        .expect("one real stat is there");
        assert_eq!(c.outbound.cx_active, None);
        assert_eq!(c.inbound.bytes_total, Some(3));
        assert_eq!(c.inbound.cx_active, None);
    }

    #[test]
    fn no_filter_stats_means_no_filter() {
        assert_eq!(stats(&[]), None);
        assert_eq!(stats(&[("wasmcustom.holdfast.loaded", 1)]), None);
        assert_eq!(
            stats(&[("server.live", 1), ("cluster.x.upstream_cx_active", 3)]),
            None
        );
    }

    #[test]
    fn custom_prefix() {
        let c = FilterCounts::from_stats(
            "wasmcustom.hf",
            [("wasmcustom.hf.outbound.cx_active", 0u64)],
        );
        assert_eq!(c.map(|c| c.outbound.cx_active), Some(Some(0)));
    }

    #[test]
    fn zero_outbound_is_idle_at_once() {
        let mut j = InFlightJudge::new(Duration::from_millis(100));
        let t = Instant::now();
        assert_eq!(
            j.observe(t, Some(&sample(0, [5, 5, 0]))),
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
            j.observe(t, Some(&sample(1, [10, 10, 0]))),
            InFlight::Busy {
                outbound_active: Some(1)
            }
        ));
        assert!(matches!(
            j.observe(t + Duration::from_millis(50), Some(&sample(1, [10, 20, 0]))),
            InFlight::Busy { .. }
        ));
        // Bytes stop at t+50: still busy until the window has passed since then.
        assert!(matches!(
            j.observe(
                t + Duration::from_millis(100),
                Some(&sample(1, [10, 20, 0]))
            ),
            InFlight::Busy { .. }
        ));
        assert_eq!(
            j.observe(
                t + Duration::from_millis(150),
                Some(&sample(1, [10, 20, 0]))
            ),
            InFlight::Idle(IdleReason::NoBytesMoved {
                idle_for: Duration::from_millis(100)
            })
        );
        // A byte moves again in any direction: busy again.
        assert!(matches!(
            j.observe(
                t + Duration::from_millis(160),
                Some(&sample(1, [10, 20, 1]))
            ),
            InFlight::Busy { .. }
        ));
    }

    #[test]
    fn a_single_sample_is_not_idle_by_bytes() {
        let mut j = InFlightJudge::new(Duration::from_millis(100));
        assert!(matches!(
            j.observe(Instant::now(), Some(&sample(2, [0, 0, 0]))),
            InFlight::Busy { .. }
        ));
    }

    #[test]
    fn zero_window_is_idle_on_the_second_equal_sample() {
        let mut j = InFlightJudge::new(Duration::ZERO);
        let t = Instant::now();
        // Zero window: an unchanged run of one sample already counts.
        assert!(matches!(
            j.observe(t, Some(&sample(1, [1, 1, 1]))),
            InFlight::Idle(_)
        ));
    }

    #[test]
    fn missing_byte_counts_never_idle_by_bytes() {
        let mut j = InFlightJudge::new(Duration::from_millis(10));
        let t = Instant::now();
        let mut c = FilterCounts::default();
        c.outbound.cx_active = Some(1);
        for ms in [0, 50, 100] {
            assert!(matches!(
                j.observe(t + Duration::from_millis(ms), Some(&c)),
                InFlight::Busy { .. }
            ));
        }
        // Garbage outbound gauge, bytes unchanged: idle by bytes only.
        let mut g = sample(0, [3, 3, 3]);
        g.outbound.cx_active = None;
        assert!(matches!(
            j.observe(t + Duration::from_millis(200), Some(&g)),
            InFlight::Busy {
                outbound_active: None
            }
        ));
        assert!(matches!(
            j.observe(t + Duration::from_millis(210), Some(&g)),
            InFlight::Idle(IdleReason::NoBytesMoved { .. })
        ));
    }

    #[test]
    fn filter_gone_resets_history() {
        let mut j = InFlightJudge::new(Duration::from_millis(10));
        let t = Instant::now();
        j.observe(t, Some(&sample(1, [1, 1, 1])));
        assert_eq!(
            j.observe(t + Duration::from_millis(5), None),
            InFlight::NoFilter
        );
        assert!(matches!(
            j.observe(t + Duration::from_millis(20), Some(&sample(1, [1, 1, 1]))),
            InFlight::Busy { .. }
        ));
    }
}
