//! A pods directory: one Pod object per file (JSON, or YAML for `.yaml`/`.yml`), like kubelet's
//! static pods. A rewritten file is an updated pod, a removed file a deleted pod. Dotfiles are
//! ignored, so writers can write a dotfile and rename it into place atomically.
//!
//! The directory is polled: a listing plus one `stat` per file per tick, and a file is re-read
//! only when its identity (inode, size, mtime) changed. A file that does not parse is reported
//! once per change and otherwise ignored: the pod it described keeps its last good state.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;

use super::PodEvent;

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

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    ino: u64,
    len: u64,
    mtime: Option<SystemTime>,
}

#[derive(Debug)]
struct Known {
    stamp: FileStamp,
    /// uid of the last object that parsed from this file, if any.
    uid: Option<String>,
}

/// Reads and follows a pods directory.
#[derive(Debug)]
pub struct PodsDir {
    dir: PathBuf,
    known: HashMap<PathBuf, Known>,
}

impl PodsDir {
    /// Opens `dir`; fails when it cannot be listed.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        std::fs::read_dir(&dir).map_err(|source| Error::ReadDir {
            path: dir.clone(),
            source,
        })?;
        Ok(Self {
            dir,
            known: HashMap::new(),
        })
    }

    /// One pass: the events since the previous pass (all pods on the first pass).
    pub fn poll(&mut self) -> Result<Vec<PodEvent>> {
        let entries = std::fs::read_dir(&self.dir).map_err(|source| Error::ReadDir {
            path: self.dir.clone(),
            source,
        })?;
        let mut seen = HashMap::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') || !is_pod_file(name) {
                continue;
            }
            // The file may vanish between listing and stat: it is then simply not seen.
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            use std::os::unix::fs::MetadataExt;
            let stamp = FileStamp {
                ino: meta.ino(),
                len: meta.len(),
                mtime: meta.modified().ok(),
            };
            seen.insert(entry.path(), stamp);
        }

        let mut events = Vec::new();
        // Removed files first, so a pod re-created under another file name reads as delete+add.
        let gone: Vec<PathBuf> = self
            .known
            .keys()
            .filter(|p| !seen.contains_key(*p))
            .cloned()
            .collect();
        for path in gone {
            if let Some(Known { uid: Some(uid), .. }) = self.known.remove(&path) {
                events.push(PodEvent::Deleted { uid });
            }
        }
        let mut paths: Vec<_> = seen.into_iter().collect();
        paths.sort_by(|a, b| a.0.cmp(&b.0));
        for (path, stamp) in paths {
            if self.known.get(&path).is_some_and(|k| k.stamp == stamp) {
                continue;
            }
            let previous_uid = self.known.get(&path).and_then(|k| k.uid.clone());
            let uid = match read_pod(&path) {
                Ok(pod) => {
                    let uid = pod.metadata.uid.clone();
                    if previous_uid.is_some() && previous_uid != uid {
                        // Same file, different pod: the old one is gone.
                        events.push(PodEvent::Deleted {
                            uid: previous_uid.clone().unwrap_or_default(),
                        });
                    }
                    events.push(PodEvent::Applied(Box::new(pod)));
                    uid
                }
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "ignoring pod file that does not parse; the pod keeps its last good state");
                    previous_uid
                }
            };
            self.known.insert(path, Known { stamp, uid });
        }
        Ok(events)
    }

    /// Polls every `interval` and sends events until the receiver is dropped. A directory that
    /// becomes unreadable is logged and retried; pods are not reported deleted because of it.
    pub async fn run(mut self, interval: Duration, tx: mpsc::Sender<PodEvent>) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        let mut synced = false;
        loop {
            tick.tick().await;
            match self.poll() {
                Ok(events) => {
                    failing = false;
                    // After the first full scan: the agent is ready (`/readyz`).
                    let first = (!synced).then_some(PodEvent::Synced);
                    synced = true;
                    for ev in events.into_iter().chain(first) {
                        if tx.send(ev).await.is_err() {
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
        }
    }
}

fn is_pod_file(name: &str) -> bool {
    name.ends_with(".json") || name.ends_with(".yaml") || name.ends_with(".yml")
}

/// Largest pod file read; real Pod objects are a few KiB.
const MAX_POD_FILE: u64 = 4 << 20;

fn read_pod(path: &Path) -> std::result::Result<Pod, String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if meta.len() > MAX_POD_FILE {
        return Err(format!(
            "file is {} bytes, larger than {MAX_POD_FILE}",
            meta.len()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let pod: Pod = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).map_err(|e| format!("invalid Pod JSON: {e}"))?
    } else {
        serde_yaml::from_str(&text).map_err(|e| format!("invalid Pod YAML: {e}"))?
    };
    if pod.metadata.uid.as_deref().unwrap_or("").is_empty() {
        return Err("Pod has no metadata.uid".into());
    }
    Ok(pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TempDir(PathBuf);
    impl TempDir {
        fn new(name: &str) -> Self {
            let p = std::env::temp_dir().join(format!("hf-podsdir-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn pod(uid: &str, name: &str) -> String {
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": "app"}]}})
        .to_string()
    }

    fn write_atomic(dir: &Path, name: &str, text: &str) {
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
    }

    fn applied_names(events: &[PodEvent]) -> Vec<String> {
        events
            .iter()
            .filter_map(|e| match e {
                PodEvent::Applied(p) => p.metadata.name.clone(),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn follows_adds_updates_and_deletes() {
        let d = TempDir::new("follow");
        write_atomic(&d.0, "a.json", &pod("u-a", "a"));
        std::fs::write(d.0.join(".b.json"), pod("u-b", "b")).unwrap(); // dotfile: ignored
        std::fs::write(d.0.join("notes.txt"), "x").unwrap(); // not a pod file
        let mut src = PodsDir::new(&d.0).unwrap();
        assert_eq!(applied_names(&src.poll().unwrap()), ["a"]);
        assert!(src.poll().unwrap().is_empty(), "unchanged: no events");

        write_atomic(
            &d.0,
            "a.json",
            &pod("u-a", "a").replace("\"ns\"", "\"ns2\""),
        );
        let ev = src.poll().unwrap();
        assert_eq!(applied_names(&ev), ["a"]);

        std::fs::write(
            d.0.join("c.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata: {name: c, uid: u-c}\nspec: {containers: [{name: x}]}\n",
        )
        .unwrap();
        assert_eq!(applied_names(&src.poll().unwrap()), ["c"]);

        std::fs::remove_file(d.0.join("a.json")).unwrap();
        let ev = src.poll().unwrap();
        assert!(matches!(&ev[..], [PodEvent::Deleted { uid }] if uid == "u-a"));
    }

    #[test]
    fn bad_files_are_reported_not_fatal() {
        let d = TempDir::new("bad");
        std::fs::write(d.0.join("a.json"), "{ not json").unwrap();
        std::fs::write(d.0.join("b.json"), r#"{"metadata": {"name": "b"}}"#).unwrap(); // no uid
        std::fs::write(d.0.join("c.json"), pod("u-c", "c")).unwrap();
        let mut src = PodsDir::new(&d.0).unwrap();
        assert_eq!(applied_names(&src.poll().unwrap()), ["c"]);

        // A good pod whose file turns bad keeps its last state: no delete event.
        write_atomic(&d.0, "c.json", "garbage");
        assert!(src.poll().unwrap().is_empty());
        // ...and removing that file deletes the last good pod.
        std::fs::remove_file(d.0.join("c.json")).unwrap();
        let ev = src.poll().unwrap();
        assert!(matches!(&ev[..], [PodEvent::Deleted { uid }] if uid == "u-c"));
    }

    #[test]
    fn missing_dir_names_the_flag() {
        let e = PodsDir::new("/nonexistent/holdfast-pods").unwrap_err();
        assert!(e.to_string().contains("--pods-dir"), "{e}");
    }
}
