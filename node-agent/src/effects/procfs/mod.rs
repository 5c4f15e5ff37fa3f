//! What procfs (and the kernel) say about pods: which pod and container a process belongs to
//! ([`cgroup`]), which sockets listen in a network namespace ([`sock_diag`], over netlink, what
//! readiness uses), and the same from `/proc/<pid>/net/tcp{,6}` ([`sockets`], the fallback when a
//! kernel has no sock_diag: it walks the whole established table, ~4 ms per read).
//!
//! The cached index of every pod's processes, which the agent polls, is
//! [`crate::effects::procfs::pod_procs`]; it classifies processes with [`cgroup::parse_pod_cgroup`].

#![forbid(unsafe_code)]

pub mod cgroup;
pub mod pod_procs;
pub(crate) mod proxy_procs;
pub mod sock_diag;
pub mod sockets;

pub(crate) use crate::effects::netns::NetnsId;
pub use cgroup::{parse_pod_cgroup, PodCgroup};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read TCP sockets in netns {netns:?}: {reason}")]
    NetnsSockets { netns: NetnsId, reason: String },
}

/// Result of this module.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// Checks that the procfs at `proc_root` is one of the agent's own pid namespace: the pids it
/// lists are the ones the agent's `pidfd_open` and signals mean. A procfs of another pid
/// namespace (a host's `/proc` mounted into a container without `hostPID`) lists pids the
/// agent cannot open: every app process would look gone at once, and drains would quit Envoy
/// with the app still running. Told by procfs itself: its `self` link names the reading
/// process's pid *in the namespace the procfs belongs to* (fs/proc/self.c `proc_self_get_link`,
/// `task_tgid_nr_ns` with the mount's namespace), so it equals the agent's own pid only in the
/// agent's namespace, and does not resolve at all where the agent is not visible. A directory
/// without a `self` entry is no procfs (a test's fixture tree): nothing to check.
pub fn check_proc_root(proc_root: &std::path::Path) -> std::result::Result<(), String> {
    let entry = proc_root.join("self");
    if std::fs::symlink_metadata(&entry).is_err() {
        return Ok(());
    }
    let link = std::fs::read_link(&entry)
        .map(|t| t.to_string_lossy().into_owned())
        .map_err(|e| e.to_string());
    proc_root_is_ours(proc_root, link, std::process::id())
}

/// The decision of [`check_proc_root`], from what `<proc_root>/self` reads (`Err`: why not).
pub(crate) fn proc_root_is_ours(
    proc_root: &std::path::Path,
    self_link: std::result::Result<String, String>,
    pid: u32,
) -> std::result::Result<(), String> {
    let fix = "run the agent with hostPID: true and --proc-root /proc (as the DaemonSet in \
               manifests/agent does), or point --proc-root at a procfs mounted from inside the \
               agent's own pid namespace";
    match self_link {
        Ok(target) if target == pid.to_string() => Ok(()),
        Ok(target) => Err(format!(
            "--proc-root {}: this procfs belongs to another pid namespace (its self is pid \
             {target}, the agent is pid {pid}), so the agent cannot follow the pods' processes \
             and every drain would see the app gone at once; {fix}",
            proc_root.display()
        )),
        Err(why) => Err(format!(
            "--proc-root {}: cannot read its self link ({why}): not a procfs, or one of a pid \
             namespace the agent is not in, so the agent cannot follow the pods' processes; \
             {fix}",
            proc_root.display()
        )),
    }
}

/// For the socket tests of this module: a socket a test has just closed may stay open for a
/// moment, because another test of the same binary forked a child meanwhile. The child gets a
/// copy of the fd table at the fork, and `O_CLOEXEC` closes the copy only at its exec, so the
/// kernel still lists the socket in that window. Seen once in five `just test` runs on a fresh
/// clone: a listener test (since gone with `sockets::listening_ports`), "port 46307 still in
/// {2024, 46307}" just after the drop. The tests therefore wait, bounded, for a closed socket to go. A reader that keeps
/// reporting it after that still fails them.
#[cfg(test)]
pub(crate) fn gone_soon(mut still_listed: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while still_listed() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    true
}

#[cfg(test)]
mod proc_root_tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_agents_own_procfs_passes_and_others_are_refused_with_the_fix() {
        assert_eq!(check_proc_root(Path::new("/proc")), Ok(()));
        let root = Path::new("/host/proc");
        assert_eq!(proc_root_is_ours(root, Ok("42".into()), 42), Ok(()));
        for link in [
            Ok("4242".to_string()),
            Err("No such file or directory".to_string()),
        ] {
            let e = proc_root_is_ours(root, link, 42).expect_err("refused");
            assert!(e.starts_with("--proc-root /host/proc"), "{e}");
            assert!(e.contains("hostPID: true"), "{e}");
        }
        // No procfs at all (a fixture tree without `self`): not checked.
        let dir = std::env::temp_dir().join(format!("hf-procroot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        assert_eq!(check_proc_root(&dir), Ok(()));
        // A `self` that names another pid (what a procfs of a parent pid namespace shows).
        std::os::unix::fs::symlink("1", dir.join("self")).expect("symlink");
        let e = check_proc_root(&dir).expect_err("refused");
        assert!(e.contains("another pid namespace"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
