//! Which LoRA adapters keep their GPU slot beyond the tier rules: the gateway's LoRA policy
//! (`[lora] residency_rule`) and an experiment arm's `residency_rule` name one of these rules.
//! The rule itself runs in the gateway (`policy::lora`); it lives here so the filter and the
//! gateway read one experiment definition.

use serde::{Deserialize, Serialize};

/// The seed keep rule's reuse distance: two uses closer than this make an adapter "reused".
pub const KEEP_REUSE_MS: u64 = 30_000;

/// Which adapters keep their GPU slot beyond the tier rules.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResidencyRule {
    /// None: every unpinned adapter past its minimum residency is a victim, in LRU-2 order.
    #[default]
    Lru2,
    /// The seed deployment's keep rule: an adapter whose last two uses were less than
    /// [`KEEP_REUSE_MS`] apart and whose priority (normalised to [0, 1]) is above 0.7, or whose
    /// priority is above 0.95, is kept (not a victim, and touched as protected adapters are).
    SeedKeep,
}
