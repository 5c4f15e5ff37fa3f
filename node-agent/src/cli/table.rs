//! The node's table as `holdfast status` prints it: pure rendering of a [`NodeStatus`] (the
//! clock passed in), at most [`TABLE_WIDTH`] columns, every string from the agent escaped.

use std::time::{Duration, SystemTime};

use crate::api::{DrainOutcome, DrainReport, JobReport, Mesh, SidecarMode};
use crate::api::{HoldOutcome, HoldRecord, NodeStatus, Phase, PodStatus};

/// Width the table is laid out for.
pub(crate) const TABLE_WIDTH: usize = 80;

/// Column widths: POD, MESH, MODE, PHASE, HELD, RELEASE; END takes the rest of
/// [`TABLE_WIDTH`] (21: the longest drain outcome with its time, `proxy-gone-early 5.0s`,
/// fits). HELD fits `12 (75s)`, RELEASE `0.41ms`.
const POD_W: usize = 17;
const MESH_W: usize = 6;
const MODE_W: usize = 7;
const PHASE_W: usize = 8;
const HELD_W: usize = 8;
const RELEASE_W: usize = 7;
const END_W: usize = TABLE_WIDTH - POD_W - MESH_W - MODE_W - PHASE_W - HELD_W - RELEASE_W - 6;
/// Indent of a row's detail lines (errors, advice).
const DETAIL_INDENT: &str = "    ";

/// The node's table, at most `TABLE_WIDTH` columns wide: a header line, one row per pod
/// (namespace/name, the mesh that injected its sidecar, sidecar mode, phase, connections held and for how long,
/// proxy-ready-to-release time, how the drain or Job ended), each followed by indented detail
/// lines: what holdfast does for a native sidecar, and anything that needs an operator (a hold
/// that did not end on a ready proxy, drain advice, the last error).
pub fn render_table(status: &NodeStatus, now: SystemTime) -> String {
    let mut out = String::new();
    let pods = match status.pods.len() {
        0 => "no meshed pods tracked".to_string(),
        1 => "1 pod".to_string(),
        n => format!("{n} pods"),
    };
    push_line(
        &mut out,
        &format!(
            "node {}, holdfast {}, {pods}",
            escape_controls(&status.node),
            escape_controls(&status.agent_version)
        ),
    );
    if status.pods.is_empty() {
        return out;
    }
    push_line(
        &mut out,
        &format!(
            "{:POD_W$} {:MESH_W$} {:MODE_W$} {:PHASE_W$} {:HELD_W$} {:RELEASE_W$} {}",
            "POD", "MESH", "MODE", "PHASE", "HELD/FOR", "RELEASE", "END (OUTCOME, TIME)"
        ),
    );
    for pod in &status.pods {
        push_line(
            &mut out,
            &format!(
                "{:POD_W$} {:MESH_W$} {:MODE_W$} {:PHASE_W$} {:HELD_W$} {:RELEASE_W$} {}",
                fit_middle(
                    &escape_controls(&format!("{}/{}", pod.namespace, pod.name)),
                    POD_W
                ),
                pod.mesh.map_or("-", Mesh::as_str),
                pod.mode.map_or("-", SidecarMode::as_str),
                phase_label(pod.phase),
                fit_end(&held_cell(pod.hold.as_ref(), now), HELD_W),
                fit_end(&release_cell(pod.hold.as_ref()), RELEASE_W),
                fit_end(&end_cell(pod), END_W),
            ),
        );
        for detail in details(pod) {
            push_line(&mut out, &format!("{DETAIL_INDENT}{detail}"));
        }
    }
    out
}

/// Appends `line` cut to the table width, trailing spaces removed.
fn push_line(out: &mut String, line: &str) {
    out.push_str(fit_end(line, TABLE_WIDTH).trim_end());
    out.push('\n');
}

pub(super) fn phase_label(phase: Phase) -> &'static str {
    match phase {
        // The full name (`waiting-for-netns`, in --json) does not fit the column.
        Phase::WaitingForNetns => "waiting",
        other => other.as_str(),
    }
}

/// `3 (2.1s)`: connections held and how long the hold lasted (so far, while holding).
pub(super) fn held_cell(hold: Option<&HoldRecord>, now: SystemTime) -> String {
    let Some(h) = hold else {
        return "-".into();
    };
    let lasted = h
        .started_at
        .and_then(|s| h.released_at.unwrap_or(now).duration_since(s).ok());
    match lasted {
        Some(d) => format!("{} ({})", h.connections_held, short_duration(d)),
        None => h.connections_held.to_string(),
    }
}

/// Proxy seen ready to every held packet accepted.
pub(super) fn release_cell(hold: Option<&HoldRecord>) -> String {
    match hold.and_then(|h| h.ready_to_release_ms) {
        Some(ms) => short_ms(ms),
        None => "-".into(),
    }
}

/// How the pod's drain or Job ended: `app-done 8.1s` (a drain: the column's usual content,
/// unprefixed to fit), `job completed 12ms`.
pub(super) fn end_cell(pod: &PodStatus) -> String {
    if let Some(d) = &pod.drain {
        return drain_summary(d);
    }
    if let Some(j) = &pod.job {
        return job_summary(j);
    }
    "-".into()
}

fn drain_summary(d: &DrainReport) -> String {
    format!("{} {}", d.outcome.as_str(), short_duration(d.elapsed))
}

fn job_summary(j: &JobReport) -> String {
    match j.app_finished_to_quit {
        Some(t) => format!("job {} {}", j.outcome.as_str(), short_duration(t)),
        None => format!("job {}", j.outcome.as_str()),
    }
}

/// Detail lines under a pod's row, each already cut to fit after the indent.
fn details(pod: &PodStatus) -> Vec<String> {
    let room = TABLE_WIDTH - DETAIL_INDENT.len();
    let mut lines = Vec::new();
    if pod.mode == Some(SidecarMode::Native) {
        lines.push(NATIVE_DETAIL.to_string());
        if let Some(d) = pod
            .drain
            .as_ref()
            .filter(|d| d.outcome == DrainOutcome::KubeletOrdered)
        {
            match d.app_gone_to_proxy_exit {
                Some(lag) => lines.push(format!(
                    "stopped by the kubelet: proxy exited {} after the app",
                    short_duration(lag)
                )),
                None => lines.push("stopped by the kubelet after the app".into()),
            }
        }
    }
    if let Some(h) = &pod.hold {
        match h.outcome {
            Some(HoldOutcome::Ready) | None => {}
            Some(other) => lines.push(format!("hold ended: {}", other.as_str())),
        }
        if h.adopted {
            lines.push("hold adopted from a previous agent".into());
        }
        if h.late {
            lines.push("hold went in late: the app was already running".into());
        }
    }
    // Both records: the column shows the drain, the Job's line goes here.
    if let (Some(_), Some(j)) = (&pod.drain, &pod.job) {
        lines.push(job_summary(j));
    }
    let mut lines: Vec<String> = lines.into_iter().map(|l| fit_end(&l, room)).collect();
    if let Some(advice) = pod.drain.as_ref().and_then(|d| d.advice.as_deref()) {
        if pod.last_error.as_deref() != Some(advice) {
            lines.extend(wrap_limited(
                &format!("advice: {advice}"),
                room,
                MESSAGE_LINES,
            ));
        }
    }
    if let Some(why) = &pod.skipped_reason {
        lines.extend(wrap_limited(
            &format!("left alone: {why}"),
            room,
            MESSAGE_LINES,
        ));
    }
    if let Some(e) = &pod.last_error {
        lines.extend(wrap_limited(&format!("error: {e}"), room, MESSAGE_LINES));
    }
    lines
}

/// What holdfast does for a native sidecar, under its row: the kubelet orders the first start
/// (after the startup probe), the stop (app first) and Jobs; holdfast holds the app's calls
/// across a proxy restart, and ends the proxy on evidence only where Istio's preStop drain is
/// overridden.
pub(super) const NATIVE_DETAIL: &str =
    "native sidecar: holdfast covers restarts; the kubelet orders start/stop";

/// Lines an error or advice may take under its row (the rest is cut; `--json` has it all).
const MESSAGE_LINES: usize = 3;

/// [`wrap`], keeping at most `max_lines` lines; the last one ends in `...` when text was cut.
pub(super) fn wrap_limited(text: &str, width: usize, max_lines: usize) -> Vec<String> {
    let wrapped = wrap(text, width);
    let mut lines: Vec<String> = wrapped.lines().map(str::to_string).collect();
    if lines.len() > max_lines {
        lines.truncate(max_lines);
        if let Some(last) = lines.last_mut() {
            // Force the ellipsis even when the kept line is short.
            *last = fit_end(&format!("{last} ..."), width);
            if !last.ends_with("...") {
                last.push_str("...");
            }
        }
    }
    lines
}

/// `s` with every character that a terminal could act on written as an escape (`\x1b`,
/// `\u{9b}`): C0 controls (ESC, BEL, CR, ...), DEL, C1 controls (CSI, OSC, ...) and the Unicode
/// bidirectional overrides. Pod names, reasons and errors come from the cluster and Envoy: printed
/// raw, an OSC or CSI sequence in them would rewrite the operator's terminal (issue 11).
pub(crate) fn escape_controls(s: &str) -> String {
    if !s.chars().any(needs_escape) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if needs_escape(c) {
            let n = c as u32;
            if n <= 0xff {
                out.push_str(&format!("\\x{n:02x}"));
            } else {
                out.push_str(&format!("\\u{{{n:x}}}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

pub(super) fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Collapses whitespace (newlines included) so a message stays on its line.
fn one_line(s: &str) -> String {
    escape_controls(&s.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// A duration in at most 6 characters: `340ms`, `2.1s`, `75s`, `12m`, `5h`.
pub(crate) fn short_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1.0 {
        format!("{}ms", d.as_millis())
    } else if s < 10.0 {
        format!("{s:.1}s")
    } else if s < 600.0 {
        format!("{s:.0}s")
    } else if s < 36_000.0 {
        format!("{:.0}m", s / 60.0)
    } else {
        format!("{:.0}h", s / 3600.0)
    }
}

/// Milliseconds in at most 7 characters: `0.41ms`, `12.3ms`, `340ms`, `2.1s`.
pub(crate) fn short_ms(ms: f64) -> String {
    if !ms.is_finite() || ms < 0.0 {
        "?".into()
    } else if ms < 10.0 {
        format!("{ms:.2}ms")
    } else if ms < 100.0 {
        format!("{ms:.1}ms")
    } else if ms < 1000.0 {
        format!("{ms:.0}ms")
    } else {
        // The value comes from a served document: a huge one (1e300) must not panic
        // (`Duration::from_secs_f64` would).
        Duration::try_from_secs_f64(ms / 1e3).map_or_else(|_| "?".into(), short_duration)
    }
}

/// `s` cut to `width` characters, ending in `...` when cut.
pub fn fit_end(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    if width <= 3 {
        return s.chars().take(width).collect();
    }
    let mut out: String = s.chars().take(width - 3).collect();
    out.push_str("...");
    out
}

/// `s` cut to `width` characters by dropping its middle (`default/web-7d..-x2x9z`), so the
/// namespace and the distinguishing suffix of a pod's name both stay.
pub(crate) fn fit_middle(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        return s.to_string();
    }
    if width <= 2 {
        return s.chars().take(width).collect();
    }
    let keep = width - 2;
    let head = keep.div_ceil(2);
    let tail = keep - head;
    let mut out: String = s.chars().take(head).collect();
    out.push_str("..");
    out.extend(s.chars().skip(n - tail));
    out
}

/// An HTTP status as `404 Not Found` (the code alone when it has no reason phrase).
pub(super) fn http_status(status: hyper::StatusCode) -> String {
    format!(
        "{} {}",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    )
    .trim()
    .to_string()
}

/// `s` cut to `width` characters, `...` when cut (for one-line messages).
pub(super) fn truncate(s: &str, width: usize) -> String {
    fit_end(&one_line(s), width)
}

/// Wraps `text` at spaces to lines of at most `width` characters (longer words are cut).
pub(super) fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let word = fit_end(&escape_controls(word), width);
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(&word);
    }
    if !line.is_empty() {
        out.push_str(&line);
        out.push('\n');
    }
    out
}
