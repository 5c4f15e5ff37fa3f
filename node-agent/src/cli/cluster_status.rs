//! `kubectl holdfast status` (`holdfast status --all-nodes`): every agent's rows in one table,
//! with a node column. The agents are read as `super::cluster::read_agents` reads them
//! (port-forwards, bounded concurrency, a deadline per agent); an agent that does not answer,
//! or is not running, is a row saying so, never left out, and whatever filter is given. With
//! `list nodes` allowed, a Linux node without an agent pod is a row too.

use std::time::SystemTime;

use serde::Serialize;

use super::cluster::{self, AgentAnswer, FanOut};
use super::remote::RemoteError;
use super::table::{end_cell, escape_controls, fit_end, held_cell, phase_label, release_cell};
use crate::api::{Mesh, NodeStatus, Phase, PodStatus};

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Table,
    /// More columns: sidecar mode, release time, the Envoy version a drain saw, the last error.
    Wide,
    Json,
}

/// What to show.
#[derive(Debug, Clone, Default)]
pub struct Filters {
    /// `-n`: pods of this namespace.
    pub namespace: Option<String>,
    /// `--node`: only this node's agent is read.
    pub node: Option<String>,
    /// `--phase`.
    pub phase: Option<Phase>,
    /// `--mesh`.
    pub mesh: Option<Mesh>,
    /// `-l`: a label selector, matched by the API server (`select_pods`).
    pub selector: Option<String>,
}

/// The pods `-l` selected, by uid (the agents' rows carry no labels).
pub(crate) type Selected = std::collections::HashSet<String>;

impl Filters {
    fn keeps(&self, p: &PodStatus, selected: Option<&Selected>) -> bool {
        self.namespace.as_deref().is_none_or(|n| n == p.namespace)
            && self.phase.is_none_or(|ph| ph == p.phase)
            && self.mesh.is_none_or(|m| Some(m) == p.mesh)
            && selected.is_none_or(|s| s.contains(&p.uid.to_ascii_lowercase()))
    }
}

/// The uids of the pods `filters.selector` matches (in `filters.namespace`, or every namespace),
/// listed by the API server, which parses and matches the selector as `kubectl get -l` does;
/// `None` without `-l`.
pub(crate) async fn select_pods(
    client: &kube::Client,
    filters: &Filters,
) -> Result<Option<Selected>, RemoteError> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, ListParams};
    let Some(selector) = filters.selector.as_deref() else {
        return Ok(None);
    };
    let (pods, scope): (Api<Pod>, String) = match filters.namespace.as_deref() {
        Some(ns) => (Api::namespaced(client.clone(), ns), format!("in {ns}")),
        None => (Api::all(client.clone()), "in every namespace".to_string()),
    };
    // Only the metadata is needed; a page at a time keeps a large cluster's answer bounded.
    let mut selected = Selected::new();
    let mut params = ListParams::default().labels(selector).limit(500);
    loop {
        let list = pods.list_metadata(&params).await.map_err(|e| {
            cluster::list_error(
                e,
                &format!("list pods {scope} with -l {selector:?}"),
                "`list pods` for your kubeconfig (-n NAMESPACE narrows it to one namespace)",
            )
        })?;
        selected.extend(
            list.items
                .iter()
                .filter_map(|p| p.metadata.uid.as_deref())
                .map(str::to_ascii_lowercase),
        );
        match list.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    Ok(Some(selected))
}

/// Parses `--phase` (the `/status` names: `holding`, `ready`, `waiting-for-netns`...).
pub fn parse_phase(s: &str) -> Result<Phase, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).map_err(|_| {
        format!("unknown phase {s:?}: one of waiting-for-netns, holding, ready, draining, quitting, done, skipped")
    })
}

/// Parses `--mesh`.
pub fn parse_mesh(s: &str) -> Result<Mesh, String> {
    Mesh::ALL
        .into_iter()
        .find(|m| m.as_str() == s)
        .ok_or_else(|| {
            let names: Vec<&str> = Mesh::ALL.iter().map(|m| m.as_str()).collect();
            format!("unknown mesh {s:?}: one of {}", names.join(", "))
        })
}

/// One node's part of the cluster view.
#[derive(Debug, Clone, Serialize)]
pub struct NodeRows {
    pub node: String,
    /// The agent pod read (`None`: the node has none).
    pub agent: Option<String>,
    /// Why its rows are missing (unreachable, not running, no agent).
    pub error: Option<String>,
    /// Its pods after the filters.
    pub pods: Vec<PodStatus>,
    #[serde(skip)]
    pub agent_version: Option<String>,
}

/// Reads the cluster: the agents (one per node; only `--node`'s with that filter), each
/// agent's status, and (if allowed) the nodes, to show those without an agent. Fails only when
/// the agents cannot be listed.
pub async fn gather(
    client: &kube::Client,
    agent_namespace: &str,
    filters: &Filters,
    fan: FanOut,
) -> Result<Vec<NodeRows>, RemoteError> {
    let mut agents = cluster::list_agents(client, agent_namespace).await?;
    if let Some(n) = &filters.node {
        agents.retain(|a| a.node.as_deref() == Some(n.as_str()));
    }
    // Nodes without an agent: shown when nodes may be listed (ClusterRole
    // holdfast-cluster-reader); without it the table shows the agents only.
    let nodes = cluster::list_nodes(client).await.unwrap_or_default();
    let selected = select_pods(client, filters).await?;
    let answers = cluster::read_agents(client, agent_namespace, &agents, fan).await;
    Ok(rows(answers, &nodes, &agents, filters, selected.as_ref()))
}

/// The rows of `answers` after `filters`, plus a row for each Linux node of `nodes` without an
/// agent pod in `agents`; by node name.
pub(crate) fn rows(
    answers: Vec<AgentAnswer>,
    nodes: &[cluster::NodeInfo],
    agents: &[cluster::AgentPod],
    filters: &Filters,
    selected: Option<&Selected>,
) -> Vec<NodeRows> {
    let mut out: Vec<NodeRows> = answers
        .into_iter()
        .map(|a| match a.result {
            Ok(status) => NodeRows {
                node: a.node,
                agent: Some(a.pod),
                error: None,
                agent_version: Some(status.agent_version.clone()),
                pods: status
                    .pods
                    .into_iter()
                    .filter(|p| filters.keeps(p, selected))
                    .collect(),
            },
            Err(why) => NodeRows {
                node: a.node,
                agent: Some(a.pod),
                error: Some(why),
                agent_version: None,
                pods: vec![],
            },
        })
        .collect();
    for n in nodes.iter().filter(|n| n.linux) {
        if filters.node.as_deref().is_some_and(|f| f != n.name) {
            continue;
        }
        if !agents
            .iter()
            .any(|a| a.node.as_deref() == Some(n.name.as_str()))
        {
            out.push(NodeRows {
                node: n.name.clone(),
                agent: None,
                error: Some("no holdfast agent pod on this node".into()),
                agent_version: None,
                pods: vec![],
            });
        }
    }
    out.sort_by(|a, b| a.node.cmp(&b.node));
    out
}

fn cell(s: &str, width: usize) -> String {
    format!("{:<width$}", fit_end(&escape_controls(s), width))
}

/// The table (or wide table, or JSON) of `rows`.
pub(crate) fn render(rows: &[NodeRows], output: Output, now: SystemTime) -> String {
    if output == Output::Json {
        let mut s = serde_json::to_string_pretty(rows).unwrap_or_default();
        s.push('\n');
        return s;
    }
    let wide = output == Output::Wide;
    let mut out = String::new();
    let mut header = format!(
        "{} {} {} {} {} {}",
        cell("NODE", 16),
        cell("POD", 34),
        cell("MESH", 6),
        cell("PHASE", 9),
        cell("HELD", 11),
        "END"
    );
    if wide {
        header = format!(
            "{} {} {} {} {} {} {} {} {} {}",
            cell("NODE", 20),
            cell("POD", 44),
            cell("MESH", 6),
            cell("MODE", 7),
            cell("PHASE", 17),
            cell("HELD", 11),
            cell("RELEASE", 8),
            cell("END", 24),
            cell("ENVOY", 8),
            "ERROR"
        );
    }
    out.push_str(header.trim_end());
    out.push('\n');
    let (mut pods, mut unanswered) = (0, 0);
    for r in rows {
        if let Some(why) = &r.error {
            unanswered += 1;
            let what = match &r.agent {
                Some(a) => format!("agent {a}: {why}"),
                None => why.clone(),
            };
            let line = format!(
                "{} {} {}",
                cell(&r.node, if wide { 20 } else { 16 }),
                cell("-", if wide { 44 } else { 34 }),
                escape_controls(&what)
            );
            out.push_str(line.trim_end());
            out.push('\n');
            continue;
        }
        for p in &r.pods {
            pods += 1;
            let pod = format!("{}/{}", p.namespace, p.name);
            let mesh = p.mesh.map(|m| m.as_str()).unwrap_or("-");
            let line = if wide {
                format!(
                    "{} {} {} {} {} {} {} {} {} {}",
                    cell(&r.node, 20),
                    cell(&pod, 44),
                    cell(mesh, 6),
                    cell(p.mode.map(|m| m.as_str()).unwrap_or("-"), 7),
                    cell(p.phase.as_str(), 17),
                    cell(&held_cell(p.hold.as_ref(), now), 11),
                    cell(&release_cell(p.hold.as_ref()), 8),
                    cell(&end_cell(p), 24),
                    cell(
                        p.drain
                            .as_ref()
                            .and_then(|d| d.envoy_version.as_deref())
                            .unwrap_or("-"),
                        8
                    ),
                    escape_controls(
                        p.last_error
                            .as_deref()
                            .or(p.skipped_reason.as_deref())
                            .unwrap_or("-")
                    )
                    .replace('\n', " ")
                )
            } else {
                format!(
                    "{} {} {} {} {} {}",
                    cell(&r.node, 16),
                    cell(&pod, 34),
                    cell(mesh, 6),
                    cell(phase_label(p.phase), 9),
                    cell(&held_cell(p.hold.as_ref(), now), 11),
                    escape_controls(&end_cell(p))
                )
            };
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out.push_str(&format!(
        "{pods} pod(s) on {} node(s); {unanswered} node(s) without an answer\n",
        rows.len()
    ));
    out
}

/// `kubectl holdfast status`'s options.
#[derive(Debug, Clone)]
pub struct ClusterStatusOptions {
    pub agent_namespace: String,
    pub filters: Filters,
    pub output: Output,
    pub watch: bool,
    pub fan_out: FanOut,
    /// `POD`: that pod's timeline, from whichever node's agent has it.
    pub pod: Option<String>,
    /// `--svg FILE`: write `POD`'s timeline there as a picture ([`super::svg`]).
    pub svg: Option<std::path::PathBuf>,
}

/// How often `--watch` reads the cluster again.
pub(crate) const WATCH_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs `kubectl holdfast status`, writing to `out`; the exit code (as `holdfast status`'s
/// [`super::status::EXIT_CODES`]).
pub fn run(opts: &ClusterStatusOptions, out: &mut impl std::io::Write) -> i32 {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("holdfast status: starting the runtime: {e}");
            return 1;
        }
    };
    let remote_code = |e: &RemoteError| match e {
        RemoteError::Config(_) => 2,
        RemoteError::Forbidden { .. } => 6,
        _ => 3,
    };
    let client = match rt.block_on(super::remote::client()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("holdfast status: {e}");
            return remote_code(&e);
        }
    };
    let selector = match opts.pod.as_deref().map(super::timeline::PodSelector::parse) {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err(why)) => {
            eprintln!(
                "holdfast status: POD {:?}: {why}",
                opts.pod.as_deref().unwrap_or("")
            );
            return 2;
        }
    };
    loop {
        let started = std::time::Instant::now();
        let read = rt.block_on(gather(
            &client,
            &opts.agent_namespace,
            &opts.filters,
            opts.fan_out,
        ));
        let text = match read {
            Err(e) if !opts.watch => {
                eprintln!("holdfast status: {e}");
                return remote_code(&e);
            }
            Err(e) => format!("{e}\n"),
            Ok(rows) => match &selector {
                None => render(&rows, opts.output, SystemTime::now()),
                Some(sel) => {
                    let found = rows
                        .iter()
                        .find_map(|r| r.pods.iter().find(|p| sel.matches(p)).map(|p| (r, p)));
                    match found {
                        Some((_, p)) if opts.output == Output::Json => {
                            let mut t = serde_json::to_string_pretty(p).unwrap_or_default();
                            t.push('\n');
                            t
                        }
                        Some((r, p)) if opts.svg.is_some() => {
                            let file = opts.svg.as_deref().expect("checked");
                            let Some(svg) = super::svg::render(&r.node, p, SystemTime::now())
                            else {
                                eprintln!("holdfast status: {sel}: the agent on {} records no steps: upgrade it", r.node);
                                return 8;
                            };
                            if let Err(e) = std::fs::write(file, svg) {
                                eprintln!("holdfast status: writing {}: {e}", file.display());
                                return 1;
                            }
                            format!(
                                "wrote {sel}'s timeline (node {}) to {}\n",
                                r.node,
                                file.display()
                            )
                        }
                        Some((r, p)) => {
                            let status = NodeStatus {
                                node: r.node.clone(),
                                agent_version: r.agent_version.clone().unwrap_or_default(),
                                pods: vec![p.clone()],
                                source_problems: vec![],
                                startup_taint: None,
                            };
                            if p.timeline.is_none() {
                                format!("{sel}: the agent on {} is older than the timeline (its rows carry no steps): upgrade it\n", r.node)
                            } else {
                                super::timeline::render_timeline(&status, p, SystemTime::now())
                            }
                        }
                        None if !opts.watch => {
                            let silent = rows.iter().filter(|r| r.error.is_some()).count();
                            eprintln!(
                                "holdfast status: {sel} is on no answering agent's board ({} node(s) read, {silent} without an answer)",
                                rows.len()
                            );
                            return 7;
                        }
                        None => format!("{sel} is on no answering agent's board\n"),
                    }
                }
            },
        };
        let frame = if opts.watch {
            format!(
                "\x1b[H\x1b[2J{text}(every {} s; Ctrl-C to stop)\n",
                WATCH_PERIOD.as_secs()
            )
        } else {
            text
        };
        if out
            .write_all(frame.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            return 1;
        }
        if !opts.watch {
            return 0;
        }
        std::thread::sleep(WATCH_PERIOD.saturating_sub(started.elapsed()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{HoldOutcome, HoldRecord, SidecarMode};
    use crate::cli::cluster::{AgentPod, NodeInfo};
    use std::time::Duration;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn pod(ns: &str, name: &str, phase: Phase, mesh: Mesh) -> PodStatus {
        PodStatus {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            phase,
            mode: Some(SidecarMode::Classic),
            mesh: Some(mesh),
            tracked_since: t(0),
            hold: Some(HoldRecord {
                started_at: Some(t(1)),
                released_at: Some(t(3)),
                connections_held: 2,
                ready_to_release_ms: Some(0.5),
                outcome: Some(HoldOutcome::Ready),
                ..HoldRecord::default()
            }),
            drain: None,
            job: None,
            last_error: None,
            skipped_reason: None,
            timeline: None,
        }
    }

    fn answers() -> Vec<AgentAnswer> {
        vec![
            AgentAnswer {
                pod: "holdfast-a".into(),
                node: "node-a".into(),
                result: Ok(NodeStatus {
                    node: "node-a".into(),
                    agent_version: "0.1.0".into(),
                    pods: vec![
                        pod("shop", "web-1", Phase::Ready, Mesh::Istio),
                        pod("pay", "api-1", Phase::Holding, Mesh::Kuma),
                    ],
                    source_problems: vec![],
                    startup_taint: None,
                }),
            },
            AgentAnswer {
                pod: "holdfast-b".into(),
                node: "node-b".into(),
                result: Err("no answer within 5000 ms".into()),
            },
        ]
    }

    fn agents() -> Vec<AgentPod> {
        ["a", "b"]
            .iter()
            .map(|n| AgentPod {
                name: format!("holdfast-{n}"),
                node: Some(format!("node-{n}")),
                phase: "Running".into(),
                ready: true,
                waiting_reason: None,
                started: None,
                restarts: 0,
            })
            .collect()
    }

    fn nodes() -> Vec<NodeInfo> {
        ["node-a", "node-b", "node-c"]
            .iter()
            .map(|n| NodeInfo {
                name: n.to_string(),
                linux: true,
                ready: true,
                gke: false,
                taints: vec![],
                created: None,
            })
            .collect()
    }

    #[test]
    fn every_node_has_rows_and_the_silent_ones_say_so() {
        let r = rows(answers(), &nodes(), &agents(), &Filters::default(), None);
        let text = render(&r, Output::Table, t(10));
        assert!(text.starts_with("NODE "), "{text}");
        assert!(text.contains("node-a           shop/web-1"), "{text}");
        assert!(text.contains("node-a           pay/api-1"), "{text}");
        assert!(
            text.contains("node-b           -")
                && text.contains("agent holdfast-b: no answer within 5000 ms"),
            "{text}"
        );
        assert!(
            text.contains("node-c") && text.contains("no holdfast agent pod"),
            "{text}"
        );
        assert!(
            text.contains("2 pod(s) on 3 node(s); 2 node(s) without an answer"),
            "{text}"
        );
    }

    /// Filters narrow the pods, never the nodes that did not answer.
    #[test]
    fn filters_keep_the_unanswered_rows() {
        let f = Filters {
            namespace: Some("pay".into()),
            ..Default::default()
        };
        let text = render(
            &rows(answers(), &nodes(), &agents(), &f, None),
            Output::Table,
            t(10),
        );
        assert!(
            text.contains("pay/api-1") && !text.contains("shop/web-1"),
            "{text}"
        );
        assert!(text.contains("holdfast-b"), "{text}");
        let f = Filters {
            phase: Some(Phase::Ready),
            ..Default::default()
        };
        let text = render(
            &rows(answers(), &nodes(), &agents(), &f, None),
            Output::Table,
            t(10),
        );
        assert!(
            !text.contains("pay/api-1") && text.contains("shop/web-1"),
            "{text}"
        );
        let f = Filters {
            mesh: Some(Mesh::Kuma),
            ..Default::default()
        };
        let text = render(
            &rows(answers(), &nodes(), &agents(), &f, None),
            Output::Table,
            t(10),
        );
        assert!(
            text.contains("pay/api-1") && !text.contains("shop/web-1"),
            "{text}"
        );
        let f = Filters {
            node: Some("node-a".into()),
            ..Default::default()
        };
        let r = rows(answers(), &nodes(), &agents(), &f, None);
        assert!(r.iter().all(|r| r.node != "node-c"), "{r:?}");
    }

    /// `-l`: only the pods the API server matched, by uid (the rows carry no labels); the
    /// nodes that did not answer stay.
    #[test]
    fn a_selector_keeps_the_selected_pods_and_the_unanswered_rows() {
        let f = Filters {
            selector: Some("app=api".into()),
            ..Default::default()
        };
        let selected: Selected = ["UID-api-1".to_ascii_lowercase()].into_iter().collect();
        let text = render(
            &rows(answers(), &nodes(), &agents(), &f, Some(&selected)),
            Output::Table,
            t(10),
        );
        assert!(
            text.contains("pay/api-1") && !text.contains("shop/web-1"),
            "{text}"
        );
        assert!(text.contains("holdfast-b"), "{text}");
        // Nothing matched: no pod row, every node still listed.
        let none = Selected::new();
        let r = rows(answers(), &nodes(), &agents(), &f, Some(&none));
        assert!(r.iter().all(|r| r.pods.is_empty()), "{r:?}");
        assert_eq!(r.len(), 3, "{r:?}");
    }

    #[test]
    fn json_and_wide() {
        let r = rows(answers(), &nodes(), &agents(), &Filters::default(), None);
        let doc: serde_json::Value =
            serde_json::from_str(&render(&r, Output::Json, t(10))).expect("json");
        assert_eq!(doc.as_array().map(Vec::len), Some(3));
        assert_eq!(doc[1]["error"], "no answer within 5000 ms");
        assert_eq!(doc[0]["pods"][1]["name"], "api-1");
        let wide = render(&r, Output::Wide, t(10));
        assert!(wide.lines().next().unwrap().contains("RELEASE"), "{wide}");
        assert!(wide.contains("classic"), "{wide}");
    }

    #[test]
    fn phases_and_meshes_parse_as_served() {
        assert_eq!(parse_phase("waiting-for-netns"), Ok(Phase::WaitingForNetns));
        assert!(parse_phase("Ready").unwrap_err().contains("one of"));
        assert_eq!(parse_mesh("kuma"), Ok(Mesh::Kuma));
        assert!(parse_mesh("linkerd").is_err());
    }
}
