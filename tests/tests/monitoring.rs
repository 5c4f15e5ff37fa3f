//! The optional monitoring component (`manifests/monitoring/`), checked as far as it can be
//! without a cluster:
//!
//! - the PrometheusRule is generated from the plain rules file (one source) and equal to it;
//! - `promtool check rules`, and `promtool test rules` (tests/monitoring/holdfast.rules.test.yaml):
//!   every alert fires on bad series and stays quiet on healthy ones, and each alert's tests
//!   fail when that alert is broken (never fires; fires on healthy series too);
//! - every metric, label and label value a rule, a dashboard panel or a dashboard variable
//!   names is exported by the agent (a small PromQL tokenizer, `holdfast_tests::monitoring`),
//!   and a wrong name fails;
//! - every alert links to its runbook section in docs/operations.md, which says what it
//!   means, what to check (with `holdfast status`) and what to change;
//! - a real Prometheus (Debian's 2.42) scrapes a real agent on the simulated node with the
//!   scrape job the shipped PodMonitor becomes, through a held start, a deadline release, a
//!   drain, a deadline drain, a proxy gone early and a Job: every series the rules and panels
//!   read exists with the agent's values, the alerts that should fire do and no other, and an
//!   agent killed is an `up == 0` alert; the scrape job docs/install.md gives clusters without
//!   the operator yields the same labels.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use holdfast::api::{DrainOutcome, HoldOutcome, JobOutcome};
use holdfast::report::board::StatusBoard;
use holdfast::report::metrics::MetricsHandle;
use holdfast_tests::agent::AgentProcess;
use holdfast_tests::monitoring::prometheus::{self, Prometheus};
use holdfast_tests::monitoring::{self, promql, scrape, Exported, Query};
use holdfast_tests::sim::{
    privileged, AppScript, NodeOptions, Phase, PodPhase, PodSpec, Runtime, SimNode,
};
use serde_json::{json, Value};

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn rules() -> Value {
    monitoring::yaml_file(&monitoring::rules_file()).expect("the rules file")
}

fn dashboard() -> Value {
    serde_json::from_str(&read(&monitoring::dashboard_file())).expect("the dashboard is JSON")
}

fn alert_names() -> Vec<String> {
    rules()["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .filter_map(|r| r.get("alert").and_then(Value::as_str).map(String::from))
        .collect()
}

/// Every query of the rules and the dashboard.
fn all_queries() -> Vec<Query> {
    let mut q = monitoring::rule_queries(&rules()).expect("the rules' queries");
    q.extend(monitoring::dashboard_queries(&dashboard()).expect("the dashboard's queries"));
    q
}

/// The scrape job the shipped PodMonitor becomes for a pod of the shipped DaemonSet on
/// `node`, whose metrics port is served at `metrics_addr` (every other port: a closed one,
/// which the PodMonitor's port filter must drop).
fn operator_scrape_job(node: &str, agent_pod: &str, metrics_addr: &str) -> Value {
    let objects = monitoring::render_install_with_monitoring().expect("render the install");
    let ds = monitoring::one_of(&objects, "DaemonSet").expect("the DaemonSet");
    let pm = monitoring::one_of(&objects, "PodMonitor").expect("the PodMonitor");
    let targets = scrape::daemonset_targets(ds, agent_pod, node, |port| {
        if port == "metrics" {
            metrics_addr.to_string()
        } else {
            "127.0.0.1:1".to_string()
        }
    })
    .expect("targets");
    assert!(
        targets.len() >= 2,
        "the agent has a metrics and a health port: {targets:?}"
    );
    scrape::pod_monitor_scrape_config(pm, 0, &targets, Some("1s")).expect("the scrape job")
}

/// What the agent exports, from its own registry (the code `/metrics` runs).
fn exported_in_process() -> Exported {
    Exported::parse(&MetricsHandle::new().encode(&StatusBoard::default())).expect("parse")
}

// --- one source -------------------------------------------------------------------------------

#[test]
fn prometheus_rule_is_generated_from_the_rules_file() {
    let generated =
        monitoring::prometheus_rule(&read(&monitoring::rules_file())).expect("generate");
    let path = monitoring::prometheus_rule_file();
    if std::env::var_os("HOLDFAST_REGENERATE").is_some() {
        std::fs::write(&path, &generated).expect("write the PrometheusRule");
    }
    let shipped = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        shipped == generated,
        "{} differs from what holdfast.rules.yaml generates: edit the rules file, then run\n  {}",
        path.display(),
        monitoring::REGENERATE
    );
    // And as data: the PrometheusRule's spec is the rules file.
    let pr = monitoring::yaml_file(&path).expect("the PrometheusRule");
    assert_eq!(pr["spec"], rules());
}

// --- promtool ---------------------------------------------------------------------------------

fn promtool(args: &[&str]) -> (bool, String) {
    let bin = prometheus::binary("promtool").expect("promtool");
    let out = Command::new(bin).args(args).output().expect("run promtool");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn promtool_checks_the_rules() {
    if prometheus::required("promtool_checks_the_rules", "promtool").is_none() {
        return;
    }
    let rules = monitoring::rules_file();
    let (ok, out) = promtool(&["check", "rules", &rules.display().to_string()]);
    assert!(ok, "{out}");
    let n = alert_names().len();
    assert!(out.contains(&format!("SUCCESS: {n} rules found")), "{out}");
    // The check can fail: a broken expression is refused.
    let dir = temp_dir("promtool-check");
    let bad = dir.join("bad.rules.yaml");
    std::fs::write(
        &bad,
        read(&rules).replace(
            "expr: up{job=\"holdfast\"} == 0",
            "expr: up{job=\"holdfast\" == 0",
        ),
    )
    .expect("write");
    let (ok, out) = promtool(&["check", "rules", &bad.display().to_string()]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!ok, "a broken expression passed: {out}");
}

fn temp_dir(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hf-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn rules_tests() -> Value {
    monitoring::yaml_file(&monitoring::rules_test_file()).expect("the rules' unit tests")
}

/// Every alert has, in the unit tests, an evaluation where it fires with its labels and one
/// where it is expected quiet; and `promtool test rules` passes.
#[test]
fn promtool_unit_tests_cover_every_alert_and_pass() {
    if prometheus::required("promtool_unit_tests_cover_every_alert_and_pass", "promtool").is_none()
    {
        return;
    }
    let tests = rules_tests();
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for t in tests["tests"].as_array().expect("tests") {
        for a in t["alert_rule_test"].as_array().expect("alert_rule_test") {
            let name = a["alertname"].as_str().expect("alertname").to_string();
            let alerts = a["exp_alerts"].as_array().expect("exp_alerts");
            if alerts.is_empty() {
                quiet.insert(name);
            } else {
                for x in alerts {
                    assert!(
                        x["exp_labels"].get("severity").is_some()
                            && x.get("exp_annotations").is_some(),
                        "{name}: expected alerts name their labels and annotations: {x}"
                    );
                }
                fires.insert(name);
            }
        }
    }
    for a in alert_names() {
        assert!(fires.contains(&a), "no unit test makes {a} fire");
        assert!(quiet.contains(&a), "no unit test expects {a} quiet");
    }
    let (ok, out) = promtool(&[
        "test",
        "rules",
        &monitoring::rules_test_file().display().to_string(),
    ]);
    assert!(ok, "{out}");
}

/// Each alert's unit tests fail when that alert is broken: made never to fire, and made to
/// fire on healthy series too (its comparison relaxed to `>= 0`, or `vector(1)` where it has
/// none). Run per alert, with only that alert's tests.
#[test]
fn every_alerts_unit_tests_fail_when_the_alert_is_broken() {
    if prometheus::required(
        "every_alerts_unit_tests_fail_when_the_alert_is_broken",
        "promtool",
    )
    .is_none()
    {
        return;
    }
    let rules = rules();
    let tests = rules_tests();
    let dir = temp_dir("promtool-mutants");
    let comparison = regex::Regex::new(r"\s*(==|!=|>=|<=|>|<)\s*[0-9.]+\s*$").expect("regex");
    let mut checked = 0;
    let mut failures = Vec::new();
    for alert in alert_names() {
        let mine: Vec<Value> = tests["tests"]
            .as_array()
            .expect("tests")
            .iter()
            .filter(|t| {
                t["alert_rule_test"]
                    .as_array()
                    .is_some_and(|l| l.iter().any(|a| a["alertname"] == alert.as_str()))
            })
            .cloned()
            .collect();
        let expr = rules["groups"][0]["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .find(|r| r["alert"] == alert.as_str())
            .and_then(|r| r["expr"].as_str())
            .expect("expr")
            .to_string();
        let loud = if comparison.is_match(&expr) {
            comparison.replace(&expr, " >= 0").into_owned()
        } else {
            "vector(1)".to_string()
        };
        for (what, mutant) in [
            ("never fires", "vector(1) == 2".to_string()),
            ("fires on healthy series", loud),
        ] {
            let mut r = rules.clone();
            for rule in r["groups"][0]["rules"].as_array_mut().expect("rules") {
                if rule["alert"] == alert.as_str() {
                    rule["expr"] = json!(mutant);
                }
            }
            let rules_path = dir.join(format!("{alert}.rules.yaml"));
            std::fs::write(&rules_path, r.to_string()).expect("write rules");
            let mut t = tests.clone();
            t["rule_files"] = json!([rules_path]);
            t["tests"] = json!(mine);
            let test_path = dir.join(format!("{alert}.test.yaml"));
            std::fs::write(&test_path, t.to_string()).expect("write tests");
            let (ok, out) = promtool(&["test", "rules", &test_path.display().to_string()]);
            checked += 1;
            if ok || !out.contains(&format!("alertname: {alert},")) {
                failures.push(format!(
                    "{alert} with `{mutant}` ({what}): the unit tests did not fail on it:\n{out}"
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(checked, 2 * alert_names().len());
}

// --- names against the agent's export ----------------------------------------------------------

/// Every metric, label and label value the rules and the dashboard name is one the agent
/// exports (or one of the PENDING series, reported as such).
#[test]
fn every_rule_and_panel_names_only_what_the_agent_exports() {
    let job = operator_scrape_job("node-1", "holdfast-agent-aaaaa", "127.0.0.1:15302");
    let targets = scrape::target_label_names(&job);
    let queries = all_queries();
    assert!(queries.len() > 20, "{queries:#?}");
    let checked = monitoring::check_queries(
        &queries,
        &exported_in_process(),
        &targets,
        &monitoring::PENDING,
    );
    for p in &checked.pending {
        eprintln!("PENDING {p}");
    }
    assert!(checked.errors.is_empty(), "{}", checked.errors.join("\n"));
    assert!(checked.selectors.len() >= queries.len());

    // A deliberately wrong name in a rule and in a panel fails, naming it.
    let mut d = dashboard();
    d["panels"][1]["targets"][0]["expr"] =
        json!("sum by (node) (rate(holdfast_holds_begun_total[5m]))");
    let mut r = rules();
    r["groups"][0]["rules"][3]["expr"] =
        json!("increase(holdfast_holds_released_total{result=\"deadline\"}[15m]) > 0");
    let mut wrong = monitoring::rule_queries(&r).expect("rules");
    wrong.extend(monitoring::dashboard_queries(&d).expect("dashboard"));
    let c = monitoring::check_queries(
        &wrong,
        &exported_in_process(),
        &targets,
        &monitoring::PENDING,
    );
    assert!(
        c.errors
            .iter()
            .any(|e| e.contains("holdfast_holds_begun_total is not exported")),
        "{:?}",
        c.errors
    );
    assert!(
        c.errors
            .iter()
            .any(|e| e.contains("has no label \"result\"")),
        "{:?}",
        c.errors
    );
}

/// The PENDING series, checked without their allowance: fails while any is not exported (mark
/// it `#[ignore]` while `PENDING` in tests/src/monitoring/mod.rs has entries; it is empty now).
#[test]
fn pending_series_are_exported() {
    let job = operator_scrape_job("node-1", "holdfast-agent-aaaaa", "127.0.0.1:15302");
    let checked = monitoring::check_queries(
        &all_queries(),
        &exported_in_process(),
        &scrape::target_label_names(&job),
        &[],
    );
    assert!(checked.errors.is_empty(), "{}", checked.errors.join("\n"));
}

/// The dashboard shows what the issue asks for: holds and releases per node, hold duration and
/// release latency histograms, drains by outcome and their duration, exit lag, Jobs, and each
/// agent's CPU, memory and open files per node.
#[test]
fn the_dashboard_covers_holds_drains_jobs_and_the_agents() {
    let queries = monitoring::dashboard_queries(&dashboard()).expect("queries");
    let names: BTreeSet<String> = queries
        .iter()
        .flat_map(|q| promql::names(&q.expr).expect("parse").selectors)
        .filter_map(|s| s.metric)
        .collect();
    for m in [
        "holdfast_holds_started_total",
        "holdfast_holds_released_total",
        "holdfast_hold_duration_seconds_bucket",
        "holdfast_hold_release_latency_seconds_bucket",
        "holdfast_drains_total",
        "holdfast_drain_duration_seconds_bucket",
        "holdfast_drain_exit_lag_seconds_bucket",
        "holdfast_jobs_total",
        "holdfast_pods",
        "holdfast_process_cpu_seconds_total",
        "holdfast_process_resident_memory_bytes",
        "holdfast_process_open_fds",
    ] {
        assert!(names.contains(m), "no panel reads {m}");
    }
    let d = dashboard();
    let heatmaps = d["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter(|p| p["type"] == "heatmap")
        .count();
    assert!(
        heatmaps >= 3,
        "hold duration, release latency and drain duration as heatmaps"
    );
    // Pod phases over time per node (issue 41): a state-timeline of holdfast_pods by node and
    // phase; the scenario below checks it reads real data from a real Prometheus.
    let timelines: Vec<&Value> = d["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter(|p| p["type"] == "state-timeline")
        .collect();
    assert_eq!(timelines.len(), 1, "one state-timeline of pod phases");
    let expr = timelines[0]["targets"][0]["expr"].as_str().expect("expr");
    assert!(
        expr.contains("holdfast_pods") && expr.contains("by (node, phase)"),
        "{expr}"
    );
    assert!(timelines[0]["targets"][0]["legendFormat"]
        .as_str()
        .is_some_and(|l| l.contains("{{node}}") && l.contains("{{phase}}")));
    // Per node: the node variable, and every per-node query filtered by it.
    for q in &queries {
        if q.origin.starts_with("panel") {
            assert!(
                q.expr.contains("$node"),
                "{}: not filtered by $node: {}",
                q.origin,
                q.expr
            );
        }
    }
}

// --- runbook -----------------------------------------------------------------------------------

/// Each alert links to a section of docs/operations.md named after it, which says what the
/// alert means, what to check (with a `holdfast status` command) and what to change; the
/// summary and description name the node (or say why not).
#[test]
fn every_alert_has_a_runbook_section() {
    let ops = read(&holdfast_tests::envoy::workspace_root().join("docs/operations.md"));
    let sections: BTreeMap<String, String> = ops
        .split("\n### ")
        .skip(1)
        .map(|s| {
            let (title, body) = s.split_once('\n').unwrap_or((s, ""));
            let body = body.split("\n## ").next().unwrap_or(body);
            (title.trim().to_string(), body.to_string())
        })
        .collect();
    for r in rules()["groups"][0]["rules"].as_array().expect("rules") {
        let name = r["alert"].as_str().expect("alert");
        let url = r["annotations"]["runbook_url"]
            .as_str()
            .expect("runbook_url");
        assert_eq!(
            url,
            format!(
                "https://github.com/holdfast-mesh/holdfast/blob/main/docs/operations.md#{}",
                name.to_lowercase()
            ),
            "{name}"
        );
        let body = sections
            .get(name)
            .unwrap_or_else(|| panic!("docs/operations.md has no `### {name}` section"));
        for part in ["**Means**", "**Check**", "**Change**", "Carries"] {
            assert!(
                body.contains(part),
                "{name}'s runbook has no {part}:\n{body}"
            );
        }
        if name != "HoldfastAgentsAbsent" {
            assert!(
                body.contains("holdfast status --node"),
                "{name}'s runbook names no holdfast status command"
            );
            // ... and the one for a pod's timeline (`holdfast status POD`).
            assert!(
                body.replace('\n', " ")
                    .contains("holdfast status --node NODE NAMESPACE/POD"),
                "{name}'s runbook names no `holdfast status --node NODE NAMESPACE/POD`"
            );
            for a in ["summary", "description"] {
                assert!(
                    r["annotations"][a]
                        .as_str()
                        .is_some_and(|s| s.contains("$labels.node")),
                    "{name}: its {a} does not name the node"
                );
            }
        }
    }
    assert_eq!(
        sections
            .keys()
            .filter(|k| k.starts_with("Holdfast"))
            .count(),
        alert_names().len()
    );
}

// --- a real Prometheus -------------------------------------------------------------------------

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The scrape job docs/install.md gives for Prometheus without the operator (the YAML block
/// after its marker), its Kubernetes SD replaced by static targets with the same SD labels.
fn docs_scrape_job(targets: &[scrape::ScrapeTarget]) -> Value {
    let install = read(&holdfast_tests::envoy::workspace_root().join("docs/install.md"));
    let marker = "<!-- scrape job, checked by tests/tests/monitoring.rs -->";
    let after = install
        .split_once(marker)
        .unwrap_or_else(|| panic!("docs/install.md has no {marker}"))
        .1;
    let block = after
        .split_once("```yaml\n")
        .and_then(|(_, b)| b.split_once("```"))
        .expect("a ```yaml block after the marker")
        .0;
    let v: Value = serde_saphyr::from_str(block).expect("the docs' scrape job is YAML");
    let mut job = v["scrape_configs"][0].clone();
    assert_eq!(
        job["job_name"], "holdfast",
        "the rules select job=\"holdfast\""
    );
    assert_eq!(job["kubernetes_sd_configs"][0]["role"], "pod");
    job.as_object_mut()
        .expect("a job")
        .remove("kubernetes_sd_configs");
    job["static_configs"] = Value::Array(
        targets
            .iter()
            .map(|t| json!({"targets": [t.address], "labels": t.sd_labels()}))
            .collect(),
    );
    job["scrape_interval"] = json!("1s");
    job
}

fn prometheus_config(jobs: &[Value], rules: bool) -> String {
    let mut c = json!({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": jobs,
    });
    if rules {
        c["rule_files"] = json!([monitoring::rules_file()]);
    }
    c.to_string()
}

/// Grafana's variables as a dashboard user with this node selected would send them.
fn grafana(expr: &str, node: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("${node}", node)
        .replace("$node", node)
}

/// A selector as PromQL (for asking Prometheus whether its series exist).
fn selector_text(s: &promql::Selector, node: &str) -> String {
    let m: Vec<String> = s
        .matchers
        .iter()
        .filter(|m| m.label != "__name__")
        .map(|m| {
            let v = m.value.clone().unwrap_or_else(|| node.to_string());
            format!("{}{}{:?}", m.label, m.op, v)
        })
        .collect();
    format!("{}{{{}}}", s.metric.as_deref().unwrap_or(""), m.join(","))
}

fn alerts(p: &Prometheus) -> Vec<(String, String, serde_json::Map<String, Value>)> {
    p.api("/api/v1/alerts").expect("alerts")["alerts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|a| {
            let labels = a["labels"].as_object().cloned().unwrap_or_default();
            (
                labels
                    .get("alertname")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                a["state"].as_str().unwrap_or("").to_string(),
                labels,
            )
        })
        .collect()
}

fn meshed(name: &str, after_sigterm: Duration, grace: Duration, drain: Duration) -> PodSpec {
    PodSpec::new(name)
        .app(AppScript::CallThroughShutdown {
            every: Duration::from_millis(200),
            pool: 2,
            after_sigterm,
        })
        .call_timeout(Duration::from_secs(10))
        .grace(grace)
        .drain(drain)
}

#[test]
fn a_real_prometheus_scrapes_a_real_agent_through_holds_drains_and_a_job() {
    let test = "a_real_prometheus_scrapes_a_real_agent_through_holds_drains_and_a_job";
    if !privileged(test) || prometheus::required(test, "prometheus").is_none() {
        return;
    }
    let t0 = Instant::now();
    let mut node = SimNode::for_test(
        "prom",
        NodeOptions {
            sim_app: Some(env!("CARGO_BIN_EXE_sim-app").into()),
            ..NodeOptions::default()
        },
    );
    let containerd = node.runtime() == Runtime::Containerd;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut flags = vec![];
    if !containerd {
        flags.extend(["--metrics-listen", listen.as_str()]);
    }
    let agent = AgentProcess::for_node_with(&node, &flags).expect("start the agent");
    // On the containerd backend the agent is the DaemonSet's pod: Prometheus scrapes its pod IP.
    let metrics_addr = match agent.pod_handle() {
        Some(p) => format!("{}:15302", p.pod_ip),
        None => listen.clone(),
    };
    let agent_pod = "holdfast-agent-sim01";
    let job = operator_scrape_job(node.node_name(), agent_pod, &metrics_addr);
    let prom = Prometheus::start("prom", &prometheus_config(std::slice::from_ref(&job), true))
        .expect("start Prometheus");
    // The docs' scrape job for clusters without the operator, in a second Prometheus (in one,
    // two jobs scraping one agent would double every sum).
    let objects = monitoring::render_install_with_monitoring().expect("render");
    let ds = monitoring::one_of(&objects, "DaemonSet").expect("DaemonSet");
    let targets = scrape::daemonset_targets(ds, agent_pod, node.node_name(), |p| {
        if p == "metrics" {
            metrics_addr.clone()
        } else {
            "127.0.0.1:1".into()
        }
    })
    .expect("targets");
    let plain = Prometheus::start(
        "prom-plain",
        &prometheus_config(&[docs_scrape_job(&targets)], false),
    )
    .expect("start the second Prometheus");
    eprintln!(
        "agent and two Prometheus servers up after {:?}",
        t0.elapsed()
    );

    // The agent is a target with the labels the rules and panels use.
    let up = prom
        .wait("the agent scraped", Duration::from_secs(15), |p| {
            let r = p.query("up{job=\"holdfast\"}")?;
            Ok((r.len() == 1 && r[0].1 == 1.0).then(|| r[0].0.clone()))
        })
        .expect("up");
    for (label, want) in [
        ("node", node.node_name()),
        ("pod", agent_pod),
        ("namespace", "holdfast-system"),
        ("container", "agent"),
        ("endpoint", "metrics"),
        ("instance", metrics_addr.as_str()),
    ] {
        assert_eq!(
            up.get(label).and_then(Value::as_str),
            Some(want),
            "{label}: {up:?}"
        );
    }
    let t = prom.api("/api/v1/targets").expect("targets");
    assert_eq!(t["activeTargets"].as_array().map(Vec::len), Some(1), "{t}");
    assert!(
        t["droppedTargets"]
            .as_array()
            .is_some_and(|d| !d.is_empty()),
        "the health port is dropped by the PodMonitor's port filter: {t}"
    );

    // The scenario: a held start, a hold released at its deadline, a drain that ends on
    // evidence, one at its deadline, one whose proxy went early, and a Job.
    let boot = |name: &str, late: Duration, app: AppScript| {
        PodSpec::new(name)
            .app(app)
            .proxy_delay(late)
            .call_timeout(Duration::from_secs(20))
    };
    let s = Duration::from_secs;
    node.add_pod(boot(
        "held",
        Duration::from_millis(500),
        AppScript::CallAtStart { calls: 1 },
    ))
    .expect("add");
    // Its own hold deadline (`holdfast.io/hold-timeout`), which its proxy (6 s late) misses;
    // the others keep the agent's 120 s (Envoy took up to 3 s to be ready on a loaded machine).
    node.add_pod(boot("late", Duration::from_secs(6), AppScript::Idle).hold_timeout(s(2)))
        .expect("add");
    node.add_pod(meshed("drained", Duration::from_millis(300), s(10), s(10)))
        .expect("add");
    node.add_pod(meshed("stuck", s(30), s(2), s(2)))
        .expect("add");
    node.add_pod(meshed("early", s(3), s(10), s(1)))
        .expect("add");
    node.add_pod(
        PodSpec::new("batch")
            .app(AppScript::Batch {
                calls: 1,
                exit_code: 0,
            })
            .app_init(s(1))
            .call_timeout(s(10))
            .job(),
    )
    .expect("add");
    node.start_pods().expect("start the pods");
    for pod in ["held", "late", "drained", "stuck", "early", "batch"] {
        agent
            .wait_hold_ended("default", pod, s(20))
            .unwrap_or_else(|e| panic!("{pod}: {e:#}"));
    }
    for pod in ["drained", "stuck", "early"] {
        node.wait_report(pod, s(30), "successful calls", |r| {
            r.calls(Phase::Running).ok >= 2
        })
        .expect("the app calls out through Envoy");
        node.delete_pod(pod).expect("delete");
    }
    node.wait_phase("batch", PodPhase::Succeeded, s(30))
        .expect("the Job completes");
    for pod in ["drained", "stuck", "early"] {
        node.wait_gone(pod, s(20))
            .expect("the deleted pod terminates");
    }
    // The agent's view, which the series must match.
    let rows = agent.status().expect("/status").pods;
    let row = |n: &str| {
        rows.iter()
            .find(|r| r.name == n)
            .unwrap_or_else(|| panic!("no row {n}"))
    };
    assert_eq!(
        row("late").hold.as_ref().and_then(|h| h.outcome),
        Some(HoldOutcome::Deadline)
    );
    assert_eq!(
        row("held").hold.as_ref().and_then(|h| h.outcome),
        Some(HoldOutcome::Ready)
    );
    let drain = |n: &str| row(n).drain.as_ref().map(|d| d.outcome);
    assert_eq!(drain("drained"), Some(DrainOutcome::AppDone));
    assert_eq!(drain("stuck"), Some(DrainOutcome::Deadline));
    assert_eq!(drain("early"), Some(DrainOutcome::ProxyGoneEarly));
    assert_eq!(
        row("batch").job.as_ref().map(|j| j.outcome),
        Some(JobOutcome::Completed)
    );
    let deadline_holds = rows
        .iter()
        .filter(|r| r.hold.as_ref().and_then(|h| h.outcome) == Some(HoldOutcome::Deadline))
        .count() as f64;
    let held: u64 = rows
        .iter()
        .filter_map(|r| r.hold.as_ref())
        .map(|h| h.connections_held)
        .sum();
    eprintln!("scenario done after {:?}", t0.elapsed());

    // Prometheus has every holdfast_* series the agent serves, with its value (the process
    // metrics move by themselves: present, not compared).
    let served = agent.get("/metrics").expect("/metrics");
    let samples: Vec<(String, f64)> = served
        .lines()
        .filter(|l| l.starts_with("holdfast_") && !l.starts_with("holdfast_process_"))
        .filter_map(|l| {
            let (sel, v) = l.rsplit_once(' ')?;
            Some((sel.to_string(), v.parse().ok()?))
        })
        .collect();
    assert!(samples.len() > 50, "{served}");
    prom.wait("Prometheus' values equal the agent's", s(15), |p| {
        for (sel, want) in &samples {
            let got = p.query(sel)?;
            if got.len() != 1 || got[0].1 != *want {
                return Err(anyhow::anyhow!("{sel}: agent {want}, Prometheus {got:?}"));
            }
        }
        Ok(Some(()))
    })
    .expect("scraped values");
    // The scenario's figures, as an operator would query them.
    let value = |q: &str| -> f64 {
        let r = prom.query(q).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(r.len(), 1, "{q}: {r:?}");
        r[0].1
    };
    let n = node.node_name();
    for (q, want) in [
        (
            format!("holdfast_holds_released_total{{node=\"{n}\",outcome=\"deadline\"}}"),
            deadline_holds,
        ),
        (
            format!("holdfast_drains_total{{node=\"{n}\",outcome=\"app-done\"}}"),
            1.0,
        ),
        (
            format!("holdfast_drains_total{{node=\"{n}\",outcome=\"deadline\"}}"),
            1.0,
        ),
        (
            format!("holdfast_drains_total{{node=\"{n}\",outcome=\"proxy-gone-early\"}}"),
            1.0,
        ),
        (
            format!("holdfast_jobs_total{{node=\"{n}\",outcome=\"completed\"}}"),
            1.0,
        ),
        (
            format!("holdfast_held_connections_total{{node=\"{n}\"}}"),
            held as f64,
        ),
        (
            format!("holdfast_drain_duration_seconds_count{{node=\"{n}\"}}"),
            3.0,
        ),
        (format!("holdfast_ready{{node=\"{n}\"}}"), 1.0),
        (
            format!("holdfast_pods_failed_open_total{{node=\"{n}\"}}"),
            0.0,
        ),
        // Native-sidecar tracking (issue 22): the series the sidecar-lost alert reads exists
        // from the start, and stays 0 on a node of classic pods; every pod here is classic.
        (
            format!("holdfast_drains_total{{node=\"{n}\",outcome=\"sidecar-lost\"}}"),
            0.0,
        ),
        (
            format!("holdfast_drains_total{{node=\"{n}\",outcome=\"kubelet-ordered\"}}"),
            0.0,
        ),
        (
            format!("sum(holdfast_pods{{node=\"{n}\",mode=\"native\"}})"),
            0.0,
        ),
    ] {
        assert_eq!(value(&q), want, "{q}");
    }
    assert!(deadline_holds >= 1.0 && held >= 1);
    assert!(
        value(&format!(
            "holdfast_process_cpu_seconds_total{{node=\"{n}\"}}"
        )) > 0.0
    );
    assert!(
        value(&format!(
            "holdfast_process_resident_memory_bytes{{node=\"{n}\"}}"
        )) > 1e6
    );

    // What the rules and panels name is exported by this agent (its real /metrics) ...
    let exported = Exported::parse(&served).expect("parse /metrics");
    let checked = monitoring::check_queries(
        &all_queries(),
        &exported,
        &scrape::target_label_names(&job),
        &monitoring::PENDING,
    );
    assert!(checked.errors.is_empty(), "{}", checked.errors.join("\n"));
    // ... and every selector finds its series in Prometheus (PENDING ones reported).
    let pending: BTreeSet<String> = checked.pending.iter().cloned().collect();
    for (origin, sel) in &checked.selectors {
        let text = selector_text(sel, n);
        let found = prom.query(&format!("count({text})")).expect("query");
        let is_pending = pending.iter().any(|p| {
            p.starts_with(&format!("{origin}:"))
                && sel.metric.as_deref().is_some_and(|m| p.contains(m))
        });
        if is_pending {
            assert!(
                found.is_empty(),
                "{origin}: {text} exists now: remove it from PENDING"
            );
            eprintln!("PENDING {origin}: {text}");
            continue;
        }
        assert!(!found.is_empty(), "{origin}: no series for {text}");
    }
    // Every panel shows data for this node (a finite value; rates over the last minute).
    for q in monitoring::dashboard_queries(&dashboard()).expect("dashboard") {
        let expr = grafana(&q.expr, n);
        let r = prom
            .query(&expr)
            .unwrap_or_else(|e| panic!("{}: {e:#}", q.origin));
        assert!(
            r.iter().any(|(_, v)| v.is_finite()),
            "{}: no data for {expr}: {r:?}",
            q.origin
        );
    }

    // The alerts: the three this scenario must raise fire (their `for` is 0), carrying the
    // node; nothing else is pending or firing.
    let want: BTreeSet<(String, Option<String>)> = [
        ("HoldfastHoldFailedOpen", Some("deadline")),
        ("HoldfastDrainDeadline", None),
        ("HoldfastProxyGoneEarly", None),
    ]
    .into_iter()
    .map(|(a, o)| (a.to_string(), o.map(String::from)))
    .collect();
    let firing = prom
        .wait("the scenario's alerts", s(15), |p| {
            let a = alerts(p);
            let got: BTreeSet<(String, Option<String>)> = a
                .iter()
                .map(|(name, _, l)| {
                    (
                        name.clone(),
                        l.get("outcome").and_then(Value::as_str).map(String::from),
                    )
                })
                .collect();
            let all_firing = a.iter().all(|(_, state, _)| state == "firing");
            Ok((got == want && all_firing).then_some(a))
        })
        .expect("alerts");
    for (name, _, labels) in &firing {
        assert_eq!(
            labels.get("node").and_then(Value::as_str),
            Some(n),
            "{name}: {labels:?}"
        );
    }

    // The docs' scrape job (no operator) gives the agent the same labels.
    let plain_up = plain
        .wait("the docs' job scrapes the agent", s(15), |p| {
            let r = p.query("up{job=\"holdfast\"}")?;
            Ok((r.len() == 1 && r[0].1 == 1.0).then(|| r[0].0.clone()))
        })
        .expect("up");
    let mut operator_labels = up.clone();
    operator_labels.remove("endpoint");
    assert_eq!(
        plain_up, operator_labels,
        "the docs' job and the PodMonitor label the agent alike"
    );
    let pt = plain.api("/api/v1/targets").expect("targets");
    assert_eq!(
        pt["activeTargets"].as_array().map(Vec::len),
        Some(1),
        "{pt}"
    );

    // The remaining pods go while the agent runs (it drains them at once).
    for pod in ["held", "late", "batch"] {
        node.delete_pod(pod).expect("delete");
    }
    for pod in ["held", "late", "batch"] {
        node.wait_gone(pod, s(40)).expect("gone");
    }

    // An agent that dies is `up == 0`: HoldfastAgentDown pending (its `for` is 5 minutes) with
    // the node and the agent's pod.
    drop(agent);
    let down = prom
        .wait("HoldfastAgentDown pending", s(15), |p| {
            Ok(alerts(p)
                .into_iter()
                .find(|(name, state, _)| name == "HoldfastAgentDown" && state == "pending"))
        })
        .expect("agent down");
    assert_eq!(down.2.get("node").and_then(Value::as_str), Some(n));
    assert_eq!(down.2.get("pod").and_then(Value::as_str), Some(agent_pod));
    eprintln!("done after {:?}", t0.elapsed());

    drop(prom);
    drop(plain);
    let left = node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
}
