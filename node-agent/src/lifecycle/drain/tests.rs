//! The drain and Job logic against real processes (`sleep` children, watched by pidfd) and a
//! scripted admin API. No root needed. Envoy itself is exercised in
//! `node-agent/tests/drain_parts.rs`.
//!
//! These tests check the I/O: pidfd exit notices, the process index, the admin calls, the
//! loop's wiring of the step to its effects. The judgements (when to quit, which outcome, the
//! deadline, counts and back-offs) are table tests of the step (`step.rs`, `decide.rs`). A test
//! here waits on what the drain did ([`until`] and the fakes' waits), never on a fixed sleep;
//! a sleep left is tokio's paused clock passing a deadline, or the scenario's own timing.

use std::future::Future;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::{watch, Notify};
// tokio's clock, as the executors use it: paused-time tests drive the deadlines.
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::admin::{AdminFailure, ProxyAdmin};
use super::decide::settle_wait;
use super::envoy_version::DRAIN_INBOUND_PATH;
use super::in_flight::DirectionCounts;
use super::*;
use crate::config::{HoldSettings, PodOverrides};
use crate::effects::procfs::pod_procs::PodProcess;
use crate::pod::{ContainerState, ContainerView, Deletion, RestartPolicy};

const APP_ID: &str = "aaaa";
const PROXY_ID: &str = "pppp";

/// A child process killed (by pid) and reaped on drop.
struct Proc(Child);

impl Proc {
    fn sleep() -> Proc {
        Proc(
            Command::new("sleep")
                .arg("60")
                .spawn()
                .expect("spawn sleep"),
        )
    }
    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
    /// SIGKILL without reaping: the process stays a zombie, as a container's main process may
    /// for a moment before its shim reaps it.
    fn kill(&mut self) {
        let _ = self.0.kill();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How long a test waits for what it waits on ([`until`]) before it fails: far above what
/// any of these waits takes on a loaded machine, far below a hung test.
const WAIT_LIMIT: Duration = Duration::from_secs(10);

/// Told at every call the drain (or the Job watch) makes on the fakes below, so a test that
/// waits on what the drain did ([`until`]) looks again then. One for all tests: a test woken
/// by another's drain only looks again.
static NEWS: Notify = Notify::const_new();

/// What a test waits on instead of a sleep: returns once `done` holds, looked at whenever the
/// drain calls a fake, and fails naming `what` after [`WAIT_LIMIT`] (real time, also in
/// paused-time tests) — a failure fails fast and says what did not happen.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = std::time::Instant::now() + WAIT_LIMIT;
    loop {
        let news = NEWS.notified();
        tokio::pin!(news);
        news.as_mut().enable();
        if done() {
            return;
        }
        let left = give_up.saturating_duration_since(std::time::Instant::now());
        assert!(!left.is_zero(), "waited {WAIT_LIMIT:?} for {what}");
        let _ = tokio::time::timeout(left, news).await;
    }
}

/// A pod's processes as the agent's index would list them (killed ones may linger as zombies).
#[derive(Clone, Default)]
struct FakeProcs {
    procs: Arc<Mutex<Vec<PodProcess>>>,
    /// How many times the drain looked at the pod's processes.
    scans: Arc<AtomicU32>,
}

impl FakeProcs {
    fn add(&self, pid: i32, container: Option<&str>) {
        self.procs.lock().unwrap().push(PodProcess {
            pid,
            container_id: container.map(str::to_string),
        });
    }
    fn scans(&self) -> u32 {
        self.scans.load(Ordering::SeqCst)
    }
    /// Waits until the drain has looked at the pod's processes `n` times in all: after an
    /// exit, the look that follows it (every exit notice rescans), where a sleep used to give
    /// the drain time to notice.
    async fn scanned(&self, n: u32) {
        until(
            &format!("the drain's look #{n} at the pod's processes"),
            || self.scans() >= n,
        )
        .await;
    }
    /// Waits until the drain has looked at the processes again (once more than now).
    async fn rescanned(&self) {
        self.scanned(self.scans() + 1).await;
    }
}

impl PodProcessSource for FakeProcs {
    async fn processes(&self) -> Vec<PodProcess> {
        let procs = self.procs.lock().unwrap().clone();
        self.scans.fetch_add(1, Ordering::SeqCst);
        NEWS.notify_waiters();
        procs
    }

    /// The real signalling (pidfd, start time checked) on the fake pod's real processes.
    async fn terminate_main(&self, container_id: &str) -> Result<i32, String> {
        let pids: Vec<i32> = self
            .procs
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.container_id.as_deref() == Some(container_id))
            .map(|p| p.pid)
            .collect();
        crate::effects::procfs::proxy_procs::terminate_main(std::path::Path::new("/proc"), &pids)
    }
}

/// Scripted admin API.
#[derive(Default)]
struct FakeAdmin {
    state: Mutex<AdminState>,
}

#[derive(Default)]
struct AdminState {
    /// Every successful POST, with when it arrived.
    posts: Vec<(String, Instant)>,
    /// Envoy has exited: every request is refused.
    gone: bool,
    /// Exit when `/quitquitquit` arrives.
    quit_exits: bool,
    /// `/stats` answers with these counts (`None`: filter not installed).
    counts: Option<FilterCounts>,
    /// `/stats` fails (not refused) this many more times.
    stats_failures: u32,
    /// Bytes added to Envoy's byte counters on every `/stats` (traffic moving).
    bytes_per_sample: u64,
    traffic_bytes: u64,
    /// When a sample last saw the bytes move.
    last_moved_at: Option<Instant>,
    /// Envoy keeps no byte counters (a stats matcher drops them).
    bytes_unexposed: bool,
    stats_calls: u32,
    /// When each `/stats` call came (answered or not).
    sampled_at: Vec<Instant>,
    /// `/server_info`'s body (`None`: the request fails, not refused).
    server_info: Option<Vec<u8>>,
    /// Bytes the pod's sockets hold in the kernel's send queues (`None`: unknown).
    send_queued: Option<u64>,
    /// When a sample last saw bytes queued in the kernel.
    last_queued_at: Option<Instant>,
    /// Envoy's health check is failed (`/healthcheck/fail`; `/healthcheck/ok` undoes it).
    health_check_failed: bool,
    /// The `server.state` gauge in the samples still shows the state before the last change
    /// (Envoy updates it at its stats flush, 5 s by default); `/ready` is always current.
    gauge_stale: bool,
}

impl FakeAdmin {
    fn new(counts: Option<FilterCounts>) -> FakeAdmin {
        let admin = FakeAdmin::default();
        {
            let mut s = admin.state.lock().unwrap();
            s.counts = counts;
            s.quit_exits = true;
            s.server_info = Some(
                br#"{"version":"9e55809/1.40.0/Clean/RELEASE/BoringSSL","state":"LIVE"}"#.to_vec(),
            );
        }
        admin
    }
    fn with<T>(&self, f: impl FnOnce(&mut AdminState) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }
    /// [`FakeAdmin::with`] for a call of the drain's: waiting tests look again.
    fn called<T>(&self, f: impl FnOnce(&mut AdminState) -> T) -> T {
        let out = self.with(f);
        NEWS.notify_waiters();
        out
    }
    fn paths(&self) -> Vec<String> {
        self.with(|s| s.posts.iter().map(|(p, _)| p.clone()).collect())
    }
    /// Waits until the drain has sampled `/stats` `n` times: the drain has begun (its inbound
    /// drain is sent and the app's processes are known), where a sleep used to stand in for it.
    async fn sampled(&self, n: u32) {
        until(&format!("/stats sampled {n} times"), || {
            self.with(|s| s.stats_calls) >= n
        })
        .await;
    }
    /// Waits until the drain's samples span `span` (first to last): the judge has that much
    /// history (counts that stood still that long are idle at the app's exit).
    async fn samples_span(&self, span: Duration) {
        until(&format!("samples spanning {span:?}"), || {
            self.with(|s| match (s.sampled_at.first(), s.sampled_at.last()) {
                (Some(first), Some(last)) => last.duration_since(*first) >= span,
                _ => false,
            })
        })
        .await;
    }
    /// Waits until the drain has sampled `/stats` `watch` or more after now — it has looked at
    /// what it holds on that long — or has quit: what a test that checks the drain holds (no
    /// quit yet) waits on, instead of a sleep that a loaded machine may end before the drain
    /// looked at all.
    async fn watched_for(&self, watch: Duration) {
        let from = Instant::now();
        until(&format!("a sample {watch:?} on, or the quit"), || {
            self.with(|s| {
                s.posts.iter().any(|(p, _)| p == QUIT_PATH)
                    || s.sampled_at.last().is_some_and(|t| *t >= from + watch)
            })
        })
        .await;
    }
    fn quit_at(&self) -> Option<Instant> {
        self.with(|s| {
            s.posts
                .iter()
                .find(|(p, _)| p == QUIT_PATH)
                .map(|(_, t)| *t)
        })
    }
}

fn refused() -> AdminFailure {
    AdminFailure {
        refused: true,
        message: "connection refused".into(),
    }
}

impl ProxyAdmin for FakeAdmin {
    async fn admin_post(&self, path: &str) -> Result<(), AdminFailure> {
        self.called(|s| {
            if s.gone {
                return Err(refused());
            }
            s.posts.push((path.to_string(), Instant::now()));
            match path {
                "/healthcheck/fail" => s.health_check_failed = true,
                "/healthcheck/ok" => s.health_check_failed = false,
                _ => {}
            }
            if path == QUIT_PATH && s.quit_exits {
                s.gone = true;
            }
            Ok(())
        })
    }

    async fn drain_sample(&self, _prefix: &str) -> Result<DrainSample, AdminFailure> {
        self.called(|s| {
            if s.gone {
                return Err(refused());
            }
            s.stats_calls += 1;
            s.sampled_at.push(Instant::now());
            if s.stats_failures > 0 {
                s.stats_failures -= 1;
                return Err(AdminFailure {
                    refused: false,
                    message: "malformed response".into(),
                });
            }
            s.traffic_bytes += s.bytes_per_sample;
            if s.bytes_per_sample > 0 {
                s.last_moved_at = Some(Instant::now());
            }
            Ok(DrainSample {
                filter: s.counts,
                traffic: TrafficBytes {
                    total: s.traffic_bytes,
                    counters: 4,
                    buffered: 0,
                    exposed: !s.bytes_unexposed,
                },
                send_queued: None,
                health_check_failed: s.health_check_failed != s.gauge_stale,
                listener_counts: None,
            })
        })
    }

    async fn probe(&self) -> Result<(), AdminFailure> {
        self.called(|s| if s.gone { Err(refused()) } else { Ok(()) })
    }

    async fn health_check_failed(&self) -> Result<bool, AdminFailure> {
        self.called(|s| {
            if s.gone {
                Err(refused())
            } else {
                Ok(s.health_check_failed)
            }
        })
    }

    async fn send_queued(&self) -> Option<u64> {
        self.called(|s| {
            if s.send_queued.is_some_and(|q| q > 0) {
                s.last_queued_at = Some(Instant::now());
            }
            s.send_queued
        })
    }

    async fn server_info(&self) -> Result<Vec<u8>, AdminFailure> {
        self.called(|s| match (&s.server_info, s.gone) {
            (_, true) => Err(refused()),
            (Some(body), false) => Ok(body.clone()),
            (None, false) => Err(AdminFailure {
                refused: false,
                message: "GET /server_info answered HTTP 404".into(),
            }),
        })
    }
}

/// The filter's counts with `outbound_active` outbound connections open and none other.
fn counts(outbound_active: u64) -> FilterCounts {
    let dir = |active| DirectionCounts {
        cx_active: Some(active),
    };
    FilterCounts {
        inbound: dir(0),
        outbound: dir(outbound_active),
        unknown: dir(0),
    }
}

fn key() -> PodKey {
    PodKey {
        uid: "0b6a3c1e-6a59-4d8e-9f3a-2f1d5c7b8a90".into(),
        namespace: "shop".into(),
        name: "web-1".into(),
    }
}

fn view(
    restart_policy: RestartPolicy,
    app: ContainerState,
    deletion_grace: Option<Duration>,
) -> PodView {
    PodView {
        key: key(),
        overrides: PodOverrides::from_annotations([], &HoldSettings::default()),
        containers: vec![
            ContainerView {
                name: "app".into(),
                id: Some(APP_ID.into()),
                is_proxy: false,
                state: app,
                ..ContainerView::default()
            },
            ContainerView {
                name: "istio-proxy".into(),
                id: Some(PROXY_ID.into()),
                is_proxy: true,
                state: ContainerState::Running,
                ..ContainerView::default()
            },
        ],
        restart_policy,
        deletion: deletion_grace.map(|grace| Deletion {
            timestamp: plan::timestamp(SystemTime::now()),
            grace,
        }),
        ..PodView::blank(crate::mesh::istio::profile(
            &crate::config::ProxyConfig::default(),
        ))
    }
}

/// A Deployment's pod deleted with a 30 s grace period, its app still running.
fn deleted_running_app() -> PodView {
    view(
        RestartPolicy::Always,
        ContainerState::Running,
        Some(Duration::from_secs(30)),
    )
}

fn fast_settings() -> DrainSettings {
    DrainSettings {
        quit_confirm: Duration::from_millis(200),
        job_rescan_every: Duration::from_millis(100),
        ..DrainSettings::default()
    }
}

/// A pod with a sandbox, a proxy and one app process.
struct Pod {
    procs: FakeProcs,
    _sandbox: Proc,
    _proxy: Proc,
    app: Proc,
}

impl Pod {
    fn new() -> Pod {
        let procs = FakeProcs::default();
        let (sandbox, proxy, app) = (Proc::sleep(), Proc::sleep(), Proc::sleep());
        procs.add(sandbox.pid(), None);
        procs.add(proxy.pid(), Some(PROXY_ID));
        procs.add(app.pid(), Some(APP_ID));
        Pod {
            procs,
            _sandbox: sandbox,
            _proxy: proxy,
            app,
        }
    }
}

static KEY: std::sync::LazyLock<PodKey> = std::sync::LazyLock::new(key);

/// A drain context whose steps are told on the returned channel (what the driver shows, and
/// what a test waits on instead of a sleep).
fn ctx_telling_steps<'a>(
    admin: &'a FakeAdmin,
    procs: FakeProcs,
    rx: watch::Receiver<Option<PodView>>,
    settings: &'a DrainSettings,
) -> (
    DrainCtx<'a, FakeAdmin, FakeProcs>,
    tokio::sync::mpsc::UnboundedReceiver<DrainStep>,
) {
    let (steps_tx, steps) = tokio::sync::mpsc::unbounded_channel();
    let ctx = DrainCtx {
        steps: Some(steps_tx),
        ..ctx(admin, procs, rx, CancellationToken::new(), settings)
    };
    (ctx, steps)
}

/// Waits until the drain tells a step that `wanted` matches; the steps told until then,
/// that one last.
async fn told_until(
    steps: &mut tokio::sync::mpsc::UnboundedReceiver<DrainStep>,
    wanted: impl Fn(&DrainStep) -> bool,
) -> Vec<DrainStep> {
    let mut told = Vec::new();
    let found = tokio::time::timeout(WAIT_LIMIT, async {
        while let Some(step) = steps.recv().await {
            let done = wanted(&step);
            told.push(step);
            if done {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        found,
        Ok(true),
        "the step waited for was not told: {told:?}"
    );
    told
}

fn ctx<'a>(
    admin: &'a FakeAdmin,
    procs: FakeProcs,
    rx: watch::Receiver<Option<PodView>>,
    stop: CancellationToken,
    settings: &'a DrainSettings,
) -> DrainCtx<'a, FakeAdmin, FakeProcs> {
    DrainCtx {
        key: &KEY,
        admin,
        processes: procs,
        view: rx,
        stop,
        settings,
        steps: None,
    }
}

async fn run_drain(
    admin: &FakeAdmin,
    procs: FakeProcs,
    rx: watch::Receiver<Option<PodView>>,
    stop: CancellationToken,
    settings: &DrainSettings,
) -> DrainReport {
    drain(ctx(admin, procs, rx, stop, settings)).await
}

async fn run_job(
    admin: &FakeAdmin,
    procs: FakeProcs,
    rx: watch::Receiver<Option<PodView>>,
    stop: CancellationToken,
    settings: &DrainSettings,
) -> JobReport {
    finish_job(ctx(admin, procs, rx, stop, settings)).await
}

/// The drain or the Job wait with a stop token nobody cancels, while `meanwhile` plays the
/// pod's side.
async fn drain_during(
    admin: &FakeAdmin,
    procs: FakeProcs,
    rx: watch::Receiver<Option<PodView>>,
    settings: &DrainSettings,
    meanwhile: impl Future<Output = ()>,
) -> DrainReport {
    let run = run_drain(admin, procs, rx, CancellationToken::new(), settings);
    tokio::join!(run, meanwhile).0
}

async fn job_during(
    admin: &FakeAdmin,
    procs: FakeProcs,
    rx: watch::Receiver<Option<PodView>>,
    settings: &DrainSettings,
    meanwhile: impl Future<Output = ()>,
) -> JobReport {
    let run = run_job(admin, procs, rx, CancellationToken::new(), settings);
    tokio::join!(run, meanwhile).0
}

/// A drain tells its steps as they happen, in order: the inbound drain (with the version), each
/// app container's exit, the app gone, the quit and why — what the driver shows (phase `quitting`) and tests wait on.
#[tokio::test]
async fn a_drain_tells_its_steps_in_order() {
    let mut pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(0)));
    let (_tx, rx) = watch::channel(Some(deleted_running_app()));
    let settings = fast_settings();
    let (ctx, mut steps) = ctx_telling_steps(&admin, pod.procs.clone(), rx, &settings);
    let (report, ()) = tokio::join!(drain(ctx), async {
        admin.sampled(1).await;
        pod.app.kill();
    });
    assert_eq!(report.outcome, DrainOutcome::AppDone);
    let mut told = Vec::new();
    while let Ok(step) = steps.try_recv() {
        told.push(step);
    }
    let quitting = told.pop();
    told.push(quitting.clone().expect("told the quit"));
    assert_eq!(
        told[..told.len() - 1],
        vec![
            DrainStep::InboundDrained {
                drained: true,
                envoy_version: Some("1.40.0".into()),
            },
            // Seen by procfs before any status says so: no exit code.
            DrainStep::AppContainerExited {
                container: "app".into(),
                exit_code: None,
            },
            DrainStep::AppGone,
        ]
    );
    // No byte moved for the idle window (Envoy keeps its byte counters here).
    assert!(
        matches!(
            quitting,
            Some(DrainStep::Quitting(QuitReason::Idle(
                IdleReason::NoBytesMoved { .. }
            )))
        ),
        "{told:?}"
    );
}

/// The Envoy version only adds advice: an Envoy older than 1.34, whose inbound-only graceful
/// drain drains outbound too (envoyproxy/envoy#35020), gets the same call as pilot-agent sends,
/// and the report says why its outbound keep-alives close; an unreadable or garbled
/// `/server_info` drains as for a current Envoy.
#[tokio::test]
async fn envoy_version_decides_advice_not_the_call() {
    for (info, version, advised) in [
        (
            Some(&br#"{"version":"abc/1.33.2/Clean/RELEASE/BoringSSL"}"#[..]),
            Some("1.33.2"),
            true,
        ),
        (Some(&b"<html>not json</html>"[..]), None, false),
        (None, None, false),
    ] {
        let mut pod = Pod::new();
        let admin = FakeAdmin::new(Some(counts(0)));
        admin.with(|s| s.server_info = info.map(<[u8]>::to_vec));
        let (_tx, rx) = watch::channel(Some(deleted_running_app()));
        let settings = fast_settings();
        let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
            admin.sampled(1).await;
            pod.app.kill();
        })
        .await;
        assert_eq!(report.outcome, DrainOutcome::AppDone, "{report:?}");
        assert_eq!(
            admin.paths(),
            vec![DRAIN_INBOUND_PATH, QUIT_PATH],
            "{info:?}"
        );
        assert_eq!(report.envoy_version.as_deref(), version);
        assert_eq!(
            report
                .advice
                .as_deref()
                .is_some_and(|a| a.contains("35020")),
            advised,
            "{report:?}"
        );
        assert!(
            report.errors.is_empty(),
            "not a drain error: {:?}",
            report.errors
        );
    }
}

#[tokio::test]
async fn quits_as_soon_as_the_app_exits() {
    let mut pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(0)));
    let (_tx, rx) = watch::channel(Some(deleted_running_app()));
    let settings = fast_settings();
    let killed = Arc::new(Mutex::new(None));
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        // The drain's samples span an idle window, none moving, before the app exits.
        admin.samples_span(settings.idle_window).await;
        *killed.lock().unwrap() = Some(Instant::now());
        pod.app.kill();
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::AppDone, "{report:?}");
    // The inbound drain and the quit, nothing that touches outbound (no /healthcheck/fail).
    assert_eq!(admin.paths(), vec![DRAIN_INBOUND_PATH, QUIT_PATH]);
    assert!(report.inbound_drained);
    assert_eq!(report.envoy_version.as_deref(), Some("1.40.0"));
    assert_eq!(report.advice, None);
    // Nothing moved in the idle window before the exit: idle at once.
    assert!(
        matches!(
            report.quit_reason,
            Some(QuitReason::Idle(IdleReason::NoBytesMoved { .. }))
        ),
        "{report:?}"
    );
    assert_eq!(report.app_processes_seen, 1);
    assert_eq!(report.app_processes_left, 0);
    let killed = killed.lock().unwrap().expect("killed");
    let lag = admin.quit_at().expect("quit sent").duration_since(killed);
    assert!(lag < Duration::from_millis(50), "kill to quit took {lag:?}");
    assert!(report.app_gone_to_quit.expect("measured") < Duration::from_millis(50));
    assert!(report.proxy_exit_seen_at.is_some());
    assert_eq!(report.error_count, 0, "{:?}", report.errors);
}

#[tokio::test]
async fn a_forked_helper_keeps_the_app_alive() {
    let mut pod = Pod::new();
    let mut helper = Proc::sleep();
    pod.procs.add(helper.pid(), Some(APP_ID));
    let admin = FakeAdmin::new(None);
    let (_tx, rx) = watch::channel(Some(deleted_running_app()));
    let settings = fast_settings();
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        admin.sampled(1).await;
        pod.app.kill();
        // The drain sees the exit (the look that follows it), then holds for two idle windows.
        pod.procs.rescanned().await;
        admin.watched_for(settings.idle_window * 2).await;
        assert!(admin.quit_at().is_none(), "quit while the helper still ran");
        // A helper forked late is found by the re-scan, and keeps the app alive too.
        let late = Proc::sleep();
        pod.procs.add(late.pid(), Some(APP_ID));
        helper.kill();
        pod.procs.rescanned().await;
        admin.watched_for(settings.idle_window * 3).await;
        assert!(
            admin.quit_at().is_none(),
            "quit while the late helper still ran"
        );
        drop(late);
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::AppDone);
    // No filter: Envoy's byte counters alone said nothing moved.
    assert!(
        matches!(
            report.quit_reason,
            Some(QuitReason::Idle(IdleReason::NoBytesMoved { .. }))
        ),
        "{report:?}"
    );
    assert_eq!(report.app_processes_seen, 3);
}

// Real time: the app's exit is a real pidfd event, and with paused time tokio's clock runs
// ahead while the test waits for it (tried: the quit then reads seconds "late").
#[tokio::test]
async fn idle_keepalives_do_not_hold_the_drain_but_moving_bytes_do() {
    let mut pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(2)));
    admin.with(|s| s.bytes_per_sample = 10);
    let (_tx, rx) = watch::channel(Some(deleted_running_app()));
    let settings = fast_settings();
    let stopped_moving = Arc::new(Mutex::new(None));
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        admin.sampled(1).await;
        pod.app.kill();
        pod.procs.rescanned().await;
        admin.watched_for(settings.idle_window * 2).await;
        assert!(admin.quit_at().is_none(), "quit while bytes were moving");
        admin.with(|s| s.bytes_per_sample = 0);
        *stopped_moving.lock().unwrap() = Some(Instant::now());
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::AppDone);
    assert!(
        matches!(
            report.quit_reason,
            Some(QuitReason::Idle(IdleReason::NoBytesMoved { .. }))
        ),
        "{report:?}"
    );
    // The window runs from the last sample that saw bytes move (a sample interval at most
    // before the test stopped them), and the quit follows its end within a few polls.
    let stopped = stopped_moving.lock().unwrap().expect("set");
    let quit = admin.quit_at().expect("quit");
    let last_moved = admin.with(|s| s.last_moved_at).expect("bytes moved");
    let idle = quit.duration_since(last_moved);
    let after = quit.duration_since(stopped);
    assert!(
        idle >= settings.idle_window && after < settings.idle_window + Duration::from_millis(60),
        "quit {idle:?} after the last bytes seen moving, {after:?} after they stopped (window {:?})",
        settings.idle_window
    );
}

/// Envoy wrote its last byte into the socket and its counters stopped, but the kernel still
/// holds bytes for a slow client: the drain waits for the queue to empty, because the runtime deletes the pod's netns, and those bytes, right after Envoy exits.
#[tokio::test]
async fn bytes_queued_in_the_kernel_hold_the_drain_until_sent() {
    let mut pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(0)));
    admin.with(|s| s.send_queued = Some(400_000));
    let (_tx, rx) = watch::channel(Some(deleted_running_app()));
    let settings = fast_settings();
    let flushed = Arc::new(Mutex::new(None));
    let (ctx, mut steps) = ctx_telling_steps(&admin, pod.procs.clone(), rx, &settings);
    let (report, mut told) = tokio::join!(drain(ctx), async {
        admin.sampled(1).await;
        pod.app.kill();
        // The drain, the app gone, saw the bytes queued; it holds for three idle windows.
        let told = told_until(&mut steps, |s| {
            matches!(s, DrainStep::KernelFlushing { .. })
        })
        .await;
        admin.watched_for(settings.idle_window * 3).await;
        assert!(
            admin.quit_at().is_none(),
            "quit while the kernel still held bytes for the client"
        );
        admin.with(|s| s.send_queued = Some(0));
        *flushed.lock().unwrap() = Some(Instant::now());
        told
    });
    assert_eq!(report.outcome, DrainOutcome::AppDone, "{report:?}");
    // The timeline says why the quit waited, once.
    while let Ok(step) = steps.try_recv() {
        told.push(step);
    }
    assert_eq!(
        told.iter()
            .filter(|s| matches!(s, DrainStep::KernelFlushing { .. }))
            .collect::<Vec<_>>(),
        [&DrainStep::KernelFlushing { bytes: 400_000 }],
        "{told:?}"
    );
    assert!(
        matches!(
            report.quit_reason,
            Some(QuitReason::Idle(IdleReason::NoBytesMoved { .. }))
        ),
        "{report:?}"
    );
    let quit = admin.quit_at().expect("quit");
    let last_queued = admin.with(|s| s.last_queued_at).expect("bytes were queued");
    let flushed = flushed.lock().unwrap().expect("set");
    assert!(quit > last_queued && quit >= flushed);
    // ... and no longer: the bytes stood still all along, so the quit follows the flush within
    // a few polls.
    let after = quit.duration_since(flushed);
    assert!(
        after < settings.idle_window,
        "quit {after:?} after the queue emptied"
    );
}

/// An empty send queue (an idle keep-alive's) holds nothing: the drain quits as soon as the
/// app is gone and no byte moved for a window, as without the check.
#[tokio::test]
async fn an_empty_send_queue_does_not_hold_the_drain() {
    let mut pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(2)));
    admin.with(|s| s.send_queued = Some(0));
    let (_tx, rx) = watch::channel(Some(deleted_running_app()));
    let settings = fast_settings();
    let killed = Arc::new(Mutex::new(None));
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        admin.sampled(1).await;
        pod.app.kill();
        *killed.lock().unwrap() = Some(Instant::now());
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::AppDone, "{report:?}");
    let quit = admin.quit_at().expect("quit");
    let after = quit.duration_since(killed.lock().unwrap().expect("set"));
    assert!(
        after < settings.idle_window + Duration::from_millis(100),
        "quit {after:?} after the app exited (window {:?})",
        settings.idle_window
    );
}

/// A drain with Envoy keeping no byte counters (Istio's default stats matcher): the app exits
/// with one outbound connection open, which closes once the drain has seen it open
/// `close_after` past the exit. Asserts the drain did
/// not quit before, and returns its report.
async fn drain_without_byte_counters(close_after: Duration) -> DrainReport {
    let mut pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(1)));
    admin.with(|s| s.bytes_unexposed = true);
    let (_tx, rx) = watch::channel(Some(deleted_running_app()));
    let report = drain_during(&admin, pod.procs.clone(), rx, &fast_settings(), async {
        admin.sampled(1).await;
        pod.app.kill();
        // The connection stays open until the drain has watched it `close_after` past the
        // exit it saw.
        pod.procs.rescanned().await;
        admin.watched_for(close_after).await;
        assert!(
            admin.quit_at().is_none(),
            "quit by bytes Envoy does not keep"
        );
        admin.with(|s| s.counts = Some(counts(0)));
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::AppDone);
    assert_eq!(
        report.quit_reason,
        Some(QuitReason::Idle(IdleReason::NoConnections))
    );
    assert_eq!(report.last_traffic_bytes, None);
    report
}

/// Without byte counters an open outbound connection after the app's exit holds the drain until
/// it closes, with advice naming the mesh config.
#[tokio::test]
async fn without_byte_counters_an_open_outbound_connection_holds_the_drain_with_advice() {
    let window = fast_settings().idle_window;
    let report = drain_without_byte_counters(window * 3).await;
    let advice = report.advice.expect("advice");
    assert!(advice.contains("proxyStatsMatcher"), "{advice}");
}

/// Without byte counters, the app's own connections closing a few ms after its exit (the usual
/// case) cost nothing worth advice.
#[tokio::test]
async fn without_byte_counters_a_connection_closing_at_once_gives_no_advice() {
    let window = fast_settings().idle_window;
    let report = drain_without_byte_counters(window / 4).await;
    assert_eq!(report.advice, None);
}

/// `kubectl delete --grace-period=1` after a 30 s deletion: the pod update shortens the grace
/// period, and the drain's deadline follows it (issue 28). Past the new deadline the running
/// app keeps its proxy; the kubelet's kill (the proxy gone while the app runs) is then the
/// grace period's end (`deadline`), not an early exit, as it would be before a deadline of 29 s
/// later.
#[tokio::test(start_paused = true)]
async fn a_shortened_grace_period_is_followed() {
    let pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(1)));
    let first = view(
        RestartPolicy::Always,
        ContainerState::Running,
        Some(Duration::from_secs(30)),
    );
    let mut shorter = first.clone();
    if let Some(d) = shorter.deletion.as_mut() {
        d.grace = Duration::from_secs(1);
    }
    let (tx, rx) = watch::channel(Some(first));
    let settings = fast_settings();
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        admin.sampled(1).await;
        tx.send_replace(Some(shorter));
        // Paused time: only tokio's clock passes, past the shortened deadline (no process
        // exits meanwhile: nothing real is awaited).
        tokio::time::sleep(Duration::from_millis(1300)).await;
        admin.with(|s| s.gone = true); // the kubelet's SIGKILL at the shortened grace's end
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::Deadline, "{report:?}");
    assert_eq!(
        admin.quit_at(),
        None,
        "no quit while the app runs: {report:?}"
    );
}

// Paused time: tokio's clock drives the deadline and the waits, so the bounds test the
// logic, not the load of a shared machine.

/// Past the deadline the running app keeps its proxy: holdfast does not quit it (without holdfast
/// Envoy serves the app to the kubelet's kill); the kill, the proxy gone with the app still
/// running, ends the drain as `deadline`, said on the row.
#[tokio::test(start_paused = true)]
async fn past_the_deadline_the_running_app_keeps_its_proxy() {
    let pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(1)));
    // Grace 1 s → margin 100 ms → deadline 900 ms after the (request-time) stamp.
    let (_tx, rx) = watch::channel(Some(view(
        RestartPolicy::Always,
        ContainerState::Running,
        Some(Duration::from_secs(1)),
    )));
    let settings = fast_settings();
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        // Paused time: only tokio's clock passes, past the deadline (no process exits
        // meanwhile: nothing real is awaited).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(admin.quit_at(), None, "no quit at the deadline");
        admin.with(|s| s.gone = true); // the kubelet's SIGKILL
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::Deadline, "{report:?}");
    assert_eq!(report.quit_reason, None);
    assert_eq!(admin.quit_at(), None);
    assert_eq!(report.app_processes_left, 1);
    assert!(
        report
            .errors
            .iter()
            .any(|e| e.contains("deadline came") && e.contains("left running")),
        "{:?}",
        report.errors
    );
}

#[tokio::test]
async fn proxy_gone_before_the_app_is_reported_with_advice() {
    let pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(0)));
    let (_tx, rx) = watch::channel(Some(deleted_running_app()));
    let settings = fast_settings();
    let t = Instant::now();
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        admin.sampled(1).await;
        admin.with(|s| s.gone = true); // pilot-agent's drain duration ran out
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::ProxyGoneEarly);
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "noticed after {:?}",
        t.elapsed()
    );
    let advice = report.advice.expect("advice");
    assert!(
        advice.contains("terminationDrainDuration") && advice.contains("30s"),
        "{advice}"
    );
    assert!(admin.quit_at().is_none());
}

/// A pod whose proxy sets `EXIT_ON_ZERO_ACTIVE_CONNECTIONS` gets the advice that helps it
/// (remove that setting: with it pilot-agent ignores terminationDrainDuration), not the one
/// that cannot (raise terminationDrainDuration). Issue 28: `pod.rs::drain_advice` had no
/// caller.
#[tokio::test]
async fn proxy_gone_early_with_exit_on_zero_gets_its_own_advice() {
    let pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(0)));
    let mut view = deleted_running_app();
    view.switches.exit_on_zero = true;
    let (_tx, rx) = watch::channel(Some(view));
    let report = drain_during(&admin, pod.procs.clone(), rx, &fast_settings(), async {
        admin.sampled(1).await;
        admin.with(|s| s.gone = true);
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::ProxyGoneEarly);
    let advice = report.advice.expect("advice");
    assert!(
        advice.contains("EXIT_ON_ZERO_ACTIVE_CONNECTIONS") && advice.contains("Remove"),
        "{advice}"
    );
}

#[tokio::test]
async fn app_already_gone_and_proxy_already_gone_is_app_done() {
    let procs = FakeProcs::default();
    let admin = FakeAdmin::new(None);
    admin.with(|s| s.gone = true);
    let v = view(
        RestartPolicy::Always,
        ContainerState::Terminated { exit_code: 0 },
        Some(Duration::from_secs(30)),
    );
    let (_tx, rx) = watch::channel(Some(v));
    let report = run_drain(
        &admin,
        procs,
        rx,
        CancellationToken::new(),
        &fast_settings(),
    )
    .await;
    assert_eq!(report.outcome, DrainOutcome::AppDone);
    assert!(!report.inbound_drained);
    assert_eq!(report.quit_sent_at, None);
}

/// Counts that cannot be read say nothing of a response still being sent: the drain does not
/// quit blind once the app is gone (the old rule did, after `admin_attempts` failed samples), nor
/// at the deadline: Envoy ends as without holdfast (its mesh's drain, or the kubelet's kill at
/// the grace period's end), and the row says why.
#[tokio::test(start_paused = true)]
async fn unreadable_stats_leave_the_proxy_to_its_own_end_not_a_blind_quit() {
    let procs = FakeProcs::default();
    let admin = FakeAdmin::new(Some(counts(1)));
    admin.with(|s| s.stats_failures = 1000);
    // Grace 1 s → deadline 900 ms after the stamp.
    let v = view(
        RestartPolicy::Always,
        ContainerState::Terminated { exit_code: 0 },
        Some(Duration::from_secs(1)),
    );
    let (_tx, rx) = watch::channel(Some(v));
    let report = drain_during(&admin, procs, rx, &fast_settings(), async {
        // Paused time, no process at all: only tokio's clock passes, past the deadline.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            admin.quit_at(),
            None,
            "no blind quit, at the deadline either"
        );
        admin.with(|s| s.gone = true); // the grace period's end
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::Deadline, "{report:#?}");
    assert_eq!(report.quit_reason, None);
    assert_eq!(admin.quit_at(), None);
    assert!(
        report
            .errors
            .iter()
            .any(|e| e.contains("could not be read") && e.contains("as without holdfast")),
        "{:?}",
        report.errors
    );
}

// Paused time: no process at all (the fakes answer for Envoy and the pod), so nothing real is
// awaited and tokio's clock can run ahead through the waits.
#[tokio::test(start_paused = true)]
async fn invisible_app_waits_for_status_not_procfs() {
    // No process of the pod is visible at all (wrong proc root, no hostPID): the app's exit
    // cannot be seen, so the drain must not take "no processes" for "app gone".
    let procs = FakeProcs::default();
    let admin = FakeAdmin::new(Some(counts(0)));
    let (tx, rx) = watch::channel(Some(deleted_running_app()));
    let settings = fast_settings();
    let report = drain_during(&admin, procs, rx, &settings, async {
        admin.sampled(1).await;
        admin.watched_for(settings.idle_window * 3).await;
        assert!(
            admin.quit_at().is_none(),
            "quit without seeing the app exit"
        );
        tx.send_replace(Some(view(
            RestartPolicy::Always,
            ContainerState::Terminated { exit_code: 0 },
            Some(Duration::from_secs(30)),
        )));
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::AppDone);
    assert!(
        report.errors.iter().any(|e| e.contains("hostPID")),
        "{:?}",
        report.errors
    );
}

#[tokio::test]
async fn app_that_exited_before_the_first_scan_counts_as_gone() {
    // The proxy's process is visible by container id, so the app container without processes
    // has exited (fast SIGTERM exit), even though the status still says Running.
    let procs = FakeProcs::default();
    let proxy = Proc::sleep();
    procs.add(proxy.pid(), Some(PROXY_ID));
    let admin = FakeAdmin::new(Some(counts(0)));
    let (_tx, rx) = watch::channel(Some(deleted_running_app()));
    let t = Instant::now();
    let report = run_drain(
        &admin,
        procs,
        rx,
        CancellationToken::new(),
        &fast_settings(),
    )
    .await;
    assert_eq!(report.outcome, DrainOutcome::AppDone);
    // No sample before: one idle window of unchanged bytes first.
    let settings = fast_settings();
    assert!(
        admin.quit_at().expect("quit").duration_since(t)
            < settings.idle_window + Duration::from_millis(50)
    );
}

// Paused time: tokio's clock drives the deadline and the waits, so the bounds test the
// logic, not the load of a shared machine.
#[tokio::test(start_paused = true)]
async fn pod_gone_and_agent_stopping_end_the_drain_promptly() {
    let pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(1)));
    let (tx, rx) = watch::channel(Some(deleted_running_app()));
    let settings = fast_settings();
    let t = Instant::now();
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        admin.sampled(1).await;
        tx.send_replace(None);
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::PodGone);
    assert!(t.elapsed() < Duration::from_millis(150));

    let (_tx, rx) = watch::channel(Some(deleted_running_app()));
    let stop = CancellationToken::new();
    let t = Instant::now();
    let sampled = admin.with(|s| s.stats_calls);
    let report = tokio::join!(
        run_drain(&admin, pod.procs.clone(), rx, stop.clone(), &settings),
        async {
            admin.sampled(sampled + 1).await;
            stop.cancel();
        }
    )
    .0;
    assert_eq!(report.outcome, DrainOutcome::AgentStopping);
    assert!(t.elapsed() < Duration::from_millis(150));
    assert!(admin.quit_at().is_none());
}

#[tokio::test]
async fn job_never_completes_from_procfs_before_the_status() {
    let mut pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(0)));
    let (_tx, rx) = watch::channel(Some(view(
        RestartPolicy::Never,
        ContainerState::Running,
        None,
    )));
    let settings = fast_settings();
    let killed = Arc::new(Mutex::new(None));
    let report = job_during(&admin, pod.procs.clone(), rx, &settings, async {
        // The watch has looked at the app's processes (and watches them by pidfd).
        pod.procs.scanned(1).await;
        *killed.lock().unwrap() = Some(Instant::now());
        pod.app.kill();
    })
    .await;
    assert_eq!(report.outcome, JobOutcome::Completed, "{report:?}");
    assert_eq!(report.finished_by, Some(FinishedBy::Procfs));
    assert_eq!(admin.paths(), vec![QUIT_PATH]);
    let lag = admin
        .quit_at()
        .expect("quit")
        .duration_since(killed.lock().unwrap().expect("killed"));
    // The Job's in-flight wait starts with its first sample: one idle window of unchanged bytes.
    assert!(
        lag < settings.idle_window + Duration::from_millis(50),
        "exit to quit {lag:?}"
    );
}

#[tokio::test]
async fn job_on_failure_waits_for_exit_code_zero() {
    let mut pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(0)));
    let (tx, rx) = watch::channel(Some(view(
        RestartPolicy::OnFailure,
        ContainerState::Running,
        None,
    )));
    let settings = fast_settings();
    // The watch's settle wait (its samples) starts once it takes the app as finished.
    let settling = || admin.with(|s| s.stats_calls) > 0 || admin.quit_at().is_some();
    let report = job_during(&admin, pod.procs.clone(), rx, &settings, async {
        pod.procs.scanned(1).await;
        pod.app.kill();
        // The look after the exit, and a periodic one after it (or the settle wait begun).
        let after_exit = pod.procs.scans() + 2;
        until("two looks after the exit", || {
            pod.procs.scans() >= after_exit || settling()
        })
        .await;
        // procfs alone must not end an OnFailure job: the exit code decides.
        assert!(!settling(), "finished without the exit code");
        assert!(admin.quit_at().is_none(), "quit without the exit code");
        tx.send_replace(Some(view(
            RestartPolicy::OnFailure,
            ContainerState::Terminated { exit_code: 1 },
            None,
        )));
        // Two looks after the status changed: the first may have begun before it.
        let after_status = pod.procs.scans() + 2;
        until("two looks after the status", || {
            pod.procs.scans() >= after_status || settling()
        })
        .await;
        assert!(!settling(), "finished although the kubelet restarts it");
        assert!(
            admin.quit_at().is_none(),
            "quit although the kubelet restarts it"
        );
        tx.send_replace(Some(view(
            RestartPolicy::OnFailure,
            ContainerState::Terminated { exit_code: 0 },
            None,
        )));
    })
    .await;
    assert_eq!(report.outcome, JobOutcome::Completed);
    assert_eq!(report.finished_by, Some(FinishedBy::Status));
}

// Paused time: no process at all (the fakes answer for Envoy and the pod), so nothing real is
// awaited and tokio's clock can run ahead through the waits.
#[tokio::test(start_paused = true)]
async fn job_waits_for_in_flight_then_quits() {
    let procs = FakeProcs::default();
    let admin = FakeAdmin::new(Some(counts(1)));
    admin.with(|s| s.bytes_per_sample = 5);
    let (_tx, rx) = watch::channel(Some(view(
        RestartPolicy::Never,
        ContainerState::Terminated { exit_code: 0 },
        None,
    )));
    let settings = fast_settings();
    let report = job_during(&admin, procs, rx, &settings, async {
        admin.sampled(1).await;
        admin.watched_for(settings.idle_window * 3 / 2).await;
        assert!(admin.quit_at().is_none(), "quit while bytes were moving");
        // The connection closes with the last byte; with byte counters the bytes decide.
        admin.with(|s| {
            s.counts = Some(counts(0));
            s.bytes_per_sample = 0;
        });
    })
    .await;
    assert_eq!(report.outcome, JobOutcome::Completed);
    assert!(
        matches!(
            report.quit_reason,
            Some(QuitReason::Idle(IdleReason::NoBytesMoved { .. }))
        ),
        "{report:?}"
    );
}

/// The Job's quit waits for the kernel's send queues too (the same rule).
// Paused time: no process at all (the fakes answer for Envoy and the pod), so nothing real is
// awaited and tokio's clock can run ahead through the waits.
#[tokio::test(start_paused = true)]
async fn job_waits_for_bytes_queued_in_the_kernel() {
    let procs = FakeProcs::default();
    let admin = FakeAdmin::new(Some(counts(0)));
    admin.with(|s| s.send_queued = Some(1));
    let (_tx, rx) = watch::channel(Some(view(
        RestartPolicy::Never,
        ContainerState::Terminated { exit_code: 0 },
        None,
    )));
    let settings = fast_settings();
    let report = job_during(&admin, procs, rx, &settings, async {
        admin.sampled(1).await;
        admin.watched_for(settings.idle_window * 2).await;
        assert!(admin.quit_at().is_none(), "quit while bytes were queued");
        admin.with(|s| s.send_queued = Some(0));
    })
    .await;
    assert_eq!(report.outcome, JobOutcome::Completed, "{report:?}");
    let quit = admin.quit_at().expect("quit");
    let last_queued = admin.with(|s| s.last_queued_at).expect("bytes were queued");
    assert!(quit > last_queued);
}

/// The Job wait of a pod with no processes, as `view` shows it (the view stays open).
async fn job_of(admin: &FakeAdmin, view: PodView, settings: &DrainSettings) -> JobReport {
    let (_tx, rx) = watch::channel(Some(view));
    run_job(
        admin,
        FakeProcs::default(),
        rx,
        CancellationToken::new(),
        settings,
    )
    .await
}

// Paused time: no process at all (the fakes answer for Envoy and the pod), so nothing real is
// awaited and tokio's clock can run ahead through the waits.
#[tokio::test(start_paused = true)]
async fn job_edge_cases() {
    let settings = fast_settings();
    // restartPolicy Always: not a job.
    let admin = FakeAdmin::new(None);
    let r = job_of(
        &admin,
        view(
            RestartPolicy::Always,
            ContainerState::Terminated { exit_code: 0 },
            None,
        ),
        &settings,
    )
    .await;
    assert_eq!(r.outcome, JobOutcome::NotAJob);
    assert!(admin.paths().is_empty());

    // Deletion hands over to the drain.
    let r = job_of(
        &admin,
        view(
            RestartPolicy::Never,
            ContainerState::Running,
            Some(Duration::from_secs(5)),
        ),
        &settings,
    )
    .await;
    assert_eq!(r.outcome, JobOutcome::Deleting);

    // The proxy exited on its own already.
    admin.with(|s| s.gone = true);
    let r = job_of(
        &admin,
        view(
            RestartPolicy::Never,
            ContainerState::Terminated { exit_code: 3 },
            None,
        ),
        &settings,
    )
    .await;
    assert_eq!(r.outcome, JobOutcome::ProxyAlreadyGone);

    // A Never job whose container has not started is not finished.
    let mut v = view(RestartPolicy::Never, ContainerState::Waiting, None);
    v.containers[0].id = None;
    let (_tx, rx) = watch::channel(Some(v));
    let stop = CancellationToken::new();
    let procs = FakeProcs::default();
    let r = tokio::join!(
        run_job(&admin, procs.clone(), rx, stop.clone(), &settings),
        async {
            // The watch looked at the app twice (once periodically): it waits.
            procs.scanned(2).await;
            stop.cancel();
        }
    )
    .0;
    assert_eq!(r.outcome, JobOutcome::AgentStopping);
}

#[test]
fn settle_wait_backs_off_to_stats_every() {
    let s = DrainSettings::default();
    assert_eq!(settle_wait(&s, 1), Duration::from_millis(5));
    assert_eq!(settle_wait(&s, 9), Duration::from_millis(5));
    assert_eq!(settle_wait(&s, 10), Duration::from_millis(10));
    assert_eq!(settle_wait(&s, 35), Duration::from_millis(40));
    assert_eq!(settle_wait(&s, 1000), Duration::from_millis(100));
    assert_eq!(settle_wait(&s, u32::MAX), Duration::from_millis(100));
}

#[test]
fn refusals_are_told_from_other_connect_failures() {
    use crate::effects::envoy_admin::Error;
    let addr: crate::effects::envoy_admin::AdminAddr = "127.0.0.1:15000"
        .parse::<std::net::SocketAddr>()
        .expect("addr")
        .into();
    let refused = Error::Connect {
        addr: addr.clone(),
        reason: "Connection refused (os error 111)".into(),
        refused: true,
        denied: false,
    };
    assert!(AdminFailure::from(refused).refused);
    // Entering the netns failed, or the connector panicked: nothing said about Envoy, whatever
    // the text says.
    for reason in [
        "setns into network namespace NetnsId { dev: 4, ino: 1 } failed: EPERM",
        "connector task failed: task panicked (Connection refused)",
    ] {
        let other = Error::Connect {
            addr: addr.clone(),
            reason: reason.into(),
            refused: false,
            denied: false,
        };
        assert!(!AdminFailure::from(other).refused, "{reason}");
    }
}

#[test]
fn reports_serialize() {
    let report = DrainReport {
        outcome: DrainOutcome::AppDone,
        started_at: SystemTime::UNIX_EPOCH,
        deadline_at: None,
        deadline_meaning: TimestampMeaning::KillTime,
        inbound_drained: true,
        health_checks_restored: 0,
        agent_signalled: false,
        envoy_version: Some("1.36.4".into()),
        app_gone_at: None,
        quit_sent_at: None,
        quit_reason: Some(QuitReason::Idle(IdleReason::NoBytesMoved {
            idle_for: Duration::from_millis(120),
        })),
        proxy_exit_seen_at: None,
        app_gone_to_quit: Some(Duration::from_micros(2500)),
        app_gone_to_proxy_exit: None,
        elapsed: Duration::from_millis(40),
        app_processes_seen: 1,
        app_processes_left: 0,
        filter_present: Some(true),
        last_counts: None,
        last_traffic_bytes: Some(1234),
        errors: vec![],
        error_count: 0,
        advice: None,
    };
    let json = serde_json::to_value(&report).expect("serializes");
    assert_eq!(json["outcome"], "app-done");
    assert_eq!(json["app_gone_to_quit_ms"], 2.5);
    assert_eq!(json["quit_reason"]["kind"], "idle");
    assert_eq!(json["quit_reason"]["reason"], "no-bytes-moved");
    assert_eq!(json["quit_reason"]["for_ms"], 120.0);
    let back: DrainReport = serde_json::from_value(json).expect("deserializes");
    assert_eq!(back, report);
    let settings = serde_json::to_value(DrainSettings::default()).expect("serializes");
    assert_eq!(settings["idle_window"], "100ms");
}

/// A pod deleted while its app container never started (still `waiting`: ContainerCreating, a
/// slow image pull) gets no early quit: "no app process" is not "app finished" (issue 10 item
/// 1), and no quit at the deadline either; the grace period's end ends its drain. Paused time:
/// the deadline is tokio's.
#[tokio::test(start_paused = true)]
async fn an_app_that_never_started_gets_no_early_quit() {
    let procs = FakeProcs::default();
    let (sandbox, proxy) = (Proc::sleep(), Proc::sleep());
    procs.add(sandbox.pid(), None);
    procs.add(proxy.pid(), Some(PROXY_ID));
    let admin = FakeAdmin::new(Some(counts(0)));
    let mut v = view(
        RestartPolicy::Always,
        ContainerState::Waiting,
        Some(Duration::from_secs(2)),
    );
    v.containers[0].id = None;
    let (_tx, rx) = watch::channel(Some(v));
    let settings = fast_settings();
    let report = drain_during(&admin, procs, rx, &settings, async {
        // Paused time: only tokio's clock passes, past the deadline (the sandbox and proxy
        // never exit meanwhile: nothing real is awaited).
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(admin.quit_at(), None, "no quit, at the deadline either");
        admin.with(|s| s.gone = true); // the kubelet's SIGKILL
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::Deadline, "{report:#?}");
    assert_eq!(report.quit_reason, None);
    drop((sandbox, proxy));
}

const SHIPPER_ID: &str = "ssss";

/// A native-sidecar pod being deleted (30 s grace): `istio-proxy` a restartable init container,
/// with Istio's preStop drain or not, and optionally a log shipper (a native sidecar started
/// after the proxy, so the kubelet stops it before the proxy).
fn native_view(istio_prestop: bool, shipper: bool) -> PodView {
    let mut v = deleted_running_app();
    let proxy = v.containers.remove(1);
    v.mode = crate::pod::SidecarMode::Native;
    v.prestop_drain = istio_prestop;
    v.init_containers = vec![ContainerView {
        restartable: true,
        ..proxy
    }];
    if shipper {
        v.init_containers.push(ContainerView {
            name: "log-shipper".into(),
            id: Some(SHIPPER_ID.into()),
            state: ContainerState::Running,
            restartable: true,
            ..ContainerView::default()
        });
    }
    v
}

/// A native sidecar with Istio's preStop drain: the kubelet ends the proxy after the app (its
/// SIGTERM, ~50 ms later), so holdfast sends nothing — no inbound drain (the preStop did it),
/// no quit — and reports the measured lag as `kubelet-ordered`. The control: the same pod
/// without that preStop gets the inbound drain and is quit once the app is gone.
#[tokio::test]
async fn a_native_sidecar_with_istios_prestop_is_left_to_the_kubelet() {
    let mut pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(0)));
    let (_tx, rx) = watch::channel(Some(native_view(true, false)));
    let settings = fast_settings();
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        admin.sampled(1).await;
        pod.app.kill();
        pod.procs.rescanned().await;
        // The kubelet's SIGTERM to pilot-agent, ~50 ms after the app is gone: Envoy exits.
        // This sleep is the kubelet's lag the drain measures (the scenario), not a wait.
        tokio::time::sleep(Duration::from_millis(60)).await;
        admin.with(|s| s.gone = true);
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::KubeletOrdered, "{report:?}");
    assert_eq!(admin.paths(), Vec::<String>::new(), "holdfast sent a POST");
    assert!(!report.inbound_drained);
    assert!(report.quit_sent_at.is_none());
    let lag = report.app_gone_to_proxy_exit.expect("the lag, measured");
    assert!(
        (Duration::from_millis(40)..Duration::from_millis(1000)).contains(&lag),
        "{lag:?}"
    );
    assert_eq!(report.advice, None);

    // The control: no Istio preStop (global.proxy.lifecycle): the full drain.
    let mut pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(0)));
    let (_tx, rx) = watch::channel(Some(native_view(false, false)));
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        admin.sampled(1).await;
        pod.app.kill();
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::AppDone, "{report:?}");
    assert_eq!(admin.paths(), vec![DRAIN_INBOUND_PATH, QUIT_PATH]);
}

/// Without Istio's preStop, a native proxy is ended on evidence, but only once every regular
/// container *and* every native sidecar started after it (which the kubelet stops before it:
/// kuberuntime_termination_order.go) has exited: a log shipper still flushing keeps the proxy.
/// The control: the shipper's exit lets the quit go at once.
#[tokio::test]
async fn a_native_proxy_outlives_the_sidecars_started_after_it() {
    let mut pod = Pod::new();
    let mut shipper = Proc::sleep();
    pod.procs.add(shipper.pid(), Some(SHIPPER_ID));
    let admin = FakeAdmin::new(Some(counts(0)));
    let (_tx, rx) = watch::channel(Some(native_view(false, true)));
    let settings = fast_settings();
    let shipper_killed = Arc::new(Mutex::new(None));
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        admin.sampled(1).await;
        pod.app.kill();
        // The app is gone; the shipper flushes for a while: no quit meanwhile.
        pod.procs.rescanned().await;
        admin.watched_for(settings.idle_window * 4).await;
        assert!(admin.quit_at().is_none(), "quit while the shipper ran");
        *shipper_killed.lock().unwrap() = Some(Instant::now());
        shipper.kill();
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::AppDone, "{report:?}");
    let killed = shipper_killed.lock().unwrap().expect("shipper killed");
    let quit = admin.quit_at().expect("quit sent");
    assert!(quit >= killed, "quit before the shipper exited");
    assert!(
        quit.duration_since(killed) < Duration::from_millis(100),
        "the shipper's exit to the quit took {:?}",
        quit.duration_since(killed)
    );
    assert_eq!(report.app_processes_seen, 2);
}

/// A native proxy that exits during termination while the app runs cannot come back (the
/// kubelet restarts no sidecar then: KEP-4438 is not in 1.33–1.35): `sidecar-lost`, with
/// advice naming it, whether or not Istio's preStop drained it. The control is the classic
/// pod's `proxy-gone-early` (proxy_gone_before_the_app_is_reported_with_advice).
#[tokio::test]
async fn a_native_proxy_lost_during_termination_is_sidecar_lost() {
    for istio_prestop in [true, false] {
        let pod = Pod::new();
        let admin = FakeAdmin::new(Some(counts(0)));
        let (_tx, rx) = watch::channel(Some(native_view(istio_prestop, false)));
        let settings = fast_settings();
        let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
            admin.sampled(1).await;
            admin.with(|s| s.gone = true); // OOM-killed
        })
        .await;
        assert_eq!(report.outcome, DrainOutcome::SidecarLost, "{report:?}");
        let advice = report.advice.expect("advice");
        assert!(advice.contains("KEP-4438"), "{advice}");
        assert!(report.proxy_exit_seen_at.is_some());
        assert!(admin.quit_at().is_none());
        assert_eq!(report.app_processes_left, 1);
    }
}

/// The kubelet removes a pod object only once every container has stopped, the proxy last; a
/// loaded agent can see that removal before its own samples see Envoy's port refuse. In a
/// kubelet-ordered drain that removal is the end it watched for (`kubelet-ordered`, the lag an
/// upper bound, said in the errors), not `pod-gone`. The control: a classic pod's drain whose
/// object goes stays `pod-gone` (its end was the agent's to make).
#[tokio::test]
async fn a_kubelet_ordered_drain_whose_pod_object_goes_first_is_still_kubelet_ordered() {
    let mut pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(0)));
    let (tx, rx) = watch::channel(Some(native_view(true, false)));
    let settings = fast_settings();
    let (ctx, mut steps) = ctx_telling_steps(&admin, pod.procs.clone(), rx, &settings);
    let (report, ()) = tokio::join!(drain(ctx), async {
        admin.sampled(1).await;
        pod.app.kill();
        // Once the drain has seen the app gone, Envoy still answers the agent: the removal
        // comes first.
        while let Some(step) = steps.recv().await {
            if step == DrainStep::AppGone {
                break;
            }
        }
        tx.send_replace(None);
    });
    assert_eq!(report.outcome, DrainOutcome::KubeletOrdered, "{report:?}");
    assert_eq!(admin.paths(), Vec::<String>::new(), "holdfast sent a POST");
    assert!(report.app_gone_to_proxy_exit.is_some(), "{report:?}");
    assert!(
        report.errors.iter().any(|e| e.contains("upper bound")),
        "{report:?}"
    );

    let pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(1)));
    let (tx, rx) = watch::channel(Some(deleted_running_app()));
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        admin.sampled(1).await;
        tx.send_replace(None);
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::PodGone, "{report:?}");
}

/// A finished Job whose Envoy still answers after `/quitquitquit` (a wedged proxy, a
/// pilot-agent that restarts it) is `proxy-not-stopped`, with what was seen in `errors` — the
/// pod will not complete, and the operator must hear of it. The control: the same Job whose
/// Envoy exits on the quit is `completed`.
// Paused time: no process at all (the fakes answer for Envoy and the pod), so nothing real is
// awaited and tokio's clock can run ahead through the waits.
#[tokio::test(start_paused = true)]
async fn a_job_whose_proxy_still_answers_after_the_quit_is_proxy_not_stopped() {
    let settings = fast_settings();
    let finished = || {
        view(
            RestartPolicy::Never,
            ContainerState::Terminated { exit_code: 0 },
            None,
        )
    };
    let admin = FakeAdmin::new(Some(counts(0)));
    admin.with(|s| s.quit_exits = false);
    let report = job_of(&admin, finished(), &settings).await;
    assert_eq!(report.outcome, JobOutcome::ProxyNotStopped, "{report:?}");
    assert!(report.quit_sent_at.is_some(), "{report:?}");
    assert!(report.proxy_exit_seen_at.is_none(), "{report:?}");
    assert!(
        report.errors.iter().any(|e| e.contains("still answered")),
        "{report:?}"
    );

    let admin = FakeAdmin::new(Some(counts(0)));
    let report = job_of(&admin, finished(), &settings).await;
    assert_eq!(report.outcome, JobOutcome::Completed, "{report:?}");
}

/// A Kuma classic pod: kuma-dp fails Envoy's health check on SIGTERM (`/healthcheck/fail`),
/// which drain-closes the app's outbound connections for its fixed 30 s. The drain undoes it
/// (`/healthcheck/ok`) while the app still runs, and ends the proxy on evidence once the app is
/// gone. The control: an Istio pod whose health check is failed by someone else gets no
/// `/healthcheck/ok` (pilot-agent never fails it; holdfast does not touch what it did not
/// cause), nor does a Kuma native pod whose kubelet-ordered drain holdfast only measures.
#[tokio::test]
async fn kumas_failed_health_check_is_undone_while_the_app_calls_out() {
    let kuma = || {
        let mut v = deleted_running_app();
        v.profile = crate::mesh::kuma::profile();
        v.containers[1].name = "kuma-sidecar".into();
        v
    };
    let mut pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(0)));
    // kuma-dp's SIGTERM handler, as the kubelet stops the pod.
    admin.with(|s| s.health_check_failed = true);
    let (_tx, rx) = watch::channel(Some(kuma()));
    let settings = fast_settings();
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        // Outbound is not drain-closed while the app still runs.
        until("the failed health check undone while the app ran", || {
            !admin.with(|s| s.health_check_failed)
        })
        .await;
        pod.app.kill();
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::AppDone, "{report:?}");
    assert_eq!(
        admin.paths(),
        vec![DRAIN_INBOUND_PATH, HEALTHCHECK_OK_PATH, QUIT_PATH]
    );
    assert_eq!(report.health_checks_restored, 1);

    // Control: Istio's pod, health check failed by someone else: not touched.
    let mut pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(0)));
    admin.with(|s| s.health_check_failed = true);
    let (_tx, rx) = watch::channel(Some(deleted_running_app()));
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        // Two samples, each of which could have restored it, while the app runs.
        admin.sampled(2).await;
        pod.app.kill();
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::AppDone, "{report:?}");
    assert_eq!(admin.paths(), vec![DRAIN_INBOUND_PATH, QUIT_PATH]);
    assert_eq!(report.health_checks_restored, 0);

    // Control: Kuma native with its preStop drain: the kubelet orders it, nothing is sent.
    let mut pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(0)));
    admin.with(|s| s.health_check_failed = true);
    let mut native = native_view(true, false);
    native.profile = crate::mesh::kuma::profile();
    let (_tx, rx) = watch::channel(Some(native));
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        admin.sampled(2).await;
        pod.app.kill();
        // The kubelet's SIGTERM once the app is gone: Envoy exits.
        pod.procs.rescanned().await;
        admin.with(|s| s.gone = true);
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::KubeletOrdered, "{report:?}");
    assert_eq!(admin.paths(), Vec::<String>::new());
}

/// kuma-dp fails the health check at its SIGTERM, moments before the drain's samples; Envoy's
/// `server.state` gauge shows it only at the next stats flush (5 s), so the drain asks `/ready`,
/// which answers at once: undone within a sample, not 5 s later (the e2e saw 3 s with the gauge
/// alone). Fails when the drain reads only the gauge.
#[tokio::test]
async fn kumas_failed_health_check_is_seen_before_the_gauge_flush() {
    let mut pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(0)));
    admin.with(|s| {
        s.health_check_failed = true;
        s.gauge_stale = true;
    });
    let mut v = deleted_running_app();
    v.profile = crate::mesh::kuma::profile();
    v.containers[1].name = "kuma-sidecar".into();
    let (_tx, rx) = watch::channel(Some(v));
    let settings = fast_settings();
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        // Three samples (the gauge in each still says "not failed"): undone by then.
        admin.sampled(3).await;
        assert!(
            !admin.with(|s| s.health_check_failed),
            "the failed health check is still failed three samples into the drain"
        );
        pod.app.kill();
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::AppDone, "{report:?}");
    assert_eq!(report.health_checks_restored, 1);
}

/// Consul's native sidecar has no preStop drain: consul-dataplane drains at its SIGTERM (after
/// the app exited) and then waits a fixed 30 s; the full drain ends it on evidence as soon as
/// the app is gone. Kuma's native sidecar drains at its preStop (`killall -USR2 kuma-dp`) and
/// exits at its SIGTERM: kubelet-ordered, as Istio's.
#[test]
fn which_native_sidecars_the_kubelet_orders_by_mesh() {
    use super::decide::{drain_kind, DrainKind};
    let consul = {
        let mut v = native_view(false, false);
        v.profile = crate::mesh::consul::profile();
        v
    };
    assert_eq!(drain_kind(&consul), DrainKind::Full);
    let kuma = {
        let mut v = native_view(true, false);
        v.profile = crate::mesh::kuma::profile();
        v
    };
    assert_eq!(drain_kind(&kuma), DrainKind::KubeletOrdered);
}

/// kuma-dp, once SIGTERMed, waits its fixed drainTime (30 s) whatever Envoy does; its second
/// SIGTERM ends it at once with exit 0 (kumahq/kuma app/kuma-dp/cmd/run.go). After quitting
/// Envoy the drain sends the proxy container's main process that SIGTERM (the real signalling:
/// pidfd, start time checked). The control: an Istio pod's pilot-agent exits with Envoy, and is
/// never signalled.
#[tokio::test]
async fn kuma_dp_gets_the_sigterm_that_ends_its_fixed_wait() {
    let kuma = || {
        let mut v = deleted_running_app();
        v.profile = crate::mesh::kuma::profile();
        v.containers[1].name = "kuma-sidecar".into();
        v
    };
    let mut pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(0)));
    let (_tx, rx) = watch::channel(Some(kuma()));
    let settings = fast_settings();
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        admin.sampled(1).await;
        pod.app.kill();
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::AppDone, "{report:?}");
    assert!(report.agent_signalled, "{report:?}");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    // The stand-in for kuma-dp (`sleep`) ended on that SIGTERM.
    let status = pod._proxy.0.wait().expect("wait");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");

    let mut pod = Pod::new();
    let admin = FakeAdmin::new(Some(counts(0)));
    let (_tx, rx) = watch::channel(Some(deleted_running_app()));
    let report = drain_during(&admin, pod.procs.clone(), rx, &settings, async {
        admin.sampled(1).await;
        pod.app.kill();
    })
    .await;
    assert_eq!(report.outcome, DrainOutcome::AppDone, "{report:?}");
    assert!(!report.agent_signalled);
    assert_eq!(
        pod._proxy.0.try_wait().expect("try_wait"),
        None,
        "pilot-agent was signalled"
    );
}

/// Kubernetes 1.35's container restart rules (KEP-5307, beta and on by default): a `Never` Job
/// whose app has `restartPolicy: Never` and a rule restarting it on exit code 42 is not finished
/// when the app exits 42 (the kubelet restarts it, and the retried app needs its proxy), by the
/// status or by procfs; it is when the app exits 0.
#[test]
fn a_job_app_retried_by_its_restart_rule_is_not_finished() {
    use super::app_exit::{AppContainer, AppSnapshot};
    use crate::pod::app_end::{ContainerRestart, RestartRule};
    let retried = ContainerRestart {
        policy: Some(RestartPolicy::Never),
        rules: vec![RestartRule {
            restarts: true,
            exit_code_in: Some(true),
            values: vec![42],
        }],
    };
    let job = |app: ContainerState| {
        let mut v = view(RestartPolicy::Never, app, None);
        v.containers[0].ran = true;
        v.containers[0].restart = retried.clone();
        v
    };
    let gone = |c: AppContainer| AppSnapshot {
        live: 0,
        containers: vec![("app".into(), c)],
    };
    // Exit 42: the kubelet restarts the app, by status or procfs alike.
    let v = job(ContainerState::Terminated { exit_code: 42 });
    assert_eq!(
        decide::job_finished(&v, &gone(AppContainer::Terminated { exit_code: 42 })),
        None
    );
    assert_eq!(decide::job_finished(&v, &gone(AppContainer::Exited)), None);
    // The same pod without the rule: finished (what holdfast did before reading the rules).
    let mut plain = v.clone();
    plain.containers[0].restart = ContainerRestart::default();
    assert_eq!(
        decide::job_finished(&plain, &gone(AppContainer::Exited)),
        Some(FinishedBy::Status)
    );
    // Exit 0: finished for good.
    let v = job(ContainerState::Terminated { exit_code: 0 });
    assert_eq!(
        decide::job_finished(&v, &gone(AppContainer::Terminated { exit_code: 0 })),
        Some(FinishedBy::Status)
    );
}
