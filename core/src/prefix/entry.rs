//! The prefix index's slots: where a key lives (`hash mod slots`), the fixed-size, versioned
//! entry a slot holds, and the [`PrefixStore`] a host provides (the filter: Envoy's shared data;
//! the evaluator and tests: [`MemoryStore`]). What the entries mean and how they route is the
//! parent module's.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The entry layout's version (first byte of every entry); other versions read as empty (version
/// 1 had no earlier holders: a proxy that loads a filter of the other layout starts its index
/// over, which costs one horizon of stickiness, never a wrong route).
pub const ENTRY_VERSION: u8 = 2;
/// Pods an entry names: the one it was last sent to and up to `HOLDERS − 1` it was sent to
/// before, each with its own time. Four keeps an entry at 74 bytes; a prefix that needs more
/// pods than four keeps them all warm through the overflow of the ones it names (the parent
/// module's step 4), and the ones it stopped naming keep their conversations' next turns.
pub const HOLDERS: usize = 4;
/// Bytes of one encoded entry: version, flags, shard hash, then each holder's pod hash and
/// written-at ms (an absent holder is zeros).
pub const ENTRY_BYTES: usize = 2 + 8 + HOLDERS * 16;
/// Default slots: 16,384 × 74 bytes ≈ 1.2 MiB of values per proxy.
pub const DEFAULT_SLOTS: u32 = 16_384;
/// Most slots a configuration may ask for (≈ 74 MiB of values).
pub const MAX_SLOTS: u32 = 1 << 20;

/// Where the earlier holders start: after version, flags, shard, pod and time.
const EARLIER_AT: usize = 2 + 8 + 8 + 8;

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

/// A pod an entry was sent to before its current one, and when it last was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Holder {
    /// [`pod_hash`] of the pod; 0 for none.
    pub pod: u64,
    pub at_ms: u64,
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
    /// Times it was written, while fresh, with a pod it did not list among its holders
    /// (saturating at [`MAX_MOVES`]): a prefix sent to several pods.
    pub moves: u8,
    /// The other pods it was sent to while fresh, most recent first, each when it last was
    /// (absent ones have pod 0): they received the prefix too, and hold it until they evict it.
    pub earlier: [Holder; HOLDERS - 1],
}

impl PrefixEntry {
    pub fn encode(&self) -> [u8; ENTRY_BYTES] {
        let mut out = [0u8; ENTRY_BYTES];
        let head = [
            ENTRY_VERSION,
            u8::from(self.interior) | (self.moves.min(MAX_MOVES) << MOVES_SHIFT),
        ];
        let words = std::iter::once(self.shard)
            .chain([self.pod, self.at_ms])
            .chain(self.earlier.iter().flat_map(|h| [h.pod, h.at_ms]))
            .flat_map(u64::to_le_bytes);
        for (dst, src) in out.iter_mut().zip(head.into_iter().chain(words)) {
            *dst = src;
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
        let mut earlier = [Holder::default(); HOLDERS - 1];
        for (i, h) in earlier.iter_mut().enumerate() {
            let at = EARLIER_AT.checked_add(i.checked_mul(16)?)?;
            *h = Holder {
                pod: word(at)?,
                at_ms: word(at.checked_add(8)?)?,
            };
        }
        Some(Self {
            interior: bytes.get(1).is_some_and(|f| f & FLAG_INTERIOR != 0),
            moves: bytes.get(1).map_or(0, |f| f >> MOVES_SHIFT),
            shard: word(2)?,
            pod: word(10)?,
            at_ms: word(18)?,
            earlier,
        })
    }

    /// An entry for `shard` sent to `pod` at `now_ms`, after `old` (the slot's fresh entry for
    /// it, if any): `old`'s pod, when another, becomes the most recent earlier holder, and
    /// `pod` leaves the earlier ones; holders older than `horizon_ms` are dropped. Moves and
    /// the interior flag are the caller's.
    pub fn sent_to(
        old: Option<&PrefixEntry>,
        shard: u64,
        pod: u64,
        now_ms: u64,
        horizon_ms: u64,
    ) -> Self {
        let mut earlier = [Holder::default(); HOLDERS - 1];
        if let Some(old) = old {
            let before = std::iter::once(Holder {
                pod: old.pod,
                at_ms: old.at_ms,
            })
            .chain(old.earlier)
            .filter(|h| h.pod != 0 && h.pod != pod)
            .filter(|h| now_ms.saturating_sub(h.at_ms) < horizon_ms);
            for (dst, h) in earlier.iter_mut().zip(before) {
                *dst = h;
            }
        }
        Self {
            shard,
            pod,
            at_ms: now_ms,
            interior: false,
            moves: 0,
            earlier,
        }
    }

    /// The pods holding it at `now_ms`: its pod, then the earlier holders younger than
    /// `horizon_ms`, most recent first (none when the entry itself is stale).
    pub fn holders(&self, now_ms: u64, horizon_ms: u64) -> impl Iterator<Item = u64> + '_ {
        let fresh = self.fresh(now_ms, horizon_ms);
        std::iter::once(self.pod)
            .chain(
                self.earlier
                    .iter()
                    .filter(move |h| h.pod != 0 && now_ms.saturating_sub(h.at_ms) < horizon_ms)
                    .map(|h| h.pod),
            )
            .filter(move |_| fresh)
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
