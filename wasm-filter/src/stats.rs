//! The filter's stats: their names, and the per-connection ledger that makes sure every
//! connection is counted exactly once and uncounted exactly once, whichever callback ends it.

use crate::direction::Direction;

/// The kind of an Envoy metric, mirrored here so the core needs no `proxy_wasm` import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatKind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
}

/// The names of one direction's stats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectionStatNames {
    /// Gauge: connections open now.
    pub cx_active: String,
    /// Counter: connections seen.
    pub cx_total: String,
}

/// Every stat name of the filter, built once from the configured prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatNames {
    /// Gauge set to 1 once the configuration is accepted (by any VM, the main thread's canary
    /// included): kept for compatibility; [`StatNames::workers_ready`] is the exact signal.
    pub loaded: String,
    /// Gauge: how many Envoy worker threads have this filter configured (see [`crate::workers`]).
    pub workers_ready: String,
    /// Indexed by [`Direction::index`].
    pub per_direction: [DirectionStatNames; 3],
}

impl StatNames {
    /// Names under `prefix` (already validated by [`crate::config::FilterConfig::parse`]).
    pub fn new(prefix: &str) -> StatNames {
        let dir = |d: Direction| DirectionStatNames {
            cx_active: format!("{prefix}.{}.cx_active", d.as_str()),
            cx_total: format!("{prefix}.{}.cx_total", d.as_str()),
        };
        StatNames {
            loaded: format!("{prefix}.loaded"),
            workers_ready: format!("{prefix}.workers_ready"),
            per_direction: Direction::ALL.map(dir),
        }
    }

    /// Every (name, kind) pair, in definition order.
    pub fn all(&self) -> Vec<(&str, StatKind)> {
        let mut v = vec![
            (self.loaded.as_str(), StatKind::Gauge),
            (self.workers_ready.as_str(), StatKind::Gauge),
        ];
        for d in &self.per_direction {
            v.push((d.cx_active.as_str(), StatKind::Gauge));
            v.push((d.cx_total.as_str(), StatKind::Counter));
        }
        v
    }
}

/// Where one connection is in its counting life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    /// Not counted yet (before `on_new_connection`).
    #[default]
    New,
    /// Counted in `cx_active` / `cx_total` under this direction.
    Open(Direction),
    /// Uncounted from `cx_active`; nothing more may change for it.
    Closed,
}

/// Per-connection bookkeeping: decides, for each callback, whether a stat must change.
///
/// Envoy may end a connection through several callbacks (`on_log`, and the context's drop when
/// the VM deletes it); whichever comes first uncounts it and the others see [`State::Closed`].
#[derive(Debug, Default)]
pub struct ConnectionLedger {
    state: State,
}

impl ConnectionLedger {
    /// A connection not counted yet.
    pub fn new() -> ConnectionLedger {
        ConnectionLedger::default()
    }

    /// The connection opened under `direction`. Returns true the first time only: the caller
    /// then adds 1 to `cx_active` and `cx_total`.
    pub fn open(&mut self, direction: Direction) -> bool {
        if self.state != State::New {
            return false;
        }
        self.state = State::Open(direction);
        true
    }

    /// The direction the connection is counted under, while it is open.
    pub fn direction(&self) -> Option<Direction> {
        match self.state {
            State::Open(d) => Some(d),
            State::New | State::Closed => None,
        }
    }

    /// The connection ended. Returns the direction to take 1 off `cx_active` under, exactly once
    /// per counted connection; `None` if it was never counted or already uncounted.
    pub fn close(&mut self) -> Option<Direction> {
        match self.state {
            State::Open(d) => {
                self.state = State::Closed;
                Some(d)
            }
            State::New => {
                // Never counted: remember it ended so a late open cannot count it.
                self.state = State::Closed;
                None
            }
            State::Closed => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_prefix() {
        let n = StatNames::new("holdfast");
        assert_eq!(n.loaded, "holdfast.loaded");
        assert_eq!(n.workers_ready, "holdfast.workers_ready");
        assert_eq!(n.per_direction[0].cx_active, "holdfast.inbound.cx_active");
        assert_eq!(n.per_direction[1].cx_total, "holdfast.outbound.cx_total");
        assert_eq!(n.per_direction[2].cx_total, "holdfast.unknown.cx_total");
        assert_eq!(n.all().len(), 8);
        let gauges = n
            .all()
            .iter()
            .filter(|(_, k)| *k == StatKind::Gauge)
            .count();
        assert_eq!(gauges, 5);
    }

    #[test]
    fn counted_once_uncounted_once() {
        let mut c = ConnectionLedger::new();
        assert!(c.open(Direction::Inbound));
        assert!(!c.open(Direction::Outbound), "second open must not count");
        assert_eq!(c.direction(), Some(Direction::Inbound));
        assert_eq!(c.close(), Some(Direction::Inbound));
        assert_eq!(c.close(), None, "on_log then drop must not uncount twice");
        assert!(!c.open(Direction::Inbound), "closed stays closed");
        assert_eq!(c.direction(), None);
    }

    #[test]
    fn never_opened_is_never_uncounted() {
        let mut c = ConnectionLedger::new();
        assert_eq!(c.close(), None);
        assert!(!c.open(Direction::Outbound));
        assert_eq!(c.close(), None);
    }

    /// Any sequence of callbacks leaves the gauge where it started once the connection ends.
    #[test]
    fn gauge_balances_for_every_callback_order() {
        #[derive(Clone, Copy, Debug)]
        enum Ev {
            Open,
            Close,
        }
        let evs = [Ev::Open, Ev::Close];
        // All sequences of length 0..=6 over the events, then a final close (drop).
        fn walk(seq: &mut Vec<Ev>, evs: &[Ev; 2], depth: usize) {
            let mut gauge = 0i64;
            let mut total = 0u64;
            let mut c = ConnectionLedger::new();
            for e in seq.iter() {
                match e {
                    Ev::Open => {
                        if c.open(Direction::Unknown) {
                            gauge += 1;
                            total += 1;
                        }
                    }
                    Ev::Close => {
                        if c.close().is_some() {
                            gauge -= 1;
                        }
                    }
                }
                assert!((0..=1).contains(&gauge), "{seq:?}");
            }
            if c.close().is_some() {
                gauge -= 1;
            }
            assert_eq!(gauge, 0, "{seq:?}");
            assert!(total <= 1, "{seq:?}");
            if depth == 0 {
                return;
            }
            for e in evs {
                seq.push(*e);
                walk(seq, evs, depth - 1);
                seq.pop();
            }
        }
        walk(&mut Vec::new(), &evs, 6);
    }
}
