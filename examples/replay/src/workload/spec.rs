//! `prewarm-replay workload` flags: what each stands for, its default and unit, and the check
//! that names a bad one. docs/workload.md says where each default comes from.

use std::path::PathBuf;

use clap::Args;

/// The workload's parameters (flags of `prewarm-replay workload`).
#[derive(Debug, Clone, Args)]
pub struct WorkloadArgs {
    /// Write the trace (Mooncake JSONL with the workload's fields) here.
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of every draw: the same seed and flags write the same bytes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seconds of trace to generate.
    #[arg(long, default_value_t = 900.0)]
    pub duration_s: f64,
    /// Mean requests per second of all applications together (every turn counts).
    #[arg(long, default_value_t = 4.0)]
    pub rps: f64,
    /// Applications: ServeGen's first N customers by chunk number (at most its 43).
    #[arg(long, default_value_t = 43)]
    pub apps: usize,
    /// Folder of the public traces (ServeGen, ShareGPT-500, MT-Bench, Mooncake).
    #[arg(long, default_value = "../shared/traces")]
    pub traces_dir: PathBuf,
    /// Shortest system prompt, tokens (drawn log-uniformly, rounded to whole 512-token blocks).
    #[arg(long, default_value_t = 500)]
    pub system_prompt_min_tokens: u64,
    /// Longest system prompt, tokens.
    #[arg(long, default_value_t = 8000)]
    pub system_prompt_max_tokens: u64,
    /// Share of applications with tool definitions, in [0, 1].
    #[arg(long, default_value_t = 0.3)]
    pub tool_share: f64,
    /// Most tool blocks (512 tokens, one function tool each) of an application with tools.
    #[arg(long, default_value_t = 4)]
    pub max_tool_blocks: usize,
    /// Share of applications serving through a LoRA adapter of their own, in [0, 1].
    #[arg(long, default_value_t = 0.3)]
    pub adapter_share: f64,
    /// Probability that a turn is followed by another, in [0, 1).
    #[arg(long, default_value_t = 0.4)]
    pub next_turn_share: f64,
    /// Most turns of a conversation.
    #[arg(long, default_value_t = 3)]
    pub max_turns: usize,
    /// Mean seconds from a turn's arrival to the next turn's (exponential).
    #[arg(long, default_value_t = 30.0)]
    pub think_time_s: f64,
    /// Share of conversations whose client sends no `user`, in [0, 1].
    #[arg(long, default_value_t = 0.2)]
    pub no_user_share: f64,
    /// Mean conversations one user starts over the generated span (sets each application's
    /// user pool).
    #[arg(long, default_value_t = 2.0)]
    pub conversations_per_user: f64,
    /// Largest inter-arrival CV of an application's conversation starts (ServeGen's mean CV
    /// clamped to [0.5, this]).
    #[arg(long, default_value_t = 4.0)]
    pub max_cv: f64,
}

/// Smallest inter-arrival CV used (a near-zero mean CV comes from customers with a handful of
/// windows and would make arrivals clockwork).
pub const MIN_CV: f64 = 0.5;
/// Most requests a workload may expect (`--rps` × `--duration-s`).
pub const MAX_EXPECTED_REQUESTS: f64 = 5_000_000.0;

impl WorkloadArgs {
    /// Every bad flag, as `--flag: value: rule`, joined by `; `.
    pub fn check(&self) -> Result<(), String> {
        let mut bad = Vec::new();
        let mut range = |flag: &str, v: f64, ok: bool, rule: &str| {
            if !ok || !v.is_finite() {
                bad.push(format!("{flag}: {v}: {rule}"));
            }
        };
        let d = self.duration_s;
        range(
            "--duration-s",
            d,
            d > 0.0 && d <= 86_400.0,
            "must be in (0, 86400]",
        );
        let r = self.rps;
        range(
            "--rps",
            r,
            r > 0.0 && r <= 10_000.0,
            "must be in (0, 10000]",
        );
        for (flag, v) in [
            ("--tool-share", self.tool_share),
            ("--adapter-share", self.adapter_share),
            ("--no-user-share", self.no_user_share),
        ] {
            range(flag, v, (0.0..=1.0).contains(&v), "must be in [0, 1]");
        }
        let n = self.next_turn_share;
        range(
            "--next-turn-share",
            n,
            (0.0..1.0).contains(&n),
            "must be in [0, 1)",
        );
        let t = self.think_time_s;
        range(
            "--think-time-s",
            t,
            t > 0.0 && t <= 3600.0,
            "must be in (0, 3600]",
        );
        let c = self.conversations_per_user;
        range(
            "--conversations-per-user",
            c,
            (1.0..=1000.0).contains(&c),
            "must be in [1, 1000]",
        );
        let m = self.max_cv;
        range(
            "--max-cv",
            m,
            (MIN_CV..=32.0).contains(&m),
            "must be in [0.5, 32]",
        );
        if d.is_finite() && r.is_finite() && d * r > MAX_EXPECTED_REQUESTS {
            bad.push(format!(
                "--rps: {r}: {r} × --duration-s {d} must be at most {MAX_EXPECTED_REQUESTS} requests"
            ));
        }
        if !(1..=10_000).contains(&self.apps) {
            bad.push(format!("--apps: {}: must be in [1, 10000]", self.apps));
        }
        let (lo, hi) = (self.system_prompt_min_tokens, self.system_prompt_max_tokens);
        if !(1..=65_536).contains(&lo) {
            bad.push(format!(
                "--system-prompt-min-tokens: {lo}: must be in [1, 65536]"
            ));
        }
        if !(lo.max(1)..=65_536).contains(&hi) {
            bad.push(format!(
                "--system-prompt-max-tokens: {hi}: must be in [--system-prompt-min-tokens, 65536]"
            ));
        }
        if !(1..=64).contains(&self.max_tool_blocks) {
            bad.push(format!(
                "--max-tool-blocks: {}: must be in [1, 64]",
                self.max_tool_blocks
            ));
        }
        if !(1..=64).contains(&self.max_turns) {
            bad.push(format!(
                "--max-turns: {}: must be in [1, 64]",
                self.max_turns
            ));
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(bad.join("; "))
        }
    }

    /// Expected turns of a conversation: Σ_{k < max_turns} next_turn_share^k.
    pub fn mean_turns(&self) -> f64 {
        (0..self.max_turns)
            .map(|k| self.next_turn_share.powi(k as i32))
            .sum()
    }
}
