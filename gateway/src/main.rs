//! `prewarm-gateway`: `serve`, `check-config`, `plan`, `status`, `fingerprint`, `arm` and
//! `compare`. See `docs/gateway-config.md`.
//!
//! Exit codes: 0 success; 64 invalid configuration (every problem printed); 1 runtime failure;
//! 2 bad command-line usage.

mod status;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use prewarm_gateway::config::{ConfigError, GatewayConfig};
use prewarm_gateway::policy::fleet::Candidates;
use prewarm_gateway::server::{serve, shutdown_requested};
use prewarm_gateway::service::planning::PlanView;
use prewarm_gateway::service::{now_ms, Gateway};
use prewarm_gateway::traces::TraceExport;

const EXIT_CONFIG: u8 = 64;

#[derive(Parser)]
#[command(
    name = "prewarm-gateway",
    version,
    about = "prewarm's gateway: warm caches on inference pods before traffic needs them"
)]
struct Cli {
    /// Log lines on stderr: `text` (human-readable) or `json` (one JSON object a line, with
    /// `timestamp`, `level`, `target`, `message` and the event's fields at the top level).
    /// Default: `PREWARM_LOG_FORMAT`, else `text`.
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// The TOML configuration.
        #[arg(long)]
        config: PathBuf,
    },
    /// Validate a configuration: prints every problem and exits 64 when there is one.
    CheckConfig {
        #[arg(long)]
        config: PathBuf,
    },
    /// Print (JSON) the warm-up plan a pod would get now, from the snapshot; no pod is contacted.
    Plan {
        #[arg(long)]
        config: PathBuf,
        /// The pod's id (from `pods.static`).
        #[arg(long)]
        pod: String,
    },
    /// Print a running gateway's pods, warm-up progress, adapters per pod and top prefixes.
    Status(status::StatusArgs),
    /// Print (JSON) core's block hashes of the canonical text on stdin for `--model`: what a
    /// filter signals for it, what `/v1/signals` checks a prefix against.
    Fingerprint {
        #[arg(long)]
        model: String,
        /// Tokens per block (`fingerprint.block_tokens`).
        #[arg(long, default_value_t = 64)]
        block_tokens: usize,
        /// Read one JSON string (a text) per line and print one JSON object per line.
        #[arg(long)]
        jsonl: bool,
    },
    /// Print (one JSON string a line) the arm the filters give each unit read on stdin (one JSON
    /// string a line: a user, else tenant, else connection) in `--experiment` (its JSON, as
    /// posted): core's assignment, for tools that split requests by arm.
    Arm {
        #[arg(long)]
        experiment: String,
    },
    /// Print (JSON) two samples compared by the experiment report's rule (Welch's t and
    /// Mann-Whitney U, significant when both p < 0.01): reads `{"arm": [..], "reference": [..]}`
    /// on stdin, for cohorts a tool holds itself; with `arm_prompt_tokens` and
    /// `reference_prompt_tokens` (one a value) also adjusted for prompt length.
    Compare,
}

fn compare() -> ExitCode {
    match prewarm_gateway::attribution::compare::compare_input(std::io::stdin().lock()) {
        Ok(c) => {
            println!("{}", serde_json::to_string(&c).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(problem) => {
            eprintln!("prewarm-gateway compare: stdin: {problem}");
            ExitCode::from(2)
        }
    }
}

fn arm(experiment: &str) -> ExitCode {
    let experiment: prewarm_core::experiment::Experiment = match serde_json::from_str(experiment) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("prewarm-gateway arm: --experiment: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(problem) = experiment.problem() {
        eprintln!("prewarm-gateway arm: --experiment: {problem}");
        return ExitCode::from(2);
    }
    json_lines("arm", |unit| {
        let name = experiment
            .arms
            .get(experiment.arm_of(unit.as_bytes()))
            .map_or("", |a| a.name.as_str());
        println!("{}", serde_json::Value::String(name.to_string()));
    })
}

/// Calls `each` with every line of stdin, each a JSON string; a line that is not one ends it
/// with exit code 2 and a message naming the line.
fn json_lines(command: &str, mut each: impl FnMut(String)) -> ExitCode {
    use std::io::BufRead;
    for (i, line) in std::io::stdin().lock().lines().enumerate() {
        let parsed = line
            .map_err(|e| e.to_string())
            .and_then(|l| serde_json::from_str::<String>(&l).map_err(|e| e.to_string()));
        match parsed {
            Ok(text) => each(text),
            Err(e) => {
                eprintln!("prewarm-gateway {command}: line {}: {e}", i + 1);
                return ExitCode::from(2);
            }
        }
    }
    ExitCode::SUCCESS
}

fn fingerprint(model: &str, block_tokens: usize, jsonl: bool) -> ExitCode {
    use std::io::Read;
    let config = prewarm_core::FingerprintConfig {
        block_tokens,
        ..prewarm_core::FingerprintConfig::default()
    };
    if let Some(problem) = config.validate().first() {
        eprintln!("prewarm-gateway fingerprint: --{problem}");
        return ExitCode::from(2);
    }
    let chain_json = |text: &[u8]| {
        let chain = prewarm_core::BlockChain::of(model, text, &config);
        let key = chain
            .prefix_fingerprint()
            .map(|last| prewarm_gateway::policy::PrefixKey::new(model, last).to_string());
        serde_json::json!({"blocks": chain.blocks, "key": key, "prompt_tokens": chain.prompt_tokens})
    };
    if jsonl {
        return json_lines("fingerprint", |text| {
            println!("{}", chain_json(text.as_bytes()))
        });
    }
    let mut text = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut text) {
        eprintln!("prewarm-gateway fingerprint: stdin: {e}");
        return ExitCode::FAILURE;
    }
    println!("{}", chain_json(&text));
    ExitCode::SUCCESS
}

fn load(path: &std::path::Path) -> Result<GatewayConfig, ExitCode> {
    GatewayConfig::load(path).map_err(|e| {
        match &e {
            ConfigError::Invalid(problems) => {
                eprintln!(
                    "prewarm-gateway: {}: {} problem(s):",
                    path.display(),
                    problems.len()
                );
                for p in problems {
                    eprintln!("  {p}");
                }
            }
            other => eprintln!("prewarm-gateway: {other}"),
        }
        ExitCode::from(EXIT_CONFIG)
    })
}

/// The log format: `--log-format`, else `PREWARM_LOG_FORMAT` (set and not empty), else text. A
/// bad value of the variable is an error naming it (clap names the flag's).
fn log_format(flag: Option<LogFormat>) -> Result<LogFormat, String> {
    use clap::ValueEnum;
    if let Some(format) = flag {
        return Ok(format);
    }
    let var = "PREWARM_LOG_FORMAT";
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => LogFormat::from_str(&v, false)
            .map_err(|_| format!("{var}: {v:?}: not a log format (text, json)")),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(LogFormat::Text),
        Err(e) => Err(format!("{var}: {e}")),
    }
}

/// The log filter: `PREWARM_LOG`, else `RUST_LOG` (the first set and not empty), else `info`,
/// in `EnvFilter`'s syntax (`warn,prewarm_gateway::service=debug`). A filter that does not
/// parse is an error naming the variable, not a silent `info`.
fn log_filter() -> Result<tracing_subscriber::EnvFilter, String> {
    for var in ["PREWARM_LOG", "RUST_LOG"] {
        let Some(value) = std::env::var_os(var).filter(|v| !v.is_empty()) else {
            continue;
        };
        let value = value
            .into_string()
            .map_err(|v| format!("{var}: {v:?}: not UTF-8"))?;
        return tracing_subscriber::EnvFilter::builder()
            .parse(&value)
            .map_err(|e| format!("{var}: {value:?}: {e}"));
    }
    Ok(tracing_subscriber::EnvFilter::new("info"))
}

/// Logs to stderr in `format` at [`log_filter`]'s level, plus the warm-up spans' export when
/// `[traces]` is on (whatever the log level).
fn init_logging(
    format: LogFormat,
    filter: tracing_subscriber::EnvFilter,
    traces: Option<&TraceExport>,
) {
    use tracing_subscriber::prelude::*;
    use tracing_subscriber::{Layer, Registry};
    let text = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let logs: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Text => Box::new(text),
        // The event's fields (`message` among them) at the top level, beside `level` and
        // `target`: what log shippers index without a nested path.
        LogFormat::Json => Box::new(text.json().flatten_event(true)),
    };
    let _ = tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(traces.map(TraceExport::layer))
        .try_init();
}

/// A tokio runtime (multi-threaded for `serve`); `None` after printing why it failed.
fn runtime(multi_thread: bool) -> Option<tokio::runtime::Runtime> {
    let mut builder = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder
        .enable_all()
        .build()
        .map_err(|e| eprintln!("prewarm-gateway: runtime: {e}"))
        .ok()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let logging = log_format(cli.log_format).and_then(|format| Ok((format, log_filter()?)));
    let (log_format, filter) = match logging {
        Ok(logging) => logging,
        Err(problem) => {
            eprintln!("prewarm-gateway: {problem}");
            return ExitCode::from(2);
        }
    };
    let mut filter = Some(filter);
    if !matches!(cli.command, Command::Serve { .. }) {
        if let Some(f) = filter.take() {
            init_logging(log_format, f, None);
        }
    }
    std::panic::set_hook(Box::new(|info| {
        tracing::error!(%info, "panic");
    }));
    match cli.command {
        Command::CheckConfig { config } => match load(&config) {
            Ok(_) => {
                println!("{}: ok", config.display());
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        Command::Plan { config, pod } => {
            let config = match load(&config) {
                Ok(c) => c,
                Err(code) => return code,
            };
            let Some(runtime) = runtime(false) else {
                return ExitCode::FAILURE;
            };
            runtime.block_on(async move {
                let gateway = Gateway::new(config);
                gateway.restore();
                let plan = gateway
                    .state()
                    .fleet
                    .plan_for(&pod, Candidates::All, now_ms());
                match plan {
                    Some(plan) => {
                        println!(
                            "{}",
                            serde_json::to_string_pretty(&PlanView::from(&plan))
                                .unwrap_or_default()
                        );
                        ExitCode::SUCCESS
                    }
                    None => {
                        eprintln!("prewarm-gateway: pod: {pod:?}: not in pods.static");
                        ExitCode::from(2)
                    }
                }
            })
        }
        Command::Fingerprint {
            model,
            block_tokens,
            jsonl,
        } => fingerprint(&model, block_tokens, jsonl),
        Command::Arm { experiment } => arm(&experiment),
        Command::Compare => compare(),
        Command::Status(args) => {
            runtime(false).map_or(ExitCode::FAILURE, |rt| rt.block_on(status::run(args)))
        }
        Command::Serve { config } => {
            let config = match load(&config) {
                Ok(c) => c,
                Err(code) => return code,
            };
            // Before the runtime: the exporter's blocking client belongs to its own thread.
            let traces = match TraceExport::start(&config.traces) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("prewarm-gateway: {e}");
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            if let Some(f) = filter.take() {
                init_logging(log_format, f, traces.as_ref());
            }
            let Some(runtime) = runtime(true) else {
                return ExitCode::FAILURE;
            };
            let code = runtime.block_on(serve(config, shutdown_requested()));
            runtime.shutdown_timeout(std::time::Duration::from_secs(2));
            if let Some(t) = traces {
                t.shutdown();
            }
            ExitCode::from(code.clamp(0, 255) as u8)
        }
    }
}
