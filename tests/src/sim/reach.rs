//! The host files a simulated pod's own uids must reach: the Envoy binary and `sim-app` (run as
//! the proxy's uid: 1337 for Istio, 5678 for Kuma, 5995 for Consul) and the filter module Envoy
//! reads. They come from the checkout (`target/`), and a checkout may live where those uids
//! cannot go: under root's home (mode 0700 on Debian), or under `/tmp`, which the kuma-dp
//! stand-in covers with the pod's emptyDir inside its mount namespace, as the injector mounts
//! `kuma-sidecar-tmp` on a real node.
//!
//! So every such file is handed to the pods from a **stage**: a root-owned directory outside
//! `/tmp` that every uid can traverse (default `/var/lib/holdfast-tests/stage`, or
//! `$HOLDFAST_STAGE_DIR`). A file already reachable from outside `/tmp` is used where it is.
//! A staged file is a hard link (a copy across file systems) under a key made of the source's
//! device, inode, size and modification time, so a rebuilt binary gets a new entry and parallel
//! test binaries never see a half-written one (written under a temporary name, then renamed).
//! Entries unused for a week are removed.
//!
//! Where a file still cannot be reached, [`pod_files`] says so before any pod starts, in one line
//! naming the path, the uid and the fix.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::SimError;

/// The uids the simulated pods run their proxies (and the DNS proxies) as, with whose they are.
pub const POD_UIDS: [(u32, &str); 3] = [
    (super::istio_init::PROXY_UID, "Istio's proxy"),
    (super::mesh::KUMA_UID, "Kuma's proxy"),
    (super::mesh::CONSUL_UID, "Consul's proxy"),
];

/// The stage when `$HOLDFAST_STAGE_DIR` is not set.
pub const DEFAULT_STAGE: &str = "/var/lib/holdfast-tests/stage";

/// Stage entries not used for this long are removed.
const PRUNE_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// What a pod's uid does with a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Runs it (the Envoy binary, `sim-app`).
    Exec,
    /// Reads it (the filter module).
    Read,
}

/// The files the pods use, each at a path every pod uid reaches.
#[derive(Clone, Debug)]
pub struct PodFiles {
    pub sim_app: PathBuf,
    pub envoy: PathBuf,
    pub filter: Option<PathBuf>,
}

/// Stages `sim_app`, `envoy` and `filter` where needed and checks that every pod uid reaches
/// each, and `work_dir` (pods' bootstraps, sockets and reports live there). Root only: the stage
/// is root's; an unprivileged caller gets the paths back unchanged (it cannot start pods).
pub fn pod_files(
    sim_app: &Path,
    envoy: &Path,
    filter: Option<&Path>,
    work_dir: &Path,
) -> Result<PodFiles, SimError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(PodFiles {
            sim_app: sim_app.to_path_buf(),
            envoy: envoy.to_path_buf(),
            filter: filter.map(Path::to_path_buf),
        });
    }
    let files = PodFiles {
        sim_app: for_pods(sim_app, Need::Exec)?,
        envoy: for_pods(envoy, Need::Exec)?,
        filter: filter.map(|f| for_pods(f, Need::Read)).transpose()?,
    };
    check_dir_for_pods(work_dir)?;
    Ok(files)
}

/// `path` itself when every pod uid reaches it and it is not under `/tmp`; else its staged copy.
pub fn for_pods(path: &Path, need: Need) -> Result<PathBuf, SimError> {
    let path = path.canonicalize().map_err(|source| SimError::Io {
        what: format!("{} (a file the simulated pods use)", path.display()),
        source,
    })?;
    if !under_tmp(&path)
        && POD_UIDS
            .iter()
            .all(|&(uid, _)| reachable(&path, uid, uid, need).is_ok())
    {
        return Ok(path);
    }
    let stage = stage_dir();
    let staged = stage_file(&path, &stage).map_err(|e| {
        SimError::Setup(format!(
            "cannot stage {} where the pods' uids can reach it ({e}); fix: set HOLDFAST_STAGE_DIR \
             to a root-owned directory outside /tmp that every uid can traverse",
            path.display()
        ))
    })?;
    for &(uid, whose) in &POD_UIDS {
        if let Err(why) = reachable(&staged, uid, uid, need) {
            return Err(SimError::Setup(format!(
                "uid {uid} ({whose}) cannot {} {}: {why}; fix: set HOLDFAST_STAGE_DIR to a \
                 root-owned directory outside /tmp that every uid can traverse (default {DEFAULT_STAGE})",
                verb(need),
                staged.display()
            )));
        }
    }
    Ok(staged)
}

/// Checks that every pod uid can traverse `dir` (the node's work directory).
fn check_dir_for_pods(dir: &Path) -> Result<(), SimError> {
    for &(uid, whose) in &POD_UIDS {
        if let Err(why) = reachable_dir(dir, uid, uid) {
            return Err(SimError::Setup(format!(
                "uid {uid} ({whose}) cannot reach the node's work directory {}: {why}; fix: set \
                 TMPDIR to a directory every uid can traverse",
                dir.display()
            )));
        }
    }
    Ok(())
}

fn verb(need: Need) -> &'static str {
    match need {
        Need::Exec => "run",
        Need::Read => "read",
    }
}

/// The stage directory: `$HOLDFAST_STAGE_DIR`, else [`DEFAULT_STAGE`].
pub fn stage_dir() -> PathBuf {
    match std::env::var_os("HOLDFAST_STAGE_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(DEFAULT_STAGE),
    }
}

fn under_tmp(path: &Path) -> bool {
    path.starts_with("/tmp")
}

/// Why `uid`/`gid` cannot reach `path` for `need` (`Ok` when it can). Mode bits only, as the
/// kernel checks them for a process with no supplementary groups (how the pods' uids run); root
/// reaches everything.
pub fn reachable(path: &Path, uid: u32, gid: u32, need: Need) -> Result<(), String> {
    if uid == 0 {
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        reachable_dir(parent, uid, gid)?;
    }
    let meta = fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let bit = match need {
        Need::Exec => 0o1,
        Need::Read => 0o4,
    };
    if !allowed(&meta, uid, gid, bit) {
        return Err(format!(
            "{} is mode {:04o}",
            path.display(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Why `uid`/`gid` cannot traverse `dir` and each directory above it.
fn reachable_dir(dir: &Path, uid: u32, gid: u32) -> Result<(), String> {
    if uid == 0 {
        return Ok(());
    }
    for d in dir.ancestors().collect::<Vec<_>>().into_iter().rev() {
        let meta = fs::metadata(d).map_err(|e| format!("{}: {e}", d.display()))?;
        if !allowed(&meta, uid, gid, 0o1) {
            return Err(format!(
                "{} is mode {:04o} (owner uid {})",
                d.display(),
                meta.mode() & 0o7777,
                meta.uid()
            ));
        }
    }
    Ok(())
}

/// Whether the owner, group or other class that applies to `uid`/`gid` has `bit` (1 = x, 4 = r).
fn allowed(meta: &fs::Metadata, uid: u32, gid: u32, bit: u32) -> bool {
    let mode = meta.mode();
    let class = if meta.uid() == uid {
        mode >> 6
    } else if meta.gid() == gid {
        mode >> 3
    } else {
        mode
    };
    class & bit == bit
}

/// Puts `src` in `stage/<key>/<name>` (hard link, else copy) and returns that path.
fn stage_file(src: &Path, stage: &Path) -> Result<PathBuf, String> {
    make_stage(stage)?;
    let meta = fs::metadata(src).map_err(|e| format!("{}: {e}", src.display()))?;
    let key = format!(
        "{:x}-{:x}-{:x}-{:x}.{:x}",
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec()
    );
    let name = src.file_name().unwrap_or(OsStr::new("file"));
    let entry = stage.join(&key);
    let dest = entry.join(name);
    if fs::metadata(&dest).is_ok_and(|m| m.len() == meta.size()) {
        touch(&entry);
        return Ok(dest);
    }
    fs::create_dir_all(&entry).map_err(|e| format!("{}: {e}", entry.display()))?;
    fs::set_permissions(&entry, fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", entry.display()))?;
    // A name of this call's own: the tests of one binary stage the same file at once (same
    // pid), and one's clean-up must never remove another's half-made copy.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = entry.join(format!(
        ".{}.{}.{}",
        name.to_string_lossy(),
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = fs::remove_file(&tmp);
    // A hard link keeps the source's mode, so it serves only when that already lets every uid
    // in; otherwise (or across file systems) a copy with the mode the pods need.
    let linked = meta.mode() & 0o005 == 0o005 && fs::hard_link(src, &tmp).is_ok();
    if !linked {
        fs::copy(src, &tmp)
            .map_err(|e| format!("copying {} to {}: {e}", src.display(), tmp.display()))?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
    }
    if let Err(e) = fs::rename(&tmp, &dest) {
        let _ = fs::remove_file(&tmp);
        // Another racer's rename won with the same content: as good.
        if !fs::metadata(&dest).is_ok_and(|m| m.len() == meta.size()) {
            return Err(format!("{}: {e}", dest.display()));
        }
    }
    prune(stage, &entry);
    Ok(dest)
}

/// Creates the stage (and the directories it needs) root-owned and 0755, and refuses one that is
/// not root-owned or is writable by others (a pod's uid could swap a binary in it).
fn make_stage(stage: &Path) -> Result<(), String> {
    if !stage.is_absolute() {
        return Err(format!("{} is not an absolute path", stage.display()));
    }
    if under_tmp(stage) {
        return Err(format!(
            "{} is under /tmp, which Kuma's sidecar covers with its own emptyDir",
            stage.display()
        ));
    }
    if !stage.exists() {
        let mut missing: Vec<&Path> = stage.ancestors().take_while(|d| !d.exists()).collect();
        fs::create_dir_all(stage).map_err(|e| format!("{}: {e}", stage.display()))?;
        missing.reverse();
        for d in missing {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("{}: {e}", d.display()))?;
        }
    }
    let meta = fs::metadata(stage).map_err(|e| format!("{}: {e}", stage.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", stage.display()));
    }
    if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} must be owned by root and writable only by it (it is uid {}, mode {:04o})",
            stage.display(),
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Marks an entry used now (its directory's modification time).
fn touch(entry: &Path) {
    if let Ok(f) = fs::File::open(entry) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// Removes entries other than `keep` not used for [`PRUNE_AFTER`].
fn prune(stage: &Path, keep: &Path) {
    let Ok(entries) = fs::read_dir(stage) else {
        return;
    };
    let now = SystemTime::now();
    for e in entries.flatten() {
        let p = e.path();
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| now.duration_since(t).is_ok_and(|age| age > PRUNE_AFTER));
        if p != keep && old && p.is_dir() {
            let _ = fs::remove_dir_all(&p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(label: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("hf-reach-{label}-{}", super::super::random_hex(4)));
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn mode(p: &Path, m: u32) {
        fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
    }

    #[test]
    fn a_0700_parent_is_named_with_its_mode() {
        let d = scratch("home");
        let home = d.join("home");
        fs::create_dir(&home).unwrap();
        let bin = home.join("envoy");
        fs::write(&bin, b"#!/bin/true\n").unwrap();
        mode(&bin, 0o755);
        mode(&home, 0o700);
        let owner = fs::metadata(&home).unwrap().uid();
        let other = if owner == 4242 { 4243 } else { 4242 };
        let why = reachable(&bin, other, other, Need::Exec).unwrap_err();
        assert!(
            why.contains(&home.display().to_string()) && why.contains("0700"),
            "{why}"
        );
        // The owner and root get through.
        reachable(&bin, owner, owner, Need::Exec).unwrap();
        reachable(&bin, 0, 0, Need::Exec).unwrap();
        mode(&home, 0o755);
        reachable(&bin, other, other, Need::Exec).unwrap();
        // A file the uid may run but not read.
        mode(&bin, 0o711);
        assert!(reachable(&bin, other, other, Need::Read).is_err());
        reachable(&bin, other, other, Need::Exec).unwrap();
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn group_bits_apply_to_the_group_only() {
        let d = scratch("group");
        let f = d.join("f");
        fs::write(&f, b"x").unwrap();
        mode(&f, 0o640);
        let m = fs::metadata(&f).unwrap();
        let stranger = 4242 + (m.uid() == 4242) as u32 * 2;
        assert!(reachable(&f, stranger, m.gid(), Need::Read).is_ok());
        assert!(reachable(&f, stranger, m.gid() + 1, Need::Read).is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    /// The tests of one binary stage the same file at once: every one gets it (a clean-up of
    /// a shared temporary name once removed another's copy before its rename: "No such file").
    #[test]
    fn staging_the_same_file_at_once_works_for_every_caller() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!(
                "SKIPPED staging_the_same_file_at_once_works_for_every_caller: the stage is root's"
            );
            return;
        }
        let d = scratch("race");
        let src = d.join("module.wasm");
        fs::write(&src, vec![7u8; 1 << 20]).unwrap();
        mode(&src, 0o600); // not readable by others: copied, not linked
        let stage = Path::new("/var/lib/holdfast-tests")
            .join(format!("race-{}", super::super::random_hex(4)));
        let got: Vec<Result<PathBuf, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| stage_file(&src, &stage)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let _ = fs::remove_dir_all(&stage);
        fs::remove_dir_all(&d).unwrap();
        for g in &got {
            assert!(g.is_ok(), "{got:?}");
        }
    }

    #[test]
    fn the_stage_refuses_tmp_and_relative_paths() {
        assert!(make_stage(Path::new("/tmp/holdfast-stage"))
            .unwrap_err()
            .contains("/tmp"));
        assert!(make_stage(Path::new("stage"))
            .unwrap_err()
            .contains("absolute"));
    }
}
