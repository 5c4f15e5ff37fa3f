//! `holdfast status --node NODE`: read a node's status through the API server, as
//! `kubectl port-forward` does, so no port needs opening: find the node's agent pod, open the
//! `pods/portforward` subresource to its status port, and `GET /status` over that stream with the
//! agent's one HTTP/1.1 client (`crate::effects::http1_client`).
//!
//! Why port-forward and not the API server's pod proxy (`pods/<name>:15300/proxy`): the agent's
//! `/status` answers loopback clients only ([`crate::report::server`]). The pod proxy connects from
//! the API server to the pod IP without the user's credentials, so anyone who reaches the pod IP
//! could do the same; a port-forward is authorized by the API server's RBAC (`create
//! pods/portforward`) and the kubelet connects to the port inside the pod's network namespace,
//! i.e. from loopback.
//!
//! The stream is kube's WebSocket port-forward (kube-client 5 `Api::portforward`,
//! `src/api/portforward.rs`: a data channel and an error channel per port, each opened with a
//! frame carrying the port); the kubelet's side is `pkg/kubelet/cri/streaming/portforward/
//! websocket.go` (WebSocket port-forward is on by default from Kubernetes 1.31, feature gate
//! `PortForwardWebsockets`).
//!
//! The user needs RBAC to list pods and to get and create `pods/portforward` in the agent's
//! namespace: manifests/agent/status-reader-role.yaml, checked against this file by
//! tests/tests/manifests.rs.

use std::future::Future;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::Api;

use crate::effects::http1_client::{Connection, Failure};

/// Namespace the manifests install the agent into.
pub const AGENT_NAMESPACE: &str = "holdfast-system";
/// Labels of the agent's pods (manifests/agent/daemonset.yaml).
pub(crate) const AGENT_SELECTOR: &str =
    "app.kubernetes.io/name=holdfast,app.kubernetes.io/component=agent";
/// The agent's status port in the manifests (`--status-listen 127.0.0.1:15300`: loopback only,
/// reached through a port-forward).
pub const STATUS_PORT: u16 = 15300;

/// Why a node's status could not be read through the API server.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("cannot configure a Kubernetes client from your kubeconfig: {0}; check KUBECONFIG / ~/.kube/config, or run `holdfast status` on the node with --agent")]
    Config(String),
    #[error("no holdfast agent pod on node {node:?} in namespace {namespace} (label {AGENT_SELECTOR}): is the node name right (`kubectl get nodes`), and is holdfast installed (`kubectl apply -k manifests/`)?")]
    NoAgent { node: String, namespace: String },
    #[error("the agent pod {namespace}/{pod} is gone (404 from the API server): it is probably being replaced; try again")]
    PodGone { pod: String, namespace: String },
    #[error("the API server refused to let you {what} (403 Forbidden): ask for RBAC to list pods, and get and create pods/portforward, in namespace {namespace} (Role holdfast-status-reader in manifests/)")]
    Forbidden { what: String, namespace: String },
    #[error("{what} failed: {why}")]
    Api { what: String, why: String },
    #[error("the agent pod {pod} answered {status} to GET /status: {body}")]
    AgentStatus {
        pod: String,
        status: String,
        body: String,
    },
    #[error("the answer of the agent pod {pod} is not HTTP the agent serves ({why}); is this holdfast the agent's version?")]
    BadAnswer { pod: String, why: String },
}

fn classify(e: kube::Error, what: &str, namespace: &str, pod: Option<&str>) -> RemoteError {
    match (&e, pod) {
        (kube::Error::Api(status), _) if status.code == 403 => RemoteError::Forbidden {
            what: what.to_string(),
            namespace: namespace.to_string(),
        },
        (kube::Error::Api(status), Some(pod)) if status.code == 404 => RemoteError::PodGone {
            pod: pod.to_string(),
            namespace: namespace.to_string(),
        },
        _ => RemoteError::Api {
            what: what.to_string(),
            why: e.to_string(),
        },
    }
}

/// A client from the user's kubeconfig (or in-cluster config).
pub async fn client() -> Result<kube::Client, RemoteError> {
    kube::Client::try_default()
        .await
        .map_err(|e| RemoteError::Config(e.to_string()))
}

/// The name of `node`'s agent pod, preferring a running one (a rolling update may briefly show
/// two).
async fn agent_pod(pods: &Api<Pod>, node: &str, namespace: &str) -> Result<String, RemoteError> {
    let params = ListParams::default()
        .labels(AGENT_SELECTOR)
        .fields(&format!("spec.nodeName={node}"));
    let list = pods
        .list(&params)
        .await
        .map_err(|e| classify(e, "list pods", namespace, None))?;
    list.items
        .iter()
        .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .or_else(|| list.items.first())
        .and_then(|p| p.metadata.name.clone())
        .ok_or_else(|| RemoteError::NoAgent {
            node: node.to_string(),
            namespace: namespace.to_string(),
        })
}

/// Ends the port-forward's background task (and so its WebSocket) when dropped: also when the
/// caller's timeout drops the fetch midway, so `--watch` does not pile up connections.
struct ForwardGuard(kube::api::Portforwarder);

impl Drop for ForwardGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The `/status` body of `node`'s agent (status 200, at most `max_body` bytes), over a
/// port-forward to its status port. Bound it with a timeout: this waits on the network.
pub async fn fetch_status_body(
    client: kube::Client,
    node: &str,
    namespace: &str,
    max_body: usize,
) -> Result<String, RemoteError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = agent_pod(&pods, node, namespace).await?;
    fetch_pod_status_body(client, &pod, namespace, max_body).await
}

/// The `/status` body of the agent pod `namespace/pod` (status 200, at most `max_body` bytes),
/// over a port-forward to its status port: [`fetch_status_body`] once the pod is known (the
/// cluster-wide reads list the agents once, then call this per agent). Bound it with a timeout.
pub(crate) async fn fetch_pod_status_body(
    client: kube::Client,
    pod: &str,
    namespace: &str,
    max_body: usize,
) -> Result<String, RemoteError> {
    let pods: Api<Pod> = Api::namespaced(client, namespace);
    let pod = pod.to_string();
    let forward = pods
        .portforward(&pod, &[STATUS_PORT])
        .await
        // The WebSocket upgrade is a GET: authorized as `get`, and from Kubernetes 1.35 also as
        // `create` (AuthorizePodWebsocketUpgradeCreatePermission, kubernetes/kubernetes#134577).
        .map_err(|e| classify(e, "get and create pods/portforward", namespace, Some(&pod)))?;
    let mut forward = ForwardGuard(forward);
    let forward_failed = |why: String| RemoteError::Api {
        what: format!("port-forward to {namespace}/{pod}:{STATUS_PORT}"),
        why,
    };
    let (Some(stream), Some(forward_error)) = (
        forward.0.take_stream(STATUS_PORT),
        forward.0.take_error(STATUS_PORT),
    ) else {
        return Err(forward_failed("kube gave no stream for the port".into()));
    };
    let answer = with_forward_error(forward_error, get_status(stream, max_body))
        .await
        .map_err(|e| match e {
            ExchangeError::Forward(why) => forward_failed(why),
            ExchangeError::Http(Failure::Malformed(why) | Failure::TooLarge(why)) => {
                RemoteError::BadAnswer {
                    pod: pod.clone(),
                    why,
                }
            }
            ExchangeError::Http(f) => forward_failed(format!("GET /status: {f}")),
        })?;
    let body = String::from_utf8_lossy(&answer.body).into_owned();
    if answer.status != hyper::StatusCode::OK {
        return Err(RemoteError::AgentStatus {
            pod,
            status: super::table::http_status(answer.status),
            body: super::table::truncate(body.trim(), 200),
        });
    }
    Ok(body)
}

enum ExchangeError {
    /// The kubelet reported on the port's error channel (e.g. nothing listens on the port).
    Forward(String),
    Http(Failure),
}

/// Runs `exchange`, unless the port's error channel speaks first. The kubelet writes the error
/// before closing the data channel, and kube forwards both in order, so when both are ready the
/// error (checked first) is the better explanation of a closed stream.
async fn with_forward_error<T>(
    forward_error: impl Future<Output = Option<String>>,
    exchange: impl Future<Output = Result<T, Failure>>,
) -> Result<T, ExchangeError> {
    tokio::select! {
        biased;
        // `None` is the error channel closing without a message: not an error by itself.
        Some(why) = forward_error => Err(ExchangeError::Forward(why)),
        result = exchange => result.map_err(ExchangeError::Http),
    }
}

async fn get_status(
    stream: tokio::io::DuplexStream,
    max_body: usize,
) -> Result<crate::effects::http1_client::Answer, Failure> {
    let mut connection = Connection::handshake(stream).await?;
    let user_agent = format!("holdfast-status/{}", env!("CARGO_PKG_VERSION"));
    connection
        .exchange(
            hyper::Method::GET,
            "/status",
            // The kubelet connects to the port on the pod's loopback.
            &format!("127.0.0.1:{STATUS_PORT}"),
            &[("accept", "application/json"), ("user-agent", &user_agent)],
            max_body,
        )
        .await
}

#[cfg(test)]
mod tests {
    //! The API server calls, against kube's mock service. A mock cannot complete the WebSocket
    //! upgrade (hyper makes the upgrade handle only for a real connection), so the round trip
    //! through a port-forward is in `tests/status_portforward.rs`, with a loopback API server.
    use super::*;
    use hyper::{Request, Response};
    use kube::client::Body;
    use std::time::Duration;

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    async fn next(
        handle: &mut Handle,
    ) -> (
        Request<Body>,
        tower_test::mock::SendResponse<Response<Body>>,
    ) {
        tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("a request within 5 s")
            .expect("a request")
    }

    fn json(status: u16, v: serde_json::Value) -> Response<Body> {
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&v).expect("json")))
            .expect("response")
    }

    fn pod_list(names: &[&str]) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"},
            "items": names.iter().map(|n| serde_json::json!({
                "metadata": {"name": n, "namespace": AGENT_NAMESPACE},
                "status": {"phase": "Running"}
            })).collect::<Vec<_>>()
        })
    }

    /// A `metav1.Status` failure as the API server writes it.
    fn failure(code: u16, reason: &str, message: &str) -> Response<Body> {
        json(
            code,
            serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": message, "reason": reason, "code": code
            }),
        )
    }

    fn start(node: &'static str) -> (Handle, tokio::task::JoinHandle<Result<String, RemoteError>>) {
        let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(svc, "default");
        let task =
            tokio::spawn(
                async move { fetch_status_body(client, node, AGENT_NAMESPACE, 1 << 20).await },
            );
        (handle, task)
    }

    /// The list call with both selectors, then the port-forward upgrade: method, path, port.
    /// Answered 403 here, which must name the permission to ask for.
    #[tokio::test]
    async fn lists_the_nodes_agent_then_asks_for_a_portforward_to_its_status_port() {
        let (mut handle, task) = start("worker-1");

        let (req, send) = next(&mut handle).await;
        assert_eq!(req.method(), hyper::Method::GET);
        assert_eq!(req.uri().path(), "/api/v1/namespaces/holdfast-system/pods");
        let q = req.uri().query().unwrap_or_default().to_string();
        assert!(q.contains("fieldSelector=spec.nodeName%3Dworker-1"), "{q}");
        assert!(
            q.contains(
                "labelSelector=app.kubernetes.io%2Fname%3Dholdfast%2Capp.kubernetes.io%2Fcomponent%3Dagent"
            ),
            "{q}"
        );
        send.send_response(json(200, pod_list(&["holdfast-abcde"])));

        let (req, send) = next(&mut handle).await;
        // kubectl POSTs for SPDY; the WebSocket handshake is a GET (RFC 6455 4.1), which the
        // API server authorizes as `get` on pods/portforward, plus `create` from 1.35.
        assert_eq!(req.method(), hyper::Method::GET);
        assert_eq!(
            req.uri().path(),
            "/api/v1/namespaces/holdfast-system/pods/holdfast-abcde/portforward"
        );
        let q = req.uri().query().unwrap_or_default();
        let ports: Vec<&str> = q.split('&').filter(|kv| kv.starts_with("ports=")).collect();
        assert_eq!(ports, ["ports=15300"], "{q}");
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        assert_eq!(header("upgrade"), "websocket");
        assert!(
            header("sec-websocket-protocol").contains("v4.channel.k8s.io"),
            "{}",
            header("sec-websocket-protocol")
        );
        send.send_response(failure(
            403,
            "Forbidden",
            "pods \"holdfast-abcde\" is forbidden: User \"dev\" cannot create resource \"pods/portforward\" in API group \"\" in the namespace \"holdfast-system\"",
        ));

        let e = task.await.expect("task").expect_err("forbidden");
        assert!(matches!(e, RemoteError::Forbidden { .. }), "{e}");
        let text = e.to_string();
        assert!(text.contains("get and create pods/portforward"), "{text}");
        assert!(text.contains("holdfast-system"), "{text}");
        assert!(!text.contains("pods/proxy"), "{text}");
    }

    #[tokio::test]
    async fn no_agent_on_the_node_says_so() {
        let (mut handle, task) = start("worker-9");
        let (_, send) = next(&mut handle).await;
        send.send_response(json(200, pod_list(&[])));
        let e = task.await.expect("task").expect_err("no agent");
        assert!(matches!(e, RemoteError::NoAgent { .. }), "{e}");
        assert!(e.to_string().contains("worker-9"), "{e}");
    }

    #[tokio::test]
    async fn rbac_denied_on_the_list_names_the_permissions() {
        let (mut handle, task) = start("worker-1");
        let (_, send) = next(&mut handle).await;
        send.send_response(failure(
            403,
            "Forbidden",
            "pods is forbidden: User \"dev\" cannot list resource \"pods\"",
        ));
        let e = task.await.expect("task").expect_err("forbidden");
        assert!(matches!(e, RemoteError::Forbidden { .. }), "{e}");
        let text = e.to_string();
        assert!(text.contains("list pods"), "{text}");
        assert!(text.contains("pods/portforward"), "{text}");
    }

    /// The pod listed, then deleted before the port-forward (a rolling update).
    #[tokio::test]
    async fn agent_pod_gone_before_the_portforward_says_so() {
        let (mut handle, task) = start("worker-1");
        let (_, send) = next(&mut handle).await;
        send.send_response(json(200, pod_list(&["holdfast-abcde"])));
        let (_, send) = next(&mut handle).await;
        send.send_response(failure(
            404,
            "NotFound",
            "pods \"holdfast-abcde\" not found",
        ));
        let e = task.await.expect("task").expect_err("gone");
        assert!(matches!(e, RemoteError::PodGone { .. }), "{e}");
        assert!(
            e.to_string().contains("holdfast-system/holdfast-abcde"),
            "{e}"
        );
    }

    /// An upgrade answered 200 (e.g. a proxy in front of the API server that does not pass
    /// WebSockets) is an error, not a hang or an empty status.
    #[tokio::test]
    async fn portforward_not_upgraded_is_an_error() {
        let (mut handle, task) = start("worker-1");
        let (_, send) = next(&mut handle).await;
        send.send_response(json(200, pod_list(&["holdfast-abcde"])));
        let (_, send) = next(&mut handle).await;
        send.send_response(json(200, serde_json::json!({"node": "worker-1"})));
        let e = task.await.expect("task").expect_err("not upgraded");
        assert!(matches!(e, RemoteError::Api { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("get and create pods/portforward failed"),
            "{e}"
        );
    }
}
