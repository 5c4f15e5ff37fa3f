//! The simulated node's stand-in programs, one subcommand each. Only argument parsing lives here;
//! the behaviour is in `holdfast_tests::sim::{apps, pilot_agent, istio_init}`.
//!
//! - `pause`: the pod sandbox (holds the pod's netns; exits on SIGTERM).
//! - `istio-init`: installs Istio's nat rules in the current netns (the init container).
//! - `pilot-agent`: starts Envoy as uid 1337 and applies pilot-agent's drain on SIGTERM.
//! - `app`: the app container, scripted by flags; writes a JSON-lines report.
//! - `remote`: the remote services (`ping\n` → `pong\n`), prints `ready` once listening.

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use holdfast_tests::sim::apps::{self, AppArgs, TermSignal};
use holdfast_tests::sim::istio_init;
use holdfast_tests::sim::pilot_agent::{self, PilotAgentArgs};

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
    },
    /// The pilot-agent stand-in.
    PilotAgent(PilotAgentArgs),
    /// An app container.
    App(AppArgs),
    /// The remote services (echo).
    Remote {
        #[arg(long)]
        listen: SocketAddr,
    },
}

fn main() -> anyhow::Result<()> {
    let started = Instant::now();
    // Before any thread exists: SIGTERM/SIGINT go to one waiter thread.
    let term = TermSignal::install()?;
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Pause => apps::run_pause(&term),
        Cmd::IstioInit {
            min_duration_ms,
            iptables,
        } => istio_init::run(&iptables, Duration::from_millis(min_duration_ms), started)?,
        Cmd::PilotAgent(args) => std::process::exit(pilot_agent::run(&args, &term)?),
        Cmd::App(args) => std::process::exit(apps::run_app(&args, &term)?),
        Cmd::Remote { listen } => {
            let l = TcpListener::bind(listen)
                .map_err(|e| anyhow::anyhow!("remote services cannot listen on {listen}: {e}"))?;
            println!("ready");
            std::io::stdout().flush()?;
            apps::serve(l, None);
        }
    }
    Ok(())
}
