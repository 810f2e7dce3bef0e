//! `prewarm-gateway status --url URL`: a terminal view of a running gateway for operators
//! without a browser — pods (health, state, routing table, warm-up progress), the adapters on
//! each pod, and the top hot prefixes with the pods they are placed on. It reads the same admin
//! API as the dashboard, with the read token (`--token` or `PREWARM_READ_TOKEN`) (`gateway/assets/dashboard/app.js`); see `docs/dashboard.md`.
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
    /// The gateway's read token (or its admin token), sent as a bearer header; defaults to the
    /// environment variable `PREWARM_READ_TOKEN` (prefer it: a flag shows in `ps`).
    #[arg(long, env = prewarm_gateway::config::READ_TOKEN_ENV, hide_env_values = true, default_value = "")]
    pub token: String,
    /// Timeout of each HTTP call, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
}

/// Prints the view; exit code 1 (with the reason on stderr) when the API cannot be read.
pub async fn run(args: StatusArgs) -> ExitCode {
    let base = args.url.trim_end_matches('/').to_string();
    let mut headers = reqwest::header::HeaderMap::new();
    if !args.token.is_empty() {
        match reqwest::header::HeaderValue::from_str(&format!("Bearer {}", args.token)) {
            Ok(mut v) => {
                v.set_sensitive(true);
                headers.insert(reqwest::header::AUTHORIZATION, v);
            }
            Err(_) => {
                eprintln!("prewarm-gateway status: --token: (hidden): must be visible ASCII");
                return ExitCode::from(2);
            }
        }
    }
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_millis(args.timeout_ms))
        .default_headers(headers)
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
