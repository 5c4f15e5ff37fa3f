//! Which processes of the proxy container are the proxy itself: the container's main process
//! (pilot-agent in Istio's `istio-proxy`) and its children (Envoy). The agent watches only
//! these for the proxy going (`lifecycle::driver`'s proxy watch), never every process of the
//! container: a `kubectl exec` session, an exec probe or a shell loop run in the container
//! ending is not the proxy going (issue 29).
//!
//! How they are told apart, without trusting any name:
//! - **the main process** is the container's oldest process (`/proc/<pid>/stat` field 22, the
//!   start time). The runtime starts it first (`runc init` execs the entrypoint in place); a
//!   process entering the container later (`runc exec`, which `kubectl exec` and exec probes
//!   use) starts later, and its parent is the runtime's shim, outside the container.
//! - **Envoy** is a child of the main process: pilot-agent starts it with `exec.Command`
//!   (istio/istio `pkg/envoy/proxy.go`, `(*envoy).Run`: `cmd := exec.Command(e.Config.BinaryPath,
//!   args...)`, then `cmd.Start()`), so its parent pid is pilot-agent's. Where the entrypoint is Envoy itself, the main
//!   process is Envoy.
//!
//! A command name (`comm`, `exe`) is not used: the pod chooses it (a process of the pod may call
//! itself `envoy`), while a start time and a parent are the kernel's. The pod's own main
//! process can still fork children that exit; what that costs the agent is bounded by the
//! machine's pace of proxy-gone re-checks (`machine::ProxyGonePace`), not here.

use std::path::Path;

/// What the kernel says about one process, as the choice needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    /// Clock ticks after boot.
    pub start_time: u64,
}

/// The proxy's own processes among `container` (every process of the proxy container): the
/// oldest (the main process; equal start times, the lower pid) and its direct children. Empty
/// when `container` is.
pub(crate) fn proxy_pids(container: &[ProcInfo]) -> Vec<i32> {
    let Some(main) = container
        .iter()
        .min_by_key(|p| (p.start_time, p.pid))
        .copied()
    else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = container
        .iter()
        .filter(|p| p.pid == main.pid || p.ppid == main.pid)
        .map(|p| p.pid)
        .collect();
    pids.sort_unstable();
    pids
}

/// Reads `pid`'s parent and start time under `proc_root`; `None` when it is gone or its stat
/// cannot be read.
pub(crate) fn read_info(proc_root: &Path, pid: i32) -> Option<ProcInfo> {
    let stat = procfs::process::Process::new_with_root(proc_root.join(pid.to_string()))
        .ok()?
        .stat()
        .ok()?;
    Some(ProcInfo {
        pid,
        ppid: stat.ppid,
        start_time: stat.starttime,
    })
}

/// [`proxy_pids`] of the container whose processes are `pids` (read under `proc_root`; a pid
/// gone meanwhile is left out). Blocking: one small read per process.
pub(crate) fn proxy_pids_of(proc_root: &Path, pids: &[i32]) -> Vec<i32> {
    let infos: Vec<ProcInfo> = pids
        .iter()
        .filter_map(|&pid| read_info(proc_root, pid))
        .collect();
    proxy_pids(&infos)
}

/// Sends SIGTERM to the main process of the proxy container whose processes are `pids` (the
/// oldest: the mesh's agent, kuma-dp), pinned by a pidfd whose process still has the start time
/// read before (a pid reused meanwhile is not signalled). Returns the pid signalled. Needs
/// `CAP_KILL` for a process of another uid (the proxy's): `EPERM` without it.
pub(crate) fn terminate_main(proc_root: &Path, pids: &[i32]) -> Result<i32, String> {
    let infos: Vec<ProcInfo> = pids
        .iter()
        .filter_map(|&pid| read_info(proc_root, pid))
        .collect();
    let main = infos
        .iter()
        .min_by_key(|p| (p.start_time, p.pid))
        .copied()
        .ok_or_else(|| "no process of the proxy container".to_string())?;
    let raw = rustix::process::Pid::from_raw(main.pid).ok_or("pid 0")?;
    let pidfd = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty())
        .map_err(|e| format!("pidfd_open({}): {e}", main.pid))?;
    if read_info(proc_root, main.pid).map(|i| i.start_time) != Some(main.start_time) {
        return Err(format!(
            "process {} changed before it was signalled",
            main.pid
        ));
    }
    rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::TERM).map_err(|e| {
        if e == rustix::io::Errno::PERM {
            format!(
                "SIGTERM to the proxy's main process {}: not permitted (the agent needs CAP_KILL \
                 to signal the proxy's uid)",
                main.pid
            )
        } else {
            format!("SIGTERM to the proxy's main process {}: {e}", main.pid)
        }
    })?;
    Ok(main.pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32, start_time: u64) -> ProcInfo {
        ProcInfo {
            pid,
            ppid,
            start_time,
        }
    }

    /// pilot-agent (the oldest) and Envoy (its child) are the proxy; an exec session, an exec
    /// probe and what they fork are not, whatever they call themselves, and whatever their pids
    /// (pids wrap: an exec'd process may have a lower pid than pilot-agent).
    #[test]
    fn the_proxy_is_the_main_process_and_its_children() {
        let shim = 900;
        let container = [
            p(1000, shim, 50),  // pilot-agent, started first
            p(1010, 1000, 52),  // Envoy, its child
            p(40, shim, 900),   // `kubectl exec ... sh` (a lower pid: pids wrapped)
            p(41, 40, 901),     // `sleep 0.005` forked by that shell
            p(2000, shim, 950), // an exec probe
        ];
        assert_eq!(proxy_pids(&container), vec![1000, 1010]);
        // Envoy as the entrypoint: the main process alone.
        assert_eq!(proxy_pids(&[p(7, 1, 10), p(8, 1, 20)]), vec![7]);
        // Equal start times (same clock tick): the lower pid is the main process.
        assert_eq!(proxy_pids(&[p(9, 1, 10), p(8, 1, 10)]), vec![8]);
        assert!(proxy_pids(&[]).is_empty());
    }

    /// The real /proc: this test process is its own container's "main process" and a child it
    /// starts is watched; a process started beside it (same parent, later) is not.
    #[test]
    fn reads_parents_and_start_times_from_proc() {
        let me = std::process::id() as i32;
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("spawn sleep");
        let child_pid = child.id() as i32;
        let info = read_info(Path::new("/proc"), child_pid).expect("child's stat");
        assert_eq!(info.ppid, me);
        let mine = read_info(Path::new("/proc"), me).expect("own stat");
        assert!(mine.start_time <= info.start_time);
        assert_eq!(
            proxy_pids_of(Path::new("/proc"), &[child_pid, me]),
            vec![me.min(child_pid), me.max(child_pid)]
        );
        assert!(read_info(Path::new("/proc"), i32::MAX).is_none());
        let _ = child.kill();
        let _ = child.wait();
    }
}
