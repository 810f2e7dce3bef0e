//! `prewarm-gateway status --url URL`: a terminal view of a running gateway for operators
//! without a browser — pods (health, state, routing table, warm-up progress), the adapters on
//! each pod, and the top hot prefixes with the pods they are placed on. It reads the same open
//! admin API as the dashboard (`gateway/assets/dashboard/app.js`); see `docs/dashboard.md`.
//!
//! - [`model`]: the API replies it reads (only the fields it shows) and the view derived from
//!   them (residency refined per pod, placement of prefixes);
//! - [`fetch`]: reading them over HTTP;
//! - [`render`]: the plain-text tables.

pub mod fetch;
pub mod model;
pub mod render;

use std::process::ExitCode;
use std::time::Duration;

/// The `status` subcommand's flags.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// The gateway's base URL (its `server.listen`), e.g. `http://127.0.0.1:8081`.
    #[arg(long)]
    pub url: String,
    /// Hot prefixes shown (1..=1000).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub top: u16,
    /// Timeout of each HTTP call, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
}

/// Prints the view; exit code 1 (with the reason on stderr) when the API cannot be read.
pub async fn run(args: StatusArgs) -> ExitCode {
    let base = args.url.trim_end_matches('/').to_string();
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_millis(args.timeout_ms))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("prewarm-gateway status: http client: {e}");
            return ExitCode::FAILURE;
        }
    };
    match fetch::snapshot(&client, &base).await {
        Ok(snapshot) => {
            let view = model::View::of(&snapshot, usize::from(args.top));
            print!("{}", render::render(&base, &view));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("prewarm-gateway status: {e}");
            ExitCode::FAILURE
        }
    }
}
