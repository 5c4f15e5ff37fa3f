//! One image layer: a tar of files, built so that the same files always give the same bytes.
//!
//! What would make two builds of the same files differ is fixed here: entries are written in
//! path order (parents first), every entry's mtime is the build's epoch
//! (`SOURCE_DATE_EPOCH`, reproducible-builds.org), owner and group are 0 with no names, modes
//! are normalised (0755 for directories and anything executable, 0644 otherwise; `/tmp` 1777),
//! and the gzip stream carries no file name or time. Parent directories are added for every
//! entry. Paths are relative (`usr/bin/x`), as the OCI layer spec's examples and Docker write
//! them (opencontainers/image-spec `layer.md`).

use std::collections::BTreeMap;
use std::io::Write;

use crate::Error;

/// What a layer entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir { mode: u32 },
    File { data: Vec<u8>, mode: u32 },
    Symlink { target: String },
}

/// The files of one layer, by path.
#[derive(Debug, Clone, Default)]
pub struct LayerBuilder {
    entries: BTreeMap<String, Entry>,
}

/// A finished layer: its tar and gzip bytes.
#[derive(Debug, Clone)]
pub struct Layer {
    /// The uncompressed tar (its sha256 is the layer's `diff_id`).
    pub tar: Vec<u8>,
    /// The gzip-compressed tar (what a registry stores; its sha256 is the layer's digest).
    pub gzip: Vec<u8>,
}

/// A normalised mode: executables (any x bit) 0755, others 0644.
pub fn file_mode(mode: u32) -> u32 {
    if mode & 0o111 != 0 {
        0o755
    } else {
        0o644
    }
}

fn clean(path: &str) -> Result<String, Error> {
    let p = path.trim_start_matches('/').trim_end_matches('/');
    if p.is_empty() || p.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(Error::Input(format!(
            "layer path {path:?}: must be a plain relative path (no '.', '..' or empty parts)"
        )));
    }
    Ok(p.to_string())
}

impl LayerBuilder {
    pub fn new() -> LayerBuilder {
        LayerBuilder::default()
    }

    /// Adds a directory (and its parents).
    pub fn dir(&mut self, path: &str, mode: u32) -> Result<&mut Self, Error> {
        let p = clean(path)?;
        self.parents(&p)?;
        self.insert(p, Entry::Dir { mode })
    }

    /// Adds a regular file with `data`; `mode` is normalised ([`file_mode`]).
    pub fn file(&mut self, path: &str, data: Vec<u8>, mode: u32) -> Result<&mut Self, Error> {
        let p = clean(path)?;
        self.parents(&p)?;
        let mode = file_mode(mode);
        self.insert(p, Entry::File { data, mode })
    }

    /// Adds a symbolic link to `target` (kept as written: relative or absolute).
    pub fn symlink(&mut self, path: &str, target: &str) -> Result<&mut Self, Error> {
        let p = clean(path)?;
        if target.is_empty() {
            return Err(Error::Input(format!(
                "symlink {path:?} has an empty target"
            )));
        }
        self.parents(&p)?;
        self.insert(
            p,
            Entry::Symlink {
                target: target.to_string(),
            },
        )
    }

    /// Whether `path` is in the layer.
    pub fn contains(&self, path: &str) -> bool {
        clean(path).is_ok_and(|p| self.entries.contains_key(&p))
    }

    /// The entries, in the order they are written.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.entries.iter().map(|(p, e)| (p.as_str(), e))
    }

    fn parents(&mut self, path: &str) -> Result<(), Error> {
        let mut at = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(part);
            match self.entries.get(&at) {
                None => {
                    self.entries.insert(at.clone(), Entry::Dir { mode: 0o755 });
                }
                Some(Entry::Dir { .. }) => {}
                Some(other) => {
                    return Err(Error::Input(format!(
                        "{path}: its parent {at} is already a {}",
                        kind(other)
                    )))
                }
            }
        }
        Ok(())
    }

    fn insert(&mut self, path: String, entry: Entry) -> Result<&mut Self, Error> {
        match self.entries.get(&path) {
            Some(old) if *old == entry => {}
            // A directory added implicitly as a parent may be given its mode later.
            Some(Entry::Dir { .. }) if matches!(entry, Entry::Dir { .. }) => {}
            Some(old) => {
                return Err(Error::Input(format!(
                    "{path} is added twice, as a {} and as a {}",
                    kind(old),
                    kind(&entry)
                )))
            }
            None => {}
        }
        self.entries.insert(path, entry);
        Ok(self)
    }

    /// Writes the tar (entries in path order, mtime `epoch`) and compresses it.
    pub fn build(&self, epoch: u64) -> Result<Layer, Error> {
        let mut out = tar::Builder::new(Vec::new());
        for (path, entry) in &self.entries {
            let mut h = tar::Header::new_ustar();
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(epoch);
            let data: &[u8] = match entry {
                Entry::Dir { mode } => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(*mode);
                    h.set_size(0);
                    set_path(&mut h, &format!("{path}/"))?;
                    &[]
                }
                Entry::File { data, mode } => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(*mode);
                    h.set_size(data.len() as u64);
                    set_path(&mut h, path)?;
                    data
                }
                Entry::Symlink { target } => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_mode(0o777);
                    h.set_size(0);
                    set_path(&mut h, path)?;
                    h.set_link_name(target)
                        .map_err(|e| Error::Input(format!("symlink {path} -> {target}: {e}")))?;
                    &[]
                }
            };
            h.set_cksum();
            out.append(&h, data).map_err(Error::Io)?;
        }
        let tar = out.into_inner().map_err(Error::Io)?;
        let gzip = gzip(&tar)?;
        Ok(Layer { tar, gzip })
    }
}

fn set_path(h: &mut tar::Header, path: &str) -> Result<(), Error> {
    h.set_path(path)
        .map_err(|e| Error::Input(format!("layer path {path}: {e}")))
}

fn kind(e: &Entry) -> &'static str {
    match e {
        Entry::Dir { .. } => "directory",
        Entry::File { .. } => "file",
        Entry::Symlink { .. } => "symlink",
    }
}

/// gzip with no name, no time and a fixed level: the same input always gives the same bytes
/// (for one version of flate2's backend, which Cargo.lock pins).
pub fn gzip(data: &[u8]) -> Result<Vec<u8>, Error> {
    let mut enc = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::new(6));
    enc.write_all(data).map_err(Error::Io)?;
    enc.finish().map_err(Error::Io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(tar: &[u8]) -> Vec<(String, u64, u32, u64)> {
        let mut a = tar::Archive::new(tar);
        a.entries()
            .expect("entries")
            .map(|e| {
                let e = e.expect("entry");
                let h = e.header();
                (
                    e.path().expect("path").to_string_lossy().into_owned(),
                    h.mtime().expect("mtime"),
                    h.mode().expect("mode"),
                    h.uid().expect("uid"),
                )
            })
            .collect()
    }

    #[test]
    fn same_files_in_any_order_give_the_same_bytes() {
        let mut a = LayerBuilder::new();
        a.file("usr/bin/b", b"b".to_vec(), 0o700).unwrap();
        a.symlink("bin", "usr/bin").unwrap();
        a.file("usr/bin/a", b"a".to_vec(), 0o640).unwrap();
        let mut b = LayerBuilder::new();
        b.file("usr/bin/a", b"a".to_vec(), 0o600).unwrap();
        b.symlink("bin", "usr/bin").unwrap();
        b.file("/usr/bin/b", b"b".to_vec(), 0o755).unwrap();
        let (la, lb) = (a.build(7).unwrap(), b.build(7).unwrap());
        assert_eq!(la.tar, lb.tar);
        assert_eq!(la.gzip, lb.gzip);
        let entries = names(&la.tar);
        let paths: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(paths, ["bin", "usr/", "usr/bin/", "usr/bin/a", "usr/bin/b"]);
        assert!(entries.iter().all(|e| e.1 == 7 && e.3 == 0));
        assert_eq!(entries[3].2, 0o644);
        assert_eq!(entries[4].2, 0o755);
        // Another epoch, other bytes: the epoch is an input.
        assert_ne!(a.build(8).unwrap().tar, la.tar);
    }

    #[test]
    fn refuses_escaping_paths_and_conflicts() {
        let mut l = LayerBuilder::new();
        assert!(l.file("../etc/passwd", vec![], 0o644).is_err());
        assert!(l.file("a/./b", vec![], 0o644).is_err());
        l.file("a/b", vec![], 0o644).unwrap();
        let err = l.file("a/b/c", vec![], 0o644).unwrap_err().to_string();
        assert!(err.contains("a/b"), "{err}");
        assert!(l.symlink("a", "x").is_err(), "a is a directory");
        // The same entry twice is fine; a different one is not.
        l.file("a/b", vec![], 0o644).unwrap();
        assert!(l.file("a/b", vec![1], 0o644).is_err());
    }
}
