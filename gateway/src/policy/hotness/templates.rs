//! Operator templates: static entries whose chain is computed from their text, never evicted
//! and never decayed below `template_hotness` (parent module doc).

use std::sync::Arc;

use prewarm_core::fingerprint::{BlockChain, FingerprintConfig};
use prewarm_core::request::Endpoint;
use prewarm_core::warm_shape::WarmShape;
use serde::{Deserialize, Serialize};

use super::{
    entry_bytes, shape_bytes, Entry, Origin, PoolError, PromptPool, ShapeSummary, SharedShape,
    MAX_TAG_BYTES,
};
use crate::policy::PrefixKey;

/// An operator template, as the admin API takes it. `Debug` shows its shape's summary, never a
/// salt.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Template {
    /// Base model or adapter name: the chain's seed.
    pub model: String,
    /// Canonical prompt text (core's `canonical_prompt` rendering).
    pub text: String,
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default = "default_endpoint")]
    pub endpoint: Endpoint,
    #[serde(default)]
    pub tags: Vec<String>,
    /// How the template's traffic reaches the engine (chat message spans over `text`, tools,
    /// kwargs, salt), as a filter's signal carries it; absent: warmed as a completion of `text`
    /// (chat: counted as unshaped) until a signal brings the traffic's shape.
    #[serde(default)]
    pub shape: Option<WarmShape>,
}

impl std::fmt::Debug for Template {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Template")
            .field("model", &self.model)
            .field("text_bytes", &self.text.len())
            .field("tenant", &self.tenant)
            .field("endpoint", &self.endpoint)
            .field("tags", &self.tags)
            .field("shape", &self.shape.as_ref().map(ShapeSummary::of))
            .finish()
    }
}

fn default_endpoint() -> Endpoint {
    Endpoint::ChatCompletions
}
impl PromptPool {
    /// Registers an operator template (or re-registers it with new tags, and its shape when it
    /// carries one). Its chain is `BlockChain::of(model, text, fingerprint)`; a dynamic entry
    /// with the same key becomes static and keeps its hotness (and its traffic's shape, unless
    /// the template carries one).
    pub fn add_template(
        &mut self,
        template: Template,
        fingerprint: &FingerprintConfig,
        now_ms: u64,
    ) -> Result<PrefixKey, PoolError> {
        self.tick(now_ms);
        if template.model.is_empty() {
            return Err(PoolError::EmptyModel);
        }
        let max_tags = self.config.max_tags;
        if template.tags.len() > max_tags || template.tags.iter().any(|t| t.len() > MAX_TAG_BYTES) {
            return Err(PoolError::BadTags(template.tags.len(), max_tags));
        }
        let chain = BlockChain::of(&template.model, template.text.as_bytes(), fingerprint);
        let last = chain
            .prefix_fingerprint()
            .ok_or(PoolError::ShorterThanABlock(template.text.len()))?;
        self.check_prefix(&template.text, chain.blocks.len())?;
        if let Some(shape) = &template.shape {
            shape.check(&template.text)?;
        }
        let shape = template.shape.map(SharedShape::new);
        let key = PrefixKey::new(&template.model, last);
        let existing = self.entries.get(&key).map(|e| e.origin);
        if existing != Some(Origin::Static) && self.templates >= self.config.max_templates {
            return Err(PoolError::TooManyTemplates(self.config.max_templates));
        }
        let floor = self.config.template_hotness * self.factor;
        match existing {
            Some(Origin::Static) => {
                if shape.is_some() {
                    self.replace_shape(&key, shape)?;
                }
            }
            Some(Origin::Dynamic) => {
                if shape.is_some() {
                    self.replace_shape(&key, shape)?;
                }
                if let Some(e) = self.entries.get_mut(&key) {
                    self.order.remove(&(e.score.to_bits(), key));
                    e.origin = Origin::Static;
                    e.keep_warm = true;
                    e.score = e.score.max(floor);
                    self.templates += 1;
                    let n = e.bytes();
                    self.template_bytes = self.template_bytes.saturating_add(n);
                }
            }
            None => {
                self.make_room(
                    entry_bytes(template.text.len(), chain.blocks.len())
                        .saturating_add(shape_bytes(shape.as_ref())),
                    false,
                )?;
                let (model, tenant) =
                    self.acquire_names(&template.model, template.tenant.as_deref())?;
                self.insert_entry(
                    key,
                    Entry {
                        text: Arc::from(template.text),
                        blocks: Arc::from(chain.blocks),
                        score: floor,
                        last_signal_ms: self.last_now_ms,
                        model,
                        tenant,
                        adoptions: 0,
                        successes: 0,
                        endpoint: template.endpoint,
                        origin: Origin::Static,
                        keep_warm: true,
                        shape,
                        salt_dropped: false,
                        rejections: 0,
                        backoff_until_ms: 0,
                    },
                );
                self.templates += 1;
            }
        }
        self.tags.insert(key, template.tags.into_boxed_slice());
        Ok(key)
    }

    /// Removes a template; returns whether `key` was one. Dynamic entries are not removed.
    pub fn remove_template(&mut self, key: &PrefixKey) -> bool {
        if self.entries.get(key).map(|e| e.origin) != Some(Origin::Static) {
            return false;
        }
        self.remove_entry(key).is_some()
    }
}
