//! The agent's image: the `holdfast` binary and exactly what it runs, nothing else (no shell,
//! no package manager).
//!
//! The agent executes only `iptables`, `iptables-restore`, `ip6tables` and `ip6tables-restore`
//! (node-agent/src/effects/hold/rules.rs, `RuleSpec::default`; the netns runner in
//! node-agent/src/effects/netns.rs is the only `Command` of the agent). In the image they are
//! Debian's nf_tables multi-call binary `xtables-nft-multi` under those names — the names
//! Debian's `iptables-nft` alternatives point at — with every xtables extension (`libxt_*.so`:
//! the hold writes `NFQUEUE`, `owner`, `comment`, `tcp`, `udp`; reading a pod's rules back with
//! `iptables -S` must parse whatever Istio and CNI plugins wrote there too).
//!
//! Two layers, so a new agent build changes only the second:
//! 1. the run time, from the Debian packages pinned in `image/agent-debs.lock` ([`crate::debs`]):
//!    `xtables-nft-multi`, the extensions, the shared libraries every ELF file of the image
//!    needs (found from their `DT_NEEDED` entries and the program interpreter, so nothing is
//!    listed by hand), the packages' copyright files, Debian's merged-`/usr` links (`/lib` →
//!    `usr/lib`…) and empty `/proc`, `/sys`, `/dev`, `/run`, `/tmp` mount points;
//! 2. `/usr/local/bin/holdfast`.
//!
//! One image per architecture ([`Arch`]: amd64 and arm64), each from its own binary and its own
//! lock of the same Debian packages; [`build_index`] writes them as one OCI image index, each
//! manifest under its platform, so a runtime pulls the one for its node's CPU (containerd
//! resolves an index by platform; a single manifest it pulls whatever its architecture). Every
//! ELF file of an image is checked to be of that image's machine.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use object::read::elf::{FileHeader, ProgramHeader};
use serde_json::{json, Value};

use crate::arch::{self, Arch};
use crate::debs::{self, DebLock};
use crate::layer::{Layer, LayerBuilder};
use crate::layout::{image_config, BuiltImage, ManifestLayer, OciLayout, OCI_CONFIG};
use crate::Error;

/// Where the agent's binary sits in the image (the DaemonSet runs the image's entrypoint).
pub const AGENT_PATH: &str = "usr/local/bin/holdfast";
/// The names the agent runs iptables by, all `xtables-nft-multi` (it dispatches on `argv[0]`).
pub const IPTABLES_NAMES: [&str; 12] = [
    "iptables",
    "iptables-restore",
    "iptables-save",
    "ip6tables",
    "ip6tables-restore",
    "ip6tables-save",
    "iptables-nft",
    "iptables-nft-restore",
    "iptables-nft-save",
    "ip6tables-nft",
    "ip6tables-nft-restore",
    "ip6tables-nft-save",
];
/// `PATH` in the image.
pub const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What an agent image is built from.
#[derive(Debug, Clone)]
pub struct AgentInputs<'a> {
    /// The `holdfast` binary (release for `just image`, the test profile's for the tests), of
    /// the lock's architecture.
    pub binary: &'a Path,
    /// The pinned Debian packages; their architecture is the image's.
    pub lock: &'a DebLock,
    /// Where the `.deb` files are kept (downloaded when missing).
    pub deb_cache: &'a Path,
    /// Scratch space (the packages are unpacked here).
    pub work: &'a Path,
    /// The image's version label (the workspace version).
    pub version: &'a str,
    /// Every file's mtime and the config's `created` (`SOURCE_DATE_EPOCH`).
    pub epoch: u64,
}

/// The two layers of the agent image, before they are written.
pub struct AgentLayers {
    pub runtime: Layer,
    pub agent: Layer,
    /// The files of the run-time layer (path → what), for reports and tests.
    pub runtime_paths: Vec<String>,
}

/// What an ELF file needs from the dynamic linker.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ElfNeeds {
    /// `DT_NEEDED` sonames (`libc.so.6`).
    pub needed: Vec<String>,
    /// `PT_INTERP` (`/lib64/ld-linux-x86-64.so.2`), for executables.
    pub interpreter: Option<String>,
}

/// Reads an ELF file's `DT_NEEDED` entries and interpreter; `Ok(None)` if it is not ELF.
pub fn elf_needs(data: &[u8]) -> Result<Option<ElfNeeds>, Error> {
    if !data.starts_with(b"\x7fELF") {
        return Ok(None);
    }
    let bad = |e: object::read::Error| Error::Input(format!("not a readable 64-bit ELF: {e}"));
    let header = object::elf::FileHeader64::<object::Endianness>::parse(data).map_err(bad)?;
    let endian = header.endian().map_err(bad)?;
    let mut needs = ElfNeeds::default();
    for ph in header.program_headers(endian, data).map_err(bad)? {
        if let Some(interp) = ph.interpreter(endian, data).map_err(bad)? {
            needs.interpreter = Some(String::from_utf8_lossy(interp).into_owned());
        }
    }
    let sections = header.sections(endian, data).map_err(bad)?;
    let dynamic = sections.dynamic_table(endian, data).map_err(bad)?;
    for d in dynamic.iter() {
        if d.tag == object::elf::DT_NEEDED {
            let name = dynamic.string(d).map_err(bad)?;
            needs
                .needed
                .push(String::from_utf8_lossy(name).into_owned());
        }
    }
    Ok(Some(needs))
}

/// The unpacked packages, with Debian's merged-`/usr` applied to their paths (`lib/…` is
/// `usr/lib/…`), as (path → entry on disk).
struct Unpacked {
    root: PathBuf,
    /// Image path → path under `root`.
    files: BTreeMap<String, PathBuf>,
}

impl Unpacked {
    fn scan(root: &Path) -> Result<Unpacked, Error> {
        let mut files = BTreeMap::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let entries = std::fs::read_dir(&dir).map_err(|source| Error::File {
                what: format!("listing {}", dir.display()),
                source,
            })?;
            for e in entries {
                let e = e.map_err(|source| Error::File {
                    what: format!("listing {}", dir.display()),
                    source,
                })?;
                let path = e.path();
                let meta = std::fs::symlink_metadata(&path).map_err(|source| Error::File {
                    what: format!("stat {}", path.display()),
                    source,
                })?;
                if meta.is_dir() {
                    stack.push(path);
                    continue;
                }
                let rel = path
                    .strip_prefix(root)
                    .map_err(|e| Error::Input(e.to_string()))?
                    .to_string_lossy()
                    .into_owned();
                files.insert(merged_usr(&rel), path);
            }
        }
        Ok(Unpacked {
            root: root.to_path_buf(),
            files,
        })
    }

    fn get(&self, path: &str) -> Option<&PathBuf> {
        self.files.get(path.trim_start_matches('/'))
    }
}

/// Debian's merged `/usr`: `/bin`, `/sbin`, `/lib`, `/lib64` are links into `/usr`.
fn merged_usr(path: &str) -> String {
    for top in ["bin/", "sbin/", "lib/", "lib64/"] {
        if path.starts_with(top) {
            return format!("usr/{path}");
        }
    }
    path.to_string()
}

/// Fails unless `data` (an ELF file, `what`) is built for `arch`.
fn check_machine(data: &[u8], arch: Arch, what: &str) -> Result<(), Error> {
    match arch::elf_machine(data) {
        Some(m) if m == arch.elf_machine() => Ok(()),
        Some(m) => Err(Error::Input(format!(
            "{what} is an ELF file for machine {m} ({}), not {arch} (machine {}): build it for {} \
             (`cargo build --target {}`)",
            Arch::of_elf_machine(m).map_or("another architecture", Arch::name),
            arch.elf_machine(),
            arch,
            arch.rust_target()
        ))),
        None => Err(Error::Input(format!("{what} is not a 64-bit ELF file"))),
    }
}

/// Adds `path` (an image path, resolved through the packages' symlinks) and what it links to.
fn add_with_links(
    layer: &mut LayerBuilder,
    unpacked: &Unpacked,
    path: &str,
    wanted_by: &str,
) -> Result<String, Error> {
    let mut at = merged_usr(path.trim_start_matches('/'));
    for _ in 0..16 {
        let on_disk = unpacked.get(&at).ok_or_else(|| {
            Error::Input(format!(
                "{at} (needed by {wanted_by}) is in none of the packages of {}: add the package \
                 that has it to image/src/debs.rs PACKAGES and run `just image-lock`",
                debs::LOCK_FILE
            ))
        })?;
        let meta = std::fs::symlink_metadata(on_disk).map_err(|source| Error::File {
            what: format!("stat {}", on_disk.display()),
            source,
        })?;
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(on_disk).map_err(|source| Error::File {
                what: format!("readlink {}", on_disk.display()),
                source,
            })?;
            let target = target.to_string_lossy().into_owned();
            layer.symlink(&at, &target)?;
            at = if let Some(abs) = target.strip_prefix('/') {
                merged_usr(abs)
            } else {
                let parent = Path::new(&at).parent().unwrap_or(Path::new(""));
                normalize(&parent.join(&target).to_string_lossy())
            };
            continue;
        }
        use std::os::unix::fs::PermissionsExt;
        let data = std::fs::read(on_disk).map_err(|source| Error::File {
            what: format!("reading {}", on_disk.display()),
            source,
        })?;
        layer.file(&at, data, meta.permissions().mode())?;
        return Ok(at);
    }
    Err(Error::Input(format!("{path}: too many levels of symlinks")))
}

fn normalize(p: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    merged_usr(&out.join("/"))
}

/// Adds the libraries `needs` names (and the interpreter), and theirs, to `layer`.
fn add_needed(
    layer: &mut LayerBuilder,
    unpacked: &Unpacked,
    arch: Arch,
    roots: Vec<(String, ElfNeeds)>,
) -> Result<(), Error> {
    let lib_dir = arch.lib_dir();
    let mut queue = roots;
    let mut seen: BTreeSet<String> = BTreeSet::new();
    while let Some((who, needs)) = queue.pop() {
        let mut wanted: Vec<String> = needs
            .needed
            .iter()
            .map(|soname| format!("{lib_dir}/{soname}"))
            .collect();
        wanted.extend(needs.interpreter.clone());
        for path in wanted {
            if !seen.insert(path.clone()) {
                continue;
            }
            let file = add_with_links(layer, unpacked, &path, &who)?;
            let data =
                std::fs::read(unpacked.get(&file).expect("just added")).map_err(|source| {
                    Error::File {
                        what: format!("reading {file}"),
                        source,
                    }
                })?;
            if let Some(more) =
                elf_needs(&data).map_err(|e| Error::Input(format!("{file}: {e}")))?
            {
                check_machine(&data, arch, &file)?;
                queue.push((file, more));
            }
        }
    }
    Ok(())
}

/// Builds both layers.
pub fn layers(inputs: &AgentInputs<'_>) -> Result<AgentLayers, Error> {
    let binary = std::fs::read(inputs.binary).map_err(|source| Error::File {
        what: format!(
            "reading the agent binary {} (build it: `cargo build --release -p holdfast`)",
            inputs.binary.display()
        ),
        source,
    })?;
    let agent_needs = elf_needs(&binary)?
        .ok_or_else(|| Error::Input(format!("{} is not an ELF binary", inputs.binary.display())))?;
    let arch = inputs.lock.arch;
    check_machine(
        &binary,
        arch,
        &format!("the agent binary {}", inputs.binary.display()),
    )?;
    if agent_needs.interpreter.as_deref() != Some(arch.interpreter()) {
        return Err(Error::Input(format!(
            "{}: program interpreter {:?}, not glibc's {} one {}",
            inputs.binary.display(),
            agent_needs.interpreter,
            arch,
            arch.interpreter()
        )));
    }

    let debs = debs::fetch(inputs.lock, inputs.deb_cache)?;
    let unpack_dir = inputs.work.join("debs-unpacked");
    debs::extract(&debs, &unpack_dir)?;
    let unpacked = Unpacked::scan(&unpack_dir)?;

    let mut rt = LayerBuilder::new();
    for (link, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        rt.symlink(link, target)?;
    }
    for dir in [
        "dev",
        "proc",
        "sys",
        "run",
        "etc",
        "usr/bin",
        "usr/local/bin",
    ] {
        rt.dir(dir, 0o755)?;
    }
    rt.dir("tmp", 0o1777)?;

    let mut roots = vec![("holdfast".to_string(), agent_needs)];
    let multi = add_with_links(&mut rt, &unpacked, "usr/sbin/xtables-nft-multi", "iptables")?;
    for name in IPTABLES_NAMES {
        rt.symlink(&format!("usr/sbin/{name}"), "xtables-nft-multi")?;
    }
    let read = |p: &str| -> Result<Vec<u8>, Error> {
        let on_disk = unpacked.get(p).expect("added from the packages");
        std::fs::read(on_disk).map_err(|source| Error::File {
            what: format!("reading {}", on_disk.display()),
            source,
        })
    };
    let multi_data = read(&multi)?;
    check_machine(&multi_data, arch, &multi)?;
    if let Some(n) = elf_needs(&multi_data)? {
        roots.push((multi.clone(), n));
    }
    // Every xtables extension (iptables loads them by name from this directory).
    let ext_dir = format!("{}/xtables/", arch.lib_dir());
    let extensions: Vec<String> = unpacked
        .files
        .keys()
        .filter(|p| p.starts_with(&ext_dir) && p.ends_with(".so"))
        .cloned()
        .collect();
    if extensions.is_empty() {
        return Err(Error::Input(format!(
            "no xtables extensions under {ext_dir} in the iptables package"
        )));
    }
    for ext in &extensions {
        let file = add_with_links(&mut rt, &unpacked, ext, "iptables")?;
        let data = read(&file)?;
        if let Some(n) = elf_needs(&data)? {
            check_machine(&data, arch, &file)?;
            roots.push((file, n));
        }
    }
    add_needed(&mut rt, &unpacked, arch, roots)?;
    // The licences of what the image redistributes. A package's doc directory may be a link
    // to another package's (libgcc-s1's is gcc-12-base's), which is then pinned for it.
    for d in &inputs.lock.debs {
        let doc = format!("usr/share/doc/{}", d.name);
        let doc = match unpacked.get(&doc).map(std::fs::read_link) {
            Some(Ok(target)) => {
                let target = target.to_string_lossy().into_owned();
                rt.symlink(&doc, &target)?;
                normalize(&format!("usr/share/doc/{target}"))
            }
            _ => doc,
        };
        let copyright = format!("{doc}/copyright");
        if unpacked.get(&copyright).is_none() {
            return Err(Error::Input(format!(
                "{}: no {copyright} in the pinned packages: the image must carry every \
                 redistributed package's licence",
                d.name
            )));
        }
        add_with_links(&mut rt, &unpacked, &copyright, "licence")?;
    }
    let runtime_paths = rt.entries().map(|(p, _)| p.to_string()).collect();
    let runtime = rt.build(inputs.epoch)?;

    let mut ag = LayerBuilder::new();
    ag.file(AGENT_PATH, binary, 0o755)?;
    let agent = ag.build(inputs.epoch)?;
    let _ = std::fs::remove_dir_all(&unpacked.root);
    Ok(AgentLayers {
        runtime,
        agent,
        runtime_paths,
    })
}

/// Builds the agent image of one architecture into the layout at `out`, tagged `tag`.
pub fn build(inputs: &AgentInputs<'_>, out: &Path, tag: &str) -> Result<BuiltImage, Error> {
    let layout = OciLayout::create(out)?;
    let (config, l) = config_and_layers(inputs)?;
    layout.write_image(
        tag,
        OCI_CONFIG,
        &config,
        &[
            ManifestLayer::gzip(&l.runtime),
            ManifestLayer::gzip(&l.agent),
        ],
    )
}

/// Builds the agent image of every architecture of `inputs` into one layout at `out`: each
/// image's manifest under its platform (`linux/amd64`, `linux/arm64`) in an OCI image index
/// tagged `tag`. Returns the index (its digest is what the install pins) and each image.
pub fn build_index(
    inputs: &[AgentInputs<'_>],
    out: &Path,
    tag: &str,
) -> Result<(BuiltImage, Vec<(Arch, BuiltImage)>), Error> {
    let layout = OciLayout::create(out)?;
    let mut images = Vec::new();
    let mut seen = BTreeSet::new();
    for i in inputs {
        let arch = i.lock.arch;
        if !seen.insert(arch) {
            return Err(Error::Input(format!("two agent images for {arch}")));
        }
        let (config, l) = config_and_layers(i)?;
        let built = layout.write_manifest(
            OCI_CONFIG,
            &config,
            &[
                ManifestLayer::gzip(&l.runtime),
                ManifestLayer::gzip(&l.agent),
            ],
        )?;
        images.push((arch, built));
    }
    let platforms: Vec<(Value, &BuiltImage)> = images
        .iter()
        .map(|(arch, b)| (json!({ "architecture": arch.name(), "os": "linux" }), b))
        .collect();
    let index = layout.write_index(tag, &platforms)?;
    Ok((index, images))
}

/// The image config and the layers of one architecture's image.
fn config_and_layers(inputs: &AgentInputs<'_>) -> Result<(Vec<u8>, AgentLayers), Error> {
    let l = layers(inputs)?;
    let packages: Vec<String> = inputs.lock.debs.iter().map(|d| d.spec()).collect();
    let container = json!({
        "Entrypoint": [format!("/{AGENT_PATH}")],
        "Cmd": ["--help"],
        "Env": [PATH_ENV],
        "Labels": {
            "org.opencontainers.image.title": "holdfast-agent",
            "org.opencontainers.image.version": inputs.version,
            "org.opencontainers.image.licenses": "Apache-2.0",
            "io.holdfast.debian-packages": packages.join(" "),
        },
    });
    let config = image_config(
        inputs.lock.arch.name(),
        inputs.epoch,
        container,
        &[&l.runtime, &l.agent],
    )?;
    Ok((config, l))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_usr_paths() {
        assert_eq!(
            merged_usr("lib/x86_64-linux-gnu/libc.so.6"),
            "usr/lib/x86_64-linux-gnu/libc.so.6"
        );
        assert_eq!(
            merged_usr("lib64/ld-linux-x86-64.so.2"),
            "usr/lib64/ld-linux-x86-64.so.2"
        );
        assert_eq!(merged_usr("usr/sbin/x"), "usr/sbin/x");
        assert_eq!(merged_usr("library/x"), "library/x");
        assert_eq!(
            normalize("usr/lib64/../lib/x86_64-linux-gnu/ld.so"),
            "usr/lib/x86_64-linux-gnu/ld.so"
        );
    }

    #[test]
    fn reads_this_test_binary_s_needs() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let needs = elf_needs(&me).unwrap().expect("an ELF file");
        assert!(needs.needed.iter().any(|n| n == "libc.so.6"), "{needs:?}");
        assert_eq!(
            needs.interpreter.as_deref(),
            Some("/lib64/ld-linux-x86-64.so.2")
        );
        assert_eq!(elf_needs(b"#!/bin/sh\n").unwrap(), None);
        assert!(elf_needs(b"\x7fELF garbage").is_err());
    }
}
