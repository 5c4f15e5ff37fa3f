//! The agent's image on its own: built by holdfast-image (as `just image` builds it) from the
//! test profile's `holdfast` binary and the pinned Debian packages. Its files are exactly what
//! the agent runs, and they work: unpacked as a runtime unpacks it, the image's own iptables
//! (`iptables-restore`, `iptables -S`, both families) installs, lists and removes the agent's
//! hold rules in a network namespace, every ELF file's libraries are in the image, and there is
//! no shell. The build is reproducible: the same inputs give the same digest.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use holdfast::effects::hold::rules::{self, Family, RuleSpec};
use holdfast_image::agent::{self, AgentInputs};
use holdfast_image::debs::DebLock;
use holdfast_image::layout::{unpack, OciLayout};
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
