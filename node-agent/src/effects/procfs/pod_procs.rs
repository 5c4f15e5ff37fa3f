//! Which processes belong to which pod, kept current cheaply enough to poll every few
//! milliseconds while a pod waits for its network namespace.
//!
//! A refresh lists `/proc` (one `getdents` pass) and reads `/proc/<pid>/cgroup` only for pids it
//! has not classified yet. A process that is not in a pod cgroup when first seen is re-read for a
//! short while, because runtimes move a new process into its container's cgroup right after
//! fork; after that it is settled. Exited pids are forgotten on the next refresh.
//!
//! **Never the wrong pod** (issue 25). A pid is only a number: between two refreshes a pod's
//! process can exit and its pid be given to another pod's process (pids wrap around — 32768 by
//! default — and a pod can hasten that by forking). So a pid is tied to its pod by its start
//! time as well (`/proc/<pid>/stat` field 22, recorded when it was classified), and whenever a
//! pod's processes are handed out (`PodProcs::of_pod`) each is checked again: a different
//! start time means a different process, classified anew. The netns lookup goes further: it
//! opens a pidfd first, reads the cgroup and the start time again, opens `ns/net`, and checks
//! the pidfd has not exited since — so the namespace opened is the one of the process whose
//! cgroup said it is the pod's (`PodProcs::find_netns`).
//!
//! **A pod's own cgroup, not all of `/proc`.** Once one of a pod's processes is classified on a
//! cgroup v2 node (the agent sees the node's cgroup paths), the pod's cgroup directory is known
//! (`crate::effects::procfs::cgroup::pod_dir_v2`), and later questions about that pod read
//! its `cgroup.procs` files (the pod's directory and its containers') instead of listing every
//! process of the node: what the agent spends on a pod no longer grows with what other tenants
//! run. The listing stays for pods whose cgroup is not known yet (waiting for their first
//! process) and where the paths cannot be followed (cgroup v1, a private cgroup namespace).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::effects::netns::{NetnsId, PodNetns};
use crate::effects::procfs::cgroup::{parse_pod_cgroup, PodCgroup};

/// How long an unclassified process keeps being re-read (runtimes move a new process into its
/// container's cgroup between fork and exec: microseconds to a few milliseconds).
const SETTLE: Duration = Duration::from_millis(250);
/// Refreshes closer together than this reuse the previous one (many pod tasks poll at once).
/// A waiting pod looks for its netns every 5 ms at first (`lifecycle::facts::netns_poll_after`),
/// so a fresher listing would not find its sandbox sooner; what closer refreshes did was list
/// `/proc` for other pods' interleaved polls: with 110 pods starting at once, ~500 listings a
/// second of ~700 processes (the kernel's `proc_pid_readdir`, ~9 % of the agent's CPU in that
/// burst by `perf`).
const MIN_REFRESH: Duration = Duration::from_millis(5);

/// The most processes of one pod handed out by `PodProcs::of_pod` (the oldest pids: a
/// pod's sandbox and its containers' first processes): what one pod's processes cost the agent
/// per look is bounded, whatever it forks. A drain watches those it is given by pidfd; as they
/// exit, the next look hands out the rest.
pub const MAX_PROCS_PER_POD: usize = 512;

/// The most new processes a drain's look at its pod checks and hands out (the rest at its next
/// looks, 100 ms doubling to 1 s apart): issue 29's 2,000-process pod made a drain's first look
/// check 512 processes (1,024 `/proc` reads) in one burst as it began, and under the
/// DaemonSet's 0.2-core quota (20 ms a 100 ms period) that burst could hold up another pod's
/// hold. 128 a look reaches the per-pod cap within a second.
pub(crate) const NEW_PER_DRAIN_LOOK: usize = 128;

/// The most pids of one pod the index keeps from the pod's cgroup directory (an entry is ~100
/// bytes): the oldest, as [`MAX_PROCS_PER_POD`] hands out.
const MAX_INDEXED_PER_POD: usize = 4 * MAX_PROCS_PER_POD;

/// Keeps the first `cap` of `items` (each a pid and its container) fairly: every container's
/// oldest pids before any container's later ones (by a pid's rank among its own container's
/// pids, then by pid), and returns them in pid order. A cap by pid alone gave a pod whose app
/// forks thousands of processes before its proxy starts only app pids, so the proxy's own
/// processes (two: the mesh's agent and Envoy) were never handed out: no watch on the proxy's
/// exit, and a Unix-socket admin (Kuma 2.14) never found, the hold run to its deadline (issue 40,
/// "one liveness question": `a_proxy_started_after_thousands_of_app_processes_is_handed_out`).
fn cap_per_container<T>(items: &mut Vec<T>, cap: usize, key: impl Fn(&T) -> (i32, Option<&str>)) {
    if items.len() <= cap {
        items.sort_unstable_by_key(|t| key(t).0);
        return;
    }
    items.sort_unstable_by_key(|t| key(t).0);
    // Borrowed container ids: a look at a pod over the cap allocates one map, no strings.
    let ranks: Vec<usize> = {
        let mut seen: HashMap<Option<&str>, usize> = HashMap::new();
        items
            .iter()
            .map(|t| {
                let n = seen.entry(key(t).1).or_default();
                *n += 1;
                *n
            })
            .collect()
    };
    let mut ranked: Vec<(usize, T)> = ranks.into_iter().zip(items.drain(..)).collect();
    // Stable: within a rank, pid order stays.
    ranked.sort_by_key(|(rank, _)| *rank);
    ranked.truncate(cap);
    items.extend(ranked.into_iter().map(|(_, t)| t));
    items.sort_unstable_by_key(|t| key(t).0);
}

/// What a classified process is now ([`check`]).
enum Checked {
    /// Exited.
    Gone,
    /// The same process (same start time); its pod by its cgroup now.
    Same(Option<PodCgroup>),
    /// Another process under the same pid.
    Reused { start: u64, pod: Option<PodCgroup> },
}

/// Reads `pid`'s start time and cgroup again, without the index's lock.
fn check(proc_root: &std::path::Path, pid: i32, classified_start: Option<u64>) -> Checked {
    let Some(now_start) = start_time(proc_root, pid) else {
        return Checked::Gone;
    };
    let pod = read_pod_cgroup(proc_root, pid);
    if Some(now_start) == classified_start {
        Checked::Same(pod)
    } else {
        Checked::Reused {
            start: now_start,
            pod,
        }
    }
}

/// One process of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodProcess {
    pub pid: i32,
    pub container_id: Option<String>,
}

#[derive(Debug)]
struct Entry {
    pod: Option<PodCgroup>,
    /// The process's start time (clock ticks after boot) when it was classified: the pid's
    /// identity together with the pid.
    start_time: Option<u64>,
    first_seen: Instant,
    /// Read when the process was older than [`SETTLE`]: a runtime has placed it by then, so a
    /// "no pod" read is final. A younger "no pod" read is not: runc starts `runc init` in its
    /// own cgroup and moves it into the container's, and a look in between must not hide the
    /// container's main process for good when no look follows within `SETTLE`.
    settled_read: bool,
}

#[derive(Debug)]
struct Index {
    proc_root: PathBuf,
    pids: HashMap<i32, Entry>,
    last_refresh: Option<Instant>,
    /// The cgroup v2 mount whose paths `/proc/<pid>/cgroup` shows (`None`: not followed).
    cgroup_root: Option<PathBuf>,
    /// Each pod's cgroup directory under `cgroup_root`, learned from its classified processes.
    pod_dirs: HashMap<String, PathBuf>,
    /// The kubelet's `kubepods` directories on this node (relative to `cgroup_root`; `true`:
    /// the systemd driver's `kubepods.slice`), learned from classified pods' directories: where
    /// a pod not seen yet will have its directory ([`predicted_pod_dirs`]).
    kubepods_roots: Vec<(PathBuf, bool)>,
    /// Full listings of `/proc` made (for tests and the timing figure).
    listings: u64,
    /// The last listing made for a pod the learned layout does not place
    /// ([`UNPREDICTED_LISTING_EVERY`]).
    last_unpredicted_listing: Option<Instant>,
}

/// How often, at most, `/proc` is listed for a pod whose directory is not where the learned
/// layout predicts it. A `kubepods` directory is learned from other pods' processes; a pod
/// under one not learned yet (a second kubelet's `cgroupRoot` on the node, a layout the first
/// pods did not show) was never looked for again and stayed without its netns, every look
/// answered "not yet" (seen: the simulated node's pods while a real kubelet ran beside it, each
/// hold never installed). Once a second at most, for the whole node: a listing costs in
/// proportion to the node's processes (issue 29), and a pod whose cgroup is predicted right is
/// never listed for.
const UNPREDICTED_LISTING_EVERY: Duration = Duration::from_secs(1);

/// A shared, cached index of pod processes.
#[derive(Debug, Clone)]
pub struct PodProcs {
    inner: Arc<Mutex<Index>>,
}

impl PodProcs {
    /// An index of the processes under `proc_root`. With the node's own `/proc` and a cgroup
    /// v2 mount (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid node, read from
    /// `/proc/self/mountinfo`), pods' cgroup directories are read where known.
    pub fn new(proc_root: PathBuf) -> Self {
        let cgroup_root = (proc_root == std::path::Path::new("/proc"))
            .then(|| std::fs::read_to_string("/proc/self/mountinfo").ok())
            .flatten()
            .and_then(|m| cgroup2_mount(&m));
        Self::with_cgroup_root(proc_root, cgroup_root)
    }

    /// An index reading pods' cgroup directories under `cgroup_root` (`None`: never).
    pub(crate) fn with_cgroup_root(proc_root: PathBuf, cgroup_root: Option<PathBuf>) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Index {
                proc_root,
                pids: HashMap::new(),
                last_refresh: None,
                cgroup_root,
                pod_dirs: HashMap::new(),
                kubepods_roots: Vec::new(),
                listings: 0,
                last_unpredicted_listing: None,
            })),
        }
    }

    /// How many full listings of `/proc` this index has made.
    #[cfg(test)]
    pub(crate) fn listings(&self) -> u64 {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .listings
    }

    /// The processes of pod `uid` (canonical lowercase uid), oldest pid first, at most
    /// [`MAX_PROCS_PER_POD`]. Each is checked again before it is handed out: a pid whose start
    /// time changed since it was classified is another process now (pid reuse), and is
    /// classified anew. Blocking I/O: call from `spawn_blocking` (see `PodProcs::of_pod`).
    ///
    /// The index's lock is held only to find the pod's processes (reading its cgroup
    /// directory, or listing `/proc` at most every `MIN_REFRESH`) and to copy them out; the
    /// per-process checks, two reads each, run without it (issue 29: a pod with 2,000 processes
    /// made every other pod's netns lookup wait behind 4,000 reads every 100 ms for its whole
    /// grace period).
    pub fn of_pod_blocking(&self, uid: &str) -> Vec<PodProcess> {
        self.of_pod_blocking_except(uid, &HashSet::new(), MAX_PROCS_PER_POD)
    }

    /// Like [`PodProcs::of_pod_blocking`], leaving out the pids in `watched`: pids the caller
    /// holds a pidfd on that has not reported an exit, so each is still the process it was
    /// (a pid is not reused while its process lives) and needs neither re-check nor handing
    /// out again. The cap applies as before (the same oldest pids), so a caller that watches
    /// what it was given is handed only what is new among them. Issue 29: a drain's rescans of
    /// a pod with 2,000 processes re-read 512 processes' `stat` and `cgroup` every 100 ms,
    /// 0.25 cores of the agent (debug build) against its 0.2-core limit; with the pidfds
    /// relied on between rescans, a rescan reads the pod's `cgroup.procs` and nothing more.
    ///
    /// At most `max_new` of those not in `watched` are checked and handed out in one look (the
    /// oldest): a caller that watches what it is given gets the rest at its next looks, so a
    /// pod with thousands of processes costs it a few reads per look, not one burst
    /// ([`NEW_PER_DRAIN_LOOK`]).
    pub(crate) fn of_pod_blocking_except(
        &self,
        uid: &str,
        watched: &HashSet<i32>,
        max_new: usize,
    ) -> Vec<PodProcess> {
        let (proc_root, mut candidates) = {
            let mut index = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            // Issue 29: a pod not seen yet is looked for where the kubelet makes its cgroup,
            // not by listing `/proc` (every few milliseconds while it waits for its sandbox: a
            // listing costs in proportion to every process of the node, which a tenant with
            // 2,000 processes made 18 ms each in a debug build).
            if !index.read_pod_cgroup_dir(uid) {
                match index.probe_pod_dir(uid) {
                    Some(true) => {
                        if !index.read_pod_cgroup_dir(uid) {
                            index.refresh_if_stale();
                        }
                    }
                    Some(false) => index.list_for_unpredicted_pod(),
                    None => index.refresh_if_stale(),
                }
            }
            let candidates: Vec<(i32, Option<u64>, Option<String>)> = index
                .pids
                .iter()
                .filter_map(|(pid, e)| {
                    let pod = e.pod.as_ref().filter(|p| p.pod_uid == uid)?;
                    Some((*pid, e.start_time, pod.container_id.clone()))
                })
                .collect();
            (index.proc_root.clone(), candidates)
        };
        if candidates.len() > MAX_PROCS_PER_POD {
            tracing::debug!(
                pod_uid = uid,
                processes = candidates.len(),
                "more processes than the agent watches per pod; each container's oldest pids are handed out"
            );
        }
        fn by_container(c: &(i32, Option<u64>, Option<String>)) -> (i32, Option<&str>) {
            (c.0, c.2.as_deref())
        }
        cap_per_container(&mut candidates, MAX_PROCS_PER_POD, by_container);
        candidates.retain(|(pid, _, _)| !watched.contains(pid));
        cap_per_container(&mut candidates, max_new, by_container);
        let candidates: Vec<(i32, Option<u64>)> = candidates
            .into_iter()
            .map(|(pid, start, _)| (pid, start))
            .collect();
        // Outside the lock: what each candidate is now.
        let checked: Vec<(i32, Option<u64>, Checked)> = candidates
            .into_iter()
            .map(|(pid, start)| (pid, start, check(&proc_root, pid, start)))
            .collect();
        let mut out = Vec::with_capacity(checked.len());
        let mut index = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for (pid, classified_start, now) in checked {
            // Another caller may have reclassified the pid meanwhile: its answer stands.
            let Some(entry) = index.pids.get_mut(&pid) else {
                continue;
            };
            if entry.start_time != classified_start {
                continue;
            }
            let pod = match now {
                Checked::Gone => {
                    index.pids.remove(&pid);
                    continue;
                }
                Checked::Same(pod) => {
                    if pod != entry.pod {
                        tracing::debug!(pid, "a pod process's cgroup changed; reclassified");
                    }
                    entry.pod = pod.clone();
                    pod
                }
                Checked::Reused { start, pod } => {
                    // An entry placed from its pod's directory has no start time yet: this is
                    // its first read, not a reuse.
                    if classified_start.is_some() {
                        tracing::debug!(
                            pid,
                            "pid reused by another process since it was classified; reclassified"
                        );
                    }
                    *entry = Entry {
                        pod: pod.clone(),
                        start_time: Some(start),
                        first_seen: Instant::now(),
                        settled_read: false,
                    };
                    pod
                }
            };
            if let Some(pod) = pod.filter(|p| p.pod_uid == uid) {
                out.push(PodProcess {
                    pid,
                    container_id: pod.container_id,
                });
            }
        }
        out
    }

    /// Async wrapper of [`PodProcs::of_pod_blocking`].
    pub(crate) async fn of_pod(&self, uid: &str) -> Vec<PodProcess> {
        let this = self.clone();
        let uid = uid.to_string();
        tokio::task::spawn_blocking(move || this.of_pod_blocking(&uid))
            .await
            .unwrap_or_default()
    }

    /// Async wrapper of [`PodProcs::of_pod_blocking_except`].
    pub(crate) async fn of_pod_except(
        &self,
        uid: &str,
        watched: HashSet<i32>,
        max_new: usize,
    ) -> Vec<PodProcess> {
        let this = self.clone();
        let uid = uid.to_string();
        tokio::task::spawn_blocking(move || this.of_pod_blocking_except(&uid, &watched, max_new))
            .await
            .unwrap_or_default()
    }

    /// The proc root this index reads.
    pub(crate) fn proc_root(&self) -> PathBuf {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .proc_root
            .clone()
    }
}

/// The result of looking for a pod's network namespace.
#[derive(Debug)]
pub enum NetnsLookup {
    /// No process of the pod that could show its netns exists yet (the sandbox is not there).
    NotYet,
    /// The pod's netns, and a live process that was in it when it was found (for logs: keep
    /// the handle, not the pid).
    Found { pid: i32, netns: PodNetns },
    /// Processes exist, but none shows a netns the agent may act in (e.g. only processes in the
    /// host's netns): the reason, for the pod's status row.
    Refused(String),
}

impl PodProcs {
    /// Finds pod `uid`'s network namespace from its processes, and never the wrong one.
    ///
    /// Candidates are only processes of the pod's sandbox or one of its containers (a container
    /// id in their cgroup path): CRI-O's conmon (`crio-conmon-<id>.scope`) sits in the pod's
    /// cgroup but in the node's netns, and a process directly in the pod cgroup may be anything.
    /// A candidate in the node's netns (`<proc_root>/1/ns/net` or `<proc_root>/2/ns/net`) or the
    /// agent's own is refused.
    /// Any live candidate will do: with CRI-O's `drop_infra_ctr = true` (its default,
    /// cri-o/cri-o docs/crio.conf.5.md) there is no pause process and the first one may be an
    /// init container that exits within milliseconds, so the result is an open netns handle,
    /// not a pid to keep using; call again to find a live process later.
    pub(crate) async fn find_netns(&self, uid: &str) -> NetnsLookup {
        let this = self.clone();
        let uid = uid.to_string();
        tokio::task::spawn_blocking(move || this.find_netns_blocking(&uid))
            .await
            .unwrap_or(NetnsLookup::NotYet)
    }

    /// Blocking form of `PodProcs::find_netns`.
    pub fn find_netns_blocking(&self, uid: &str) -> NetnsLookup {
        let proc_root = self.proc_root();
        let candidates: Vec<PodProcess> = self
            .of_pod_blocking(uid)
            .into_iter()
            .filter(|p| p.container_id.is_some())
            .collect();
        if candidates.is_empty() {
            return NetnsLookup::NotYet;
        }
        // The node's netns: pid 1's, and kthreadd's (pid 2: kernel threads live in the initial
        // netns), because pid 1's ns files can be unreadable even to root (seen in a sandboxed
        // build machine: EACCES). runc's `runc init` sits in the pod's cgroup a moment before it
        // joins the pod's netns (seen on containerd + runc): without this check the agent can take
        // the node's netns for the pod's.
        let host: Vec<NetnsId> = ["1/ns/net", "2/ns/net"]
            .iter()
            .filter_map(|p| NetnsId::of_path(&proc_root.join(p)).ok())
            .collect();
        let own: Vec<NetnsId> = [
            proc_root.join("self/ns/net"),
            PathBuf::from("/proc/self/ns/net"),
        ]
        .iter()
        .filter_map(|p| NetnsId::of_path(p).ok())
        .collect();
        let mut refused = Vec::new();
        for p in candidates {
            let path = proc_root.join(p.pid.to_string()).join("ns/net");
            let container = p
                .container_id
                .as_deref()
                .map_or("", |id| &id[..id.len().min(12)]);
            // Tie the pid to this process first, and check it is still the pod's after: the
            // namespace opened in between is then that process's.
            let pidfd = open_pidfd(p.pid);
            if !self.still_the_pods(p.pid, uid) {
                continue;
            }
            let opened = PodNetns::open_path(&path);
            if pidfd.as_ref().is_some_and(exited) || !self.still_the_pods(p.pid, uid) {
                // Exited (and maybe reused) while the namespace was opened: not this one.
                continue;
            }
            match opened {
                Ok(netns) if host.contains(&netns.id()) => refused.push(format!(
                    "pid {} (container {container}) is in the node's network namespace",
                    p.pid
                )),
                Ok(netns) if own.contains(&netns.id()) => refused.push(format!(
                    "pid {} (container {container}) is in the agent's own network namespace",
                    p.pid
                )),
                Ok(netns) => return NetnsLookup::Found { pid: p.pid, netns },
                // Exited between the listing and the open: look at the next one.
                Err(crate::effects::netns::Error::Open { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => refused.push(format!("pid {} (container {container}): {e}", p.pid)),
            }
        }
        if refused.is_empty() {
            NetnsLookup::NotYet
        } else {
            NetnsLookup::Refused(refused.join("; "))
        }
    }
}

/// The kubelet's `kubepods` directory a pod directory is under (`/kubepods`, or
/// `/kubepods.slice` with the systemd driver, after any nesting prefix), and whether it is the
/// systemd form.
fn kubepods_root(pod_dir: &str) -> Option<(PathBuf, bool)> {
    let segments: Vec<&str> = pod_dir.split('/').filter(|s| !s.is_empty()).collect();
    let at = segments
        .iter()
        .position(|s| *s == "kubepods" || *s == "kubepods.slice")?;
    Some((
        PathBuf::from(format!("/{}", segments[..=at].join("/"))),
        segments[at] == "kubepods.slice",
    ))
}

/// Where the kubelet makes pod `uid`'s cgroup under `kubepods`, for each QoS class: its name is
/// `[kubepods, <qos>, pod<uid>]` (Guaranteed: no QoS level; kubernetes pkg/kubelet/cm
/// pod_container_manager_linux.go `GetPodContainerName`, `podCgroupNamePrefix = "pod"`;
/// qos_container_manager_linux.go `burstable`, `besteffort`), which the cgroupfs driver joins
/// with `/` and the systemd driver turns into nested slices with the uid's dashes escaped to
/// `_` (cgroup_manager_linux.go `ToSystemd`: `kubepods-burstable-pod<uid_>.slice`).
fn predicted_pod_dirs(kubepods: &std::path::Path, systemd: bool, uid: &str) -> Vec<PathBuf> {
    if systemd {
        let escaped = uid.replace('-', "_");
        vec![
            kubepods.join(format!("kubepods-pod{escaped}.slice")),
            kubepods.join(format!(
                "kubepods-burstable.slice/kubepods-burstable-pod{escaped}.slice"
            )),
            kubepods.join(format!(
                "kubepods-besteffort.slice/kubepods-besteffort-pod{escaped}.slice"
            )),
        ]
    } else {
        vec![
            kubepods.join(format!("pod{uid}")),
            kubepods.join(format!("burstable/pod{uid}")),
            kubepods.join(format!("besteffort/pod{uid}")),
        ]
    }
}

/// The mount point of the cgroup v2 hierarchy, from mountinfo (`<id> <parent> <dev> <root>
/// <mount point> <options> ... - cgroup2 <source> <super options>`), when it is mounted whole
/// (root `/`).
fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let f: Vec<&str> = left.split_whitespace().collect();
        let point = f.get(4)?;
        (f.get(3) == Some(&"/")).then(|| PathBuf::from(point))
    })
}

/// A pidfd on `pid` (`None` where pidfds are missing or the process is gone; the checks of
/// cgroup and start time around the open still stand then).
fn open_pidfd(pid: i32) -> Option<std::os::fd::OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

/// Whether the process behind a pidfd has exited (the pidfd is readable then).
fn exited(fd: &std::os::fd::OwnedFd) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}

/// The start time of `pid` (`/proc/<pid>/stat` field 22, clock ticks after boot), parsed by the
/// procfs crate (a command with spaces or parentheses included); `None` when it is gone or
/// its stat does not parse.
fn start_time(proc_root: &std::path::Path, pid: i32) -> Option<u64> {
    let stat = procfs::process::Process::new_with_root(proc_root.join(pid.to_string()))
        .ok()?
        .stat()
        .ok()?;
    Some(stat.starttime)
}

impl PodProcs {
    /// Whether `pid` is, right now, a process of pod `uid` with the start time it was
    /// classified with (reclassifying it when not).
    fn still_the_pods(&self, pid: i32, uid: &str) -> bool {
        let (proc_root, start) = {
            let index = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            let Some(entry) = index.pids.get(&pid) else {
                return false;
            };
            (index.proc_root.clone(), entry.start_time)
        };
        // The usual answer (the same process) is read without the lock; anything else is
        // settled under it.
        if let Checked::Same(pod) = check(&proc_root, pid, start) {
            return pod.is_some_and(|p| p.pod_uid == uid);
        }
        let mut index = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        index.recheck(pid).is_some_and(|p| p.pod_uid == uid)
    }
}

impl Index {
    /// Reads `pid`'s cgroup and start time again: the pod it belongs to now (updating the
    /// entry when the pid is another process than the one classified), `None` when gone.
    fn recheck(&mut self, pid: i32) -> Option<PodCgroup> {
        let now_start = start_time(&self.proc_root, pid);
        let entry = self.pids.get(&pid)?;
        if now_start.is_some() && now_start == entry.start_time {
            // The same process: its cgroup is re-read (cheap, and a pod's process may have
            // been moved), but a changed answer is the exception.
            let pod = read_pod_cgroup(&self.proc_root, pid);
            if pod != entry.pod {
                tracing::debug!(pid, "a pod process's cgroup changed; reclassified");
            }
            let e = self.pids.get_mut(&pid)?;
            e.pod = pod.clone();
            return pod;
        }
        let Some(start) = now_start else {
            self.pids.remove(&pid);
            return None;
        };
        if entry.start_time.is_some() {
            tracing::debug!(
                pid,
                "pid reused by another process since it was classified; reclassified"
            );
        }
        let pod = read_pod_cgroup(&self.proc_root, pid);
        self.pids.insert(
            pid,
            Entry {
                pod: pod.clone(),
                start_time: Some(start),
                first_seen: Instant::now(),
                settled_read: false,
            },
        );
        pod
    }

    /// For a pod whose directory is not known yet: looks where the kubelet makes it
    /// ([`predicted_pod_dirs`] under the `kubepods` directories learned from other pods).
    /// `Some(true)`: found and remembered; `Some(false)`: the layout is known and the pod has
    /// no directory yet, so it has no process yet either (the kubelet makes a pod's cgroup
    /// before its sandbox: pkg/kubelet/kubelet.go `SyncPod` calls `EnsureExists` on the pod's
    /// cgroup before the runtime's `SyncPod`); `None`: no layout learned (or no cgroup v2
    /// paths to follow), the caller lists `/proc`.
    fn probe_pod_dir(&mut self, uid: &str) -> Option<bool> {
        let root = self.cgroup_root.as_ref()?;
        if self.kubepods_roots.is_empty() {
            return None;
        }
        for (kubepods, systemd) in &self.kubepods_roots {
            for dir in predicted_pod_dirs(kubepods, *systemd, uid) {
                let abs = root.join(dir.strip_prefix("/").unwrap_or(&dir));
                if abs.is_dir() {
                    self.pod_dirs.insert(uid.to_string(), dir);
                    return Some(true);
                }
            }
        }
        Some(false)
    }

    /// Places the processes in pod `uid`'s cgroup directory (and its containers') in the index,
    /// if the directory is known and readable; `false` when the caller must list `/proc` instead.
    ///
    /// Issue 29: the directory a pid is listed in says its pod and container, so a new pid is
    /// entered from the path alone, with no read of its own: its start time is read when it is
    /// first handed out ([`PodProcs::of_pod_blocking_except`] checks every candidate, and a
    /// pid entered here has none yet). Before, each new pid was classified by reading its
    /// `cgroup` and `stat` (512 a look): a drain's first looks at a pod of 2,000 processes
    /// made ~5,000 reads in a burst (300 ms of a debug build), which under the DaemonSet's
    /// 0.2-core quota throttled the agent as another pod's sandbox came up, and that pod's
    /// hold went in after its app's first connect. An entry whose pod the directory
    /// contradicts (a pid reused by another pod since) is placed again; an entry of this pod
    /// that no directory lists any more is dropped (exited or moved), so the index keeps no
    /// more of a pod than it has now.
    fn read_pod_cgroup_dir(&mut self, uid: &str) -> bool {
        let (Some(root), Some(dir)) = (&self.cgroup_root, self.pod_dirs.get(uid)) else {
            return false;
        };
        let base = root.join(dir.strip_prefix("/").unwrap_or(dir));
        let mut listed: Vec<(i32, Option<PodCgroup>)> = Vec::new();
        let mut dirs = vec![(base, 0u8)];
        // Whether every directory under the pod's was read (none deeper than the walk goes):
        // only then is a pid missing from the listing known not to be the pod's.
        let mut whole = true;
        while let Some((d, depth)) = dirs.pop() {
            let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) else {
                if depth == 0 {
                    // The pod's cgroup is gone (or was never there): forget it, list /proc.
                    self.pod_dirs.remove(uid);
                    return false;
                }
                whole = false;
                continue;
            };
            // The directory as `/proc/<pid>/cgroup` would show it for a process in it.
            let pod = d
                .strip_prefix(root)
                .ok()
                .and_then(|rel| rel.to_str())
                .and_then(|rel| parse_pod_cgroup(&format!("0::/{rel}\n")));
            listed.extend(
                text.lines()
                    .filter_map(|l| l.trim().parse::<i32>().ok())
                    .map(|pid| (pid, pod.clone())),
            );
            // Containers are children of the pod's directory (runtimes may nest one more).
            if let Ok(rd) = std::fs::read_dir(&d) {
                let children: Vec<PathBuf> = rd
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path())
                    .collect();
                if depth < 2 {
                    dirs.extend(children.into_iter().map(|c| (c, depth + 1)));
                } else if !children.is_empty() {
                    whole = false;
                }
            }
        }
        let now = Instant::now();
        // At most this many pids of one pod are kept: the index's memory per pod is bounded
        // whatever the pod forks (the oldest pids are the ones handed out).
        cap_per_container(&mut listed, MAX_INDEXED_PER_POD, |(pid, pod)| {
            (*pid, pod.as_ref().and_then(|p| p.container_id.as_deref()))
        });
        let present: Vec<i32> = listed.iter().map(|(pid, _)| *pid).collect();
        for (pid, pod) in listed {
            let Some(pod) = pod.filter(|p| p.pod_uid == uid) else {
                continue;
            };
            let stale = match self.pids.get(&pid) {
                None => true,
                Some(e) => e.pod.as_ref().is_none_or(|p| p.pod_uid != pod.pod_uid),
            };
            if stale {
                self.pids.insert(
                    pid,
                    Entry {
                        pod: Some(pod),
                        start_time: None,
                        first_seen: now,
                        settled_read: true,
                    },
                );
            }
        }
        if whole {
            self.pids.retain(|pid, e| {
                present.binary_search(pid).is_ok()
                    || e.pod.as_ref().is_none_or(|p| p.pod_uid != uid)
            });
        }
        true
    }

    /// Reads `pid`'s cgroup and start time into the index, learning its pod's cgroup directory.
    fn classify(&mut self, pid: i32, now: Instant) {
        let text = std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("cgroup"))
            .unwrap_or_default();
        let pod = parse_pod_cgroup(&text);
        if let Some(p) = &pod {
            if !self.pod_dirs.contains_key(&p.pod_uid) {
                if let Some(dir) = crate::effects::procfs::cgroup::pod_dir_v2(&text) {
                    if let Some(root) = kubepods_root(&dir) {
                        if !self.kubepods_roots.contains(&root) {
                            self.kubepods_roots.push(root);
                        }
                    }
                    self.pod_dirs.insert(p.pod_uid.clone(), PathBuf::from(dir));
                }
            }
        }
        let start = start_time(&self.proc_root, pid);
        let first_seen = self.pids.get(&pid).map_or(now, |e| e.first_seen);
        let settled_read = now.duration_since(first_seen) > SETTLE;
        self.pids.insert(
            pid,
            Entry {
                pod,
                start_time: start,
                first_seen,
                settled_read,
            },
        );
    }

    /// Lists `/proc` for a pod the learned layout does not place, at most every
    /// [`UNPREDICTED_LISTING_EVERY`].
    /// The first such look only starts the clock: a pod the layout places is usually just not
    /// there yet (its sandbox is being made), and is found without any listing.
    fn list_for_unpredicted_pod(&mut self) {
        let now = Instant::now();
        match self.last_unpredicted_listing {
            None => {
                self.last_unpredicted_listing = Some(now);
                return;
            }
            Some(t) if now.duration_since(t) < UNPREDICTED_LISTING_EVERY => return,
            Some(_) => {}
        }
        self.last_unpredicted_listing = Some(now);
        // Not skipped by `refresh_if_stale`'s own 5 ms bound: at most once a second here.
        self.last_refresh = None;
        self.refresh_if_stale();
    }

    fn refresh_if_stale(&mut self) {
        let now = Instant::now();
        if self
            .last_refresh
            .is_some_and(|t| now.duration_since(t) < MIN_REFRESH)
        {
            return;
        }
        self.last_refresh = Some(now);
        self.listings += 1;
        let Ok(dir) = std::fs::read_dir(&self.proc_root) else {
            tracing::warn!(proc_root = %self.proc_root.display(), "cannot list the proc root");
            return;
        };
        let mut alive = Vec::with_capacity(self.pids.len() + 16);
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            alive.push(pid);
            let settled = self
                .pids
                .get(&pid)
                .is_some_and(|e| e.pod.is_some() || e.settled_read);
            if settled {
                continue;
            }
            // The process may exit between listing and reading: it then reads as no pod. The
            // start time is read after the cgroup: a reuse in between shows as a different
            // start time at the next check.
            self.classify(pid, now);
        }
        if alive.len() != self.pids.len() {
            let alive: std::collections::HashSet<i32> = alive.into_iter().collect();
            self.pids.retain(|pid, _| alive.contains(pid));
        }
    }
}

/// A `/proc/<pid>/stat` line with start time `start` (field 22), for fake proc trees: the 52
/// fields Linux writes since 3.5 (`fs/proc/array.c::do_task_stat`), with a command holding a
/// space and a `)` as a container's may.
#[cfg(test)]
fn fake_stat(pid: i32, start: u64) -> String {
    let tail = ["0"; 28].join(" ");
    format!(
        "{pid} (sim) app) S 1 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 {start} 1000 10 \
         {tail}\n"
    )
}

/// A fake tree (proc root, cgroup root) under the temp dir, removed on drop (also when an
/// assertion fails).
#[cfg(test)]
struct Tree(PathBuf);

#[cfg(test)]
impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes a fake `/proc/<pid>` with `cgroup` line `0::<cgroup>` and start time 500.
#[cfg(test)]
fn fake_process(proc_root: &std::path::Path, pid: i32, cgroup: &str) {
    let d = proc_root.join(pid.to_string());
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("cgroup"), format!("0::{cgroup}\n")).unwrap();
    std::fs::write(d.join("stat"), fake_stat(pid, 500)).unwrap();
}

/// The pod `pid` belongs to by its cgroup file, if any.
fn read_pod_cgroup(proc_root: &std::path::Path, pid: i32) -> Option<PodCgroup> {
    std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup"))
        .ok()
        .and_then(|text| parse_pod_cgroup(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_pod_processes_in_a_fake_proc_tree() {
        let tree = Tree(std::env::temp_dir().join(format!("hf-podprocs-{}", std::process::id())));
        let root = tree.0.clone();
        let _ = std::fs::remove_dir_all(&root);
        let uid = "0b6a3c1e-6a59-4d8e-9f3a-2f1d5c7b8a90";
        let cid = "a".repeat(64);
        for (pid, cgroup) in [
            (10, format!("0::/kubepods/besteffort/pod{uid}/{cid}\n")),
            (11, "0::/system.slice/sshd.service\n".to_string()),
            (12, format!("0::/kubepods/pod{uid}/{}\n", "b".repeat(64))),
        ] {
            let d = root.join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cgroup"), cgroup).unwrap();
            std::fs::write(d.join("stat"), fake_stat(pid, 1000)).unwrap();
        }
        std::fs::create_dir_all(root.join("self")).unwrap();
        let procs = PodProcs::new(root.clone());
        let found = procs.of_pod_blocking(uid);
        assert_eq!(
            found.iter().map(|p| p.pid).collect::<Vec<_>>(),
            vec![10, 12]
        );
        assert_eq!(found[0].container_id.as_deref(), Some(cid.as_str()));
        assert!(procs.of_pod_blocking("other").is_empty());

        // A process that exits is forgotten.
        std::fs::remove_dir_all(root.join("10")).unwrap();
        std::thread::sleep(MIN_REFRESH * 2);
        assert_eq!(procs.of_pod_blocking(uid).len(), 1);

        // A process seen outside any pod (runc's init before it is moved into the container's
        // cgroup), then nobody looks until after SETTLE: the next look still reads it again.
        let d = root.join("13");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cgroup"), "0::/system.slice/containerd.service\n").unwrap();
        std::fs::write(d.join("stat"), fake_stat(13, 1000)).unwrap();
        std::thread::sleep(MIN_REFRESH * 2);
        assert_eq!(procs.of_pod_blocking(uid).len(), 1);
        std::fs::write(
            d.join("cgroup"),
            format!("0::/kubepods/besteffort/pod{uid}/{}\n", "c".repeat(64)),
        )
        .unwrap();
        std::thread::sleep(SETTLE + MIN_REFRESH * 2);
        assert_eq!(
            procs
                .of_pod_blocking(uid)
                .iter()
                .map(|p| p.pid)
                .collect::<Vec<_>>(),
            vec![12, 13],
            "a process moved into the pod's cgroup is found"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}

/// `find_netns` on a fake proc root shaped like a CRI-O node with `conmon_cgroup = "pod"`:
/// conmon and a process directly in the pod cgroup sit in the node's netns, at lower pids than
/// the container. Netns files are plain files here: a netns is known by (dev, inode) only.
#[cfg(test)]
mod netns_tests {
    use super::*;
    use std::path::Path;

    const UID: &str = "9b7969b2-aad0-47d4-b11c-4acfd1ce018e";
    const UID_: &str = "9b7969b2_aad0_47d4_b11c_4acfd1ce018e";

    /// A fake proc root; removed on drop.
    struct FakeProc {
        root: PathBuf,
    }

    impl FakeProc {
        fn new(name: &str) -> FakeProc {
            let root = std::env::temp_dir().join(format!("hf-netns-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join("ns-files")).unwrap();
            for ns in ["node", "agent", "pod", "other-pod"] {
                std::fs::write(root.join("ns-files").join(ns), ns).unwrap();
            }
            let f = FakeProc { root };
            f.link("1", "node");
            f.link("self", "agent");
            f
        }

        /// `<root>/<dir>/ns/net` → the named netns file.
        fn link(&self, dir: &str, ns: &str) {
            let d = self.root.join(dir).join("ns");
            std::fs::create_dir_all(&d).unwrap();
            std::os::unix::fs::symlink(self.root.join("ns-files").join(ns), d.join("net")).unwrap();
        }

        fn process(&self, pid: i32, cgroup: &str, ns: Option<&str>) {
            self.process_started(pid, cgroup, ns, 1000);
        }

        /// A process with start time `start` (a different start time under the same pid is
        /// another process: pid reuse).
        fn process_started(&self, pid: i32, cgroup: &str, ns: Option<&str>, start: u64) {
            let d = self.root.join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cgroup"), cgroup).unwrap();
            std::fs::write(d.join("stat"), fake_stat(pid, start)).unwrap();
            let _ = std::fs::remove_file(d.join("ns/net"));
            if let Some(ns) = ns {
                self.link(&pid.to_string(), ns);
            }
        }

        fn ns_id(&self, ns: &str) -> NetnsId {
            NetnsId::of_path(&self.root.join("ns-files").join(ns)).unwrap()
        }

        fn lookup(&self) -> NetnsLookup {
            PodProcs::new(self.root.clone()).find_netns_blocking(UID)
        }
    }

    impl Drop for FakeProc {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    /// Issue 29: one pod's process checks run outside the index's lock. Pod A's process has a
    /// `stat` that blocks its reader (a FIFO: a slow /proc read, as with thousands of
    /// processes); pod B's lookup still answers at once. Before, B waited behind A's lock for
    /// as long as A's reads took.
    #[test]
    fn one_pods_checks_do_not_hold_up_another_pods_lookup() {
        let f = FakeProc::new("lock");
        let a = "0b6a3c1e-6a59-4d8e-9f3a-00000000000a";
        let b = "0b6a3c1e-6a59-4d8e-9f3a-00000000000b";
        let cid = |c: char| c.to_string().repeat(64);
        f.process(30, &format!("0::/kubepods/pod{a}/{}\n", cid('a')), None);
        f.process(31, &format!("0::/kubepods/pod{b}/{}\n", cid('b')), None);
        let procs = PodProcs::with_cgroup_root(f.root.clone(), None);
        assert_eq!(procs.of_pod_blocking(a).len(), 1);
        assert_eq!(procs.of_pod_blocking(b).len(), 1);
        // A's stat becomes a FIFO with no writer yet: reading it blocks.
        let stat = f.root.join("30/stat");
        std::fs::remove_file(&stat).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&stat).status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("SKIP: no mkfifo here");
            return;
        }
        let slow = {
            let procs = procs.clone();
            let a = a.to_string();
            std::thread::spawn(move || procs.of_pod_blocking(&a))
        };
        std::thread::sleep(Duration::from_millis(100)); // A is blocked in its read now
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let procs = procs.clone();
            let b = b.to_string();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(10)); // past MIN_REFRESH
                let _ = tx.send(procs.of_pod_blocking(&b));
            });
        }
        let answer = rx.recv_timeout(Duration::from_secs(2));
        // Unblock A whatever happened (a writer that opens, writes and closes).
        std::fs::write(&stat, fake_stat(30, 1000)).unwrap();
        assert_eq!(
            answer
                .expect("B's lookup waited behind A's process checks")
                .len(),
            1
        );
        assert_eq!(slow.join().unwrap().len(), 1);
    }

    /// Issue 29: pids the caller watches by pidfd are neither handed out again nor re-read.
    /// Pid 30's `stat` becomes a FIFO no one writes (any read of it blocks): a look that
    /// leaves 30 out answers at once with 31 alone; a plain look would block on 30's read.
    #[test]
    fn watched_pids_are_not_read_again() {
        let f = FakeProc::new("watched");
        let uid = "0b6a3c1e-6a59-4d8e-9f3a-0000000000dd";
        let cg = format!("0::/kubepods/pod{uid}/{}\n", "d".repeat(64));
        f.process(30, &cg, None);
        f.process(31, &cg, None);
        let procs = PodProcs::with_cgroup_root(f.root.clone(), None);
        assert_eq!(procs.of_pod_blocking(uid).len(), 2);
        let stat = f.root.join("30/stat");
        std::fs::remove_file(&stat).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&stat).status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("SKIP: no mkfifo here");
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let procs = procs.clone();
            let uid = uid.to_string();
            std::thread::spawn(move || {
                std::thread::sleep(MIN_REFRESH * 2);
                let watched: HashSet<i32> = [30].into();
                let _ = tx.send(procs.of_pod_blocking_except(&uid, &watched, MAX_PROCS_PER_POD));
            });
        }
        let answer = rx.recv_timeout(Duration::from_secs(2));
        // Unblock a reader if there is one (opened read-write, a FIFO's open does not wait
        // for a reader; a blocked reader's open returns and reads this).
        {
            use std::io::Write;
            let mut fifo = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&stat)
                .unwrap();
            fifo.write_all(fake_stat(30, 1000).as_bytes()).unwrap();
        }
        let pids: Vec<i32> = answer
            .expect("the look read the watched pid's stat")
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(pids, vec![31]);
    }

    /// A pod's processes handed out per look are bounded (the oldest pids first): 600
    /// processes cost one look 512 checks, whatever the pod forks.
    #[test]
    fn processes_handed_out_per_pod_are_capped() {
        let f = FakeProc::new("cap");
        let uid = "0b6a3c1e-6a59-4d8e-9f3a-0000000000cc";
        let cg = format!("0::/kubepods/pod{uid}/{}\n", "c".repeat(64));
        for pid in 1000..1600 {
            f.process(pid, &cg, None);
        }
        let procs = PodProcs::with_cgroup_root(f.root.clone(), None);
        let got = procs.of_pod_blocking(uid);
        assert_eq!(got.len(), MAX_PROCS_PER_POD);
        assert_eq!(got.first().map(|p| p.pid), Some(1000));
        assert!(got.windows(2).all(|w| w[0].pid < w[1].pid));
    }

    /// Issue 40's liveness question: the app forked 2,100 processes before the proxy container
    /// started, so every proxy pid is higher than every app pid. The proxy's two processes are
    /// still handed out (the proxy watch and Kuma's Unix-socket admin lookup pick them from
    /// what is handed out), by the /proc listing and from the pod's cgroup directory alike,
    /// within the same caps.
    #[test]
    fn a_proxy_started_after_thousands_of_app_processes_is_handed_out() {
        let uid = "0b6a3c1e-6a59-4d8e-9f3a-0000000000dd";
        let (sandbox, app, proxy) = ("5".repeat(64), "a".repeat(64), "e".repeat(64));
        let at = |cid: &str| format!("/kubepods/pod{uid}/{cid}");
        let mut all: Vec<(i32, String)> = vec![(900, at(&sandbox))];
        all.extend((1000..3100).map(|pid| (pid, at(&app))));
        all.extend([(5000, at(&proxy)), (5001, at(&proxy))]);

        // By the /proc listing (no cgroup root followed).
        let f = FakeProc::new("late-proxy");
        for (pid, cg) in &all {
            f.process(*pid, &format!("0::{cg}\n"), None);
        }
        let procs = PodProcs::with_cgroup_root(f.root.clone(), None);
        let got = procs.of_pod_blocking(uid);
        assert_eq!(got.len(), MAX_PROCS_PER_POD);
        assert!(got.windows(2).all(|w| w[0].pid < w[1].pid), "in pid order");
        let pids: Vec<i32> = got.iter().map(|p| p.pid).collect();
        assert!(
            pids.contains(&900) && pids.contains(&5000) && pids.contains(&5001),
            "{pids:?}"
        );
        let proxy_pids: Vec<i32> = got
            .iter()
            .filter(|p| p.container_id.as_deref() == Some(proxy.as_str()))
            .map(|p| p.pid)
            .collect();
        assert_eq!(proxy_pids, [5000, 5001]);

        // From the pod's cgroup directory (cgroup v2 paths followed): the index keeps at most
        // MAX_INDEXED_PER_POD of the pod's pids, again every container's oldest first.
        let tree = Tree(std::env::temp_dir().join(format!("hf-late-proxy-{}", std::process::id())));
        let (proc_root, cg_root) = (tree.0.join("proc"), tree.0.join("cgroup"));
        let mut by_dir: HashMap<String, String> = HashMap::new();
        for (pid, cg) in &all {
            fake_process(&proc_root, *pid, cg);
            by_dir
                .entry(cg.clone())
                .or_default()
                .push_str(&format!("{pid}\n"));
        }
        std::fs::create_dir_all(cg_root.join(format!("kubepods/pod{uid}"))).unwrap();
        std::fs::write(cg_root.join(format!("kubepods/pod{uid}/cgroup.procs")), "").unwrap();
        for (cg, text) in &by_dir {
            let d = cg_root.join(cg.trim_start_matches('/'));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cgroup.procs"), text).unwrap();
        }
        let procs = PodProcs::with_cgroup_root(proc_root.clone(), Some(cg_root.clone()));
        let _ = procs.of_pod_blocking(uid); // the first look lists /proc and learns the directory
        std::thread::sleep(MIN_REFRESH * 2);
        let got: Vec<i32> = procs.of_pod_blocking(uid).iter().map(|p| p.pid).collect();
        assert_eq!(got.len(), MAX_PROCS_PER_POD);
        assert!(got.contains(&5000) && got.contains(&5001), "{got:?}");
        assert_eq!(procs.listings(), 1, "read from the cgroup directory");
    }

    fn slice() -> String {
        format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice")
    }

    fn conmon(cid: char) -> String {
        format!(
            "{}/crio-conmon-{}.scope\n",
            slice(),
            cid.to_string().repeat(64)
        )
    }

    fn container(cid: char) -> String {
        format!("{}/crio-{}.scope\n", slice(), cid.to_string().repeat(64))
    }

    #[test]
    fn conmon_in_the_node_netns_is_never_the_pods() {
        let f = FakeProc::new("conmon");
        f.process(20, &conmon('a'), Some("node"));
        f.process(21, &format!("{}\n", slice()), Some("node"));
        f.process(30, &container('a'), Some("pod"));
        match f.lookup() {
            NetnsLookup::Found { pid, netns } => {
                assert_eq!(pid, 30);
                assert_eq!(netns.id(), f.ns_id("pod"));
            }
            other => panic!("expected the container's netns, got {other:?}"),
        }
    }

    #[test]
    fn only_conmon_is_not_yet() {
        let f = FakeProc::new("onlyconmon");
        f.process(20, &conmon('a'), Some("node"));
        assert!(matches!(f.lookup(), NetnsLookup::NotYet));
    }

    #[test]
    fn node_and_agent_netns_are_refused_with_the_pid() {
        let f = FakeProc::new("refused");
        f.process(40, &container('b'), Some("node"));
        match f.lookup() {
            NetnsLookup::Refused(why) => {
                assert!(
                    why.contains("pid 40") && why.contains("node's network namespace"),
                    "{why}"
                );
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        let f = FakeProc::new("agent");
        f.process(41, &container('c'), Some("agent"));
        match f.lookup() {
            NetnsLookup::Refused(why) => {
                assert!(
                    why.contains("pid 41") && why.contains("agent's own"),
                    "{why}"
                );
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// CRI-O with the systemd driver and crun on cgroup v2, placed from the pod's directory:
    /// crun puts a container's processes in a `container` sub-cgroup of its scope (crun(1),
    /// `run.oci.systemd.subgroup`: "defaults to container on cgroup v2"), conmon sits in
    /// `crio-conmon-<id>.scope` in the node's netns (`conmon_cgroup = "pod"`, OpenShift's
    /// setting), and the pod slice's name has the uid's dashes as `_`. After the first listing
    /// has taught the index the layout, a new process in the `container` sub-cgroup is found
    /// from `cgroup.procs` with its container id, conmon never gives the netns, and another pod
    /// of the same layout is found in its predicted slice, all with no second listing.
    #[test]
    fn crio_systemd_layout_with_crun_subgroups_is_placed_from_the_directory() {
        const UID_B: &str = "3d2f0c4e-1111-4a2b-8c3d-5e6f7a8b9c0d";
        let f = FakeProc::new("crio-dirs");
        let cg = f.root.join("cg");
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        let pod_slice = |uid: &str| {
            format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
                uid.replace('-', "_")
            )
        };
        // `cgroup.procs` of `<pod slice>/<rel>` (every level has one, as in cgroupfs), and the
        // processes in it.
        let put = |uid: &str, rel: &str, pids: &[(i32, &str)]| {
            let d = cg.join(pod_slice(uid)).join(rel);
            std::fs::create_dir_all(&d).unwrap();
            let mut text = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
            for (pid, ns) in pids {
                text.push_str(&format!("{pid}\n"));
                let line = format!("0::/{}/{rel}\n", pod_slice(uid));
                f.process(*pid, line.trim_end_matches("/\n"), Some(ns));
            }
            std::fs::write(d.join("cgroup.procs"), text).unwrap();
        };
        put(UID, "", &[]);
        put(UID, &format!("crio-conmon-{a}.scope"), &[(20, "node")]);
        put(UID, &format!("crio-{a}.scope"), &[]);
        put(UID, &format!("crio-{a}.scope/container"), &[(30, "pod")]);
        let procs = PodProcs::with_cgroup_root(f.root.clone(), Some(cg.clone()));
        match procs.find_netns_blocking(UID) {
            NetnsLookup::Found { pid, netns } => {
                assert_eq!((pid, netns.id()), (30, f.ns_id("pod")));
            }
            other => panic!("expected the container's netns, got {other:?}"),
        }
        assert_eq!(procs.listings(), 1, "the first look lists /proc");
        // A second container's process, in its crun sub-cgroup: read from the directory.
        put(UID, &format!("crio-{b}.scope"), &[]);
        put(UID, &format!("crio-{b}.scope/container"), &[(31, "pod")]);
        std::thread::sleep(MIN_REFRESH * 2);
        let got = procs.of_pod_blocking(UID);
        let by_pid = |pid: i32| {
            got.iter()
                .find(|p| p.pid == pid)
                .map(|p| p.container_id.clone())
        };
        assert_eq!(by_pid(20), Some(None), "conmon: the pod's, no container");
        assert_eq!(by_pid(30), Some(Some(a.clone())));
        assert_eq!(by_pid(31), Some(Some(b.clone())), "{got:?}");
        assert_eq!(procs.listings(), 1, "no second listing");
        // Another pod of the same layout: its predicted slice, not a listing.
        put(UID_B, "", &[]);
        put(UID_B, &format!("crio-conmon-{a}.scope"), &[(40, "node")]);
        assert!(
            matches!(procs.find_netns_blocking(UID_B), NetnsLookup::NotYet),
            "only conmon yet"
        );
        put(UID_B, &format!("crio-{b}.scope"), &[]);
        put(
            UID_B,
            &format!("crio-{b}.scope/container"),
            &[(41, "other-pod")],
        );
        match procs.find_netns_blocking(UID_B) {
            NetnsLookup::Found { pid, netns } => {
                assert_eq!((pid, netns.id()), (41, f.ns_id("other-pod")));
            }
            other => panic!("expected pod B's netns, got {other:?}"),
        }
        assert_eq!(
            procs.listings(),
            1,
            "pod B found where the kubelet makes it"
        );
    }

    /// A pod under a `kubepods` directory other than the one learned from the first pods (a
    /// second kubelet's `cgroupRoot`): not where the learned layout predicts it, so found by a
    /// listing — at most one a second — instead of never.
    #[test]
    fn a_pod_outside_the_learned_layout_is_still_found() {
        const UID_B: &str = "3d2f0c4e-2222-4a2b-8c3d-5e6f7a8b9c0d";
        let f = FakeProc::new("second-root");
        let cg = f.root.join("cg");
        let put = |dir: &str, pid: i32, ns: &str| {
            let d = cg.join(dir);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cgroup.procs"), format!("{pid}\n")).unwrap();
            f.process(pid, &format!("0::/{dir}"), Some(ns));
        };
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        put(&format!("kubepods/burstable/pod{UID}/{a}"), 30, "pod");
        let procs = PodProcs::with_cgroup_root(f.root.clone(), Some(cg.clone()));
        assert!(matches!(
            procs.find_netns_blocking(UID),
            NetnsLookup::Found { .. }
        ));
        let learned = procs.listings();
        // Pod B under another kubelet's root, after the layout was learned.
        put(
            &format!("second/kubepods/besteffort/pod{UID_B}/{b}"),
            50,
            "other-pod",
        );
        assert!(
            matches!(procs.find_netns_blocking(UID_B), NetnsLookup::NotYet),
            "the first look only starts the clock"
        );
        assert_eq!(procs.listings(), learned);
        std::thread::sleep(UNPREDICTED_LISTING_EVERY + Duration::from_millis(50));
        match procs.find_netns_blocking(UID_B) {
            NetnsLookup::Found { pid, netns } => {
                assert_eq!((pid, netns.id()), (50, f.ns_id("other-pod")));
            }
            other => panic!("pod B under a second kubepods root: {other:?}"),
        }
        assert_eq!(procs.listings(), learned + 1, "one listing found it");
        // A pod with no process anywhere yet: looked for by listing at most once a second.
        for _ in 0..20 {
            assert!(matches!(
                procs.find_netns_blocking("00000000-0000-4000-8000-000000000000"),
                NetnsLookup::NotYet
            ));
        }
        assert!(
            procs.listings() <= learned + 2,
            "{} listings",
            procs.listings()
        );
    }

    /// Pid reuse: pod A's lowest pid exits and pod B's process gets the same pid between two
    /// refreshes (the listing sees the pid both times). The index must notice by the start time
    /// and the cgroup, and never hand out B's netns (nor B's process) for A.
    #[test]
    fn a_reused_pid_is_never_taken_for_the_old_pod() {
        const UID_B: &str = "3d2f0c4e-1111-4a2b-8c3d-5e6f7a8b9c0d";
        let f = FakeProc::new("reuse");
        f.process(30, &container('a'), Some("pod"));
        f.process(31, &container('b'), Some("pod"));
        let procs = PodProcs::new(f.root.clone());
        match procs.find_netns_blocking(UID) {
            NetnsLookup::Found { pid, netns } => {
                assert_eq!((pid, netns.id()), (30, f.ns_id("pod")));
            }
            other => panic!("expected the pod's netns, got {other:?}"),
        }
        // Pid 30 is now pod B's process (another start time, another cgroup, another netns).
        let b_cgroup = format!("0::/kubepods/besteffort/pod{UID_B}/{}\n", "e".repeat(64));
        f.process_started(30, &b_cgroup, Some("other-pod"), 9999);
        std::thread::sleep(MIN_REFRESH * 2);
        match procs.find_netns_blocking(UID) {
            NetnsLookup::Found { pid, netns } => {
                assert_eq!(pid, 31, "the reused pid is skipped");
                assert_eq!(netns.id(), f.ns_id("pod"), "never pod B's netns");
            }
            other => panic!("expected the pod's netns through pid 31, got {other:?}"),
        }
        let pids: Vec<i32> = procs.of_pod_blocking(UID).iter().map(|p| p.pid).collect();
        assert_eq!(pids, vec![31]);
        let b: Vec<i32> = procs.of_pod_blocking(UID_B).iter().map(|p| p.pid).collect();
        assert_eq!(b, vec![30], "the reused pid is pod B's now");
    }

    /// CRI-O with `drop_infra_ctr = true`: no pause; the lowest pid is an init container that has
    /// already exited (its /proc entry is half gone). Any live candidate is taken.
    #[test]
    fn an_exited_first_process_is_skipped() {
        let f = FakeProc::new("dropinfra");
        f.process(50, &container('d'), None);
        assert!(
            matches!(f.lookup(), NetnsLookup::NotYet),
            "only an exited process"
        );
        f.process(51, &container('e'), Some("pod"));
        match f.lookup() {
            NetnsLookup::Found { pid, netns } => {
                assert_eq!(pid, 51);
                assert_eq!(netns.id(), f.ns_id("pod"));
            }
            other => panic!("expected the live container's netns, got {other:?}"),
        }
        assert!(Path::new(&f.root).exists());
    }
}

/// A pod whose cgroup directory is known is answered from its `cgroup.procs` files, without
/// listing `/proc`; a process forked into it later is found the same way.
#[cfg(test)]
mod cgroup_dir_tests {
    use super::*;

    #[test]
    fn the_cgroup2_mount_is_found() {
        let hybrid = "30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "35 24 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(unified),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(cgroup2_mount("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"), None);
    }

    #[test]
    fn a_known_pod_is_read_from_its_own_cgroup() {
        let tree = Tree(std::env::temp_dir().join(format!("hf-cgdir-{}", std::process::id())));
        let (proc_root, cg_root) = (tree.0.join("proc"), tree.0.join("cgroup"));
        let uid = "0b6a3c1e-6a59-4d8e-9f3a-2f1d5c7b8a90";
        let (c1, c2) = ("a".repeat(64), "b".repeat(64));
        let add = |pid: i32, cid: &str| {
            fake_process(&proc_root, pid, &format!("/kubepods/pod{uid}/{cid}"));
            let c = cg_root.join(format!("kubepods/pod{uid}/{cid}"));
            std::fs::create_dir_all(&c).unwrap();
            let procs = c.join("cgroup.procs");
            let mut text = std::fs::read_to_string(&procs).unwrap_or_default();
            text.push_str(&format!("{pid}\n"));
            std::fs::write(procs, text).unwrap();
        };
        std::fs::create_dir_all(cg_root.join(format!("kubepods/pod{uid}"))).unwrap();
        std::fs::write(cg_root.join(format!("kubepods/pod{uid}/cgroup.procs")), "").unwrap();
        add(40, &c1);
        // Many other processes on the node.
        for pid in 100..400 {
            fake_process(&proc_root, pid, "/system.slice/x.service");
        }
        let procs = PodProcs::with_cgroup_root(proc_root.clone(), Some(cg_root.clone()));
        let pids = |p: &PodProcs| {
            p.of_pod_blocking(uid)
                .iter()
                .map(|p| p.pid)
                .collect::<Vec<_>>()
        };
        assert_eq!(pids(&procs), vec![40], "found by the first listing");
        assert_eq!(procs.listings(), 1);
        add(41, &c2);
        std::thread::sleep(MIN_REFRESH * 2);
        assert_eq!(
            pids(&procs),
            vec![40, 41],
            "a new container process, from cgroup.procs"
        );
        assert_eq!(procs.listings(), 1, "no second listing of /proc");
        // Issue 29: another pod, not seen yet, is looked for where the kubelet makes its
        // directory (the layout learned from the first pod), not by listing /proc.
        let other = "0b6a3c1e-6a59-4d8e-9f3a-2f1d5c7b8a91";
        let p = |p: &PodProcs, uid: &str| {
            p.of_pod_blocking(uid)
                .iter()
                .map(|p| p.pid)
                .collect::<Vec<_>>()
        };
        std::thread::sleep(MIN_REFRESH * 2);
        assert!(p(&procs, other).is_empty(), "no cgroup, no process yet");
        assert_eq!(
            procs.listings(),
            1,
            "no listing for a pod without a cgroup yet"
        );
        let c3 = "c".repeat(64);
        let d = cg_root.join(format!("kubepods/besteffort/pod{other}/{c3}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cgroup.procs"), "42\n").unwrap();
        std::fs::write(d.parent().unwrap().join("cgroup.procs"), "").unwrap();
        fake_process(
            &proc_root,
            42,
            &format!("/kubepods/besteffort/pod{other}/{c3}"),
        );
        std::thread::sleep(MIN_REFRESH * 2);
        assert_eq!(
            p(&procs, other),
            vec![42],
            "found in its predicted directory"
        );
        assert_eq!(procs.listings(), 1, "still no second listing");
        // The pod's cgroup gone (on a node its processes are gone too: a cgroup with a process
        // cannot be removed): where the layout is known, no listing is made to find more.
        std::fs::remove_dir_all(cg_root.join("kubepods")).unwrap();
        std::thread::sleep(MIN_REFRESH * 2);
        let _ = pids(&procs);
        assert_eq!(procs.listings(), 1);
        // No layout learned (a new index): a listing, as before.
        let fresh = PodProcs::with_cgroup_root(proc_root.clone(), Some(cg_root.clone()));
        let _ = pids(&fresh);
        assert_eq!(fresh.listings(), 1);
    }
}

#[cfg(test)]
mod predicted_dir_tests {
    use super::*;

    #[test]
    fn pod_directories_are_predicted_for_both_drivers() {
        let uid = "0b6a3c1e-6a59-4d8e-9f3a-2f1d5c7b8a90";
        let uid_ = "0b6a3c1e_6a59_4d8e_9f3a_2f1d5c7b8a90";
        let learned =
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice");
        let (root, systemd) = kubepods_root(&learned).unwrap();
        assert_eq!((root.to_str().unwrap(), systemd), ("/kubepods.slice", true));
        let dirs = predicted_pod_dirs(&root, systemd, uid);
        assert!(dirs.contains(&PathBuf::from(&learned)), "{dirs:?}");
        assert!(dirs.contains(&PathBuf::from(format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice"
        ))));
        assert!(dirs.contains(&PathBuf::from(format!(
            "/kubepods.slice/kubepods-pod{uid_}.slice"
        ))));
        // cgroupfs, under kind's nesting prefix.
        let learned = format!("/docker/abc/kubepods/besteffort/pod{uid}");
        let (root, systemd) = kubepods_root(&learned).unwrap();
        assert_eq!(
            (root.to_str().unwrap(), systemd),
            ("/docker/abc/kubepods", false)
        );
        let dirs = predicted_pod_dirs(&root, systemd, uid);
        assert!(dirs.contains(&PathBuf::from(&learned)), "{dirs:?}");
        assert!(dirs.contains(&PathBuf::from(format!("/docker/abc/kubepods/pod{uid}"))));
        assert_eq!(kubepods_root("/system.slice/foo.service"), None);
    }
}

#[cfg(test)]
mod timing {
    use super::*;

    /// The cost of polling this index on the real /proc: a first, full classification, then the
    /// refreshes a waiting pod triggers every few milliseconds (a listing plus only new pids).
    #[test]
    #[ignore = "timing figure for docs/benchmarks.md; prints, asserts nothing about speed"]
    fn refresh_timing() {
        let procs = PodProcs::new(PathBuf::from("/proc"));
        let t = Instant::now();
        let _ = procs.of_pod_blocking("no-such-pod");
        let first = t.elapsed();
        let n = procs.inner.lock().unwrap().pids.len();
        // Unclassified processes are re-read while they are new; measure the steady state.
        std::thread::sleep(SETTLE + Duration::from_millis(100));
        let _ = procs.of_pod_blocking("no-such-pod");
        let rounds = 200;
        let t = Instant::now();
        for _ in 0..rounds {
            procs.inner.lock().unwrap().last_refresh = None;
            let _ = procs.of_pod_blocking("no-such-pod");
        }
        let per = t.elapsed() / rounds;
        println!("{n} processes: first classification {first:?}, later refresh {per:?} each");
    }
}

/// Issue 29: a pod's processes are placed from its cgroup directory with no read of their own;
/// only those handed out are read (start time and cgroup), and the ones that left the
/// directory are dropped from the index.
#[cfg(test)]
mod placed_from_the_directory {
    use super::*;

    #[test]
    fn only_the_handed_out_processes_are_read_and_the_gone_are_dropped() {
        let tree = Tree(std::env::temp_dir().join(format!("hf-placed-{}", std::process::id())));
        let (proc_root, cg_root) = (tree.0.join("proc"), tree.0.join("cgroup"));
        let uid = "0b6a3c1e-6a59-4d8e-9f3a-2f1d5c7b8a90";
        let cid = "a".repeat(64);
        let c = cg_root.join(format!("kubepods/pod{uid}/{cid}"));
        std::fs::create_dir_all(&c).unwrap();
        std::fs::write(cg_root.join(format!("kubepods/pod{uid}/cgroup.procs")), "").unwrap();
        let many = MAX_PROCS_PER_POD as i32 + 300;
        let pids: Vec<i32> = (1000..1000 + many).collect();
        for &pid in &pids {
            fake_process(&proc_root, pid, &format!("/kubepods/pod{uid}/{cid}"));
        }
        let list = |pids: &[i32]| pids.iter().map(|p| format!("{p}\n")).collect::<String>();
        std::fs::write(c.join("cgroup.procs"), list(&pids)).unwrap();
        // An index that already knows the pod's directory (as after its first process).
        let knowing_the_pod = || {
            let procs = PodProcs::with_cgroup_root(proc_root.clone(), Some(cg_root.clone()));
            procs
                .inner
                .lock()
                .unwrap()
                .pod_dirs
                .insert(uid.into(), PathBuf::from(format!("/kubepods/pod{uid}")));
            procs
        };
        let procs = knowing_the_pod();

        let first = procs.of_pod_blocking(uid);
        assert_eq!(first.len(), MAX_PROCS_PER_POD, "the oldest, up to the cap");
        assert_eq!(first[0].container_id.as_deref(), Some(cid.as_str()));
        {
            let index = procs.inner.lock().unwrap();
            assert_eq!(index.listings, 0, "no listing of /proc");
            let read = index
                .pids
                .values()
                .filter(|e| e.start_time.is_some())
                .count();
            assert_eq!(read, MAX_PROCS_PER_POD, "only the handed-out were read");
            assert_eq!(index.pids.len(), pids.len(), "every one placed");
        }
        // A drain's look hands out (and reads) at most NEW_PER_DRAIN_LOOK new ones.
        let fresh = knowing_the_pod();
        let mut drained = HashSet::new();
        for look in 1..=MAX_PROCS_PER_POD / NEW_PER_DRAIN_LOOK {
            let got = fresh.of_pod_blocking_except(uid, &drained, NEW_PER_DRAIN_LOOK);
            assert_eq!(got.len(), NEW_PER_DRAIN_LOOK, "look {look}");
            drained.extend(got.iter().map(|p| p.pid));
            let index = fresh.inner.lock().unwrap();
            let read = index
                .pids
                .values()
                .filter(|e| e.start_time.is_some())
                .count();
            assert_eq!(
                read,
                look * NEW_PER_DRAIN_LOOK,
                "only the handed-out were read"
            );
        }
        assert!(
            fresh
                .of_pod_blocking_except(uid, &drained, NEW_PER_DRAIN_LOOK)
                .is_empty(),
            "the per-pod cap reached: nothing more"
        );
        // Watched by the caller: a rescan hands out nothing new and reads nothing.
        let watched: HashSet<i32> = first.iter().map(|p| p.pid).collect();
        assert!(procs
            .of_pod_blocking_except(uid, &watched, MAX_PROCS_PER_POD)
            .is_empty());
        // Half leave (exit); the index forgets them at the next look.
        let (gone, stay) = pids.split_at(pids.len() / 2);
        for pid in gone {
            std::fs::remove_dir_all(proc_root.join(pid.to_string())).unwrap();
        }
        std::fs::write(c.join("cgroup.procs"), list(stay)).unwrap();
        let _ = procs.of_pod_blocking_except(uid, &watched, MAX_PROCS_PER_POD);
        let index = procs.inner.lock().unwrap();
        assert_eq!(index.pids.len(), stay.len(), "the gone are dropped");
        assert!(gone.iter().all(|p| !index.pids.contains_key(p)));
    }
}
