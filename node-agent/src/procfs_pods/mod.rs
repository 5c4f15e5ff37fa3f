//! Which processes belong to which pod, read from procfs.
//!
//! Owns the one-pass scan of `/proc` (root injectable, so tests use a fake tree): for every
//! process, `/proc/<pid>/cgroup` names its pod UID and container ID ([`cgroup`]), and
//! `/proc/<pid>/ns/net` its network namespace. Processes vanish mid-scan all the time; such races
//! are ignored quietly. [`sockets`] reads a process's netns TCP table.

#![forbid(unsafe_code)]

pub mod cgroup;
pub mod sockets;

use std::collections::{BTreeMap, HashSet};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

pub use crate::netns::NetnsId;
pub use cgroup::{parse_pod_cgroup, PodCgroup};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot list processes in {path}: {source} (is procfs mounted there, and does the agent run with hostPID?)")]
    ListProc {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read TCP sockets of pid {pid}: {reason}")]
    Sockets { pid: i32, reason: String },
    #[error("cannot read TCP sockets in netns {netns:?}: {reason}")]
    NetnsSockets { netns: NetnsId, reason: String },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One process of a pod.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PodProcess {
    pub pid: i32,
    /// Container ID (lowercase hex), `None` for a process outside any container's cgroup.
    pub container_id: Option<String>,
    /// Network namespace, `None` if it could not be read (process exited mid-scan, or no access).
    pub netns: Option<NetnsId>,
}

/// The processes of one pod found in a scan.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PodProcesses {
    pub processes: Vec<PodProcess>,
}

impl PodProcesses {
    /// The pod's network namespace and a pid to open it through: the first process (lowest pid,
    /// usually the pause container) whose netns was read.
    pub fn netns(&self) -> Option<(i32, NetnsId)> {
        self.processes
            .iter()
            .find_map(|p| p.netns.map(|ns| (p.pid, ns)))
    }

    /// Pids of processes whose container ID is one of `container_ids`.
    pub fn pids_of<'a>(&self, container_ids: impl IntoIterator<Item = &'a str>) -> Vec<i32> {
        let wanted: HashSet<&str> = container_ids.into_iter().collect();
        self.processes
            .iter()
            .filter(|p| {
                p.container_id
                    .as_deref()
                    .is_some_and(|c| wanted.contains(c))
            })
            .map(|p| p.pid)
            .collect()
    }
}

/// Reads pods' processes from a procfs root (`/proc`, or a fake tree in tests).
#[derive(Debug, Clone)]
pub struct ProcScanner {
    root: PathBuf,
}

impl Default for ProcScanner {
    fn default() -> Self {
        ProcScanner::new("/proc")
    }
}

impl ProcScanner {
    pub fn new(root: impl Into<PathBuf>) -> ProcScanner {
        ProcScanner { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// One pass over every process: pod UID → its processes, sorted by pid. Host processes and
    /// processes that exit during the scan are left out.
    pub fn scan(&self) -> Result<BTreeMap<String, PodProcesses>> {
        self.scan_filtered(|_| true)
    }

    /// Like [`scan`](Self::scan) for one pod only (the netns of other pods' processes is not
    /// read).
    pub fn scan_pod(&self, pod_uid: &str) -> Result<PodProcesses> {
        let mut pods = self.scan_filtered(|uid| uid == pod_uid)?;
        Ok(pods.remove(pod_uid).unwrap_or_default())
    }

    /// Live pids of the given containers of one pod (the drain watches the app's containers).
    pub fn container_pids(&self, pod_uid: &str, container_ids: &[&str]) -> Result<Vec<i32>> {
        let wanted: HashSet<&str> = container_ids.iter().copied().collect();
        let mut pids = Vec::new();
        for pid in self.pids()? {
            let Some(found) = self.read_cgroup(pid) else {
                continue;
            };
            if found.pod_uid == pod_uid
                && found
                    .container_id
                    .as_deref()
                    .is_some_and(|c| wanted.contains(c))
            {
                pids.push(pid);
            }
        }
        pids.sort_unstable();
        Ok(pids)
    }

    fn scan_filtered(
        &self,
        want_pod: impl Fn(&str) -> bool,
    ) -> Result<BTreeMap<String, PodProcesses>> {
        let mut pods: BTreeMap<String, PodProcesses> = BTreeMap::new();
        let mut pids = self.pids()?;
        pids.sort_unstable();
        for pid in pids {
            let Some(found) = self.read_cgroup(pid) else {
                continue;
            };
            if !want_pod(&found.pod_uid) {
                continue;
            }
            let netns = self.read_netns(pid);
            pods.entry(found.pod_uid)
                .or_default()
                .processes
                .push(PodProcess {
                    pid,
                    container_id: found.container_id,
                    netns,
                });
        }
        Ok(pods)
    }

    /// Numeric entries of the procfs root (thread-group leaders).
    fn pids(&self) -> Result<Vec<i32>> {
        let entries = std::fs::read_dir(&self.root).map_err(|source| Error::ListProc {
            path: self.root.clone(),
            source,
        })?;
        let mut pids = Vec::with_capacity(512);
        for entry in entries {
            let Ok(entry) = entry else {
                continue;
            };
            if let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            {
                if pid > 0 {
                    pids.push(pid);
                }
            }
        }
        Ok(pids)
    }

    fn read_cgroup(&self, pid: i32) -> Option<PodCgroup> {
        let path = self.root.join(pid.to_string()).join("cgroup");
        match std::fs::read(&path) {
            // /proc/<pid>/cgroup is kernel-generated text; lossy decoding only matters for
            // hostile cgroup names, which then simply fail to parse as a pod.
            Ok(bytes) => parse_pod_cgroup(&String::from_utf8_lossy(&bytes)),
            Err(e) => {
                log_unreadable(pid, &path, &e);
                None
            }
        }
    }

    fn read_netns(&self, pid: i32) -> Option<NetnsId> {
        let path = self.root.join(pid.to_string()).join("ns/net");
        match NetnsId::of_path(&path) {
            Ok(id) => Some(id),
            Err(e) => {
                log_unreadable(pid, &path, &e);
                None
            }
        }
    }
}

/// Processes exit during a scan (ENOENT, ESRCH): expected, not worth a log line above trace.
fn log_unreadable(pid: i32, path: &Path, error: &std::io::Error) {
    let vanished = error.kind() == ErrorKind::NotFound || error.raw_os_error() == Some(libc::ESRCH);
    if vanished {
        tracing::trace!(pid, path = %path.display(), "process vanished during scan");
    } else {
        tracing::debug!(pid, path = %path.display(), %error, "cannot read process info");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const UID_A: &str = "fd52ef25-a87d-11e9-9423-0800271a638e";
    const UID_B: &str = "863b91d4-4b68-4efa-917f-4b560e3e86aa";
    const CID_1: &str = "8c046cb0b72cd4c99f51b5591cd5b095967f58ee003710a45280c28ee1a9c7fa";
    const CID_2: &str = "75c7fe7ad0df679971e755bd97b84dd68a32e1eba8e8f99b01ab3c07196a3e4a";

    struct FakeProc(PathBuf);
    impl FakeProc {
        fn new(name: &str) -> FakeProc {
            let dir =
                std::env::temp_dir().join(format!("hf-fakeproc-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("create fake proc");
            FakeProc(dir)
        }
        fn process(&self, pid: i32, cgroup: &str, netns_target: Option<&Path>) {
            let dir = self.0.join(pid.to_string());
            std::fs::create_dir_all(dir.join("ns")).expect("mkdir");
            std::fs::write(dir.join("cgroup"), cgroup).expect("write cgroup");
            if let Some(target) = netns_target {
                std::os::unix::fs::symlink(target, dir.join("ns/net")).expect("symlink");
            }
        }
    }
    impl Drop for FakeProc {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn scan_fake_tree() {
        let fake = FakeProc::new("scan");
        let own_netns = Path::new("/proc/self/ns/net").canonicalize().ok();
        let ns_target = Path::new("/proc/self/ns/net");
        fake.process(1, "0::/init.scope\n", Some(ns_target));
        fake.process(
            100,
            &format!("0::/kubepods/besteffort/pod{UID_A}/{CID_1}\n"),
            Some(ns_target),
        );
        fake.process(
            101,
            &format!("0::/kubepods/besteffort/pod{UID_A}/{CID_2}\n"),
            None,
        );
        fake.process(
            200,
            &format!(
                "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{CID_1}.scope\n",
                UID_B.replace('-', "_")
            ),
            Some(ns_target),
        );
        // A vanished process: directory without files.
        std::fs::create_dir_all(fake.0.join("300")).expect("mkdir");
        std::fs::create_dir_all(fake.0.join("self")).expect("mkdir");
        let _ = own_netns;

        let scanner = ProcScanner::new(&fake.0);
        let pods = scanner.scan().expect("scan");
        assert_eq!(pods.len(), 2, "{pods:?}");
        let a = &pods[UID_A];
        assert_eq!(a.processes.len(), 2);
        assert_eq!(a.processes[0].pid, 100);
        assert_eq!(a.processes[0].container_id.as_deref(), Some(CID_1));
        assert!(a.processes[0].netns.is_some());
        assert_eq!(a.processes[1].netns, None);
        let own = NetnsId::of_path(Path::new("/proc/self/ns/net")).expect("stat");
        assert_eq!(a.netns(), Some((100, own)));
        assert_eq!(a.pids_of([CID_2]), vec![101]);
        assert_eq!(pods[UID_B].processes[0].pid, 200);

        assert_eq!(
            scanner
                .container_pids(UID_A, &[CID_1, CID_2])
                .expect("pids"),
            vec![100, 101]
        );
        assert_eq!(
            scanner.container_pids(UID_B, &[CID_2]).expect("pids"),
            Vec::<i32>::new()
        );
        assert_eq!(
            scanner.scan_pod(UID_B).expect("scan pod").processes.len(),
            1
        );
    }

    #[test]
    fn missing_root_is_an_error_naming_it() {
        let err = ProcScanner::new("/nonexistent-proc").scan().unwrap_err();
        assert!(err.to_string().contains("/nonexistent-proc"), "{err}");
    }

    /// Prints how long a scan of this machine's /proc takes with at least 300 processes (extra
    /// `sleep` children are started, and killed by pid afterwards). Run with
    /// `cargo test -p holdfast --release --lib scan_timing -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing figure for the report; prints, asserts nothing about speed"]
    fn scan_timing() {
        let scanner = ProcScanner::default();
        let existing = scanner.pids().expect("pids").len();
        let mut children = Vec::new();
        for _ in existing..320 {
            children.push(
                std::process::Command::new("sleep")
                    .arg("60")
                    .spawn()
                    .expect("spawn sleep"),
            );
        }
        let processes = scanner.pids().expect("pids").len();
        let rounds = 50;
        let start = Instant::now();
        for _ in 0..rounds {
            let _ = scanner.scan().expect("scan");
        }
        let per_scan = start.elapsed() / rounds;
        for mut child in children {
            let _ = child.kill();
            let _ = child.wait();
        }
        println!("scan of {processes} processes: {per_scan:?} per scan ({rounds} rounds)");
        assert!(processes >= 300, "only {processes} processes");
    }
}
