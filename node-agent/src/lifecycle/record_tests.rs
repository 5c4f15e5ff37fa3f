//! Every metric and every Event reason moves when its outcome happens: each test drives the
//! machine through a pod's life, hands its effects to a [`Recorder`] with a real registry, board
//! and a capturing event sink, and reads the rendered `/metrics` text.

use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::api::{DrainOutcome, DrainReport, JobOutcome, JobReport};
use crate::effects::netns::NetnsId;
use crate::lifecycle::facts::RestartPolicy;
use crate::lifecycle::machine::{step, Effect, Input, Now, PodFacts, Released, Seen, State, Timer};
use crate::pod::{ContainerState, Deletion};
use crate::report::metrics::MetricsHandle;

struct Harness {
    handle: MetricsHandle,
    rec: Recorder,
    events: tokio::sync::mpsc::UnboundedReceiver<(PodKey, Reason, String)>,
    state: State,
    now: Instant,
}

fn key() -> PodKey {
    PodKey {
        uid: "0b5c6d1e-1111-4222-8333-444455556666".into(),
        namespace: "shop".into(),
        name: "web-1".into(),
    }
}

fn facts(policy: RestartPolicy, deleting: bool) -> PodFacts {
    PodFacts {
        deletion: deleting.then(|| Deletion {
            timestamp: Timestamp::from_second(1_795_327_237).expect("timestamp"),
            grace: Duration::from_secs(30),
        }),
        restart_policy: policy,
        apps: vec![(Some("app".into()), ContainerState::Running)],
        app_restarts: Vec::new(),
        proxy: Some((Some("proxy".into()), ContainerState::Running)),
        user_init_running: false,
        hold_timeout: Duration::from_secs(120),
        terminal: false,
        mode: SidecarMode::Classic,
        restarting_in_place: false,
        proxy_startup_probe: false,
    }
}

impl Harness {
    fn new(pod: PodFacts) -> Harness {
        let handle = MetricsHandle::new();
        let (events, rx) = PodEvents::capturing();
        let rec = Recorder {
            key: key(),
            board: StatusBoard::default(),
            metrics: handle.metrics.clone(),
            events,
        };
        rec.start(
            None,
            crate::api::SidecarMode::Classic,
            crate::api::Mesh::Istio,
        );
        let now = Instant::now();
        let (state, fx) = State::new(
            pod,
            Duration::from_millis(5),
            Now {
                mono: now,
                wall: SystemTime::now(),
            },
        );
        let h = Harness {
            handle,
            rec,
            events: rx,
            state,
            now,
        };
        h.apply(fx);
        h
    }

    fn apply(&self, fx: Vec<Effect>) {
        for e in fx {
            match e {
                Effect::Record(o) => self.rec.outcome(&o),
                Effect::SetPhase(p) => self.rec.phase(p),
                Effect::Problem(m) => self.rec.problem(m),
                Effect::Step(k, d) => self.rec.step(k, d),
                Effect::Ignored { stage, input } => self.rec.ignored(stage, input),
                _ => {}
            }
        }
    }

    fn feed(&mut self, inputs: Vec<Input>) -> &mut Self {
        for input in inputs {
            self.now += Duration::from_millis(40);
            let (state, fx) = step(
                self.state.clone(),
                input,
                Now {
                    mono: self.now,
                    wall: SystemTime::now(),
                },
            );
            self.state = state;
            self.apply(fx);
        }
        self
    }

    /// Up to holding (netns found, proxy down, hold set up).
    fn hold(&mut self) -> &mut Self {
        self.feed(vec![
            Input::NetnsFound {
                netns: NetnsId { dev: 1, ino: 2 },
            },
            Input::Readiness(Seen::Down),
            Input::HoldSetUp {
                adopted: false,
                app_running: false,
                age: Duration::ZERO,
            },
        ])
    }

    fn metric(&self, series: &str) -> f64 {
        let text = self.handle.encode(&self.rec.board);
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no series {series} in\n{text}"))
    }

    fn reasons(&mut self) -> Vec<Reason> {
        let mut out = Vec::new();
        while let Ok((pod, reason, _)) = self.events.try_recv() {
            assert_eq!(pod, key());
            out.push(reason);
        }
        out
    }

    fn row(&self) -> crate::api::PodStatus {
        self.rec.board.snapshot().pop().expect("a row")
    }
}

fn released(connections: u64) -> Input {
    Input::HoldReleased(Released {
        connections,
        packets: connections + 1,
        ready_to_release: Some(Duration::from_micros(700)),
        first_held_at: None,
    })
}

#[test]
fn hold_released_moves_hold_metrics_and_posts_hold_released() {
    let mut h = Harness::new(facts(RestartPolicy::Always, false));
    h.hold();
    assert_eq!(h.metric("holdfast_holds_started_total"), 1.0);
    assert_eq!(
        h.metric("holdfast_pods{phase=\"holding\",mode=\"classic\",mesh=\"istio\"}"),
        1.0
    );
    h.feed(vec![Input::Readiness(Seen::Ready), released(3)]);
    assert_eq!(
        h.metric("holdfast_holds_released_total{outcome=\"ready\"}"),
        1.0
    );
    assert_eq!(h.metric("holdfast_held_connections_total"), 3.0);
    assert_eq!(h.metric("holdfast_hold_duration_seconds_count"), 1.0);
    assert_eq!(h.metric("holdfast_hold_release_latency_seconds_count"), 1.0);
    assert_eq!(
        h.metric("holdfast_pods{phase=\"ready\",mode=\"classic\",mesh=\"istio\"}"),
        1.0
    );
    assert_eq!(h.reasons(), [Reason::HoldReleased]);
    let hold = h.row().hold.expect("hold record");
    assert_eq!(hold.connections_held, 3);
    assert!(hold.released_at.is_some());
}

#[test]
fn hold_deadline_posts_hold_deadline_and_sets_last_error() {
    let mut h = Harness::new(facts(RestartPolicy::Always, false));
    h.hold()
        .feed(vec![Input::Timer(Timer::HoldDeadline), released(1)]);
    assert_eq!(
        h.metric("holdfast_holds_released_total{outcome=\"deadline\"}"),
        1.0
    );
    assert_eq!(h.reasons(), [Reason::HoldDeadline]);
    assert!(h
        .row()
        .last_error
        .expect("last_error")
        .contains("hold deadline"));
}

#[test]
fn other_hold_ends_are_counted_by_outcome() {
    let mut h = Harness::new(facts(RestartPolicy::Always, false));
    h.hold().feed(vec![Input::AgentStop]);
    assert_eq!(
        h.metric("holdfast_holds_released_total{outcome=\"agent-stopped\"}"),
        1.0
    );
    let mut h = Harness::new(facts(RestartPolicy::Always, false));
    h.hold().feed(vec![
        Input::Pod(Some(facts(RestartPolicy::Always, true))),
        released(0),
    ]);
    assert_eq!(
        h.metric("holdfast_holds_released_total{outcome=\"pod-deleted\"}"),
        1.0
    );
    let mut h = Harness::new(facts(RestartPolicy::Always, false));
    h.feed(vec![
        Input::NetnsFound {
            netns: NetnsId { dev: 1, ino: 2 },
        },
        Input::Readiness(Seen::Down),
        Input::HoldFailed("no queue".into()),
    ]);
    assert_eq!(
        h.metric("holdfast_holds_released_total{outcome=\"failed\"}"),
        1.0
    );
    assert!(h.row().last_error.expect("last_error").contains("no queue"));
    assert!(h.reasons().is_empty());
}

#[test]
fn a_late_hold_is_on_the_row() {
    let mut h = Harness::new(facts(RestartPolicy::Always, false));
    h.feed(vec![
        Input::NetnsFound {
            netns: NetnsId { dev: 1, ino: 2 },
        },
        Input::Readiness(Seen::Down),
        Input::HoldSetUp {
            adopted: false,
            app_running: true,
            age: Duration::ZERO,
        },
    ]);
    let row = h.row();
    assert!(row.hold.expect("hold").late);
    assert!(row
        .last_error
        .expect("last_error")
        .contains("already running"));
}

/// Drives a drain to `report`'s outcome; returns the harness.
fn drained(report: DrainReport) -> Harness {
    let mut h = Harness::new(facts(RestartPolicy::Always, true));
    h.feed(vec![
        Input::NetnsFound {
            netns: NetnsId { dev: 1, ino: 2 },
        },
        Input::Readiness(Seen::Up),
    ]);
    assert_eq!(
        h.metric("holdfast_pods{phase=\"draining\",mode=\"classic\",mesh=\"istio\"}"),
        1.0
    );
    h.feed(vec![Input::QuitStarted]);
    assert_eq!(
        h.metric("holdfast_pods{phase=\"quitting\",mode=\"classic\",mesh=\"istio\"}"),
        1.0
    );
    h.feed(vec![Input::DrainFinished(Box::new(report))]);
    h
}

#[test]
fn drain_app_done_moves_every_drain_metric_and_posts_drain_completed() {
    let mut r = DrainReport::new(DrainOutcome::AppDone, SystemTime::now());
    r.elapsed = Duration::from_millis(1500);
    r.app_gone_to_quit = Some(Duration::from_millis(3));
    r.app_gone_to_proxy_exit = Some(Duration::from_millis(9));
    r.error_count = 2;
    r.errors = vec!["POST /healthcheck/fail failed".into()];
    let mut h = drained(r);
    assert_eq!(h.metric("holdfast_drains_total{outcome=\"app-done\"}"), 1.0);
    assert_eq!(h.metric("holdfast_drain_duration_seconds_count"), 1.0);
    assert_eq!(h.metric("holdfast_drain_duration_seconds_sum"), 1.5);
    assert_eq!(h.metric("holdfast_drain_exit_lag_seconds_count"), 1.0);
    assert_eq!(h.metric("holdfast_drain_errors_total"), 2.0);
    assert_eq!(
        h.metric("holdfast_pods{phase=\"done\",mode=\"classic\",mesh=\"istio\"}"),
        1.0
    );
    assert_eq!(h.reasons(), [Reason::DrainCompleted]);
    let row = h.row();
    assert_eq!(row.drain.expect("drain").outcome, DrainOutcome::AppDone);
    assert!(row.last_error.expect("last_error").contains("healthcheck"));
}

#[test]
fn drain_deadline_posts_drain_deadline() {
    let mut h = drained(DrainReport::new(DrainOutcome::Deadline, SystemTime::now()));
    assert_eq!(h.metric("holdfast_drains_total{outcome=\"deadline\"}"), 1.0);
    assert_eq!(h.reasons(), [Reason::DrainDeadline]);
}

#[test]
fn proxy_gone_early_posts_proxy_exited_before_app_with_advice() {
    let mut r = DrainReport::new(DrainOutcome::ProxyGoneEarly, SystemTime::now());
    r.advice = Some("Set terminationDrainDuration".into());
    let mut h = drained(r);
    assert_eq!(
        h.metric("holdfast_drains_total{outcome=\"proxy-gone-early\"}"),
        1.0
    );
    assert_eq!(h.reasons(), [Reason::ProxyExitedBeforeApp]);
    assert_eq!(
        h.row().last_error.as_deref(),
        Some("Set terminationDrainDuration")
    );
}

#[test]
fn drain_pod_gone_and_agent_stopping_are_counted() {
    for outcome in [DrainOutcome::PodGone, DrainOutcome::AgentStopping] {
        let mut h = drained(DrainReport::new(outcome, SystemTime::now()));
        let series = format!("holdfast_drains_total{{outcome=\"{}\"}}", outcome.as_str());
        assert_eq!(h.metric(&series), 1.0);
        assert!(h.reasons().is_empty());
    }
}

#[test]
fn a_completed_job_posts_job_proxy_stopped() {
    let mut h = Harness::new(facts(RestartPolicy::Never, false));
    h.feed(vec![
        Input::NetnsFound {
            netns: NetnsId { dev: 1, ino: 2 },
        },
        Input::Readiness(Seen::Ready),
    ]);
    let mut r = JobReport::new(JobOutcome::Completed);
    r.error_count = 1;
    h.feed(vec![Input::JobFinished(Box::new(r))]);
    assert_eq!(h.metric("holdfast_jobs_total{outcome=\"completed\"}"), 1.0);
    assert_eq!(h.metric("holdfast_drain_errors_total"), 1.0);
    assert_eq!(h.reasons(), [Reason::JobProxyStopped]);
    assert_eq!(h.row().job.expect("job").outcome, JobOutcome::Completed);
}

#[test]
fn a_job_whose_proxy_was_not_stopped_posts_a_warning_and_counts() {
    let mut h = Harness::new(facts(RestartPolicy::Never, false));
    h.feed(vec![
        Input::NetnsFound {
            netns: NetnsId { dev: 1, ino: 2 },
        },
        Input::Readiness(Seen::Ready),
    ]);
    let mut r = JobReport::new(JobOutcome::ProxyNotStopped);
    r.errors = vec!["the proxy still answered 1s after /quitquitquit".into()];
    r.error_count = 1;
    h.feed(vec![Input::JobFinished(Box::new(r))]);
    assert_eq!(
        h.metric("holdfast_jobs_total{outcome=\"proxy-not-stopped\"}"),
        1.0
    );
    assert_eq!(h.metric("holdfast_jobs_total{outcome=\"completed\"}"), 0.0);
    assert_eq!(h.reasons(), [Reason::JobProxyNotStopped]);
    let row = h.row();
    assert_eq!(row.job.expect("job").outcome, JobOutcome::ProxyNotStopped);
    assert!(
        row.last_error
            .as_deref()
            .is_some_and(|e| e.contains("still answered")),
        "{:?}",
        row.last_error
    );
}

#[test]
fn skipped_pods_get_a_row_and_a_phase_count() {
    let handle = MetricsHandle::new();
    let board = StatusBoard::default();
    Recorder::skipped(&board, &key(), "gateway: no sidecar interception");
    let row = board.snapshot().pop().expect("row");
    assert_eq!(row.phase, crate::api::Phase::Skipped);
    assert_eq!(
        row.skipped_reason.as_deref(),
        Some("gateway: no sidecar interception")
    );
    let v = serde_json::to_value(&row).expect("json");
    assert_eq!(v["phase"], "skipped");
    let text = handle.encode(&board);
    assert!(
        text.contains("holdfast_pods{phase=\"skipped\",mode=\"none\",mesh=\"none\"} 1"),
        "{text}"
    );
}

#[test]
fn a_job_whose_proxy_was_already_gone_is_counted_without_an_event() {
    let mut h = Harness::new(facts(RestartPolicy::OnFailure, false));
    assert_eq!(
        h.metric("holdfast_pods{phase=\"waiting_for_netns\",mode=\"classic\",mesh=\"istio\"}"),
        1.0
    );
    h.feed(vec![
        Input::NetnsFound {
            netns: NetnsId { dev: 1, ino: 2 },
        },
        Input::Readiness(Seen::Ready),
        Input::JobFinished(Box::new(JobReport::new(JobOutcome::ProxyAlreadyGone))),
    ]);
    assert_eq!(
        h.metric("holdfast_jobs_total{outcome=\"proxy-already-gone\"}"),
        1.0
    );
    assert!(h.reasons().is_empty());
}

fn step_kinds(row: &crate::api::PodStatus) -> Vec<&'static str> {
    row.timeline
        .as_ref()
        .expect("this agent's rows have a timeline")
        .steps
        .iter()
        .map(|s| s.step.as_str())
        .collect()
}

/// The recorder writes the row's timeline from the machine's steps, its own outcomes and the
/// drain executor's steps, in time order: first sight to the proxy's exit, with the first held
/// connection dated when its packet was held, and the quit's reason in words.
#[test]
fn the_timeline_follows_hold_release_and_drain_in_order() {
    let mut h = Harness::new(facts(RestartPolicy::Always, false));
    h.hold();
    let first_held = SystemTime::now();
    h.feed(vec![
        Input::Readiness(Seen::Live),
        Input::Readiness(Seen::Ready),
    ]);
    h.feed(vec![Input::HoldReleased(Released {
        connections: 2,
        packets: 3,
        ready_to_release: Some(Duration::from_micros(700)),
        first_held_at: Some(first_held),
    })]);
    h.feed(vec![Input::Pod(Some(facts(RestartPolicy::Always, true)))]);
    h.rec.drain_step(&DrainStep::InboundDrained {
        drained: true,
        envoy_version: Some("1.40.0".into()),
    });
    h.rec.drain_step(&DrainStep::AppContainerExited {
        container: "app".into(),
        exit_code: Some(0),
    });
    h.rec.drain_step(&DrainStep::AppGone);
    h.rec.drain_step(&DrainStep::KernelFlushing { bytes: 4096 });
    h.rec.drain_step(&DrainStep::Quitting(QuitReason::Idle(
        IdleReason::NoOutboundConnections,
    )));
    let mut report = DrainReport::new(DrainOutcome::AppDone, SystemTime::now());
    report.proxy_exit_seen_at = Some(SystemTime::now());
    report.app_gone_to_proxy_exit = Some(Duration::from_millis(3));
    h.feed(vec![
        Input::QuitStarted,
        Input::DrainFinished(Box::new(report)),
    ]);
    let row = h.row();
    assert_eq!(
        step_kinds(&row),
        [
            "first-seen",
            "proxy-running",
            "netns-found",
            "hold-in",
            "first-connection-held",
            "envoy-live",
            "proxy-ready",
            "hold-released",
            "drain-started",
            "inbound-drained",
            "app-container-exited",
            "app-gone",
            "kernel-flushing",
            "quitting",
            "proxy-exited",
            "drain-finished",
        ]
    );
    let tl = row.timeline.as_ref().expect("timeline");
    assert!(tl.steps.windows(2).all(|w| w[0].at <= w[1].at), "{tl:#?}");
    let step = |k: &str| tl.steps.iter().find(|s| s.step.as_str() == k).expect(k);
    assert_eq!(step("first-connection-held").at, first_held);
    let detail = |k: &str| step(k).detail.clone().unwrap_or_default();
    assert!(detail("hold-released").starts_with("ready: held 2 connection(s)"));
    assert_eq!(
        detail("app-container-exited"),
        "app (exit code 0, by its status)"
    );
    assert_eq!(
        detail("quitting"),
        "nothing in flight: no outbound connection open"
    );
    assert!(detail("drain-finished").starts_with("app-done after "));
    assert_eq!(tl.dropped, 0);
}

/// A native sidecar lost during the termination is its own step, with the drain's end after it.
#[test]
fn a_sidecar_lost_is_a_step() {
    let mut h = Harness::new(facts(RestartPolicy::Always, true));
    h.feed(vec![
        Input::NetnsFound {
            netns: NetnsId { dev: 1, ino: 2 },
        },
        Input::Readiness(Seen::Up),
    ]);
    let mut report = DrainReport::new(DrainOutcome::SidecarLost, SystemTime::now());
    report.proxy_exit_seen_at = Some(SystemTime::now());
    report.app_processes_left = 1;
    h.feed(vec![Input::DrainFinished(Box::new(report))]);
    let kinds = step_kinds(&h.row());
    assert_eq!(
        kinds[kinds.len() - 3..],
        ["drain-started", "sidecar-lost", "drain-finished"],
        "{kinds:?}"
    );
}

/// A Job's end on the timeline: the app finished (and how it was seen), the quit and why, the
/// proxy's exit, the Job watch's end with its outcome.
#[test]
fn a_jobs_end_is_on_the_timeline() {
    let mut h = Harness::new(facts(RestartPolicy::Never, false));
    h.feed(vec![
        Input::NetnsFound {
            netns: NetnsId { dev: 1, ino: 2 },
        },
        Input::Readiness(Seen::Ready),
    ]);
    h.rec
        .drain_step(&DrainStep::JobFinished(FinishedBy::Status));
    h.rec.drain_step(&DrainStep::Quitting(QuitReason::NoFilter));
    let mut r = JobReport::new(JobOutcome::Completed);
    r.proxy_exit_seen_at = Some(SystemTime::now());
    r.app_finished_to_quit = Some(Duration::from_millis(14));
    h.feed(vec![Input::QuitStarted, Input::JobFinished(Box::new(r))]);
    let row = h.row();
    assert_eq!(
        step_kinds(&row),
        [
            "first-seen",
            "proxy-running",
            "netns-found",
            "proxy-ready",
            "job-app-finished",
            "quitting",
            "proxy-exited",
            "job-finished",
        ]
    );
    let tl = row.timeline.as_ref().expect("timeline");
    let detail = |i: usize| tl.steps[i].detail.clone().unwrap_or_default();
    assert_eq!(detail(4), "seen in the pod's status");
    assert!(detail(5).starts_with("the holdfast filter is not installed"));
    assert_eq!(
        detail(7),
        "completed: proxy quit 14.0 ms after the app finished"
    );
}

/// Issue 29: a row's pod-controlled strings are cut (the cut said) and escaped whatever the pod
/// sends, so one pod's row stays small and `/status` cannot outgrow the CLI's 16 MiB cap because
/// of it. Before, a 3 MB env value reached `last_error` and a step whole, Debug-escaped.
#[test]
fn one_pods_row_stays_small_and_one_line_whatever_it_sends() {
    let hostile = |n: usize| format!("\r\nforged\u{9b}\u{202e}{}", "\u{1}".repeat(n));
    let mut h = Harness::new(facts(RestartPolicy::Always, true));
    h.rec.start(
        Some(hostile(3 << 20)),
        crate::api::SidecarMode::Classic,
        crate::api::Mesh::Istio,
    );
    h.rec.problem(hostile(3 << 20));
    let mut r = DrainReport::new(DrainOutcome::AppDone, SystemTime::now());
    r.errors = (0..10).map(|_| hostile(1 << 20)).collect();
    h.feed(vec![
        Input::NetnsFound {
            netns: NetnsId { dev: 1, ino: 2 },
        },
        Input::Readiness(Seen::Up),
        Input::QuitStarted,
        Input::DrainFinished(Box::new(r)),
    ]);
    for _ in 0..100 {
        h.rec.problem(hostile(1 << 20));
    }
    let json = serde_json::to_string(&h.row()).expect("json");
    // 10 drain errors, last_error and 40 step details, each bounded.
    assert!(json.len() < 200 * 1024, "row is {} bytes", json.len());
    let row = h.row();
    let last = row.last_error.expect("last_error");
    assert!(last.contains("bytes cut]"), "{last}");
    for text in std::iter::once(&last).chain(&row.drain.expect("drain").errors) {
        assert!(
            !text.chars().any(crate::api::text::is_unsafe_char),
            "{text:?}"
        );
    }
    for s in &row.timeline.expect("timeline").steps {
        let d = s.detail.as_deref().unwrap_or("");
        assert!(!d.chars().any(crate::api::text::is_unsafe_char), "{d:?}");
    }
    // A skipped pod's reason (a container arg, an annotation) too.
    let board = StatusBoard::default();
    Recorder::skipped(&board, &key(), &hostile(3 << 20));
    let row = board.snapshot().pop().expect("row");
    let why = row.skipped_reason.expect("reason");
    assert!(
        why.len() < 8 * 1024 && why.contains("bytes cut]"),
        "{}",
        why.len()
    );
    assert!(!why.chars().any(crate::api::text::is_unsafe_char));
}

/// An input its stage ignores is counted by stage and input, once per input (the machine's side:
/// `machine_tests::an_ignored_input_is_said`); an input acted on is not.
#[test]
fn an_ignored_input_is_counted() {
    let mut h = Harness::new(facts(RestartPolicy::Always, false));
    h.hold();
    let series = "holdfast_inputs_ignored_total{stage=\"holding\",input=\"proxy-gone\"}";
    assert!(
        !h.handle.encode(&h.rec.board).contains(series),
        "nothing ignored yet"
    );
    h.feed(vec![Input::ProxyGone, Input::ProxyGone]);
    assert_eq!(h.metric(series), 2.0);
    // A readiness answer while holding is acted on (a poll scheduled): not counted.
    h.feed(vec![Input::Readiness(Seen::Down)]);
    let text = h.handle.encode(&h.rec.board);
    assert!(!text.contains("input=\"readiness\""), "{text}");
}
