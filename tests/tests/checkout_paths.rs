//! The README's commands from wherever a user clones (issue 39). The simulated pods run Envoy and
//! `sim-app` as their proxy's uid (1337, 5678, 5995) and Envoy reads the filter module, all from
//! the checkout's `target/`: a checkout under root's home (0700) hid them from those uids, and
//! one under `/tmp` was hidden from Kuma's sidecar by its emptyDir on `/tmp`
//! (tests/src/sim/reach.rs stages them).
//!
//! Each test lays out a checkout's `target/` (hard links of this build's files, a copy across
//! file systems) under a 0700 directory or under `/tmp`, and runs from it: the demo's first
//! scenario as the `holdfast-demo` binary of that layout, and an Istio and a Kuma pod of the
//! end-to-end files given that layout's Envoy, `sim-app` and filter. A planted stage the pods
//! cannot reach gives one line naming the path, the uid and the fix, before any pod starts.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use holdfast_tests::agent::holdfast_binary;
use holdfast_tests::envoy::{envoy_binary, filter_wasm};
use holdfast_tests::sim::{
    privileged, random_hex, AppScript, KumaAdmin, Mesh, NodeOptions, Phase, PodSpec, SimNode,
};

/// A checkout's `target/` laid out under `parent`, whose own directory has `mode`; removed on
/// drop, also when the test fails.
struct Checkout {
    top: PathBuf,
    target: PathBuf,
}

impl Checkout {
    fn new(parent: &Path, mode: u32) -> Checkout {
        let top = parent.join(format!("hf-checkout-{}", random_hex(4)));
        let target = top.join("holdfast/target");
        fs::create_dir_all(target.join("bin")).expect("mkdir target/bin");
        fs::create_dir_all(target.join("debug")).expect("mkdir target/debug");
        let c = Checkout { top, target };
        c.put(&envoy_binary().expect("Envoy (just setup)"), "bin/envoy");
        c.put(
            &filter_wasm().expect("the filter (just filter)"),
            "holdfast_filter.wasm",
        );
        c.put(Path::new(env!("CARGO_BIN_EXE_sim-app")), "debug/sim-app");
        c.put(
            Path::new(env!("CARGO_BIN_EXE_holdfast-demo")),
            "debug/holdfast-demo",
        );
        c.put(&holdfast_binary().expect("the agent"), "debug/holdfast");
        fs::set_permissions(&c.top, fs::Permissions::from_mode(mode)).expect("chmod");
        c
    }

    fn put(&self, from: &Path, rel: &str) {
        let to = self.target.join(rel);
        if fs::hard_link(from, &to).is_err() {
            fs::copy(from, &to)
                .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.target.join(rel)
    }

    /// `holdfast-demo` of this checkout, finding its agent and `sim-app` beside itself, Envoy
    /// and the filter where this checkout's `target/` has them.
    fn demo(&self) -> Command {
        let mut cmd = Command::new(self.path("debug/holdfast-demo"));
        cmd.env("HOLDFAST_ENVOY", self.path("bin/envoy"))
            .env("HOLDFAST_FILTER_WASM", self.path("holdfast_filter.wasm"))
            .env_remove("HOLDFAST_SIM_APP")
            .env_remove("HOLDFAST_BIN")
            .env_remove("HOLDFAST_STAGE_DIR");
        cmd
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.top);
    }
}

/// Root's home on Debian: mode 0700, like any directory only its owner may enter.
fn private_checkout() -> Checkout {
    // /var/tmp: on the root file system (hard links work) and not under /tmp.
    Checkout::new(Path::new("/var/tmp"), 0o700)
}

fn tmp_checkout() -> Checkout {
    Checkout::new(Path::new("/tmp"), 0o755)
}

/// The demo's first scenario; the row of boot calls must read 3 of 3 with holdfast.
fn demo_startup(c: &Checkout) {
    let out = c
        .demo()
        .args(["--scenario", "startup"])
        .output()
        .expect("run holdfast-demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    let row = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("boot calls ok"))
        .unwrap_or_else(|| panic!("no boot-calls row:\n{stdout}"));
    assert!(
        row.trim_end().ends_with("3 of 3"),
        "with holdfast, every boot call: {row}\n{stdout}"
    );
}

/// An Istio and a Kuma pod (the proxy uids 1337 and 5678; Kuma's sidecar covers `/tmp`) given
/// this checkout's Envoy, `sim-app` and filter: both Envoys LIVE, the Istio app's boot calls
/// answered.
fn pods_run(c: &Checkout, test: &str) {
    let opts = NodeOptions {
        sim_app: Some(c.path("debug/sim-app")),
        envoy: Some(c.path("bin/envoy")),
        filter: Some(c.path("holdfast_filter.wasm")),
        ..NodeOptions::default()
    };
    let mut node = SimNode::for_test(test, opts);
    node.add_pod(
        PodSpec::new("istio")
            .app(AppScript::CallAtStart { calls: 1 })
            .proxy_delay(Duration::ZERO)
            .holdfast_enabled(false),
    )
    .expect("add the Istio pod");
    node.add_pod(
        PodSpec::new("kuma")
            .mesh(Mesh::Kuma(KumaAdmin::Tcp))
            .app(AppScript::Idle)
            .holdfast_enabled(false),
    )
    .expect("add the Kuma pod");
    node.start_pods().expect("start");
    node.wait_proxy_live("istio", Duration::from_secs(30))
        .expect("Istio's Envoy (uid 1337) LIVE");
    node.wait_proxy_live("kuma", Duration::from_secs(30))
        .expect("Kuma's Envoy (uid 5678) LIVE");
    node.wait_report("istio", Duration::from_secs(20), "the boot call", |r| {
        let calls = r.calls(Phase::Startup);
        calls.ok + calls.failed >= 1
    })
    .expect("the Istio app's boot call");
    let left = node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

#[test]
fn demo_runs_from_a_checkout_under_a_0700_directory() {
    if !privileged("demo_runs_from_a_checkout_under_a_0700_directory") {
        return;
    }
    demo_startup(&private_checkout());
}

#[test]
fn demo_runs_from_a_checkout_under_tmp() {
    if !privileged("demo_runs_from_a_checkout_under_tmp") {
        return;
    }
    demo_startup(&tmp_checkout());
}

#[test]
fn pods_run_from_a_checkout_under_a_0700_directory() {
    if !privileged("pods_run_from_a_checkout_under_a_0700_directory") {
        return;
    }
    pods_run(&private_checkout(), "paths0700");
}

#[test]
fn pods_run_from_a_checkout_under_tmp() {
    if !privileged("pods_run_from_a_checkout_under_tmp") {
        return;
    }
    pods_run(&tmp_checkout(), "pathstmp");
}

/// A stage the pods' uids cannot enter (planted inside the 0700 directory): the demo says so in
/// one line naming the path, the uid and the fix, before starting a pod.
#[test]
fn an_unreachable_path_is_one_line_before_any_pod() {
    if !privileged("an_unreachable_path_is_one_line_before_any_pod") {
        return;
    }
    let c = private_checkout();
    let stage = c.top.join("stage");
    let started = Instant::now();
    let out = c
        .demo()
        .env("HOLDFAST_STAGE_DIR", &stage)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run holdfast-demo");
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line, no backtrace:\n{stderr}");
    let line = lines[0];
    for want in [
        "uid 1337",
        &stage.display().to_string(),
        &format!("{} is mode 0700", c.top.display()),
        "fix: set HOLDFAST_STAGE_DIR",
    ] {
        assert!(line.contains(want), "{want:?} missing from: {line}");
    }
    assert!(!stdout.contains("running"), "no run started: {stdout}");
    assert!(
        took < Duration::from_secs(10),
        "said before any pod: {took:?}"
    );
}
