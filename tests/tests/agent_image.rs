//! The agent's image on its own: built by holdfast-image (as `just image` builds it) from the
//! test profile's `holdfast` binary and the pinned Debian packages. Its files are exactly what
//! the agent runs, and they work: unpacked as a runtime unpacks it, the image's own iptables
//! (`iptables-restore`, `iptables -S`, both families) installs, lists and removes the agent's
//! hold rules in a network namespace, every ELF file's libraries are in the image, and there is
//! no shell. The build is reproducible: the same inputs give the same digest. The release's
//! image index carries a linux/amd64 and a linux/arm64 image; read back from a registry as
//! containerd reads it (the index, then the manifest of the node's platform), each image's files
//! are all of its own CPU (the ELF machine of the agent, iptables and every library) and the
//! agent's libraries and dynamic linker are in it; the arm64 agent starts under qemu-user in its
//! own image's root; a real containerd pulls each platform's image from the index.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use holdfast::effects::hold::rules::{self, Family, RuleSpec};
use holdfast_image::agent::{self, AgentInputs};
use holdfast_image::arch::{self, Arch};
use holdfast_image::debs::DebLock;
use holdfast_image::layout::{unpack, Index, Manifest, OciLayout, OCI_INDEX, OCI_MANIFEST};
use holdfast_image::registry::LocalRegistry;
use holdfast_tests::cri::agent_image::{build_for, TEST_TAG};
use holdfast_tests::sim::netns::{run_in, NetNs};
use holdfast_tests::sim::privileged;

fn workspace() -> PathBuf {
    holdfast_tests::envoy::workspace_root()
}

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(label: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("hf-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch dir");
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn holdfast() -> PathBuf {
    holdfast_tests::agent::holdfast_binary().expect("the holdfast binary")
}

/// `program args` run by chroot into `root`, stdin `input`; (success, stdout + stderr).
fn in_image(root: &Path, program: &str, args: &[&str], input: &str) -> (bool, String) {
    let mut child = Command::new("chroot")
        .arg(root)
        .arg(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chroot");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_agent_image_is_reproducible() {
    let binary = holdfast();
    let (_cached, digest) = build_for(&binary).expect("the test image");
    let scratch = Scratch::new("agentrepro");
    let lock = DebLock::read(&workspace().join(holdfast_image::debs::LOCK_FILE)).expect("lock");
    let target = binary.parent().and_then(Path::parent).expect("target dir");
    let build = |epoch: u64, dir: &str| {
        agent::build(
            &AgentInputs {
                binary: &binary,
                lock: &lock,
                deb_cache: &target.join("image/debs"),
                work: &scratch.0.join(format!("{dir}.work")),
                version: env!("CARGO_PKG_VERSION"),
                epoch,
            },
            &scratch.0.join(dir),
            TEST_TAG,
        )
        .expect("building the agent image")
    };
    let again = build(0, "again");
    assert_eq!(
        again.digest, digest,
        "same binary, packages and epoch: same digest"
    );
    eprintln!(
        "agent image (test binary): {} — download {} bytes, unpacked {} bytes",
        again.digest, again.compressed_size, again.uncompressed_size
    );
    let later = build(1_700_000_000, "later");
    assert_ne!(later.digest, digest, "SOURCE_DATE_EPOCH is an input");
}

#[test]
fn the_image_s_iptables_holds_and_releases_in_a_pod_netns() {
    if !privileged("the_image_s_iptables_holds_and_releases_in_a_pod_netns") {
        return;
    }
    let (layout_dir, _) = build_for(&holdfast()).expect("the test image");
    let scratch = Scratch::new("agentimg");
    let root = scratch.0.join("rootfs");
    unpack(
        &OciLayout::open(&layout_dir).expect("layout"),
        TEST_TAG,
        &root,
    )
    .expect("unpack");

    // Nothing but the agent and what it runs: no shell, no package manager.
    for absent in ["usr/bin/sh", "bin/sh", "usr/bin/apt", "usr/bin/dpkg"] {
        assert!(!root.join(absent).exists(), "{absent} is in the image");
    }
    // Every ELF file finds its libraries in the image (the dynamic linker's own --list).
    for elf in ["/usr/local/bin/holdfast", "/usr/sbin/xtables-nft-multi"] {
        let (ok, out) = in_image(
            &root,
            "/usr/lib64/ld-linux-x86-64.so.2",
            &["--list", elf],
            "",
        );
        assert!(ok && !out.contains("not found"), "{elf}:\n{out}");
    }
    let (ok, out) = in_image(&root, "/usr/local/bin/holdfast", &["--version"], "");
    assert!(ok && out.contains("holdfast"), "{out}");

    let ns = NetNs::create("hf-agentimg-pod").expect("netns");
    let spec = RuleSpec {
        ipv6: true,
        dns_port: Some(15053),
        ..RuleSpec::default()
    };
    for (family, restore, list) in [
        (
            Family::V4,
            "/usr/sbin/iptables-restore",
            "/usr/sbin/iptables",
        ),
        (
            Family::V6,
            "/usr/sbin/ip6tables-restore",
            "/usr/sbin/ip6tables",
        ),
    ] {
        let script = rules::install_script(&spec, family, &Default::default());
        let (ok, out) = run_in(&ns.path(), || {
            in_image(&root, restore, &["--noflush"], &script)
        })
        .expect("enter netns");
        assert!(ok, "{restore} refused the hold rules:\n{script}\n{out}");
        let (ok, listed) =
            run_in(&ns.path(), || in_image(&root, list, &["-w", "-S"], "")).expect("netns");
        assert!(ok, "{listed}");
        let found = rules::parse_found(&listed);
        assert!(found.is_active(), "{family:?}: no active hold in\n{listed}");
        assert!(
            listed.contains("--queue-num 15015 --queue-bypass")
                && listed.contains("--uid-owner 1337"),
            "the NFQUEUE and owner extensions load: {listed}"
        );
        let removal = rules::remove_script(&found).expect("something to remove");
        let (ok, out) = run_in(&ns.path(), || {
            in_image(&root, restore, &["--noflush"], &removal)
        })
        .expect("netns");
        assert!(ok, "{out}");
        let (_, after) =
            run_in(&ns.path(), || in_image(&root, list, &["-w", "-S"], "")).expect("netns");
        assert!(!rules::parse_found(&after).is_active(), "{after}");
        assert!(!after.to_ascii_lowercase().contains("holdfast"), "{after}");
    }
    // Istio's nat rules, written by another iptables, read back by the image's.
    let istio = "*nat\n:ISTIO_REDIRECT - [0:0]\n-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001\n-A OUTPUT -m owner ! --uid-owner 1337 -j ISTIO_REDIRECT\nCOMMIT\n";
    let (ok, out) = run_in(&ns.path(), || {
        let mut c = Command::new("iptables-restore")
            .arg("--noflush")
            .stdin(Stdio::piped())
            .spawn()
            .expect("host iptables-restore");
        c.stdin
            .take()
            .expect("stdin")
            .write_all(istio.as_bytes())
            .expect("write");
        let st = c.wait().expect("wait");
        (st.success(), String::new())
    })
    .expect("netns");
    assert!(ok, "{out}");
    let (ok, nat) = run_in(&ns.path(), || {
        in_image(&root, "/usr/sbin/iptables", &["-w", "-t", "nat", "-S"], "")
    })
    .expect("netns");
    assert!(ok && nat.contains("-j REDIRECT --to-ports 15001"), "{nat}");
    drop(ns);
}

/// Whether a tool-dependent check may skip: not when CI is set.
fn skip_or_fail(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{why} (CI is set: not skipping)");
    }
    eprintln!("SKIP: {why}");
}

/// The arm64 agent binary: `HOLDFAST_BIN_ARM64`, or the test profile's (then the release's)
/// cross build next to the amd64 one (`cargo build -p holdfast --target
/// aarch64-unknown-linux-gnu`, which `just test-all` runs).
fn holdfast_arm64(amd64: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HOLDFAST_BIN_ARM64") {
        return Some(PathBuf::from(p));
    }
    let target = amd64.parent().and_then(Path::parent)?;
    ["debug", "release"]
        .iter()
        .map(|p| {
            target
                .join(Arch::Arm64.rust_target())
                .join(p)
                .join("holdfast")
        })
        .find(|p| p.is_file())
}

/// Every regular file of a gzip tar layer: (path without a leading `/` or `./`, bytes), and
/// every symlink: (path, target).
type LayerFiles = (
    std::collections::BTreeMap<String, Vec<u8>>,
    std::collections::BTreeMap<String, String>,
);

fn layer_files(blob: &[u8]) -> LayerFiles {
    use std::io::Read;
    let mut files = std::collections::BTreeMap::new();
    let mut links = std::collections::BTreeMap::new();
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(blob));
    for e in archive.entries().expect("a tar layer") {
        let mut e = e.expect("a tar entry");
        let path = e.path().expect("path").to_string_lossy().into_owned();
        let path = path
            .trim_start_matches("./")
            .trim_start_matches('/')
            .to_string();
        match e.header().entry_type() {
            tar::EntryType::Regular => {
                let mut data = Vec::new();
                e.read_to_end(&mut data).expect("read entry");
                files.insert(path, data);
            }
            tar::EntryType::Symlink => {
                let target = e.link_name().expect("link").expect("a target");
                links.insert(path, target.to_string_lossy().into_owned());
            }
            _ => {}
        }
    }
    (files, links)
}

/// `path` resolved through the image's symlinks (absolute and relative), merged-`/usr` aware
/// as the image is (its `/lib` is a link to `usr/lib`).
fn resolve(links: &std::collections::BTreeMap<String, String>, path: &str) -> String {
    let mut at: Vec<String> = Vec::new();
    let mut todo: Vec<String> = path
        .trim_start_matches('/')
        .split('/')
        .rev()
        .map(String::from)
        .collect();
    let mut hops = 0;
    while let Some(c) = todo.pop() {
        match c.as_str() {
            "" | "." => continue,
            ".." => {
                at.pop();
                continue;
            }
            _ => {}
        }
        at.push(c);
        let here = at.join("/");
        if let Some(target) = links.get(&here) {
            hops += 1;
            assert!(hops < 40, "{path}: symlink loop");
            at.pop();
            if target.starts_with('/') {
                at.clear();
            }
            todo.extend(target.split('/').rev().map(String::from));
        }
    }
    at.join("/")
}

/// `just image`'s agent image: an OCI index of a linux/amd64 and a linux/arm64 image. Pushed to
/// a registry on loopback and read back the way containerd resolves it (GET the tag: an index;
/// pick the manifest whose `platform` is the node's; GET it and its blobs), each platform's
/// image has the config of its platform, and every ELF file in its layers — the agent, iptables,
/// each extension and library — is for that CPU; the agent's dynamic linker and every library
/// it names are in the image. Fails before the index (one amd64 manifest: no index, no arm64).
#[test]
#[ignore = "long form, `just test-all`: needs the arm64 cross build"]
fn the_agent_image_index_has_an_image_per_platform_as_containerd_reads_it() {
    let amd64 = holdfast();
    let Some(arm64) = holdfast_arm64(&amd64) else {
        skip_or_fail(
            "needs the arm64 agent binary: `cargo build -p holdfast --target \
             aarch64-unknown-linux-gnu` (rustup target and gcc-aarch64-linux-gnu: `just setup`)",
        );
        return;
    };
    let scratch = Scratch::new("agentindex");
    let target = amd64.parent().and_then(Path::parent).expect("target dir");
    let locks: Vec<DebLock> = Arch::ALL
        .iter()
        .map(|a| {
            DebLock::read_for(&workspace().join(a.lock_file()), *a)
                .unwrap_or_else(|e| panic!("{a} lock: {e}"))
        })
        .collect();
    let works: Vec<PathBuf> = Arch::ALL
        .iter()
        .map(|a| scratch.0.join(format!("work-{a}")))
        .collect();
    let binaries = [amd64.clone(), arm64.clone()];
    let deb_cache = target.join("image/debs");
    let inputs: Vec<AgentInputs<'_>> = (0..2)
        .map(|i| AgentInputs {
            binary: &binaries[i],
            lock: &locks[i],
            deb_cache: &deb_cache,
            work: &works[i],
            version: env!("CARGO_PKG_VERSION"),
            epoch: 0,
        })
        .collect();
    let layout_dir = scratch.0.join("layout");
    let (index, images) =
        agent::build_index(&inputs, &layout_dir, TEST_TAG).expect("building the image index");
    // A binary of the wrong CPU for its lock is refused, naming both.
    let swapped = AgentInputs {
        binary: &amd64,
        ..inputs[1].clone()
    };
    let err = match agent::build(&swapped, &scratch.0.join("swapped"), TEST_TAG) {
        Ok(b) => panic!(
            "an amd64 binary in the arm64 image was accepted: {}",
            b.digest
        ),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("not arm64") && err.contains("amd64"), "{err}");

    let registry = match LocalRegistry::start(&scratch.0.join("registry"), 0) {
        Ok(r) => r,
        Err(e) => {
            skip_or_fail(&format!("needs docker-registry (`just setup`): {e}"));
            return;
        }
    };
    let client = registry.client().expect("client");
    let layout = OciLayout::open(&layout_dir).expect("layout");
    let pushed = client
        .push(&layout, TEST_TAG, "holdfast/agent", "multi")
        .expect("push");
    assert_eq!(pushed, index.digest);
    let top = client
        .manifest("holdfast/agent", "multi")
        .expect("GET the tag");
    assert_eq!(top.media_type, OCI_INDEX, "the tag is an image index");
    assert_eq!(top.digest, index.digest);
    let idx: Index = serde_json::from_slice(&top.bytes).expect("an index");
    assert_eq!(idx.manifests.len(), Arch::ALL.len(), "{idx:?}");
    for arch in Arch::ALL {
        // containerd's platform matcher: os and architecture of the descriptor's platform.
        let matching: Vec<_> = idx
            .manifests
            .iter()
            .filter(|d| {
                d.platform
                    .as_ref()
                    .is_some_and(|p| p["os"] == "linux" && p["architecture"] == arch.name())
            })
            .collect();
        assert_eq!(matching.len(), 1, "linux/{arch}: {idx:?}");
        let desc = matching[0];
        assert_eq!(desc.media_type, OCI_MANIFEST);
        let built = &images.iter().find(|(a, _)| *a == arch).expect("built").1;
        assert_eq!(desc.digest, built.digest, "linux/{arch}");
        let m = client
            .manifest("holdfast/agent", &desc.digest)
            .expect("GET the platform's manifest");
        let manifest: Manifest = serde_json::from_slice(&m.bytes).expect("a manifest");
        let config: serde_json::Value = serde_json::from_slice(
            &client
                .blob("holdfast/agent", &manifest.config.digest, 1 << 20)
                .expect("config"),
        )
        .expect("config JSON");
        assert_eq!(
            config["architecture"],
            arch.name(),
            "config of linux/{arch}"
        );
        assert_eq!(config["os"], "linux");
        let mut files = std::collections::BTreeMap::new();
        let mut links = std::collections::BTreeMap::new();
        for l in &manifest.layers {
            let blob = client
                .blob("holdfast/agent", &l.digest, 256 << 20)
                .expect("layer");
            let (f, s) = layer_files(&blob);
            files.extend(f);
            links.extend(s);
        }
        let mut elfs = 0;
        for (path, data) in &files {
            if let Some(machine) = arch::elf_machine(data) {
                assert_eq!(
                    Arch::of_elf_machine(machine),
                    Some(arch),
                    "linux/{arch}: {path} is for ELF machine {machine}"
                );
                elfs += 1;
            }
        }
        let agent_bin = files
            .get(agent::AGENT_PATH)
            .unwrap_or_else(|| panic!("linux/{arch}: no {}", agent::AGENT_PATH));
        let want = std::fs::read(&binaries[Arch::ALL.iter().position(|a| *a == arch).unwrap()])
            .expect("binary");
        assert!(
            agent_bin == &want,
            "linux/{arch}: the agent is that platform's binary"
        );
        let needs = agent::elf_needs(agent_bin)
            .expect("ELF")
            .expect("an ELF binary");
        let interp = needs.interpreter.clone().expect("a dynamic executable");
        assert_eq!(interp, arch.interpreter());
        for wanted in std::iter::once(interp).chain(
            needs
                .needed
                .iter()
                .map(|so| format!("{}/{so}", arch.lib_dir())),
        ) {
            let real = resolve(&links, &wanted);
            assert!(
                files.contains_key(&real),
                "linux/{arch}: {wanted} (→ {real}) is not in the image"
            );
        }
        assert!(
            files.contains_key(&resolve(&links, "usr/sbin/iptables-restore")),
            "linux/{arch}: iptables-restore"
        );
        eprintln!(
            "linux/{arch}: {} — {elfs} ELF files, all of machine {}",
            desc.digest,
            arch.elf_machine()
        );
        // The layout resolves the same platform.
        let (d, _, _) = layout.image_for(TEST_TAG, arch.name()).expect("image_for");
        assert_eq!(d.digest, desc.digest);
    }
    assert!(
        layout.image(TEST_TAG).is_err(),
        "an index is not one platform's image"
    );

    // Real containerd (a private one, as the containerd backend runs): the kubelet's CRI
    // PullImage of the pinned index takes the image of the node's platform (this machine's:
    // amd64), and `ctr images pull --platform linux/arm64` (what an arm64 node's containerd
    // resolves to) fetches the arm64 one, content checked by digest.
    if !privileged("the_agent_image_index_has_an_image_per_platform_as_containerd_reads_it") {
        return;
    }
    // The arm64 image's agent started under emulation: qemu-user (Debian's qemu-user-static)
    // copied into the unpacked image, chroot there, so the program interpreter and every library
    // it loads are the image's own. (Its iptables cannot be run this way: qemu-user does not
    // emulate netfilter netlink sockets, "Failed to initialize nft: Protocol not supported".)
    let qemu = Path::new("/usr/bin/qemu-aarch64-static");
    if qemu.is_file() {
        let root = scratch.0.join("arm64-rootfs");
        holdfast_image::layout::unpack_for(&layout, TEST_TAG, "arm64", &root)
            .expect("unpack linux/arm64");
        std::fs::copy(qemu, root.join("qemu-aarch64-static")).expect("copy qemu");
        let (ok, out) = in_image(
            &root,
            "/qemu-aarch64-static",
            &["/usr/local/bin/holdfast", "--version"],
            "",
        );
        assert!(
            ok && out.contains(&format!("holdfast {}", env!("CARGO_PKG_VERSION"))),
            "the arm64 agent under qemu: {out}"
        );
        eprintln!("linux/arm64 agent under qemu-user: {}", out.trim());
    } else {
        skip_or_fail("needs qemu-user-static to start the arm64 agent (`just setup`)");
    }
    if let Some(why) = holdfast_tests::cri::runtime::missing_pieces() {
        skip_or_fail(&why);
        return;
    }
    let rt = holdfast_tests::cri::runtime::Containerd::start("agentindex").expect("containerd");
    let host = registry.host();
    rt.allow_plain_http(&host).expect("hosts.toml");
    let config_of = |arch: Arch| -> String {
        let (_, _, m) = layout.image_for(TEST_TAG, arch.name()).expect("image_for");
        m.config.digest
    };
    let arm64_ref = format!("{host}/holdfast/agent:multi");
    rt.ctr(&[
        "content",
        "fetch",
        "--plain-http",
        "--platform",
        "linux/arm64",
        &arm64_ref,
    ])
    .expect("ctr content fetch --platform linux/arm64");
    let content = rt.ctr(&["content", "ls", "-q"]).expect("ctr content ls");
    let (_, _, arm) = layout.image_for(TEST_TAG, "arm64").expect("arm64");
    let (_, _, amd) = layout.image_for(TEST_TAG, "amd64").expect("amd64");
    for l in std::iter::once(&arm.config).chain(&arm.layers) {
        assert!(
            content.contains(&l.digest),
            "arm64 blob {} not fetched",
            l.digest
        );
    }
    for l in &amd.layers {
        assert!(
            !content.contains(&l.digest),
            "linux/arm64 fetched an amd64 layer {}",
            l.digest
        );
    }
    let image_id = rt
        .pull(&format!("{host}/holdfast/agent@{}", index.digest))
        .expect("CRI PullImage of the index");
    assert_eq!(
        image_id,
        config_of(Arch::Amd64),
        "the kubelet's pull on an amd64 node takes the amd64 image"
    );
    drop(rt);
}
