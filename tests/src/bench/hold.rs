//! The `hold` benchmark section (see docs/benchmarks.md).

/// Options shared by the simulated-node sections.
pub use crate::bench_opts::SimBenchOpts;

/// Runs the section and prints its table.
pub fn run(_opts: &SimBenchOpts) -> anyhow::Result<()> {
    anyhow::bail!("the hold section is not written yet")
}
