//! `holdfast check` (`kubectl holdfast check`): the cluster read for what makes holdfast silently
//! do less, each finding with a stable code (docs/check-codes.md lists every code, what it
//! means and the fix), the objects it names, and the fix. Errors make the command exit 1, so it
//! can gate a pipeline; warnings are printed and leave the exit code 0.
//!
//! `findings` is a pure function of what `super::cluster::gather` read: the nodes, the agent
//! pods, the agent namespace's ResourceQuotas and every agent's `/status` rows.

use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::cluster::ClusterView;
pub use super::remote::{client, AGENT_NAMESPACE};
use crate::api::{DrainOutcome, HoldOutcome, NodeStatus, PodStatus, StartupTaint};

/// The first Envoy whose `inboundonly&graceful` drain leaves outbound alone (envoyproxy/envoy
/// #37873): the agent's `lifecycle::drain::envoy_version::INBOUND_ONLY_GRACEFUL_FIXED`, which
/// the CLI may not link (tests/layout.rs); a unit test keeps the two equal.
pub(crate) const DIRECTIONAL_DRAIN_SINCE: (u32, u32) = (1, 34);

/// Words both of the drain's advices about missing byte counters say (the agent's
/// `mesh::unexposed_bytes_advice` and `mesh::unseen_advice`; a unit test keeps them saying it).
pub(crate) const BYTE_COUNTERS_ADVICE_MARK: &str = "not keep its downstream byte counters";

/// `major.minor` of a report's Envoy version (`1.36.4`, `1.37.0-dev`).
fn major_minor(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.split('.').map(|p| {
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u32>().ok()
    });
    Some((parts.next()??, parts.next()??))
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Severity {
    /// holdfast does nothing where it should: `check` exits 1.
    Error,
    /// holdfast does less than it could, or something needs a look.
    Warning,
}

impl Severity {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// Every code `check` can report, its severity and a one-line title (docs/check-codes.md has
/// one section per code; tests check the two agree).
pub(crate) const CODES: &[(&str, Severity, &str)] = &[
    (
        "HF0101",
        Severity::Error,
        "a Linux node without a Ready holdfast agent",
    ),
    (
        "HF0102",
        Severity::Warning,
        "an agent whose status could not be read",
    ),
    (
        "HF0103",
        Severity::Error,
        "GKE without the ResourceQuota for the agent's priority class",
    ),
    (
        "HF0104",
        Severity::Warning,
        "the cluster could not be read completely",
    ),
    (
        "HF0105",
        Severity::Warning,
        "a node without a Ready agent and without the startup taint: meshed pods land there unprotected",
    ),
    (
        "HF0106",
        Severity::Warning,
        "a new node's first agent found no startup taint: the node pool does not set it",
    ),
    (
        "HF0201",
        Severity::Warning,
        "a pod's hold ran to its deadline (failed open) in the last hour",
    ),
    (
        "HF0202",
        Severity::Warning,
        "a pod's hold failed (traffic passed unheld) in the last hour",
    ),
    (
        "HF0203",
        Severity::Warning,
        "a sidecar without the holdfast filter (its stats absent)",
    ),
    (
        "HF0204",
        Severity::Warning,
        "a sidecar's Envoy older than 1.34: its inbound drain also drains outbound",
    ),
    (
        "HF0205",
        Severity::Warning,
        "the mesh's stats matcher drops the byte counters holdfast reads",
    ),
    (
        "HF0206",
        Severity::Warning,
        "a proxy exited before its app: the mesh's drain duration is too short",
    ),
    (
        "HF0207",
        Severity::Warning,
        "an agent rejected entries of its pod source",
    ),
];

/// The agent's startup taint (the agent's `effects::node_taint::STARTUP_TAINT_KEY`, which the
/// CLI may not link; a unit test keeps the two equal).
pub(crate) const STARTUP_TAINT_KEY: &str = "holdfast.io/agent-not-ready";

/// How far back rows count for the "in the last hour" findings.
pub(crate) const RECENT: Duration = Duration::from_secs(3600);

/// An agent pod started this soon after its node joined is the node's first (HF0106): the
/// DaemonSet's pod is created as the node registers, and the kubelet takes it once the node is
/// Ready (seconds; minutes with a slow image pull).
pub(crate) const FIRST_AGENT_WINDOW: Duration = Duration::from_secs(10 * 60);

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Finding {
    pub code: &'static str,
    pub severity: Severity,
    /// The objects it is about, as `kind/namespace/name` or `kind/name`.
    pub objects: Vec<String>,
    /// What is wrong.
    pub message: String,
    /// What to do.
    pub fix: String,
}

fn severity_of(code: &str) -> Severity {
    CODES
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, s, _)| *s)
        .expect("every code used is in CODES")
}

fn finding(code: &'static str, objects: Vec<String>, message: String, fix: String) -> Finding {
    Finding {
        code,
        severity: severity_of(code),
        objects,
        message,
        fix,
    }
}

/// Everything wrong in `view`, errors first, then by code and object.
pub(crate) fn findings(view: &ClusterView, now: SystemTime) -> Vec<Finding> {
    let mut out = Vec::new();
    let ns = &view.namespace;
    for problem in &view.problems {
        out.push(finding(
            "HF0104",
            vec![],
            format!("part of the cluster could not be read: {problem}"),
            "grant the reader roles (ClusterRole holdfast-cluster-reader, Role holdfast-status-reader; docs/check-codes.md) and run check again: findings that need it were not looked for".into(),
        ));
    }

    // HF0101: every Linux node has a Ready agent.
    for node in view.nodes.iter().filter(|n| n.linux) {
        let agents: Vec<_> = view
            .agents
            .iter()
            .filter(|a| a.node.as_deref() == Some(node.name.as_str()))
            .collect();
        if agents.iter().any(|a| a.ready) {
            continue;
        }
        let mut objects = vec![format!("node/{}", node.name)];
        let (message, fix) = match agents.first() {
            None => (
                format!(
                    "node {} has no holdfast agent pod: meshed pods starting or stopping there get no hold, drain or Job completion",
                    node.name
                ),
                format!(
                    "kubectl -n {ns} describe daemonset holdfast-agent (its events say why no pod was created: a taint it does not tolerate, its nodeSelector kubernetes.io/os=linux, or on GKE a missing ResourceQuota, HF0103)"
                ),
            ),
            Some(a) => {
                objects.push(format!("pod/{ns}/{}", a.name));
                (
                    format!(
                        "the holdfast agent {ns}/{} on node {} is not Ready (phase {}{})",
                        a.name,
                        node.name,
                        a.phase,
                        a.waiting_reason
                            .as_deref()
                            .map(|r| format!(", {r}"))
                            .unwrap_or_default()
                    ),
                    format!(
                        "kubectl -n {ns} describe pod {} and kubectl -n {ns} logs {} (docs/operations.md, HoldfastAgentDown)",
                        a.name, a.name
                    ),
                )
            }
        };
        out.push(finding("HF0101", objects, message, fix.clone()));
        // Without the startup taint nothing keeps meshed pods off the node until its agent is
        // Ready (docs/install.md, "New nodes"). A node whose agent is Ready no longer carries it
        // either way, so only nodes without a Ready agent tell whether their pool sets it.
        let tainted = node.taints.iter().any(|t| {
            t.starts_with(&format!("{STARTUP_TAINT_KEY}="))
                || t.starts_with(&format!("{STARTUP_TAINT_KEY}:"))
        });
        if !tainted {
            out.push(finding(
                "HF0105",
                vec![format!("node/{}", node.name)],
                format!(
                    "node {} has no Ready holdfast agent and no startup taint {STARTUP_TAINT_KEY}: the scheduler places meshed pods there, which start without a hold",
                    node.name
                ),
                "give the node pool the startup taint holdfast.io/agent-not-ready=true:NoSchedule (docs/install.md, \"New nodes: the startup taint\"; the chart's NOTES.txt prints your platform's setting)".into(),
            ));
        }
    }

    // HF0106: the startup taint is not configured on a node pool. What the API shows of a node
    // whose agent is Ready is the same whether its pool set the taint (the agent removed it) or
    // not; the agent says which it found. `not-there` means the pool does not set it only when
    // this agent was the node's first: no restart (a restarted agent finds the taint its earlier
    // run removed) and started within FIRST_AGENT_WINDOW of the node joining (a later pod is a
    // DaemonSet rollout or an install on an existing node).
    for answer in &view.answers {
        let Ok(status) = &answer.result else { continue };
        if status.startup_taint != Some(StartupTaint::NotThere) {
            continue;
        }
        let Some(agent) = view.agents.iter().find(|a| a.name == answer.pod) else {
            continue;
        };
        let Some(node) = view.nodes.iter().find(|n| n.name == answer.node) else {
            continue;
        };
        let first = match (agent.started, node.created) {
            (Some(started), Some(created)) => {
                agent.restarts == 0
                    && started
                        .duration_since(created)
                        .is_ok_and(|d| d <= FIRST_AGENT_WINDOW)
            }
            _ => false,
        };
        if first {
            out.push(finding(
                "HF0106",
                vec![format!("node/{}", node.name), format!("pod/{ns}/{}", agent.name)],
                format!(
                    "node {} joined without the startup taint {STARTUP_TAINT_KEY} (its first agent, {}, found none): until an agent is Ready on a new node of this pool, the scheduler places meshed pods there and they start without a hold",
                    node.name, agent.name
                ),
                "give the node pool the startup taint holdfast.io/agent-not-ready=true:NoSchedule (docs/install.md, \"New nodes: the startup taint\"; the chart's NOTES.txt prints your platform's setting)".into(),
            ));
        }
    }

    // HF0102: agents whose status could not be read.
    for answer in &view.answers {
        if let Err(why) = &answer.result {
            // A not-running agent is HF0101 already.
            let running = view
                .agents
                .iter()
                .any(|a| a.name == answer.pod && a.phase == "Running");
            if !running {
                continue;
            }
            out.push(finding(
                "HF0102",
                vec![format!("node/{}", answer.node), format!("pod/{ns}/{}", answer.pod)],
                format!(
                    "the agent on node {} did not give its status: {why}; the pod findings (HF02xx) for that node were not looked for",
                    answer.node
                ),
                format!(
                    "holdfast status --node {} (the same read, alone); kubectl -n {ns} logs {}",
                    answer.node, answer.pod
                ),
            ));
        }
    }

    // HF0103: GKE admits system-node-critical pods outside kube-system only under a quota.
    if let Some(quotas) = &view.quotas {
        let gke: Vec<_> = view.nodes.iter().filter(|n| n.gke).collect();
        let admitted = quotas.iter().any(|q| {
            q.priority_classes
                .iter()
                .any(|c| c == "system-node-critical")
        });
        if !gke.is_empty() && !admitted {
            out.push(finding(
                "HF0103",
                vec![
                    format!("namespace/{ns}"),
                    format!("daemonset/{ns}/holdfast-agent"),
                ],
                format!(
                    "GKE ({} node(s), e.g. {}) admits pods of the priority class system-node-critical outside kube-system only under a ResourceQuota for that class, and {ns} has none: the DaemonSet cannot create the agent's pods",
                    gke.len(),
                    gke[0].name
                ),
                format!(
                    "kubectl apply -f manifests/agent/resourcequota.yaml (namespace {ns}), or helm upgrade ... --set resourceQuota.enabled=true"
                ),
            ));
        }
    }

    // HF02xx: from the agents' rows.
    for answer in &view.answers {
        if let Ok(status) = &answer.result {
            pod_findings(&answer.node, status, now, &mut out);
        }
    }

    out.sort_by(|a, b| (a.severity, a.code, &a.objects).cmp(&(b.severity, b.code, &b.objects)));
    out
}

fn recent(t: Option<SystemTime>, now: SystemTime) -> bool {
    t.is_some_and(|t| now.duration_since(t).map_or(true, |ago| ago <= RECENT))
}

fn pod_ref(p: &PodStatus) -> String {
    format!("pod/{}/{}", p.namespace, p.name)
}

fn timeline_fix(node: &str, p: &PodStatus) -> String {
    format!(
        "holdfast status --node {node} {}/{} (its timeline says what the proxy was doing)",
        p.namespace, p.name
    )
}

fn pod_findings(node: &str, status: &NodeStatus, now: SystemTime, out: &mut Vec<Finding>) {
    for p in &status.pods {
        if let Some(h) = &p.hold {
            let when = h.released_at.or(h.started_at);
            match h.outcome {
                Some(HoldOutcome::Deadline) if recent(when, now) => out.push(finding(
                    "HF0201",
                    vec![pod_ref(p), format!("node/{node}")],
                    format!(
                        "{}/{}'s proxy was not ready by the hold deadline: its held connections were let through unready (failed open)",
                        p.namespace, p.name
                    ),
                    format!(
                        "{}; if its proxy is slow to get config, raise the agent's --hold-deadline (agent.extraArgs in the chart)",
                        timeline_fix(node, p)
                    ),
                )),
                Some(HoldOutcome::Failed) if recent(when, now) => out.push(finding(
                    "HF0202",
                    vec![pod_ref(p), format!("node/{node}")],
                    format!(
                        "{}/{}'s hold could not be set up or released cleanly: its connections went as without holdfast{}",
                        p.namespace,
                        p.name,
                        p.last_error
                            .as_deref()
                            .map(|e| format!(" ({e})"))
                            .unwrap_or_default()
                    ),
                    format!(
                        "{}; the agent's log on node {node} has the error",
                        timeline_fix(node, p)
                    ),
                )),
                _ => {}
            }
        }
        let Some(d) = &p.drain else { continue };
        let mesh = p.mesh.unwrap_or_default();
        // A mesh that cannot take the filter has no fix for it: its absence there is expected.
        if let (Some(false), Some(fix)) = (d.filter_present, mesh.filter_install_fix()) {
            out.push(finding(
                "HF0203",
                vec![pod_ref(p), format!("node/{node}")],
                format!(
                    "{}/{}'s {mesh} sidecar had no holdfast filter stats when it drained: the filter is not loaded there, so the drain cannot count connections in flight",
                    p.namespace, p.name
                ),
                fix.into(),
            ));
        }
        if let Some(v) = d.envoy_version.as_deref() {
            if major_minor(v).is_some_and(|mm| mm < DIRECTIONAL_DRAIN_SINCE) {
                out.push(finding(
                    "HF0204",
                    vec![pod_ref(p), format!("node/{node}")],
                    format!(
                        "{}/{}'s Envoy is {v}: before 1.34 the inbound drain (drain_listeners?inboundonly&graceful) drains outbound too, so the app's outbound keep-alives are closed while it shuts down (envoyproxy/envoy#37873)",
                        p.namespace, p.name
                    ),
                    mesh.envoy_1_34_fix().into(),
                ));
            }
        }
        let said = |advice: &str| {
            d.advice.as_deref().is_some_and(|a| a.contains(advice))
                || d.errors.iter().any(|e| e.contains(advice))
        };
        if said(BYTE_COUNTERS_ADVICE_MARK) {
            out.push(finding(
                "HF0205",
                vec![pod_ref(p), format!("node/{node}")],
                format!(
                    "{}/{}'s drain could not tell an idle connection from traffic in flight: Envoy does not keep the downstream byte counters (the mesh's stats matcher drops them), so the proxy was left to the mesh's own drain",
                    p.namespace, p.name
                ),
                "add inclusionSuffixes downstream_cx_rx_bytes_total, downstream_cx_tx_bytes_total, downstream_cx_tx_bytes_buffered to meshConfig.defaultConfig.proxyStatsMatcher (manifests/mesh-config; docs/install.md, \"The mesh config change, and why\")".into(),
            ));
        }
        if d.outcome == DrainOutcome::ProxyGoneEarly && recent(Some(d.started_at), now) {
            out.push(finding(
                "HF0206",
                vec![pod_ref(p), format!("node/{node}")],
                format!(
                    "{}/{}'s proxy exited while its app still ran: the app's last calls had no mesh{}",
                    p.namespace,
                    p.name,
                    d.advice
                        .as_deref()
                        .map(|a| format!(" ({a})"))
                        .unwrap_or_default()
                ),
                "set the mesh's terminationDrainDuration to the pods' grace period (manifests/mesh-config; docs/install.md, \"The mesh config change, and why\")".into(),
            ));
        }
    }
    for sp in &status.source_problems {
        out.push(finding(
            "HF0207",
            vec![format!("node/{node}")],
            format!(
                "the agent on node {node} rejected {}: {}",
                sp.entry, sp.problem
            ),
            format!("holdfast status --node {node} lists them; fix the object named"),
        ));
    }
}

/// The findings as text: one block per finding, then a summary line.
pub(crate) fn render_text(findings: &[Finding], view: &ClusterView) -> String {
    let mut out = String::new();
    for f in findings {
        out.push_str(&format!(
            "{} {:<7} {}\n",
            f.code,
            f.severity.as_str(),
            if f.objects.is_empty() {
                "(cluster)".to_string()
            } else {
                f.objects.join(" ")
            }
        ));
        out.push_str(&format!(
            "  {}\n",
            super::table::escape_controls(&f.message)
        ));
        out.push_str(&format!(
            "  fix: {}\n",
            super::table::escape_controls(&f.fix)
        ));
    }
    let errors = findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .count();
    let answered = view.answers.iter().filter(|a| a.result.is_ok()).count();
    out.push_str(&format!(
        "{} error(s), {} warning(s); {} node(s), {} agent(s), {} answered (docs/check-codes.md)\n",
        errors,
        findings.len() - errors,
        view.nodes.len(),
        view.answers.len(),
        answered
    ));
    out
}

/// The exit code for `findings`: 1 with any error, else 0.
pub(crate) fn exit_code(findings: &[Finding]) -> i32 {
    i32::from(findings.iter().any(|f| f.severity == Severity::Error))
}

/// `holdfast check`'s options.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// The agent's namespace.
    pub namespace: String,
    /// `-o json`: the findings as a JSON document.
    pub json: bool,
    pub fan_out: super::cluster::FanOut,
}

/// Exit code when the cluster cannot be read at all (no kubeconfig, the agents not listable).
pub(crate) const EXIT_UNREADABLE: i32 = 3;

/// Runs the check against `client`: the text (or JSON) to print and the exit code (0 clean or
/// warnings only, 1 errors, `EXIT_UNREADABLE` when the agents cannot even be listed).
pub async fn run(client: &kube::Client, opts: &CheckOptions, now: SystemTime) -> (String, i32) {
    let view = match super::cluster::gather(client, &opts.namespace, opts.fan_out).await {
        Ok(v) => v,
        Err(e) => return (format!("holdfast check: {e}\n"), EXIT_UNREADABLE),
    };
    let found = findings(&view, now);
    let code = exit_code(&found);
    let text = if opts.json {
        let doc = serde_json::json!({
            "findings": found,
            "nodes": view.nodes.len(),
            "agents": view.answers.len(),
            "answered": view.answers.iter().filter(|a| a.result.is_ok()).count(),
        });
        let mut t = serde_json::to_string_pretty(&doc).unwrap_or_default();
        t.push('\n');
        t
    } else {
        render_text(&found, &view)
    };
    (text, code)
}

#[cfg(test)]
mod tests;
