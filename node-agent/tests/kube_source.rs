//! The in-cluster pod source against a mock API server (kube-rs's `tower_test` pattern): a
//! scenario task asserts every request the watcher sends (method, path, query) and answers with
//! the JSON an API server would send. Each step is bounded by a timeout, so a wrong or missing
//! request fails the test instead of hanging it.
//!
//! kube 5's default watcher (`InitialListStrategy::ListWatch`) sends
//! `GET /api/v1/pods?fieldSelector=..&limit=50` (paged list, small pages: issue 25; `resourceVersion=0` is left out
//! when a limit is set), then
//! `GET /api/v1/pods?watch=true&timeoutSeconds=290&fieldSelector=..&allowWatchBookmarks=true&resourceVersion=<rv>`.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use holdfast::source::kube::KubePods;
use holdfast::source::PodEvent;
use hyper::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
type Respond = tower_test::mock::SendResponse<Response<Body>>;

const NODE: &str = "node-a";
/// How long one step (a request from the watcher, an event from the source) may take. The
/// source's first retry pause is at most 0.5 s (`WATCH_RETRY`), so this leaves room for retries.
const STEP: Duration = Duration::from_secs(5);

/// A mock API server and the source running against it.
struct Harness {
    events: mpsc::Receiver<PodEvent>,
    source: JoinHandle<()>,
    scenario: JoinHandle<Result<()>>,
}

impl Harness {
    /// Starts the source on a client whose every request goes to `scenario`.
    fn start<F, Fut>(scenario: F) -> Self
    where
        F: FnOnce(Handle) -> Fut,
        Fut: std::future::Future<Output = Result<()>> + Send + 'static,
    {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "default");
        let (tx, events) = mpsc::channel(64);
        let source = tokio::spawn(KubePods::new(client, NODE).run(tx));
        let scenario = tokio::spawn(scenario(handle));
        Self {
            events,
            source,
            scenario,
        }
    }

    /// The next event, failing with the scenario's error if the scenario stopped first.
    async fn next(&mut self) -> Result<PodEvent> {
        self.next_within(STEP).await
    }

    /// [`next`](Self::next) with its own bound.
    async fn next_within(&mut self, step: Duration) -> Result<PodEvent> {
        tokio::select! {
            ev = self.events.recv() => ev.context("the source stopped sending events"),
            res = &mut self.scenario => match res {
                Ok(Ok(())) => bail!("the scenario ended while an event was still expected"),
                Ok(Err(e)) => Err(e.context("mock API server scenario failed")),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => bail!("scenario task failed: {e}"),
            },
            _ = tokio::time::sleep(step) => bail!("no pod event within {step:?}"),
        }
    }

    /// The next `n` events as `A:<uid>@<resourceVersion>` / `D:<uid>`.
    async fn next_n(&mut self, n: usize) -> Result<Vec<String>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(describe(&self.next().await?));
        }
        Ok(out)
    }

    /// Checks no further event arrives for a while (nothing spurious after the expected ones).
    async fn expect_quiet(&mut self, d: Duration) -> Result<()> {
        match tokio::time::timeout(d, self.events.recv()).await {
            Err(_elapsed) => Ok(()),
            Ok(Some(ev)) => bail!("unexpected event {}", describe(&ev)),
            Ok(None) => bail!("the source stopped"),
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.source.abort();
        self.scenario.abort();
    }
}

fn describe(ev: &PodEvent) -> String {
    match ev {
        PodEvent::Applied(p) => format!(
            "A:{}@{}",
            p.metadata.uid.as_deref().unwrap_or("?"),
            p.metadata.resource_version.as_deref().unwrap_or("?")
        ),
        PodEvent::Deleted { uid } => format!("D:{uid}"),
        PodEvent::Synced => "S".to_string(),
    }
}

fn pod(name: &str, uid: &str, rv: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": uid, "resourceVersion": rv},
        "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "app:1"}]},
    })
}

fn pod_list(rv: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": rv}, "items": items})
}

/// A watch body: one JSON event per line, as the API server streams them.
fn watch_lines(events: &[Value]) -> Vec<u8> {
    let mut body = Vec::new();
    for e in events {
        body.extend_from_slice(e.to_string().as_bytes());
        body.push(b'\n');
    }
    body
}

fn event(kind: &str, object: Value) -> Value {
    json!({"type": kind, "object": object})
}

fn gone_410(rv: &str) -> Value {
    event(
        "ERROR",
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {rv} (500)"),
            "reason": "Expired", "code": 410,
        }),
    )
}

fn respond(send: Respond, status: StatusCode, body: Vec<u8>) -> Result<()> {
    let resp = Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .context("building the mock response")?;
    send.send_response(resp);
    Ok(())
}

/// The query of a request URI as raw (still percent-encoded) pairs.
fn query(req: &Request<Body>) -> HashMap<String, String> {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (p.to_owned(), String::new()),
        })
        .collect()
}

/// Waits for the watcher's next request, bounded by [`STEP`], and checks what every request of
/// this source must carry: a GET on all pods with this node's field selector.
async fn next_request(handle: &mut Handle, what: &str) -> Result<(Request<Body>, Respond)> {
    next_request_within(handle, what, STEP).await
}

/// [`next_request`] with its own bound, for waits longer than one retry.
async fn next_request_within(
    handle: &mut Handle,
    what: &str,
    step: Duration,
) -> Result<(Request<Body>, Respond)> {
    let (req, send) = tokio::time::timeout(step, handle.next_request())
        .await
        .with_context(|| format!("no {what} request within {step:?}"))?
        .with_context(|| format!("client gone before the {what} request"))?;
    let uri = req.uri().to_string();
    if req.method() != Method::GET || req.uri().path() != "/api/v1/pods" {
        bail!(
            "{what}: expected GET /api/v1/pods, got {} {uri}",
            req.method()
        );
    }
    let q = query(&req);
    // Never a cluster-wide list or watch: the node's field selector is on every request.
    if q.get("fieldSelector").map(String::as_str) != Some("spec.nodeName%3Dnode-a") {
        bail!("{what}: request without fieldSelector=spec.nodeName%3Dnode-a: {uri}");
    }
    Ok((req, send))
}

/// Expects the initial (or re-)list: no watch, paged, no resourceVersion (any version is fine).
async fn expect_list(handle: &mut Handle, what: &str) -> Result<Respond> {
    let (req, send) = next_request(handle, what).await?;
    let q = query(&req);
    let uri = req.uri().to_string();
    if q.contains_key("watch") {
        bail!("{what}: expected a list, got a watch: {uri}");
    }
    let limit = holdfast::source::kube::LIST_PAGE_SIZE.to_string();
    if q.get("limit") != Some(&limit) {
        bail!("{what}: expected a paged list (limit={limit}): {uri}");
    }
    if q.contains_key("continue") {
        bail!("{what}: unexpected continue token: {uri}");
    }
    Ok(send)
}

/// Expects a watch from `rv`.
async fn expect_watch(handle: &mut Handle, rv: &str, what: &str) -> Result<Respond> {
    let (req, send) = next_request(handle, what).await?;
    let q = query(&req);
    let uri = req.uri().to_string();
    let want = [
        ("watch", "true"),
        ("resourceVersion", rv),
        ("allowWatchBookmarks", "true"),
    ];
    for (k, v) in want {
        if q.get(k).map(String::as_str) != Some(v) {
            bail!("{what}: expected {k}={v}: {uri}");
        }
    }
    // Plain list+watch, not a streaming list.
    if q.contains_key("sendInitialEvents") {
        bail!("{what}: unexpected sendInitialEvents: {uri}");
    }
    Ok(send)
}

/// Keeps the last watch open (the API server would, until its timeout) so the watcher does not
/// loop; the harness aborts this task at the end of the test.
async fn hold_open(send: Respond) -> Result<()> {
    std::future::pending::<()>().await;
    drop(send);
    Ok(())
}

#[tokio::test]
async fn list_then_watch_modified_added_deleted_then_410_relist() -> Result<()> {
    let mut h = Harness::start(|mut api| async move {
        let send = expect_list(&mut api, "initial list").await?;
        let list = pod_list(
            "100",
            vec![pod("a", "uid-a", "90"), pod("b", "uid-b", "95")],
        );
        respond(send, StatusCode::OK, list.to_string().into_bytes())?;

        let send = expect_watch(&mut api, "100", "first watch").await?;
        let body = watch_lines(&[
            event("MODIFIED", pod("a", "uid-a", "101")),
            event("ADDED", pod("c", "uid-c", "102")),
            event("DELETED", pod("b", "uid-b", "103")),
            gone_410("103"),
        ]);
        respond(send, StatusCode::OK, body)?;

        // After 410 Gone the watcher starts over with a list. c was deleted while the watch was
        // down, so the new list lacks it.
        let send = expect_list(&mut api, "re-list after 410").await?;
        let list = pod_list("200", vec![pod("a", "uid-a", "150")]);
        respond(send, StatusCode::OK, list.to_string().into_bytes())?;

        let send = expect_watch(&mut api, "200", "watch after re-list").await?;
        hold_open(send).await
    });

    assert_eq!(
        h.next_n(3).await?,
        ["A:uid-a@90", "A:uid-b@95", "S"],
        "initial list, then Synced (once: the re-list below sends none)"
    );
    assert_eq!(
        h.next_n(3).await?,
        ["A:uid-a@101", "A:uid-c@102", "D:uid-b"],
        "watch events"
    );
    assert_eq!(
        h.next_n(2).await?,
        ["A:uid-a@150", "D:uid-c"],
        "re-list: listed pods applied, the pod missing from it deleted"
    );
    h.expect_quiet(Duration::from_millis(300)).await?;
    Ok(())
}

#[tokio::test]
async fn list_errors_are_retried_and_never_delete_pods() -> Result<()> {
    let mut h = Harness::start(|mut api| async move {
        let send = expect_list(&mut api, "initial list").await?;
        let list = pod_list("100", vec![pod("a", "uid-a", "90")]);
        respond(send, StatusCode::OK, list.to_string().into_bytes())?;

        // The watch connection drops without an event: the watcher re-watches from 100.
        let send = expect_watch(&mut api, "100", "first watch").await?;
        respond(send, StatusCode::OK, Vec::new())?;

        // The API server now fails: the re-watch gets a 500, the next one a 410 (too old) as
        // its body's first event; each is retried after a pause (at most 0.5 s, then 1 s:
        // `WATCH_RETRY`), the 410 with a re-list.
        let send = expect_watch(&mut api, "100", "re-watch").await?;
        let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": "etcdserver: leader changed", "reason": "InternalError", "code": 500});
        respond(
            send,
            StatusCode::INTERNAL_SERVER_ERROR,
            status.to_string().into_bytes(),
        )?;
        let send = expect_watch(&mut api, "100", "re-watch after 500").await?;
        respond(send, StatusCode::OK, watch_lines(&[gone_410("100")]))?;
        // Recovered: a is still there and b is new.
        let send = expect_list(&mut api, "re-list after 410").await?;
        let list = pod_list(
            "300",
            vec![pod("a", "uid-a", "250"), pod("b", "uid-b", "260")],
        );
        respond(send, StatusCode::OK, list.to_string().into_bytes())?;
        let send = expect_watch(&mut api, "300", "watch after recovery").await?;
        hold_open(send).await
    });

    assert_eq!(
        h.next_n(2).await?,
        ["A:uid-a@90", "S"],
        "initial list, then Synced"
    );
    // Errors produce no events (no Deleted while the API server is failing); the first event
    // after them is the recovered list, two pauses later (at most 0.5 s + 1 s).
    let first = describe(&h.next_within(Duration::from_secs(15)).await?);
    assert_eq!(first, "A:uid-a@250", "recovered list");
    assert_eq!(h.next_n(1).await?, ["A:uid-b@260"], "recovered list");
    h.expect_quiet(Duration::from_millis(300)).await?;
    Ok(())
}

/// An API server that stays down: the retries must back off (`WATCH_RETRY`: 0.5 s doubling to a
/// 5 s cap, each pause jittered into its upper half), not hammer it every second, and not grow
/// past the cap (a real API server restart left kube-rs's 30 s-capped schedule 26-70 s behind:
/// docs/real-cluster.md). kube-rs's `default_backoff()` would reset on the `Ok(Init)` the
/// watcher yields before every list attempt and never grow. Paused time: the delays are measured
/// on tokio's clock without being waited for.
#[tokio::test(start_paused = true)]
async fn retries_back_off_while_the_api_server_is_down() -> Result<()> {
    // Longer than the longest pause (the 5 s cap), on the paused clock.
    const LONG: Duration = Duration::from_secs(60);
    let schedule = holdfast::source::kube::WATCH_RETRY;
    let mut h = Harness::start(|mut api| async move {
        let unavailable = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": "unavailable", "reason": "ServiceUnavailable", "code": 503});
        let mut at = Vec::new();
        for attempt in 0..7 {
            let what = format!("list attempt {attempt}");
            let (req, send) = next_request_within(&mut api, &what, LONG).await?;
            if req.uri().query().is_some_and(|q| q.contains("watch=")) {
                bail!("{what}: expected a list, got {}", req.uri());
            }
            at.push(tokio::time::Instant::now());
            respond(
                send,
                StatusCode::SERVICE_UNAVAILABLE,
                unavailable.to_string().into_bytes(),
            )?;
        }
        let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
        // 0.5, 1, 2, 4, 5, 5 s nominal; each jittered into [pause/2, pause]; a few ms for the
        // mock's own steps.
        for (i, gap) in gaps.iter().enumerate() {
            let nominal = schedule.after(i as u32);
            let (floor, ceiling) = (nominal / 2, nominal + Duration::from_millis(50));
            if *gap < floor || *gap > ceiling {
                bail!(
                    "retry {} came after {gap:?}, expected {floor:?}..{ceiling:?} (all gaps: {gaps:?})",
                    i + 1
                );
            }
        }
        if gaps
            .last()
            .is_some_and(|g| *g < Duration::from_millis(2_500))
        {
            bail!("the pauses did not grow to the cap: {gaps:?}");
        }
        let (_req, send) = next_request_within(&mut api, "list after the outage", LONG).await?;
        let list = pod_list("100", vec![pod("a", "uid-a", "90")]);
        respond(send, StatusCode::OK, list.to_string().into_bytes())?;
        let send = expect_watch(&mut api, "100", "watch after the outage").await?;
        hold_open(send).await
    });

    let ev = describe(&h.next_within(LONG).await?);
    assert_eq!(
        ev, "A:uid-a@90",
        "the first event is the list after the outage"
    );
    assert_eq!(
        h.next_n(1).await?,
        ["S"],
        "Synced after the first complete list"
    );
    h.expect_quiet(Duration::from_millis(300)).await?;
    Ok(())
}
