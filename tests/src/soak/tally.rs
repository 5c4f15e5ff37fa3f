//! The soak's counts, from what the apps saw (their reports), what the kubelet saw (container
//! exits) and when the agent was away.
//!
//! **The fail-open window.** holdfast promises nothing while no agent runs: the hold rule stays
//! in place with `--queue-bypass`, so with no agent bound to its queue a SYN passes as if there
//! were no rule, and a call to a proxy that is not ready is refused exactly as without holdfast.
//! A refused call is *inside the window* when it ended (a refusal ends the call the moment the
//! SYN meets the closed port) between an agent's end (the signal) and [`ADOPT_MARGIN`] after its
//! successor's status API answered (the time the successor has to list the pods and install or
//! adopt their holds). Every other refused call is *outside the window*: an agent was running
//! and had had the time to see the pod. The goal is 0.

use std::collections::BTreeMap;
use std::time::Duration;

use super::chaos::Outage;
use super::driver::Facts;
use super::plan::{EnvoyChaos, Kind, PodRestart, DOWNLOAD_BYTES};
use crate::sim::pod_object::ContainerView;
use crate::sim::report::AppEvent;
use crate::sim::CallError;

/// See the module's documentation.
pub const ADOPT_MARGIN: Duration = Duration::from_millis(1500);
/// A drain crossed by an outage is adopted when the proxy exits (or the agent's quit is sent)
/// at most this long after the latest of the app's exit, the successor's start and (a
/// download) the response's last byte.
pub const ADOPT_LAG: Duration = Duration::from_secs(3);
/// A proxy that outlives its app by more than this held the pod up (a fixed drain, a Job that
/// does not complete).
pub const OUTLIVED: Duration = Duration::from_secs(2);

/// Why a drain's proxy outlived its app by more than [`OUTLIVED`]: each slow drain gets one,
/// the first that applies, in this order. Only `Unexplained` is a goal (0): the others are the
/// chaos injected (an agent outage, a frozen Envoy), the deadline, or named waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SlowDrain {
    /// An agent outage crossed the drain: the successor found and adopted it.
    AgentOutage,
    /// The pod's Envoy was frozen (SIGSTOP) during the drain.
    EnvoyFrozen,
    /// The drain ended at its deadline (the app or its traffic outlasted the grace period).
    Deadline,
    /// The agent waited for traffic still in flight after the app's exit (its report says the
    /// quit came more than a second after the app was gone, and why).
    WaitedForTraffic,
    /// Envoy took more than a second to exit after the quit.
    SlowEnvoyExit,
    /// No drain report from any agent for the pod.
    NoReport,
    /// None of the above: the agent could have ended it sooner (goal 0).
    Unexplained,
}

impl SlowDrain {
    pub fn as_str(self) -> &'static str {
        match self {
            SlowDrain::AgentOutage => "agent outage",
            SlowDrain::EnvoyFrozen => "Envoy frozen",
            SlowDrain::Deadline => "deadline",
            SlowDrain::WaitedForTraffic => "traffic in flight",
            SlowDrain::SlowEnvoyExit => "slow Envoy exit",
            SlowDrain::NoReport => "no drain report",
            SlowDrain::Unexplained => "unexplained",
        }
    }
}

/// The cause of one slow drain (see [`SlowDrain`]); `app`, `proxy`: the containers' exits (µs).
fn slow_drain_cause(f: &Facts, outages: &[Outage], app: u64, proxy: u64) -> SlowDrain {
    let crossed = outages.iter().any(|o| {
        let up = o
            .up_us
            .unwrap_or(u64::MAX)
            .saturating_add(ADOPT_MARGIN.as_micros() as u64);
        o.down_us <= proxy && up >= app.min(f.deleted_us.unwrap_or(app))
    });
    if crossed {
        return SlowDrain::AgentOutage;
    }
    if f.envoy_chaos_done && matches!(f.plan.envoy, Some((_, EnvoyChaos::Stop(_)))) {
        return SlowDrain::EnvoyFrozen;
    }
    let Some(d) = &f.drain else {
        return SlowDrain::NoReport;
    };
    if d.outcome == holdfast::api::DrainOutcome::Deadline {
        return SlowDrain::Deadline;
    }
    let between = |a: Option<std::time::SystemTime>, b: Option<std::time::SystemTime>| {
        a.zip(b).and_then(|(a, b)| b.duration_since(a).ok())
    };
    let second = Duration::from_secs(1);
    if between(d.app_gone_at, d.quit_sent_at).is_some_and(|w| w > second) {
        return SlowDrain::WaitedForTraffic;
    }
    if between(d.quit_sent_at, d.proxy_exit_seen_at).is_some_and(|w| w > second) {
        return SlowDrain::SlowEnvoyExit;
    }
    SlowDrain::Unexplained
}

/// Counts of one variant's run.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub by_kind: BTreeMap<&'static str, u32>,
    pub calls_ok: u32,
    pub calls_failed: u32,
    pub refused: u32,
    pub refused_in_window: u32,
    /// One line per refused call outside the window.
    pub refused_outside: Vec<String>,
    pub timeouts: u32,
    pub resets_or_closed: u32,
    /// Boot callers whose app crashed (a failed startup call) and was restarted.
    pub app_restarts: u32,
    pub jobs: u32,
    pub jobs_never_completed: u32,
    pub drains: u32,
    pub proxy_outlived_app: u32,
    /// Each drain whose proxy outlived the app by more than [`OUTLIVED`], by cause, with its
    /// details.
    pub slow_drains: Vec<(SlowDrain, String)>,
    /// Proxy exit − app exit (or − deletion, if later), ms.
    pub drain_lag_ms: Vec<f64>,
    pub drains_crossed: u32,
    pub drains_not_adopted: Vec<String>,
    pub envoy_kills: u32,
    pub envoy_freezes: u32,
    pub stale_holds: Vec<String>,
    pub stuck: Vec<String>,
    /// Download pods whose client ran / whose response did not arrive whole.
    pub downloads: u32,
    pub downloads_cut: Vec<String>,
    pub bytes_missing: u64,
    /// Boot callers restarted whole: sandbox recreated / in place.
    pub sandbox_recreations: u32,
    pub in_place_restarts: u32,
    /// What each lifecycle cost its pod, in plan order (for the comparison with the baseline).
    pub lives: Vec<LifeCounts>,
}

/// What one lifecycle cost its pod — the counts compared with the baseline's same lifecycle
/// (issue 28: never worse with holdfast).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LifeCounts {
    pub index: usize,
    /// Calls refused outside the fail-open window.
    pub refused: u32,
    /// Calls that failed in any way outside the fail-open window, except resets of calls the
    /// Envoy kill itself cut ([`KILL_CUTS`]).
    pub failed: u32,
    /// Bytes of the download that never arrived.
    pub bytes_missing: u64,
    /// Deletion → the pod's last container exit, ms.
    pub deletion_to_gone_ms: Option<f64>,
    /// Deletion → the app's exit, ms (the app's own shutdown, which no agent shortens).
    pub deletion_to_app_exit_ms: Option<f64>,
    /// An agent outage crossed the pod's deletion (its drain went the fail-open way, which
    /// `drains_not_adopted` judges instead).
    pub drain_crossed: bool,
}

/// A call reset or closed this soon after the pod's Envoy was SIGKILLed was cut by the kill
/// (the chaos), with or without holdfast: the comparison leaves it out.
pub const KILL_CUTS: Duration = Duration::from_secs(2);

fn exit_us(c: Option<&ContainerView>) -> Option<u64> {
    let t = c?.last_exit()?;
    u64::try_from(t.finished_at.as_microsecond()).ok()
}

/// Whether wall time `t_us` is inside the fail-open window of some outage.
pub fn in_window(outages: &[Outage], t_us: u64) -> bool {
    let margin = ADOPT_MARGIN.as_micros() as u64;
    outages
        .iter()
        .any(|o| o.down_us <= t_us && t_us <= o.up_us.map_or(u64::MAX, |up| up + margin))
}

/// Counts `facts` against `outages` (none for the baseline).
pub fn tally(facts: &[Facts], outages: &[Outage]) -> Tally {
    let mut t = Tally::default();
    for f in facts {
        let name = f.plan.pod_name();
        let kind = match f.plan.kind {
            Kind::BootCaller => "boot",
            Kind::ShutdownCaller => "call",
            Kind::Job => "job",
            Kind::Download => "dl",
        };
        *t.by_kind.entry(kind).or_default() += 1;
        t.lives.push(life_counts(f, outages));
        if let Some(r) = f.plan.restart.filter(|_| f.restarted_us.is_some()) {
            match r.kind {
                PodRestart::Sandbox => t.sandbox_recreations += 1,
                PodRestart::InPlace => t.in_place_restarts += 1,
            }
        }
        if let Some(d) = &f.download {
            t.downloads += 1;
            let missing = DOWNLOAD_BYTES.saturating_sub(d.got);
            t.bytes_missing += missing;
            if missing > 0 || d.error.is_some() {
                t.downloads_cut.push(format!(
                    "{name}: {} of {DOWNLOAD_BYTES} bytes ({}); {}",
                    d.got,
                    d.error.as_deref().unwrap_or("closed early"),
                    life(f)
                ));
            }
        }
        count_calls(&mut t, f, outages);
        if f.plan.kind == Kind::BootCaller {
            t.app_restarts += f.report.starts().saturating_sub(1) as u32;
        }
        if f.envoy_chaos_done {
            match f.plan.envoy {
                Some((_, EnvoyChaos::Kill)) => t.envoy_kills += 1,
                Some((_, EnvoyChaos::Stop(_))) => t.envoy_freezes += 1,
                None => {}
            }
        }
        if f.plan.kind == Kind::Job {
            t.jobs += 1;
            if f.job_completed != Some(true) {
                t.jobs_never_completed += 1;
            }
        }
        if let Some(s) = &f.stale_hold {
            t.stale_holds.push(format!("{name}: {s}"));
        }
        if let Some(s) = &f.stuck {
            t.stuck.push(format!("{name}: {s}"));
        }
        count_drain(&mut t, f, outages);
    }
    t
}

fn count_calls(t: &mut Tally, f: &Facts, outages: &[Outage]) {
    for e in &f.report.events {
        let AppEvent::Call {
            at_ms,
            at_us,
            phase,
            ok,
            error,
            ..
        } = e
        else {
            continue;
        };
        if *ok {
            t.calls_ok += 1;
            continue;
        }
        t.calls_failed += 1;
        match error {
            Some(CallError::ConnectionRefused) => {
                t.refused += 1;
                let at = at_us.unwrap_or(at_ms * 1000);
                if !outages.is_empty() && in_window(outages, at) {
                    t.refused_in_window += 1;
                } else {
                    t.refused_outside.push(format!(
                        "{} {phase:?} call refused at {}; {}",
                        f.plan.pod_name(),
                        secs(at),
                        life(f)
                    ));
                }
            }
            Some(CallError::Timeout) => t.timeouts += 1,
            Some(CallError::ConnectionReset | CallError::Closed) => t.resets_or_closed += 1,
            _ => {}
        }
    }
}

/// Wall time µs as `HH:MM:SS.mmm` UTC (as the agent's log prints it).
fn secs(us: u64) -> String {
    let ms = us / 1000;
    let s = ms / 1000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        (s / 3600) % 24,
        (s / 60) % 60,
        s % 60,
        ms % 1000
    )
}

/// When the pod was deleted and its app and proxy last exited, for the details.
fn life(f: &Facts) -> String {
    let view = f.view.as_ref();
    let at = |us: Option<u64>| us.map_or("—".into(), secs);
    format!(
        "deleted {}, app exit {}, proxy exit {} (proxy restarts {})",
        at(f.deleted_us),
        at(exit_us(view.and_then(|v| v.app()))),
        at(exit_us(view.and_then(|v| v.proxy()))),
        view.and_then(|v| v.proxy()).map_or(0, |c| c.restart_count)
    )
}

/// The pod's last container exit (wall clock, µs).
fn gone_us(f: &Facts) -> Option<u64> {
    let view = f.view.as_ref()?;
    view.containers
        .iter()
        .chain(view.sidecar.iter())
        .filter_map(|c| exit_us(Some(c)))
        .max()
}

/// What lifecycle `f` cost its pod (see [`LifeCounts`]).
pub fn life_counts(f: &Facts, outages: &[Outage]) -> LifeCounts {
    let mut c = LifeCounts {
        index: f.plan.index,
        ..LifeCounts::default()
    };
    let kill = f
        .envoy_chaos_us
        .filter(|_| matches!(f.plan.envoy, Some((_, EnvoyChaos::Kill))));
    for e in &f.report.events {
        let AppEvent::Call {
            at_ms,
            at_us,
            ok: false,
            error,
            ..
        } = e
        else {
            continue;
        };
        let at = at_us.unwrap_or(at_ms * 1000);
        if in_window(outages, at) {
            continue;
        }
        let cut_by_kill = matches!(error, Some(CallError::ConnectionReset | CallError::Closed))
            && kill.is_some_and(|k| k <= at && at <= k + KILL_CUTS.as_micros() as u64);
        if cut_by_kill {
            continue;
        }
        c.failed += 1;
        if *error == Some(CallError::ConnectionRefused) {
            c.refused += 1;
        }
    }
    if f.plan.kind == Kind::Download {
        c.bytes_missing = DOWNLOAD_BYTES.saturating_sub(f.download.as_ref().map_or(0, |d| d.got));
    }
    if let (Some(deleted), Some(gone)) = (f.deleted_us, gone_us(f)) {
        if gone >= deleted {
            c.deletion_to_gone_ms = Some((gone - deleted) as f64 / 1000.0);
            c.deletion_to_app_exit_ms = exit_us(f.view.as_ref().and_then(|v| v.app()))
                .map(|app| app.saturating_sub(deleted) as f64 / 1000.0);
            c.drain_crossed = outages
                .iter()
                .any(|o| o.down_us <= gone && o.up_us.is_none_or(|up| up >= deleted));
        }
    }
    c
}

/// A drain: the pod was deleted while its proxy ran.
fn count_drain(t: &mut Tally, f: &Facts, outages: &[Outage]) {
    let Some(view) = &f.view else { return };
    let (Some(deleted), Some(app), Some(proxy)) =
        (f.deleted_us, exit_us(view.app()), exit_us(view.proxy()))
    else {
        return;
    };
    if proxy < deleted {
        return; // A completed Job: its proxy had ended already.
    }
    t.drains += 1;
    let from = app.max(deleted);
    let lag_ms = (proxy as f64 - from as f64) / 1000.0;
    t.drain_lag_ms.push(lag_ms);
    if lag_ms > OUTLIVED.as_secs_f64() * 1000.0 {
        t.proxy_outlived_app += 1;
        let cause = slow_drain_cause(f, outages, app, proxy);
        let agent_says = f.drain.as_ref().map_or("no report".to_string(), |d| {
            format!(
                "{} (quit {:?}, app gone → quit {:?}, → proxy exit {:?})",
                d.outcome.as_str(),
                d.quit_reason,
                d.app_gone_to_quit,
                d.app_gone_to_proxy_exit
            )
        });
        t.slow_drains.push((
            cause,
            format!(
                "{}: {} ms; {}; agent: {agent_says}",
                f.plan.pod_name(),
                lag_ms as u64,
                life(f)
            ),
        ));
    }
    // Every outage that crosses this drain; the last successor is the one that had the drain
    // to adopt (an agent killed before it quit Envoy leaves it to the next one: CI, 2026-11-28
    // 10:48, `l0007-boot`, judged against the first successor's start and called late).
    let crossing: Vec<&Outage> = outages
        .iter()
        .filter(|o| o.down_us <= proxy && o.up_us.unwrap_or(u64::MAX) >= deleted)
        .collect();
    if let Some(o) = crossing.iter().max_by_key(|o| o.up_us.unwrap_or(u64::MAX)) {
        let up = o.up_us.unwrap_or(u64::MAX);
        t.drains_crossed += 1;
        // A download's response is still on its way after its app exited: the drain is due
        // to end after its last byte, not before.
        let last_byte = f
            .download
            .as_ref()
            .and_then(|d| d.last_byte)
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_micros() as u64);
        let due = app
            .max(up)
            .max(last_byte)
            .saturating_add(ADOPT_LAG.as_micros() as u64);
        // The successor quit Envoy in time and Envoy took its time to exit: adopted (the exit
        // is Envoy's; the slow-drain causes count it).
        let quit_in_time = f
            .drain
            .as_ref()
            .and_then(|d| d.quit_sent_at)
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .is_some_and(|q| (q.as_micros() as u64) <= due);
        if proxy > due && !quit_in_time {
            t.drains_not_adopted.push(format!(
                "{}: {}; agent {:?} down {}..{}, proxy exit {} ms late",
                f.plan.pod_name(),
                life(f),
                o.end,
                secs(o.down_us),
                o.up_us.map_or("never".into(), secs),
                (proxy - due) / 1000
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soak::plan::AgentEnd;

    fn outage(down: u64, up: Option<u64>) -> Outage {
        Outage {
            end: AgentEnd::Sigkill,
            gap: Duration::from_millis(10),
            down_us: down,
            up_us: up,
            slow_exit: false,
        }
    }

    #[test]
    fn the_window_runs_from_the_signal_to_the_margin_after_the_successor() {
        let o = [outage(10_000_000, Some(12_000_000))];
        assert!(!in_window(&o, 9_999_999));
        assert!(in_window(&o, 10_000_000));
        assert!(in_window(&o, 13_500_000));
        assert!(!in_window(&o, 13_500_001));
        // A successor that never answered leaves the window open.
        assert!(in_window(&[outage(1, None)], u64::MAX - 1));
        assert!(!in_window(&[], 5));
    }
}
