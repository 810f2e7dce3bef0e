//! The order in which a warm-up plan takes the keys that move to a pod (`warmup.sampling`); the
//! plan's tiers are cut from this order.
//!
//! - `hottest` (the default): hottest first. The first tier's `F` keys are then the `F`
//!   hottest that move: the most expected prefix hits, if the next minutes bring the hotness
//!   the pool measured.
//! - `groups`: the pool's semantic groups (leader clustering of the prompt index at
//!   `embeddings.group_cosine`, [`crate::embeddings`]) covered by hotness. Round `r` takes the
//!   `r`-th key of every group that has more than `r` moving keys, so every group is in the
//!   plan once before any is in it twice. Within a round the groups come in a roulette draw,
//!   each next group with probability its hotness (its moving keys' total) over the round's
//!   remaining groups'; within a group its keys come in a roulette draw by their own hotness.
//!   Keys in no group (not embedded yet, or embeddings off) form one group together, so
//!   without embeddings the order is a plain roulette by hotness.
//!
//! A roulette draw without replacement is an order by core's `weighted_draw` (`−w / ln u`,
//! highest first: Efraimidis–Spirakis), `u` from a hash of the pod, the round and the item —
//! the same plan for the same pool, and a different draw for each pod.
//!
//! What `groups` trades, and what it assumes: it gives up expected hits of the first tier (a
//! cold group's key takes the place of a hot group's second key) for coverage of the topics the
//! pool holds. That pays when hotness is a poor forecast at the group level — when a topic's
//! prompts rise and fall together (a product launch, a new document set) and the tier is small
//! against the pool — and costs when the measured hotness holds, as it does in a stationary
//! trace. It is opt-in for that reason; `docs/embedding-warmup.md` has the measured trade.

use std::collections::HashMap;

use prewarm_core::placement::weighted_draw;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::{HotPrefix, PrefixKey};

/// How a warm-up plan orders the keys that move to a pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sampling {
    /// Hottest first.
    #[default]
    Hottest,
    /// The semantic groups covered by hotness: see the module docs.
    Groups,
}

/// The semantic group of each grouped pool prompt (ids are arbitrary but stable within one map).
pub type SemanticGroups = HashMap<PrefixKey, u32>;

/// The group of keys that are in no semantic group.
const UNGROUPED: u64 = u64::MAX;

/// `moved` (hottest first) in `sampling`'s order; `seed` makes the draw (the pod's hash).
pub fn order(
    moved: Vec<&HotPrefix>,
    sampling: Sampling,
    groups: &SemanticGroups,
    seed: u64,
) -> Vec<PrefixKey> {
    match sampling {
        Sampling::Hottest => moved.into_iter().map(|h| h.key).collect(),
        Sampling::Groups => by_groups(moved, groups, seed),
    }
}

fn draw(seed: u64, round: u64, item: u64, weight: f64) -> f64 {
    let h = xxh3_64_with_seed(&[round.to_le_bytes(), item.to_le_bytes()].concat(), seed);
    // A key of no hotness still comes, after every weighted one.
    weighted_draw(h, weight.max(f64::MIN_POSITIVE))
}

fn key_item(key: &PrefixKey) -> u64 {
    key.model.rotate_left(32) ^ key.last.0
}

fn by_groups(moved: Vec<&HotPrefix>, groups: &SemanticGroups, seed: u64) -> Vec<PrefixKey> {
    // Each group's keys in a roulette draw by hotness, and the group's hotness.
    let mut members: HashMap<u64, (f64, Vec<(f64, PrefixKey)>)> = HashMap::new();
    for h in moved {
        let group = groups.get(&h.key).map_or(UNGROUPED, |g| u64::from(*g));
        let entry = members.entry(group).or_default();
        entry.0 += h.hotness.max(0.0);
        entry
            .1
            .push((draw(seed, 0, key_item(&h.key), h.hotness), h.key));
    }
    let mut groups: Vec<(u64, f64, Vec<PrefixKey>)> = members
        .into_iter()
        .map(|(group, (hotness, mut keys))| {
            keys.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            (group, hotness, keys.into_iter().map(|(_, k)| k).collect())
        })
        .collect();
    let total: usize = groups.iter().map(|g| g.2.len()).sum();
    let mut out = Vec::with_capacity(total);
    let mut round = 0usize;
    while out.len() < total {
        groups.retain(|g| g.2.len() > round);
        let mut drawn: Vec<(f64, u64, PrefixKey)> = groups
            .iter()
            .filter_map(|(group, hotness, keys)| {
                let key = *keys.get(round)?;
                let d = draw(seed, round as u64 + 1, *group, *hotness);
                Some((d, *group, key))
            })
            .collect();
        drawn.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        out.extend(drawn.into_iter().map(|(_, _, k)| k));
        round += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use prewarm_core::fingerprint::BlockHash;

    fn prefix(i: u64, hotness: f64) -> HotPrefix {
        HotPrefix {
            key: PrefixKey {
                model: 1,
                last: BlockHash(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            },
            routing_key: BlockHash(i),
            tokens: 512,
            hotness,
            fleet_wide: false,
            holders: 0,
        }
    }

    /// `sizes[g]` keys in group `g`, hotness falling with the group and within it.
    fn grouped(sizes: &[u64]) -> (Vec<HotPrefix>, SemanticGroups) {
        let mut hot = Vec::new();
        let mut groups = SemanticGroups::new();
        let mut i = 0;
        for (g, n) in sizes.iter().enumerate() {
            for m in 0..*n {
                let p = prefix(i, 1_000.0 / (g as f64 + 1.0) / (m as f64 + 1.0));
                groups.insert(p.key, g as u32);
                hot.push(p);
                i += 1;
            }
        }
        hot.sort_by(|a, b| b.hotness.total_cmp(&a.hotness));
        (hot, groups)
    }

    #[test]
    fn hottest_keeps_the_hotness_order() {
        let (hot, groups) = grouped(&[5, 3, 2]);
        let keys: Vec<PrefixKey> = hot.iter().map(|h| h.key).collect();
        assert_eq!(
            order(hot.iter().collect(), Sampling::Hottest, &groups, 7),
            keys
        );
    }

    #[test]
    fn every_group_comes_once_before_any_comes_twice() {
        let (hot, groups) = grouped(&[40, 1, 1, 1, 20, 1]);
        for seed in 0..50 {
            let got = order(hot.iter().collect(), Sampling::Groups, &groups, seed);
            assert_eq!(got.len(), hot.len(), "every key, once");
            let first: std::collections::HashSet<u32> =
                got.iter().take(6).map(|k| groups[k]).collect();
            assert_eq!(
                first.len(),
                6,
                "seed {seed}: the first six keys cover the six groups"
            );
        }
    }

    #[test]
    fn a_group_comes_first_in_proportion_to_its_hotness() {
        // Two groups of one key: hotness 3 and 1, so the hot one leads 3 draws in 4.
        let hot = [prefix(1, 3.0), prefix(2, 1.0)];
        let groups: SemanticGroups = [(hot[0].key, 0), (hot[1].key, 1)].into_iter().collect();
        let n = 4_000;
        let led = (0..n)
            .filter(|seed| {
                order(hot.iter().collect(), Sampling::Groups, &groups, *seed)[0] == hot[0].key
            })
            .count();
        let share = led as f64 / n as f64;
        // ±4.3 standard deviations of a binomial(4000, 0.75) share.
        assert!((share - 0.75).abs() < 0.03, "share {share}");
    }

    #[test]
    fn within_a_group_keys_come_in_proportion_to_their_hotness() {
        let hot = [prefix(1, 9.0), prefix(2, 1.0)];
        let n = 4_000;
        let led = (0..n)
            .filter(|seed| {
                order(
                    hot.iter().collect(),
                    Sampling::Groups,
                    &SemanticGroups::new(),
                    *seed,
                )[0] == hot[0].key
            })
            .count();
        let share = led as f64 / n as f64;
        assert!((share - 0.9).abs() < 0.02, "share {share}");
    }

    #[test]
    fn the_order_is_the_same_for_the_same_seed_and_differs_across_seeds() {
        let (hot, groups) = grouped(&[10, 10, 10, 10]);
        let a = order(hot.iter().collect(), Sampling::Groups, &groups, 1);
        assert_eq!(a, order(hot.iter().collect(), Sampling::Groups, &groups, 1));
        assert_ne!(a, order(hot.iter().collect(), Sampling::Groups, &groups, 2));
    }

    #[test]
    fn keys_without_hotness_still_come_last() {
        let hot = [prefix(1, 0.0), prefix(2, 5.0), prefix(3, f64::NAN)];
        let got = order(
            hot.iter().collect(),
            Sampling::Groups,
            &SemanticGroups::new(),
            3,
        );
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], hot[1].key);
    }
}
