//! The `holdfast` binary: parses arguments and calls the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use holdfast::config::{self, Config, HoldSettings, ProxyConfig, SourceConfig};

/// holdfast: startup and shutdown ordering for Envoy sidecars, run from the node.
///
/// The agent holds a pod's new connections until its Envoy sidecar is ready (nothing is
/// refused), coordinates the drain when the pod stops, and lets Jobs complete — without any
/// change to the pod spec.
#[derive(Parser)]
#[command(name = "holdfast", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node agent (one per node, as a DaemonSet with hostPID).
    Agent(Box<AgentArgs>),
    /// Print the node's table (every tracked pod's phase, hold, drain and Job outcome), or with
    /// POD that pod's timeline.
    ///
    /// Read from the agent's status API (`GET /status` on its loopback `--status-listen`;
    /// `--json` prints it as served; `--node` reads a node's agent over a port-forward).
    /// `holdfast status default/web-0` prints each step of the pod's life (netns found, hold
    /// in, first connection held, proxy running, Envoy listening/LIVE/ready, released; on
    /// deletion: drain started, inbound drained, each app container's exit, the quit and why,
    /// the proxy's exit) with its time since the pod was first seen and since the step before,
    /// then the outcome and its reason. A deleted pod stays readable while its row is kept.
    Status(StatusArgs),
    /// Check the cluster for what makes holdfast silently do less, with your kubeconfig.
    ///
    /// Reads the nodes, the agent pods, the agent namespace's ResourceQuotas and every agent's
    /// status (over a port-forward, at most --concurrency at once, each within --timeout) and
    /// prints each finding with its stable code (HF0xxx, docs/check-codes.md), the objects it
    /// names and the fix. Exit codes: 0 nothing wrong or warnings only, 1 at least one error,
    /// 3 the cluster could not be read. RBAC: the Role holdfast-status-reader and the
    /// ClusterRole holdfast-cluster-reader (manifests/agent/).
    Check(CheckArgs),
}

#[derive(Args)]
struct CheckArgs {
    /// The agent's namespace.
    #[arg(long, default_value = holdfast::cli::check::AGENT_NAMESPACE, value_name = "NAMESPACE")]
    agent_namespace: String,

    /// Output format.
    #[arg(short = 'o', long, default_value = "text", value_parser = ["text", "json"])]
    output: String,

    /// Deadline of one agent's read.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    timeout: Duration,

    /// Agents read at once.
    #[arg(long, default_value_t = 32, value_name = "N")]
    concurrency: usize,
}

#[derive(Args)]
struct StatusArgs {
    /// One pod: namespace/name (e.g. default/web-0) or its uid. Prints its timeline; with
    /// --json its row, steps included; with --watch follows it live.
    #[arg(value_name = "POD")]
    pod: Option<String>,

    /// The agent's status API (its --status-listen address), as http://HOST:PORT.
    #[arg(
        long,
        env = "HOLDFAST_AGENT",
        default_value = holdfast::cli::status::DEFAULT_AGENT_URL,
        value_name = "URL"
    )]
    agent: String,

    /// Print the status document (JSON) as the agent serves it; with POD, that pod's row.
    #[arg(long)]
    json: bool,

    /// Refresh in place every second until Ctrl-C.
    #[arg(long)]
    watch: bool,

    /// Read NODE's agent over a port-forward through the API server, with your kubeconfig (needs
    /// RBAC: list pods, get and create pods/portforward in holdfast-system; Role
    /// holdfast-status-reader). Installed as `kubectl-holdfast`, this is
    /// `kubectl holdfast status --node NODE`.
    #[arg(long, value_name = "NODE")]
    node: Option<String>,

    /// Give up on an answer after this long (with --all-nodes: each agent's).
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    timeout: Duration,

    /// Every node's agent in one table, with a node column (the default as `kubectl holdfast
    /// status`): each agent read over a port-forward with your kubeconfig, at most
    /// --concurrency at once; an agent that does not answer is a row saying so. With --node,
    /// that node only.
    #[arg(short = 'A', long)]
    all_nodes: bool,

    /// With --all-nodes: only pods of this namespace.
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    namespace: Option<String>,

    /// With --all-nodes: only pods in this phase (waiting-for-netns, holding, ready, draining,
    /// quitting, done, skipped).
    #[arg(long, value_name = "PHASE", value_parser = holdfast::cli::cluster_status::parse_phase)]
    phase: Option<holdfast::api::Phase>,

    /// With --all-nodes: only pods of this mesh (istio, kuma, consul).
    #[arg(long, value_name = "MESH", value_parser = holdfast::cli::cluster_status::parse_mesh)]
    mesh: Option<holdfast::api::Mesh>,

    /// With --all-nodes: only pods matching this label selector (kubectl's syntax: `app=web`,
    /// `tier in (a,b)`, `!canary`), as the API server matches it: needs `list pods` in -n's
    /// namespace, or cluster-wide without -n, for your kubeconfig.
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    selector: Option<String>,

    /// With --all-nodes: table, wide (more columns) or json (every node's rows).
    #[arg(short = 'o', long, value_name = "FORMAT", value_parser = ["table", "wide", "json"])]
    output: Option<String>,

    /// With --all-nodes: agents read at once.
    #[arg(long, default_value_t = 32, value_name = "N")]
    concurrency: usize,

    /// With POD: write the pod's timeline as an SVG picture to FILE (lanes for the app, the
    /// proxy, the hold and the drain on one time axis; every step with its detail as a tooltip).
    #[arg(long, value_name = "FILE", requires = "pod")]
    svg: Option<PathBuf>,

    /// With --all-nodes: the agents' namespace.
    #[arg(long, default_value = holdfast::cli::check::AGENT_NAMESPACE, value_name = "NAMESPACE")]
    agent_namespace: String,
}

#[derive(Args)]
struct AgentArgs {
    /// Name of the node this agent serves (downward API: spec.nodeName).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    node_name: String,

    /// Read Pod objects from this directory (JSON or YAML, one per file; dotfiles ignored) and
    /// follow its changes. Used by the simulated node and for static pods.
    #[arg(
        long,
        value_name = "DIR",
        conflicts_with = "kube",
        required_unless_present = "kube"
    )]
    pods_dir: Option<PathBuf>,

    /// Watch the Kubernetes API server for pods with spec.nodeName=<node> (in-cluster config).
    #[arg(long)]
    kube: bool,

    /// Address of the read-only status API (/status, /config, /metrics, /healthz, /readyz): a
    /// loopback address only — /status and /config are for clients inside the agent's pod
    /// (`kubectl port-forward`, `kubectl exec`). `holdfast status` reads it there.
    #[arg(
        long,
        env = "HOLDFAST_STATUS_LISTEN",
        default_value = "127.0.0.1:15300",
        value_name = "ADDR"
    )]
    status_listen: SocketAddr,

    /// Also serve the kubelet's probes (/healthz, /readyz, nothing else) here, on a listener of
    /// their own that no other client can exhaust (one request per connection, a per-peer
    /// limit). The DaemonSet uses [::]:15301 (bound dual-stack).
    #[arg(long, env = "HOLDFAST_HEALTH_LISTEN", value_name = "ADDR")]
    health_listen: Option<SocketAddr>,

    /// Also serve /metrics (nothing else) here, for Prometheus outside the agent's pod, with a
    /// per-peer connection limit. The DaemonSet uses [::]:15302 (bound dual-stack).
    #[arg(long, env = "HOLDFAST_METRICS_LISTEN", value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,

    /// Name of Istio's sidecar container (Kuma's and Consul's are their injectors'). The
    /// defaults of this and the next four flags are Istio's sidecar template's.
    #[arg(long, default_value_t = ProxyConfig::default().container, value_name = "NAME")]
    proxy_container: String,

    /// uid Istio's proxy runs as; its own connections are never held.
    #[arg(long, default_value_t = ProxyConfig::default().uid, value_name = "UID")]
    proxy_uid: u32,

    /// Istio's Envoy admin address inside each pod's network namespace.
    #[arg(long, default_value_t = ProxyConfig::default().admin, value_name = "ADDR")]
    admin_addr: SocketAddr,

    /// Istio's Envoy outbound capture port.
    #[arg(long, default_value_t = ProxyConfig::default().outbound_port, value_name = "PORT")]
    outbound_port: u16,

    /// Istio's Envoy inbound capture port.
    #[arg(long, default_value_t = ProxyConfig::default().inbound_port, value_name = "PORT")]
    inbound_port: u16,

    /// RuntimeClass names of sandboxed runtimes (gVisor, Kata) whose pods are left alone, with
    /// the reason on their row; comma-separated, a trailing `*` matches any rest.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "gvisor,runsc,kata*",
        value_name = "NAMES"
    )]
    sandboxed_runtime_classes: Vec<String>,

    /// Release a hold after this long even if the proxy never becomes ready (fail open).
    /// Per pod: annotation holdfast.io/hold-timeout.
    #[arg(long, default_value = "120s", value_parser = parse_duration, value_name = "DURATION")]
    hold_timeout: Duration,

    /// The longest hold a pod's holdfast.io/hold-timeout annotation may ask for; larger values
    /// are clamped to it (and the pod's status says so).
    #[arg(long, default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    max_hold_timeout: Duration,

    /// How often a holding pod's proxy readiness is checked before its Envoy starts (one
    /// sock_diag lookup of the admin port). While Envoy starts, every 1 ms (paced node-wide),
    /// for at most 10 s, then backing off to 1 s.
    #[arg(long, default_value = "5ms", value_parser = parse_duration, value_name = "DURATION")]
    ready_poll: Duration,

    /// NFQUEUE number used inside each pod's network namespace.
    #[arg(long, default_value_t = 15015, value_name = "N")]
    queue_num: u16,

    /// Also wait for the holdfast filter before releasing a hold: configured on every Envoy
    /// worker (`workers_ready` = `server.concurrency`). Without it a proxy without the filter
    /// counts as ready.
    #[arg(long)]
    require_filter: bool,

    /// The holdfast filter's `stat_prefix`, as set in its plugin configuration (the filter
    /// publishes `wasmcustom.<prefix>.workers_ready`, `.<dir>.cx_active`, ...): readiness and the
    /// drain read the filter's stats under it.
    #[arg(long, default_value = config::FILTER_STAT_PREFIX, value_name = "PREFIX")]
    filter_stat_prefix: String,

    /// Drain: no byte through the pod's traffic listeners for this long means what is still
    /// open is idle (keep-alives), and the proxy may go once the app has. 10ms to 10s.
    #[arg(long, default_value = "100ms", value_parser = parse_duration, value_name = "DURATION")]
    drain_idle_window: Duration,

    /// Job: the longest wait for in-flight traffic to settle after the app finished, before the
    /// proxy is quit anyway. Up to 5m.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    job_in_flight_wait: Duration,

    /// Timeout of each Envoy admin request of the drain and the Job watch. 50ms to 10s.
    #[arg(long, default_value = "500ms", value_parser = parse_duration, value_name = "DURATION")]
    admin_timeout: Duration,

    /// Root of the proc filesystem (the host's, with hostPID).
    #[arg(long, default_value = "/proc", value_name = "DIR")]
    proc_root: PathBuf,

    /// Log format.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    config::parse_duration(s).map_err(|e| e.to_string())
}

impl AgentArgs {
    fn into_config(self) -> anyhow::Result<Config> {
        config::check_status_listen(self.status_listen).map_err(anyhow::Error::msg)?;
        holdfast::effects::procfs::check_proc_root(&self.proc_root).map_err(anyhow::Error::msg)?;
        if self.hold_timeout > self.max_hold_timeout {
            anyhow::bail!(
                "--hold-timeout {} is longer than --max-hold-timeout {}: raise the ceiling or lower the default",
                config::format_duration(self.hold_timeout),
                config::format_duration(self.max_hold_timeout)
            );
        }
        Ok(Config {
            node_name: self.node_name,
            source: match self.pods_dir {
                Some(dir) => SourceConfig::PodsDir(dir),
                None => SourceConfig::Kube,
            },
            status_listen: self.status_listen,
            health_listen: self.health_listen,
            metrics_listen: self.metrics_listen,
            proc_root: self.proc_root,
            proxy: ProxyConfig {
                container: self.proxy_container,
                uid: self.proxy_uid,
                admin: self.admin_addr,
                outbound_port: self.outbound_port,
                inbound_port: self.inbound_port,
                sandboxed_runtime_classes: self.sandboxed_runtime_classes,
            },
            hold: HoldSettings {
                timeout: self.hold_timeout,
                max_timeout: self.max_hold_timeout,
                queue_num: self.queue_num,
                require_filter: self.require_filter,
                ready_poll: self.ready_poll.max(Duration::from_millis(1)),
            },
            drain: config::DrainSettings::from_flags(&config::DrainFlags {
                filter_stat_prefix: self.filter_stat_prefix,
                idle_window: self.drain_idle_window,
                job_in_flight_wait: self.job_in_flight_wait,
                admin_timeout: self.admin_timeout,
            })?,
        })
    }
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HOLDFAST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use holdfast::report::log_lines::{LogFormat, OneLineLog};
    let format = if format == "json" {
        LogFormat::Json
    } else {
        LogFormat::Text
    };
    // Each event stays one line whatever a pod put in its fields; no colour codes, which
    // would be escaped too (and are noise in `kubectl logs`).
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(move || OneLineLog::new(std::io::stderr(), format));
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// At most two glibc malloc arenas.
///
/// glibc gives each thread that allocates while the others' arenas are busy an arena of its
/// own, up to 8 per core; every arena keeps the memory freed into it. The agent's threads come
/// and go (tokio's blocking pool, one short-lived thread per netns entry, one per holding pod),
/// so a 110-pod burst left RSS at 27.7 MiB, most of it free memory spread over arenas. Two
/// arenas (one for each of the node's usual cores) keep contention low and RSS near what is
/// live (`mallopt(3)`: `M_ARENA_MAX`; the same as `MALLOC_ARENA_MAX=2` in the environment).
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a tunable of glibc's allocator, and runs here before any other
    // thread exists. Its result (0 on failure) is ignored: the default arenas are safe too.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Every 30 s, hands memory the agent has freed back to the kernel (`malloc_trim(3)`).
///
/// glibc keeps freed heap for reuse; after a burst (110 pods starting, a flood of status API
/// clients) the agent's RSS stayed ~7–9 MiB above what it used (chaos soak: 21.5 → 28.4 MiB at
/// the end with no pods). `malloc_trim(0)` releases free pages of every arena (`madvise`), a few
/// milliseconds of work on the blocking pool.
async fn return_freed_memory() {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(30));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only returns free memory of glibc's allocator to the kernel; it
        // takes the allocator's own locks and touches no memory in use.
        let _ = tokio::task::spawn_blocking(|| unsafe { libc::malloc_trim(0) }).await;
    }
}

fn main() -> anyhow::Result<()> {
    use clap::{CommandFactory, FromArgMatches};
    // `holdfast status --help` lists the exit codes from the one table the code maps to.
    // Installed as `kubectl-holdfast` (krew, or a link on PATH), kubectl runs it as `kubectl
    // holdfast ...`: usage says so, and `status` reads every node by default.
    let plugin = std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|f| f.to_string_lossy().starts_with("kubectl-holdfast"))
        })
        .unwrap_or(false);
    let mut command = Cli::command().mut_subcommand("status", |c| {
        c.after_long_help(holdfast::cli::status::exit_codes_help())
    });
    if plugin {
        command = command
            .name("kubectl holdfast")
            .bin_name("kubectl holdfast");
    }
    let matches = command.get_matches();
    // `--agent` given (flag or HOLDFAST_AGENT): the user means that one agent.
    let agent_given = matches.subcommand_matches("status").is_some_and(|m| {
        matches!(
            m.value_source("agent"),
            Some(clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable)
        )
    });
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Agent(args) => {
            limit_malloc_arenas();
            init_logging(&args.log_format);
            let config = (*args).into_config()?;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                // Idle blocking-pool threads (a burst of hold installs and process scans leaves
                // dozens) end after a second instead of ten: fewer threads, less memory held.
                .thread_keep_alive(std::time::Duration::from_secs(1))
                .build()
                .context("starting the tokio runtime")?;
            rt.block_on(async move {
                let shutdown = async {
                    let mut term =
                        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                            .expect("installing a SIGTERM handler");
                    tokio::select! {
                        _ = term.recv() => {},
                        _ = tokio::signal::ctrl_c() => {},
                    }
                };
                tokio::spawn(return_freed_memory());
                holdfast::agent::run(config, shutdown).await
            })?;
            Ok(())
        }
        Command::Status(args) => {
            use holdfast::cli::cluster_status::{self, ClusterStatusOptions, Filters, Output};
            let cluster_only = args.namespace.is_some()
                || args.selector.is_some()
                || args.phase.is_some()
                || args.mesh.is_some()
                || matches!(args.output.as_deref(), Some("table" | "wide"));
            if args.all_nodes || cluster_only || (plugin && !agent_given) {
                let opts = ClusterStatusOptions {
                    agent_namespace: args.agent_namespace,
                    filters: Filters {
                        namespace: args.namespace,
                        node: args.node,
                        phase: args.phase,
                        mesh: args.mesh,
                        selector: args.selector,
                    },
                    output: match (args.output.as_deref(), args.json) {
                        (Some("json"), _) | (None, true) => Output::Json,
                        (Some("wide"), _) => Output::Wide,
                        _ => Output::Table,
                    },
                    watch: args.watch,
                    fan_out: holdfast::cli::cluster::FanOut {
                        concurrency: args.concurrency.max(1),
                        per_agent: args.timeout,
                        ..Default::default()
                    },
                    pod: args.pod,
                    svg: args.svg,
                };
                let stdout = std::io::stdout();
                std::process::exit(cluster_status::run(&opts, &mut stdout.lock()));
            }
            let opts = holdfast::cli::status::StatusOptions {
                agent: args.agent,
                json: args.json || args.output.as_deref() == Some("json"),
                watch: args.watch,
                node: args.node,
                timeout: args.timeout,
                pod: args.pod,
            };
            if let Some(file) = &args.svg {
                match holdfast::cli::status::write_svg(&opts, file) {
                    Ok(text) => print!("{text}"),
                    Err(e) => {
                        eprintln!("holdfast status: {e}");
                        std::process::exit(e.exit_code());
                    }
                }
                return Ok(());
            }
            let stdout = std::io::stdout();
            if let Err(e) = holdfast::cli::status::run(&opts, &mut stdout.lock()) {
                eprintln!("holdfast status: {e}");
                std::process::exit(e.exit_code());
            }
            Ok(())
        }
        Command::Check(args) => {
            let opts = holdfast::cli::check::CheckOptions {
                namespace: args.agent_namespace,
                json: args.output == "json",
                fan_out: holdfast::cli::cluster::FanOut {
                    concurrency: args.concurrency.max(1),
                    per_agent: args.timeout,
                    ..Default::default()
                },
            };
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the tokio runtime")?;
            let (text, code) = rt.block_on(async {
                match holdfast::cli::check::client().await {
                    Ok(client) => {
                        holdfast::cli::check::run(&client, &opts, std::time::SystemTime::now())
                            .await
                    }
                    Err(e) => (format!("holdfast check: {e}\n"), 2),
                }
            });
            if code >= 2 {
                eprint!("{text}");
            } else {
                print!("{text}");
            }
            std::process::exit(code);
        }
    }
}
