//! The pool's prompts in vector space: what `GET /admin/prompts/similar` and
//! `GET /admin/prompts/groups` read. [`PromptSearch`] owns the embedder, a cache of the pool's
//! prompt vectors (so a refresh embeds only new prompts) and the published [`PromptIndex`]
//! (prompts, their vectors, and an IVF-PQ index over them from `exact_below` prompts on).
//!
//! A refresh takes the pool's hottest `max_prompts` prompts, embeds the new ones (hottest first,
//! for at most `embed_budget_ms`; the rest in later refreshes), and builds and swaps in a new
//! index of the prompts embedded so far when that set changed; readers keep the index they hold. The
//! first refresh (model load included) runs before the gateway reports ready, so the index is
//! trained when traffic arrives. Everything here is blocking CPU work: callers run it on
//! `spawn_blocking`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::ivf_pq::{exact, IvfPq, IvfPqParams};
use super::kmeans::squared_distance;
use super::minilm::{EmbedError, MiniLm, DIM, MAX_BATCH};
use super::EmbeddingsConfig;
use crate::policy::{PrefixKey, SemanticGroups};

/// Re-ranked candidates per result (the shortlist is `RERANK × k`): recall@10 ≥ 0.95 in the
/// index's tests, where PQ distances alone give ~0.8.
pub const RERANK: usize = 4;
/// Characters of prompt text shown per result.
const PREVIEW_CHARS: usize = 120;
/// Most prompts the semantic groups are formed over (the hottest): leader clustering is
/// O(prompts × groups).
pub const MAX_GROUPED_PROMPTS: usize = 2000;

/// One pool prompt handed to a refresh.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolPrompt {
    pub key: PrefixKey,
    pub model: String,
    pub hotness: f64,
    pub text: String,
}

/// A prompt of the index, as results show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexedPrompt {
    pub key: String,
    pub model: String,
    /// Hotness when the index was built.
    pub hotness: f64,
    pub preview: String,
}

/// One published index.
#[derive(Debug, Default)]
pub struct PromptIndex {
    pub prompts: Vec<IndexedPrompt>,
    keys: Vec<PrefixKey>,
    /// `prompts.len() × DIM`, row i is prompt i's unit vector.
    vectors: Vec<f32>,
    ivf: Option<IvfPq>,
}

/// A prompt near a query.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimilarPrompt {
    #[serde(flatten)]
    pub prompt: IndexedPrompt,
    pub cosine: f32,
}

/// A semantic group of hot prompts: its hottest prompt (the leader) and its members' count and
/// summed hotness.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptGroup {
    pub leader: IndexedPrompt,
    pub members: usize,
    pub hotness: f64,
}

/// What the index is, for the API and metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexStatus {
    pub built: bool,
    pub prompts: usize,
    /// `ivf_pq` or `exact`.
    pub kind: &'static str,
    pub index_bytes: usize,
    pub error: Option<String>,
}

impl PromptIndex {
    fn vector(&self, i: usize) -> Option<&[f32]> {
        self.vectors.get(i * DIM..(i + 1) * DIM)
    }

    /// The `k` prompts nearest to `query` (a unit vector), nearest first.
    pub fn nearest(&self, query: &[f32], k: usize, probe: usize) -> Vec<SimilarPrompt> {
        let found = match &self.ivf {
            Some(ivf) => ivf.search_reranked(query, k, Some(probe), RERANK, |id| {
                self.vector(id as usize).map(|v| squared_distance(v, query))
            }),
            None => exact(&self.vectors, DIM, query, k),
        };
        found
            .into_iter()
            .filter_map(|(id, d)| {
                self.prompts.get(id as usize).map(|p| SimilarPrompt {
                    prompt: p.clone(),
                    // |a − b|² = 2 − 2 cos for unit vectors.
                    cosine: 1.0 - d / 2.0,
                })
            })
            .collect()
    }

    /// Leader clustering of the hottest prompts: each prompt, hottest first, joins the first
    /// group whose leader it is at least `min_cosine` close to, else leads a new group. Returns
    /// each group's leader and each clustered prompt with its group (prompt indices).
    fn cluster(&self, min_cosine: f32) -> (Vec<usize>, Vec<(usize, usize)>) {
        let mut order: Vec<usize> = (0..self.prompts.len()).collect();
        order.sort_by(|a, b| {
            let h = |i: &usize| self.prompts.get(*i).map_or(0.0, |p| p.hotness);
            h(b).total_cmp(&h(a))
        });
        order.truncate(MAX_GROUPED_PROMPTS);
        let max_distance = 2.0 - 2.0 * min_cosine;
        let mut leaders: Vec<usize> = Vec::new();
        let mut members = Vec::with_capacity(order.len());
        for i in order {
            let Some(v) = self.vector(i) else { continue };
            let joined = leaders.iter().position(|&l| {
                self.vector(l)
                    .is_some_and(|lv| squared_distance(lv, v) <= max_distance)
            });
            let group = joined.unwrap_or_else(|| {
                leaders.push(i);
                leaders.len() - 1
            });
            members.push((i, group));
        }
        (leaders, members)
    }

    /// The semantic groups ([`Self::cluster`]), hottest first.
    pub fn groups(&self, min_cosine: f32) -> Vec<PromptGroup> {
        let (leaders, members) = self.cluster(min_cosine);
        let mut groups: Vec<PromptGroup> = leaders
            .iter()
            .filter_map(|&l| self.prompts.get(l))
            .map(|leader| PromptGroup {
                leader: leader.clone(),
                members: 0,
                hotness: 0.0,
            })
            .collect();
        for (i, g) in members {
            if let (Some(group), Some(p)) = (groups.get_mut(g), self.prompts.get(i)) {
                group.members += 1;
                group.hotness += p.hotness;
            }
        }
        groups.sort_by(|a, b| b.hotness.total_cmp(&a.hotness));
        groups
    }

    /// Each clustered prompt's group, for warm-up sampling (`warmup.sampling = "groups"`).
    pub fn semantic_groups(&self, min_cosine: f32) -> SemanticGroups {
        let (_, members) = self.cluster(min_cosine);
        members
            .into_iter()
            .filter_map(|(i, g)| Some((*self.keys.get(i)?, u32::try_from(g).ok()?)))
            .collect()
    }
}

/// The embedder, the vector cache and the published index.
pub struct PromptSearch {
    config: EmbeddingsConfig,
    model: Mutex<Option<Arc<MiniLm>>>,
    cache: Mutex<HashMap<PrefixKey, Arc<[f32]>>>,
    index: RwLock<Arc<PromptIndex>>,
    built: AtomicBool,
    error: Mutex<Option<String>>,
}

impl std::fmt::Debug for PromptSearch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptSearch")
            .field("status", &self.status())
            .finish()
    }
}

/// `text` cut to at most `max` bytes at a character boundary.
fn leading(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or("")
}

impl PromptSearch {
    /// A search with nothing loaded yet: the model is read by the first refresh.
    pub fn new(config: EmbeddingsConfig) -> Self {
        Self {
            config,
            model: Mutex::new(None),
            cache: Mutex::new(HashMap::new()),
            index: RwLock::new(Arc::new(PromptIndex::default())),
            built: AtomicBool::new(false),
            error: Mutex::new(None),
        }
    }

    pub fn config(&self) -> &EmbeddingsConfig {
        &self.config
    }

    /// True once a first index has been published.
    pub fn is_built(&self) -> bool {
        self.built.load(Ordering::Acquire)
    }

    pub fn index(&self) -> Arc<PromptIndex> {
        self.index.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn status(&self) -> IndexStatus {
        let index = self.index();
        IndexStatus {
            built: self.is_built(),
            prompts: index.prompts.len(),
            kind: if index.ivf.is_some() {
                "ivf_pq"
            } else {
                "exact"
            },
            index_bytes: index.ivf.as_ref().map_or(0, IvfPq::bytes),
            error: self.error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }

    fn model(&self) -> Result<Arc<MiniLm>, EmbedError> {
        let mut slot = self.model.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = slot.as_ref() {
            return Ok(m.clone());
        }
        let dir = self.config.model_dir.clone().unwrap_or_default();
        let model = Arc::new(MiniLm::load(&dir)?);
        *slot = Some(model.clone());
        Ok(model)
    }

    /// The unit vector of a query text (cut to `max_text_bytes`).
    pub fn embed_query(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        let model = self.model()?;
        let mut vectors = model.embed(&[leading(text, self.config.max_text_bytes)])?;
        vectors
            .pop()
            .ok_or_else(|| EmbedError::Forward("no vector".into()))
    }

    /// Embeds the new prompts of `pool` and publishes a new index when the prompts changed.
    /// Returns whether it published one. An error is kept for the status and logged by the
    /// caller; the previous index stays.
    pub fn refresh(&self, mut pool: Vec<PoolPrompt>) -> Result<bool, EmbedError> {
        let result = self.try_refresh(&mut pool);
        let mut error = self.error.lock().unwrap_or_else(|p| p.into_inner());
        *error = result.as_ref().err().map(ToString::to_string);
        result
    }

    fn try_refresh(&self, pool: &mut Vec<PoolPrompt>) -> Result<bool, EmbedError> {
        pool.sort_by(|a, b| b.hotness.total_cmp(&a.hotness));
        pool.truncate(self.config.max_prompts);
        let current = self.index();
        let same = self.is_built() && current.keys.len() == pool.len() && {
            let keys: HashSet<&PrefixKey> = current.keys.iter().collect();
            pool.iter().all(|p| keys.contains(&p.key))
        };
        if same {
            return Ok(false);
        }
        let model = self.model()?;
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let missing: Vec<&PoolPrompt> = pool
            .iter()
            .filter(|p| !cache.contains_key(&p.key))
            .collect();
        // Hottest first, a batch at a time, until the budget is spent: the rest wait for the
        // next refresh, and the index published now holds the prompts embedded so far.
        let started = Instant::now();
        let budget = Duration::from_millis(self.config.embed_budget_ms);
        for batch in missing.chunks(MAX_BATCH) {
            if started.elapsed() >= budget {
                break;
            }
            let texts: Vec<&str> = batch
                .iter()
                .map(|p| leading(&p.text, self.config.max_text_bytes))
                .collect();
            for (p, v) in batch.iter().zip(model.embed(&texts)?) {
                cache.insert(p.key, v.into());
            }
        }
        let live: HashSet<PrefixKey> = pool.iter().map(|p| p.key).collect();
        cache.retain(|k, _| live.contains(k));
        let mut index = PromptIndex {
            prompts: Vec::with_capacity(pool.len()),
            keys: Vec::with_capacity(pool.len()),
            vectors: Vec::with_capacity(pool.len() * DIM),
            ivf: None,
        };
        for p in pool.iter() {
            let Some(v) = cache.get(&p.key) else { continue };
            index.vectors.extend_from_slice(v);
            index.keys.push(p.key);
            index.prompts.push(IndexedPrompt {
                key: p.key.to_string(),
                model: p.model.clone(),
                hotness: p.hotness,
                preview: p.text.chars().take(PREVIEW_CHARS).collect(),
            });
        }
        drop(cache);
        if index.prompts.len() >= self.config.exact_below.max(1) {
            let params = IvfPqParams {
                lists: self.config.index_lists,
                subspaces: self.config.index_subspaces,
                probe: self.config.index_probe,
                ..IvfPqParams::default()
            };
            index.ivf = IvfPq::build(&index.vectors, DIM, params)
                .map_err(|e| EmbedError::Forward(format!("index: {e}")))
                .map(Some)?;
        }
        *self.index.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(index);
        self.built.store(true, Ordering::Release);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(v: &[f32]) -> Vec<f32> {
        let mut out = vec![0.0; DIM];
        out[..v.len()].copy_from_slice(v);
        let n = out.iter().map(|x| x * x).sum::<f32>().sqrt();
        out.iter().map(|x| x / n).collect()
    }

    fn index_of(rows: &[(&str, f64, Vec<f32>)]) -> PromptIndex {
        let mut index = PromptIndex::default();
        for (i, (name, hotness, v)) in rows.iter().enumerate() {
            index.vectors.extend(unit(v));
            index.keys.push(PrefixKey {
                model: 1,
                last: prewarm_core::BlockHash(i as u64),
            });
            index.prompts.push(IndexedPrompt {
                key: name.to_string(),
                model: "m".into(),
                hotness: *hotness,
                preview: name.to_string(),
            });
        }
        index
    }

    #[test]
    fn nearest_and_groups_follow_cosine_and_hotness() {
        let index = index_of(&[
            ("password-a", 5.0, vec![1.0, 0.1]),
            ("weather", 9.0, vec![0.0, 0.0, 1.0]),
            ("password-b", 1.0, vec![1.0, 0.2]),
        ]);
        let near = index.nearest(&unit(&[1.0, 0.15]), 2, 1);
        let names: Vec<&str> = near.iter().map(|s| s.prompt.key.as_str()).collect();
        assert_eq!(names.len(), 2);
        assert!(names.contains(&"password-a") && names.contains(&"password-b"));
        assert!(near[0].cosine > 0.99 && near[0].cosine <= 1.0 + 1e-6);
        let groups = index.groups(0.8);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].leader.key, "weather");
        assert_eq!(
            (groups[1].leader.key.as_str(), groups[1].members),
            ("password-a", 2)
        );
        assert!((groups[1].hotness - 6.0).abs() < 1e-9);
    }

    #[test]
    fn leading_cuts_at_a_character_boundary() {
        assert_eq!(leading("héllo", 2), "h");
        assert_eq!(leading("héllo", 3), "hé");
        assert_eq!(leading("abc", 10), "abc");
    }
}
