//! The chaos soak's short form, inside `just test` (the long form is `just soak`): a few dozen
//! pod lifecycles on the simulated node while the agent is SIGKILLed and SIGTERMed and
//! restarted 10 ms … 3 s later, Envoys are killed and frozen, and the status API is flooded;
//! then the same seed without holdfast; downloads through drains and pods restarted whole
//! (sandbox recreated, in place) among them. holdfast's run must meet every goal (see
//! `holdfast_tests::soak::missed_goals`: no lifecycle worse than the baseline's among them);
//! the baseline must show the failures holdfast removes.
//!
//! `HOLDFAST_SOAK_SEED` repeats a seed (printed at start and in any failure).

use holdfast_tests::sim::privileged;
use holdfast_tests::soak::{self, plan::ChaosRates, SoakOpts, Variant};

#[test]
fn chaos_soak_short() {
    if !privileged("chaos_soak_short") {
        return;
    }
    let seed = std::env::var("HOLDFAST_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261123);
    let opts = SoakOpts {
        seed,
        lifecycles: 32,
        from: 0,
        concurrency: 6,
        // More agent restarts than the long form, so 32 lifecycles see a few of each kind.
        rates: ChaosRates {
            agent: 0.4,
            ..ChaosRates::default()
        },
        sim_app: Some(env!("CARGO_BIN_EXE_sim-app").into()),
        holdfast: None,
        name: "soak".into(),
    };
    let runs = soak::run(&opts, &[Variant::Holdfast, Variant::Baseline])
        .unwrap_or_else(|e| panic!("soak seed {seed}: {e:#}"));
    let (with, without) = (&runs[0], &runs[1]);
    let missed = soak::missed_goals(with);
    assert!(
        missed.is_empty(),
        "soak seed {seed}: holdfast missed: {missed:#?}"
    );
    assert!(
        !with.outages.is_empty() && with.tally.envoy_kills + with.tally.envoy_freezes > 0,
        "soak seed {seed}: the chaos ran (outages {:?})",
        with.outages
    );
    // Issue 28's lifecycles ran too: downloads through drains, pods restarted whole; and the
    // comparison with the baseline, lifecycle by lifecycle (its goal is in `missed_goals`).
    let t = &with.tally;
    assert!(
        t.downloads > 0 && t.sandbox_recreations + t.in_place_restarts > 0,
        "soak seed {seed}: downloads {}, sandbox recreations {}, in-place restarts {}",
        t.downloads,
        t.sandbox_recreations,
        t.in_place_restarts
    );
    let versus = with.versus.as_ref().expect("compared with the baseline");
    assert_eq!(versus.unmatched, 0, "soak seed {seed}: {versus:?}");
    // The baseline shows what holdfast removes: refused calls, Jobs that never complete.
    assert!(
        without.tally.refused > 0 && without.tally.jobs_never_completed > 0,
        "soak seed {seed}: the baseline fails as sidecars do without holdfast: {:?}",
        without.tally
    );
    assert!(
        without.leftovers.is_empty(),
        "baseline leftovers: {:?}",
        without.leftovers
    );
}
