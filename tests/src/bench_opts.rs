//! Options of the simulated-node benchmark sections (`holdfast-bench hold|drain`).

use std::path::PathBuf;
use std::time::Duration;

/// Set by `holdfast-bench` from its command line.
#[derive(Debug, Clone)]
pub struct SimBenchOpts {
    /// The `holdfast` binary (built next to `holdfast-bench`).
    pub holdfast: PathBuf,
    /// The `sim-app` binary (built next to `holdfast-bench`).
    pub sim_app: PathBuf,
    /// Repetitions per variant (pods per round x rounds).
    pub runs: u32,
    /// How late Envoy is (hold section).
    pub proxy_delay: Duration,
    /// How long the app initialises before its first call (hold section).
    pub app_init: Duration,
    /// Pods per variant in each round (hold section).
    pub hold_pods: u32,
    /// How long the calling app keeps calling out after SIGTERM (drain section).
    pub after_sigterm: Duration,
}
