//! The application workload (`prewarm-replay workload`) end to end over the shared public
//! traces: deterministic bytes, applications' prompts shared and distinct, ServeGen rates,
//! conversations the chat replayer renders as turns, requests without `user`, and the offline
//! evaluator reading the trace as it is.

mod generation;
mod rendering;

use std::path::{Path, PathBuf};

use clap::Parser;
use prewarm_replay::cli::{Cli, Command};
use prewarm_replay::live::chat::{ChatPrompt, ChatRenderer};
use prewarm_replay::render::BlockTexts;
use prewarm_replay::trace::TraceRequest;
use prewarm_replay::workload::sources::{load, Sources};
use prewarm_replay::workload::{generate, Workload, WorkloadArgs};

pub fn traces_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces")
}

pub fn sources() -> Sources {
    load(&traces_dir()).unwrap()
}

pub fn args(out: &Path, extra: &[&str]) -> WorkloadArgs {
    let dir = traces_dir();
    let mut argv = vec!["prewarm-replay", "workload", "--out", out.to_str().unwrap()];
    if !extra.contains(&"--traces-dir") {
        argv.extend_from_slice(&["--traces-dir", dir.to_str().unwrap()]);
    }
    argv.extend_from_slice(extra);
    match Cli::parse_from(argv).command {
        Command::Workload(a) => a,
        _ => unreachable!("workload was asked for"),
    }
}

pub fn workload(extra: &[&str]) -> Workload {
    generate(&args(Path::new("/dev/null"), extra), &sources()).unwrap()
}

pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("replay-workload-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Every request's chat rendering, in trace order.
pub fn render(requests: &[TraceRequest]) -> Vec<ChatPrompt> {
    let mut texts = BlockTexts::default();
    let mut chat = ChatRenderer::default();
    requests
        .iter()
        .map(|r| chat.prompt(r, &mut texts))
        .collect()
}
