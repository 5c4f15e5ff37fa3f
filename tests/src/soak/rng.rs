//! The soak's only source of randomness: SplitMix64 (Steele, Lea, Flood: "Fast splittable
//! pseudorandom number generators", OOPSLA 2014; the constants of Java's `SplittableRandom`).
//! A run is fixed by its seed: every choice of the plan comes from here, in order.

/// A SplitMix64 generator.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` (the top 53 bits).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Uniform in `[lo, hi]` (whole numbers).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// Log-uniform in `[lo, hi]` (`lo > 0`): as many draws near 10 ms as near 1 s.
    pub fn log_range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo || lo == 0 {
            return lo;
        }
        let (l, h) = ((lo as f64).ln(), (hi as f64).ln());
        ((l + (h - l) * self.unit()).exp().round() as u64).clamp(lo, hi)
    }
}

/// A seed from the clock, for runs not given one (printed, so the run can be repeated).
pub fn seed_from_clock() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    SplitMix64::new(nanos ^ u64::from(std::process::id())).next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_sequence() {
        // SplitMix64 seeded with 0: the first outputs of the reference implementation
        // (Vigna's splitmix64.c, used to seed xoshiro).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(r.next_u64(), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn ranges_stay_in_bounds() {
        let mut r = SplitMix64::new(42);
        for _ in 0..10_000 {
            assert!((3..=9).contains(&r.range(3, 9)));
            assert!((10..=3000).contains(&r.log_range(10, 3000)));
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
        }
        assert_eq!(r.range(5, 5), 5);
        assert_eq!(r.log_range(0, 9), 0);
    }
}
