//! The netns backend's two startup baselines for the benchmarks, on real containers (see
//! [`crate::sim::kubelet`] for what they stand for): `serial_start`, Istio's
//! `holdApplicationUntilProxyStarts` (the proxy container first; the others once a postStart
//! hook polling Envoy's readiness every 500 ms has seen it ready), and `drop_until_ready`
//! (DROP the app's SYNs to the capture ports from before istio-init until Envoy is ready,
//! polled every 1 ms). Both poll Envoy's admin `/ready` from inside the sandbox's netns.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sim::kubelet::{drop_rules, iptables_restore};
use crate::sim::SimError;

/// The postStart hook `pilot-agent wait`: its `--periodMillis` default.
pub(crate) const POST_START_PERIOD: Duration = Duration::from_millis(500);
/// `pilot-agent wait --timeoutSeconds` default: kubelet would then kill the proxy; here the
/// other containers are started anyway, with a line in the test's output.
pub(crate) const POST_START_TIMEOUT: Duration = Duration::from_secs(60);

/// Polls Envoy's `/ready` at `admin` inside the netns at `netns` every `period` on a thread of
/// its own, calling `step(live)` until it returns true or `stopping` is set.
pub(crate) fn poll_ready(
    pod: &str,
    what: &str,
    netns: PathBuf,
    admin: SocketAddr,
    period: Duration,
    stopping: Arc<AtomicBool>,
    mut step: impl FnMut(bool) -> bool + Send + 'static,
) {
    let name = pod.to_string();
    let spawned = std::thread::Builder::new()
        .name(format!("{what}-{pod}"))
        .spawn(move || {
            let entered = std::fs::File::open(&netns).and_then(|f| {
                nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)
            });
            if let Err(e) = entered {
                eprintln!("sim: pod {name}: cannot enter {}: {e}", netns.display());
                return;
            }
            while !stopping.load(Ordering::SeqCst) {
                let live = crate::sim::pilot_agent::admin_request(admin, "GET", "/ready")
                    .is_ok_and(|b| b.trim() == "LIVE");
                if step(live) {
                    return;
                }
                std::thread::sleep(period);
            }
        });
    if let Err(e) = spawned {
        eprintln!("sim: pod {pod}: cannot start the {what} poller: {e}");
    }
}

/// `serial_start`: sets `post_started` once Envoy is ready (or the hook timed out).
pub(crate) fn post_start_wait(
    pod: &str,
    netns: PathBuf,
    admin: SocketAddr,
    stopping: Arc<AtomicBool>,
    post_started: Arc<AtomicBool>,
) {
    let started = Instant::now();
    let name = pod.to_string();
    poll_ready(
        pod,
        "poststart",
        netns,
        admin,
        POST_START_PERIOD,
        stopping,
        move |live| {
            let timed_out = started.elapsed() >= POST_START_TIMEOUT;
            if timed_out {
                eprintln!("sim: pod {name}: postStart `pilot-agent wait` timed out after {POST_START_TIMEOUT:?}; starting the app anyway");
            }
            if live || timed_out {
                post_started.store(true, Ordering::SeqCst);
            }
            live || timed_out
        },
    );
}

/// `drop_until_ready`: installs the DROP rules in the sandbox's netns now and removes them the
/// moment Envoy is ready.
pub(crate) fn drop_until_ready(
    pod: &str,
    netns: &Path,
    admin: SocketAddr,
    stopping: Arc<AtomicBool>,
) -> Result<(), SimError> {
    crate::sim::netns::run_in(netns, || iptables_restore(&drop_rules(true)))??;
    let name = pod.to_string();
    poll_ready(
        pod,
        "drop-remover",
        netns.to_path_buf(),
        admin,
        Duration::from_millis(1),
        stopping,
        move |live| {
            if live {
                if let Err(e) = iptables_restore(&drop_rules(false)) {
                    eprintln!("sim: pod {name}: cannot remove the DROP rules: {e}");
                }
            }
            live
        },
    );
    Ok(())
}
