//! The optional monitoring component (`manifests/monitoring/`): its alert rules, dashboard and
//! scrape wiring, checked against what the agent really exports.
//!
//! # Layout
//!
//! - this module: where the files are, the PrometheusRule generated from the plain rules file
//!   (the one source), the queries of the rules and the dashboard, and the check that every
//!   metric, label and label value they name is exported ([`check_queries`]).
//! - [`promql`]: a PromQL tokenizer and the selectors and grouping labels of a query.
//! - [`scrape`]: the scrape job the shipped PodMonitor becomes (the Prometheus Operator's
//!   relabelings), with a static target standing in for Kubernetes service discovery.
//! - [`prometheus`]: a real Prometheus (Debian's 2.42) on loopback and its HTTP API.

pub mod prometheus;
pub mod promql;
pub mod scrape;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

/// Series the rules or the dashboard name that the agent does not export yet, each with what
/// adds it. The checks report each as PENDING (never as a pass) and fail once the agent does
/// export it, so the line is removed when the metric lands. `pending_series_are_exported` in
/// tests/tests/monitoring.rs checks them without this allowance. Empty: every series the rules
/// and panels name is exported (the last, `holdfast_jobs_total{outcome="proxy-not-stopped"}`,
/// landed with the Job outcome of that name).
pub const PENDING: [(&str, &str); 0] = [];

/// Series Prometheus itself makes for every target (scrape/scrape.go), with the target's labels.
pub const SCRAPE_SERIES: [&str; 5] = [
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
];

pub fn monitoring_dir() -> PathBuf {
    crate::envoy::workspace_root().join("manifests/monitoring")
}

/// The plain rules file: the one source of the alert rules.
pub fn rules_file() -> PathBuf {
    monitoring_dir().join("holdfast.rules.yaml")
}

/// The PrometheusRule, generated from [`rules_file`].
pub fn prometheus_rule_file() -> PathBuf {
    monitoring_dir().join("prometheusrule.yaml")
}

pub fn pod_monitor_file() -> PathBuf {
    monitoring_dir().join("podmonitor.yaml")
}

pub fn dashboard_file() -> PathBuf {
    monitoring_dir().join("dashboard.json")
}

/// `promtool test rules` input: every alert on bad and healthy series.
pub fn rules_test_file() -> PathBuf {
    crate::envoy::workspace_root().join("tests/monitoring/holdfast.rules.test.yaml")
}

/// The command that rewrites [`prometheus_rule_file`] from [`rules_file`].
pub const REGENERATE: &str =
    "HOLDFAST_REGENERATE=1 cargo test -p holdfast-tests --test monitoring prometheus_rule_is_generated_from_the_rules_file";

/// The PrometheusRule for `rules` (the text of the plain rules file): its `groups:` and
/// everything after, comments included, under `spec:`. Text, not re-serialised YAML, so the
/// comments reach the cluster's copy too.
pub fn prometheus_rule(rules: &str) -> Result<String> {
    let start = rules
        .lines()
        .position(|l| l.starts_with("groups:"))
        .context("the rules file has no top-level `groups:`")?;
    let mut out = format!(
        "# GENERATED from holdfast.rules.yaml (the one source of holdfast's alert rules): edit that\n\
         # file, then regenerate this one with\n\
         #   {REGENERATE}\n\
         # tests/tests/monitoring.rs fails while the two differ.\n\
         apiVersion: monitoring.coreos.com/v1\n\
         kind: PrometheusRule\n\
         metadata:\n  \
           name: holdfast\n  \
           namespace: holdfast-system\n  \
           labels:\n    \
             app.kubernetes.io/name: holdfast\n    \
             app.kubernetes.io/component: agent\n\
         spec:\n"
    );
    for l in rules.lines().skip(start) {
        if l.is_empty() {
            out.push('\n');
        } else {
            out.push_str("  ");
            out.push_str(l);
            out.push('\n');
        }
    }
    Ok(out)
}

/// A query to check, and where it comes from (for messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub origin: String,
    pub expr: String,
}

/// Every alert's and recording rule's `expr` in a rules file (parsed YAML).
pub fn rule_queries(rules: &Value) -> Result<Vec<Query>> {
    let mut out = Vec::new();
    for g in rules
        .get("groups")
        .and_then(Value::as_array)
        .context("no groups")?
    {
        for r in g
            .get("rules")
            .and_then(Value::as_array)
            .context("a group without rules")?
        {
            let name = r
                .get("alert")
                .or_else(|| r.get("record"))
                .and_then(Value::as_str)
                .context("a rule without alert or record")?;
            let expr = r
                .get("expr")
                .and_then(Value::as_str)
                .with_context(|| format!("rule {name} has no expr"))?;
            out.push(Query {
                origin: format!("rule {name}"),
                expr: expr.to_string(),
            });
        }
    }
    Ok(out)
}

/// Every panel target's `expr` in a Grafana dashboard (rows' nested panels included), and
/// every templating variable's query.
pub fn dashboard_queries(dashboard: &Value) -> Result<Vec<Query>> {
    fn panels(list: &Value, out: &mut Vec<Query>) {
        for p in list.as_array().into_iter().flatten() {
            let title = p
                .get("title")
                .and_then(Value::as_str)
                .unwrap_or("(untitled)");
            for (i, t) in p
                .get("targets")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                if let Some(e) = t.get("expr").and_then(Value::as_str) {
                    out.push(Query {
                        origin: format!("panel {title:?} target {i}"),
                        expr: e.to_string(),
                    });
                }
            }
            if let Some(nested) = p.get("panels") {
                panels(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    panels(dashboard.get("panels").context("no panels")?, &mut out);
    for v in dashboard
        .pointer("/templating/list")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if v.get("type").and_then(Value::as_str) != Some("query") {
            continue;
        }
        let q = v
            .pointer("/query/query")
            .or_else(|| v.get("query"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        // Grafana's `label_values(metric, label)`: the metric and the label it names.
        if let Some(args) = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
        {
            let (metric, label) = args
                .rsplit_once(',')
                .with_context(|| format!("variable query {q:?}"))?;
            out.push(Query {
                origin: format!(
                    "variable {}",
                    v.get("name").and_then(Value::as_str).unwrap_or("?")
                ),
                expr: format!("count by ({}) ({})", label.trim(), metric.trim()),
            });
        }
    }
    Ok(out)
}

/// What the agent exports, as Prometheus stores it: each series name with, per label, the
/// values seen.
#[derive(Debug, Clone, Default)]
pub struct Exported {
    pub series: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

impl Exported {
    /// From a text exposition (Prometheus or OpenMetrics): the sample lines' names and labels
    /// (`_total`, `_bucket`, `_sum`, `_count` as Prometheus stores them).
    pub fn parse(text: &str) -> Result<Exported> {
        let mut out = Exported::default();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let name_end = line
                .find(|c: char| c == '{' || c.is_whitespace())
                .with_context(|| format!("sample line without a value: {line:?}"))?;
            let name = &line[..name_end];
            let labels = out.series.entry(name.to_string()).or_default();
            if line[name_end..].starts_with('{') {
                let close = line
                    .rfind('}')
                    .with_context(|| format!("unclosed labels: {line:?}"))?;
                let sel = promql::names(&line[..=close])
                    .with_context(|| format!("labels of {line:?}"))?;
                for m in sel.selectors.into_iter().flat_map(|s| s.matchers) {
                    labels.entry(m.label).or_default().extend(m.value);
                }
            }
        }
        Ok(out)
    }
}

/// What [`check_queries`] found.
#[derive(Debug, Default)]
pub struct Checked {
    /// Names that do not exist, each saying where and why.
    pub errors: Vec<String>,
    /// Selectors of [`PENDING`] series the agent does not export yet.
    pub pending: Vec<String>,
    /// Every selector checked (metric name and matchers), for the real-Prometheus test.
    pub selectors: Vec<(String, promql::Selector)>,
}

/// The PENDING entry that `sel` is, if any (by metric name, and label value where the entry
/// names one).
fn pending_entry<'a>(
    sel: &promql::Selector,
    pending: &'a [(&'static str, &'static str)],
) -> Option<&'a (&'static str, &'static str)> {
    pending.iter().find(|(p, _)| {
        let (name, matcher) = match p.split_once('{') {
            Some((n, m)) => (n, Some(m.trim_end_matches('}'))),
            None => (*p, None),
        };
        sel.metric.as_deref() == Some(name)
            && matcher.is_none_or(|m| {
                sel.matchers
                    .iter()
                    .any(|x| format!("{}=\"{}\"", x.label, x.value.as_deref().unwrap_or("")) == m)
            })
    })
}

/// Checks that every metric, label and label value `queries` name is exported: metrics in
/// `exported` or made by Prometheus for each target ([`SCRAPE_SERIES`]); labels on that
/// metric or among `target_labels` (the scrape config's); `=` values among those exported, `=~`
/// alternations of plain words each among them (target labels' values are checked by the
/// real-Prometheus test); grouping labels on some metric of the query, a target label, or `le`
/// on a `_bucket` series. `pending` (normally [`PENDING`], or none): series reported as
/// PENDING while not exported, and an error once they are.
pub fn check_queries(
    queries: &[Query],
    exported: &Exported,
    target_labels: &BTreeSet<String>,
    pending: &[(&'static str, &'static str)],
) -> Checked {
    let allow_pending = !pending.is_empty();
    let pending_list = pending;
    let plain_alternation =
        regex::Regex::new(r"^[A-Za-z0-9_.:-]+(\|[A-Za-z0-9_.:-]+)*$").expect("a valid regex");
    let no_labels = BTreeMap::new();
    let mut out = Checked::default();
    for q in queries {
        let names = match promql::names(&q.expr) {
            Ok(n) => n,
            Err(e) => {
                out.errors.push(format!("{}: {e:#}", q.origin));
                continue;
            }
        };
        let mut labels_here: BTreeSet<String> = target_labels.clone();
        for sel in &names.selectors {
            out.selectors.push((q.origin.clone(), sel.clone()));
            let Some(metric) = sel.metric.as_deref() else {
                out.errors
                    .push(format!("{}: a selector without a metric name", q.origin));
                continue;
            };
            let pending = pending_entry(sel, pending_list);
            let known = exported.series.get(metric);
            let scrape_series = SCRAPE_SERIES.contains(&metric);
            let Some(labels) = known.or(scrape_series.then_some(&no_labels)) else {
                match pending {
                    Some((_, why)) if allow_pending => out
                        .pending
                        .push(format!("{}: {metric} (PENDING: {why})", q.origin)),
                    _ => out.errors.push(format!(
                        "{}: metric {metric} is not exported by the agent{}",
                        q.origin,
                        close_names(metric, exported.series.keys())
                    )),
                }
                continue;
            };
            labels_here.extend(labels.keys().cloned());
            if metric.ends_with("_bucket") {
                labels_here.insert("le".into());
            }
            let mut pending_value = false;
            for m in &sel.matchers {
                if m.label == "__name__" {
                    continue;
                }
                let values = labels.get(&m.label);
                if values.is_none() && !target_labels.contains(&m.label) {
                    out.errors.push(format!(
                        "{}: {metric} has no label {:?} (its labels: {:?}; target labels: {target_labels:?})",
                        q.origin,
                        m.label,
                        labels.keys().collect::<Vec<_>>()
                    ));
                    continue;
                }
                let (Some(values), Some(v)) = (values, m.value.as_deref()) else {
                    continue;
                };
                let wanted: Vec<&str> = match m.op.as_str() {
                    "=" => vec![v],
                    "=~" if plain_alternation.is_match(v) => v.split('|').collect(),
                    _ => vec![],
                };
                for w in wanted {
                    if values.contains(w) {
                        continue;
                    }
                    if pending.is_some() && allow_pending {
                        pending_value = true;
                        continue;
                    }
                    out.errors.push(format!(
                        "{}: {metric}{{{}=...}} never has the value {w:?} (exported: {values:?})",
                        q.origin, m.label
                    ));
                }
            }
            match (pending, pending_value) {
                (Some((_, why)), true) => out.pending.push(format!(
                    "{}: {metric}{:?} (PENDING: {why})",
                    q.origin, sel.matchers
                )),
                (Some((p, _)), false) if allow_pending => out.errors.push(format!(
                    "{}: {p} is exported now: remove it from PENDING in tests/src/monitoring/mod.rs (and un-ignore pending_series_are_exported)",
                    q.origin
                )),
                _ => {}
            }
        }
        for g in &names.grouping {
            if !labels_here.contains(g) {
                out.errors.push(format!(
                    "{}: grouping label {g:?} is on none of the query's series (labels: {labels_here:?})",
                    q.origin
                ));
            }
        }
    }
    out
}

/// ", did you mean X?" for the exported name closest to `name` (shares the longest prefix).
fn close_names<'a>(name: &str, known: impl Iterator<Item = &'a String>) -> String {
    let common = |a: &str, b: &str| a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    known
        .max_by_key(|k| common(name, k))
        .filter(|k| common(name, k) > "holdfast_".len())
        .map(|k| format!(" (did you mean {k}?)"))
        .unwrap_or_default()
}

/// What an overlay of the default install plus the monitoring component renders (the overlay
/// docs/install.md shows, written to a temporary directory: kustomize refuses an overlay inside
/// `manifests/` that includes its parent).
pub fn render_install_with_monitoring() -> Result<Vec<crate::kustomize::Object>> {
    let manifests = crate::envoy::workspace_root()
        .join("manifests")
        .canonicalize()
        .context("manifests/")?;
    let dir = std::env::temp_dir().join(format!("hf-monitoring-overlay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).context("the overlay's directory")?;
    let dir = std::path::absolute(&dir)?;
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n- {m}\ncomponents:\n- {m}/monitoring\n",
            m = manifests.display()
        ),
    )?;
    let rel = dir.strip_prefix("/").context("absolute")?.to_path_buf();
    let r = crate::kustomize::render(std::path::Path::new("/"), &rel);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(r?.objects)
}

/// The one object of `kind` in `objects`.
pub fn one_of<'a>(objects: &'a [crate::kustomize::Object], kind: &str) -> Result<&'a Value> {
    let mut it = objects.iter().filter(|o| o.kind() == kind);
    let first = it.next().with_context(|| format!("no {kind} rendered"))?;
    ensure!(it.next().is_none(), "more than one {kind} rendered");
    Ok(&first.value)
}

/// Reads and parses a YAML file as JSON values.
pub fn yaml_file(path: &std::path::Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value =
        serde_saphyr::from_str(&text).with_context(|| format!("{}: not YAML", path.display()))?;
    if v.is_null() {
        bail!("{} is empty", path.display());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = "# TYPE holdfast_drains counter\n\
        holdfast_drains_total{outcome=\"deadline\"} 0\n\
        holdfast_drains_total{outcome=\"app-done\"} 2\n\
        holdfast_hold_duration_seconds_bucket{le=\"0.001\"} 0\n\
        holdfast_pods{phase=\"holding\"} 1\n\
        holdfast_ready 1\n\
        # EOF\n";

    fn q(expr: &str) -> Vec<Query> {
        vec![Query {
            origin: "test".into(),
            expr: expr.into(),
        }]
    }

    fn targets() -> BTreeSet<String> {
        ["job", "instance", "node"].map(String::from).into()
    }

    #[test]
    fn exposition_parses_to_series_labels_and_values() {
        let e = Exported::parse(EXPOSITION).expect("parse");
        assert_eq!(
            e.series.keys().collect::<Vec<_>>(),
            [
                "holdfast_drains_total",
                "holdfast_hold_duration_seconds_bucket",
                "holdfast_pods",
                "holdfast_ready"
            ]
        );
        assert_eq!(
            e.series["holdfast_drains_total"]["outcome"],
            ["app-done", "deadline"].map(String::from).into()
        );
    }

    /// Proof that the check can fail: a wrong metric, label, value or grouping label each
    /// fails, naming it; the right ones pass.
    #[test]
    fn a_query_naming_what_the_agent_does_not_export_fails() {
        let e = Exported::parse(EXPOSITION).expect("parse");
        let ok = check_queries(
            &q(
                r#"sum by (node, outcome) (increase(holdfast_drains_total{outcome=~"deadline|app-done", node=~"$node"}[5m])) > 0 or up{job="holdfast"} == 0 or histogram_quantile(0.9, sum by (le) (rate(holdfast_hold_duration_seconds_bucket[1m])))"#,
            ),
            &e,
            &targets(),
            &[],
        );
        assert!(ok.errors.is_empty(), "{:?}", ok.errors);
        assert_eq!(ok.selectors.len(), 3);
        for (expr, expect) in [
            ("holdfast_drain_total", "metric holdfast_drain_total is not exported by the agent (did you mean holdfast_drains_total?)"),
            (r#"holdfast_drains_total{outcom="deadline"}"#, "has no label \"outcom\""),
            (r#"holdfast_drains_total{outcome="deadlin"}"#, "never has the value \"deadlin\""),
            (r#"holdfast_drains_total{outcome=~"deadline|gone"}"#, "never has the value \"gone\""),
            (r#"sum by (phase) (holdfast_drains_total)"#, "grouping label \"phase\""),
            (r#"holdfast_sidecars_lost_total"#, "not exported"),
        ] {
            let c = check_queries(&q(expr), &e, &targets(), &[]);
            assert!(
                c.errors.iter().any(|x| x.contains(expect)),
                "{expr}: {:?}",
                c.errors
            );
        }
    }

    #[test]
    fn pending_series_are_reported_until_exported_then_fail() {
        const SOON: [(&str, &str); 1] = [(
            "holdfast_jobs_total{outcome=\"proxy-wedged\"}",
            "a Job outcome not built yet",
        )];
        let c = check_queries(
            &q(r#"holdfast_jobs_total{outcome="proxy-wedged"}"#),
            &Exported::parse("holdfast_jobs_total{outcome=\"completed\"} 0\n").expect("parse"),
            &targets(),
            &SOON,
        );
        assert!(c.errors.is_empty() && c.pending.len() == 1, "{c:?}");
        // Without the allowance it is an error, as for any name the agent does not export.
        let c = check_queries(
            &q(r#"holdfast_jobs_total{outcome="proxy-wedged"}"#),
            &Exported::parse("holdfast_jobs_total{outcome=\"completed\"} 0\n").expect("parse"),
            &targets(),
            &[],
        );
        assert!(c.errors.len() == 1 && c.pending.is_empty(), "{c:?}");
        let landed = Exported::parse(&format!(
            "{EXPOSITION}holdfast_jobs_total{{outcome=\"proxy-wedged\"}} 0\n"
        ))
        .expect("parse");
        let c = check_queries(
            &q(r#"holdfast_jobs_total{outcome="proxy-wedged"}"#),
            &landed,
            &targets(),
            &SOON,
        );
        assert!(
            c.errors
                .iter()
                .any(|x| x.contains("remove it from PENDING")),
            "{c:?}"
        );
    }

    #[test]
    fn the_prometheus_rule_embeds_the_rules_under_spec() {
        let rules =
            "# header\n# more\ngroups:\n- name: g\n  rules:\n\n  - alert: A\n    expr: up == 0\n";
        let pr = prometheus_rule(rules).expect("generate");
        assert!(pr.contains("kind: PrometheusRule\n"));
        assert!(pr.ends_with("spec:\n  groups:\n  - name: g\n    rules:\n\n    - alert: A\n      expr: up == 0\n"), "{pr}");
        assert!(!pr.contains("# header"));
        let v: Value = serde_saphyr::from_str(&pr).expect("YAML");
        let r: Value = serde_saphyr::from_str(rules).expect("YAML");
        assert_eq!(v["spec"], r);
        assert!(prometheus_rule("rules: []\n").is_err());
    }
}
