//! Removing the agent's startup taint against a mock API server (kube-rs's `tower_test`
//! pattern, as in kube_source.rs): each step asserts the method, path, content type and the
//! exact JSON patch, bounded by a timeout, so a wrong or missing request fails the test.

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use holdfast::effects::node_taint::{
    remove_startup_taint, remove_startup_taint_retrying, Error, Removal, TaintMetrics, ATTEMPTS,
    FIRST_RETRY_PAUSE, MAX_RETRY_PAUSE, OVERDUE_AFTER, STARTUP_TAINT_KEY,
};
use http_body_util::BodyExt;
use hyper::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{json, Value};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
type Respond = tower_test::mock::SendResponse<Response<Body>>;

const NODE: &str = "node-a";
const STEP: Duration = Duration::from_secs(5);

fn ours() -> Value {
    json!({"key": STARTUP_TAINT_KEY, "effect": "NoSchedule"})
}

/// Taints a real node carries next to ours: the node lifecycle controller's (with timeAdded)
/// and a node pool's own.
fn others() -> Vec<Value> {
    vec![
        json!({"key": "node.kubernetes.io/not-ready", "effect": "NoExecute", "timeAdded": "2026-11-23T10:00:00Z"}),
        json!({"key": "dedicated", "value": "mesh", "effect": "NoSchedule"}),
    ]
}

fn node(taints: Option<Vec<Value>>) -> Value {
    let mut spec = json!({"podCIDR": "10.244.1.0/24"});
    if let Some(t) = taints {
        spec["taints"] = Value::Array(t);
    }
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": NODE, "resourceVersion": "4711"}, "spec": spec})
}

fn respond(send: Respond, status: StatusCode, body: Value) -> Result<()> {
    let resp = Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string().into_bytes()))
        .context("building the mock response")?;
    send.send_response(resp);
    Ok(())
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": format!("mock {reason}"), "reason": reason, "code": code})
}

async fn next(handle: &mut Handle, what: &str) -> Result<(Request<Body>, Respond)> {
    tokio::time::timeout(STEP, handle.next_request())
        .await
        .with_context(|| format!("no {what} request within {STEP:?}"))?
        .with_context(|| format!("client gone before the {what} request"))
}

async fn expect_get(handle: &mut Handle) -> Result<Respond> {
    let (req, send) = next(handle, "GET node").await?;
    ensure!(
        req.method() == Method::GET && req.uri().path() == format!("/api/v1/nodes/{NODE}"),
        "expected GET /api/v1/nodes/{NODE}, got {} {}",
        req.method(),
        req.uri()
    );
    Ok(send)
}

/// The next request must be the JSON patch; returns its operations.
async fn expect_patch(handle: &mut Handle) -> Result<(Value, Respond)> {
    let (req, send) = next(handle, "PATCH node").await?;
    ensure!(
        req.method() == Method::PATCH && req.uri().path() == format!("/api/v1/nodes/{NODE}"),
        "expected PATCH /api/v1/nodes/{NODE}, got {} {}",
        req.method(),
        req.uri()
    );
    let ct = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    ensure!(ct == "application/json-patch+json", "content type {ct}");
    let body = req.into_body().collect().await?.to_bytes();
    Ok((serde_json::from_slice(&body)?, send))
}

fn expected_ops(read: &[Value]) -> Value {
    let kept: Vec<&Value> = read
        .iter()
        .filter(|t| t["key"] != STARTUP_TAINT_KEY)
        .collect();
    json!([
        {"op": "test", "path": "/spec/taints", "value": read},
        {"op": "replace", "path": "/spec/taints", "value": kept},
    ])
}

/// Runs the removal against `scenario`; returns the call's result after the scenario passed.
async fn run<F, Fut>(scenario: F) -> Result<Result<bool, Error>>
where
    F: FnOnce(Handle) -> Fut,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let scenario = tokio::spawn(scenario(handle));
    let result = tokio::time::timeout(STEP * 3, remove_startup_taint(client, NODE))
        .await
        .context("remove_startup_taint hung")?;
    match scenario.await {
        Ok(r) => r.context("mock API server scenario failed")?,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => bail!("scenario task failed: {e}"),
    }
    Ok(result)
}

#[tokio::test]
async fn removes_only_the_startup_taint() -> Result<()> {
    let result = run(|mut h| async move {
        let mut read = vec![ours()];
        read.extend(others());
        respond(
            expect_get(&mut h).await?,
            StatusCode::OK,
            node(Some(read.clone())),
        )?;
        let (ops, send) = expect_patch(&mut h).await?;
        ensure!(ops == expected_ops(&read), "patch {ops}");
        respond(send, StatusCode::OK, node(Some(others())))
    })
    .await?;
    assert!(result.expect("removed"));
    Ok(())
}

#[tokio::test]
async fn a_node_without_the_taint_is_not_written() -> Result<()> {
    for taints in [None, Some(vec![]), Some(others())] {
        let result = run(move |mut h| async move {
            respond(expect_get(&mut h).await?, StatusCode::OK, node(taints))?;
            // No PATCH may follow: the call returns, the client is dropped.
            match tokio::time::timeout(Duration::from_millis(200), h.next_request()).await {
                Ok(Some((req, _))) => bail!("unexpected {} {}", req.method(), req.uri()),
                _ => Ok(()),
            }
        })
        .await?;
        assert!(!result.expect("no error"));
    }
    Ok(())
}

/// Another controller adds a taint between our read and our patch: the `test` op fails (422),
/// the agent reads again and keeps the new taint.
#[tokio::test]
async fn a_concurrent_taint_change_is_kept() -> Result<()> {
    let result = run(|mut h| async move {
        let first = vec![ours(), others()[0].clone()];
        respond(
            expect_get(&mut h).await?,
            StatusCode::OK,
            node(Some(first.clone())),
        )?;
        let (ops, send) = expect_patch(&mut h).await?;
        ensure!(ops == expected_ops(&first), "first patch {ops}");
        respond(
            send,
            StatusCode::UNPROCESSABLE_ENTITY,
            status(422, "Invalid"),
        )?;

        let mut second = first.clone();
        second.push(others()[1].clone());
        respond(
            expect_get(&mut h).await?,
            StatusCode::OK,
            node(Some(second.clone())),
        )?;
        let (ops, send) = expect_patch(&mut h).await?;
        ensure!(ops == expected_ops(&second), "second patch {ops}");
        ensure!(
            ops[1]["value"].as_array().map(Vec::len) == Some(2),
            "both other taints kept: {ops}"
        );
        respond(send, StatusCode::OK, node(Some(others())))
    })
    .await?;
    assert!(result.expect("removed on the second attempt"));
    Ok(())
}

#[tokio::test]
async fn forbidden_says_which_rbac_is_missing() -> Result<()> {
    let result = run(|mut h| async move {
        respond(
            expect_get(&mut h).await?,
            StatusCode::FORBIDDEN,
            status(403, "Forbidden"),
        )
    })
    .await?;
    let err = result.expect_err("403");
    assert!(matches!(err, Error::Get { .. }), "{err:?}");
    assert!(err.to_string().contains("get on nodes"), "{err}");

    let result = run(|mut h| async move {
        respond(
            expect_get(&mut h).await?,
            StatusCode::OK,
            node(Some(vec![ours()])),
        )?;
        let (_, send) = expect_patch(&mut h).await?;
        respond(send, StatusCode::FORBIDDEN, status(403, "Forbidden"))
    })
    .await?;
    let err = result.expect_err("403 on patch");
    assert!(err.to_string().contains("patch on nodes"), "{err}");
    Ok(())
}

/// The taints keep changing: the agent gives up after a bounded number of attempts — exactly
/// [`ATTEMPTS`] reads, each followed by its patch, and nothing after.
#[tokio::test]
async fn endless_contention_is_bounded() -> Result<()> {
    let counts = std::sync::Arc::new(std::sync::Mutex::new((0usize, 0usize)));
    let seen = counts.clone();
    let result = run(|mut h| async move {
        loop {
            let send = match tokio::time::timeout(STEP, h.next_request()).await {
                Ok(Some((req, send))) if req.method() == Method::GET => {
                    seen.lock().expect("counts").0 += 1;
                    send
                }
                Ok(Some((req, send))) if req.method() == Method::PATCH => {
                    seen.lock().expect("counts").1 += 1;
                    respond(
                        send,
                        StatusCode::UNPROCESSABLE_ENTITY,
                        status(422, "Invalid"),
                    )?;
                    continue;
                }
                Ok(Some((req, _))) => bail!("unexpected {} {}", req.method(), req.uri()),
                Ok(None) => return Ok(()),
                Err(_) => bail!("the agent neither retried nor gave up"),
            };
            respond(send, StatusCode::OK, node(Some(vec![ours()])))?;
        }
    })
    .await?;
    let (gets, patches) = *counts.lock().expect("counts");
    assert_eq!(
        (gets, patches),
        (ATTEMPTS, ATTEMPTS),
        "one read and one patch per attempt, {ATTEMPTS} attempts"
    );
    let err = result.expect_err("gives up");
    assert!(matches!(err, Error::Contended { .. }), "{err:?}");
    Ok(())
}

/// The outer loop (the agent's, around each bounded removal), on paused time, against an API
/// stand-in that refuses every try (403, as while RBAC or the admission policy is still being
/// applied) for 10 minutes — longer than the ~4 min (8 tries) after which the agent used to give
/// up and leave the node closed — and then lets the patch through: the loop keeps trying, paused
/// 1, 2, 4, … s then every 60 s, with the pending metric 1 and each refusal counted, and opens the
/// node on the first try after the refusal ends. A node without the taint stops the loop too.
#[tokio::test(start_paused = true)]
async fn a_tainted_node_opens_after_a_refusal_longer_than_four_minutes() -> Result<()> {
    const REFUSED_FOR: Duration = Duration::from_secs(10 * 60);
    for tainted in [true, false] {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "default");
        let metrics = TaintMetrics::default();
        let started = tokio::time::Instant::now();
        let watched = metrics.clone();
        let server = tokio::spawn(async move {
            let mut gets = Vec::new();
            let mut patched = None;
            loop {
                let Some((req, send)) = handle.next_request().await else {
                    return Ok::<_, anyhow::Error>((gets, patched));
                };
                let now = started.elapsed();
                match req.method() {
                    &Method::GET if now < REFUSED_FOR => {
                        gets.push(now);
                        assert_eq!(watched.pending.get(), 1, "pending while refused");
                        respond(send, StatusCode::FORBIDDEN, status(403, "Forbidden"))?
                    }
                    &Method::GET => {
                        gets.push(now);
                        let mut taints = others();
                        if tainted {
                            taints.push(ours());
                        }
                        respond(send, StatusCode::OK, node(Some(taints)))?
                    }
                    &Method::PATCH => {
                        patched = Some(now);
                        respond(send, StatusCode::OK, node(Some(others())))?
                    }
                    m => bail!("unexpected {m}"),
                }
            }
        });
        let removal = remove_startup_taint_retrying(client, NODE, &metrics).await;
        let (gets, patched) = server.await??;
        let tries = gets.len() as u32;
        let refused = gets.iter().filter(|t| **t < REFUSED_FOR).count() as u64;
        if tainted {
            assert_eq!(removal, Removal::Removed { tries });
            let patched = patched.context("the taint was never patched away")?;
            assert!(patched >= REFUSED_FOR, "patched at {patched:?}");
            assert!(
                patched < REFUSED_FOR + MAX_RETRY_PAUSE + STEP,
                "the node opens within one pause of the refusal's end: {patched:?}"
            );
        } else {
            assert_eq!(removal, Removal::NotThere);
            assert!(patched.is_none(), "a node without the taint is not written");
        }
        assert!(
            REFUSED_FOR > OVERDUE_AFTER && tries > 8,
            "kept trying past the old budget: {tries} tries"
        );
        assert_eq!(
            metrics.pending.get(),
            0,
            "not pending once the node is free"
        );
        assert_eq!(metrics.failures.get(), refused, "every refusal counted");
        let pauses: Vec<Duration> = gets.windows(2).map(|w| w[1] - w[0]).collect();
        let mut want = FIRST_RETRY_PAUSE;
        for (i, p) in pauses.iter().enumerate() {
            assert_eq!(*p, want, "pause {i} of {pauses:?}");
            want = (want * 2).min(MAX_RETRY_PAUSE);
        }
    }
    Ok(())
}
