//! docs/reference.md is complete: every flag and environment variable of `holdfast agent
//! --help` and `holdfast status --help` (the real binary), every exit code of
//! `holdfast::cli::status::EXIT_CODES`, every metric and label value of the agent's `/metrics`
//! (`MetricsHandle::encode`, what the status API serves), every Kubernetes Event reason, phase
//! and outcome the code can write, and every field of the `/status` document (a fully filled
//! `NodeStatus`, serialized as served) has its place there. Adding one without documenting it
//! fails here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use holdfast::api::{
    DrainOutcome, DrainReport, FilterCounts, FinishedBy, HoldRecord, IdleReason, JobOutcome,
    JobReport, NodeStatus, Phase, PodStatus, QuitReason, SidecarMode, SourceProblem, Step,
    StepKind, Timeline,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn reference() -> String {
    std::fs::read_to_string(root().join("docs/reference.md")).expect("reading docs/reference.md")
}

/// The `--flags` and `[env: NAME=]`s a `--help` lists.
fn help_flags(args: &[&str]) -> (Vec<String>, Vec<String>) {
    let out = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(args)
        .output()
        .expect("running holdfast --help");
    assert!(out.status.success(), "{args:?}: {out:?}");
    let help = String::from_utf8(out.stdout).expect("utf-8 help");
    let mut flags = Vec::new();
    let mut envs = Vec::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        let trimmed = trimmed.strip_prefix("-h, ").unwrap_or(trimmed);
        if let Some(rest) = trimmed.strip_prefix("--") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if name != "help" && name != "version" {
                flags.push(format!("--{name}"));
            }
        }
        for (i, part) in line.split("[env: ").enumerate() {
            if i > 0 {
                envs.push(part.split('=').next().unwrap_or("").to_string());
            }
        }
    }
    (flags, envs)
}

/// The text of `doc` from heading `heading` (a whole line) to the next heading of the same or a
/// higher level.
fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let start = doc
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("docs/reference.md has no `{heading}` section"));
    let body = &doc[start + heading.len() + 2..];
    let end = body
        .match_indices("\n#")
        .find(|(at, _)| {
            let hashes = body[at + 1..].chars().take_while(|c| *c == '#').count();
            hashes <= level && body[at + 1 + hashes..].starts_with(' ')
        })
        .map_or(body.len(), |(at, _)| at);
    &body[..end]
}

/// Whether `text` has a table row whose first cell is `` `cell` `` (or starts with it).
fn has_row(text: &str, cell: &str) -> bool {
    text.lines()
        .any(|l| l.starts_with(&format!("| `{cell}` |")) || l.starts_with(&format!("| `{cell}`,")))
}

fn missing_rows(text: &str, cells: impl IntoIterator<Item = String>) -> Vec<String> {
    cells.into_iter().filter(|c| !has_row(text, c)).collect()
}

fn missing_mentions(text: &str, words: impl IntoIterator<Item = String>) -> Vec<String> {
    words
        .into_iter()
        .filter(|w| !text.contains(&format!("`{w}`")))
        .collect()
}

#[test]
fn every_agent_flag_and_environment_variable() {
    let (flags, envs) = help_flags(&["agent", "--help"]);
    assert!(flags.len() > 15, "agent --help parsed to {flags:?}");
    assert!(envs.contains(&"NODE_NAME".to_string()), "{envs:?}");
    let doc = reference();
    let agent = section(&doc, "## The agent: `holdfast agent`");
    let missing = missing_rows(agent, flags);
    assert!(
        missing.is_empty(),
        "agent flags missing from docs/reference.md's flag table: {missing:?}"
    );
    let missing = missing_rows(agent, envs.into_iter().chain(["HOLDFAST_LOG".to_string()]));
    assert!(
        missing.is_empty(),
        "environment variables missing from docs/reference.md: {missing:?}"
    );
}

#[test]
fn every_status_flag_and_exit_code() {
    let (flags, envs) = help_flags(&["status", "--help"]);
    assert!(flags.len() >= 5, "status --help parsed to {flags:?}");
    let doc = reference();
    let status = section(&doc, "## `holdfast status`");
    let missing = missing_rows(status, flags);
    assert!(
        missing.is_empty(),
        "status flags missing from docs/reference.md: {missing:?}"
    );
    let missing = missing_rows(&doc, envs);
    assert!(
        missing.is_empty(),
        "status environment variables missing: {missing:?}"
    );
    let codes = holdfast::cli::status::EXIT_CODES
        .iter()
        .map(|(code, _)| code.to_string());
    let missing = missing_rows(status, codes);
    assert!(
        missing.is_empty(),
        "exit codes missing from docs/reference.md: {missing:?}"
    );
}

/// The metric names of a Prometheus text exposition as a reader queries them (counters with
/// `_total`), and every label value, by label.
fn metrics_and_labels(text: &str) -> (BTreeSet<String>, BTreeSet<(String, String)>) {
    let mut names = BTreeSet::new();
    let mut labels = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            names.insert(if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_string()
            });
        } else if !line.starts_with('#') {
            let Some((_, rest)) = line.split_once('{') else {
                continue;
            };
            let inside = rest.split('}').next().unwrap_or("");
            for pair in inside.split(',') {
                if let Some((k, v)) = pair.split_once('=') {
                    if k != "le" {
                        labels.insert((k.to_string(), v.trim_matches('"').to_string()));
                    }
                }
            }
        }
    }
    (names, labels)
}

#[test]
fn every_metric_and_label_value() {
    let handle = holdfast::report::metrics::MetricsHandle::new();
    let text = handle.encode(&holdfast::report::board::StatusBoard::default());
    let (names, labels) = metrics_and_labels(&text);
    assert!(names.len() > 20, "metrics parsed to {names:?}");
    assert!(labels.len() > 20, "labels parsed to {labels:?}");
    let doc = reference();
    let metrics = section(&doc, "## Metrics");
    let missing = missing_rows(metrics, names);
    assert!(
        missing.is_empty(),
        "metrics missing from docs/reference.md's table: {missing:?}"
    );
    let mut missing = Vec::new();
    for (label, value) in labels {
        let row = metrics
            .lines()
            .find(|l| l.contains(&format!("`{label}`:")) && l.contains(&format!("`{value}`")));
        if row.is_none() {
            missing.push(format!("{label}={value}"));
        }
    }
    assert!(
        missing.is_empty(),
        "label values missing from docs/reference.md's metrics table: {missing:?}"
    );
}

/// The strings an `as_str` writes for `Type::Variant => "string"` arms in `file`: the match is
/// exhaustive, so a new variant cannot be added without one.
fn as_str_labels(file: &str, ty: &str) -> Vec<String> {
    let code = std::fs::read_to_string(root().join(file)).expect(file);
    // The body of `impl <ty> { … fn as_str … }`, up to the function's closing brace.
    let imp = code
        .find(&format!("impl {ty} {{"))
        .unwrap_or_else(|| panic!("{file} has no `impl {ty}`"));
    let body = &code[imp..];
    let start = body
        .find("fn as_str")
        .unwrap_or_else(|| panic!("{file}: `impl {ty}` has no `as_str`"));
    let body = &body[start..];
    let body = &body[..body.find("\n    }\n").unwrap_or(body.len())];
    let mut out = Vec::new();
    for line in body.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix(&format!("{ty}::")) {
            if let Some((_, label)) = rest.split_once("=> \"") {
                out.push(label.split('"').next().unwrap_or("").to_string());
            }
        }
    }
    out
}

#[test]
fn every_event_reason_phase_and_outcome() {
    let doc = reference();
    for (file, ty, heading, at_least) in [
        (
            "node-agent/src/report/events.rs",
            "Reason",
            "## Kubernetes Events",
            9,
        ),
        ("node-agent/src/api/status.rs", "Phase", "### Phases", 7),
        (
            "node-agent/src/api/status.rs",
            "HoldOutcome",
            "### Hold outcomes",
            5,
        ),
        (
            "node-agent/src/api/reports.rs",
            "DrainOutcome",
            "### Drain outcomes",
            8,
        ),
        (
            "node-agent/src/api/reports.rs",
            "JobOutcome",
            "### Job outcomes",
            7,
        ),
    ] {
        let labels = as_str_labels(file, ty);
        assert!(
            labels.len() >= at_least,
            "{ty} in {file} parsed to {labels:?}"
        );
        let missing = missing_rows(section(&doc, heading), labels);
        assert!(
            missing.is_empty(),
            "{ty}s missing from docs/reference.md `{heading}`: {missing:?}"
        );
    }
}

/// Every object key of a JSON value, recursively.
fn keys(v: &serde_json::Value, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                out.insert(k.clone());
                keys(v, out);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| keys(v, out)),
        _ => {}
    }
}

#[test]
fn every_status_document_field() {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let quit = Some(QuitReason::Idle(IdleReason::NoBytesMoved {
        idle_for: Duration::from_millis(100),
    }));
    let status = NodeStatus {
        node: "node-a".into(),
        agent_version: "0".into(),
        pods: vec![PodStatus {
            namespace: "ns".into(),
            name: "pod".into(),
            uid: "uid".into(),
            phase: Phase::Done,
            mode: Some(SidecarMode::Classic),
            mesh: Some(holdfast::api::Mesh::Istio),
            tracked_since: t,
            hold: Some(HoldRecord::default()),
            drain: Some(DrainReport {
                last_counts: Some(FilterCounts::default()),
                quit_reason: quit,
                health_checks_restored: 1,
                agent_signalled: true,
                ..DrainReport::new(DrainOutcome::AppDone, t)
            }),
            job: Some(JobReport {
                finished_by: Some(FinishedBy::Status),
                quit_reason: quit,
                ..JobReport::new(JobOutcome::Completed)
            }),
            last_error: None,
            skipped_reason: None,
            timeline: Some(Timeline {
                steps: vec![Step {
                    at: t,
                    step: StepKind::FirstSeen,
                    detail: Some("d".into()),
                }],
                dropped: 0,
            }),
        }],
        source_problems: vec![SourceProblem {
            entry: "e".into(),
            problem: "p".into(),
        }],
        startup_taint: Some(holdfast::api::StartupTaint::Removed),
    };
    let mut fields = BTreeSet::new();
    keys(
        &serde_json::to_value(&status).expect("serializes"),
        &mut fields,
    );
    assert!(fields.len() > 40, "fields parsed to {fields:?}");
    let doc = reference();
    let missing = missing_mentions(section(&doc, "### The `/status` document"), fields);
    assert!(
        missing.is_empty(),
        "/status fields missing from docs/reference.md: {missing:?}"
    );
}

/// The checks above on a page with one row of each kind removed: each must notice.
#[test]
fn a_missing_row_is_noticed() {
    let doc = reference();
    for row in [
        "| `--drain-idle-window` |",
        "| `6` |",
        "| `holdfast_pod_task_panics_total` |",
        "| `SidecarLostDuringTermination` |",
        "| `kubelet-ordered` |",
    ] {
        let line = doc
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("{row} is in docs/reference.md"));
        let cut = doc.replace(&format!("{line}\n"), "");
        let cell = row.trim_start_matches("| `").trim_end_matches("` |");
        assert!(has_row(&doc, cell) && !has_row(&cut, cell), "{row}");
    }
    // A label value listed in no row.
    let text = "# TYPE holdfast_x counter\nholdfast_x_total{outcome=\"new-one\"} 0\n";
    let (names, labels) = metrics_and_labels(text);
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["holdfast_x_total"]);
    assert!(labels.contains(&("outcome".to_string(), "new-one".to_string())));
}
