//! Applications: one per ServeGen customer, each with its popularity, burstiness, system
//! prompt, tools, adapter and user pool.
//!
//! Block ids: application `a`'s (its index) system block `k` is `APP_FIRST_ID + a·2^16 + k` and
//! its tool block `j` is `APP_FIRST_ID + a·2^16 + 2^15 + j`, in [2^50, 2^51); the
//! conversations' own blocks count up from [`CONVERSATION_FIRST_ID`] (2^51). Mooncake traces
//! number their blocks up from 0 (the shared ones stay below 50,000), the `--system-prompt-tokens`
//! blocks start at [`crate::system_prompt::SYSTEM_PROMPT_FIRST_ID`] (0xF000…), and every id
//! stays below 2^53, so JSON tools that read numbers as doubles (`jq`, JavaScript) keep them
//! exact. So an application's system prompt and tools render to the same bytes for every
//! request of it, and to different bytes from every other application's.

use super::draws::{Draws, Purpose};
use super::sources::Customer;
use super::spec::{WorkloadArgs, MIN_CV};
use crate::trace::TRACE_BLOCK_TOKENS;

/// First id of the applications' system-prompt and tool blocks.
pub const APP_FIRST_ID: u64 = 1 << 50;
/// First id of the conversations' own blocks (user messages and replies), counted up.
pub const CONVERSATION_FIRST_ID: u64 = 1 << 51;
/// Ids per application.
const APP_ID_SPAN: u64 = 1 << 16;
/// Offset of the tool blocks within an application's ids.
const TOOL_ID_OFFSET: u64 = 1 << 15;

/// One application of the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Application {
    /// `app-<chunk>`.
    pub id: String,
    /// The ServeGen customer it stands for.
    pub customer: u32,
    /// Mean requests per second (all turns).
    pub rate_per_s: f64,
    /// Inter-arrival CV of its conversation starts.
    pub cv: f64,
    /// Its system prompt's block ids.
    pub system_ids: Vec<u64>,
    /// Its tool definitions' block ids (empty: no tools).
    pub tool_ids: Vec<u64>,
    /// `app-<chunk>-lora` for an application on an adapter.
    pub adapter: Option<String>,
    /// `app-<chunk>` for an application on an adapter (tiers go by its requests).
    pub tenant: Option<String>,
    /// Users it draws its user-carrying conversations from.
    pub users: usize,
}

/// The applications of `customers` (the first `args.apps`), rates scaled to `args.rps`.
pub fn plan_applications(args: &WorkloadArgs, customers: &[Customer]) -> Vec<Application> {
    let customers = customers
        .get(..args.apps.min(customers.len()))
        .unwrap_or(&[]);
    let total: f64 = customers.iter().map(|c| c.mean_rate).sum();
    let n = customers.len();
    let with_tools = chosen(args.seed, Purpose::ToolChoice, n, args.tool_share);
    let with_adapter = chosen(args.seed, Purpose::AdapterChoice, n, args.adapter_share);
    let mean_turns = args.mean_turns();
    customers
        .iter()
        .enumerate()
        .map(|(a, c)| {
            let mut draws = Draws::new(args.seed, Purpose::Application, a as u64);
            let base = APP_FIRST_ID + a as u64 * APP_ID_SPAN;
            let system = system_prompt_blocks(args, &mut draws);
            let tools = if with_tools.contains(&a) {
                1 + draws.below(args.max_tool_blocks)
            } else {
                0
            };
            let rate_per_s = if total > 0.0 {
                args.rps * c.mean_rate / total
            } else {
                0.0
            };
            let conversations = rate_per_s / mean_turns * args.duration_s;
            let with_user = conversations * (1.0 - args.no_user_share);
            let id = format!("app-{}", c.chunk);
            let on_adapter = with_adapter.contains(&a);
            Application {
                customer: c.chunk,
                rate_per_s,
                cv: c.mean_cv.clamp(MIN_CV, args.max_cv),
                system_ids: (0..system as u64).map(|k| base + k).collect(),
                tool_ids: (0..tools as u64)
                    .map(|j| base + TOOL_ID_OFFSET + j)
                    .collect(),
                adapter: on_adapter.then(|| format!("{id}-lora")),
                tenant: on_adapter.then(|| id.clone()),
                users: ((with_user / args.conversations_per_user).round() as usize).max(1),
                id,
            }
        })
        .collect()
}

/// Exactly `round(share · n)` of `0..n`, seeded.
fn chosen(seed: u64, purpose: Purpose, n: usize, share: f64) -> Vec<usize> {
    let count = ((share * n as f64).round() as usize).min(n);
    let mut picked = Draws::new(seed, purpose, 0).shuffled(n);
    picked.truncate(count);
    picked
}

/// A system prompt's length in whole trace blocks: tokens log-uniform in [min, max], rounded to
/// the nearest block, at least one.
fn system_prompt_blocks(args: &WorkloadArgs, draws: &mut Draws) -> usize {
    let (lo, hi) = (
        args.system_prompt_min_tokens as f64,
        args.system_prompt_max_tokens as f64,
    );
    let tokens = lo * (hi / lo).powf(draws.unit());
    ((tokens / TRACE_BLOCK_TOKENS as f64).round() as usize).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::tests_support::args;

    fn customers(n: u32) -> Vec<Customer> {
        (0..n)
            .map(|chunk| Customer {
                chunk,
                mean_rate: f64::from(chunk + 1),
                mean_cv: f64::from(chunk) * 0.5,
            })
            .collect()
    }

    #[test]
    fn rates_follow_the_customers_and_shares_are_exact() {
        let apps = plan_applications(&args(&["--apps", "10", "--rps", "11"]), &customers(40));
        assert_eq!(apps.len(), 10);
        // rates 1..=10 scaled to a total of 11
        for (i, a) in apps.iter().enumerate() {
            assert!((a.rate_per_s - 11.0 * (i + 1) as f64 / 55.0).abs() < 1e-12);
            assert!((MIN_CV..=4.0).contains(&a.cv));
        }
        assert_eq!(apps.iter().filter(|a| !a.tool_ids.is_empty()).count(), 3);
        assert_eq!(apps.iter().filter(|a| a.adapter.is_some()).count(), 3);
        for a in &apps {
            assert_eq!(a.adapter.is_some(), a.tenant.is_some());
            assert!((1..=4).contains(&a.tool_ids.len()) || a.tool_ids.is_empty());
        }
    }

    #[test]
    fn system_prompts_span_the_range_in_whole_blocks_with_ids_of_their_own() {
        let apps = plan_applications(&args(&["--apps", "40"]), &customers(40));
        let blocks: Vec<usize> = apps.iter().map(|a| a.system_ids.len()).collect();
        // 500–8,000 tokens: 1 to 16 blocks of 512, both ends reached over 40 draws
        assert!(blocks.iter().all(|b| (1..=16).contains(b)), "{blocks:?}");
        assert!(blocks.iter().any(|b| *b <= 2) && blocks.iter().any(|b| *b >= 12));
        let mut ids: Vec<u64> = apps
            .iter()
            .flat_map(|a| a.system_ids.iter().chain(&a.tool_ids).copied())
            .collect();
        let all = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), all, "no id is shared between applications");
        assert!(ids
            .iter()
            .all(|id| (APP_FIRST_ID..CONVERSATION_FIRST_ID).contains(id)));
    }
}
