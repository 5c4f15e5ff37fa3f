//! The moment a container's init process exits, from a pidfd (`pidfd_open(2)`): the pidfd turns
//! readable when the process exits, whoever its parent is.
//!
//! Why not the runtime's `finishedAt`: containerd's runc shim stamps the exit when it reaps its
//! child, and the CRI plugin reports it only after its event loop has handled the exit (one loop
//! for every container of the runtime; containerd 1.6 `pkg/cri/server/events.go`,
//! `handleContainerExit`, deletes the task before it updates the status). Measured here under
//! a load average of 5–9 on 2 cores: `ContainerStatus` showed an exit 60–1150 ms after its
//! `finishedAt`, and two containers' `finishedAt` were up to ~100 ms further apart than their
//! processes' exits. The netns backend learns exits from `waitid` on its own children; this gives
//! the containerd backend the same precision, so the drain tests' "app exit → proxy exit" bounds
//! measure holdfast, not the shims' scheduling. The watcher thread, too, stamps the moment only
//! once it runs, so the kubelet stand-in takes the earlier of the two.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use rustix::process::{pidfd_open, Pid, PidfdFlags};

/// Exit moments by container id, filled by one watcher thread per container.
#[derive(Debug, Clone, Default)]
pub struct ExitTimes {
    times: Arc<Mutex<HashMap<String, SystemTime>>>,
}

impl ExitTimes {
    /// Watches `pid` (the init process of container `cid`, a host pid) and records when it
    /// exits. Returns false when there is nothing to watch: no pidfd support, or the process is
    /// already gone (then the runtime's `finishedAt` is all there is).
    pub fn watch(&self, cid: &str, pid: u32) -> bool {
        let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
            return false;
        };
        let Ok(fd) = pidfd_open(pid, PidfdFlags::empty()) else {
            return false;
        };
        let (times, cid) = (self.times.clone(), cid.to_string());
        std::thread::Builder::new()
            .name(format!("exit-{}", &cid[..12.min(cid.len())]))
            .spawn(move || loop {
                let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                match poll(&mut fds, PollTimeout::NONE) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    Ok(_) => {
                        let at = SystemTime::now();
                        times
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(cid, at);
                        return;
                    }
                    // Unreachable with a valid pidfd; leave the runtime's time in charge.
                    Err(_) => return,
                }
            })
            .is_ok()
    }

    /// When container `cid`'s init process exited, if a watcher saw it.
    pub fn take(&self, cid: &str) -> Option<SystemTime> {
        self.times
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(cid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn records_the_exit_of_a_process_that_is_not_our_child_too() {
        let times = ExitTimes::default();
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .expect("sleep");
        assert!(times.watch("c1", child.id()));
        let before = SystemTime::now();
        let _ = child.wait();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let at = loop {
            if let Some(at) = times.take("c1") {
                break at;
            }
            assert!(std::time::Instant::now() < deadline, "no exit recorded");
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(
            at >= before - Duration::from_millis(300),
            "{at:?} vs {before:?}"
        );
        // A process that is gone cannot be watched.
        assert!(!times.watch("c2", child.id()));
        assert_eq!(times.take("c2"), None);
    }
}
