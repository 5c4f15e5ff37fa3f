//! The Debian packages the agent image takes its run-time files from (iptables and the shared
//! libraries), pinned per architecture in `image/agent-debs.lock` (amd64) and
//! `image/agent-debs-arm64.lock` by version and by the `.deb` file's sha256, so an image's
//! content depends on that file and never on what the build machine has installed.
//!
//! Packages are fetched with `apt-get download <name>:<arch>=<version>` (apt checks them against
//! the archive's signed index; a foreign architecture needs `dpkg --add-architecture arm64` and
//! `apt-get update` first, which `just setup` does), kept in a cache directory (`target/image/debs`), checked against the
//! lock and unpacked with `dpkg-deb -x`. A version the archive no longer carries (Debian keeps
//! the newest of a release and its security updates) fails with the fix: `just image-lock`.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest as _, Sha256};

use crate::arch::Arch;
use crate::layout::hex;
use crate::Error;

/// The amd64 lock file, in the workspace (each architecture's: [`Arch::lock_file`]).
pub const LOCK_FILE: &str = "image/agent-debs.lock";

/// The packages the agent image needs, for `just image-lock`: iptables (its nf_tables
/// `xtables-nft-multi` and extensions) and every library the image's ELF files link
/// (`crate::agent` fails naming any library none of these provides), and the licences.
pub const PACKAGES: [&str; 9] = [
    "iptables",
    "libxtables12",
    "libnftnl11",
    "libmnl0",
    "libnetfilter-conntrack3",
    "libnfnetlink0",
    "libc6",
    "libgcc-s1",
    // Only for its copyright file, which libgcc-s1's doc directory links to.
    "gcc-12-base",
];

/// One pinned package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedDeb {
    pub name: String,
    pub version: String,
    /// sha256 of the `.deb` file, hex.
    pub sha256: String,
    /// The package's architecture (its lock file's).
    pub arch: Arch,
}

impl PinnedDeb {
    /// The file name `apt-get download` gives it (an epoch's `:` is written `%3a`).
    pub fn file_name(&self) -> String {
        format!(
            "{}_{}_{}.deb",
            self.name,
            self.version.replace(':', "%3a"),
            self.arch
        )
    }

    /// `name=version`, as the image's label lists it.
    pub fn spec(&self) -> String {
        format!("{}={}", self.name, self.version)
    }

    /// `name:arch=version`, as apt takes it.
    pub fn apt_spec(&self) -> String {
        format!("{}:{}={}", self.name, self.arch, self.version)
    }
}

/// The parsed lock file of one architecture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebLock {
    pub arch: Arch,
    pub debs: Vec<PinnedDeb>,
}

impl DebLock {
    /// Parses `name version sha256` lines (`#` comments, blank lines ignored) of the amd64 lock.
    pub fn parse(text: &str, origin: &str) -> Result<DebLock, Error> {
        DebLock::parse_for(text, origin, Arch::Amd64)
    }

    /// Parses the lock of `arch`.
    pub fn parse_for(text: &str, origin: &str, arch: Arch) -> Result<DebLock, Error> {
        let mut debs = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let parts: Vec<&str> = line.split_whitespace().collect();
            let [name, version, sha256] = parts.as_slice() else {
                return Err(Error::Input(format!(
                    "{origin}:{}: expected `name version sha256`, got {line:?}",
                    i + 1
                )));
            };
            let valid_name = name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b));
            let valid_version = version
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.:~".contains(&b));
            if !valid_name || !valid_version || sha256.len() != 64 {
                return Err(Error::Input(format!(
                    "{origin}:{}: {line:?} is not a Debian package name, version and sha256",
                    i + 1
                )));
            }
            debs.push(PinnedDeb {
                name: name.to_string(),
                version: version.to_string(),
                sha256: sha256.to_ascii_lowercase(),
                arch,
            });
        }
        if debs.is_empty() {
            return Err(Error::Input(format!("{origin}: no packages")));
        }
        Ok(DebLock { arch, debs })
    }

    /// Reads the amd64 lock.
    pub fn read(path: &Path) -> Result<DebLock, Error> {
        DebLock::read_for(path, Arch::Amd64)
    }

    /// Reads the lock of `arch`.
    pub fn read_for(path: &Path, arch: Arch) -> Result<DebLock, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::File {
            what: format!("reading {}", path.display()),
            source,
        })?;
        DebLock::parse_for(&text, &path.display().to_string(), arch)
    }

    /// The lock file's text.
    pub fn render(&self) -> String {
        let mut out = format!(
            "# The Debian packages (bookworm, {}) the agent image takes its files from: name, version,\n\
             # sha256 of the .deb. Read by `just image` and the tests' image build (image/src/debs.rs);\n\
             # rewritten from the archive's current versions by `just image-lock`.\n",
            self.arch
        );
        for d in &self.debs {
            out.push_str(&format!("{} {} {}\n", d.name, d.version, d.sha256));
        }
        out
    }
}

fn sha256_file(path: &Path) -> Result<String, Error> {
    let data = std::fs::read(path).map_err(|source| Error::File {
        what: format!("reading {}", path.display()),
        source,
    })?;
    Ok(hex(&Sha256::digest(&data)))
}

/// Runs a program with fixed arguments (never a shell string).
pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<String, Error> {
    let out = cmd.output().map_err(|source| Error::File {
        what: format!("running {what}"),
        source,
    })?;
    if !out.status.success() {
        return Err(Error::Command {
            what: what.to_string(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn apt_download(spec: &str, dir: &Path) -> Result<(), Error> {
    let foreign = spec
        .split_once(':')
        .is_some_and(|(_, rest)| !rest.starts_with(Arch::Amd64.name()));
    // As root apt drops to `_apt` for downloads, which cannot write a directory it does not
    // own: download as the caller instead.
    run(
        Command::new("apt-get")
            .args(["-q", "-o", "APT::Sandbox::User=root", "download", spec])
            .current_dir(dir),
        &format!("apt-get download {spec}"),
    )
    .map(|_| ())
    .map_err(|e| match e {
        Error::Command { stderr, .. } => Error::Input(format!(
            "apt-get download {spec} failed: {stderr}\n\
             fix: if apt has no package lists, run `apt-get update`{}; if the archive no longer \
             carries this version, refresh the pins with `just image-lock` (it rewrites the lock files)",
            if foreign {
                " (for arm64 packages on an amd64 machine: `dpkg --add-architecture arm64` first, \
                 as `just setup` does)"
            } else {
                ""
            }
        )),
        other => other,
    })
}

/// The pinned `.deb` files in `cache`, downloading those missing; each checked against the lock.
pub fn fetch(lock: &DebLock, cache: &Path) -> Result<Vec<PathBuf>, Error> {
    std::fs::create_dir_all(cache).map_err(|source| Error::File {
        what: format!("creating {}", cache.display()),
        source,
    })?;
    let mut out = Vec::new();
    for d in &lock.debs {
        let path = cache.join(d.file_name());
        if !path.is_file() {
            apt_download(&d.apt_spec(), cache)?;
        }
        if !path.is_file() {
            return Err(Error::Input(format!(
                "apt-get download {} left no {}",
                d.apt_spec(),
                path.display()
            )));
        }
        let sum = sha256_file(&path)?;
        if sum != d.sha256 {
            return Err(Error::Input(format!(
                "{}: sha256 {sum}, but {} pins {} (delete the file to download it again, \
                 or refresh the pins with `just image-lock`)",
                path.display(),
                d.arch.lock_file(),
                d.sha256
            )));
        }
        out.push(path);
    }
    Ok(out)
}

/// Unpacks `.deb` files into `dir` (`dpkg-deb -x`; nothing is installed).
pub fn extract(debs: &[PathBuf], dir: &Path) -> Result<(), Error> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|source| Error::File {
            what: format!("removing {}", dir.display()),
            source,
        })?;
    }
    std::fs::create_dir_all(dir).map_err(|source| Error::File {
        what: format!("creating {}", dir.display()),
        source,
    })?;
    for deb in debs {
        run(
            Command::new("dpkg-deb").arg("-x").arg(deb).arg(dir),
            &format!("dpkg-deb -x {}", deb.display()),
        )?;
    }
    Ok(())
}

/// A lock of the archive's current candidate versions of [`PACKAGES`] for `arch` (downloads
/// them into `cache`).
pub fn lock_current(cache: &Path, arch: Arch) -> Result<DebLock, Error> {
    let tmp = cache.join(format!("lock-current-{arch}"));
    if tmp.exists() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    std::fs::create_dir_all(&tmp).map_err(|source| Error::File {
        what: format!("creating {}", tmp.display()),
        source,
    })?;
    let mut debs = Vec::new();
    for name in PACKAGES {
        apt_download(&format!("{name}:{arch}"), &tmp)?;
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&tmp)
        .map_err(|source| Error::File {
            what: format!("listing {}", tmp.display()),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    files.sort();
    for f in files {
        let field = |name: &str| -> Result<String, Error> {
            Ok(run(
                Command::new("dpkg-deb").arg("-f").arg(&f).arg(name),
                &format!("dpkg-deb -f {} {name}", f.display()),
            )?
            .trim()
            .to_string())
        };
        let deb = PinnedDeb {
            name: field("Package")?,
            version: field("Version")?,
            sha256: sha256_file(&f)?,
            arch: Arch::parse(&field("Architecture")?)?,
        };
        let dest = cache.join(deb.file_name());
        std::fs::rename(&f, &dest).map_err(|source| Error::File {
            what: format!("moving {}", f.display()),
            source,
        })?;
        debs.push(deb);
    }
    let _ = std::fs::remove_dir_all(&tmp);
    debs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(DebLock { arch, debs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_parses_and_renders_back() {
        let text = format!(
            "# comment\n\niptables 1.8.9-2 {}\nlibc6 2.36-9+deb12u14 {}\n",
            "a".repeat(64),
            "B".repeat(64)
        );
        let lock = DebLock::parse(&text, "x").unwrap();
        assert_eq!(lock.debs.len(), 2);
        assert_eq!(lock.debs[1].sha256, "b".repeat(64));
        assert_eq!(lock.debs[0].file_name(), "iptables_1.8.9-2_amd64.deb");
        assert_eq!(DebLock::parse(&lock.render(), "y").unwrap(), lock);
        let epoch = PinnedDeb {
            name: "x".into(),
            version: "1:2.0-1".into(),
            sha256: String::new(),
            arch: Arch::Arm64,
        };
        assert_eq!(epoch.file_name(), "x_1%3a2.0-1_arm64.deb");
        assert_eq!(epoch.apt_spec(), "x:arm64=1:2.0-1");
        assert_eq!(epoch.spec(), "x=1:2.0-1");
    }

    #[test]
    fn bad_lines_name_the_line() {
        for bad in [
            "iptables 1.8.9-2",
            "iptables 1.8.9-2 abc",
            "ipt;ables 1.8.9-2 aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "",
        ] {
            let err = DebLock::parse(bad, "lock").unwrap_err().to_string();
            assert!(err.contains("lock"), "{bad:?}: {err}");
        }
    }

    /// Each lock pins exactly the packages `just image-lock` pins, and both architectures the
    /// same versions (one Debian release: the images differ in the CPU only).
    #[test]
    fn the_committed_locks_pin_exactly_the_packages() {
        let read = |arch: Arch| {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(arch.lock_file());
            DebLock::read_for(&path, arch).unwrap()
        };
        let mut versions = Vec::new();
        for arch in Arch::ALL {
            let lock = read(arch);
            let mut names: Vec<&str> = lock.debs.iter().map(|d| d.name.as_str()).collect();
            names.sort();
            let mut expected = PACKAGES.to_vec();
            expected.sort();
            assert_eq!(names, expected, "{arch}");
            let mut v: Vec<(String, String)> = lock
                .debs
                .iter()
                .map(|d| (d.name.clone(), d.version.clone()))
                .collect();
            v.sort();
            versions.push(v);
        }
        assert_eq!(
            versions[0], versions[1],
            "amd64 and arm64 pin the same versions"
        );
        assert_eq!(
            read(Arch::Amd64),
            DebLock::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("agent-debs.lock")).unwrap()
        );
    }
}
