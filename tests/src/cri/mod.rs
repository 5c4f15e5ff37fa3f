//! The simulated node's second backend: pods as real containers of a private containerd
//! (Debian's containerd 1.6 with its built-in CRI plugin, runc, the CNI bridge plugin), driven
//! through the CRI by a kubelet stand-in ([`kubelet`]).
//!
//! - [`runtime`]: the private containerd (own root, state, socket, CNI config) and its teardown.
//! - [`image`]: OCI layout images built without a registry (Debian's static busybox).
//! - [`kubelet`]: the CRI pod worker (sandbox, istio-init, containers in order, stop, restarts).
//! - [`status`]: containerd's verbose status (process ids, the sandbox's netns path).
//! - [`baselines`]: the benchmarks' startup baselines (`serial_start`, `drop_until_ready`).
//! - [`exit_watch`]: the exact moment a container's init process exits (pidfd).
//! - [`stale`]: runtimes left by killed test binaries, cleaned up by the next one to start.
//! - [`agent_image`]: the agent's image, built as `just image` builds it, pushed to a registry
//!   on loopback and pulled through CRI `PullImage`.
//! - [`agent_pod`]: the agent's DaemonSet pod as rendered from `manifests/`, run as the kubelet
//!   runs it.
//!
//! One containerd serves every test of a test binary ([`shared`]): starting it and importing the
//! image takes about a second, and `just test` must stay fast. It is torn down when the test
//! binary exits (an `atexit` handler, because statics are never dropped), also after a test
//! panicked; each node removes its own sandboxes when it is dropped.

pub mod agent_image;
pub mod agent_pod;
pub mod baselines;
pub mod exit_watch;
pub mod image;
pub mod kubelet;
pub mod runtime;
pub mod stale;
pub mod status;

use std::sync::OnceLock;

pub use runtime::Containerd;

static SHARED: OnceLock<Result<Containerd, String>> = OnceLock::new();

extern "C" fn teardown_shared() {
    let Some(Ok(c)) = SHARED.get() else {
        return;
    };
    // On a thread of its own: by the time `exit` runs this handler, the main thread's
    // thread-locals (tokio's runtime context among them) may be destroyed already, and a panic
    // here cannot unwind (seen in `holdfast-demo`, whose main thread used the runtime).
    let done = std::thread::Builder::new()
        .name("cri-teardown".into())
        .spawn(move || c.teardown())
        .map(|t| t.join());
    match done {
        Ok(Ok(left)) => {
            for l in left {
                eprintln!("cri: left after teardown: {l}");
            }
        }
        Ok(Err(_)) => eprintln!("cri: the runtime's teardown panicked"),
        Err(e) => eprintln!("cri: cannot start the runtime's teardown: {e}"),
    }
}

/// The test binary's private containerd, started on first use.
pub fn shared() -> Result<&'static Containerd, String> {
    let r = SHARED.get_or_init(|| {
        let tag = std::env::var("HOLDFAST_SIM_TAG")
            .ok()
            .filter(|t| !t.is_empty() && t.chars().all(|c| c.is_ascii_alphanumeric()))
            .unwrap_or_else(|| "t".into());
        let started = Containerd::start(&tag).map_err(|e| e.to_string());
        if started.is_ok() && !crate::sim::process::at_exit(teardown_shared) {
            eprintln!("cri: cannot register the runtime's teardown at exit: containerd will outlive the tests");
        }
        started
    });
    r.as_ref().map_err(Clone::clone)
}

/// Gate for tests on the real runtime: the shared containerd, or `None` (with a message) when
/// this machine cannot run it — except under CI (`CI` set), where that is a failure.
pub fn runtime_for(test: &str) -> Option<&'static Containerd> {
    if !crate::sim::privileged(test) {
        return None;
    }
    match shared() {
        Ok(c) => Some(c),
        Err(e) if std::env::var_os("CI").is_some() => {
            panic!("{test}: the containerd backend cannot run and CI is set: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED {test}: the containerd backend cannot run here: {e}");
            None
        }
    }
}

/// Holdfast's iptables rules in the host's network namespace (none may ever be there: the agent
/// acts only in pods' namespaces), as leftover descriptions.
pub fn host_netns_holdfast_rules() -> Vec<String> {
    let mut left = Vec::new();
    for table in ["filter", "mangle", "nat", "raw"] {
        if let Ok(out) = crate::sim::netns::run_output("iptables", &["-w", "-t", table, "-S"]) {
            left.extend(
                out.lines()
                    .filter(|l| l.to_ascii_lowercase().contains("holdfast"))
                    .map(|l| format!("host netns iptables -t {table}: {l}")),
            );
        }
    }
    left
}
