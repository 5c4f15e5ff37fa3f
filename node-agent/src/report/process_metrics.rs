//! The agent's own resources, as metrics read from `/proc/self` at scrape time, and its
//! open-files budget.
//!
//! Metric names follow the Prometheus process collector (`process_cpu_seconds_total`,
//! `process_open_fds`, `process_max_fds`, `process_resident_memory_bytes`, `process_threads`),
//! prefixed `holdfast_` like every metric of the agent. `holdfast_source_problems` (the pod
//! source's current rejected entries) is registered here too, so one call wires them all.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// Registers the process metrics and `holdfast_source_problems` (call once per registry).
pub fn register(registry: &mut Registry) {
    registry.register_collector(Box::new(ProcessCollector));
}

/// A snapshot of the agent's own resources. Each field is `None` when it could not be read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessStats {
    /// Entries in `/proc/self/fd`.
    pub open_fds: Option<u64>,
    /// The soft `RLIMIT_NOFILE`.
    pub max_fds: Option<u64>,
    /// `VmRSS` of `/proc/self/status`, in bytes.
    pub resident_memory_bytes: Option<u64>,
    /// `Threads` of `/proc/self/status`.
    pub threads: Option<u64>,
    /// User and system CPU time, in seconds (`utime` + `stime` of `/proc/self/stat`).
    pub cpu_seconds: Option<f64>,
}

impl ProcessStats {
    /// Reads `/proc/self`.
    pub fn read() -> Self {
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            // The listing's own fd is counted too, as the process collector does.
            .map(|d| d.count() as u64);
        let max_fds = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .ok()
            .map(|(soft, _)| soft);
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let (rss_kib, threads) = parse_status(&status);
        let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .filter(|t| *t > 0);
        let cpu_seconds = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_stat_cpu_ticks(&s))
            .zip(ticks)
            .map(|(cpu, per_second)| cpu as f64 / per_second as f64);
        Self {
            open_fds,
            max_fds,
            resident_memory_bytes: rss_kib.map(|k| k.saturating_mul(1024)),
            threads,
            cpu_seconds,
        }
    }
}

/// `utime` + `stime` (clock ticks) from the text of `/proc/<pid>/stat` (proc(5): fields 14 and
/// 15, counted after the `(comm)` field, which may itself contain spaces and parentheses).
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After `comm` come state (field 3) .. utime (14), stime (15).
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    utime.checked_add(stime)
}

/// `VmRSS` (KiB) and `Threads` from the text of `/proc/<pid>/status` (proc(5): `VmRSS:\t  1234 kB`).
pub fn parse_status(status: &str) -> (Option<u64>, Option<u64>) {
    let field = |name: &str| {
        status.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
    };
    (field("VmRSS"), field("Threads"))
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns `(soft, hard)` after.
///
/// Why: the agent's fds are its ability to work — the pods directory, `/proc`, one netns fd and
/// NFQUEUE socket per holding pod, the admin connections of a drain. The defaults (soft 1024)
/// are far below what the kernel allows the container (hard, often 1048576), and the status API
/// is capped at [`crate::report::server::MAX_CONNECTIONS`], far below either: a flood of clients can
/// take at most that many fds, never the rest.
pub fn raise_fd_limit() -> Option<(u64, u64)> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft < hard {
        if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            tracing::warn!(soft, hard, error = %e, "cannot raise the open-files limit");
            return Some((soft, hard));
        }
    }
    getrlimit(Resource::RLIMIT_NOFILE).ok()
}

#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = ProcessStats::read();
        let gauges = [
            (
                "holdfast_process_open_fds",
                "Open file descriptors of the agent (/proc/self/fd)",
                stats.open_fds,
            ),
            (
                "holdfast_process_max_fds",
                "The agent's open-files limit (soft RLIMIT_NOFILE)",
                stats.max_fds,
            ),
            (
                "holdfast_process_resident_memory_bytes",
                "Resident memory of the agent in bytes (VmRSS)",
                stats.resident_memory_bytes,
            ),
            (
                "holdfast_process_threads",
                "Threads of the agent",
                stats.threads,
            ),
        ];
        for (name, help, value) in gauges {
            let Some(value) = value else { continue };
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        if let Some(cpu) = stats.cpu_seconds {
            let counter = ConstCounter::new(cpu);
            counter.encode(encoder.encode_descriptor(
                "holdfast_process_cpu_seconds",
                "User and system CPU time of the agent, in seconds (/proc/self/stat)",
                None,
                counter.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_parse_and_garbage_is_none() {
        let text = "Name:\tholdfast\nThreads:\t7\nVmRSS:\t   12345 kB\n";
        assert_eq!(parse_status(text), (Some(12345), Some(7)));
        assert_eq!(parse_status("VmRSS: x kB\nThreads:"), (None, None));
        assert_eq!(parse_status(""), (None, None));
    }

    #[test]
    fn stat_cpu_ticks_parse_past_a_comm_with_spaces_and_parens() {
        // proc(5) field order; comm "a) b" — the last ')' ends it.
        let stat = "42 (a) b) S 1 42 42 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 3 0 12345 0 0";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(281));
        assert_eq!(parse_stat_cpu_ticks("42 (x) S 1 2"), None);
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
        let own = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
        assert!(parse_stat_cpu_ticks(&own).is_some(), "{own}");
        assert!(ProcessStats::read().cpu_seconds.is_some());
    }

    #[test]
    fn reads_this_process() {
        let s = ProcessStats::read();
        assert!(s.open_fds.is_some_and(|n| n >= 3), "{s:?}");
        assert!(s.max_fds.is_some_and(|n| n >= s.open_fds.unwrap_or(0)));
        assert!(
            s.resident_memory_bytes.is_some_and(|b| b > 1 << 20),
            "{s:?}"
        );
        assert!(s.threads.is_some_and(|t| t >= 1));
    }
}
