//! `holdfast status POD --svg FILE`: the pod's timeline as a picture. One time axis; four lanes:
//! the app's containers (first seen to the app gone), the proxy (its container running to its
//! exit, Envoy started / listening / LIVE / ready marked), the hold (rule in to released, or
//! failed open) and the drain (started to finished, inbound drained and the quit marked). Every
//! step is a tick on its lane with its name and detail as a tooltip (`<title>`). A standalone SVG
//! 1.1 document with no script, no external reference and every text escaped, so any browser or
//! viewer shows it as is; tests/tests/status_svg.rs renders it in headless Chromium.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use crate::api::{PodStatus, Step, StepKind};

/// The picture's width and the plot's margins, in SVG user units (pixels at 100%).
pub const WIDTH: f64 = 960.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 48.0;
const LANE: f64 = 34.0;
const BAR: f64 = 14.0;

/// The lanes, top to bottom, with their bar colour.
pub const LANES: [(&str, &str); 4] = [
    ("app", "#4c78a8"),
    ("proxy", "#54a24b"),
    ("hold", "#f58518"),
    ("drain", "#b279a2"),
];

/// The colour of the proxy-ready mark (a vertical line across every lane).
pub const READY_COLOUR: &str = "#e45756";

fn lane_of(kind: StepKind) -> usize {
    use StepKind::*;
    match kind {
        FirstSeen | Skipped | NetnsFound | AppContainerExited | AppGone | JobAppFinished
        | Problem | Unknown => 0,
        ProxyRunning | EnvoyStarted | EnvoyListening | EnvoyLive | ProxyReady | ProxyGone
        | ProxyExited | SidecarLost => 1,
        HoldIn | FirstConnectionHeld | HoldReleased | FailedOpen => 2,
        DrainStarted | InboundDrained | KernelFlushing | Quitting | DrainFinished | JobFinished => {
            3
        }
    }
}

fn kind_name(kind: StepKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// Escapes text for SVG character data and attribute values, and drops what XML 1.0 cannot
/// carry (control characters other than tab and newline).
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' => out.push(' '),
            c if c.is_control() || ('\u{fffe}'..='\u{ffff}').contains(&c) => {}
            c => out.push(c),
        }
    }
    out
}

fn since(t: SystemTime, t0: SystemTime) -> Duration {
    t.duration_since(t0).unwrap_or_default()
}

fn label(d: Duration) -> String {
    super::table::short_duration(d)
}

/// The first step of `kinds` in `steps`.
fn first(steps: &[Step], kinds: &[StepKind]) -> Option<SystemTime> {
    steps.iter().find(|s| kinds.contains(&s.step)).map(|s| s.at)
}

/// The last step of `kinds` in `steps`.
fn last(steps: &[Step], kinds: &[StepKind]) -> Option<SystemTime> {
    steps
        .iter()
        .rev()
        .find(|s| kinds.contains(&s.step))
        .map(|s| s.at)
}

/// The SVG of `pod`'s timeline, `None` without steps. `now` ends the bars still open (a pod
/// holding, a proxy running).
pub fn render(node: &str, pod: &PodStatus, now: SystemTime) -> Option<String> {
    use StepKind::*;
    let steps = &pod.timeline.as_ref()?.steps;
    let t0 = steps.iter().map(|s| s.at).min()?;
    let t_end = steps.iter().map(|s| s.at).max()?.max(t0);
    let open_end = if matches!(
        pod.phase,
        crate::api::Phase::Done | crate::api::Phase::Skipped
    ) {
        t_end
    } else {
        now.max(t_end)
    };
    let span = since(open_end, t0).as_secs_f64().max(0.001);
    let plot = WIDTH - LEFT - RIGHT;
    let x = |t: SystemTime| LEFT + since(t, t0).as_secs_f64() / span * plot;
    let lane_y = |lane: usize| TOP + lane as f64 * LANE;
    let height = TOP + LANES.len() as f64 * LANE + 36.0;

    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">
<title>{title}</title>
<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>
<text x="{LEFT}" y="20" font-size="14" font-weight="bold">{title}</text>
"##,
        title = escape(&format!(
            "{}/{} on {node}: {} ({} step(s))",
            pod.namespace,
            pod.name,
            pod.phase.as_str(),
            steps.len()
        )),
    );
    // Lanes and their names.
    for (i, (name, _)) in LANES.iter().enumerate() {
        let y = lane_y(i);
        let _ = writeln!(
            svg,
            r##"<text x="10" y="{}" class="lane">{name}</text><line x1="{LEFT}" y1="{}" x2="{}" y2="{}" stroke="#dddddd"/>"##,
            y + BAR - 2.0,
            y + BAR / 2.0,
            WIDTH - RIGHT,
            y + BAR / 2.0
        );
    }
    // Bars: from a start step to an end step, or to the end of the picture while open.
    let bar = |svg: &mut String,
               lane: usize,
               from: Option<SystemTime>,
               to: Option<SystemTime>,
               what: &str| {
        let Some(from) = from else { return };
        let to = to.unwrap_or(open_end).max(from);
        let (x1, x2) = (x(from), x(to).max(x(from) + 2.0));
        let _ = writeln!(
            svg,
            r#"<rect class="bar" data-lane="{}" x="{x1:.1}" y="{:.1}" width="{:.1}" height="{BAR}" fill="{}" rx="2"><title>{}</title></rect>"#,
            LANES[lane].0,
            lane_y(lane),
            x2 - x1,
            LANES[lane].1,
            escape(&format!(
                "{what}: {} to {}",
                label(since(from, t0)),
                label(since(to, t0))
            ))
        );
    };
    bar(
        &mut svg,
        0,
        first(steps, &[FirstSeen, NetnsFound]),
        last(steps, &[AppGone, JobAppFinished]),
        "app",
    );
    bar(
        &mut svg,
        1,
        first(steps, &[ProxyRunning, EnvoyStarted]),
        last(steps, &[ProxyExited, ProxyGone, SidecarLost]),
        "proxy",
    );
    bar(
        &mut svg,
        2,
        first(steps, &[HoldIn]),
        first(steps, &[HoldReleased, FailedOpen]),
        "hold",
    );
    bar(
        &mut svg,
        3,
        first(steps, &[DrainStarted]),
        last(steps, &[DrainFinished, JobFinished, ProxyExited]),
        "drain",
    );
    // The proxy's readiness across every lane: the moment the hold exists for.
    if let Some(ready) = first(steps, &[ProxyReady]) {
        let _ = writeln!(
            svg,
            r#"<line class="ready" x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="{READY_COLOUR}" stroke-width="2"><title>proxy ready at {}</title></line><text x="{:.1}" y="{:.1}" fill="{READY_COLOUR}">ready</text>"#,
            TOP - 8.0,
            lane_y(LANES.len() - 1) + BAR + 4.0,
            label(since(ready, t0)),
            x(ready) + 3.0,
            TOP - 10.0,
            x = x(ready),
        );
    }
    // Every step: a tick on its lane with its tooltip.
    for s in steps {
        let lane = lane_of(s.step);
        let name = kind_name(s.step);
        let tip = match &s.detail {
            Some(d) => format!("{name} at {}: {d}", label(since(s.at, t0))),
            None => format!("{name} at {}", label(since(s.at, t0))),
        };
        let _ = writeln!(
            svg,
            r##"<line class="step" data-step="{}" x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#222222" stroke-width="1"><title>{}</title></line>"##,
            escape(&name),
            lane_y(lane) - 3.0,
            lane_y(lane) + BAR + 3.0,
            escape(&tip),
            x = x(s.at),
        );
    }
    // Names on the moments the picture is for: the release, the app gone, the quit, the exit.
    for (kinds, name) in [
        (&[HoldReleased, FailedOpen][..], "release"),
        (&[AppGone][..], "app gone"),
        (&[Quitting][..], "quit"),
        (&[ProxyExited][..], "exit"),
    ] {
        if let Some(s) = steps.iter().find(|s| kinds.contains(&s.step)) {
            let lane = lane_of(s.step);
            let _ = writeln!(
                svg,
                r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#333333">{name}</text>"##,
                x(s.at) + 2.0,
                lane_y(lane) - 4.0,
            );
        }
    }
    // The time axis.
    let axis_y = lane_y(LANES.len()) + 4.0;
    let _ = writeln!(
        svg,
        r##"<line x1="{LEFT}" y1="{axis_y}" x2="{}" y2="{axis_y}" stroke="#444444"/>"##,
        WIDTH - RIGHT
    );
    for i in 0..=5 {
        let d = Duration::from_secs_f64(span * f64::from(i) / 5.0);
        let tx = LEFT + plot * f64::from(i) / 5.0;
        let _ = writeln!(
            svg,
            r##"<line x1="{tx:.1}" y1="{axis_y}" x2="{tx:.1}" y2="{}" stroke="#444444"/><text x="{tx:.1}" y="{}" text-anchor="middle" class="tick">{}</text>"##,
            axis_y + 4.0,
            axis_y + 17.0,
            escape(&label(d))
        );
    }
    svg.push_str("</svg>\n");
    Some(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Phase, SidecarMode, Timeline};

    fn t(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000) + Duration::from_millis(ms)
    }

    pub(crate) fn pod() -> PodStatus {
        use StepKind::*;
        let steps = [
            (0, FirstSeen, None),
            (52, NetnsFound, None),
            (111, HoldIn, None),
            (
                219,
                FirstConnectionHeld,
                Some("10.0.0.7:8080 <\"app\"> & co"),
            ),
            (300, ProxyRunning, Some("istio-proxy")),
            (420, EnvoyStarted, None),
            (700, EnvoyLive, None),
            (845, ProxyReady, None),
            (886, HoldReleased, Some("ready: held 2 connection(s)")),
            (5000, DrainStarted, None),
            (5010, InboundDrained, None),
            (8800, AppContainerExited, Some("app")),
            (8805, AppGone, None),
            (8910, Quitting, Some("nothing in flight")),
            (8949, ProxyExited, None),
            (8950, DrainFinished, Some("app-done")),
        ];
        PodStatus {
            namespace: "default".into(),
            name: "flusher".into(),
            uid: "u".into(),
            phase: Phase::Done,
            mode: Some(SidecarMode::Classic),
            mesh: Some(crate::api::Mesh::Istio),
            tracked_since: t(0),
            hold: None,
            drain: None,
            job: None,
            last_error: None,
            skipped_reason: None,
            timeline: Some(Timeline {
                steps: steps
                    .iter()
                    .map(|(ms, step, d)| Step {
                        at: t(*ms),
                        step: *step,
                        detail: d.map(str::to_string),
                    })
                    .collect(),
                dropped: 0,
            }),
        }
    }

    #[test]
    fn every_step_and_lane_is_drawn_and_text_is_escaped() {
        let svg = render("node-a", &pod(), t(20_000)).expect("an svg");
        assert!(svg.starts_with("<?xml"), "{svg}");
        assert_eq!(svg.matches("class=\"step\"").count(), 16);
        for (lane, colour) in LANES {
            assert!(svg.contains(&format!("data-lane=\"{lane}\"")), "{lane}");
            assert!(svg.contains(colour));
        }
        assert!(svg.contains("class=\"ready\""));
        assert!(svg.contains("&lt;&quot;app&quot;&gt; &amp; co"), "{svg}");
        assert!(!svg.contains("<\"app\">"));
        // A finished pod's picture ends at its last step, not at `now`.
        assert!(
            svg.contains(&format!(">{}<", label(Duration::from_millis(8950)))),
            "{svg}"
        );
        assert!(!svg.contains(">20s<"), "{svg}");
    }

    #[test]
    fn no_steps_no_picture() {
        let mut p = pod();
        p.timeline = None;
        assert!(render("n", &p, t(0)).is_none());
    }

    #[test]
    fn controls_are_dropped() {
        assert_eq!(escape("a\u{1b}[31mb\u{7}c\td"), "a[31mbc d");
    }
}
