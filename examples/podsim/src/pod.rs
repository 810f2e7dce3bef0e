//! The pure model of one inference pod: admission, scheduling, the prefix cache, LoRA adapters
//! and the counters `/metrics` reports. No I/O and no clock: every call takes `now`, model time
//! in seconds since an origin the caller chooses.
//!
//! Lifecycle of a request: [`Pod::submit`] parses nothing and waits for nothing; it resolves the
//! model, looks up and takes the prompt's KV blocks, computes when the request starts (see
//! [`crate::schedule`]), places its adapter, and returns an [`Admission`] with every figure
//! (start, first token, finish). [`Pod::advance`] moves the clock: requests whose start has come
//! move from waiting to running, and those whose finish has come release their blocks (in
//! reverse order) and count as successes. [`Pod::abort`] ends one early.
//!
//! State changes of a request (its blocks, its adapter's place in the host cache and GPU slots,
//! its adapter costs) happen at admission, in admission order, even when it starts later; the
//! queries (`gpu_adapters`, `cached_prefix_tokens`, ...) therefore describe the pod with every
//! admitted request placed. Requests start in admission order unless a later one fits in a gap
//! (see [`crate::schedule`]); only then can adapter costs differ from a strict replay.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::adapters::{AdapterSets, AdapterSpec};
use crate::config::{Engine, PodConfig, PrefillCompute};
use crate::prefix_cache::{
    prompt_block_hashes, salted_prompt_block_hashes, BlockId, BlockPool, PoolEvent,
};
use crate::request::RequestSpec;
use crate::schedule::{adapters_at, earliest_start, micros, BatchLimits, Interval};

/// Identifies an admitted request on its pod.
pub type RequestId = u64;

/// Why a request was refused. Messages are vLLM's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("The model `{model}` does not exist.")]
    UnknownModel { model: String },
    #[error("max_tokens must be at least 1, got {max_tokens}. (parameter=max_tokens, value={max_tokens})")]
    InvalidMaxTokens { max_tokens: u64 },
    #[error("max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. Please request fewer output tokens. (parameter=max_tokens, value={max_tokens})")]
    MaxTokensOverModelLen { max_tokens: u64, max_model_len: u64 },
    #[error("This model's maximum context length is {max_model_len} tokens. However, your prompt contains {prompt_tokens} input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt.")]
    PromptTooLong {
        max_model_len: u64,
        prompt_tokens: usize,
    },
}

/// Why an adapter load or unload failed. Messages are vLLM's (SGLang's for the cap).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterError {
    #[error("LoRA is not enabled on this server (--enable-lora).")]
    LoraDisabled,
    #[error("The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.")]
    AlreadyLoaded { name: String },
    #[error("LoRA rank {rank} is greater than max_lora_rank {max_lora_rank}.")]
    RankTooHigh {
        name: String,
        rank: u32,
        max_lora_rank: u32,
    },
    #[error("The lora adapter '{name}' cannot be found.")]
    NotFound { name: String },
    #[error("Cannot load LoRA adapter '{name}': the maximum number of loaded adapters ({max_loaded_loras}) is reached.")]
    TooManyLoaded {
        name: String,
        max_loaded_loras: usize,
    },
}

/// Everything the model decided about one admitted request. Times are model seconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Admission {
    pub id: RequestId,
    /// The adapter the request runs with; `None` for the base model.
    pub adapter: Option<String>,
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache (full blocks, at most `prompt_tokens − 1`).
    pub cached_tokens: usize,
    /// Tokens the request generates (`max_tokens` or the pod's default).
    pub output_tokens: u64,
    pub arrival: f64,
    /// When it entered the running batch.
    pub start: f64,
    pub first_token_at: f64,
    /// When its last token is out and its blocks are released.
    pub finish_at: f64,
    /// Waiting for a batch place or a LoRA slot.
    pub queue_seconds: f64,
    /// Disk load of its adapter (host-cache miss), else 0.
    pub adapter_load_seconds: f64,
    /// Host→GPU copy of its adapter (slot miss), else 0.
    pub adapter_activation_seconds: f64,
    /// Overhead plus uncached prompt tokens.
    pub prefill_seconds: f64,
    /// `first_token_at − arrival`.
    pub ttft_seconds: f64,
    pub inter_token_seconds: f64,
}

impl Admission {
    /// When output token `index` (0-based) is out.
    pub fn token_at(&self, index: u64) -> f64 {
        self.first_token_at + self.inter_token_seconds * index as f64
    }
}

/// How a request ended, as `vllm:request_success_total`'s `finished_reason` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishedReason {
    Stop,
    Length,
    Abort,
}

/// The pod's state and counters at one instant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodMetrics {
    pub now: f64,
    pub running: usize,
    /// Admitted, not started (waiting for a batch place or a LoRA slot).
    pub waiting: usize,
    /// 1 − free/(blocks − 1); idle cached blocks count as free.
    pub kv_cache_usage: f64,
    pub free_blocks: usize,
    pub cached_blocks: usize,
    /// Prompt tokens looked up in the prefix cache (counter).
    pub prefix_queries_tokens: u64,
    /// Prompt tokens served from it (counter).
    pub prefix_hits_tokens: u64,
    pub finished_stop: u64,
    pub finished_length: u64,
    pub finished_abort: u64,
    /// Adapters with a running request, sorted.
    pub running_adapters: Vec<String>,
    /// Adapters with a waiting request, sorted.
    pub waiting_adapters: Vec<String>,
}

#[derive(Debug, Clone)]
struct LiveRequest {
    adapter: Option<String>,
    blocks: Vec<BlockId>,
    start: f64,
    finish: f64,
    running: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    prefix_queries: u64,
    prefix_hits: u64,
    stop: u64,
    length: u64,
    abort: u64,
}

/// One simulated pod.
#[derive(Debug, Clone)]
pub struct Pod {
    config: PodConfig,
    cache: BlockPool,
    adapters: AdapterSets,
    requests: HashMap<RequestId, LiveRequest>,
    waiting: BTreeMap<(u64, RequestId), ()>,
    running: BTreeMap<(u64, RequestId), ()>,
    running_adapters: HashMap<String, usize>,
    waiting_adapters: HashMap<String, usize>,
    counters: Counters,
    next_id: RequestId,
    noise_state: u64,
    now: f64,
    /// With shared prefill compute, when the last admitted prefill's tokens are computed.
    prefill_free_at: f64,
}

impl Pod {
    /// A cold pod: empty cache, no adapters. Fails with every invalid field.
    pub fn new(config: PodConfig) -> Result<Self, Vec<String>> {
        let problems = config.validate();
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Self {
            cache: BlockPool::new(config.num_gpu_blocks, config.block_bytes()),
            adapters: AdapterSets::new(config.max_loras, config.max_cpu_loras),
            requests: HashMap::new(),
            waiting: BTreeMap::new(),
            running: BTreeMap::new(),
            running_adapters: HashMap::new(),
            waiting_adapters: HashMap::new(),
            counters: Counters::default(),
            next_id: 1,
            noise_state: config.seed ^ 0x9e37_79b9_7f4a_7c15,
            now: 0.0,
            prefill_free_at: 0.0,
            config,
        })
    }

    /// Starts logging the prefix cache's changes for KV-cache events (see
    /// [`crate::prefix_cache::PoolEvent`]); the server publishes them.
    pub fn log_kv_events(&mut self) {
        self.cache.log_events();
    }

    /// vLLM's `POST /reset_prefix_cache` at `now`: drops every cached block when no request
    /// holds one; false (nothing changed) otherwise.
    pub fn reset_prefix_cache(&mut self, now: f64) -> bool {
        self.advance(now);
        self.cache.reset()
    }

    /// The prefix cache's changes since the last call, oldest first.
    pub fn take_kv_events(&mut self) -> Vec<PoolEvent> {
        self.cache.take_events()
    }

    pub fn config(&self) -> &PodConfig {
        &self.config
    }

    /// The adapter a `model` field selects: `Ok(None)` for the base model. On SGLang an adapter
    /// is named `base:adapter`.
    pub fn resolve_model(&self, model: &str) -> Result<Option<&AdapterSpec>, RequestError> {
        let unknown = || RequestError::UnknownModel {
            model: model.to_string(),
        };
        if model == self.config.served_model_name {
            return Ok(None);
        }
        let adapter = match self.config.engine {
            Engine::Vllm => model,
            Engine::Sglang => match model.split_once(':') {
                Some((base, adapter)) if base == self.config.served_model_name => adapter,
                _ => return Err(unknown()),
            },
        };
        self.adapters.get(adapter).map(Some).ok_or_else(unknown)
    }

    /// Admits a request arriving at `now`; see the module doc.
    /// A `now` earlier than the pod's clock (or not a number) counts as the clock.
    pub fn submit(&mut self, now: f64, spec: &RequestSpec) -> Result<Admission, RequestError> {
        self.submit_salted(now, spec, None)
    }

    /// [`Pod::submit`] for a request carrying a `cache_salt`: the salt is mixed into its first
    /// block's hash, so its blocks are found only by requests with the same salt.
    pub fn submit_salted(
        &mut self,
        now: f64,
        spec: &RequestSpec,
        cache_salt: Option<&str>,
    ) -> Result<Admission, RequestError> {
        self.advance(now);
        let now = self.now;
        let adapter = self.resolve_model(&spec.model)?.cloned();
        let output_tokens = spec.max_tokens.unwrap_or(self.config.default_max_tokens);
        if output_tokens == 0 {
            return Err(RequestError::InvalidMaxTokens { max_tokens: 0 });
        }
        if output_tokens > self.config.max_model_len {
            return Err(RequestError::MaxTokensOverModelLen {
                max_tokens: output_tokens,
                max_model_len: self.config.max_model_len,
            });
        }
        let prompt_tokens = spec.prompt_tokens();
        let Some(room) = self.config.max_model_len.checked_sub(prompt_tokens as u64) else {
            return Err(RequestError::PromptTooLong {
                max_model_len: self.config.max_model_len,
                prompt_tokens,
            });
        };
        // vLLM clamps the output to the room the context leaves (no error).
        let output_tokens = output_tokens.min(room);
        if output_tokens == 0 {
            return Err(RequestError::InvalidMaxTokens { max_tokens: 0 });
        }
        let total = (prompt_tokens as u64).saturating_add(output_tokens);

        let cache_key = adapter
            .as_ref()
            .map_or(self.config.served_model_name.as_str(), |a| a.name.as_str());
        let hashes = if self.config.enable_prefix_caching {
            salted_prompt_block_hashes(
                cache_key,
                cache_salt,
                spec.canonical_prompt.as_bytes(),
                self.cache.block_bytes(),
            )
        } else {
            Vec::new()
        };
        let block_size = self.config.block_size;
        let hit_cap = prompt_tokens.saturating_sub(1) / block_size;
        let hit = self
            .cache
            .cached_prefix_blocks(hashes.get(..hit_cap.min(hashes.len())).unwrap_or(&[]));
        let needed = total.div_ceil(block_size as u64) as usize;
        let blocks = self.cache.allocate(&hashes, hit, needed);
        let cached_tokens = hit * block_size;
        if self.config.enable_prefix_caching {
            self.counters.prefix_queries += prompt_tokens as u64;
            self.counters.prefix_hits += cached_tokens as u64;
        }

        let adapter_name = adapter.as_ref().map(|a| a.name.clone());
        let latency = self.config.latency;
        // Adapter costs as the caches stand now (they change only in admission order).
        let (load, activation) = adapter.as_ref().map_or((0.0, 0.0), |a| {
            let load = if self.adapters.is_in_host_cache(&a.name) {
                0.0
            } else {
                latency.adapter_load(a.rank)
            };
            let activation = if self.adapters.is_in_gpu_slot(&a.name) {
                0.0
            } else {
                latency.adapter_activation(a.rank)
            };
            (load, activation)
        });
        let uncached = prompt_tokens - cached_tokens;
        let noise = self.noise_factor();
        let prefill = latency.prefill(uncached) * noise;
        // With shared compute the request is not started before the tokens of every prefill
        // admitted before it are computed (its own load and activation may overlap them).
        let ready = match self.config.prefill_compute {
            PrefillCompute::Unshared => now,
            PrefillCompute::Shared => now.max(self.prefill_free_at - load - activation),
        };
        let inter_token = latency.inter_token * self.noise_factor();
        let duration = load + activation + prefill + inter_token * (output_tokens - 1) as f64;
        let pinned: Vec<&str> = self.adapters.pinned().collect();
        let limits = BatchLimits {
            max_num_seqs: self.config.max_num_seqs,
            max_loras: self.config.max_loras,
            pinned: &pinned,
        };
        let start = earliest_start(
            self.admitted(),
            ready,
            duration,
            adapter_name.as_deref(),
            limits,
        );
        if let Some(a) = &adapter {
            let busy = adapters_at(self.admitted(), start);
            self.adapters.place(&a.name, &busy);
        }
        let first_token_at = start + load + activation + prefill;
        if self.config.prefill_compute == PrefillCompute::Shared {
            let computed =
                start + load + activation + latency.per_uncached_token * uncached as f64 * noise;
            self.prefill_free_at = self.prefill_free_at.max(computed);
        }
        let finish_at = start + duration;

        let id = self.next_id;
        self.next_id += 1;
        self.requests.insert(
            id,
            LiveRequest {
                adapter: adapter_name.clone(),
                blocks,
                start,
                finish: finish_at,
                running: false,
            },
        );
        self.waiting.insert((micros(start), id), ());
        if let Some(a) = &adapter_name {
            *self.waiting_adapters.entry(a.clone()).or_default() += 1;
        }
        self.advance(now);
        Ok(Admission {
            id,
            adapter: adapter_name,
            prompt_tokens,
            cached_tokens,
            output_tokens,
            arrival: now,
            start,
            first_token_at,
            finish_at,
            queue_seconds: start - now,
            adapter_load_seconds: load,
            adapter_activation_seconds: activation,
            prefill_seconds: prefill,
            ttft_seconds: first_token_at - now,
            inter_token_seconds: inter_token,
        })
    }

    /// The admitted, unfinished requests' intervals.
    fn admitted(&self) -> impl Iterator<Item = Interval<'_>> {
        self.requests.values().map(|r| Interval {
            start: r.start,
            finish: r.finish,
            adapter: r.adapter.as_deref(),
        })
    }

    /// Moves the clock to `now` (never backwards): starts and finishes what is due.
    pub fn advance(&mut self, now: f64) {
        if now.is_finite() {
            self.now = self.now.max(now);
        }
        let t = micros(self.now);
        while let Some(entry) = self.waiting.first_entry() {
            if entry.key().0 > t {
                break;
            }
            let (_, id) = entry.remove_entry().0;
            if let Some(r) = self.requests.get_mut(&id) {
                r.running = true;
                self.running.insert((micros(r.finish), id), ());
                if let Some(a) = &r.adapter {
                    decrement(&mut self.waiting_adapters, a);
                    *self.running_adapters.entry(a.clone()).or_default() += 1;
                }
            }
        }
        while let Some(entry) = self.running.first_entry() {
            if entry.key().0 > t {
                break;
            }
            let (_, id) = entry.remove_entry().0;
            self.end(id, FinishedReason::Length);
        }
    }

    /// Ends request `id` early (the client went away); false when it had already finished.
    pub fn abort(&mut self, now: f64, id: RequestId) -> bool {
        self.advance(now);
        let Some(r) = self.requests.get(&id) else {
            return false;
        };
        let (start, finish) = (r.start, r.finish);
        self.waiting.remove(&(micros(start), id));
        self.running.remove(&(micros(finish), id));
        self.end(id, FinishedReason::Abort);
        true
    }

    fn end(&mut self, id: RequestId, reason: FinishedReason) {
        let Some(r) = self.requests.remove(&id) else {
            return;
        };
        self.cache.release(&r.blocks);
        if let Some(a) = &r.adapter {
            let set = if r.running {
                &mut self.running_adapters
            } else {
                &mut self.waiting_adapters
            };
            decrement(set, a);
        }
        match reason {
            FinishedReason::Stop => self.counters.stop += 1,
            FinishedReason::Length => self.counters.length += 1,
            FinishedReason::Abort => self.counters.abort += 1,
        }
    }

    /// Registers an adapter and reads it into the host cache (`/v1/load_lora_adapter`).
    /// Returns the model time the load takes. `replace` is vLLM's `load_inplace`.
    pub fn load_adapter(&mut self, spec: AdapterSpec, replace: bool) -> Result<f64, AdapterError> {
        if !self.config.enable_lora {
            return Err(AdapterError::LoraDisabled);
        }
        if self.adapters.get(&spec.name).is_some() && !replace {
            return Err(AdapterError::AlreadyLoaded { name: spec.name });
        }
        if spec.rank > self.config.max_lora_rank {
            return Err(AdapterError::RankTooHigh {
                name: spec.name,
                rank: spec.rank,
                max_lora_rank: self.config.max_lora_rank,
            });
        }
        if let Some(max) = self.config.max_loaded_loras {
            if self.adapters.get(&spec.name).is_none() && self.adapters.registered_count() >= max {
                return Err(AdapterError::TooManyLoaded {
                    name: spec.name,
                    max_loaded_loras: max,
                });
            }
        }
        let cost = self.config.latency.adapter_load(spec.rank);
        self.adapters.unregister(&spec.name);
        let busy = adapters_at(self.admitted(), self.now);
        self.adapters.register(spec, &busy);
        Ok(cost)
    }

    /// Forgets an adapter everywhere (`/v1/unload_lora_adapter`).
    pub fn unload_adapter(&mut self, name: &str) -> Result<(), AdapterError> {
        if self.adapters.unregister(name) {
            Ok(())
        } else {
            Err(AdapterError::NotFound {
                name: name.to_string(),
            })
        }
    }

    /// Registered adapters, by name.
    pub fn registered_adapters(&self) -> impl Iterator<Item = &AdapterSpec> {
        self.adapters.registered()
    }

    /// Adapters holding a GPU slot, least recently used first. No side effects.
    pub fn gpu_adapters(&self) -> Vec<&str> {
        self.adapters.in_gpu_slots().collect()
    }

    /// Adapters in the host cache, least recently used first. No side effects.
    pub fn host_adapters(&self) -> Vec<&str> {
        self.adapters.host_cached().collect()
    }

    /// Leading prompt tokens of `canonical_prompt` whose full blocks are cached for `adapter`
    /// (`None` = base model), without the `prompt_tokens − 1` cap and without touching the LRU.
    pub fn cached_prefix_tokens(&self, adapter: Option<&str>, canonical_prompt: &str) -> usize {
        self.cached_tokens_of(&self.prompt_hashes(adapter, canonical_prompt))
    }

    /// The full-block hashes this pod's cache keys `canonical_prompt` by for `adapter` (`None`
    /// = base model): the same on every pod of one configuration, so a caller looking the
    /// prompt up on many pods hashes it once.
    pub fn prompt_hashes(&self, adapter: Option<&str>, canonical_prompt: &str) -> Vec<u64> {
        let key = adapter.unwrap_or(&self.config.served_model_name);
        prompt_block_hashes(key, canonical_prompt.as_bytes(), self.cache.block_bytes())
    }

    /// Leading tokens of a prompt of block `hashes` ([`Self::prompt_hashes`]) cached here.
    pub fn cached_tokens_of(&self, hashes: &[u64]) -> usize {
        if !self.config.enable_prefix_caching {
            return 0;
        }
        self.cache.cached_prefix_blocks(hashes) * self.config.block_size
    }

    /// The cached tokens a request with this prompt would get now (capped at
    /// `prompt_tokens − 1`). No side effects.
    pub fn would_hit_tokens(&self, adapter: Option<&str>, canonical_prompt: &str) -> usize {
        let prompt_tokens = prewarm_core::tokens::token_count(canonical_prompt.len());
        self.would_hit_of(
            &self.prompt_hashes(adapter, canonical_prompt),
            prompt_tokens,
        )
    }

    /// [`Self::would_hit_tokens`] of a prompt of `prompt_tokens` already hashed.
    pub fn would_hit_of(&self, hashes: &[u64], prompt_tokens: usize) -> usize {
        let cap = prompt_tokens.saturating_sub(1) / self.config.block_size * self.config.block_size;
        self.cached_tokens_of(hashes).min(cap)
    }

    /// The state at `now` (advancing the clock first).
    pub fn metrics(&mut self, now: f64) -> PodMetrics {
        self.advance(now);
        PodMetrics {
            now: self.now,
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv_cache_usage: self.cache.usage(),
            free_blocks: self.cache.free_blocks(),
            cached_blocks: self.cache.cached_blocks(),
            prefix_queries_tokens: self.counters.prefix_queries,
            prefix_hits_tokens: self.counters.prefix_hits,
            finished_stop: self.counters.stop,
            finished_length: self.counters.length,
            finished_abort: self.counters.abort,
            running_adapters: sorted_names(&self.running_adapters),
            waiting_adapters: sorted_names(&self.waiting_adapters),
        }
    }

    /// A multiplicative factor in [1 − noise, 1 + noise] from the seeded generator (splitmix64).
    fn noise_factor(&mut self) -> f64 {
        if self.config.noise == 0.0 {
            return 1.0;
        }
        self.noise_state = self.noise_state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.noise_state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
        1.0 + self.config.noise * (2.0 * unit - 1.0)
    }
}

fn decrement(counts: &mut HashMap<String, usize>, key: &str) {
    if let Some(n) = counts.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(key);
        }
    }
}

fn sorted_names(counts: &HashMap<String, usize>) -> Vec<String> {
    let mut names: Vec<String> = counts.keys().cloned().collect();
    names.sort();
    names
}
