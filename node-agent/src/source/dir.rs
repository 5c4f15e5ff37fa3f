//! A pods directory: one Pod object per file (JSON, or YAML for `.yaml`/`.yml`), like kubelet's
//! static pods. A rewritten file is an updated pod, a removed file a deleted pod. Dotfiles are
//! ignored, so writers can write a dotfile and rename it into place atomically.
//!
//! The directory is watched with inotify: nothing is read while nothing changes (idle cost does
//! not grow with the number of pods). A change costs what changed: the pod files inotify named
//! are `stat`ed and re-read, nothing else ([`PodsDir::poll_named`]). While any pod file is a
//! symlink (a ConfigMap-style mount), a change triggers a full pass instead (a listing plus one
//! `stat` per file; a file is re-read only when its identity changed or inotify named it),
//! because renaming `..data` changes every file behind the links. A slow safety rescan catches
//! what inotify cannot see (a symlink's target outside the directory) and an inotify queue
//! overflow (`IN_Q_OVERFLOW`) forces a full re-read. If inotify is unavailable
//! (`fs.inotify.max_user_instances` reached), the source falls back to rescanning every second.
//!
//! Bad entries are reported in [`SourceProblems`] (served on `/status`, counted in
//! `holdfast_source_problems`), not only logged:
//! - symlinks are followed (ConfigMap mounts are `name -> ..data/name`, `..data -> ..<timestamp>`,
//!   swapped atomically by renaming `..data`; the rename is an event in this directory); loops
//!   are detected by the kernel (`ELOOP`, see path_resolution(7)) and reported;
//! - a file name that is not UTF-8 is reported and ignored;
//! - a uid in two files is reported for both; the first file (by name) is the pod's state, and
//!   the pod is deleted only when no file has it any more;
//! - a file is read in one bounded step (open non-blocking, read at most [`MAX_POD_FILE`] + 1
//!   bytes, parse), never a size check then a read; a file that does not parse (including one
//!   read while still being written) keeps the pod's last good state.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ffi::OsString;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;

use super::dir_watch::{Changed, DirWatch};
use super::{PodEvent, SourceProblem, SourceProblems};

/// Errors reading the pods directory itself (a bad file is not an error of the source).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "cannot read pods directory {path}: {source} (pass an existing directory with --pods-dir)"
    )]
    ReadDir {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// Largest pod file read; real Pod objects are a few KiB (the API server caps a whole object at
/// 1.5 MiB, etcd's request limit), so 1 MiB leaves room and bounds what one file can cost.
pub const MAX_POD_FILE: u64 = 1 << 20;

/// The rescan period when inotify cannot be used.
const FALLBACK_RESCAN: Duration = Duration::from_secs(1);

/// A file's identity as last read (of the symlink's target for a symlink).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileStamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
        }
    }
}

#[derive(Debug, Default)]
struct FileState {
    /// Identity at the last read; `None` forces a re-read.
    stamp: Option<FileStamp>,
    /// The last pod that parsed from this file.
    pod: Option<Arc<Pod>>,
    /// Why the last read failed, if it did.
    problem: Option<String>,
}

/// Reads and follows a pods directory.
#[derive(Debug)]
pub struct PodsDir {
    dir: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
    /// Problems with entries that are not (readable) files: loops, non-UTF-8 names...
    entry_problems: Vec<SourceProblem>,
    /// What the agent was last told, per uid.
    emitted: HashMap<String, Arc<Pod>>,
    /// Names inotify reported since the last rescan: re-read whatever their stamp says.
    dirty: HashSet<OsString>,
    /// A full pass has run, and none of the pod files it found was a symlink (cleared when a
    /// named file turns out to be one): a change then touches only the files inotify names.
    named_passes: bool,
    problems: SourceProblems,
}

/// What one directory entry is, as far as the source is concerned.
enum Entry {
    /// Not there (removed since inotify named it or the listing saw it).
    Absent,
    /// There, but not readable as a file (reported in `entry_problems`); its pod keeps its last
    /// good state.
    Unreadable,
    /// A file with this identity.
    File(FileStamp),
}

impl PodsDir {
    /// Opens `dir`; fails when it cannot be listed. Problems go to a list of its own until
    /// [`with_problems`](Self::with_problems) shares one with the status API.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        std::fs::read_dir(&dir).map_err(|source| Error::ReadDir {
            path: dir.clone(),
            source,
        })?;
        Ok(Self {
            dir,
            files: BTreeMap::new(),
            entry_problems: Vec::new(),
            emitted: HashMap::new(),
            dirty: HashSet::new(),
            named_passes: false,
            problems: SourceProblems::default(),
        })
    }

    /// Reports rejected and ignored entries into `problems` (the list `/status` serves).
    pub fn with_problems(mut self, problems: SourceProblems) -> Self {
        self.problems = problems;
        self
    }

    /// One full pass: the events since the previous pass (all pods on the first pass).
    pub fn poll(&mut self) -> Result<Vec<PodEvent>> {
        let present = self.list()?;
        self.files.retain(|path, _| present.contains_key(path));
        for (path, entry) in present {
            let name = path.file_name().map(OsString::from).unwrap_or_default();
            let named = self.dirty.contains(&name);
            self.update(path, entry, named);
        }
        self.dirty.clear();
        let events = self.diff();
        self.publish_problems();
        Ok(events)
    }

    /// The events after inotify named `names`, reading only those: each named pod file is
    /// `stat`ed and re-read (or forgotten, when it is gone); other names (dotfiles such as a
    /// writer's temporary file, names that are not pod files) cannot change a pod and are
    /// skipped. Falls back to a full [`poll`](Self::poll) before the first full pass, and
    /// whenever a pod file is a symlink: a ConfigMap-style `..data` swap changes the files
    /// behind every link while inotify names only `..data`.
    pub fn poll_named(&mut self, names: &[OsString]) -> Result<Vec<PodEvent>> {
        let mut named: Vec<&OsString> = names
            .iter()
            .filter(|n| !n.as_bytes().starts_with(b".") && is_pod_file(n.as_bytes()))
            .collect();
        named.sort();
        named.dedup();
        let mut checked = Vec::with_capacity(named.len());
        for name in named {
            let path = self.dir.join(name);
            // lstat: for a file that is not a symlink, the same answer `stat` gives.
            let meta = std::fs::symlink_metadata(&path);
            if meta.as_ref().is_ok_and(|m| m.file_type().is_symlink()) {
                self.named_passes = false;
            }
            checked.push((path, meta));
        }
        if !self.named_passes {
            self.dirty.extend(names.iter().cloned());
            return self.poll();
        }
        for (path, meta) in checked {
            let shown = path.display().to_string();
            self.entry_problems.retain(|p| p.entry != shown);
            match self.classify(&path, meta) {
                Entry::Absent => {
                    self.files.remove(&path);
                }
                entry => self.update(path, entry, true),
            }
        }
        let events = self.diff();
        self.publish_problems();
        Ok(events)
    }

    /// Brings one present entry's state up to date: re-reads the file when its identity changed
    /// or `named` (inotify reported it).
    fn update(&mut self, path: PathBuf, entry: Entry, named: bool) {
        let state = self.files.entry(path.clone()).or_default();
        // Present but not a readable file (a loop, a dangling link): reported by `classify`;
        // the pod it had keeps its last good state.
        let Entry::File(stamp) = entry else { return };
        if state.stamp == Some(stamp) && !named {
            return;
        }
        match read_pod(&path) {
            Ok((pod, stamp)) => {
                state.stamp = Some(stamp);
                state.pod = Some(Arc::new(pod));
                state.problem = None;
            }
            Err(problem) => {
                if state.problem.as_deref() != Some(problem.as_str()) {
                    tracing::warn!(file = %path.display(), %problem, "ignoring pod file; the pod keeps its last good state");
                }
                state.stamp = Some(stamp);
                state.problem = Some(problem);
            }
        }
    }

    /// The pod files present, with what each is. Notes whether any is a symlink (the entry's
    /// type from the listing itself, no extra `stat`).
    fn list(&mut self) -> Result<BTreeMap<PathBuf, Entry>> {
        let entries = std::fs::read_dir(&self.dir).map_err(|source| Error::ReadDir {
            path: self.dir.clone(),
            source,
        })?;
        let mut present = BTreeMap::new();
        let mut symlinks = false;
        self.entry_problems.clear();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let bytes = name.as_bytes();
            if bytes.starts_with(b".") || !is_pod_file(bytes) {
                continue;
            }
            let path = entry.path();
            // A type the listing could not tell counts as a symlink: full passes, to be safe.
            symlinks |= entry.file_type().map_or(true, |t| t.is_symlink());
            // Follows symlinks (a ConfigMap-style mount).
            let meta = std::fs::metadata(&path);
            match self.classify(&path, meta) {
                Entry::Absent => {}
                entry => {
                    present.insert(path, entry);
                }
            }
        }
        self.named_passes = !symlinks;
        Ok(present)
    }

    /// What the entry at `path` is, from its `stat` (symlinks followed) `meta` — or its `lstat`
    /// where it is known not to be a symlink; a problem is reported in `entry_problems`.
    fn classify(&mut self, path: &Path, meta: std::io::Result<std::fs::Metadata>) -> Entry {
        if path.file_name().and_then(|n| n.to_str()).is_none() {
            self.entry_problems.push(SourceProblem {
                entry: path.to_string_lossy().into_owned(),
                problem: "ignored: the file name is not valid UTF-8; rename the file".into(),
            });
            return Entry::Absent;
        }
        let problem = match meta {
            Ok(meta) if meta.is_file() => return Entry::File(FileStamp::of(&meta)),
            Ok(_) => {
                self.entry_problems.push(SourceProblem {
                    entry: path.display().to_string(),
                    problem: "ignored: not a regular file (a directory, pipe or device)".into(),
                });
                return Entry::Absent;
            }
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                "ignored: symlink loop (too many levels of symbolic links); fix the link".into()
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Removed since the listing, or a dangling symlink (reported).
                if std::fs::symlink_metadata(path).is_err() {
                    return Entry::Absent;
                }
                "ignored: dangling symlink (its target does not exist)".into()
            }
            Err(e) => format!("ignored: cannot stat: {e}"),
        };
        self.entry_problems.push(SourceProblem {
            entry: path.display().to_string(),
            problem,
        });
        Entry::Unreadable
    }

    /// The events that bring the agent from `emitted` to the pods the files now describe.
    /// A uid in several files takes the first file's pod; it is deleted only when no file has it.
    fn diff(&mut self) -> Vec<PodEvent> {
        let mut wanted: HashMap<String, Arc<Pod>> = HashMap::new();
        for state in self.files.values() {
            if let Some(pod) = &state.pod {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                wanted.entry(uid).or_insert_with(|| pod.clone());
            }
        }
        let mut events = Vec::new();
        let mut gone: Vec<&String> = self
            .emitted
            .keys()
            .filter(|uid| !wanted.contains_key(*uid))
            .collect();
        gone.sort();
        events.extend(
            gone.into_iter()
                .map(|uid| PodEvent::Deleted { uid: uid.clone() }),
        );
        // In file order, so the events are reproducible.
        let mut applied = BTreeSet::new();
        for state in self.files.values() {
            let Some(pod) = &state.pod else { continue };
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let Some(current) = wanted.get(&uid) else {
                continue;
            };
            if !applied.insert(uid.clone()) {
                continue;
            }
            let unchanged = self
                .emitted
                .get(&uid)
                .is_some_and(|e| Arc::ptr_eq(e, current) || **e == **current);
            if !unchanged {
                events.push(PodEvent::Applied(Box::new(super::slim(
                    (**current).clone(),
                ))));
            }
        }
        self.emitted = wanted;
        events
    }

    /// Publishes the whole current picture: entry problems, unreadable files, duplicate uids.
    fn publish_problems(&self) {
        let mut problems = self.entry_problems.clone();
        let mut by_uid: BTreeMap<String, Vec<&Path>> = BTreeMap::new();
        for (path, state) in &self.files {
            if let Some(problem) = &state.problem {
                let keeps = if state.pod.is_some() {
                    "; the pod keeps its last good state"
                } else {
                    ""
                };
                problems.push(SourceProblem {
                    entry: path.display().to_string(),
                    problem: format!("{problem}{keeps}"),
                });
            }
            if let Some(pod) = &state.pod {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                by_uid.entry(uid).or_default().push(path);
            }
        }
        for (uid, paths) in by_uid.iter().filter(|(_, p)| p.len() > 1) {
            for path in paths {
                let others: Vec<String> = paths
                    .iter()
                    .filter(|p| *p != path)
                    .map(|p| p.display().to_string())
                    .collect();
                problems.push(SourceProblem {
                    entry: path.display().to_string(),
                    problem: format!(
                        "duplicate uid {uid}: also in {}; the pod's state is read from {} (the first by name); remove the duplicate",
                        others.join(", "),
                        paths[0].display()
                    ),
                });
            }
        }
        problems.sort_by(|a, b| (&a.entry, &a.problem).cmp(&(&b.entry, &b.problem)));
        self.problems.set(problems);
    }

    /// Follows the directory and sends events until the receiver is dropped: one full scan, then
    /// [`PodEvent::Synced`], then a rescan on every inotify event and every `safety_rescan`
    /// (10 s is plenty: it only covers what inotify cannot see). A directory that becomes
    /// unreadable is logged and retried; pods are not reported deleted because of it.
    pub async fn run(mut self, safety_rescan: Duration, tx: mpsc::Sender<PodEvent>) {
        let mut watch = DirWatch::new(&self.dir);
        let mut failing = false;
        let mut synced = false;
        // What inotify named last; `None`: a full pass.
        let mut named: Option<Vec<OsString>> = None;
        loop {
            let pass = match named.take() {
                Some(names) => self.poll_named(&names),
                None => self.poll(),
            };
            match pass {
                Ok(events) => {
                    failing = false;
                    for ev in events {
                        if tx.send(ev).await.is_err() {
                            return;
                        }
                    }
                    // After the first full scan: the agent's view is complete (`/readyz`).
                    if !synced {
                        synced = true;
                        if tx.send(PodEvent::Synced).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) if !failing => {
                    failing = true;
                    tracing::error!(error = %e, "pods directory unreadable; retrying");
                }
                Err(_) => {}
            }
            let wait = match &watch {
                Some(_) => safety_rescan,
                None => safety_rescan.min(FALLBACK_RESCAN),
            };
            let changed = match &mut watch {
                Some(w) => tokio::select! {
                    changed = w.changed() => changed,
                    () = tokio::time::sleep(wait) => Changed::Rescan,
                    () = tx.closed() => return,
                },
                None => tokio::select! {
                    () = tokio::time::sleep(wait) => Changed::Rescan,
                    () = tx.closed() => return,
                },
            };
            match changed {
                Changed::Names(names) => named = Some(names),
                Changed::Rescan => {}
                Changed::Overflow => {
                    tracing::warn!("inotify queue overflowed; re-reading every pod file");
                    for state in self.files.values_mut() {
                        state.stamp = None;
                    }
                }
                Changed::Lost => {
                    // The directory itself was removed or replaced: watch the new one.
                    watch = DirWatch::new(&self.dir);
                    for state in self.files.values_mut() {
                        state.stamp = None;
                    }
                }
            }
        }
    }
}

fn is_pod_file(name: &[u8]) -> bool {
    name.ends_with(b".json") || name.ends_with(b".yaml") || name.ends_with(b".yml")
}

/// Reads one pod file in one bounded step: open (non-blocking, so a FIFO cannot hang the agent),
/// `fstat` the opened file (the stamp of what is read), read at most [`MAX_POD_FILE`] + 1 bytes,
/// parse. The error says what is wrong; the caller keeps the pod's last good state.
fn read_pod(path: &Path) -> std::result::Result<(Pod, FileStamp), String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => "symlink loop (too many levels of symbolic links)".to_string(),
            _ => format!("cannot open: {e}"),
        })?;
    let meta = file.metadata().map_err(|e| format!("cannot stat: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let stamp = FileStamp::of(&meta);
    let mut bytes = Vec::with_capacity(meta.len().min(MAX_POD_FILE) as usize + 1);
    file.take(MAX_POD_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_POD_FILE {
        return Err(format!(
            "larger than {MAX_POD_FILE} bytes (a Pod object is a few KiB)"
        ));
    }
    let pod = parse_pod(path, &bytes)?;
    Ok((pod, stamp))
}

/// Parses a Pod object: JSON for `.json`, YAML (serde-saphyr, with its default alias and depth
/// budget) otherwise. Requires `metadata.uid`, the pod's identity.
pub fn parse_pod(path: &Path, bytes: &[u8]) -> std::result::Result<Pod, String> {
    let is_json = path.extension().is_some_and(|e| e == "json");
    let pod: Pod = if is_json {
        serde_json::from_slice(bytes)
            .map_err(|e| format!("does not parse as Pod JSON (still being written?): {e}"))?
    } else {
        let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8 text: {e}"))?;
        serde_saphyr::from_str(text)
            .map_err(|e| format!("does not parse as Pod YAML (still being written?): {e}"))?
    };
    if pod.metadata.uid.as_deref().unwrap_or("").is_empty() {
        return Err("the Pod has no metadata.uid".into());
    }
    Ok(pod)
}
