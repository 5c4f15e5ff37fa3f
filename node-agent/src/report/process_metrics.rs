//! The agent's own resources, as metrics read from `<proc-root>/self` (the agent's
//! `--proc-root`, by the `procfs` crate) at scrape time, and its open-files budget.
//!
//! Metric names follow the Prometheus process collector (`process_cpu_seconds_total`,
//! `process_open_fds`, `process_max_fds`, `process_resident_memory_bytes`, `process_threads`),
//! prefixed `holdfast_` like every metric of the agent.

use std::path::{Path, PathBuf};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// Registers the process metrics, read under `proc_root` (the agent's `--proc-root`; see
/// [`own_proc_root`]) (call once per registry).
pub(crate) fn register(registry: &mut Registry, proc_root: &Path) {
    registry.register_collector(Box::new(ProcessCollector {
        proc_root: own_proc_root(proc_root),
    }));
}

/// Where the agent reads its own `self`: under `--proc-root` when that is a procfs (it has a
/// `self` entry; `effects::procfs::check_proc_root` has refused one of another pid namespace
/// at start, so its `self` is the agent), else — a test's fixture tree, which has no `self`
/// (the same rule as `check_proc_root`) — the process's own `/proc`.
pub(crate) fn own_proc_root(proc_root: &Path) -> PathBuf {
    if std::fs::symlink_metadata(proc_root.join("self")).is_ok() {
        proc_root.to_path_buf()
    } else {
        PathBuf::from("/proc")
    }
}

/// A snapshot of the agent's own resources. Each field is `None` when it could not be read.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ProcessStats {
    /// Entries in `<proc-root>/self/fd`.
    pub(crate) open_fds: Option<u64>,
    /// The soft `RLIMIT_NOFILE`.
    pub(crate) max_fds: Option<u64>,
    /// `VmRSS` of `<proc-root>/self/status`, in bytes.
    pub(crate) resident_memory_bytes: Option<u64>,
    /// `Threads` of `<proc-root>/self/status`.
    pub(crate) threads: Option<u64>,
    /// User and system CPU time, in seconds (`utime` + `stime` of `<proc-root>/self/stat`).
    pub(crate) cpu_seconds: Option<f64>,
}

impl ProcessStats {
    /// Reads `<proc_root>/self` (`self` is the reader in the pid namespace of that procfs: the
    /// agent, with the node's `/proc` under `hostPID`).
    pub(crate) fn read(proc_root: &Path) -> Self {
        let me = procfs::process::Process::new_with_root(proc_root.join("self")).ok();
        // The listing's own fd is counted too, as the process collector does.
        let open_fds = me
            .as_ref()
            .and_then(|p| p.fd_count().ok())
            .map(|n| n as u64);
        let max_fds = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .ok()
            .map(|(soft, _)| soft);
        let status = me.as_ref().and_then(|p| p.status().ok());
        let ticks = procfs::ticks_per_second();
        let cpu_seconds = me
            .as_ref()
            .and_then(|p| p.stat().ok())
            .and_then(|s| s.utime.checked_add(s.stime))
            .filter(|_| ticks > 0)
            .map(|cpu| cpu as f64 / ticks as f64);
        Self {
            open_fds,
            max_fds,
            resident_memory_bytes: status
                .as_ref()
                .and_then(|s| s.vmrss)
                .map(|k| k.saturating_mul(1024)),
            threads: status.as_ref().map(|s| s.threads),
            cpu_seconds,
        }
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns `(soft, hard)` after.
///
/// Why: the agent's fds are its ability to work — the pods directory, `/proc`, one netns fd and
/// NFQUEUE socket per holding pod, the admin connections of a drain. The defaults (soft 1024)
/// are far below what the kernel allows the container (hard, often 1048576), and the status API
/// is capped at [`crate::report::server::MAX_CONNECTIONS`], far below either: a flood of clients can
/// take at most that many fds, never the rest.
pub(crate) fn raise_fd_limit() -> Option<(u64, u64)> {
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
struct ProcessCollector {
    proc_root: PathBuf,
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = ProcessStats::read(&self.proc_root);
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

    /// Another proc root is read, not this process's `/proc`: nothing there, nothing said
    /// (the open-files limit is the process's own, not a procfs file). A `--proc-root` with a
    /// `self` is read; a fixture tree without one is not a procfs, and `/proc` is read.
    #[test]
    fn reads_under_the_proc_root() {
        struct Dir(PathBuf);
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let dir = Dir(std::env::temp_dir().join(format!("hf-procroot-{}", std::process::id())));
        std::fs::create_dir_all(&dir.0).expect("mkdir");
        assert_eq!(own_proc_root(&dir.0), Path::new("/proc"));
        std::os::unix::fs::symlink("1", dir.0.join("self")).expect("symlink");
        assert_eq!(own_proc_root(&dir.0), dir.0);
        let s = ProcessStats::read(&dir.0);
        assert_eq!(
            (
                s.open_fds,
                s.resident_memory_bytes,
                s.threads,
                s.cpu_seconds
            ),
            (None, None, None, None),
            "{s:?}"
        );
        assert!(s.max_fds.is_some());
    }

    #[test]
    fn reads_this_process() {
        let s = ProcessStats::read(Path::new("/proc"));
        assert!(s.cpu_seconds.is_some(), "{s:?}");
        assert!(s.open_fds.is_some_and(|n| n >= 3), "{s:?}");
        assert!(s.max_fds.is_some_and(|n| n >= s.open_fds.unwrap_or(0)));
        assert!(
            s.resident_memory_bytes.is_some_and(|b| b > 1 << 20),
            "{s:?}"
        );
        assert!(s.threads.is_some_and(|t| t >= 1));
    }
}
