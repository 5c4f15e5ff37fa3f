//! Tests of `holdfast status`: rendering, 80 columns, escaping, remote errors.
use super::*;
use crate::api::{
    DrainOutcome, DrainReport, FilterCounts, HoldOutcome, HoldRecord, IdleReason, JobOutcome,
    JobReport, Phase, PodStatus, QuitReason, SidecarMode, TimestampMeaning,
};
use crate::cli::table::{
    escape_controls, fit_middle, needs_escape, short_duration, short_ms, wrap_limited,
    NATIVE_DETAIL,
};
use std::io::Read;
use std::net::TcpListener;

fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

fn pod(name: &str, phase: Phase) -> PodStatus {
    PodStatus {
        namespace: "ns".into(),
        name: name.into(),
        uid: "5a7e2c1b-0000-4000-8000-000000000001".into(),
        phase,
        mode: Some(SidecarMode::Classic),
        mesh: Some(crate::api::Mesh::Istio),
        tracked_since: t(0),
        hold: None,
        drain: None,
        job: None,
        last_error: None,
        skipped_reason: None,
        timeline: None,
    }
}

fn hold(n: u64, secs: u64, outcome: Option<HoldOutcome>) -> HoldRecord {
    HoldRecord {
        started_at: Some(t(1)),
        released_at: outcome.map(|_| t(1 + secs)),
        packets_held: n + 1,
        connections_held: n,
        ready_to_release_ms: outcome.map(|_| 0.412),
        outcome,
        ..HoldRecord::default()
    }
}

fn drain(outcome: DrainOutcome, elapsed_ms: u64) -> DrainReport {
    DrainReport {
        outcome,
        started_at: t(10),
        deadline_at: Some(t(40)),
        deadline_meaning: TimestampMeaning::KillTime,
        inbound_drained: true,
        health_checks_restored: 0,
        agent_signalled: false,
        envoy_version: Some("1.36.4".into()),
        app_gone_at: Some(t(18)),
        quit_sent_at: Some(t(18)),
        quit_reason: Some(QuitReason::Idle(IdleReason::NoOutboundConnections)),
        proxy_exit_seen_at: Some(t(18)),
        app_gone_to_quit: Some(Duration::from_millis(12)),
        app_gone_to_proxy_exit: Some(Duration::from_millis(35)),
        elapsed: Duration::from_millis(elapsed_ms),
        app_processes_seen: 1,
        app_processes_left: 0,
        filter_present: Some(true),
        last_counts: Some(FilterCounts::default()),
        last_traffic_bytes: Some(0),
        errors: vec![],
        error_count: 0,
        advice: None,
    }
}

fn job(outcome: JobOutcome) -> JobReport {
    JobReport {
        outcome,
        finished_by: None,
        app_finished_at: Some(t(5)),
        quit_sent_at: Some(t(5)),
        quit_reason: Some(QuitReason::NoFilter),
        proxy_exit_seen_at: Some(t(5)),
        app_finished_to_quit: Some(Duration::from_millis(14)),
        errors: vec![],
        error_count: 0,
    }
}

/// A node with one pod in every interesting state.
fn fixture() -> NodeStatus {
    let mut held = pod("fetch-config", Phase::Ready);
    held.hold = Some(hold(3, 2, Some(HoldOutcome::Ready)));
    let mut holding = pod("slow-starter", Phase::Holding);
    holding.hold = Some(HoldRecord {
        late: true,
        ..hold(1, 0, None)
    });
    let mut drained = pod("flusher", Phase::Done);
    drained.drain = Some(drain(DrainOutcome::AppDone, 8_123));
    let mut job_done = pod("batch-x7k2p", Phase::Done);
    job_done.job = Some(job(JobOutcome::Completed));
    let mut early = pod(
        "a-deployment-with-a-very-long-name-7d9f8c6b5-x2x9z",
        Phase::Done,
    );
    let mut d = drain(DrainOutcome::ProxyGoneEarly, 5_004);
    d.advice = Some("Envoy exited 3.0 s before the app: set the mesh's terminationDrainDuration to at least the pod's terminationGracePeriodSeconds (30 s) so the agent can end the drain".into());
    early.drain = Some(d);
    early.last_error = Some("admin API at 127.0.0.1:15000 in the pod's netns: connection refused\n(after /quitquitquit)".into());
    let mut deadline = pod("never-ready", Phase::Ready);
    deadline.hold = Some(hold(2, 120, Some(HoldOutcome::Deadline)));
    deadline.last_error = Some(
        "hold deadline (120 s) passed before the proxy was ready; released (fail open)".into(),
    );
    NodeStatus {
        node: "worker-1".into(),
        agent_version: "0.1.0".into(),
        pods: vec![
            held,
            holding,
            drained,
            job_done,
            early,
            deadline,
            pod("new", Phase::WaitingForNetns),
        ],
        source_problems: vec![],
        startup_taint: None,
    }
}

#[test]
fn table_shows_every_pod_state() {
    let table = render_table(&fixture(), t(3));
    println!("{table}");
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("no row for {name}:\n{table}"))
            .to_string()
    };
    assert!(table.starts_with("node worker-1, holdfast 0.1.0, 7 pods\n"));
    let r = row("ns/fetch-config");
    assert!(
        r.contains("ready") && r.contains("3 (2.0s)") && r.contains("0.41ms"),
        "{r}"
    );
    // Still holding: the duration runs up to now (t(3) - t(1)).
    assert!(row("slow-starter").contains("1 (2.0s)"), "{table}");
    assert!(row("flusher").contains(" app-done 8.1s"), "{table}");
    assert!(row("flusher").contains(" classic "), "{table}");
    assert!(
        row("ns/batch-x7k2p").contains("job completed 14ms"),
        "{table}"
    );
    assert!(row("ns/new").contains("waiting"), "{table}");
    // Long name: middle dropped, both ends kept.
    let long = row("x2x9z");
    assert!(long.starts_with("ns/a-dep..5-x2x9z "), "{long}");
    assert!(long.contains(" proxy-gone-early 5.0s"), "{long}");
    // Advice and errors go on indented lines below their row, one line each.
    assert!(
        table.contains("\n    advice: Envoy exited 3.0 s before the app"),
        "{table}"
    );
    assert!(table.contains("\n    error: admin API at 127.0.0.1:15000 in the pod's netns: connection refused\n    (after /quitquitquit)\n"), "{table}");
    assert!(table.contains("\n    hold ended: deadline\n"), "{table}");
    assert!(
        table.contains(
            "ns/slow-starter   istio  classic holding  1 (2.0s) -       -\n    hold went in late"
        ),
        "{table}"
    );
}

#[test]
fn table_fits_80_columns() {
    let table = render_table(&fixture(), t(3));
    for line in table.lines() {
        assert!(
            line.chars().count() <= TABLE_WIDTH,
            "{} chars: {line:?}",
            line.chars().count()
        );
    }
    // And with extreme values everywhere.
    let mut s = fixture();
    s.node = "n".repeat(200);
    for p in &mut s.pods {
        p.namespace = "ns".repeat(40);
        p.last_error = Some("e ".repeat(300));
        if let Some(h) = &mut p.hold {
            h.connections_held = u64::MAX;
            h.ready_to_release_ms = Some(1e12);
        }
        if let Some(d) = &mut p.drain {
            d.elapsed = Duration::from_secs(1 << 40);
        }
    }
    let table = render_table(&s, t(3));
    for line in table.lines() {
        assert!(
            line.chars().count() <= TABLE_WIDTH,
            "{} chars: {line:?}",
            line.chars().count()
        );
    }
}

#[test]
fn empty_node_says_so() {
    let s = NodeStatus {
        node: "worker-1".into(),
        agent_version: "0.1.0".into(),
        pods: vec![],
        source_problems: vec![],
        startup_taint: None,
    };
    assert_eq!(
        render_table(&s, t(0)),
        "node worker-1, holdfast 0.1.0, no meshed pods tracked\n"
    );
}

#[test]
fn json_round_trips_through_the_served_format() {
    let s = fixture();
    let body = serde_json::to_string_pretty(&s).expect("serialize");
    let agent = AgentUrl::parse(DEFAULT_AGENT_URL).expect("url");
    let back = parse_status(&agent, &body).expect("parse");
    assert_eq!(back.pods, s.pods);
    let err = parse_status(&agent, "{\"pods\": 3}").expect_err("not a status");
    assert_eq!(err.exit_code(), 5);
    assert!(
        err.to_string().contains("not a holdfast status document"),
        "{err}"
    );
}

#[test]
fn truncation() {
    assert_eq!(fit_end("abcdef", 6), "abcdef");
    assert_eq!(fit_end("abcdefg", 6), "abc...");
    assert_eq!(fit_end("abcdefg", 2), "ab");
    assert_eq!(
        fit_middle("default/web-7d9f8c6b5-x2x9z", 16),
        "default..5-x2x9z"
    );
    assert_eq!(
        fit_middle("default/web-7d9f8c6b5-x2x9z", 16)
            .chars()
            .count(),
        16
    );
    assert_eq!(fit_middle("short", 16), "short");
    assert_eq!(fit_middle("ééééééééé", 5), "éé..é");
    assert_eq!(short_duration(Duration::from_millis(340)), "340ms");
    assert_eq!(short_duration(Duration::from_millis(2_140)), "2.1s");
    assert_eq!(short_duration(Duration::from_secs(75)), "75s");
    assert_eq!(short_duration(Duration::from_secs(720)), "12m");
    assert_eq!(short_ms(0.412), "0.41ms");
    assert_eq!(short_ms(12.34), "12.3ms");
    assert_eq!(short_ms(340.0), "340ms");
    assert_eq!(short_ms(2_140.0), "2.1s");
    assert_eq!(short_ms(f64::NAN), "?");
    assert_eq!(wrap("aaa bbb ccc", 7), "aaa bbb\nccc\n");
    assert_eq!(
        wrap_limited("aaa bbb ccc ddd eee", 7, 2),
        vec!["aaa bbb", "ccc ..."]
    );
    assert_eq!(wrap_limited("aaa bbb ccc", 7, 2), vec!["aaa bbb", "ccc"]);
}

#[test]
fn agent_urls() {
    let u = AgentUrl::parse("http://127.0.0.1:15300").expect("plain");
    assert_eq!(
        (u.authority.as_str(), u.path("/status")),
        ("127.0.0.1:15300", "/status".to_string())
    );
    let u = AgentUrl::parse("127.0.0.1:15300/").expect("no scheme");
    assert_eq!(u.path("/status"), "/status");
    let u = AgentUrl::parse("http://[::1]:15300").expect("v6");
    assert_eq!(u.authority, "[::1]:15300");
    let u = AgentUrl::parse(
        "http://localhost:8001/api/v1/namespaces/holdfast/pods/holdfast-x:15300/proxy/",
    )
    .expect("base path");
    assert_eq!(
        u.path("/status"),
        "/api/v1/namespaces/holdfast/pods/holdfast-x:15300/proxy/status"
    );
    assert_eq!(
        AgentUrl::parse("http://agent").expect("no port").authority,
        "agent:80"
    );
    for bad in [
        "https://127.0.0.1:15300",
        "ftp://x:1",
        "http://:15300",
        "http://h:99999",
        "::1:15300",
        "http://h:1/s?x",
    ] {
        let e = AgentUrl::parse(bad).expect_err(bad);
        assert_eq!(e.exit_code(), 2, "{bad}");
        assert!(e.to_string().contains("--status-listen"), "{e}");
    }
}

/// Serves one canned answer on a local port; returns the agent URL.
fn serve_once(answer: &'static [u8]) -> AgentUrl {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = s.write_all(answer);
        }
    });
    AgentUrl::parse(&format!("http://{addr}")).expect("url")
}

#[test]
fn fetch_reports_each_failure_with_its_fix() {
    let t = Duration::from_secs(2);
    // Nothing listens: a port just freed.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let url = AgentUrl::parse(&format!("http://127.0.0.1:{port}")).expect("url");
    let e = fetch_status_body(&url, t).expect_err("nothing listens");
    assert_eq!(e.exit_code(), 3);
    assert!(e.to_string().starts_with(&format!("no holdfast agent answers at http://127.0.0.1:{port}: is the agent running on this node, and is --agent its --status-listen address?")), "{e}");

    let e = fetch_status_body(
        &serve_once(b"HTTP/1.1 404 Not Found\r\ncontent-length: 10\r\n\r\nnot found\n"),
        t,
    )
    .expect_err("404");
    assert_eq!(e.exit_code(), 4);
    assert!(
        e.to_string().contains("404 Not Found") && e.to_string().contains("not found"),
        "{e}"
    );

    let e = fetch_status(
        &serve_once(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi"),
        t,
    )
    .expect_err("not JSON");
    assert_eq!(e.exit_code(), 5);

    let body = serde_json::to_string(&fixture()).expect("json");
    let answer: &'static [u8] = Box::leak(
        format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
        .into_boxed_slice(),
    );
    let s = fetch_status(&serve_once(answer), t).expect("a status");
    assert_eq!(s.pods.len(), 7);

    // Accepts but never answers: bounded by the timeout.
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = AgentUrl::parse(&format!("http://{}", l.local_addr().expect("addr"))).expect("url");
    let started = Instant::now();
    let e = fetch_status_body(&url, Duration::from_millis(300)).expect_err("silent");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(e.to_string().contains("no answer within"), "{e}");
    drop(l);
}

#[test]
fn huge_or_negative_release_times_from_the_wire_do_not_panic() {
    // 1e300 ms overflows Duration: `Duration::from_secs_f64` panicked here.
    let mut s = fixture();
    if let Some(h) = &mut s.pods[0].hold {
        h.ready_to_release_ms = Some(1e300);
    }
    if let Some(h) = &mut s.pods[1].hold {
        h.ready_to_release_ms = Some(-5.0);
    }
    let body = serde_json::to_string(&s).expect("json");
    assert!(body.contains("1e+300"), "{body}");
    let answer: &'static [u8] = Box::leak(
        format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
        .into_boxed_slice(),
    );
    let served = fetch_status(&serve_once(answer), Duration::from_secs(2)).expect("a status");
    let table = render_table(&served, t(3));
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_default()
            .to_string()
    };
    assert!(row("fetch-config").contains(" ? "), "{table}");
    assert!(row("slow-starter").contains(" ? "), "{table}");
    assert_eq!(short_ms(1e300), "?");
    assert_eq!(short_ms(f64::INFINITY), "?");
    assert_eq!(short_ms(-0.5), "?");
}

/// Native-sidecar rows say their mode and what holdfast does for them (the kubelet orders
/// start and stop; holdfast covers a proxy restart), a kubelet-ordered deletion its measured
/// lag, a lost sidecar its outcome; classic and skipped rows get no such line.
#[test]
fn native_rows_say_what_holdfast_does() {
    let mut s = fixture();
    let mut rehold = pod("native-web", Phase::Ready);
    rehold.mode = Some(SidecarMode::Native);
    rehold.mesh = Some(crate::api::Mesh::Kuma);
    rehold.hold = Some(hold(1, 3, Some(HoldOutcome::Ready)));
    rehold.last_error = Some("the native sidecar's proxy exited while the app runs: the kubelet restarts it after its CrashLoopBackOff back-off".into());
    let mut stopped = pod("nat-stopped", Phase::Done);
    stopped.mode = Some(SidecarMode::Native);
    let mut d = drain(DrainOutcome::KubeletOrdered, 1_040);
    d.app_gone_to_proxy_exit = Some(Duration::from_millis(42));
    d.quit_sent_at = None;
    stopped.drain = Some(d);
    let mut lost = pod("native-lost", Phase::Done);
    lost.mode = Some(SidecarMode::Native);
    let mut d = drain(DrainOutcome::SidecarLost, 2_300);
    d.advice =
        Some("the native sidecar's proxy exited during the pod's termination (KEP-4438)".into());
    lost.drain = Some(d);
    let mut gw = pod("gw-7d9", Phase::Skipped);
    gw.mode = None;
    gw.mesh = None;
    gw.skipped_reason = Some("not a sidecar pod".into());
    s.pods.extend([rehold, stopped, lost, gw]);
    let table = render_table(&s, t(3));
    println!("{table}");
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[1].starts_with("POD               MESH   MODE    PHASE"),
        "{table}"
    );
    let at = |name: &str| {
        lines
            .iter()
            .position(|l| l.contains(name))
            .unwrap_or_else(|| panic!("no row for {name}:\n{table}"))
    };
    let r = at("native-web");
    assert!(lines[r].contains(" kuma   native  ready "), "{table}");
    assert!(lines[r].contains("1 (3.0s)"), "{table}");
    assert_eq!(lines[r + 1], format!("    {NATIVE_DETAIL}"), "{table}");
    assert!(
        lines[r + 2].starts_with("    error: the native sidecar's proxy exited"),
        "{table}"
    );
    let r = at("nat-stopped");
    assert!(
        lines[r].contains(" native  done ") && lines[r].contains(" kubelet-ordered 1.0s"),
        "{table}"
    );
    assert_eq!(lines[r + 1], format!("    {NATIVE_DETAIL}"), "{table}");
    assert_eq!(
        lines[r + 2],
        "    stopped by the kubelet: proxy exited 42ms after the app",
        "{table}"
    );
    let r = at("native-lost");
    assert!(lines[r].contains(" sidecar-lost 2.3s"), "{table}");
    assert!(
        lines[r + 2].contains("advice: the native sidecar's proxy exited"),
        "{table}"
    );
    // Classic and skipped rows: their mode (or none), no native line.
    let r = at("ns/fetch-config");
    assert!(lines[r].contains(" classic ready "), "{table}");
    assert!(!lines[r + 1].contains("native"), "{table}");
    let r = at("gw-7d9");
    assert!(lines[r].contains(" -      -       skipped "), "{table}");
    assert_eq!(table.matches(NATIVE_DETAIL).count(), 3, "{table}");
    for line in table.lines() {
        assert!(line.chars().count() <= TABLE_WIDTH, "{line:?}");
    }
}

#[test]
fn skipped_pods_show_why() {
    let mut s = fixture();
    let mut gw = pod("gw-7d9", Phase::Skipped);
    gw.skipped_reason = Some(
        "not a sidecar pod: the proxy is the only container (a gateway, waypoint or ztunnel)"
            .into(),
    );
    s.pods.push(gw);
    let table = render_table(&s, t(3));
    println!("{table}");
    let row = table
        .lines()
        .position(|l| l.contains("gw-7d9"))
        .expect("the skipped pod has a row");
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[row].contains("skipped"), "{table}");
    assert!(
        lines[row + 1].contains("left alone: not a sidecar pod"),
        "{table}"
    );
}

#[test]
fn terminal_control_characters_are_escaped() {
    let mut s = fixture();
    s.node = "worker\x07-1".into();
    // OSC (set the window title), CSI via ESC and via C1, and a bidi override.
    s.pods[0].name = "w\x1b]0;\x07".into();
    s.pods[1].last_error = Some("boom \x1b[2J\u{9b}31m red \u{202e}txt \x00 \x7f".into());
    if let Some(d) = &mut s.pods[4].drain {
        d.advice = Some("advice with \x1b[1m bold".into());
    }
    let table = render_table(&s, t(3));
    println!("{table}");
    assert!(
        table.chars().all(|c| c == '\n' || !needs_escape(c)),
        "a control character reached the table: {table:?}"
    );
    assert!(table.contains("worker\\x07-1"), "{table}");
    assert!(table.contains("ns/w\\x1b]0;\\x07 "), "{table}");
    assert!(table.contains("\\x1b[2J\\x9b31m"), "{table}");
    assert!(table.contains("\\u{202e}txt"), "{table}");
    assert!(table.contains("\\x1b[1m"), "{table}");
    assert_eq!(escape_controls("plain ünïcode"), "plain ünïcode");
    // Through --agent too: an error body from a wrong service is escaped.
    let e = fetch_status_body(
        &serve_once(b"HTTP/1.1 500 Oops\r\ncontent-length: 6\r\n\r\n\x1b]0;x"),
        Duration::from_secs(2),
    )
    .expect_err("500");
    assert!(!e.to_string().contains('\x1b'), "{e}");
}

/// Issue 29: `--json` (the node's document and one pod's row) prints no raw C1 control or bidi
/// override, even from an agent that served them raw (serde_json escapes only C0); the JSON
/// still means the same.
#[test]
fn json_output_escapes_c1_and_bidi() {
    let mut s = fixture();
    let hostile = "boom \u{9b}2J \u{85}next \u{202e}txt \u{2066}";
    s.pods[1].last_error = Some(hostile.into());
    s.pods[1].timeline = Some(Default::default());
    let body = serde_json::to_string(&s).expect("json");
    assert!(body.contains('\u{9b}'), "serde_json writes C1 raw");
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let answer: &'static [u8] = Box::leak(answer.into_bytes().into_boxed_slice());
    for pod in [
        None,
        Some(format!("{}/{}", s.pods[1].namespace, s.pods[1].name)),
    ] {
        let url = serve_once(answer);
        let opts = StatusOptions {
            agent: url.to_string(),
            json: true,
            watch: false,
            node: None,
            timeout: Duration::from_secs(2),
            pod: pod.clone(),
        };
        let mut out = Vec::new();
        run(&opts, &mut out).expect("status --json");
        let out = String::from_utf8(out).expect("utf-8");
        assert!(
            !out.chars()
                .any(|c| c != '\n' && crate::api::text::is_unsafe_char(c)),
            "{pod:?}: {out:?}"
        );
        let v: serde_json::Value = serde_json::from_str(&out).expect("still JSON");
        let row = if pod.is_some() { &v } else { &v["pods"][1] };
        assert_eq!(row["last_error"], hostile, "{pod:?}");
    }
}

#[test]
fn chunked_and_malformed_answers() {
    let body = serde_json::to_string(&fixture()).expect("json");
    let (a, b) = body.split_at(body.len() / 2);
    let answer: &'static [u8] = Box::leak(
        format!(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        )
        .into_bytes()
        .into_boxed_slice(),
    );
    let s = fetch_status(&serve_once(answer), Duration::from_secs(2)).expect("chunked");
    assert_eq!(s.pods.len(), 7);
    for garbage in [
        &b"SSH-2.0-OpenSSH\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{}",
        b"",
    ] {
        let e =
            fetch_status_body(&serve_once(garbage), Duration::from_secs(2)).expect_err("garbage");
        assert_eq!(e.exit_code(), 5, "{e}");
    }
}

#[test]
fn remote_errors_have_distinct_exit_codes() {
    use crate::cli::remote::RemoteError;
    let e = |source| StatusCliError::Remote {
        node: "worker-2".into(),
        source,
    };
    assert_eq!(
        e(RemoteError::Config("no kubeconfig".into())).exit_code(),
        2
    );
    let forbidden = e(RemoteError::Forbidden {
        what: "create pods/portforward".into(),
        namespace: "holdfast-system".into(),
    });
    assert_eq!(forbidden.exit_code(), 6);
    assert!(forbidden.to_string().contains("--node worker-2"));
    assert_eq!(
        e(RemoteError::NoAgent {
            node: "worker-2".into(),
            namespace: "holdfast-system".into()
        })
        .exit_code(),
        3
    );
    // Through the port-forward the agent's own answers keep --agent's codes.
    assert_eq!(
        e(RemoteError::AgentStatus {
            pod: "holdfast-abcde".into(),
            status: "500 Internal Server Error".into(),
            body: String::new(),
        })
        .exit_code(),
        4
    );
    assert_eq!(
        e(RemoteError::BadAnswer {
            pod: "holdfast-abcde".into(),
            why: "invalid HTTP version".into(),
        })
        .exit_code(),
        5
    );
}

/// Every error maps to a code of the one table `--help` prints, and every code of the table
/// but 0 is some error's.
#[test]
fn exit_codes_come_from_the_documented_table() {
    use crate::cli::remote::RemoteError;
    let s = || String::from("x");
    let remote = |source| StatusCliError::Remote { node: s(), source };
    let errors = vec![
        StatusCliError::BadUrl { url: s(), why: s() },
        remote(RemoteError::Config(s())),
        remote(RemoteError::Forbidden {
            what: s(),
            namespace: s(),
        }),
        remote(RemoteError::NoAgent {
            node: s(),
            namespace: s(),
        }),
        remote(RemoteError::AgentStatus {
            pod: s(),
            status: s(),
            body: s(),
        }),
        remote(RemoteError::BadAnswer { pod: s(), why: s() }),
        StatusCliError::Unreachable { url: s(), why: s() },
        StatusCliError::HttpStatus {
            url: s(),
            path: s(),
            status: s(),
            body: s(),
        },
        StatusCliError::Output(std::io::Error::other("closed")),
        StatusCliError::BadDocument { url: s(), why: s() },
        StatusCliError::BadPod { pod: s(), why: s() },
        StatusCliError::PodNotFound {
            pod: s(),
            url: s(),
            hint: None,
        },
        StatusCliError::NoTimeline {
            pod: s(),
            url: s(),
            agent_version: s(),
        },
    ];
    let table: Vec<i32> = EXIT_CODES.iter().map(|(c, _)| *c).collect();
    let used: std::collections::BTreeSet<i32> = errors.iter().map(|e| e.exit_code()).collect();
    for code in &used {
        assert!(
            table.contains(code),
            "exit code {code} is not in EXIT_CODES"
        );
    }
    for code in table.iter().filter(|c| **c != 0) {
        assert!(
            used.contains(code),
            "EXIT_CODES lists {code}, which no error returns"
        );
    }
    let help = exit_codes_help();
    for (code, what) in EXIT_CODES {
        assert!(help.contains(&format!("{code}  {what}")), "{help}");
    }
}

/// `holdfast status POD`: namespace/name or a uid; anything else is a usage error (exit 2)
/// that says what to give.
#[test]
fn pod_argument_is_namespace_name_or_uid() {
    use crate::cli::timeline::PodSelector;
    assert_eq!(
        PodSelector::parse("ns/flusher"),
        Ok(PodSelector::Name {
            namespace: "ns".into(),
            name: "flusher".into()
        })
    );
    assert_eq!(
        PodSelector::parse(" 5a7e2c1b-0000-4000-8000-000000000001 "),
        Ok(PodSelector::Uid(
            "5a7e2c1b-0000-4000-8000-000000000001".into()
        ))
    );
    for bad in [
        "",
        "  ",
        "/flusher",
        "ns/",
        "a/b/c",
        "ns/fl usher",
        "x\u{1b}y",
    ] {
        let opts = StatusOptions {
            agent: DEFAULT_AGENT_URL.into(),
            json: false,
            watch: false,
            node: None,
            timeout: Duration::from_secs(1),
            pod: Some(bad.into()),
        };
        let e = pod_selector(&opts).expect_err(bad);
        assert_eq!(e.exit_code(), 2, "{bad:?}");
        assert!(e.to_string().contains("namespace/name"), "{e}");
        // Parsed before any connection: `run` fails with the usage error, not "unreachable".
        let e = run(&opts, &mut Vec::new()).expect_err(bad);
        assert!(matches!(e, StatusCliError::BadPod { .. }), "{e}");
    }
}

/// A pod with every kind of step a classic pod's life has, from first sight to the proxy's
/// exit.
fn flusher_with_timeline() -> PodStatus {
    use crate::api::{StepKind as K, Timeline};
    let mut p = pod("flusher", Phase::Done);
    p.mode = Some(crate::api::SidecarMode::Classic);
    p.hold = Some(hold(3, 2, Some(HoldOutcome::Ready)));
    p.drain = Some(drain(DrainOutcome::AppDone, 8_123));
    let mut tl = Timeline::default();
    let at = |ms: u64| t(0) + Duration::from_millis(ms);
    for (ms, kind, detail) in [
        (0, K::FirstSeen, None),
        (12, K::NetnsFound, None),
        (14, K::HoldIn, None),
        (180, K::FirstConnectionHeld, None),
        (420, K::ProxyRunning, None),
        (1_900, K::EnvoyListening, Some("its capture ports listen")),
        (1_901, K::EnvoyLive, Some("LIVE, workers started; the filter not ready on every worker yet")),
        (2_004, K::ProxyReady, Some("LIVE, workers started, the filter ready on every worker")),
        (2_005, K::HoldReleased, Some("ready: held 3 connection(s) for 1991 ms; released 0.4 ms after the proxy was ready")),
        (10_000, K::DrainStarted, None),
        (10_003, K::InboundDrained, Some("Envoy drains its inbound listeners; outbound untouched (Envoy 1.40.0)")),
        (18_000, K::AppContainerExited, Some("flusher (its processes are gone)")),
        (18_000, K::AppGone, Some("every app process is gone; waiting only for what is in flight")),
        (18_012, K::Quitting, Some("nothing in flight: no outbound connection open")),
        (18_035, K::ProxyExited, Some("35.0 ms after the app was gone")),
        (18_123, K::DrainFinished, Some("app-done after 8123 ms; last sample: 0 outbound and 0 inbound connection(s) open, 0 bytes through the pod's listeners")),
    ] {
        tl.push(at(ms), kind, detail.map(str::to_string));
    }
    p.timeline = Some(tl);
    p
}

fn node_with(pods: Vec<PodStatus>) -> NodeStatus {
    NodeStatus {
        node: "worker-1".into(),
        agent_version: "0.1.0".into(),
        pods,
        source_problems: vec![],
        startup_taint: None,
    }
}

/// The timeline: each step with its time since first sight and since the step before, the
/// detail wrapped under its column, the outcome last; every line within 80 columns, also with
/// hostile and extreme values.
#[test]
fn timeline_renders_each_step_with_both_times_in_80_columns() {
    use crate::cli::timeline::render_timeline;
    let p = flusher_with_timeline();
    let s = node_with(vec![p.clone()]);
    let text = render_timeline(&s, &p, t(60));
    println!("{text}");
    let line = |step: &str| {
        text.lines()
            .find(|l| l.split_whitespace().nth(2) == Some(step))
            .unwrap_or_else(|| panic!("no {step} line:\n{text}"))
            .to_string()
    };
    assert!(text.starts_with("pod ns/flusher\n"), "{text}");
    assert!(
        line("first-seen").starts_with("   0.00ms       -  first-seen"),
        "{text}"
    );
    assert!(
        line("hold-in").contains(" 14.0ms  2.00ms  hold-in"),
        "{text}"
    );
    assert!(
        line("drain-started").contains(" 10.000s  7.995s  drain-started"),
        "{text}"
    );
    assert!(
        line("proxy-ready").contains(" 2.004s   103ms  proxy-ready"),
        "{text}"
    );
    assert!(
        line("quitting").contains("18.012s  12.0ms  quitting  "),
        "{text}"
    );
    // The steps in the recorded order.
    let recorded: Vec<&str> = p
        .timeline
        .as_ref()
        .expect("timeline")
        .steps
        .iter()
        .map(|s| s.step.as_str())
        .collect();
    let shown: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|w| recorded.contains(w))
        .collect();
    assert_eq!(shown, recorded);
    // A long detail continues under the detail column.
    assert!(
        text.contains(&format!("\n{:40}", "")),
        "no continuation line:\n{text}"
    );
    // The outcome, last.
    let tail: Vec<&str> = text.lines().rev().take(3).collect();
    assert!(
        text.contains("OUTCOME  hold: ready, 3 connection(s) held for 2.0s"),
        "{text}"
    );
    assert!(
        text.contains("drain: app-done after 8.1s, proxy gone 35.0ms after the app"),
        "{tail:?}"
    );
    for l in text.lines() {
        assert!(
            l.chars().count() <= TABLE_WIDTH,
            "{} chars: {l:?}",
            l.chars().count()
        );
    }

    // Extreme values: a huge name, details of any length and control characters, a clock that
    // stepped back.
    let mut p = flusher_with_timeline();
    p.namespace = "ns".repeat(60);
    p.uid = "u".repeat(200);
    p.last_error = Some("\u{1b}]0;pwned\u{7} e ".repeat(80));
    if let Some(tl) = &mut p.timeline {
        tl.push(
            t(0) - Duration::from_secs(5),
            crate::api::StepKind::Problem,
            Some("x".repeat(290)),
        );
        tl.dropped = u64::MAX;
        for s in &mut tl.steps {
            s.detail = Some("\u{1b}[2J word ".repeat(40));
        }
    }
    let s = node_with(vec![p.clone()]);
    let text = render_timeline(&s, &p, t(1 << 40));
    for l in text.lines() {
        assert!(
            l.chars().count() <= TABLE_WIDTH,
            "{} chars: {l:?}",
            l.chars().count()
        );
        assert!(
            !l.chars().any(needs_escape),
            "raw control character in {l:?}"
        );
    }
    assert!(
        text.contains(&format!("({} earlier step(s) dropped", u64::MAX)),
        "{text}"
    );
}

/// The pod is found by namespace/name or uid; an unknown pod is exit 7 naming it and pointing
/// at `holdfast status`; a row from an agent without timelines is exit 8, not an empty story;
/// `--json` prints the pod's row as served, steps included.
#[test]
fn pod_lookup_errors_and_json() {
    use crate::cli::timeline::PodSelector;
    let p = flusher_with_timeline();
    let s = node_with(vec![p.clone(), pod("old", Phase::Ready)]);
    let body = serde_json::to_string(&s).expect("json");
    let sel = |x: &str| PodSelector::parse(x).expect("selector");

    let text = pod_text("agent", &s, &body, &sel("ns/flusher"), false, t(60)).expect("found");
    assert!(text.contains("drain-finished"), "{text}");
    let by_uid = pod_text("agent", &s, &body, &sel(&p.uid), false, t(60)).expect("by uid");
    assert_eq!(by_uid, text);

    let e = pod_text("agent", &s, &body, &sel("ns/nope"), false, t(60)).expect_err("unknown");
    assert_eq!(e.exit_code(), 7);
    let msg = e.to_string();
    assert!(
        msg.contains("ns/nope") && msg.contains("`holdfast status`"),
        "{msg}"
    );
    // A bare name is taken for a uid; the error suggests the pod it may mean.
    let e = pod_text("agent", &s, &body, &sel("flusher"), false, t(60)).expect_err("bare name");
    assert!(e.to_string().contains("did you mean ns/flusher?"), "{e}");

    let e = pod_text("agent", &s, &body, &sel("ns/old"), false, t(60)).expect_err("old agent");
    assert_eq!(e.exit_code(), 8);
    assert!(
        e.to_string().contains("holdfast 0.1.0") && e.to_string().contains("older"),
        "{e}"
    );
    // An older agent's document (no `timeline` key at all) parses, and says the same.
    let mut v: serde_json::Value = serde_json::from_str(&body).expect("json");
    v["pods"][0]
        .as_object_mut()
        .expect("row")
        .remove("timeline");
    let old_body = v.to_string();
    let old: NodeStatus = serde_json::from_str(&old_body).expect("an old document parses");
    let e = pod_text("agent", &old, &old_body, &sel("ns/flusher"), false, t(60))
        .expect_err("old agent");
    assert_eq!(e.exit_code(), 8);

    let json = pod_text("agent", &s, &body, &sel("ns/flusher"), true, t(60)).expect("json");
    let row: serde_json::Value = serde_json::from_str(&json).expect("a JSON row");
    assert_eq!(row["name"], "flusher");
    let steps = row["timeline"]["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 16);
    assert_eq!(steps[0]["step"], "first-seen");
    assert_eq!(steps[15]["step"], "drain-finished");
    assert_eq!(row["timeline"]["dropped"], 0);
}
