//! The agent's per-pod status board: what every tracked pod is doing now and what happened to it.
//!
//! Pod tasks write their own row; the status API and `holdfast status` read the whole board.
//! Rows are plain data (serde), so the JSON the API serves is this module's types, documented in
//! docs/reference.md as a stable format.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

pub use crate::api::time::rfc3339;
pub use crate::api::{HoldOutcome, HoldRecord, NodeStatus, Phase, PodStatus};

/// The node's status: every tracked pod, by `namespace/name`.
#[derive(Debug, Clone, Default)]
pub struct StatusBoard {
    inner: Arc<Mutex<BTreeMap<String, PodStatus>>>,
}

impl StatusBoard {
    /// Inserts or replaces a pod's row.
    pub(crate) fn put(&self, status: PodStatus) {
        let key = format!("{}/{}", status.namespace, status.name);
        self.lock().insert(key, status);
    }

    /// Changes a pod's row in place, if it exists.
    pub(crate) fn update(&self, namespace: &str, name: &str, f: impl FnOnce(&mut PodStatus)) {
        if let Some(row) = self.lock().get_mut(&format!("{namespace}/{name}")) {
            f(row);
        }
    }

    /// Removes a pod's row only if it still belongs to pod `uid` (a pod re-created under the same
    /// name has a new uid and keeps its row).
    pub(crate) fn remove_if_uid(&self, namespace: &str, name: &str, uid: &str) {
        let mut rows = self.lock();
        let key = format!("{namespace}/{name}");
        if rows.get(&key).is_some_and(|r| r.uid == uid) {
            rows.remove(&key);
        }
    }

    /// A copy of one pod's row, if it has one.
    pub(crate) fn snapshot_row(&self, namespace: &str, name: &str) -> Option<PodStatus> {
        self.lock().get(&format!("{namespace}/{name}")).cloned()
    }

    /// A copy of every row, ordered by `namespace/name`.
    pub(crate) fn snapshot(&self) -> Vec<PodStatus> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, PodStatus>> {
        // A panic while holding the lock cannot leave a row half-written (rows are replaced or
        // mutated field by field with plain values), so the data is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
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
            mode: None,
            mesh: None,
            tracked_since: t,
            hold: Some(HoldRecord {
                started_at: Some(t),
                ..HoldRecord::default()
            }),
            drain: None,
            job: None,
            last_error: None,
            skipped_reason: None,
            timeline: None,
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
