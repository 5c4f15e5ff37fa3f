//! The scrape job a PodMonitor becomes, as the Prometheus Operator generates it, with the
//! Kubernetes service discovery of one pod played by a static target carrying the same
//! `__meta_kubernetes_*` labels: so a real Prometheus in a test scrapes the agent exactly as it
//! would in a cluster (the same relabelings: pod selector, port filter, `job`, `node`, ...).
//!
//! Read from prometheus-operator `pkg/prometheus/promcfg.go` (`generatePodMonitorConfig`,
//! `initRelabelings`, `generateRunningFilter`, `generateRelabelConfig`, `sanitizeLabelName`), the
//! same at v0.73.2 and v0.93.0. Left out: the sharding relabelings (a no-op with one shard),
//! scrape classes, authorization and TLS (the shipped PodMonitor uses none), and the
//! `kubernetes_sd_configs` block, which [`ScrapeTarget`]'s static labels stand in for (those
//! Prometheus' Kubernetes SD sets for a pod's container port: discovery/kubernetes/pod.go).

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

/// One container port of one pod, as Prometheus' Kubernetes SD (role `pod`) sees it.
#[derive(Debug, Clone)]
pub struct ScrapeTarget {
    /// `host:port` Prometheus connects to (`__address__`: pod IP and container port in a
    /// cluster).
    pub address: String,
    pub namespace: String,
    pub pod: String,
    pub node: String,
    pub phase: String,
    pub labels: BTreeMap<String, String>,
    pub container: String,
    pub port_name: String,
    pub port_number: u16,
}

impl ScrapeTarget {
    /// The `__meta_kubernetes_*` labels Prometheus' Kubernetes SD gives this target
    /// (discovery/kubernetes/pod.go: `podLabels`, `buildPod`).
    pub fn sd_labels(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::from([
            ("__meta_kubernetes_namespace".into(), self.namespace.clone()),
            ("__meta_kubernetes_pod_name".into(), self.pod.clone()),
            ("__meta_kubernetes_pod_node_name".into(), self.node.clone()),
            ("__meta_kubernetes_pod_phase".into(), self.phase.clone()),
            (
                "__meta_kubernetes_pod_container_name".into(),
                self.container.clone(),
            ),
            (
                "__meta_kubernetes_pod_container_port_name".into(),
                self.port_name.clone(),
            ),
            (
                "__meta_kubernetes_pod_container_port_number".into(),
                self.port_number.to_string(),
            ),
            (
                "__meta_kubernetes_pod_container_port_protocol".into(),
                "TCP".into(),
            ),
        ]);
        for (k, v) in &self.labels {
            let k = sanitize_label_name(k);
            out.insert(format!("__meta_kubernetes_pod_label_{k}"), v.clone());
            out.insert(
                format!("__meta_kubernetes_pod_labelpresent_{k}"),
                "true".into(),
            );
        }
        out
    }
}

/// The targets Kubernetes SD finds for a pod made from `daemonset`'s template on `node`: one
/// per container port (the operator's port filter must keep only the right one). `address`
/// maps a port name to where the test's agent serves it.
pub fn daemonset_targets(
    daemonset: &Value,
    pod_name: &str,
    node: &str,
    address: impl Fn(&str) -> String,
) -> Result<Vec<ScrapeTarget>> {
    let template = daemonset
        .pointer("/spec/template")
        .context("the DaemonSet has no spec.template")?;
    let namespace = daemonset
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .context("the DaemonSet has no namespace")?;
    let labels: BTreeMap<String, String> = template
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let mut out = Vec::new();
    for c in template
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .context("the DaemonSet's pod has no containers")?
    {
        let container = c.get("name").and_then(Value::as_str).unwrap_or_default();
        for p in c
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let port_name = p.get("name").and_then(Value::as_str).unwrap_or_default();
            let port_number = p
                .get("containerPort")
                .and_then(Value::as_u64)
                .context("a container port without containerPort")?;
            out.push(ScrapeTarget {
                address: address(port_name),
                namespace: namespace.to_string(),
                pod: pod_name.to_string(),
                node: node.to_string(),
                phase: "Running".into(),
                labels: labels.clone(),
                container: container.to_string(),
                port_name: port_name.to_string(),
                port_number: u16::try_from(port_number).context("containerPort")?,
            });
        }
    }
    Ok(out)
}

/// prometheus-operator's `sanitizeLabelName`: every character outside `[a-zA-Z0-9_]` becomes `_`.
pub fn sanitize_label_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn relabel(pairs: &[(&str, Value)]) -> Value {
    Value::Object(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect::<Map<_, _>>(),
    )
}

/// The scrape job the operator generates for endpoint `index` of `pod_monitor`, its
/// Kubernetes SD replaced by `targets` (static, with their SD labels). `interval` overrides the
/// endpoint's (tests scrape every second instead of every 30).
pub fn pod_monitor_scrape_config(
    pod_monitor: &Value,
    index: usize,
    targets: &[ScrapeTarget],
    interval: Option<&str>,
) -> Result<Value> {
    let s = |p: &str| pod_monitor.pointer(p).and_then(Value::as_str);
    let (Some(namespace), Some(name)) = (s("/metadata/namespace"), s("/metadata/name")) else {
        bail!("the PodMonitor needs metadata.namespace and metadata.name");
    };
    let ep = pod_monitor
        .pointer(&format!("/spec/podMetricsEndpoints/{index}"))
        .with_context(|| format!("the PodMonitor has no podMetricsEndpoints[{index}]"))?;
    let spec = pod_monitor
        .get("spec")
        .context("the PodMonitor has no spec")?;
    let mut cfg = Map::new();
    cfg.insert(
        "job_name".into(),
        json!(format!("podMonitor/{namespace}/{name}/{index}")),
    );
    cfg.insert(
        "static_configs".into(),
        Value::Array(
            targets
                .iter()
                .map(|t| json!({"targets": [t.address], "labels": t.sd_labels()}))
                .collect(),
        ),
    );
    if let Some(i) = interval.or_else(|| ep.get("interval").and_then(Value::as_str)) {
        cfg.insert("scrape_interval".into(), json!(i));
    }
    if let Some(t) = ep.get("scrapeTimeout").and_then(Value::as_str) {
        cfg.insert("scrape_timeout".into(), json!(t));
    }
    if let Some(p) = ep.get("path").and_then(Value::as_str) {
        cfg.insert("metrics_path".into(), json!(p));
    }
    if let Some(p) = ep.get("scheme").and_then(Value::as_str) {
        cfg.insert("scheme".into(), json!(p.to_lowercase()));
    }
    for unsupported in [
        "params",
        "basicAuth",
        "authorization",
        "oauth2",
        "tlsConfig",
        "bearerTokenSecret",
        "proxyUrl",
    ] {
        if ep.get(unsupported).is_some() {
            bail!("podMetricsEndpoints[{index}].{unsupported}: not translated here (tests/src/monitoring/scrape.rs)");
        }
    }
    let mut r = vec![relabel(&[
        ("source_labels", json!(["job"])),
        ("target_label", json!("__tmp_prometheus_job_name")),
    ])];
    if ep.get("filterRunning").and_then(Value::as_bool) != Some(false) {
        r.push(relabel(&[
            ("action", json!("drop")),
            ("source_labels", json!(["__meta_kubernetes_pod_phase"])),
            ("regex", json!("(Failed|Succeeded)")),
        ]));
    }
    if let Some(m) = spec
        .pointer("/selector/matchLabels")
        .and_then(Value::as_object)
    {
        // Go ranges over sortutil.SortedKeys; serde_json's map is sorted too.
        for (k, v) in m {
            let k = sanitize_label_name(k);
            r.push(relabel(&[
                ("action", json!("keep")),
                (
                    "source_labels",
                    json!([
                        format!("__meta_kubernetes_pod_label_{k}"),
                        format!("__meta_kubernetes_pod_labelpresent_{k}")
                    ]),
                ),
                (
                    "regex",
                    json!(format!("({});true", v.as_str().unwrap_or(""))),
                ),
            ]));
        }
    }
    if spec.pointer("/selector/matchExpressions").is_some() {
        bail!("selector.matchExpressions: not translated here (tests/src/monitoring/scrape.rs)");
    }
    let port = ep
        .get("port")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty());
    match (port, ep.get("portNumber").and_then(Value::as_u64)) {
        (Some(p), _) => r.push(relabel(&[
            ("action", json!("keep")),
            (
                "source_labels",
                json!(["__meta_kubernetes_pod_container_port_name"]),
            ),
            ("regex", json!(p)),
        ])),
        (None, Some(n)) => r.push(relabel(&[
            ("action", json!("keep")),
            (
                "source_labels",
                json!(["__meta_kubernetes_pod_container_port_number"]),
            ),
            ("regex", json!(n.to_string())),
        ])),
        (None, None) => {}
    }
    for (source, target) in [
        ("__meta_kubernetes_namespace", "namespace"),
        ("__meta_kubernetes_pod_container_name", "container"),
        ("__meta_kubernetes_pod_name", "pod"),
    ] {
        r.push(relabel(&[
            ("source_labels", json!([source])),
            ("target_label", json!(target)),
        ]));
    }
    for l in spec
        .get("podTargetLabels")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let l = sanitize_label_name(l);
        r.push(relabel(&[
            (
                "source_labels",
                json!([format!("__meta_kubernetes_pod_label_{l}")]),
            ),
            ("target_label", json!(l)),
            ("regex", json!("(.+)")),
            ("replacement", json!("${1}")),
        ]));
    }
    r.push(relabel(&[
        ("target_label", json!("job")),
        ("replacement", json!(format!("{namespace}/{name}"))),
    ]));
    if let Some(j) = spec.get("jobLabel").and_then(Value::as_str) {
        r.push(relabel(&[
            (
                "source_labels",
                json!([format!(
                    "__meta_kubernetes_pod_label_{}",
                    sanitize_label_name(j)
                )]),
            ),
            ("target_label", json!("job")),
            ("regex", json!("(.+)")),
            ("replacement", json!("${1}")),
        ]));
    }
    if let Some(p) = port {
        r.push(relabel(&[
            ("target_label", json!("endpoint")),
            ("replacement", json!(p)),
        ]));
    }
    // The endpoint's own relabelings (generateRelabelConfig: camelCase to snake_case, action
    // lower-cased).
    for (i, rc) in ep
        .get("relabelings")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let rc = rc
            .as_object()
            .with_context(|| format!("relabelings[{i}] is not an object"))?;
        let mut out = Map::new();
        for (k, v) in rc {
            let key = match k.as_str() {
                "sourceLabels" => "source_labels",
                "separator" => "separator",
                "targetLabel" => "target_label",
                "regex" => "regex",
                "modulus" => "modulus",
                "replacement" => "replacement",
                "action" => {
                    out.insert(
                        "action".into(),
                        json!(v.as_str().unwrap_or_default().to_lowercase()),
                    );
                    continue;
                }
                other => bail!("relabelings[{i}].{other}: not a RelabelConfig field"),
            };
            out.insert(key.into(), v.clone());
        }
        r.push(Value::Object(out));
    }
    cfg.insert("relabel_configs".into(), Value::Array(r));
    Ok(Value::Object(cfg))
}

/// The labels a scrape job's relabelings can give its series (every `target_label` not
/// starting with `__`), with `job` and `instance`, which Prometheus always sets.
pub fn target_label_names(scrape_config: &Value) -> std::collections::BTreeSet<String> {
    let mut out: std::collections::BTreeSet<String> =
        ["job".to_string(), "instance".to_string()].into();
    for r in scrape_config
        .get("relabel_configs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(t) = r.get("target_label").and_then(Value::as_str) {
            if !t.starts_with("__") {
                out.insert(t.to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_monitor() -> Value {
        json!({
            "metadata": {"name": "pm", "namespace": "ns"},
            "spec": {
                "jobLabel": "app.kubernetes.io/name",
                "selector": {"matchLabels": {"app.kubernetes.io/name": "x"}},
                "podMetricsEndpoints": [{
                    "port": "metrics", "path": "/metrics", "interval": "30s",
                    "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "Replace"}]
                }]
            }
        })
    }

    #[test]
    fn the_operators_relabelings_in_its_order() {
        let t = ScrapeTarget {
            address: "127.0.0.1:1".into(),
            namespace: "ns".into(),
            pod: "p".into(),
            node: "n".into(),
            phase: "Running".into(),
            labels: [("app.kubernetes.io/name".to_string(), "x".to_string())].into(),
            container: "c".into(),
            port_name: "metrics".into(),
            port_number: 1,
        };
        assert_eq!(
            t.sd_labels()
                .get("__meta_kubernetes_pod_label_app_kubernetes_io_name")
                .map(String::as_str),
            Some("x")
        );
        let cfg = pod_monitor_scrape_config(&pod_monitor(), 0, &[t], Some("1s")).expect("cfg");
        assert_eq!(cfg["job_name"], "podMonitor/ns/pm/0");
        assert_eq!(cfg["scrape_interval"], "1s");
        let r = cfg["relabel_configs"].as_array().expect("list");
        let targets: Vec<&str> = r
            .iter()
            .filter_map(|x| x.get("target_label").and_then(Value::as_str))
            .collect();
        assert_eq!(
            targets,
            [
                "__tmp_prometheus_job_name",
                "namespace",
                "container",
                "pod",
                "job",
                "job",
                "endpoint",
                "node"
            ]
        );
        assert_eq!(r[2]["regex"], "(x);true");
        assert_eq!(r[3]["regex"], "metrics");
        assert_eq!(r.last().expect("node")["action"], "replace");
        assert_eq!(
            target_label_names(&cfg).into_iter().collect::<Vec<_>>(),
            [
                "container",
                "endpoint",
                "instance",
                "job",
                "namespace",
                "node",
                "pod"
            ]
        );
        let mut bad = pod_monitor();
        bad["spec"]["podMetricsEndpoints"][0]["tlsConfig"] = json!({});
        assert!(pod_monitor_scrape_config(&bad, 0, &[], None).is_err());
    }
}
