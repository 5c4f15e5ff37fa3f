//! The simulated node's stand-in programs, one subcommand each. Only argument parsing lives here;
//! the behaviour is in `holdfast_tests::sim::{apps, pilot_agent, istio_init}`.
//!
//! - `pause`: the pod sandbox (holds the pod's netns; exits on SIGTERM).
//! - `istio-init`: installs Istio's nat rules in the current netns (the init container).
//! - `pilot-agent`: starts Envoy as uid 1337 and applies pilot-agent's drain on SIGTERM.
//! - `app`: the app container, scripted by flags; writes a JSON-lines report.
//! - `remote`: the remote services (`ping\n` → `pong\n`, and HTTP/1.1 on 8080; also on
//!   [`REMOTE_IP6`]) and the cluster DNS (port 53 on both addresses), prints `ready` once
//!   listening.
//! - `dns-proxy`: pilot-agent's DNS proxy on localhost:15053 (started by `pilot-agent`).
//! - `request`: `pilot-agent request` (Istio's native-sidecar preStop hook runs it).
//! - `mesh-init`, `kuma-dp`, `consul-dataplane`, `killall-usr2-kuma-dp`,
//!   `consul-check-proxy-health`: Kuma's and Consul's init step, proxy processes, Kuma's native
//!   preStop hook and Consul's native startup probe (`sim::mesh`, `sim::dataplane`).

use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use holdfast_tests::sim::apps::{self, AppArgs, TermSignal};
use holdfast_tests::sim::dataplane::{self, ConsulDataplaneArgs, KumaDpArgs};
use holdfast_tests::sim::dns::{self, NameTable};
use holdfast_tests::sim::http_calls;
use holdfast_tests::sim::istio_init::{self, InitOptions};
use holdfast_tests::sim::mesh::{self, Mesh};
use holdfast_tests::sim::netns::REMOTE_IP6;
use holdfast_tests::sim::pilot_agent::{self, PilotAgentArgs};
use holdfast_tests::sim::pilot_status::{self, RequestArgs};

#[derive(Parser)]
#[command(
    name = "sim-app",
    about = "Stand-in programs of holdfast's simulated node"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The pod sandbox's pause process.
    Pause,
    /// Istio's init container: nat rules, then wait out --min-duration-ms.
    IstioInit {
        #[arg(long, default_value_t = 150)]
        min_duration_ms: u64,
        #[arg(long, default_value = "iptables")]
        iptables: String,
        #[arg(long, default_value = "ip6tables")]
        ip6tables: String,
        /// Also write the IPv6 rules (the pod's first address is IPv6).
        #[arg(long)]
        ipv6: bool,
        /// DNS capture (`ISTIO_META_DNS_CAPTURE`): redirect DNS to the nameservers of
        /// --resolv-conf to 15053.
        #[arg(long, requires = "resolv_conf")]
        redirect_dns: bool,
        /// The pod's resolv.conf (istio-init reads the container's /etc/resolv.conf).
        #[arg(long)]
        resolv_conf: Option<PathBuf>,
        /// istio-validation in CNI mode: the CNI plugin wrote the rules; only take the time.
        #[arg(long)]
        skip_rule_apply: bool,
    },
    /// pilot-agent's DNS proxy: A/AAAA for the simulated cluster on `localhost:<port>`.
    DnsProxy {
        #[arg(long, default_value_t = istio_init::DNS_PORT)]
        port: u16,
    },
    /// The pilot-agent stand-in.
    PilotAgent(PilotAgentArgs),
    /// An app container.
    App(AppArgs),
    /// `pilot-agent request <method> <path>`: what Istio's native-sidecar preStop hook runs
    /// (`request --debug-port=15020 POST drain`).
    Request(RequestArgs),
    /// The init step of a Kuma (`kuma-init`) or Consul (`consul-connect-inject-init`) pod: the
    /// mesh's nat rules, then wait out --min-duration-ms.
    MeshInit {
        #[arg(long)]
        mesh: Mesh,
        #[arg(long, default_value_t = 150)]
        min_duration_ms: u64,
        #[arg(long, default_value = "iptables")]
        iptables: String,
        /// Kuma's builtin DNS: kuma-init's `--redirect-all-dns-traffic --redirect-dns-port`.
        #[arg(long)]
        redirect_dns_port: Option<u16>,
        /// The pod has IPv6: Kuma's ip6tables rules too (`ipFamilyMode: dualstack`).
        #[arg(long)]
        ipv6: bool,
    },
    /// The kuma-dp stand-in (Kuma's `kuma-sidecar`).
    KumaDp(KumaDpArgs),
    /// The consul-dataplane stand-in (Consul's `consul-dataplane`).
    ConsulDataplane(ConsulDataplaneArgs),
    /// `killall -USR2 kuma-dp` in the caller's container (Kuma's native-sidecar preStop hook).
    KillallUsr2KumaDp,
    /// `consul-dataplane -check-proxy-health` (Consul's native-sidecar startup probe, an exec in
    /// the container): `GET /ready` on Envoy's admin, exit 0 on a 2xx/3xx answer
    /// (hashicorp/consul-dataplane cmd/consul-dataplane/main.go `doHealthCheck`).
    ConsulCheckProxyHealth {
        #[arg(long, default_value = "127.0.0.1:19000")]
        admin: SocketAddr,
    },
    /// The remote services (echo).
    Remote {
        #[arg(long)]
        listen: SocketAddr,
        /// No services on the node's IPv6 address (the containerd backend's CNI is IPv4 only).
        #[arg(long)]
        ipv4_only: bool,
    },
}

fn main() -> anyhow::Result<()> {
    let started = Instant::now();
    // Before any thread exists: SIGUSR2 blocked in every thread (kuma-dp takes it with
    // sigwait; any other sim-app leaves it pending, as a process that ignores it), and
    // SIGTERM/SIGINT go to one waiter thread.
    let mut usr2 = nix::sys::signal::SigSet::empty();
    usr2.add(nix::sys::signal::Signal::SIGUSR2);
    usr2.thread_block()?;
    let term = TermSignal::install()?;
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Pause => apps::run_pause(&term),
        Cmd::IstioInit {
            min_duration_ms,
            iptables,
            ip6tables,
            ipv6,
            redirect_dns,
            resolv_conf,
            skip_rule_apply,
        } => {
            if skip_rule_apply {
                let rest = Duration::from_millis(min_duration_ms).saturating_sub(started.elapsed());
                std::thread::sleep(rest);
                return Ok(());
            }
            let dns_servers = match (redirect_dns, resolv_conf) {
                (true, Some(path)) => {
                    let text = std::fs::read_to_string(&path).map_err(|e| {
                        anyhow::anyhow!("cannot read resolv.conf {}: {e}", path.display())
                    })?;
                    istio_init::nameservers(&text)
                }
                _ => Vec::new(),
            };
            istio_init::run_with(
                &iptables,
                &ip6tables,
                &InitOptions { ipv6, dns_servers },
                Duration::from_millis(min_duration_ms),
                started,
            )?
        }
        Cmd::DnsProxy { port } => {
            let table = Arc::new(NameTable::sim_cluster());
            dns::serve(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), table.clone())
                .map_err(|e| anyhow::anyhow!("DNS proxy cannot listen on 127.0.0.1:{port}: {e}"))?;
            // pilot-agent listens on ::1 only when the pod has IPv6 nameservers; a pod without
            // IPv6 on lo simply has none.
            if let Err(e) = dns::serve(SocketAddr::from((Ipv6Addr::LOCALHOST, port)), table) {
                eprintln!("dns-proxy: not listening on [::1]:{port}: {e}");
            }
            eprintln!("dns-proxy: listening on localhost:{port}");
            while !term.sleep(Duration::from_secs(3600)) {}
        }
        Cmd::PilotAgent(args) => std::process::exit(pilot_agent::run(&args, &term)?),
        Cmd::App(args) => std::process::exit(apps::run_app(&args, &term)?),
        Cmd::Request(args) => pilot_status::request(&args)?,
        Cmd::MeshInit {
            mesh,
            min_duration_ms,
            iptables,
            redirect_dns_port,
            ipv6,
        } => mesh::run_init(
            mesh,
            &iptables,
            redirect_dns_port,
            ipv6,
            Duration::from_millis(min_duration_ms),
            started,
        )?,
        Cmd::KumaDp(args) => std::process::exit(dataplane::run_kuma_dp(&args, &term)?),
        Cmd::ConsulDataplane(args) => {
            std::process::exit(dataplane::run_consul_dataplane(&args, &term)?)
        }
        Cmd::ConsulCheckProxyHealth { admin } => {
            let admin = holdfast_tests::sim::mesh::AdminAddr::Tcp(admin);
            match dataplane::admin_call(&admin, "GET", "/ready") {
                Ok((code, _)) if (200..400).contains(&code) => {}
                Ok((code, body)) => {
                    eprintln!("envoy not ready: {code} {}", body.trim());
                    std::process::exit(1);
                }
                Err(e) => {
                    eprintln!("envoy admin: {e}");
                    std::process::exit(1);
                }
            }
        }
        Cmd::KillallUsr2KumaDp => {
            dataplane::killall_usr2_kuma_dp()?;
        }
        Cmd::Remote { listen, ipv4_only } => {
            let l = TcpListener::bind(listen)
                .map_err(|e| anyhow::anyhow!("remote services cannot listen on {listen}: {e}"))?;
            // The same services on the node's IPv6 address, and the cluster DNS on port 53 of
            // both (what the pods' resolv.conf names).
            // IPv6 is best effort: a host without it runs the IPv4 shapes only.
            let listen6 = SocketAddr::from((REMOTE_IP6, listen.port()));
            match (!ipv4_only).then(|| TcpListener::bind(listen6)) {
                None => {}
                Some(Ok(l6)) => {
                    std::thread::Builder::new()
                        .name("serve6".into())
                        .spawn(move || apps::serve(l6, None))?;
                }
                Some(Err(e)) => eprintln!("remote: not listening on {listen6}: {e}"),
            }
            let v4 = match listen.ip() {
                std::net::IpAddr::V4(ip) => ip,
                std::net::IpAddr::V6(_) => anyhow::bail!("--listen takes the IPv4 address"),
            };
            let table = Arc::new(NameTable::sim_cluster_at(v4));
            dns::serve(SocketAddr::from((listen.ip(), 53)), table.clone()).map_err(|e| {
                anyhow::anyhow!("cluster DNS cannot listen on {}:53: {e}", listen.ip())
            })?;
            if !ipv4_only {
                if let Err(e) = dns::serve(SocketAddr::from((REMOTE_IP6, 53)), table) {
                    eprintln!("remote: no cluster DNS on [{REMOTE_IP6}]:53: {e}");
                }
            }
            // The HTTP service (an Istio `http` service port), on both addresses too.
            let http = SocketAddr::new(listen.ip(), http_calls::REMOTE_HTTP_PORT);
            let lh = TcpListener::bind(http)
                .map_err(|e| anyhow::anyhow!("remote HTTP service cannot listen on {http}: {e}"))?;
            std::thread::Builder::new()
                .name("http".into())
                .spawn(move || http_calls::serve_http(lh))?;
            if !ipv4_only {
                let http6 = SocketAddr::from((REMOTE_IP6, http_calls::REMOTE_HTTP_PORT));
                match TcpListener::bind(http6) {
                    Ok(l6) => {
                        std::thread::Builder::new()
                            .name("http6".into())
                            .spawn(move || http_calls::serve_http(l6))?;
                    }
                    Err(e) => eprintln!("remote: no HTTP service on {http6}: {e}"),
                }
            }
            println!("ready");
            std::io::stdout().flush()?;
            apps::serve(l, None);
        }
    }
    Ok(())
}
