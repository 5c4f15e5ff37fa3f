//! holdfast against the baseline, lifecycle by lifecycle (issue 28: "never worse than without
//! holdfast", measured). Both variants ran the same plan (the same seed), so lifecycle N is the
//! same pod, app, chaos and timing in both; what each cost its pod ([`LifeCounts`]) is compared
//! count by count.
//!
//! A count is *worse* with holdfast when it is higher than the baseline's. Deletion → pod gone
//! is worse when it is longer by more than [`GONE_SLACK`] *beyond what the app's own exit took
//! longer*: the app's shutdown (its calls after SIGTERM, its exit) is the app's and the
//! machine's, which no agent shortens — on a loaded machine the same plan's app exits a second
//! apart in the two runs — while the time the pod outlives its app is the proxy's, which the
//! agent decides. Outside the comparison, as the rest of the soak
//! counts them: calls inside the fail-open window (no agent bound to the queue), and the
//! deletion → gone time of a drain crossed by an agent outage (its adoption is judged by
//! `drains_not_adopted`, goal 0). The goal is 0 lifecycles worse on any count.

use std::fmt::Write as _;
use std::time::Duration;

use super::tally::LifeCounts;

/// How much later than the baseline's a pod may be gone with holdfast before it counts as
/// worse: the drain's idle window (100 ms), its sampling, Envoy's exit and the kubelet stand-in's
/// polling add up to a few hundred ms on a loaded machine; Istio alone drains for seconds.
pub const GONE_SLACK: Duration = Duration::from_secs(1);

/// One count, over every lifecycle both variants ran.
#[derive(Debug, Clone, Default)]
pub struct Count {
    pub name: &'static str,
    /// Lifecycles where holdfast's count is lower / the same / higher.
    pub better: u32,
    pub same: u32,
    pub worse: u32,
    /// Sums (deletion → gone: p50 in ms, as a sum means little).
    pub with: f64,
    pub without: f64,
}

/// The comparison: the counts, and a line for every lifecycle where holdfast was worse.
#[derive(Debug, Clone, Default)]
pub struct Versus {
    pub counts: Vec<Count>,
    pub worse: Vec<String>,
    /// Lifecycles one variant has and the other has not (a run cut short).
    pub unmatched: usize,
}

impl Versus {
    /// Lifecycles worse with holdfast on some count (goal 0).
    pub fn lifecycles_worse(&self) -> usize {
        self.worse.len()
    }
}

/// Compares holdfast's lifecycles (`with`) with the baseline's (`without`), by plan index.
pub fn compare(with: &[LifeCounts], without: &[LifeCounts]) -> Versus {
    type Get = fn(&LifeCounts) -> Option<f64>;
    let counts: [(&'static str, Get, f64); 4] = [
        ("refused calls", |c| Some(f64::from(c.refused)), 0.0),
        ("failed calls", |c| Some(f64::from(c.failed)), 0.0),
        (
            "bytes of responses not delivered",
            |c| Some(c.bytes_missing as f64),
            0.0,
        ),
        (
            "deletion → pod gone, ms",
            |c| c.deletion_to_gone_ms.filter(|_| !c.drain_crossed),
            GONE_SLACK.as_secs_f64() * 1000.0,
        ),
    ];
    let mut v = Versus {
        counts: counts
            .iter()
            .map(|(name, ..)| Count {
                name,
                ..Count::default()
            })
            .collect(),
        ..Versus::default()
    };
    let mut gone: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for w in with {
        let Some(b) = without.iter().find(|b| b.index == w.index) else {
            v.unmatched += 1;
            continue;
        };
        let mut worse_on = String::new();
        // How much later holdfast's app exited after the deletion than the baseline's.
        let app_later = match (w.deletion_to_app_exit_ms, b.deletion_to_app_exit_ms) {
            (Some(x), Some(y)) => (x - y).max(0.0),
            _ => 0.0,
        };
        for (k, (name, get, slack)) in counts.iter().enumerate() {
            let (Some(x), Some(y)) = (get(w), get(b)) else {
                continue;
            };
            let slack = if k == 3 { slack + app_later } else { *slack };
            let c = &mut v.counts[k];
            if k == 3 {
                gone[0].push(x);
                gone[1].push(y);
            } else {
                c.with += x;
                c.without += y;
            }
            if x > y + slack {
                c.worse += 1;
                let _ = write!(worse_on, "{name} {x:.0} against {y:.0}; ");
            } else if x < y - slack {
                c.better += 1;
            } else {
                c.same += 1;
            }
        }
        if !worse_on.is_empty() {
            let exits = |c: &LifeCounts| {
                format!(
                    "app exit {} / gone {} ms after the deletion",
                    c.deletion_to_app_exit_ms
                        .map_or("—".into(), |v| format!("{v:.0}")),
                    c.deletion_to_gone_ms
                        .map_or("—".into(), |v| format!("{v:.0}"))
                )
            };
            v.worse.push(format!(
                "lifecycle {}: {} (holdfast: {}; no agent: {})",
                w.index,
                worse_on.trim_end_matches("; "),
                exits(w),
                exits(b)
            ));
        }
    }
    v.unmatched += without
        .iter()
        .filter(|b| !with.iter().any(|w| w.index == b.index))
        .count();
    let p50 = |xs: &[f64]| crate::bench::percentile(xs, 0.5).unwrap_or(0.0);
    v.counts[3].with = p50(&gone[0]);
    v.counts[3].without = p50(&gone[1]);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn life(index: usize, refused: u32, failed: u32, gone_ms: f64) -> LifeCounts {
        LifeCounts {
            index,
            refused,
            failed,
            deletion_to_gone_ms: Some(gone_ms),
            ..LifeCounts::default()
        }
    }

    #[test]
    fn a_lifecycle_is_worse_on_any_count_higher_than_the_baselines() {
        let with = [
            life(0, 0, 0, 200.0),
            life(1, 1, 1, 200.0),
            life(2, 0, 0, 5400.0),
            LifeCounts {
                bytes_missing: 10,
                ..life(3, 0, 0, 100.0)
            },
        ];
        let without = [
            life(0, 2, 3, 5000.0),
            life(1, 0, 0, 5000.0),
            life(2, 0, 0, 5000.0),
            life(3, 0, 0, 5000.0),
        ];
        let v = compare(&with, &without);
        assert_eq!(v.lifecycles_worse(), 2, "{:#?}", v.worse);
        assert!(v.worse[0].starts_with("lifecycle 1: refused calls 1 against 0"));
        assert!(v.worse[1].starts_with("lifecycle 3: bytes"));
        let refused = &v.counts[0];
        assert_eq!((refused.better, refused.same, refused.worse), (1, 2, 1));
        assert_eq!((refused.with, refused.without), (1.0, 2.0));
        // 400 ms later than the baseline is within the slack; only the count shows it.
        let gone = &v.counts[3];
        assert_eq!((gone.better, gone.same, gone.worse), (3, 1, 0));
        assert_eq!(v.unmatched, 0);
    }

    #[test]
    fn a_pod_gone_later_because_its_app_exited_later_is_not_worse() {
        let with = LifeCounts {
            deletion_to_app_exit_ms: Some(6100.0),
            ..life(0, 0, 0, 6300.0)
        };
        let without = LifeCounts {
            deletion_to_app_exit_ms: Some(5000.0),
            ..life(0, 0, 0, 5100.0)
        };
        assert_eq!(compare(&[with], &[without]).lifecycles_worse(), 0);
        // The same app exit, the proxy kept 2.2 s longer: worse.
        let kept = LifeCounts {
            deletion_to_app_exit_ms: Some(5000.0),
            ..life(0, 0, 0, 7300.0)
        };
        let v = compare(&[kept], &[without]);
        assert_eq!(v.lifecycles_worse(), 1, "{v:?}");
        assert!(
            v.worse[0].contains("holdfast: app exit 5000 / gone 7300"),
            "{v:?}"
        );
    }

    #[test]
    fn a_crossed_drain_and_a_missing_lifecycle_are_left_out() {
        let with = [LifeCounts {
            drain_crossed: true,
            ..life(0, 0, 0, 9000.0)
        }];
        let v = compare(&with, &[life(0, 0, 0, 5000.0), life(1, 0, 0, 1.0)]);
        assert_eq!(v.lifecycles_worse(), 0);
        assert_eq!(v.unmatched, 1);
    }
}
