//! The prefix index's slots: where a key lives (`hash mod slots`), the fixed-size, versioned
//! entry a slot holds, and the [`PrefixStore`] a host provides (the filter: Envoy's shared data;
//! the evaluator and tests: [`MemoryStore`]). What the entries mean and how they route is the
//! parent module's.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The entry layout's version (first byte of every entry); other versions read as empty.
pub const ENTRY_VERSION: u8 = 1;
/// Bytes of one encoded entry: version, flags, shard hash, pod hash, written-at ms.
pub const ENTRY_BYTES: usize = 2 + 8 + 8 + 8;
/// Default slots: 16,384 × 26 bytes ≈ 416 KiB of values per proxy.
pub const DEFAULT_SLOTS: u32 = 16_384;
/// Most slots a configuration may ask for (≈ 27 MiB of values).
pub const MAX_SLOTS: u32 = 1 << 20;

const FLAG_INTERIOR: u8 = 1;
/// The flags byte's other 7 bits count the entry's moves.
const MOVES_SHIFT: u8 = 1;
/// Moves that make an entry common: sent to at least three pods within its horizon. See the
/// parent module's docs.
pub const COMMON_MOVES: u8 = 2;
/// Most moves an entry counts.
pub const MAX_MOVES: u8 = 0x7f;
/// Domain seed of pod-id hashes ("prewarmp").
const POD_SEED: u64 = 0x7072_6577_6172_6d70;

/// The pod of an entry: a hash of its id.
pub fn pod_hash(id: &str) -> u64 {
    xxh3_64_with_seed(id.as_bytes(), POD_SEED)
}

/// The slot of a shard hash among `slots` (at least 1).
pub fn slot_of(shard: u64, slots: u32) -> u32 {
    // the remainder is below `slots`, so it fits
    u32::try_from(shard % u64::from(slots.max(1))).unwrap_or(0)
}

/// One slot's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixEntry {
    /// Chain hash of the shard.
    pub shard: u64,
    /// [`pod_hash`] of the pod it was last sent to.
    pub pod: u64,
    /// When it was last written, ms (the writer's clock).
    pub at_ms: u64,
    /// A prompt went on past it (it is not the end of every prompt that wrote it).
    pub interior: bool,
    /// Times it was written with another pod than the one it named while fresh (saturating at
    /// [`MAX_MOVES`]): a prefix sent to several pods.
    pub moves: u8,
}

impl PrefixEntry {
    pub fn encode(&self) -> [u8; ENTRY_BYTES] {
        let mut out = [0u8; ENTRY_BYTES];
        let parts: [&[u8]; 5] = [
            &[ENTRY_VERSION],
            &[u8::from(self.interior) | (self.moves.min(MAX_MOVES) << MOVES_SHIFT)],
            &self.shard.to_le_bytes(),
            &self.pod.to_le_bytes(),
            &self.at_ms.to_le_bytes(),
        ];
        let mut at = 0;
        for part in parts {
            for (dst, src) in out.iter_mut().skip(at).zip(part) {
                *dst = *src;
            }
            at += part.len();
        }
        out
    }

    /// The entry in `bytes`; `None` for anything but one entry of this version.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != ENTRY_BYTES || bytes.first() != Some(&ENTRY_VERSION) {
            return None;
        }
        let word = |at: usize| -> Option<u64> {
            let b: [u8; 8] = bytes.get(at..at.checked_add(8)?)?.try_into().ok()?;
            Some(u64::from_le_bytes(b))
        };
        Some(Self {
            interior: bytes.get(1).is_some_and(|f| f & FLAG_INTERIOR != 0),
            moves: bytes.get(1).map_or(0, |f| f >> MOVES_SHIFT),
            shard: word(2)?,
            pod: word(10)?,
            at_ms: word(18)?,
        })
    }

    /// Whether the prefix was sent to several pods: moved at least [`COMMON_MOVES`] times.
    pub fn common(&self) -> bool {
        self.moves >= COMMON_MOVES
    }

    /// Whether it is younger than `horizon_ms` at `now_ms` (a write from a clock ahead of this
    /// one counts as fresh).
    pub fn fresh(&self, now_ms: u64, horizon_ms: u64) -> bool {
        now_ms.saturating_sub(self.at_ms) < horizon_ms
    }
}

/// Where a host keeps the slots. Reads and writes may fail (a failed read is a miss).
pub trait PrefixStore {
    /// Number of slots (at least 1).
    fn slots(&self) -> u32;
    /// The bytes in `slot`, if any.
    fn read(&self, slot: u32) -> Option<Vec<u8>>;
    /// Replaces `slot`'s bytes; `false` when the host refused.
    fn write(&mut self, slot: u32, entry: &[u8; ENTRY_BYTES]) -> bool;
}

/// An in-memory store (the evaluator's, and tests').
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    slots: u32,
    entries: std::collections::HashMap<u32, [u8; ENTRY_BYTES]>,
}

impl MemoryStore {
    pub fn new(slots: u32) -> Self {
        Self {
            slots: slots.clamp(1, MAX_SLOTS),
            entries: Default::default(),
        }
    }
}

impl PrefixStore for MemoryStore {
    fn slots(&self) -> u32 {
        self.slots.max(1)
    }

    fn read(&self, slot: u32) -> Option<Vec<u8>> {
        self.entries.get(&slot).map(|e| e.to_vec())
    }

    fn write(&mut self, slot: u32, entry: &[u8; ENTRY_BYTES]) -> bool {
        self.entries.insert(slot, *entry);
        true
    }
}
