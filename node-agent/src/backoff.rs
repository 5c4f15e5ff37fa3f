//! The one back-off every retry and pause of the agent uses: a pause that starts at `first`, is
//! multiplied by `factor` with each step, and never exceeds `max` (nor falls below `first`).
//! Each caller names its bounds beside the reason for them; the arithmetic is here once,
//! saturating, so no count of steps can overflow or wrap to a short pause.

use std::time::Duration;

/// A growing pause between `first` and `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
    pub factor: u32,
}

impl Backoff {
    /// Doubling from `first` up to `max` (`first` when `max` is shorter).
    pub const fn doubling(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            factor: 2,
        }
    }

    /// The upper bound actually applied: `max`, or `first` when that is longer.
    fn ceiling(&self) -> Duration {
        self.max.max(self.first)
    }

    /// The pause after `steps` steps: `first × factor^steps`, at most the ceiling.
    pub fn after(&self, steps: u32) -> Duration {
        let mut pause = self.first;
        let ceiling = self.ceiling();
        for _ in 0..steps {
            if pause >= ceiling || self.factor <= 1 {
                break;
            }
            pause = pause.saturating_mul(self.factor);
        }
        pause.min(ceiling)
    }

    /// The pause after `previous` (`None`: the first pause): `previous × factor`, kept within
    /// `first` and the ceiling.
    pub fn next(&self, previous: Option<Duration>) -> Duration {
        match previous {
            None => self.first,
            Some(p) => p
                .saturating_mul(self.factor)
                .clamp(self.first, self.ceiling()),
        }
    }
}

/// `pause` with "equal jitter": a random point of `[pause/2, pause]`, so the agents of many
/// nodes that failed together (an API server restart) do not retry in step.
pub fn jittered(pause: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    // std's RandomState is seeded from the OS once per thread and stepped per instance: enough
    // to spread retries, with no dependency for it.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(pause.subsec_nanos());
    let fraction = (h.finish() % 1_001) as f64 / 1_000.0;
    let half = pause / 2;
    half + half.mul_f64(fraction)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn doubles_then_stays_at_the_ceiling() {
        let b = Backoff::doubling(Duration::from_millis(100), Duration::from_secs(1));
        let steps: Vec<u128> = (0..6).map(|n| b.after(n).as_millis()).collect();
        assert_eq!(steps, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.next(None), Duration::from_millis(100));
        assert_eq!(
            b.next(Some(Duration::from_millis(700))),
            Duration::from_secs(1)
        );
        // A first pause longer than the ceiling is kept.
        let b = Backoff::doubling(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(b.after(5), Duration::from_secs(2));
    }

    #[test]
    fn jitter_spreads_within_the_upper_half() {
        let pause = Duration::from_secs(4);
        let picks: std::collections::BTreeSet<Duration> =
            (0..50).map(|_| jittered(pause)).collect();
        assert!(
            picks.iter().all(|p| *p >= pause / 2 && *p <= pause),
            "{picks:?}"
        );
        assert!(picks.len() > 10, "not spread: {picks:?}");
        assert_eq!(jittered(Duration::ZERO), Duration::ZERO);
    }

    proptest! {
        /// Never below `first`, never above the ceiling, never shorter after more steps, and
        /// `next` agrees with `after` step by step.
        #[test]
        fn bounded_monotone_and_consistent(
            first_ms in 0u64..10_000,
            max_ms in 0u64..100_000,
            factor in 0u32..5,
            steps in 0u32..200,
        ) {
            let b = Backoff {
                first: Duration::from_millis(first_ms),
                max: Duration::from_millis(max_ms),
                factor,
            };
            let ceiling = b.max.max(b.first);
            let a = b.after(steps);
            prop_assert!(a >= b.first && a <= ceiling);
            prop_assert!(b.after(steps + 1) >= a);
            let mut p = None;
            for _ in 0..=steps.min(40) {
                p = Some(b.next(p));
            }
            prop_assert_eq!(p.unwrap(), b.after(steps.min(40)));
        }
    }
}
