//! `holdfast status POD`: one pod's lifecycle as a timeline. This module owns naming the pod
//! ([`PodSelector`]: `namespace/name` or its uid), finding it in the node's status document, and
//! rendering its steps ([`render_timeline`], pure, the clock passed in) so that it fits
//! [`TABLE_WIDTH`] columns: each step with its time since the pod was first seen and since the
//! step before, ending in the pod's outcome and its reason.
//!
//! The steps are the row's `timeline` as the agent recorded them (`crate::lifecycle::record`);
//! an agent older than the timeline serves rows without one, which is an error with its own
//! exit code, not an empty story.

use std::time::{Duration, SystemTime};

use crate::api::{HoldOutcome, NodeStatus, PodStatus, Step, MAX_STEPS};

use super::table::{escape_controls, fit_end, fit_middle, short_ms, wrap, TABLE_WIDTH};

/// Which pod `holdfast status POD` is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PodSelector {
    /// `namespace/name`.
    Name { namespace: String, name: String },
    /// The pod's `metadata.uid` (a word without `/`).
    Uid(String),
}

impl PodSelector {
    /// Parses `namespace/name` or a uid; `Err` says what is wrong and what to give instead.
    pub(crate) fn parse(text: &str) -> Result<PodSelector, String> {
        let t = text.trim();
        if t.is_empty() {
            return Err("empty; give namespace/name (e.g. default/web-0) or the pod's uid".into());
        }
        if t.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(
                "contains spaces or control characters; give namespace/name or the pod's uid"
                    .into(),
            );
        }
        match t.split_once('/') {
            None => Ok(PodSelector::Uid(t.to_string())),
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(PodSelector::Name {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                })
            }
            Some(_) => Err(
                "expected namespace/name with both parts (e.g. default/web-0), or the pod's uid"
                    .into(),
            ),
        }
    }

    /// Whether `pod` is the one named.
    pub(crate) fn matches(&self, pod: &PodStatus) -> bool {
        match self {
            PodSelector::Name { namespace, name } => {
                &pod.namespace == namespace && &pod.name == name
            }
            PodSelector::Uid(uid) => &pod.uid == uid,
        }
    }

    /// A hint for a pod not found: a uid that is some pod's name, or a name in another
    /// namespace.
    pub(crate) fn hint(&self, status: &NodeStatus) -> Option<String> {
        let named = |name: &str| -> Vec<String> {
            status
                .pods
                .iter()
                .filter(|p| p.name == name)
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .take(3)
                .collect()
        };
        let similar = match self {
            PodSelector::Uid(word) => named(word),
            PodSelector::Name { name, .. } => named(name),
        };
        (!similar.is_empty()).then(|| format!("did you mean {}?", similar.join(" or ")))
    }
}

impl std::fmt::Display for PodSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PodSelector::Name { namespace, name } => write!(f, "{namespace}/{name}"),
            PodSelector::Uid(uid) => write!(f, "uid {uid}"),
        }
    }
}

/// Width of the two time columns (`short_ms`: at most 7 characters).
const TIME_W: usize = 7;
/// Width of the step column (the longest step name, `first-connection-held`).
const STEP_W: usize = 21;
/// Where a step's detail starts (the columns before it and their separators).
const DETAIL_AT: usize = 2 + TIME_W + 1 + TIME_W + 2 + STEP_W + 1;

/// The pod's timeline, at most [`TABLE_WIDTH`] columns: who the pod is, one line per step (its
/// time since the pod was first seen, since the step before, its name and what the agent knew,
/// wrapped under the detail column), and the outcome with its reason.
pub(crate) fn render_timeline(status: &NodeStatus, pod: &PodStatus, now: SystemTime) -> String {
    let mut out = String::new();
    let mut line = |s: &str| {
        out.push_str(fit_end(s, TABLE_WIDTH).trim_end());
        out.push('\n');
    };
    line(&fit_middle(
        &escape_controls(&format!("pod {}/{}", pod.namespace, pod.name)),
        TABLE_WIDTH,
    ));
    line(&format!("  uid {}", escape_controls(&pod.uid)));
    line(&format!(
        "  {}phase {}, on node {}, holdfast {}",
        pod.mode
            .map(|m| format!("{} sidecar, ", m.as_str()))
            .unwrap_or_default(),
        pod.phase.as_str(),
        escape_controls(&status.node),
        escape_controls(&status.agent_version)
    ));
    let first = pod.tracked_since;
    line(&format!(
        "  first seen {} ({} ago)",
        crate::api::time::rfc3339::format(first),
        now.duration_since(first)
            .map_or("?".to_string(), super::table::short_duration)
    ));
    let Some(timeline) = &pod.timeline else {
        return out;
    };
    line("");
    line(&format!(
        "  {:>TIME_W$} {:>TIME_W$}  {:STEP_W$} {}",
        "SINCE", "+STEP", "STEP", "WHAT"
    ));
    if timeline.dropped > 0 {
        line(&format!(
            "  ({} earlier step(s) dropped; the latest {MAX_STEPS} are kept)",
            timeline.dropped
        ));
    }
    let mut before: Option<SystemTime> = None;
    for step in &timeline.steps {
        for l in step_lines(step, first, before) {
            line(&l);
        }
        before = Some(step.at);
    }
    line("");
    for l in outcome_lines(pod) {
        line(&l);
    }
    out
}

/// One step's lines: the times, its name and the first line of its detail, then the rest of
/// the detail under the detail column.
fn step_lines(step: &Step, first: SystemTime, before: Option<SystemTime>) -> Vec<String> {
    let since = |from: SystemTime| match step.at.duration_since(from) {
        Ok(d) => step_time(d),
        // Recorded from a clock that stepped back (or a report dated before first sight).
        Err(e) => format!("-{}", step_time(e.duration())),
    };
    let since_first = since(first);
    let since_before = before.map_or_else(|| "-".to_string(), since);
    let detail = step.detail.as_deref().unwrap_or("");
    let wrapped = wrap(detail, TABLE_WIDTH - DETAIL_AT);
    let mut detail_lines = wrapped.lines();
    let mut lines = vec![format!(
        "  {:>TIME_W$} {:>TIME_W$}  {:STEP_W$} {}",
        fit_end(&since_first, TIME_W),
        fit_end(&since_before, TIME_W),
        step.step.as_str(),
        detail_lines.next().unwrap_or("")
    )];
    // A long detail is kept to a few lines (`--json` has all of it).
    const DETAIL_LINES: usize = 4;
    for (i, l) in detail_lines.enumerate() {
        if i + 1 >= DETAIL_LINES {
            if let Some(last) = lines.last_mut() {
                last.push_str(" ...");
            }
            break;
        }
        lines.push(format!("{:DETAIL_AT$}{l}", ""));
    }
    lines
}

/// A step's time in at most [`TIME_W`] characters, to the millisecond up to 100 s (a drain's
/// steps seconds after first sight still tell apart): `0.41ms`, `340ms`, `18.012s`, `75.5s`.
fn step_time(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1.0 {
        short_ms(s * 1e3)
    } else if s < 100.0 {
        format!("{s:.3}s")
    } else if s < 10_000.0 {
        format!("{s:.1}s")
    } else {
        super::table::short_duration(d)
    }
}

/// How the pod's story ended (so far): the hold, the drain or the Job, and the reason.
fn outcome_lines(pod: &PodStatus) -> Vec<String> {
    let mut parts: Vec<String> = Vec::new();
    if let Some(h) = &pod.hold {
        let lasted = h
            .started_at
            .zip(h.released_at)
            .and_then(|(s, r)| r.duration_since(s).ok());
        parts.push(match h.outcome {
            None => format!("hold: in force, {} connection(s) held", h.connections_held),
            Some(o) => format!(
                "hold: {}, {} connection(s) held{}{}",
                o.as_str(),
                h.connections_held,
                lasted.map_or(String::new(), |d| format!(
                    " for {}",
                    short_ms(d.as_secs_f64() * 1e3)
                )),
                match (o, h.ready_to_release_ms) {
                    (HoldOutcome::Ready, Some(ms)) =>
                        format!(", released {} after the proxy was ready", short_ms(ms)),
                    _ => String::new(),
                }
            ),
        });
    }
    if let Some(d) = &pod.drain {
        let mut s = format!(
            "drain: {} after {}",
            d.outcome.as_str(),
            short_ms(d.elapsed.as_secs_f64() * 1e3)
        );
        if let Some(lag) = d.app_gone_to_proxy_exit {
            s.push_str(&format!(
                ", proxy gone {} after the app",
                short_ms(lag.as_secs_f64() * 1e3)
            ));
        }
        parts.push(s);
    }
    if let Some(j) = &pod.job {
        parts.push(match j.app_finished_to_quit {
            Some(t) => format!(
                "job: {}, proxy quit {} after the app finished",
                j.outcome.as_str(),
                short_ms(t.as_secs_f64() * 1e3)
            ),
            None => format!("job: {}", j.outcome.as_str()),
        });
    }
    if parts.is_empty() {
        parts.push(format!("none yet (phase {})", pod.phase.as_str()));
    }
    let why = pod
        .drain
        .as_ref()
        .and_then(|d| d.advice.clone())
        .or_else(|| pod.skipped_reason.clone())
        .or_else(|| pod.last_error.clone());
    if let Some(why) = why {
        parts.push(format!("why: {why}"));
    }
    const LABEL: &str = "OUTCOME  ";
    let mut lines = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let wrapped = wrap(part, TABLE_WIDTH - LABEL.len());
        for (j, l) in wrapped.lines().enumerate() {
            let label = if i == 0 && j == 0 { LABEL } else { "" };
            lines.push(format!("{label:<w$}{l}", w = LABEL.len()));
        }
    }
    lines
}
