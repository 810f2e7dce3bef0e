//! `prewarm-replay`: see [`prewarm_replay::cli`].

use clap::Parser;
use prewarm_replay::cli::{run_assignment, run_offline, Cli, Command};

fn main() {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Offline(args) => run_offline(args),
        Command::Live(args) => prewarm_replay::live::run_live(args),
        Command::Report(args) => prewarm_replay::comparison::run_report(args),
        Command::Assignment(args) => run_assignment(args),
        Command::Embeddings(args) => prewarm_replay::embeddings::run_embeddings(args),
        Command::Workload(args) => prewarm_replay::workload::run_workload(args),
    };
    if let Err(e) = result {
        eprintln!("prewarm-replay: {e}");
        std::process::exit(64);
    }
}
