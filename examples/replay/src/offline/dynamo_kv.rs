//! `dynamo_kv`: NVIDIA Dynamo's KV router, as a baseline.
//!
//! Dynamo learns each worker's cached blocks exactly from the engines' KV events (block stored,
//! block removed) and tracks, itself, the requests it sent that are still running. For a
//! request it computes, per worker,
//!
//! - overlap: the request's leading blocks cached on the worker — here read from the podsim pod
//!   model's KV state (`Pod::cached_prefix_tokens`), which is what KV events would tell it;
//! - prefill blocks: (prompt tokens of the worker's requests still in prefill + the request's
//!   tokens not in the overlap) / block size;
//! - decode blocks: the blocks of the worker's running requests (prompt plus the tokens
//!   generated so far) + the request's own blocks;
//!
//! and sends it to the worker of least `overlap_score_weight × prefill blocks + decode blocks`.
//! Defaults are Dynamo's documented ones (docs/baselines.md cites them): weight 1, temperature 0
//! (the minimum, no sampling), block size the engine's (16 for vLLM). Ties between workers of
//! equal cost are broken by a draw from a fixed seed (Dynamo's docs do not say how it breaks
//! them at temperature 0; a draw avoids favouring low pod indices), so runs are repeatable.
//! Adapters: the pods whose GPU slots hold the request's adapter first ([`adapter_first_pool`]),
//! the LoRA awareness llm-d and Dynamo give. A running request's blocks are counted whole even
//! when another request on the worker shares them.

use podsim::Admission;

use super::baselines::adapter_first_pool;
use super::fleet::Fleet;
use super::policy::{Policy, RequestCtx};
use crate::render::splitmix64;
use crate::scenario::FleetEvent;

/// The router's knobs.
#[derive(Debug, Clone, PartialEq)]
pub struct KvRouterConfig {
    /// Weight of prefill blocks against decode blocks (Dynamo's `overlap_score_weight`).
    pub overlap_score_weight: f64,
    /// Seed of the tie-breaking draws.
    pub seed: u64,
}

impl Default for KvRouterConfig {
    fn default() -> Self {
        Self {
            overlap_score_weight: 1.0,
            seed: 1,
        }
    }
}

/// A request the router sent and has not seen finish.
#[derive(Debug, Clone, PartialEq)]
struct ActiveRequest {
    /// Tokens it had to prefill (prompt − overlap).
    prefill_tokens: usize,
    prompt_tokens: usize,
    output_tokens: u64,
    first_token_at: f64,
    inter_token_s: f64,
    finish_at: f64,
}

impl ActiveRequest {
    fn of(admission: &Admission) -> Self {
        Self {
            prefill_tokens: admission
                .prompt_tokens
                .saturating_sub(admission.cached_tokens),
            prompt_tokens: admission.prompt_tokens,
            output_tokens: admission.output_tokens,
            first_token_at: admission.first_token_at,
            inter_token_s: admission.inter_token_seconds,
            finish_at: admission.finish_at,
        }
    }

    /// Tokens in its KV blocks at `now`: the prompt and the output generated so far.
    fn tokens_at(&self, now: f64) -> usize {
        if now < self.first_token_at {
            return self.prompt_tokens;
        }
        let step = self.inter_token_s.max(f64::MIN_POSITIVE);
        let generated =
            (((now - self.first_token_at) / step).floor() as u64 + 1).min(self.output_tokens);
        self.prompt_tokens
            .saturating_add(usize::try_from(generated).unwrap_or(usize::MAX))
    }
}

/// What the router knows of one worker for one request, in tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerLoad {
    /// The request's leading tokens cached on the worker (whole blocks).
    pub overlap_tokens: usize,
    /// Prompt tokens of the worker's requests still in prefill.
    pub active_prefill_tokens: usize,
    /// Blocks held by the worker's running requests.
    pub active_blocks: usize,
}

/// Dynamo's cost of sending a `prompt_tokens` request to a worker in state `load`.
pub fn cost(
    config: &KvRouterConfig,
    block_tokens: usize,
    prompt_tokens: usize,
    load: &WorkerLoad,
) -> f64 {
    let bs = block_tokens.max(1) as f64;
    let new_tokens = prompt_tokens.saturating_sub(load.overlap_tokens);
    let prefill_blocks = load.active_prefill_tokens.saturating_add(new_tokens) as f64 / bs;
    let decode_blocks =
        load.active_blocks as f64 + prompt_tokens.div_ceil(block_tokens.max(1)) as f64;
    config.overlap_score_weight * prefill_blocks + decode_blocks
}

/// Dynamo's KV routing over the fleet.
#[derive(Debug)]
pub struct DynamoKv {
    config: KvRouterConfig,
    block_tokens: usize,
    active: Vec<Vec<ActiveRequest>>,
    rng: u64,
}

impl DynamoKv {
    pub fn new(config: KvRouterConfig, fleet: &Fleet) -> Self {
        let rng = config.seed;
        Self {
            config,
            block_tokens: fleet.config().block_size,
            active: Vec::new(),
            rng,
        }
    }

    fn load_of(&mut self, fleet: &Fleet, pod: usize, request: &RequestCtx<'_>) -> WorkerLoad {
        let now = request.now_s;
        let bs = self.block_tokens.max(1);
        let (active_prefill_tokens, active_blocks) = match self.active.get_mut(pod) {
            Some(list) => {
                list.retain(|r| r.finish_at > now);
                list.iter().fold((0usize, 0usize), |(p, b), r| {
                    let p = if now < r.first_token_at {
                        p.saturating_add(r.prefill_tokens)
                    } else {
                        p
                    };
                    (p, b.saturating_add(r.tokens_at(now).div_ceil(bs)))
                })
            }
            None => (0, 0),
        };
        let overlap_tokens = fleet.pods.get(pod).map_or(0, |p| {
            p.pod
                .cached_prefix_tokens(request.adapter, request.canonical)
        });
        WorkerLoad {
            overlap_tokens,
            active_prefill_tokens,
            active_blocks,
        }
    }
}

impl Policy for DynamoKv {
    fn name(&self) -> &'static str {
        "dynamo_kv"
    }

    fn on_event(&mut self, fleet: &mut Fleet, event: FleetEvent, _now_s: f64) {
        if self.active.len() < fleet.pods.len() {
            self.active.resize_with(fleet.pods.len(), Vec::new);
        }
        // a restarted worker's requests fail: the router frees them
        if let FleetEvent::RestartPod { index, .. } = event {
            if let Some(list) = self.active.get_mut(index) {
                list.clear();
            }
        }
    }

    fn route(&mut self, fleet: &Fleet, request: &RequestCtx<'_>) -> usize {
        if self.active.len() < fleet.pods.len() {
            self.active.resize_with(fleet.pods.len(), Vec::new);
        }
        let pool = adapter_first_pool(fleet, request.adapter);
        let prompt_tokens = request.chain.prompt_tokens;
        let costs: Vec<(usize, f64)> = pool
            .iter()
            .map(|&pod| {
                let load = self.load_of(fleet, pod, request);
                (
                    pod,
                    cost(&self.config, self.block_tokens, prompt_tokens, &load),
                )
            })
            .collect();
        let best = costs.iter().map(|(_, c)| *c).fold(f64::INFINITY, f64::min);
        let tied: Vec<usize> = costs
            .iter()
            .filter(|(_, c)| *c <= best)
            .map(|(p, _)| *p)
            .collect();
        let draw = splitmix64(&mut self.rng);
        let n = tied.len().max(1) as u64;
        tied.get(usize::try_from(draw % n).unwrap_or(0))
            .copied()
            .unwrap_or(0)
    }

    fn served(
        &mut self,
        _fleet: &mut Fleet,
        _request: &RequestCtx<'_>,
        pod: usize,
        admission: &Admission,
    ) {
        if let Some(list) = self.active.get_mut(pod) {
            list.push(ActiveRequest::of(admission));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cost_trades_overlap_against_load() {
        let config = KvRouterConfig::default();
        // Dynamo's documented example: (prefill 8, decode 10), (5, 5), (2, 9) blocks of 16
        let worker = |prefill_blocks: usize, decode_blocks: usize| WorkerLoad {
            overlap_tokens: 0,
            active_prefill_tokens: prefill_blocks * 16,
            active_blocks: decode_blocks,
        };
        let costs: Vec<f64> = [worker(8, 10), worker(5, 5), worker(2, 9)]
            .iter()
            .map(|w| cost(&config, 16, 0, w))
            .collect();
        assert_eq!(costs, vec![18.0, 10.0, 11.0]);
        // a 1,600-token prompt: 100 blocks to prefill where nothing is cached, 20 where 80 are
        let cold = WorkerLoad {
            overlap_tokens: 0,
            active_prefill_tokens: 0,
            active_blocks: 0,
        };
        let warm = WorkerLoad {
            overlap_tokens: 1280,
            ..cold
        };
        assert_eq!(cost(&config, 16, 1600, &cold), 200.0);
        assert_eq!(cost(&config, 16, 1600, &warm), 120.0);
        // the warm worker's 81 running blocks outweigh the 80 blocks of overlap it saves
        let busy = WorkerLoad {
            active_blocks: 81,
            ..warm
        };
        assert!(cost(&config, 16, 1600, &busy) > cost(&config, 16, 1600, &cold));
    }
}
