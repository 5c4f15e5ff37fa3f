//! The agent's per-pod status board: what every tracked pod is doing now and what happened to it.
//!
//! Pod tasks write their own row; the status API and `holdfast status` read the whole board.
//! Rows are plain data (serde), so the JSON the API serves is this module's types, documented in
//! the README as a stable format.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// Lifecycle phase of a tracked pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Tracked, but no process of the pod exists yet (no network namespace to act in).
    WaitingForNetns,
    /// The app's new connections are held until the proxy is ready.
    Holding,
    /// The proxy is ready and nothing is held.
    Ready,
    /// The pod is being deleted; inbound is drained and the app watched.
    Draining,
    /// The agent asked the proxy to exit.
    Quitting,
    /// Nothing left to do for this pod.
    Done,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::WaitingForNetns => "waiting-for-netns",
            Phase::Holding => "holding",
            Phase::Ready => "ready",
            Phase::Draining => "draining",
            Phase::Quitting => "quitting",
            Phase::Done => "done",
        }
    }
}

/// Why a hold ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HoldOutcome {
    /// The proxy became ready.
    Ready,
    /// The hold deadline passed first (fail open).
    Deadline,
    /// The pod was deleted while held.
    PodDeleted,
    /// The agent stopped while holding; the rule stays for the next agent, which adopts it.
    AgentStopped,
    /// The hold could not be set up or released cleanly; traffic flows as without the agent.
    Failed,
}

impl HoldOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            HoldOutcome::Ready => "ready",
            HoldOutcome::Deadline => "deadline",
            HoldOutcome::PodDeleted => "pod-deleted",
            HoldOutcome::AgentStopped => "agent-stopped",
            HoldOutcome::Failed => "failed",
        }
    }
}

/// What the startup hold did for one pod.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HoldRecord {
    /// When the hold rule went in (or was adopted from a previous agent).
    #[serde(with = "rfc3339::option", default)]
    pub started_at: Option<SystemTime>,
    /// When the hold was released.
    #[serde(with = "rfc3339::option", default)]
    pub released_at: Option<SystemTime>,
    /// Packets (SYNs, including retransmissions) held.
    pub packets_held: u64,
    /// Distinct connections held.
    pub connections_held: u64,
    /// Time from seeing the proxy ready to every held packet accepted, in milliseconds.
    pub ready_to_release_ms: Option<f64>,
    /// True when this agent took over a hold left by a previous agent.
    pub adopted: bool,
    /// True when an app container was already running when the hold went in: the agent was
    /// late, and the app's earliest connections may have met the proxy unheld.
    #[serde(default)]
    pub late: bool,
    /// Why the hold ended; `None` while holding.
    pub outcome: Option<HoldOutcome>,
}

/// One row of the board.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodStatus {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub phase: Phase,
    /// When the agent first saw the pod.
    #[serde(with = "rfc3339")]
    pub tracked_since: SystemTime,
    /// `None` when the proxy was already ready when the pod was first seen (no hold needed).
    pub hold: Option<HoldRecord>,
    /// What the drain did, once the pod was deleted.
    #[serde(default)]
    pub drain: Option<crate::agent::drain::DrainReport>,
    /// What the Job completion did, for a finished Job.
    #[serde(default)]
    pub job: Option<crate::agent::drain::JobReport>,
    /// Problems worth an operator's attention (invalid annotations, admin API errors...).
    pub last_error: Option<String>,
}

/// The node's status: every tracked pod, by `namespace/name`.
#[derive(Debug, Clone, Default)]
pub struct StatusBoard {
    inner: Arc<Mutex<BTreeMap<String, PodStatus>>>,
}

impl StatusBoard {
    /// Inserts or replaces a pod's row.
    pub fn put(&self, status: PodStatus) {
        let key = format!("{}/{}", status.namespace, status.name);
        self.lock().insert(key, status);
    }

    /// Changes a pod's row in place, if it exists.
    pub fn update(&self, namespace: &str, name: &str, f: impl FnOnce(&mut PodStatus)) {
        if let Some(row) = self.lock().get_mut(&format!("{namespace}/{name}")) {
            f(row);
        }
    }

    /// Removes a pod's row (the pod is gone).
    pub fn remove(&self, namespace: &str, name: &str) {
        self.lock().remove(&format!("{namespace}/{name}"));
    }

    /// Removes a pod's row only if it still belongs to pod `uid` (a pod re-created under the same
    /// name has a new uid and keeps its row).
    pub fn remove_if_uid(&self, namespace: &str, name: &str, uid: &str) {
        let mut rows = self.lock();
        let key = format!("{namespace}/{name}");
        if rows.get(&key).is_some_and(|r| r.uid == uid) {
            rows.remove(&key);
        }
    }

    /// A copy of every row, ordered by `namespace/name`.
    pub fn snapshot(&self) -> Vec<PodStatus> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, PodStatus>> {
        // A panic while holding the lock cannot leave a row half-written (rows are replaced or
        // mutated field by field with plain values), so the data is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Timestamps in the status document are RFC 3339 strings in UTC (`2026-11-22T06:00:37.458Z`),
/// as Kubernetes writes them.
pub mod rfc3339 {
    use std::time::SystemTime;

    use k8s_openapi::jiff::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    fn format(t: SystemTime) -> String {
        Timestamp::try_from(t)
            .map(|ts| {
                ts.round(k8s_openapi::jiff::Unit::Millisecond)
                    .unwrap_or(ts)
                    .to_string()
            })
            .unwrap_or_default()
    }

    fn parse<E: serde::de::Error>(s: &str) -> Result<SystemTime, E> {
        s.parse::<Timestamp>()
            .map(SystemTime::from)
            .map_err(|e| E::custom(format!("invalid RFC 3339 timestamp {s:?}: {e}")))
    }

    pub fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        parse(&String::deserialize(d)?)
    }

    /// The same for optional timestamps (`null` when absent).
    pub mod option {
        use super::*;

        pub fn serialize<S: Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
            match t {
                Some(t) => s.serialize_some(&format(*t)),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<SystemTime>, D::Error> {
            Option::<String>::deserialize(d)?
                .map(|s| parse(&s))
                .transpose()
        }
    }
}

/// The JSON document served at `/status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeStatus {
    pub node: String,
    pub agent_version: String,
    pub pods: Vec<PodStatus>,
    /// Pod source entries that were rejected or ignored (bad files, duplicate uids...).
    #[serde(default)]
    pub source_problems: Vec<crate::source::SourceProblem>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn timestamps_are_rfc3339_and_round_trip() {
        let t = UNIX_EPOCH + Duration::from_millis(1_795_327_237_458);
        let row = PodStatus {
            namespace: "shop".into(),
            name: "web-1".into(),
            uid: "u".into(),
            phase: Phase::Holding,
            tracked_since: t,
            hold: Some(HoldRecord {
                started_at: Some(t),
                ..HoldRecord::default()
            }),
            drain: None,
            job: None,
            last_error: None,
        };
        let v = serde_json::to_value(&row).unwrap();
        assert_eq!(v["tracked_since"], "2026-11-22T06:00:37.458Z");
        assert_eq!(v["hold"]["started_at"], "2026-11-22T06:00:37.458Z");
        assert!(v["hold"]["released_at"].is_null());
        assert_eq!(v["phase"], "holding");
        let back: PodStatus = serde_json::from_value(v).unwrap();
        assert_eq!(back, row);

        let bad = serde_json::json!({"namespace": "a", "name": "b", "uid": "c", "phase": "ready",
            "tracked_since": "yesterday", "hold": null, "last_error": null});
        let e = serde_json::from_value::<PodStatus>(bad).unwrap_err();
        assert!(e.to_string().contains("\"yesterday\""), "{e}");
    }
}
