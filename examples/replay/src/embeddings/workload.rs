//! The embeddings workload, pure: real prompts (ShareGPT's first user messages) sent to
//! `/v1/embeddings` with Zipf repeats, the way RAG and search services re-send the same chunks
//! and queries.
//!
//! Which prompt is hot is a seeded permutation; each request's inputs are drawn by Zipf rank
//! (probability ∝ 1 / rank^s) and arrivals are Poisson at the given rate. The same seed and
//! parameters give the same sequence. With `s` = 0 every prompt is as likely; the larger `s`,
//! the larger the share of inputs that repeat an earlier one ([`expected_repeat_share`]).

use std::path::Path;

use serde::Deserialize;

use crate::render::splitmix64;

/// Most prompts a workload reads (ShareGPT slices in `../shared/traces` hold 500).
pub const MAX_PROMPTS: usize = 100_000;

#[derive(Deserialize)]
struct Conversation {
    conversations: Vec<Message>,
}

#[derive(Deserialize)]
struct Message {
    from: String,
    value: String,
}

/// The first human message of each ShareGPT conversation (JSON list), without blanks and
/// exact duplicates, in file order.
pub fn parse_sharegpt(text: &str) -> Result<Vec<String>, String> {
    let conversations: Vec<Conversation> =
        serde_json::from_str(text).map_err(|e| format!("ShareGPT JSON: {e}"))?;
    let mut seen = std::collections::HashSet::new();
    let mut prompts = Vec::new();
    for c in conversations {
        let Some(first) = c.conversations.into_iter().find(|m| m.from == "human") else {
            continue;
        };
        if first.value.trim().is_empty() || !seen.insert(first.value.clone()) {
            continue;
        }
        prompts.push(first.value);
        if prompts.len() == MAX_PROMPTS {
            break;
        }
    }
    if prompts.is_empty() {
        return Err("ShareGPT file: no human message".into());
    }
    Ok(prompts)
}

/// [`parse_sharegpt`] of a file.
pub fn load_sharegpt(path: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_sharegpt(&text)
}

/// The shape of a workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkloadSpec {
    /// Requests to draw.
    pub requests: usize,
    /// Inputs per request.
    pub batch: usize,
    /// Zipf exponent `s` ≥ 0 over the prompts' popularity ranks.
    pub zipf_s: f64,
    /// Mean arrival rate, requests per second (> 0).
    pub rate_per_s: f64,
    pub seed: u64,
}

/// One request of the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedRequest {
    /// Seconds from the start.
    pub at_s: f64,
    /// Indices into the prompt list.
    pub inputs: Vec<usize>,
}

fn unit(state: &mut u64) -> f64 {
    (splitmix64(state) >> 11) as f64 / (1u64 << 53) as f64
}

/// Zipf probabilities of ranks 1..=n.
fn zipf_weights(n: usize, s: f64) -> Vec<f64> {
    let raw: Vec<f64> = (1..=n).map(|k| 1.0 / (k as f64).powf(s)).collect();
    let total: f64 = raw.iter().sum();
    raw.into_iter().map(|w| w / total).collect()
}

/// The requests of `spec` over `prompts` prompts.
pub fn plan(prompts: usize, spec: &WorkloadSpec) -> Vec<PlannedRequest> {
    if prompts == 0 {
        return Vec::new();
    }
    let mut state = spec.seed ^ 0x656d_6265_6464_696e;
    // Which prompt holds each popularity rank: a seeded Fisher–Yates shuffle.
    let mut by_rank: Vec<usize> = (0..prompts).collect();
    for i in (1..prompts).rev() {
        let j = (splitmix64(&mut state) % (i as u64 + 1)) as usize;
        by_rank.swap(i, j);
    }
    let mut cumulative = zipf_weights(prompts, spec.zipf_s);
    let mut acc = 0.0;
    for w in &mut cumulative {
        acc += *w;
        *w = acc;
    }
    let mut at_s = 0.0;
    (0..spec.requests)
        .map(|_| {
            at_s += -(1.0 - unit(&mut state)).ln() / spec.rate_per_s;
            let inputs = (0..spec.batch)
                .map(|_| {
                    let u = unit(&mut state);
                    let rank = cumulative.partition_point(|c| *c <= u).min(prompts - 1);
                    by_rank.get(rank).copied().unwrap_or(0)
                })
                .collect();
            PlannedRequest { at_s, inputs }
        })
        .collect()
}

/// Share of the inputs of `requests` that repeat an earlier input.
pub fn repeat_share(requests: &[PlannedRequest]) -> f64 {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0usize;
    let mut repeats = 0usize;
    for input in requests.iter().flat_map(|r| &r.inputs) {
        total += 1;
        if !seen.insert(*input) {
            repeats += 1;
        }
    }
    if total == 0 {
        0.0
    } else {
        repeats as f64 / total as f64
    }
}

/// The expected [`repeat_share`] of `draws` Zipf(`s`) draws over `prompts` prompts:
/// 1 − E[distinct] / draws, with E[distinct] = Σₖ 1 − (1 − pₖ)^draws.
pub fn expected_repeat_share(prompts: usize, s: f64, draws: usize) -> f64 {
    if draws == 0 {
        return 0.0;
    }
    let distinct: f64 = zipf_weights(prompts, s)
        .iter()
        .map(|p| 1.0 - (1.0 - p).powf(draws as f64))
        .sum();
    1.0 - distinct / draws as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(zipf_s: f64, seed: u64) -> WorkloadSpec {
        WorkloadSpec {
            requests: 4000,
            batch: 1,
            zipf_s,
            rate_per_s: 50.0,
            seed,
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_sequence() {
        let a = plan(500, &spec(1.0, 7));
        assert_eq!(a, plan(500, &spec(1.0, 7)));
        assert_ne!(a, plan(500, &spec(1.0, 8)));
        assert!(a.windows(2).all(|w| w[0].at_s < w[1].at_s));
        // Poisson at 50/s: 4000 requests take about 80 s.
        let last = a.last().unwrap().at_s;
        assert!((70.0..90.0).contains(&last), "{last}");
    }

    #[test]
    fn the_repeat_share_follows_the_zipf_exponent() {
        let mut previous = -1.0;
        for s in [0.0, 0.6, 1.0, 1.4] {
            let got = repeat_share(&plan(500, &spec(s, 3)));
            let want = expected_repeat_share(500, s, 4000);
            assert!((got - want).abs() < 0.02, "s={s}: {got} vs {want}");
            assert!(got > previous, "s={s}: {got} not above {previous}");
            previous = got;
        }
    }

    #[test]
    fn sharegpt_first_human_messages_without_blanks_or_duplicates() {
        let text = r#"[
            {"id":"a","conversations":[{"from":"human","value":"one"}]},
            {"id":"b","conversations":[{"from":"gpt","value":"x"},{"from":"human","value":"two"}]},
            {"id":"c","conversations":[{"from":"human","value":"one"}]},
            {"id":"d","conversations":[{"from":"human","value":"  "}]},
            {"id":"e","conversations":[]}
        ]"#;
        assert_eq!(parse_sharegpt(text).unwrap(), vec!["one", "two"]);
        assert!(parse_sharegpt("[]").is_err());
        assert!(parse_sharegpt("{").is_err());
    }

    #[test]
    fn the_shared_sharegpt_slice_reads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/traces/sharegpt-500/prompts.json");
        let prompts = load_sharegpt(&path).unwrap();
        assert!(prompts.len() > 400, "{}", prompts.len());
    }
}
