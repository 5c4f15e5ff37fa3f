//! `holdfast status`: the node's table, read from the agent's status API (`GET /status`);
//! `holdfast status POD`: one pod's timeline from the same document (`super::timeline`).
//!
//! This module owns the client side of the status API: parsing `--agent`, one bounded HTTP/1.1
//! `GET` on the agent's one HTTP client (`crate::effects::http1_client`, hyper), decoding the
//! [`NodeStatus`] JSON, and rendering it as a table that fits an 80-column terminal. Rendering is
//! pure ([`render_table`], with the clock passed in) so it is tested without an agent; `--watch`
//! and `--json` are thin loops over the same pieces ([`run`]).
//!
//! Exit codes: [`EXIT_CODES`] (what `--help` prints; [`StatusCliError::exit_code`] maps each
//! error to one of them, and a test checks every code it returns is in the table).

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use crate::api::text::escape_json_document;
use crate::api::NodeStatus;
use crate::cli::timeline::{render_timeline, PodSelector};
use crate::effects::http1_client::{Connection, Failure};

pub(crate) use super::table::TABLE_WIDTH;
pub use super::table::{fit_end, render_table};
use super::table::{http_status, truncate, wrap};

/// The agent's default `--status-listen`, as a URL.
pub const DEFAULT_AGENT_URL: &str = "http://127.0.0.1:15300";

/// `--watch` refresh period.
pub(crate) const WATCH_PERIOD: Duration = Duration::from_secs(1);

/// Largest `/status` body accepted (a node's worth of pods is a few hundred KiB at most).
const MAX_BODY: usize = 16 << 20;

/// Errors of `holdfast status`. Each message names what failed and what to do.
#[derive(Debug, thiserror::Error)]
pub enum StatusCliError {
    #[error("--agent {url:?}: {why}; give the agent's --status-listen address, e.g. {DEFAULT_AGENT_URL}")]
    BadUrl { url: String, why: String },
    #[error("--node {node}: {source}")]
    Remote {
        node: String,
        #[source]
        source: crate::cli::remote::RemoteError,
    },
    #[error("no holdfast agent answers at {url}: is the agent running on this node, and is --agent its --status-listen address? ({why})")]
    Unreachable { url: String, why: String },
    #[error("the agent at {url} answered {status} to GET {path}: {body}; is --agent the holdfast agent's --status-listen address (not Envoy's or another service's)?")]
    HttpStatus {
        url: String,
        path: String,
        status: String,
        body: String,
    },
    #[error("POD {pod:?}: {why}")]
    BadPod { pod: String, why: String },
    #[error("no pod {pod} on the board of {url}: it is not on this node, not meshed, or gone longer than its row is kept{}; run `holdfast status` (with the same --agent/--node) to list the pods it tracks", hint.as_deref().map(|h| format!(" ({h})")).unwrap_or_default())]
    PodNotFound {
        pod: String,
        url: String,
        hint: Option<String>,
    },
    #[error("the agent at {url} (holdfast {agent_version}) records no timeline for {pod}: it is older than this holdfast; upgrade the agent, or run `holdfast status` for its row")]
    NoTimeline {
        pod: String,
        url: String,
        agent_version: String,
    },
    #[error("cannot write the status to stdout: {0}")]
    Output(#[source] std::io::Error),
    #[error("the answer from {url} is not a holdfast status document ({why}); is --agent the holdfast agent's --status-listen address, and is this holdfast the agent's version? (`--json` prints what was served)")]
    BadDocument { url: String, why: String },
}

/// `holdfast status`'s exit codes and what each means: the one table `--help`, the docs and
/// [`StatusCliError::exit_code`] agree on.
pub const EXIT_CODES: &[(i32, &str)] = &[
    (0, "ok"),
    (1, "writing to stdout failed"),
    (
        2,
        "usage: a bad --agent URL or POD, or no kubeconfig for --node",
    ),
    (
        3,
        "no agent answers: not running, a wrong --agent, or no agent pod on --node's node",
    ),
    (4, "the agent answered with an error status"),
    (5, "the answer was not a holdfast status document"),
    (
        6,
        "--node: the API server refused (RBAC: list pods, get and create pods/portforward in \
         holdfast-system; Role holdfast-status-reader)",
    ),
    (
        7,
        "POD is not on the agent's board (`holdfast status` lists the pods it tracks)",
    ),
    (
        8,
        "POD: the agent is older than the timeline and recorded no steps",
    ),
];

/// [`EXIT_CODES`] as `--help` prints them.
pub fn exit_codes_help() -> String {
    let mut out = String::from("Exit codes:\n");
    for (code, what) in EXIT_CODES {
        out.push_str(&format!("  {code}  {what}\n"));
    }
    out
}

impl StatusCliError {
    /// The process exit code for this error: one of [`EXIT_CODES`].
    pub fn exit_code(&self) -> i32 {
        match self {
            StatusCliError::BadUrl { .. } | StatusCliError::BadPod { .. } => 2,
            StatusCliError::PodNotFound { .. } => 7,
            StatusCliError::NoTimeline { .. } => 8,
            StatusCliError::Remote { source, .. } => match source {
                crate::cli::remote::RemoteError::Config(_) => 2,
                crate::cli::remote::RemoteError::Forbidden { .. } => 6,
                crate::cli::remote::RemoteError::AgentStatus { .. } => 4,
                crate::cli::remote::RemoteError::BadAnswer { .. } => 5,
                _ => 3,
            },
            StatusCliError::Unreachable { .. } => 3,
            StatusCliError::HttpStatus { .. } => 4,
            StatusCliError::BadDocument { .. } => 5,
            StatusCliError::Output(_) => 1,
        }
    }
}

pub(crate) type Result<T, E = StatusCliError> = std::result::Result<T, E>;

/// Where the agent's status API is: `http://HOST[:PORT][/BASE]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentUrl {
    /// `HOST:PORT` as given (also the `Host` header).
    authority: String,
    /// Path prefix before `/status` (empty, or starting with `/` and not ending with one).
    base_path: String,
    /// The URL as the user gave it, for messages.
    shown: String,
}

impl AgentUrl {
    /// Parses `http://HOST[:PORT][/BASE]` or `HOST:PORT`. The status API is plain HTTP: `https`
    /// is refused with a message rather than tried.
    pub fn parse(url: &str) -> Result<AgentUrl> {
        let bad = |why: &str| StatusCliError::BadUrl {
            url: url.to_string(),
            why: why.to_string(),
        };
        let trimmed = url.trim();
        let rest = if let Some(rest) = trimmed.strip_prefix("http://") {
            rest
        } else if trimmed.starts_with("https://") {
            return Err(bad(
                "the status API is plain HTTP (it listens on the node only); use http://",
            ));
        } else if trimmed.contains("://") {
            return Err(bad("only http:// URLs are supported"));
        } else {
            trimmed
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let host = match authority.rfind(':') {
            Some(i) if !authority[..i].contains(':') || authority[..i].ends_with(']') => {
                &authority[..i]
            }
            _ => authority,
        };
        if host.is_empty() || host == "[]" {
            return Err(bad("no host"));
        }
        if path.contains(['?', '#']) {
            return Err(bad("no query or fragment, please"));
        }
        if authority.contains(['@', ' ']) {
            return Err(bad("expected HOST:PORT"));
        }
        // A port is present when the text after the last ':' follows the host (IPv6 hosts are
        // bracketed, so their colons sit before the `]`).
        let has_port = match authority.rfind(':') {
            Some(i) => authority[..i].ends_with(']') || !authority[..i].contains(':'),
            None => false,
        };
        let authority = if has_port {
            let port = authority.rsplit(':').next().unwrap_or_default();
            if port.parse::<u16>().is_err() {
                return Err(bad(&format!(
                    "port {port:?} is not a number from 0 to 65535"
                )));
            }
            authority.to_string()
        } else if authority.contains(':') && !authority.starts_with('[') {
            return Err(bad(
                "put an IPv6 address in brackets, e.g. http://[::1]:15300",
            ));
        } else {
            format!("{authority}:80")
        };
        Ok(AgentUrl {
            authority,
            base_path: path.trim_end_matches('/').to_string(),
            shown: trimmed.trim_end_matches('/').to_string(),
        })
    }

    /// The full path of `endpoint` (e.g. `/status`) under the base path.
    pub(crate) fn path(&self, endpoint: &str) -> String {
        format!("{}{endpoint}", self.base_path)
    }
}

impl std::fmt::Display for AgentUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

/// `GET /status` from the agent: the body as served, once the status is 200. `timeout` bounds
/// the whole exchange (connect, send, read). HTTP on hyper, as the agent's admin client
/// ([`crate::effects::http1_client`]), on a small runtime of its own (the CLI is synchronous).
pub(crate) fn fetch_status_body(agent: &AgentUrl, timeout: Duration) -> Result<String> {
    let unreachable = |why: String| StatusCliError::Unreachable {
        url: agent.to_string(),
        why,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| unreachable(format!("cannot start an async runtime: {e}")))?;
    runtime.block_on(async {
        match tokio::time::timeout(timeout, fetch_async(agent, timeout)).await {
            Ok(result) => result,
            Err(_) => Err(unreachable(format!("no answer within {timeout:?}"))),
        }
    })
}

async fn fetch_async(agent: &AgentUrl, timeout: Duration) -> Result<String> {
    let path = agent.path("/status");
    let unreachable = |why: String| StatusCliError::Unreachable {
        url: agent.to_string(),
        why,
    };
    let bad_document = |why: String| StatusCliError::BadDocument {
        url: agent.to_string(),
        why,
    };
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(agent.authority.as_str())
        .await
        .map_err(|e| unreachable(format!("cannot resolve {}: {e}", agent.authority)))?
        .collect();
    let mut last_err = format!("{} resolves to no address", agent.authority);
    let mut stream = None;
    for addr in addrs {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last_err = format!("connect to {addr}: {e}"),
        }
    }
    let stream = stream.ok_or_else(|| unreachable(last_err))?;
    let failed = |f: Failure| match f {
        Failure::Malformed(why) | Failure::TooLarge(why) => bad_document(why),
        Failure::Closed(_) | Failure::NotSent(_) => {
            bad_document("the connection closed without a complete answer".into())
        }
        Failure::Io(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            unreachable(format!("no answer within {timeout:?}"))
        }
        Failure::Io(e) => unreachable(format!("reading the answer: {e}")),
    };
    let mut connection = Connection::handshake(stream).await.map_err(failed)?;
    let user_agent = format!("holdfast-status/{}", env!("CARGO_PKG_VERSION"));
    let answer = connection
        .exchange(
            hyper::Method::GET,
            &path,
            &agent.authority,
            &[("accept", "application/json"), ("user-agent", &user_agent)],
            MAX_BODY,
        )
        .await
        .map_err(failed)?;
    let body = String::from_utf8_lossy(&answer.body).into_owned();
    if answer.status != hyper::StatusCode::OK {
        return Err(StatusCliError::HttpStatus {
            url: agent.to_string(),
            path,
            status: http_status(answer.status),
            body: truncate(body.trim(), 200),
        });
    }
    Ok(body)
}

/// Decodes a `/status` body.
pub(crate) fn parse_status(agent: &AgentUrl, body: &str) -> Result<NodeStatus> {
    serde_json::from_str(body).map_err(|e| StatusCliError::BadDocument {
        url: agent.to_string(),
        why: e.to_string(),
    })
}

/// Fetches and decodes the node's status.
pub fn fetch_status(agent: &AgentUrl, timeout: Duration) -> Result<NodeStatus> {
    let body = fetch_status_body(agent, timeout)?;
    parse_status(agent, &body)
}

/// What `holdfast status` was asked to do.
#[derive(Debug, Clone)]
pub struct StatusOptions {
    /// `--agent` (see [`AgentUrl::parse`]).
    pub agent: String,
    /// `--json`: print the document as served.
    pub json: bool,
    /// `--watch`: refresh in place every `WATCH_PERIOD` until interrupted.
    pub watch: bool,
    /// `--node`: read that node's agent through the API server (a port-forward to its status
    /// port) instead of `agent`.
    pub node: Option<String>,
    /// Bound of one request.
    pub timeout: Duration,
    /// `POD` (`namespace/name` or uid, see `PodSelector::parse`): that pod's timeline
    /// instead of the node's table (with `--json`: its row, steps included).
    pub pod: Option<String>,
}

/// The pod `opts` names, if any (a usage error when it is malformed).
pub(crate) fn pod_selector(opts: &StatusOptions) -> Result<Option<PodSelector>> {
    opts.pod
        .as_deref()
        .map(|p| {
            PodSelector::parse(p).map_err(|why| StatusCliError::BadPod {
                pod: p.to_string(),
                why,
            })
        })
        .transpose()
}

/// One pod's text from a `/status` body: its timeline, or with `json` its row as served.
/// Errors: the pod is not on the board, or the agent records no steps.
pub(crate) fn pod_text(
    label: &str,
    status: &NodeStatus,
    body: &str,
    pod: &PodSelector,
    json: bool,
    now: SystemTime,
) -> Result<String> {
    let Some(index) = status.pods.iter().position(|p| pod.matches(p)) else {
        return Err(StatusCliError::PodNotFound {
            pod: pod.to_string(),
            url: label.to_string(),
            hint: pod.hint(status),
        });
    };
    let row = &status.pods[index];
    if row.timeline.is_none() {
        return Err(StatusCliError::NoTimeline {
            pod: pod.to_string(),
            url: label.to_string(),
            agent_version: status.agent_version.clone(),
        });
    }
    if !json {
        return Ok(render_timeline(status, row, now));
    }
    // The row as served (every field, also those this holdfast does not know).
    let bad_document = |why: String| StatusCliError::BadDocument {
        url: label.to_string(),
        why,
    };
    let doc: serde_json::Value =
        serde_json::from_str(body).map_err(|e| bad_document(e.to_string()))?;
    let served = doc
        .get("pods")
        .and_then(|p| p.get(index))
        .ok_or_else(|| bad_document("the pod's row is missing from the document".into()))?;
    let text = serde_json::to_string_pretty(served).map_err(|e| bad_document(e.to_string()))?;
    let mut text = escape_json_document(&text).into_owned();
    text.push('\n');
    Ok(text)
}

/// `holdfast status POD --svg FILE`: writes the pod's timeline as an SVG picture
/// ([`super::svg`]) to `file`; returns what to print.
pub fn write_svg(opts: &StatusOptions, file: &std::path::Path) -> Result<String> {
    let pod = pod_selector(opts)?.ok_or_else(|| StatusCliError::BadPod {
        pod: String::new(),
        why: "--svg draws one pod's timeline: give POD (namespace/name or uid)".into(),
    })?;
    let source = Source::new(opts)?;
    let status = source.parse(&source.body(opts.timeout)?)?;
    let label = &source.label;
    let Some(row) = status.pods.iter().find(|p| pod.matches(p)) else {
        return Err(StatusCliError::PodNotFound {
            pod: pod.to_string(),
            url: label.to_string(),
            hint: pod.hint(&status),
        });
    };
    let Some(svg) = super::svg::render(&status.node, row, SystemTime::now()) else {
        return Err(StatusCliError::NoTimeline {
            pod: pod.to_string(),
            url: label.to_string(),
            agent_version: status.agent_version.clone(),
        });
    };
    std::fs::write(file, svg).map_err(StatusCliError::Output)?;
    Ok(format!("wrote {pod}'s timeline to {}\n", file.display()))
}

/// Runs `holdfast status`, writing to `out`. Returns only on error or, without `--watch`, when
/// done.
pub fn run(opts: &StatusOptions, out: &mut impl Write) -> Result<()> {
    let pod = pod_selector(opts)?;
    let source = Source::new(opts)?;
    let agent = &source.label;
    let write_err = StatusCliError::Output;
    // One pod's timeline (or row), from the same document.
    let pod_frame = |body: &str| -> Result<String> {
        let pod = pod.as_ref().expect("only called with a pod");
        let status = source.parse(body)?;
        pod_text(agent, &status, body, pod, opts.json, SystemTime::now())
    };
    if !opts.watch {
        let text = if pod.is_some() {
            pod_frame(&source.body(opts.timeout)?)?
        } else if opts.json {
            let body = source.body(opts.timeout)?;
            // Served as is (scripts get every field), but checked to be JSON at all.
            serde_json::from_str::<serde_json::Value>(&body).map_err(|e| {
                StatusCliError::BadDocument {
                    url: agent.to_string(),
                    why: e.to_string(),
                }
            })?;
            // Served as is but for raw C1 and bidi controls, escaped (an older agent sends
            // them raw; the document means the same).
            let mut b = escape_json_document(&body).into_owned();
            if !b.ends_with('\n') {
                b.push('\n');
            }
            b
        } else {
            let body = source.body(opts.timeout)?;
            render_table(&source.parse(&body)?, SystemTime::now())
        };
        return out
            .write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .map_err(write_err);
    }
    loop {
        let started = Instant::now();
        // In watch mode a failed fetch is shown and retried: the agent may be restarting.
        // A pod not (or no longer) on the board is shown and watched for: it may appear.
        let text = match source.body(opts.timeout) {
            Ok(body) if pod.is_some() => {
                pod_frame(&body).unwrap_or_else(|e| wrap(&e.to_string(), TABLE_WIDTH))
            }
            Ok(body) if opts.json => escape_json_document(&body).into_owned(),
            Ok(body) => match source.parse(&body) {
                Ok(status) => render_table(&status, SystemTime::now()),
                Err(e) => wrap(&e.to_string(), TABLE_WIDTH),
            },
            Err(e) => wrap(&e.to_string(), TABLE_WIDTH),
        };
        // Home, clear the screen, print; then the footer says how to stop.
        let frame = format!(
            "\x1b[H\x1b[2J{}{}\n(every {} s; Ctrl-C to stop)\n",
            text,
            if text.ends_with('\n') { "" } else { "\n" },
            WATCH_PERIOD.as_secs()
        );
        out.write_all(frame.as_bytes()).map_err(write_err)?;
        out.flush().map_err(write_err)?;
        std::thread::sleep(WATCH_PERIOD.saturating_sub(started.elapsed()));
    }
}

/// Where the status document comes from: the agent's address, or a node through the API server.
struct Source {
    /// Shown in errors.
    label: String,
    kind: SourceKind,
}

enum SourceKind {
    Local(AgentUrl),
    Node {
        node: String,
        rt: tokio::runtime::Runtime,
        client: kube::Client,
    },
}

impl Source {
    fn new(opts: &StatusOptions) -> Result<Self> {
        let Some(node) = &opts.node else {
            let agent = AgentUrl::parse(&opts.agent)?;
            return Ok(Source {
                label: agent.to_string(),
                kind: SourceKind::Local(agent),
            });
        };
        let remote = |source| StatusCliError::Remote {
            node: node.clone(),
            source,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| remote(crate::cli::remote::RemoteError::Config(e.to_string())))?;
        let client = rt.block_on(crate::cli::remote::client()).map_err(remote)?;
        Ok(Source {
            label: format!("node {node} (port-forward through the API server)"),
            kind: SourceKind::Node {
                node: node.clone(),
                rt,
                client,
            },
        })
    }

    fn body(&self, timeout: Duration) -> Result<String> {
        match &self.kind {
            SourceKind::Local(agent) => fetch_status_body(agent, timeout),
            SourceKind::Node { node, rt, client } => {
                let fetch = crate::cli::remote::fetch_status_body(
                    client.clone(),
                    node,
                    crate::cli::remote::AGENT_NAMESPACE,
                    MAX_BODY,
                );
                rt.block_on(async { tokio::time::timeout(timeout, fetch).await })
                    .map_err(|_| crate::cli::remote::RemoteError::Api {
                        what: "reading the status through the API server".into(),
                        why: format!("no answer within {timeout:?}"),
                    })
                    .and_then(|r| r)
                    .map_err(|source| StatusCliError::Remote {
                        node: node.clone(),
                        source,
                    })
            }
        }
    }

    fn parse(&self, body: &str) -> Result<NodeStatus> {
        match &self.kind {
            SourceKind::Local(agent) => parse_status(agent, body),
            SourceKind::Node { .. } => {
                serde_json::from_str(body).map_err(|e| StatusCliError::BadDocument {
                    url: self.label.clone(),
                    why: e.to_string(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests;
