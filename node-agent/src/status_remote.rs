//! `holdfast status --node NODE`: read a node's status through the API server, as kubectl does,
//! so no port needs opening: find the node's agent pod, then `GET /status` through the API
//! server's pod proxy (`pods/<name>:15300/proxy/status`), with the user's kubeconfig.
//!
//! The user needs RBAC to list pods in the agent's namespace and to get `pods/proxy` there.

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::Api;

/// Namespace the manifests install the agent into.
pub const AGENT_NAMESPACE: &str = "holdfast-system";
/// Labels of the agent's pods (manifests/agent/daemonset.yaml).
pub const AGENT_SELECTOR: &str =
    "app.kubernetes.io/name=holdfast,app.kubernetes.io/component=agent";
/// The agent's status port in the manifests (`--status-listen 0.0.0.0:15300`).
pub const STATUS_PORT: u16 = 15300;

/// Why a node's status could not be read through the API server.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("cannot configure a Kubernetes client from your kubeconfig: {0}; check KUBECONFIG / ~/.kube/config, or run `holdfast status` on the node with --agent")]
    Config(String),
    #[error("no holdfast agent pod on node {node:?} in namespace {namespace} (label {AGENT_SELECTOR}): is the node name right (`kubectl get nodes`), and is holdfast installed (`kubectl apply -k manifests/`)?")]
    NoAgent { node: String, namespace: String },
    #[error("the API server refused to let you {what} (403 Forbidden): ask for RBAC to list pods and get pods/proxy in namespace {namespace}")]
    Forbidden { what: String, namespace: String },
    #[error("{what} failed: {why}")]
    Api { what: String, why: String },
}

fn classify(e: kube::Error, what: &str, namespace: &str) -> RemoteError {
    match &e {
        kube::Error::Api(status) if status.code == 403 => RemoteError::Forbidden {
            what: what.to_string(),
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

/// The `/status` body of `node`'s agent, through the API server's pod proxy.
pub async fn fetch_status_body(
    client: kube::Client,
    node: &str,
    namespace: &str,
) -> Result<String, RemoteError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default()
        .labels(AGENT_SELECTOR)
        .fields(&format!("spec.nodeName={node}"));
    let list = pods
        .list(&params)
        .await
        .map_err(|e| classify(e, "list the agent's pods", namespace))?;
    // Prefer a running pod (a rolling update may briefly show two).
    let pod = list
        .items
        .iter()
        .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .or_else(|| list.items.first())
        .and_then(|p| p.metadata.name.clone())
        .ok_or_else(|| RemoteError::NoAgent {
            node: node.to_string(),
            namespace: namespace.to_string(),
        })?;
    let path = format!("/api/v1/namespaces/{namespace}/pods/{pod}:{STATUS_PORT}/proxy/status");
    let request = hyper::Request::get(&path)
        .body(Vec::new())
        .map_err(|e| RemoteError::Api {
            what: format!("building GET {path}"),
            why: e.to_string(),
        })?;
    client
        .request_text(request)
        .await
        .map_err(|e| classify(e, &format!("GET {path} (pods/proxy)"), namespace))
}

#[cfg(test)]
mod tests {
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

    #[tokio::test]
    async fn finds_the_nodes_agent_and_reads_status_through_the_pod_proxy() {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(svc, "default");
        let task =
            tokio::spawn(
                async move { fetch_status_body(client, "worker-1", AGENT_NAMESPACE).await },
            );

        let (req, send) = next(&mut handle).await;
        assert_eq!(req.uri().path(), "/api/v1/namespaces/holdfast-system/pods");
        let q = req.uri().query().unwrap_or_default().to_string();
        assert!(q.contains("fieldSelector=spec.nodeName%3Dworker-1"), "{q}");
        assert!(
            q.contains("labelSelector=app.kubernetes.io%2Fname%3Dholdfast"),
            "{q}"
        );
        send.send_response(json(200, pod_list(&["holdfast-abcde"])));

        let (req, send) = next(&mut handle).await;
        assert_eq!(req.method(), hyper::Method::GET);
        assert_eq!(
            req.uri().path(),
            "/api/v1/namespaces/holdfast-system/pods/holdfast-abcde:15300/proxy/status"
        );
        send.send_response(json(
            200,
            serde_json::json!({"node": "worker-1", "agent_version": "0.1.0", "pods": []}),
        ));

        let body = task.await.expect("task").expect("status body");
        assert!(body.contains("\"worker-1\""), "{body}");
    }

    #[tokio::test]
    async fn no_agent_on_the_node_says_so() {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(svc, "default");
        let task =
            tokio::spawn(
                async move { fetch_status_body(client, "worker-9", AGENT_NAMESPACE).await },
            );
        let (_, send) = next(&mut handle).await;
        send.send_response(json(200, pod_list(&[])));
        let e = task.await.expect("task").expect_err("no agent");
        assert!(matches!(e, RemoteError::NoAgent { .. }), "{e}");
        assert!(e.to_string().contains("worker-9"), "{e}");
    }

    #[tokio::test]
    async fn rbac_denied_names_the_permission() {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(svc, "default");
        let task =
            tokio::spawn(
                async move { fetch_status_body(client, "worker-1", AGENT_NAMESPACE).await },
            );
        let (_, send) = next(&mut handle).await;
        send.send_response(json(200, pod_list(&["holdfast-abcde"])));
        let (_, send) = next(&mut handle).await;
        send.send_response(json(403, serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "pods \"holdfast-abcde\" is forbidden: User \"dev\" cannot get resource \"pods/proxy\"",
            "reason": "Forbidden", "code": 403
        })));
        let e = task.await.expect("task").expect_err("forbidden");
        assert!(matches!(e, RemoteError::Forbidden { .. }), "{e}");
        assert!(e.to_string().contains("pods/proxy"), "{e}");
    }
}
