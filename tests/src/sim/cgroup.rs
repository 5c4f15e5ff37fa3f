//! Kubelet-shaped cgroups on the machine's cgroup v2 hierarchy: `kubepods/pod<uid>/<container-id>`,
//! as the cgroupfs driver lays them out, so `/proc/<pid>/cgroup` of a pod process reads
//! `0::/kubepods/pod<uid>/<64-hex id>` exactly as on a node.

use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::SimError;

/// The cgroup v2 mount point, from `/proc/self/mountinfo` (fstype `cgroup2`).
pub fn cgroup2_root() -> Result<PathBuf, SimError> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").map_err(|source| SimError::Io {
        what: "cannot read /proc/self/mountinfo".into(),
        source,
    })?;
    parse_cgroup2_mount(&text).ok_or_else(|| {
        SimError::Setup(
            "no cgroup2 mount in /proc/self/mountinfo: the simulated node needs cgroup v2 \
             (mount -t cgroup2 none /sys/fs/cgroup/unified)"
                .into(),
        )
    })
}

/// Finds the mount point of the first `cgroup2` filesystem in mountinfo text.
pub fn parse_cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // Fields: id parent maj:min root mountpoint opts [optional...] - fstype source superopts
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// One cgroup directory the simulated node created.
#[derive(Debug)]
pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    /// Creates `root/<rel>` (and missing parents, e.g. the shared `kubepods`).
    pub fn create(root: &Path, rel: &str) -> Result<Cgroup, SimError> {
        let path = root.join(rel);
        std::fs::create_dir_all(&path).map_err(|source| SimError::Io {
            what: format!("cannot create cgroup {}", path.display()),
            source,
        })?;
        Ok(Cgroup { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `cgroup.procs`, which a process writes to move itself in.
    pub fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// PIDs in this cgroup (not its children).
    pub fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.procs_file())
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// SIGKILLs every process in the cgroup and its children (`cgroup.kill`, as containerd kills
    /// a container), falling back to killing listed PIDs on kernels without it.
    pub fn kill_all(&self) {
        if std::fs::write(self.path.join("cgroup.kill"), "1").is_err() {
            for pid in self.pids() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    /// Removes the directory once its processes are gone (killed processes leave within a few
    /// ms; waits up to 10 s). Already gone is fine.
    pub fn remove(&self) -> Result<(), SimError> {
        // A killed process leaves its cgroup only once the kernel has torn it down: under heavy
        // load (the chaos soak saw a load average of 47) that took longer than 2 s, with no
        // process left in `cgroup.procs`.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match std::fs::remove_dir(&self.path) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
                Err(e) if Instant::now() < deadline && busy(&e) => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(source) => {
                    return Err(SimError::Io {
                        what: format!(
                            "cannot remove cgroup {} (processes left: {:?})",
                            self.path.display(),
                            self.pids()
                        ),
                        source,
                    })
                }
            }
        }
    }
}

fn busy(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::ENOTEMPTY))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cgroup2_mount() {
        let mi = "30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n\
                  41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            parse_cgroup2_mount(mi),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            parse_cgroup2_mount("1 2 0:1 / / rw - ext4 /dev/sda rw\n"),
            None
        );
    }
}
