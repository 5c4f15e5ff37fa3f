//! The machine's inputs, recorded by a running agent and replayed (issue 28 item 6).
//!
//! The driver logs, at debug level under the target `TARGET`, the pod's first facts and then
//! every input it feeds `machine::step`, as JSON (`Recorded`); the end-to-end tests' agents
//! log it (`HOLDFAST_LOG=holdfast=debug`), and an operator can with
//! `HOLDFAST_LOG=info,holdfast::inputs=debug`. [`Recording::from_log`] reads one pod's
//! sequences back from the agent's log (text or JSON format; one sequence per agent that
//! followed the pod), and [`Recording::replay`] feeds it to the machine again, on a clock made
//! from the lines' timestamps, checking what must hold for any sequence ([`Replayed::check`]).
//!
//! The end-to-end tests replay what their agent was fed (a machine decision the sequence does
//! not reproduce fails there), and `machine_tests.rs` replays the recorded sequences kept in
//! `node-agent/tests/corpus/inputs/` — a recreated sandbox, an in-place restart, a drain adopted
//! after Envoy's drain time, a download through a drain — beside its hand-written rows.

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use super::facts::PodFacts;
use super::machine::{self, Now, Stage, State};
use super::messages::{Effect, Input, Seen, Timer};
use crate::effects::netns::NetnsId;

/// The log target of the recorded inputs.
pub(crate) const TARGET: &str = "holdfast::inputs";
/// The log field that carries a [`Recorded`] as JSON.
pub(crate) const FIELD: &str = "recorded";

/// One line of a recording.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Recorded {
    /// An agent began to follow the pod with these facts (`State::new`).
    Start(PodFacts),
    /// The next input the machine got.
    Input(Input),
}

impl Recorded {
    /// The JSON the driver logs (`{"Start":…}`, `{"Input":…}`).
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"unrecordable\":\"{e}\"}}"))
    }
}

/// One agent's sequence for one pod.
#[derive(Debug, Clone)]
pub struct Recording {
    pub first: PodFacts,
    /// Each input with when it was logged.
    pub inputs: Vec<(SystemTime, Input)>,
    pub started_at: SystemTime,
}

/// A replay's result: the stage after each input, and every effect.
#[derive(Debug)]
pub struct Replayed {
    pub stages: Vec<Stage>,
    pub effects: Vec<Vec<Effect>>,
    pub state: State,
    /// What went against the rules every sequence must keep ([`Replayed::check`]).
    pub broken: Vec<String>,
}

impl Replayed {
    /// `Ok` when the replay kept every rule: no hold set up in a netns the pod's processes had
    /// left (`NetnsGone`) unless it was found again, and no input after the task exited.
    pub fn check(&self) -> Result<(), String> {
        if self.broken.is_empty() {
            Ok(())
        } else {
            Err(self.broken.join("; "))
        }
    }

    /// The netns of each hold the replay set up, in order (the stage an `InstallHold` entered).
    pub fn holds_set_up(&self) -> Vec<NetnsId> {
        self.stages
            .windows(2)
            .zip(&self.effects[1..])
            .filter(|(_, fx)| fx.iter().any(|e| matches!(e, Effect::InstallHold { .. })))
            .filter_map(|(w, _)| match w[1] {
                Stage::SettingUpHold { netns, .. } => Some(netns),
                _ => None,
            })
            .collect()
    }

    /// Whether any step's effects match `f`.
    pub fn any_effect(&self, f: impl Fn(&Effect) -> bool) -> bool {
        self.effects.iter().flatten().any(f)
    }
}

impl Recording {
    /// The sequences of pod `pod` (`namespace/name`) in an agent log, in order (one per agent
    /// that followed it). Lines of other pods and targets are skipped; a recorded line that does
    /// not parse is an error naming its line number.
    pub fn from_log(log: &str, pod: &str) -> Result<Vec<Recording>, String> {
        let mut out: Vec<Recording> = Vec::new();
        for (n, line) in log.lines().enumerate() {
            let Some((at, json)) = recorded_of(line, pod) else {
                continue;
            };
            let rec: Recorded = serde_json::from_str(&json)
                .map_err(|e| format!("log line {}: recorded input: {e}", n + 1))?;
            match rec {
                Recorded::Start(first) => out.push(Recording {
                    first,
                    inputs: Vec::new(),
                    started_at: at,
                }),
                Recorded::Input(input) => match out.last_mut() {
                    Some(r) => r.inputs.push((at, input)),
                    None => {
                        return Err(format!(
                            "log line {}: an input of {pod} before its start",
                            n + 1
                        ))
                    }
                },
            }
        }
        Ok(out)
    }

    /// The outcome of the drain report the sequence fed the machine, if one.
    pub fn drain_outcome(&self) -> Option<crate::api::DrainOutcome> {
        self.inputs.iter().find_map(|(_, i)| match i {
            Input::DrainFinished(d) => Some(d.outcome),
            _ => None,
        })
    }

    /// The recording as the lines [`Recording::from_log`] reads (text format), for a corpus
    /// file.
    pub fn to_log(&self, pod: &str) -> String {
        let line = |at: SystemTime, r: Recorded| {
            let ts = k8s_openapi::jiff::Timestamp::try_from(at)
                .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
            format!(
                "{ts} DEBUG pod{{pod={pod}}}: {TARGET}: {FIELD}={}\n",
                r.to_json()
            )
        };
        let mut s = line(self.started_at, Recorded::Start(self.first.clone()));
        for (at, input) in &self.inputs {
            s.push_str(&line(*at, Recorded::Input(input.clone())));
        }
        s
    }

    /// Feeds the sequence to the machine again, its clock following the recorded times.
    pub fn replay(&self, ready_poll: Duration) -> Replayed {
        let base = Instant::now();
        let now_at = |at: SystemTime| Now {
            mono: base + at.duration_since(self.started_at).unwrap_or_default(),
            wall: at,
        };
        let (mut state, fx) = State::new(self.first.clone(), ready_poll, now_at(self.started_at));
        let mut r = Replayed {
            stages: vec![state.stage.clone()],
            effects: vec![fx],
            state: state.clone(),
            broken: Vec::new(),
        };
        let mut dead: HashSet<NetnsId> = HashSet::new();
        for (i, (at, input)) in self.inputs.iter().enumerate() {
            if state.stage == Stage::Exited {
                r.broken
                    .push(format!("input {i} ({input:?}) after the task exited"));
                break;
            }
            match input {
                Input::NetnsGone => {
                    if let Some(n) = netns_of(&state.stage) {
                        dead.insert(n);
                    }
                }
                Input::NetnsFound { netns } => {
                    dead.remove(netns);
                }
                _ => {}
            }
            let fx;
            (state, fx) = machine::step(state, input.clone(), now_at(*at));
            if let Some(n) = hold_in_dead_netns(&dead, &state.stage, &fx) {
                r.broken.push(format!(
                    "input {i} ({input:?}): a hold set up in {n:?}, which the pod's processes \
                     had left"
                ));
            }
            r.stages.push(state.stage.clone());
            r.effects.push(fx);
        }
        r.state = state;
        r
    }
}

/// The netns of a hold these effects set up in `stage`, when the pod's processes had left it.
fn hold_in_dead_netns(dead: &HashSet<NetnsId>, stage: &Stage, fx: &[Effect]) -> Option<NetnsId> {
    let installs = fx.iter().any(|e| matches!(e, Effect::InstallHold { .. }));
    netns_of(stage).filter(|n| installs && dead.contains(n))
}

/// The netns a stage acts in.
fn netns_of(stage: &Stage) -> Option<NetnsId> {
    match stage {
        Stage::Checking { netns, .. }
        | Stage::SettingUpHold { netns, .. }
        | Stage::Holding { netns, .. }
        | Stage::Releasing { netns, .. }
        | Stage::Running { netns, .. }
        | Stage::JobWatch { netns }
        | Stage::Draining { netns } => Some(*netns),
        Stage::WaitingForNetns { .. } | Stage::Finished | Stage::Exited => None,
    }
}

/// The time and JSON of a recorded line of `pod`, in the text or JSON log format.
fn recorded_of(line: &str, pod: &str) -> Option<(SystemTime, String)> {
    if !line.contains(TARGET) {
        return None;
    }
    if line.starts_with('{') {
        // JSON format: {"timestamp":…,"fields":{"recorded":"…"},"target":…,"span":{"pod":…}}
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        if v.get("target")?.as_str()? != TARGET || v.pointer("/span/pod")?.as_str()? != pod {
            return None;
        }
        let at = parse_time(v.get("timestamp")?.as_str()?)?;
        let json = v
            .pointer(&format!("/fields/{FIELD}"))?
            .as_str()?
            .to_string();
        return Some((at, json));
    }
    // Text format: `<timestamp> DEBUG pod{pod=<pod> uid=…}: holdfast::inputs: recorded={…}`.
    let (ts, rest) = line.split_once(' ')?;
    let span = rest.split_once("pod{pod=")?.1;
    let named = span.strip_prefix(pod)?;
    if !(named.starts_with(' ') || named.starts_with('}')) {
        return None;
    }
    let json = rest
        .split_once(&format!(" {TARGET}: {FIELD}="))?
        .1
        .trim_end();
    Some((parse_time(ts)?, json.to_string()))
}

fn parse_time(ts: &str) -> Option<SystemTime> {
    ts.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(SystemTime::from)
}

/// Which of the machine's inputs the driver logs (`holdfast::inputs`, debug), as JSON, in
/// order: the sequence [`Recorded`] reads back (`HOLDFAST_LOG=info,holdfast::inputs=debug`) —
/// but not the readiness polls' timers, and not a readiness observation the same as the input
/// before it, which change nothing a replay decides (machine_tests.rs `replay_*` leaves those
/// runs out anyway): in a burst of pods starting those were thousands of lines a second, and
/// formatting and writing them was the largest part of what the agent spent beyond the c978d44
/// build (issue 29 item 9, `perf` of a 30-pod burst). Serialized only when enabled.
#[derive(Debug, Default)]
pub(crate) struct InputsLog {
    last_seen: Option<Seen>,
}

impl InputsLog {
    /// Logs the facts a pod's machine starts from.
    pub(crate) fn start(facts: &PodFacts) {
        tracing::debug!(
            target: "holdfast::inputs",
            recorded = %Recorded::Start(facts.clone()).to_json()
        );
    }

    /// Logs `input` unless it is one left out (and remembers it).
    pub(crate) fn log(&mut self, input: &Input) {
        if self.note(input) {
            tracing::debug!(
                target: "holdfast::inputs",
                recorded = %Recorded::Input(input.clone()).to_json()
            );
        }
    }

    /// Whether to log `input` (and remembers it).
    fn note(&mut self, input: &Input) -> bool {
        match input {
            Input::Timer(Timer::ReadinessPoll) => false,
            Input::Readiness(seen) => self.last_seen.replace(*seen) != Some(*seen),
            _ => {
                self.last_seen = None;
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::messages::Seen;
    use crate::pod::{ContainerState, RestartPolicy};

    /// Issue 29 item 9: the inputs log leaves out the readiness polls' timers and repeated
    /// observations (thousands of lines a second in a burst), and keeps every other input and
    /// every change of what the checks see.
    #[test]
    fn the_inputs_log_leaves_out_repeated_polls() {
        let mut log = InputsLog::default();
        let logged: Vec<bool> = [
            Input::NetnsFound {
                netns: crate::effects::netns::NetnsId { dev: 4, ino: 1 },
            },
            Input::Readiness(Seen::Down),
            Input::Timer(Timer::ReadinessPoll),
            Input::Readiness(Seen::Down),
            Input::Timer(Timer::ReadinessPoll),
            Input::Readiness(Seen::Up),
            Input::Timer(Timer::ReadinessPoll),
            Input::Readiness(Seen::Up),
            Input::Timer(Timer::HoldDeadline),
            Input::Readiness(Seen::Up),
            Input::Readiness(Seen::Ready),
        ]
        .iter()
        .map(|i| log.note(i))
        .collect();
        assert_eq!(
            logged,
            [true, true, false, false, false, true, false, false, true, true, true]
        );
    }

    fn facts() -> PodFacts {
        PodFacts {
            deletion: None,
            restart_policy: RestartPolicy::Always,
            apps: vec![(Some("app-1".into()), ContainerState::Running)],
            app_restarts: Vec::new(),
            proxy: Some((Some("proxy-1".into()), ContainerState::Running)),
            user_init_running: false,
            hold_timeout: Duration::from_secs(120),
            terminal: false,
            mode: Default::default(),
            restarting_in_place: false,
            proxy_startup_probe: false,
        }
    }

    #[test]
    fn a_recording_reads_back_from_its_own_lines_and_both_log_formats() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let rec = Recording {
            first: facts(),
            inputs: vec![
                (
                    t0 + Duration::from_millis(5),
                    Input::NetnsFound {
                        netns: NetnsId { dev: 4, ino: 77 },
                    },
                ),
                (t0 + Duration::from_millis(9), Input::Readiness(Seen::Ready)),
            ],
            started_at: t0,
        };
        let text = rec.to_log("default/web");
        let other = text.replace("pod=default/web", "pod=default/web-2");
        let log = format!("{other}noise line\n{text}");
        let back = Recording::from_log(&log, "default/web").expect("parses");
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].first, rec.first);
        assert_eq!(back[0].inputs, rec.inputs);
        // The JSON format, as tracing-subscriber's json() writes a span field.
        let json_line = serde_json::json!({
            "timestamp": "2027-01-15T08:00:00.005Z",
            "level": "DEBUG",
            "fields": {FIELD: Recorded::Start(facts()).to_json()},
            "target": TARGET,
            "span": {"pod": "default/web", "name": "pod"},
        });
        let back = Recording::from_log(&json_line.to_string(), "default/web").expect("parses");
        assert_eq!(back.len(), 1);
        // A recorded line that does not parse is an error with its line number.
        let bad = text.replacen("{\"Start\"", "{\"Strat\"", 1);
        let err = Recording::from_log(&bad, "default/web").expect_err("bad line");
        assert!(err.starts_with("log line 1:"), "{err}");
    }

    #[test]
    fn a_hold_in_a_netns_the_pod_left_breaks_the_replay_rule() {
        let (old, new) = (NetnsId { dev: 4, ino: 1 }, NetnsId { dev: 4, ino: 2 });
        let dead = HashSet::from([old]);
        let install = [Effect::InstallHold {
            fresh: false,
            rehold: true,
        }];
        let setting_up = |netns| Stage::SettingUpHold {
            netns,
            rehold: true,
        };
        assert_eq!(
            hold_in_dead_netns(&dead, &setting_up(old), &install),
            Some(old)
        );
        assert_eq!(hold_in_dead_netns(&dead, &setting_up(new), &install), None);
        assert_eq!(hold_in_dead_netns(&dead, &setting_up(old), &[]), None);
    }
}
