//! Snapshots of the prompt pool: every entry as a [`PromptRecord`], and back. A snapshot being
//! written takes [`SharedRecord`]s ([`PromptPool::export_shared`]): the texts and hashes are
//! shared with the pool by reference count, so the lock is held for a pass over the entries,
//! never for copying texts or serialising them.
//!
//! A shape is written without its `cache_salt` (a client's secret never goes to disk), with
//! `salt_dropped: true` when there was one: the restored entry is not warmed until a signal
//! brings the salt again. An entry from a snapshot older than shapes has none (a chat prefix is
//! then warmed unshaped, and counted, until a signal brings its shape).

use std::sync::Arc;

use prewarm_core::fingerprint::BlockHash;
use prewarm_core::request::Endpoint;
use prewarm_core::warm_shape::WarmShape;
use serde::{Deserialize, Serialize};

use super::shape::{serialize_unsalted, SharedShape};
use super::{Entry, Origin, PoolError, PromptPool};
use crate::policy::PrefixKey;

/// An entry as snapshots store it ([`PromptPool::export`], [`PromptPool::restore`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptRecord {
    pub model: String,
    #[serde(default)]
    pub tenant: Option<String>,
    pub endpoint: Endpoint,
    pub text: String,
    pub blocks: Vec<BlockHash>,
    pub hotness: f64,
    pub origin: Origin,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub adoptions: u32,
    #[serde(default)]
    pub successes: u32,
    #[serde(default)]
    pub last_signal_ms: u64,
    /// Absent (every record before this field, and every kept-warm one): `true`.
    #[serde(default = "kept_warm", skip_serializing_if = "is_kept_warm")]
    pub keep_warm: bool,
    /// The traffic's shape, without its salt. Absent: none (every record before this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<WarmShape>,
    /// The shape had a salt, not written. Absent: `false`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub salt_dropped: bool,
}

fn kept_warm() -> bool {
    true
}

fn is_kept_warm(b: &bool) -> bool {
    *b
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// An entry for a snapshot being written: serialises exactly as a [`PromptRecord`], its text,
/// hashes and names shared with the pool.
#[derive(Debug, Clone)]
pub struct SharedRecord {
    model: Arc<str>,
    tenant: Option<Arc<str>>,
    endpoint: Endpoint,
    text: Arc<str>,
    blocks: Arc<[BlockHash]>,
    hotness: f64,
    origin: Origin,
    tags: Vec<String>,
    adoptions: u32,
    successes: u32,
    last_signal_ms: u64,
    keep_warm: bool,
    /// Serialised without its salt.
    shape: Option<SharedShape>,
    salt_dropped: bool,
}

/// [`PromptRecord`]'s fields, borrowed.
#[derive(Serialize)]
struct RecordRef<'a> {
    model: &'a str,
    tenant: Option<&'a str>,
    endpoint: Endpoint,
    text: &'a str,
    blocks: &'a [BlockHash],
    hotness: f64,
    origin: Origin,
    tags: &'a [String],
    adoptions: u32,
    successes: u32,
    last_signal_ms: u64,
    #[serde(skip_serializing_if = "is_kept_warm")]
    keep_warm: bool,
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_unsalted"
    )]
    shape: &'a Option<SharedShape>,
    #[serde(skip_serializing_if = "is_false")]
    salt_dropped: bool,
}

impl Serialize for SharedRecord {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        RecordRef {
            model: &self.model,
            tenant: self.tenant.as_deref(),
            endpoint: self.endpoint,
            text: &self.text,
            blocks: &self.blocks,
            hotness: self.hotness,
            origin: self.origin,
            tags: &self.tags,
            adoptions: self.adoptions,
            successes: self.successes,
            last_signal_ms: self.last_signal_ms,
            keep_warm: self.keep_warm,
            shape: &self.shape,
            salt_dropped: self.salt_dropped,
        }
        .serialize(serializer)
    }
}

impl PromptPool {
    /// Every entry, hottest first, sharing texts, hashes and names with the pool: O(entries)
    /// reference counts, no text copied. Serialises as [`PromptPool::export`] does.
    pub fn export_shared(&self) -> Vec<SharedRecord> {
        self.hottest_keys(usize::MAX)
            .into_iter()
            .filter_map(|(hotness, key)| {
                let e = self.entries.get(&key)?;
                Some(SharedRecord {
                    model: self.names.shared(e.model)?,
                    tenant: (e.tenant != super::NO_NAME)
                        .then(|| self.names.shared(e.tenant))
                        .flatten(),
                    endpoint: e.endpoint,
                    text: e.text.clone(),
                    blocks: e.blocks.clone(),
                    hotness,
                    origin: e.origin,
                    tags: self.tags.get(&key).map(|t| t.to_vec()).unwrap_or_default(),
                    adoptions: e.adoptions,
                    successes: e.successes,
                    last_signal_ms: e.last_signal_ms,
                    keep_warm: e.keep_warm,
                    shape: e.shape.clone(),
                    salt_dropped: e.salt_dropped || e.shape.as_ref().is_some_and(|s| s.salted()),
                })
            })
            .collect()
    }

    /// Every entry as a snapshot record, hottest first.
    pub fn export(&self) -> Vec<PromptRecord> {
        self.hottest_keys(usize::MAX)
            .into_iter()
            .filter_map(|(_, key)| {
                let v = self.get(&key)?;
                Some(PromptRecord {
                    model: v.model.to_string(),
                    tenant: v.tenant.map(str::to_string),
                    endpoint: v.endpoint,
                    text: v.text.to_string(),
                    blocks: v.blocks.to_vec(),
                    hotness: v.hotness,
                    origin: v.origin,
                    tags: v.tags.to_vec(),
                    adoptions: v.adoptions,
                    successes: v.successes,
                    last_signal_ms: v.last_signal_ms,
                    keep_warm: v.keep_warm,
                    shape: v.shape.map(|s| s.without_salt()),
                    salt_dropped: v.salt_dropped || v.shape.is_some_and(|s| s.salted()),
                })
            })
            .collect()
    }

    /// Loads snapshot records into the pool (after what it holds), with the limits of a live
    /// signal; returns the records refused with why. Templates keep their recorded blocks.
    pub fn restore(&mut self, records: Vec<PromptRecord>, now_ms: u64) -> Vec<PoolError> {
        self.tick(now_ms);
        let mut refused = Vec::new();
        for r in records {
            if let Err(e) = self.restore_one(r) {
                refused.push(e);
            }
        }
        refused
    }

    fn restore_one(&mut self, r: PromptRecord) -> Result<(), PoolError> {
        let last = *r.blocks.last().ok_or(PoolError::EmptyPrefix)?;
        self.check_prefix(&r.text, r.blocks.len())?;
        if let Some(shape) = &r.shape {
            shape.check(&r.text)?;
        }
        let shape = r.shape.map(SharedShape::new);
        let cost = super::entry_bytes(r.text.len(), r.blocks.len())
            .saturating_add(super::shape_bytes(shape.as_ref()));
        let key = PrefixKey::new(&r.model, last);
        if self.entries.contains_key(&key) {
            return Ok(());
        }
        match r.origin {
            Origin::Static if self.templates >= self.config.max_templates => {
                return Err(PoolError::TooManyTemplates(self.config.max_templates));
            }
            Origin::Static if r.tags.len() > self.config.max_tags => {
                return Err(PoolError::BadTags(r.tags.len(), self.config.max_tags));
            }
            Origin::Dynamic if self.dynamic_len() >= self.config.max_entries => return Ok(()),
            // Records come hottest first: a colder dynamic one that does not fit is dropped.
            Origin::Dynamic if self.bytes.saturating_add(cost) > self.config.max_pool_bytes => {
                return Ok(())
            }
            _ => {}
        }
        if r.origin == Origin::Static {
            self.make_room(cost, false)?;
        }
        let (model, tenant) = self.acquire_names(&r.model, r.tenant.as_deref())?;
        let hotness = if r.hotness.is_finite() {
            r.hotness.clamp(0.0, 1e12)
        } else {
            0.0
        };
        let score = hotness * self.factor;
        self.insert_entry(
            key,
            Entry {
                text: Arc::from(r.text),
                blocks: Arc::from(r.blocks),
                score,
                last_signal_ms: r.last_signal_ms,
                model,
                tenant,
                adoptions: r.adoptions,
                successes: r.successes,
                endpoint: r.endpoint,
                origin: r.origin,
                keep_warm: r.keep_warm || r.origin == Origin::Static,
                // A salt in a record (not one this gateway wrote) is the traffic's own.
                salt_dropped: r.salt_dropped && !shape.as_ref().is_some_and(|s| s.salted()),
                shape,
                rejections: 0,
                backoff_until_ms: 0,
            },
        );
        match r.origin {
            Origin::Dynamic => {
                self.order.insert((score.to_bits(), key));
            }
            Origin::Static => {
                self.templates += 1;
                self.tags.insert(key, r.tags.into_boxed_slice());
            }
        }
        Ok(())
    }
}
