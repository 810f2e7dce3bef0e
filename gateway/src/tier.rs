//! A tenant's tier: the vocabulary the adapter registry records (whose tier an adapter serves)
//! and the policies decide over (residency guarantees, gold pools, placement). A leaf below both,
//! so that the registry need not import the policies that own it.

use serde::{Deserialize, Serialize};

/// A tenant tier. Ordered bronze < silver < gold.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    #[default]
    Bronze,
    Silver,
    Gold,
}
