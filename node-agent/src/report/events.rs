//! Kubernetes Events on the pod, so `kubectl describe pod` tells what holdfast did: how long its
//! connections were held, how its drain ended, why a deadline or an early proxy exit needs the
//! operator.
//!
//! Pod tasks never wait on the API server: [`PodEvents::emit`] queues (bounded; a full queue
//! drops the event and logs a warning) and one publisher task posts through kube-rs's event
//! [`Recorder`] (events.k8s.io/v1; repeats become a series). Each (pod, reason) is published at
//! most once per [`MIN_INTERVAL`]. Without the API server (`--pods-dir`) events are only logged.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

use crate::pod::PodKey;

/// The shortest time between two events of the same reason on the same pod.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_secs(30);
/// Events waiting to be posted; past this they are dropped (and logged).
const QUEUE: usize = 256;

/// Why an event was posted: the stable `reason` operators filter on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Reason {
    /// The hold ended because the proxy became ready (Normal).
    HoldReleased,
    /// The hold deadline passed before the proxy was ready (Warning).
    HoldDeadline,
    /// The drain ended because the app was done (Normal).
    DrainCompleted,
    /// The drain deadline ended the drain (Warning).
    DrainDeadline,
    /// The proxy exited while the app still ran: the mesh's drain duration is too short (Warning).
    ProxyExitedBeforeApp,
    /// A finished Job's proxy was stopped so the pod completes (Normal).
    JobProxyStopped,
    /// A finished Job's proxy still ran after the agent asked it to quit: the pod does not
    /// complete (Warning).
    JobProxyNotStopped,
    /// The pod broke one of the agent's bounds and is left alone, its hold released (Warning).
    FailedOpen,
    /// The drain could not start; the proxy ends as without holdfast (Warning).
    DrainNotStarted,
    /// A native sidecar's proxy exited during termination while the app ran; the kubelet does
    /// not restart it then (Warning).
    SidecarLostDuringTermination,
}

impl Reason {
    /// Every reason (the reference's table is checked against it).
    #[cfg(test)]
    pub(crate) const ALL: [Reason; 10] = [
        Reason::HoldReleased,
        Reason::HoldDeadline,
        Reason::DrainCompleted,
        Reason::DrainDeadline,
        Reason::ProxyExitedBeforeApp,
        Reason::JobProxyStopped,
        Reason::JobProxyNotStopped,
        Reason::FailedOpen,
        Reason::DrainNotStarted,
        Reason::SidecarLostDuringTermination,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::HoldReleased => "HoldReleased",
            Reason::HoldDeadline => "HoldDeadline",
            Reason::DrainCompleted => "DrainCompleted",
            Reason::DrainDeadline => "DrainDeadline",
            Reason::ProxyExitedBeforeApp => "ProxyExitedBeforeApp",
            Reason::JobProxyStopped => "JobProxyStopped",
            Reason::JobProxyNotStopped => "JobProxyNotStopped",
            Reason::FailedOpen => "FailedOpen",
            Reason::DrainNotStarted => "DrainNotStarted",
            Reason::SidecarLostDuringTermination => "SidecarLostDuringTermination",
        }
    }

    pub(crate) fn is_warning(self) -> bool {
        matches!(
            self,
            Reason::HoldDeadline
                | Reason::DrainDeadline
                | Reason::ProxyExitedBeforeApp
                | Reason::FailedOpen
                | Reason::DrainNotStarted
                | Reason::SidecarLostDuringTermination
                | Reason::JobProxyNotStopped
        )
    }

    /// The `action` field: what holdfast did.
    pub(crate) fn action(self) -> &'static str {
        match self {
            Reason::HoldReleased | Reason::HoldDeadline => "ReleaseHold",
            Reason::DrainCompleted
            | Reason::DrainDeadline
            | Reason::ProxyExitedBeforeApp
            | Reason::DrainNotStarted => "DrainProxy",
            Reason::SidecarLostDuringTermination => "WatchProxy",
            Reason::JobProxyStopped | Reason::JobProxyNotStopped => "StopProxy",
            Reason::FailedOpen => "LeavePodAlone",
        }
    }
}

#[derive(Debug)]
struct Pending {
    pod: PodKey,
    reason: Reason,
    note: String,
}

/// Where pod tasks send events. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct PodEvents {
    tx: Option<mpsc::Sender<Pending>>,
    /// Tests: every emitted event is also sent here (see [`PodEvents::capturing`]).
    capture: Option<mpsc::UnboundedSender<(PodKey, Reason, String)>>,
}

impl PodEvents {
    /// Events are only logged (no API server).
    pub(crate) fn log_only() -> Self {
        Self::default()
    }

    /// Events are logged and handed to the returned receiver (a test hook: assert that an
    /// outcome posted its Event without an API server).
    #[cfg(test)]
    pub(crate) fn capturing() -> (Self, mpsc::UnboundedReceiver<(PodKey, Reason, String)>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Self {
                tx: None,
                capture: Some(tx),
            },
            rx,
        )
    }

    /// Posts events through `client`, reporting as `holdfast` from `node`.
    pub(crate) fn start(client: kube::Client, node: &str) -> Self {
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: "holdfast".into(),
                instance: Some(format!("holdfast-{node}")),
            },
        );
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(publish(recorder, rx));
        Self {
            tx: Some(tx),
            capture: None,
        }
    }

    /// Queues an event on `pod`. Never blocks.
    pub(crate) fn emit(&self, pod: &PodKey, reason: Reason, note: String) {
        // A note may quote the pod (its Envoy's errors, its annotations): one line, cut to the
        // API's limit with the cut said, before it reaches the log or the API.
        use crate::api::text::{cut, escape_controls};
        let note = fit_note(escape_controls(&cut(&note, 1000)).into_owned());
        if reason.is_warning() {
            tracing::warn!(reason = reason.as_str(), "{note}");
        } else {
            tracing::info!(reason = reason.as_str(), "{note}");
        }
        if let Some(capture) = &self.capture {
            let _ = capture.send((pod.clone(), reason, note.clone()));
        }
        let Some(tx) = &self.tx else { return };
        let pending = Pending {
            pod: pod.clone(),
            reason,
            note,
        };
        if let Err(e) = tx.try_send(pending) {
            tracing::warn!(reason = reason.as_str(), error = %e, "event not posted: the event queue is full or closed");
        }
    }
}

/// The reference Events use for a pod.
pub(crate) fn pod_reference(pod: &PodKey) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.name.clone()),
        namespace: Some(pod.namespace.clone()),
        uid: Some(pod.uid.clone()),
        ..Default::default()
    }
}

/// Truncates a note to the API's 1 kB limit on a character boundary, saying how much was cut.
fn fit_note(note: String) -> String {
    const MAX: usize = 1000;
    // Room for the cut's own words (`… [N bytes cut]`).
    const SAID: usize = 32;
    if note.len() > MAX {
        crate::api::text::cut(&note, MAX - SAID).into_owned()
    } else {
        note
    }
}

async fn publish(recorder: Recorder, mut rx: mpsc::Receiver<Pending>) {
    let mut last: HashMap<(String, Reason), Instant> = HashMap::new();
    let mut last_error_log: Option<Instant> = None;
    while let Some(p) = rx.recv().await {
        let key = (p.pod.uid.clone(), p.reason);
        let now = Instant::now();
        if last
            .get(&key)
            .is_some_and(|t| now.duration_since(*t) < MIN_INTERVAL)
        {
            continue;
        }
        last.insert(key, now);
        last.retain(|_, t| now.duration_since(*t) < MIN_INTERVAL);
        let event = Event {
            type_: if p.reason.is_warning() {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: p.reason.as_str().into(),
            note: Some(fit_note(p.note)),
            action: p.reason.action().into(),
            secondary: None,
        };
        // Bounded: a slow API server delays events, never the agent's pods.
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            recorder.publish(&event, &pod_reference(&p.pod)),
        )
        .await;
        let error = match result {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out after 10 s".to_string(),
        };
        if last_error_log.is_none_or(|t| now.duration_since(t) > MIN_INTERVAL) {
            last_error_log = Some(now);
            tracing::warn!(pod = %p.pod, reason = p.reason.as_str(), %error, "posting an event failed (needs RBAC events.k8s.io create/patch); further failures are logged at most every 30 s");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::{Method, Request, Response};
    use kube::client::Body;

    fn key() -> PodKey {
        PodKey {
            uid: "5b0f6a4e-8c1d-4e2f-9a3b-7c6d5e4f3a2b".into(),
            namespace: "shop".into(),
            name: "web-1".into(),
        }
    }

    /// The recorder posts an events.k8s.io/v1 Event about the pod; a repeat within the interval
    /// is not posted.
    #[tokio::test]
    async fn posts_one_event_per_reason_and_interval() {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(svc, "default");
        let events = PodEvents::start(client, "node-a");
        events.emit(&key(), Reason::HoldDeadline, "hold deadline passed".into());
        events.emit(&key(), Reason::HoldDeadline, "again".into());
        events.emit(&key(), Reason::HoldReleased, "held 2 connections".into());

        let mut seen = Vec::new();
        for _ in 0..2 {
            let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
                .await
                .expect("an event request within 5 s")
                .expect("a request");
            assert_eq!(req.method(), Method::POST);
            assert_eq!(
                req.uri().path(),
                "/apis/events.k8s.io/v1/namespaces/shop/events"
            );
            let body = req.into_body().collect_bytes().await.expect("body");
            let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
            assert_eq!(v["regarding"]["kind"], "Pod");
            assert_eq!(v["regarding"]["uid"], key().uid.as_str());
            assert_eq!(v["reportingController"], "holdfast");
            seen.push((
                v["reason"].as_str().unwrap_or_default().to_string(),
                v["type"].as_str().unwrap_or_default().to_string(),
            ));
            let created = serde_json::to_vec(&v).expect("json");
            send.send_response(
                Response::builder()
                    .status(201)
                    .body(Body::from(created))
                    .expect("response"),
            );
        }
        assert_eq!(
            seen,
            [
                ("HoldDeadline".to_string(), "Warning".to_string()),
                ("HoldReleased".to_string(), "Normal".to_string())
            ]
        );
        // The repeated HoldDeadline was not posted.
        let extra = tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await;
        assert!(extra.is_err(), "a rate-limited event was posted");
    }

    /// docs/reference.md's Events table has a row per reason with its type and `action`.
    #[test]
    fn the_reference_names_each_reasons_type_and_action() {
        let doc = include_str!("../../../docs/reference.md");
        for r in Reason::ALL {
            let row = doc
                .lines()
                .find(|l| l.starts_with(&format!("| `{}` |", r.as_str())))
                .unwrap_or_else(|| panic!("docs/reference.md has no Events row for {r:?}"));
            let ty = if r.is_warning() { "Warning" } else { "Normal" };
            assert!(
                row.contains(&format!("| {ty} | `{}` |", r.action())),
                "{r:?}: the row should say `| {ty} | `{}` |`: {row}",
                r.action()
            );
        }
    }

    #[test]
    fn long_notes_are_cut_on_a_char_boundary() {
        let n = fit_note("é".repeat(800));
        assert!(n.len() <= 1000);
        let (kept, said) = n.split_once('…').expect("the cut is said");
        assert!(kept.chars().all(|c| c == 'é'));
        assert!(said.ends_with("bytes cut]"), "{said}");
    }
}
