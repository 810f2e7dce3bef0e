//! Live replay over HTTP.
use clap::Args;

#[derive(Debug, Clone, Args)]
pub struct LiveArgs {
    #[command(flatten)]
    pub common: crate::cli::TraceArgs,
    #[arg(long)]
    pub target: String,
}

pub fn run_live(_args: &LiveArgs) -> Result<(), String> {
    Err("live: not yet".into())
}
