use clap::Parser;

/// holdfast: startup and shutdown ordering for Envoy sidecars, run from the node.
#[derive(Parser)]
#[command(name = "holdfast", version, about)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
}
