//! The KV-cache events an engine publishes, in vLLM's wire format: what podsim sends and the
//! gateway reads.
//!
//! vLLM (`--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'`)
//! publishes on a ZeroMQ PUB socket one message a scheduler step, three frames:
//! `[topic, sequence, payload]` — the configured topic (empty by default), the batch's sequence
//! number as 8 bytes big-endian (0 for a new process's first batch, +1 a batch), and a MessagePack
//! *batch*. msgspec encodes its structs as arrays (`array_like`), leaves trailing fields at their
//! defaults out (`omit_defaults`), and tags each event with its class name as the first element:
//!
//! ```text
//! batch   = [ts: float, events: [event, ...], data_parallel_rank?: int|nil]
//! event   = ["BlockStored", block_hashes: [hash, ...], parent_block_hash: hash|nil,
//!            token_ids: [int, ...], block_size: int, lora_id?: int|nil, medium?: str|nil, ...]
//!         | ["BlockRemoved", block_hashes: [hash, ...], medium?: str|nil]
//!         | ["AllBlocksCleared"]
//! hash    = int (signed or unsigned 64-bit) | bytes (newer vLLM: the raw block hash)
//! ```
//!
//! A hash becomes an [`EngineBlock`]: an integer as its 64 bits, bytes as their XXH3-64 (a set
//! of a few hundred thousand blocks collides with probability ~1e-9). Fields after the ones above
//! (later vLLM versions append some) are skipped; an unknown event tag is skipped and counted,
//! so a newer engine's events never stop the reader.
//!
//! **Limits.** A payload is at most [`MAX_PAYLOAD_BYTES`]; an array may not declare more
//! elements than bytes remain (each element takes at least one), nesting is at most
//! [`MAX_DEPTH`] deep, and a batch holds at most [`MAX_EVENTS`] events. Anything else is a
//! [`KvEventError`] naming the field, never a panic.

use xxhash_rust::xxh3::xxh3_64;

/// Largest payload frame decoded (a 64 Ki-token prefill's BlockStored is ~200 KB).
pub const MAX_PAYLOAD_BYTES: usize = 16 << 20;
/// Most events a batch may carry.
pub const MAX_EVENTS: usize = 1 << 16;
/// Deepest nesting of arrays decoded (a batch is 3 deep).
pub const MAX_DEPTH: usize = 6;

/// One KV block as the engine names it (see the module docs for bytes hashes).
pub type EngineBlock = u64;

/// Where a block lives: the GPU's cache (vLLM's `medium` "GPU", or none given) or an offload
/// tier (anything else, e.g. "CPU").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    Gpu,
    Offloaded,
}

/// One event of a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    /// Full blocks entered the prefix cache, in chain order after `parent`.
    Stored {
        blocks: Vec<EngineBlock>,
        parent: Option<EngineBlock>,
        /// The tokens the blocks hold (`block_size` a block).
        token_ids: Vec<u32>,
        block_size: u32,
        lora_id: Option<i64>,
        medium: Medium,
    },
    /// Blocks left the prefix cache (evicted).
    Removed {
        blocks: Vec<EngineBlock>,
        medium: Medium,
    },
    /// The whole cache was dropped (`/reset_prefix_cache`, or a new process).
    Cleared,
    /// An event whose tag this reader does not know (counted, skipped).
    Unknown,
}

/// One published message's payload.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventBatch {
    /// The engine's clock at publication, unix seconds.
    pub ts: f64,
    pub events: Vec<KvEvent>,
    pub data_parallel_rank: Option<i64>,
}

/// Why a message could not be read; the field is named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvEventError {
    #[error("kv event message: {0} frames, expected 3 (topic, sequence, payload)")]
    Frames(usize),
    #[error("kv event sequence: {0} bytes, expected 8")]
    Sequence(usize),
    #[error("kv event payload: {0} bytes, limit {MAX_PAYLOAD_BYTES}")]
    TooLarge(usize),
    #[error("kv event {field}: {problem}")]
    Field {
        field: &'static str,
        problem: &'static str,
    },
}

fn bad(field: &'static str, problem: &'static str) -> KvEventError {
    KvEventError::Field { field, problem }
}

/// A message's sequence frame: 8 bytes, big-endian, signed (vLLM's replay socket ends its
/// answer with −1).
pub fn decode_sequence(frame: &[u8]) -> Result<i64, KvEventError> {
    let bytes: [u8; 8] = frame
        .try_into()
        .map_err(|_| KvEventError::Sequence(frame.len()))?;
    Ok(i64::from_be_bytes(bytes))
}

/// The sequence frame of `seq`.
pub fn encode_sequence(seq: i64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// A decoded MessagePack value, only the kinds the format uses.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Nil,
    Bool,
    Int(i128),
    Float(f64),
    Str(String),
    Bin(Vec<u8>),
    Array(Vec<Value>),
    /// An array of integers only (token ids, integer hashes), read without a value each.
    Ints(Vec<i128>),
    Map(Vec<(Value, Value)>),
}

impl Value {
    /// The elements of an array (integers as values), `None` for anything else.
    fn into_items(self) -> Option<Vec<Value>> {
        match self {
            Value::Array(items) => Some(items),
            Value::Ints(ints) => Some(ints.into_iter().map(Value::Int).collect()),
            _ => None,
        }
    }
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], KvEventError> {
        let (head, tail) = self
            .rest
            .split_at_checked(n)
            .ok_or_else(|| bad(field, "truncated"))?;
        self.rest = tail;
        Ok(head)
    }

    fn uint(&mut self, n: usize, field: &'static str) -> Result<u64, KvEventError> {
        Ok(self
            .take(n, field)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn sint(&mut self, n: usize, field: &'static str) -> Result<i64, KvEventError> {
        let u = self.uint(n, field)?;
        let shift = 64 - 8 * n as u32;
        Ok(((u << shift) as i64) >> shift)
    }

    /// A declared element count, checked against what remains (`per` bytes an element at least).
    fn count(&mut self, n: usize, per: usize, field: &'static str) -> Result<usize, KvEventError> {
        let len = self.uint(n, field)? as usize;
        if len.saturating_mul(per) > self.rest.len() {
            return Err(bad(field, "declares more elements than the payload holds"));
        }
        Ok(len)
    }

    fn value(&mut self, depth: usize, field: &'static str) -> Result<Value, KvEventError> {
        if depth > MAX_DEPTH {
            return Err(bad(field, "nested too deep"));
        }
        let marker = self.uint(1, field)? as u8;
        if let Some(i) = self.int_after(marker, field)? {
            return Ok(Value::Int(i));
        }
        Ok(match marker {
            0xc0 => Value::Nil,
            0xc2 | 0xc3 => Value::Bool,
            0xca => Value::Float(f64::from(f32::from_bits(self.uint(4, field)? as u32))),
            0xcb => Value::Float(f64::from_bits(self.uint(8, field)?)),
            0xa0..=0xbf => self.string(usize::from(marker & 0x1f), field)?,
            // str 8/16/32, bin 8/16/32, array 16/32, map 16/32: a 1/2/4-byte length first
            0xd9..=0xdb => {
                let n = self.count(1 << (marker - 0xd9), 1, field)?;
                self.string(n, field)?
            }
            0xc4..=0xc6 => {
                let n = self.count(1 << (marker - 0xc4), 1, field)?;
                Value::Bin(self.take(n, field)?.to_vec())
            }
            0x90..=0x9f => self.array(usize::from(marker & 0x0f), depth, field)?,
            0xdc | 0xdd => {
                let n = self.count(2 << (marker - 0xdc), 1, field)?;
                self.array(n, depth, field)?
            }
            0x80..=0x8f => self.map(usize::from(marker & 0x0f), depth, field)?,
            0xde | 0xdf => {
                let n = self.count(2 << (marker - 0xde), 2, field)?;
                self.map(n, depth, field)?
            }
            _ => return Err(bad(field, "unsupported MessagePack type")),
        })
    }

    fn string(&mut self, n: usize, field: &'static str) -> Result<Value, KvEventError> {
        let bytes = self.take(n, field)?;
        Ok(Value::Str(String::from_utf8_lossy(bytes).into_owned()))
    }

    fn array(
        &mut self,
        n: usize,
        depth: usize,
        field: &'static str,
    ) -> Result<Value, KvEventError> {
        if n > self.rest.len() {
            return Err(bad(field, "declares more elements than the payload holds"));
        }
        let start = self.rest;
        if let Some(ints) = self.ints(n, field)? {
            return Ok(Value::Ints(ints));
        }
        self.rest = start;
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(self.value(depth + 1, field)?);
        }
        Ok(Value::Array(items))
    }

    /// `n` integers, or `None` at the first element that is not one (the caller rewinds).
    fn ints(&mut self, n: usize, field: &'static str) -> Result<Option<Vec<i128>>, KvEventError> {
        let mut ints = Vec::with_capacity(n);
        for _ in 0..n {
            let marker = self.uint(1, field)? as u8;
            let Some(i) = self.int_after(marker, field)? else {
                return Ok(None);
            };
            ints.push(i);
        }
        Ok(Some(ints))
    }

    /// The integer `marker` starts (its bytes read), or `None` when it starts something else.
    fn int_after(&mut self, marker: u8, field: &'static str) -> Result<Option<i128>, KvEventError> {
        Ok(Some(match marker {
            0x00..=0x7f => i128::from(marker),
            0xe0..=0xff => i128::from(marker as i8),
            0xcc..=0xcf => i128::from(self.uint(1 << (marker - 0xcc), field)?),
            0xd0..=0xd3 => i128::from(self.sint(1 << (marker - 0xd0), field)?),
            _ => return Ok(None),
        }))
    }

    fn map(&mut self, n: usize, depth: usize, field: &'static str) -> Result<Value, KvEventError> {
        if n.saturating_mul(2) > self.rest.len() {
            return Err(bad(field, "declares more elements than the payload holds"));
        }
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let key = self.value(depth + 1, field)?;
            entries.push((key, self.value(depth + 1, field)?));
        }
        Ok(Value::Map(entries))
    }
}

fn block_of(v: &Value, field: &'static str) -> Result<EngineBlock, KvEventError> {
    match v {
        Value::Int(i) => Ok(*i as u64),
        Value::Bin(b) => Ok(xxh3_64(b)),
        _ => Err(bad(field, "must be an integer or bytes")),
    }
}

fn blocks_of(v: Option<&Value>, field: &'static str) -> Result<Vec<EngineBlock>, KvEventError> {
    match v {
        Some(Value::Array(items)) => items.iter().map(|h| block_of(h, field)).collect(),
        Some(Value::Ints(ints)) => Ok(ints.iter().map(|&i| i as u64).collect()),
        _ => Err(bad(field, "must be an array")),
    }
}

fn int_of(v: Option<&Value>, field: &'static str) -> Result<Option<i64>, KvEventError> {
    match v {
        None | Some(Value::Nil) => Ok(None),
        Some(Value::Int(i)) => i64::try_from(*i)
            .map(Some)
            .map_err(|_| bad(field, "out of range")),
        _ => Err(bad(field, "must be an integer or nil")),
    }
}

fn medium_of(v: Option<&Value>) -> Result<Medium, KvEventError> {
    match v {
        None | Some(Value::Nil) => Ok(Medium::Gpu),
        Some(Value::Str(s)) if s.eq_ignore_ascii_case("gpu") => Ok(Medium::Gpu),
        Some(Value::Str(_)) => Ok(Medium::Offloaded),
        _ => Err(bad("medium", "must be a string or nil")),
    }
}

/// An event's fields: by position (array events) or by name (map events).
enum Fields<'a> {
    Array(&'a [Value]),
    Map(&'a [(Value, Value)]),
}

impl<'a> Fields<'a> {
    /// The field at `index` of an array event (the tag is index 0) or named `name` in a map.
    fn get(&self, index: usize, name: &str) -> Option<&'a Value> {
        match self {
            Fields::Array(items) => items.get(index),
            Fields::Map(entries) => entries
                .iter()
                .find(|(k, _)| matches!(k, Value::Str(s) if s == name))
                .map(|(_, v)| v),
        }
    }
}

fn event_of(v: &Value) -> Result<KvEvent, KvEventError> {
    let fields = match v {
        Value::Array(items) => Fields::Array(items),
        Value::Map(entries) => Fields::Map(entries),
        _ => return Err(bad("events[]", "must be a tagged array or map")),
    };
    let Some(Value::Str(tag)) = fields.get(0, "type") else {
        return Err(bad("events[]", "must carry its tag"));
    };
    Ok(match tag.as_str() {
        "BlockStored" => {
            let token_ids = match fields.get(3, "token_ids") {
                Some(Value::Array(ts)) => ts
                    .iter()
                    .map(|t| match t {
                        Value::Int(i) => {
                            u32::try_from(*i).map_err(|_| bad("token_ids", "out of range"))
                        }
                        _ => Err(bad("token_ids", "must be integers")),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                Some(Value::Ints(ts)) => ts
                    .iter()
                    .map(|&i| u32::try_from(i).map_err(|_| bad("token_ids", "out of range")))
                    .collect::<Result<Vec<_>, _>>()?,
                _ => return Err(bad("token_ids", "must be an array")),
            };
            let block_size = int_of(fields.get(4, "block_size"), "block_size")?
                .and_then(|b| u32::try_from(b).ok())
                .filter(|&b| b > 0)
                .ok_or_else(|| bad("block_size", "must be a positive integer"))?;
            KvEvent::Stored {
                blocks: blocks_of(fields.get(1, "block_hashes"), "block_hashes")?,
                parent: match fields.get(2, "parent_block_hash") {
                    None | Some(Value::Nil) => None,
                    Some(h) => Some(block_of(h, "parent_block_hash")?),
                },
                token_ids,
                block_size,
                lora_id: int_of(fields.get(5, "lora_id"), "lora_id")?,
                medium: medium_of(fields.get(6, "medium"))?,
            }
        }
        "BlockRemoved" => KvEvent::Removed {
            blocks: blocks_of(fields.get(1, "block_hashes"), "block_hashes")?,
            medium: medium_of(fields.get(2, "medium"))?,
        },
        "AllBlocksCleared" => KvEvent::Cleared,
        _ => KvEvent::Unknown,
    })
}

/// Decodes one payload frame (see the module docs for the format and the limits).
pub fn decode_batch(payload: &[u8]) -> Result<KvEventBatch, KvEventError> {
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(KvEventError::TooLarge(payload.len()));
    }
    let mut reader = Reader { rest: payload };
    let Some(fields) = reader.value(0, "batch")?.into_items() else {
        return Err(bad("batch", "must be an array"));
    };
    let mut fields = fields.into_iter();
    let ts = match fields.next() {
        Some(Value::Float(t)) => t,
        Some(Value::Int(i)) => i as f64,
        _ => return Err(bad("ts", "must be a number")),
    };
    let Some(events) = fields.next().and_then(Value::into_items) else {
        return Err(bad("events", "must be an array"));
    };
    if events.len() > MAX_EVENTS {
        return Err(bad("events", "more than 65,536 events"));
    }
    Ok(KvEventBatch {
        ts,
        events: events.iter().map(event_of).collect::<Result<_, _>>()?,
        data_parallel_rank: int_of(fields.next().as_ref(), "data_parallel_rank")?,
    })
}

/// Encodes a batch as vLLM 0.32 does: events as maps tagged under `"type"`, every field of
/// BlockStored and BlockRemoved written, `nil` where unset. Integer hashes are written unsigned.
pub fn encode_batch(batch: &KvEventBatch) -> Vec<u8> {
    let mut out = Vec::new();
    let w = &mut out;
    array_len(
        w,
        if batch.data_parallel_rank.is_some() {
            3
        } else {
            2
        },
    );
    w.push(0xcb);
    w.extend_from_slice(&batch.ts.to_bits().to_be_bytes());
    // an event this reader did not know has nothing to write: it is left out, never re-tagged
    let events: Vec<&KvEvent> = batch
        .events
        .iter()
        .filter(|e| !matches!(e, KvEvent::Unknown))
        .collect();
    array_len(w, events.len());
    let medium_name = |m: &Medium| match m {
        Medium::Gpu => "GPU",
        Medium::Offloaded => "CPU",
    };
    for e in events {
        match e {
            KvEvent::Stored {
                blocks,
                parent,
                token_ids,
                block_size,
                lora_id,
                medium,
            } => {
                w.push(0x88);
                tag(w, "type");
                tag(w, "BlockStored");
                tag(w, "block_hashes");
                hashes(w, blocks);
                tag(w, "parent_block_hash");
                match parent {
                    Some(p) => uint(w, *p),
                    None => w.push(0xc0),
                }
                tag(w, "token_ids");
                array_len(w, token_ids.len());
                for &t in token_ids {
                    uint(w, u64::from(t));
                }
                tag(w, "block_size");
                uint(w, u64::from(*block_size));
                tag(w, "lora_id");
                match lora_id {
                    Some(l) => sint(w, *l),
                    None => w.push(0xc0),
                }
                tag(w, "medium");
                tag(w, medium_name(medium));
                tag(w, "lora_name");
                w.push(0xc0);
            }
            KvEvent::Removed { blocks, medium } => {
                w.push(0x83);
                tag(w, "type");
                tag(w, "BlockRemoved");
                tag(w, "block_hashes");
                hashes(w, blocks);
                tag(w, "medium");
                tag(w, medium_name(medium));
            }
            KvEvent::Cleared => {
                w.push(0x81);
                tag(w, "type");
                tag(w, "AllBlocksCleared");
            }
            KvEvent::Unknown => {}
        }
    }
    if let Some(r) = batch.data_parallel_rank {
        sint(w, r);
    }
    out
}

fn array_len(w: &mut Vec<u8>, n: usize) {
    if n < 16 {
        w.push(0x90 | n as u8);
    } else if n <= usize::from(u16::MAX) {
        w.push(0xdc);
        w.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        w.push(0xdd);
        w.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

fn tag(w: &mut Vec<u8>, s: &str) {
    // field names and tags only: shorter than 32 bytes
    w.push(0xa0 | (s.len() as u8 & 0x1f));
    w.extend_from_slice(s.as_bytes());
}

fn uint(w: &mut Vec<u8>, v: u64) {
    if v < 0x80 {
        w.push(v as u8);
    } else if v <= u64::from(u32::MAX) {
        w.push(0xce);
        w.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        w.push(0xcf);
        w.extend_from_slice(&v.to_be_bytes());
    }
}

fn sint(w: &mut Vec<u8>, v: i64) {
    if v >= 0 {
        uint(w, v as u64);
    } else {
        w.push(0xd3);
        w.extend_from_slice(&v.to_be_bytes());
    }
}

fn hashes(w: &mut Vec<u8>, blocks: &[EngineBlock]) {
    array_len(w, blocks.len());
    for &b in blocks {
        uint(w, b);
    }
}

#[cfg(test)]
mod tests;
