//! Runtimes a killed test binary left behind. A test binary tears its private containerd down at
//! exit (`atexit`), but one killed with SIGKILL (a CI timeout, `kill -9`, the OOM killer) leaves
//! containerd, its shims, the pods' containers, their netns and veths, overlay and shm mounts,
//! the CNI bridge and `/tmp/hf-cri-<tag>-<id>` behind. The next runtime to start cleans up every
//! such directory whose owner is dead.
//!
//! Ownership: each runtime directory holds `owner`, the pid and start time (`/proc/<pid>/stat`
//! field 22, so a reused pid is not taken for the owner) of the test process that made it. A
//! directory without one (made by an older build, or being made right now) is never touched,
//! nor is one whose owner is alive; the machine's own `/run/containerd` is never looked at.
//! Two cleaners at once: the first to create `cleaner` in the directory does it.

use std::path::{Path, PathBuf};

use super::runtime::Containerd;

/// The owner file in a runtime directory.
pub const OWNER_FILE: &str = "owner";
const CLEANER_FILE: &str = "cleaner";
/// Where runtime directories live, and their name prefix.
const TMP: &str = "/tmp";
const PREFIX: &str = "hf-cri-";

/// A process's identity: pid and start time in clock ticks since boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessId {
    pub pid: u32,
    pub start_ticks: u64,
}

impl ProcessId {
    /// This process.
    pub fn me() -> Option<ProcessId> {
        let pid = std::process::id();
        Some(ProcessId {
            pid,
            start_ticks: start_ticks(pid)?,
        })
    }

    /// Whether this process still runs (same pid, same start time, not a zombie).
    pub fn alive(&self) -> bool {
        start_ticks(self.pid) == Some(self.start_ticks) && crate::sim::process::alive(self.pid)
    }

    fn parse(text: &str) -> Option<ProcessId> {
        let mut it = text.split_whitespace();
        let pid = it.next()?.parse().ok()?;
        let start_ticks = it.next()?.parse().ok()?;
        Some(ProcessId { pid, start_ticks })
    }

    fn render(&self) -> String {
        format!("{} {}\n", self.pid, self.start_ticks)
    }
}

/// Field 22 of `/proc/<pid>/stat` (after the parenthesised command name, which may hold spaces).
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    // `rest` starts at field 3 (state): field 22 is the 20th from there.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Marks `dir` as this process's runtime.
pub fn write_owner(dir: &Path) -> std::io::Result<()> {
    let me = ProcessId::me().ok_or_else(|| std::io::Error::other("cannot read /proc/self/stat"))?;
    std::fs::write(dir.join(OWNER_FILE), me.render())
}

/// The owner of a runtime directory, if it names one.
pub fn owner(dir: &Path) -> Option<ProcessId> {
    ProcessId::parse(&std::fs::read_to_string(dir.join(OWNER_FILE)).ok()?)
}

/// Runtime directories whose owner is dead.
pub fn stale_runtimes() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(TMP) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(PREFIX))
        .map(|e| e.path())
        .filter(|d| d.is_dir() && owner(d).is_some_and(|o| !o.alive()))
        .collect()
}

/// Claims `dir` for cleaning: true if this process may clean it (no live cleaner before it).
fn claim(dir: &Path) -> bool {
    let Some(me) = ProcessId::me() else {
        return false;
    };
    let path = dir.join(CLEANER_FILE);
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => {
                use std::io::Write;
                return f.write_all(me.render().as_bytes()).is_ok();
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let other = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|t| ProcessId::parse(&t));
                if other.is_some_and(|o| o.alive()) {
                    return false;
                }
                // A cleaner that died (or had not written its id yet: then it is racing us and
                // one of us loses the next create_new).
                let _ = std::fs::remove_file(&path);
            }
            Err(_) => return false,
        }
    }
    false
}

/// Cleans up every stale runtime; returns one line per runtime (what was done, or what is left).
pub fn clean_stale_runtimes() -> Vec<String> {
    let mut report = Vec::new();
    for dir in stale_runtimes() {
        if !claim(&dir) {
            continue;
        }
        match Containerd::adopt(&dir) {
            Ok(rt) => {
                let left = rt.teardown();
                if left.is_empty() {
                    report.push(format!("cleaned up {} (its owner is dead)", dir.display()));
                } else {
                    report.push(format!(
                        "cleaned up {} (its owner is dead); left: {}",
                        dir.display(),
                        left.join("; ")
                    ));
                }
            }
            Err(e) => {
                let _ = std::fs::remove_file(dir.join(CLEANER_FILE));
                report.push(format!(
                    "cannot clean up {} (its owner is dead): {e}",
                    dir.display()
                ));
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_known_by_pid_and_start_time() {
        let me = ProcessId::me().expect("own stat");
        assert!(me.alive());
        assert_eq!(ProcessId::parse(&me.render()), Some(me));
        // Same pid, another start time: a reused pid, not the owner.
        let reused = ProcessId {
            start_ticks: me.start_ticks + 1,
            ..me
        };
        assert!(!reused.alive());
        let mut child = std::process::Command::new("true").spawn().expect("true");
        let pid = child.id();
        let _ = child.wait();
        assert!(!ProcessId {
            pid,
            start_ticks: 0
        }
        .alive());
        assert_eq!(ProcessId::parse("12 x"), None);
        assert_eq!(ProcessId::parse(""), None);
    }

    #[test]
    fn a_directory_is_claimed_once_while_its_cleaner_lives() {
        let dir = std::env::temp_dir().join(format!("hf-stale-unit-{}", crate::sim::random_hex(4)));
        std::fs::create_dir_all(&dir).expect("dir");
        assert!(claim(&dir));
        // This process is the live cleaner now: a second claim loses.
        assert!(!claim(&dir));
        // A dead cleaner's claim is taken over.
        std::fs::write(dir.join(CLEANER_FILE), "4194305 0\n").expect("write");
        assert!(claim(&dir));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
