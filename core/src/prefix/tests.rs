// Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
use super::*;
use crate::placement::{place, PlacementCandidate};
use proptest::prelude::*;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const HORIZON: u64 = 120_000;

fn pod(id: &str, load: Option<f64>) -> RoutedPod {
    RoutedPod {
        load,
        ..RoutedPod::new(id, &format!("{id}:8000"), &[])
    }
}

fn table(n: usize, load_factor: Option<f64>) -> RoutingTable {
    let pods = (0..n)
        .map(|i| pod(&format!("pod-{i}"), Some(0.2)))
        .collect();
    RoutingTable {
        load_factor,
        ..RoutingTable::of_pods(1, 64, pods)
    }
}

fn fp() -> FingerprintConfig {
    FingerprintConfig::default()
}

/// A prompt of `system` bytes shared by all, then `own` bytes of conversation `conv`.
fn prompt(system: usize, conv: u32, own: usize) -> PromptKeys {
    let mut text = vec![b's'; system];
    let tag = format!("conversation {conv} ");
    text.extend(tag.bytes().cycle().take(own));
    PromptKeys::of(&BlockChain::of("m", &text, &fp()), &fp())
}

/// Routes and records as the filter does; returns the pod id.
fn route(t: &RoutingTable, store: &mut MemoryStore, keys: &PromptKeys, now: u64) -> String {
    let r = route_prefix(t, "m", keys, store, now, HORIZON).unwrap();
    let id = r.primary.id.clone();
    record(store, keys, &id, now, HORIZON);
    id
}

#[test]
fn entries_round_trip_and_refuse_other_bytes() {
    let e = PrefixEntry {
        shard: 7,
        pod: pod_hash("pod-1"),
        at_ms: 99,
        interior: true,
        moves: 5,
        earlier: [
            Holder {
                pod: pod_hash("pod-2"),
                at_ms: 98,
            },
            Holder::default(),
            Holder {
                pod: 3,
                at_ms: u64::MAX,
            },
        ],
    };
    assert_eq!(PrefixEntry::decode(&e.encode()), Some(e));
    let saturated = PrefixEntry {
        moves: MAX_MOVES,
        ..e
    };
    assert_eq!(PrefixEntry::decode(&saturated.encode()), Some(saturated));
    let mut other = e.encode();
    other[0] = 1;
    assert_eq!(PrefixEntry::decode(&other), None);
    assert_eq!(PrefixEntry::decode(&e.encode()[1..]), None);
}

#[test]
fn the_horizon_is_the_time_to_overwrite_the_cache() {
    // 32,768 blocks of 16 tokens at 4,000 tokens/s a tenth of the time (llama-8b-h100 in
    // podsim): 1,311 s.
    assert_eq!(
        eviction_horizon_ms(32_768 * 16, 4_000.0),
        DEFAULT_HORIZON_MS
    );
    assert_eq!(eviction_horizon_ms(1, 0.0), 0);
    assert_eq!(eviction_horizon_ms(1, f64::NAN), 0);
}

/// The pod rendezvous puts `key` on.
fn rendezvous(t: &RoutingTable, key: u64) -> String {
    let candidates: Vec<PlacementCandidate<'_>> = t
        .pods
        .iter()
        .map(|p| PlacementCandidate::new(&p.id, 1.0))
        .collect();
    t.pods[place(key, &candidates).unwrap()].id.clone()
}

#[test]
fn a_routed_prompts_follow_ups_stick_while_new_conversations_spread() {
    let mut t = table(8, Some(1.25));
    let mut store = MemoryStore::new(DEFAULT_SLOTS);
    // 2,048 tokens of shared system prompt (4 shards), then each conversation's own text; the
    // table's loads follow the conversations routed (a pod is half busy with 8 of them), so
    // they reach new pods as the ones holding the system prompt fill
    let system = 2048 * 4;
    let mut first = Vec::new();
    let mut counts = vec![0u32; 8];
    for conv in 0..64 {
        let pod = route(&t, &mut store, &prompt(system, conv, 600), 1_000);
        let i = t.pods.iter().position(|p| p.id == pod).unwrap();
        counts[i] += 1;
        for (p, n) in t.pods.iter_mut().zip(&counts) {
            p.load = Some((f64::from(*n) / 16.0).min(1.0));
        }
        first.push(pod);
    }
    let spread: std::collections::BTreeSet<&String> = first.iter().collect();
    assert!(spread.len() >= 6, "new conversations on {spread:?}");
    assert!(counts.iter().all(|n| *n <= 16), "{counts:?}");
    for p in &mut t.pods {
        p.load = Some(0.1);
    }
    for (conv, pod) in first.iter().enumerate() {
        // the next turn: the same conversation, longer (its partial shard grows)
        let keys = prompt(system, conv as u32, 1_500);
        let r = route_prefix(&t, "m", &keys, &store, 2_000, HORIZON).unwrap();
        assert_eq!(&r.primary.id, pod, "conversation {conv}");
        assert!(r.matched_blocks > 32, "matched {}", r.matched_blocks);
        assert!(r.reads <= 7 + 4);
    }
}

#[test]
fn without_entries_a_prompt_goes_where_first_shard_rendezvous_puts_it() {
    let t = table(5, None);
    let store = MemoryStore::new(64);
    for conv in 0..100 {
        let keys = prompt(0, conv, 3_000);
        let r = route_prefix(&t, "m", &keys, &store, 0, HORIZON).unwrap();
        assert_eq!(
            r.primary.id,
            rendezvous(&t, keys.first_shard_key().unwrap())
        );
        assert_eq!(r.matched_blocks, 0);
    }
}

/// The pod rendezvous picks for `keys` in `t` without entries, and another one.
fn rendezvous_and_other(t: &RoutingTable, keys: &PromptKeys) -> (String, String) {
    let r = route_prefix(t, "m", keys, &MemoryStore::new(8), 0, HORIZON).unwrap();
    let other = t.pods.iter().find(|p| p.id != r.primary.id).unwrap();
    (r.primary.id.clone(), other.id.clone())
}

#[test]
fn stale_entries_and_entries_of_absent_pods_are_ignored() {
    let t = table(4, None);
    let first = prompt(0, 1, 3_000);
    let next = prompt(0, 1, 3_900);
    let (placed, other) = rendezvous_and_other(&t, &next);
    let mut store = MemoryStore::new(DEFAULT_SLOTS);
    record(&mut store, &first, &other, 10_000, HORIZON);
    let at = |now| route_prefix(&t, "m", &next, &store, now, HORIZON).unwrap();
    assert_eq!(at(10_000 + HORIZON - 1).primary.id, other);
    assert_eq!(at(10_000 + HORIZON).primary.id, placed, "stale");
    let mut gone = MemoryStore::new(DEFAULT_SLOTS);
    record(&mut gone, &first, "pod-99", 10_000, HORIZON);
    let r = route_prefix(&t, "m", &next, &gone, 10_000, HORIZON).unwrap();
    assert_eq!(
        (r.primary.id.as_str(), r.matched_blocks),
        (placed.as_str(), 0)
    );
}

#[test]
fn an_overloaded_matched_pod_is_left() {
    let mut t = table(4, Some(1.25));
    let first = prompt(0, 1, 3_000);
    let next = prompt(0, 1, 3_900);
    let (_, other) = rendezvous_and_other(&t, &next);
    let mut store = MemoryStore::new(DEFAULT_SLOTS);
    record(&mut store, &first, &other, 0, HORIZON);
    let r = route_prefix(&t, "m", &next, &store, 1, HORIZON).unwrap();
    assert_eq!(
        (r.primary.id.as_str(), r.matched_blocks),
        (other.as_str(), 11)
    );
    for p in &mut t.pods {
        if p.id == other {
            p.load = Some(0.9); // mean 0.375, cap 0.47
        }
    }
    let r = route_prefix(&t, "m", &next, &store, 1, HORIZON).unwrap();
    assert_ne!(r.primary.id, other);
    assert_eq!(r.matched_blocks, 0);
}

/// `next`'s route when `first` went to the holder (the rendezvous runner-up), the holder has
/// `load` and waits `holder_wait` ms, every other pod waits `others_wait` ms, and moving is
/// priced at 250 µs a token; returns whether the holder kept it.
fn holder_keeps(
    first: &PromptKeys,
    next: &PromptKeys,
    load: f64,
    holder_wait: u64,
    others_wait: u64,
) -> bool {
    holder_keeps_against(first, next, (load, holder_wait), (0.2, others_wait))
}

/// [`holder_keeps`] with the other pods' load too.
fn holder_keeps_against(
    first: &PromptKeys,
    next: &PromptKeys,
    (load, holder_wait): (f64, u64),
    (others_load, others_wait): (f64, u64),
) -> bool {
    let mut t = table(4, Some(1.25));
    t.prefill_us_per_token = Some(250.0);
    let (_, holder) = rendezvous_and_other(&t, next);
    for p in &mut t.pods {
        let is_holder = p.id == holder;
        p.load = Some(if is_holder { load } else { others_load });
        p.wait_ms = Some(if is_holder { holder_wait } else { others_wait });
    }
    let mut store = MemoryStore::new(DEFAULT_SLOTS);
    record(&mut store, first, &holder, 0, HORIZON);
    let r = route_prefix(&t, "m", next, &store, 1, HORIZON).unwrap();
    let kept = r.primary.id == holder;
    assert_eq!(r.matched_blocks > 0, kept, "a move matches nothing");
    kept
}

#[test]
fn a_busy_holder_keeps_the_request_while_its_wait_costs_less_than_the_move() {
    // 11 blocks of 64 tokens matched: 704 tokens, 176 ms to prefill elsewhere.
    let (first, next) = (prompt(0, 1, 3_000), prompt(0, 1, 3_900));
    assert!(
        holder_keeps(&first, &next, 0.9, 0, 0),
        "over the cap, no queue"
    );
    assert!(holder_keeps(&first, &next, 0.9, 100, 0));
    assert!(!holder_keeps(&first, &next, 0.9, 1_000, 0));
    assert!(
        holder_keeps(&first, &next, 0.9, 1_000, 900),
        "moving waits 900 ms as well: 1,076 ms in all"
    );
}

/// A move's prefill delays the requests queued behind it on a busy pod: priced at
/// `1 ÷ (1 − ρ)` times the request's own (move_cost's module doc).
#[test]
fn a_move_onto_a_busy_pod_costs_the_requests_queued_there_too() {
    // 704 tokens matched: 176 ms to prefill on an idle pod, 880 ms on one busy 80 % of the
    // minute, 3.5 s (the cap, 20 ×) on one busy all of it.
    let (first, next) = (prompt(0, 1, 3_000), prompt(0, 1, 3_900));
    assert!(!holder_keeps_against(&first, &next, (0.9, 800), (0.0, 0)));
    assert!(holder_keeps_against(&first, &next, (0.9, 800), (0.8, 0)));
    assert!(!holder_keeps_against(&first, &next, (0.9, 1_000), (0.8, 0)));
    assert!(holder_keeps_against(&first, &next, (1.0, 3_500), (1.0, 0)));
    assert!(!holder_keeps_against(&first, &next, (1.0, 3_600), (1.0, 0)));
}

#[test]
fn a_holder_under_the_cap_with_a_long_queue_is_left() {
    let (first, next) = (prompt(0, 1, 3_000), prompt(0, 1, 3_900));
    assert!(!holder_keeps(&first, &next, 0.2, 5_000, 0));
}

#[test]
fn a_long_context_outweighs_a_queue_a_short_one_does_not() {
    // 40,000 bytes: 156 blocks, ~10 k tokens, 2.5 s to prefill again; 3,000 bytes: 176 ms.
    let long = (prompt(0, 1, 40_000), prompt(0, 1, 41_000));
    let short = (prompt(0, 1, 3_000), prompt(0, 1, 3_900));
    assert!(holder_keeps(&long.0, &long.1, 0.9, 2_000, 0));
    assert!(!holder_keeps(&short.0, &short.1, 0.9, 2_000, 0));
}

#[test]
fn a_session_longer_than_the_index_is_priced_at_its_whole_context() {
    // 200,000 bytes: ~50 k tokens, of which the index keys 32,768 (512 blocks); its holder
    // has the whole previous turn, so a move prefills ~50 k tokens again: 12.6 s at 250 µs,
    // ÷ (1 − 0.2) for the other pods' load: 15.7 s (the keyed 32,768 tokens alone: 10.2 s)
    let long = (prompt(0, 1, 200_000), prompt(0, 1, 201_000));
    assert_eq!(long.1.held_tokens(512), long.1.prompt_tokens());
    assert_eq!(long.1.prompt_tokens(), 50_250);
    assert!(holder_keeps(&long.0, &long.1, 0.9, 15_000, 0));
    assert!(!holder_keeps(&long.0, &long.1, 0.9, 16_000, 0));
    // a match short of the index's end holds only its blocks
    assert_eq!(long.1.held_tokens(511), 511 * 64);
    // a prompt the index keys whole: its blocks, not its partial last block
    let short = prompt(0, 1, 3_900);
    assert_eq!(short.held_tokens(15), 15 * 64);
}

#[test]
fn the_pod_a_long_session_left_is_priced_at_what_it_matched() {
    // a ~50 k-token session went to one pod, then to another (the index keys its first
    // 32,768 tokens); the newest holder waits a minute, so the one the session left is asked:
    // it has the keyed 512 blocks, not what the session grew since, so a move off it costs
    // 32,768 tokens (8.2 s ÷ (1 − 0.2) = 10.2 s), not the whole prompt (15.7 s)
    let (first, next) = (prompt(0, 1, 200_000), prompt(0, 1, 201_000));
    let route_with = |left_wait: u64| {
        let mut t = table(4, Some(1.25));
        t.prefill_us_per_token = Some(250.0);
        for p in &mut t.pods {
            p.wait_ms = Some(match p.id.as_str() {
                "pod-1" => left_wait,
                "pod-2" => 60_000,
                _ => 0,
            });
        }
        let mut store = MemoryStore::new(DEFAULT_SLOTS);
        record(&mut store, &first, "pod-1", 0, HORIZON);
        record(&mut store, &first, "pod-2", 1, HORIZON);
        let r = route_prefix(&t, "m", &next, &store, 2, HORIZON).unwrap();
        (r.primary.id.clone(), r.matched_blocks)
    };
    assert_eq!(route_with(9_000), ("pod-1".to_string(), 512));
    let (moved_to, matched) = route_with(12_000);
    assert_ne!(moved_to, "pod-1");
    assert_ne!(moved_to, "pod-2");
    assert_eq!(matched, 0);
}

#[test]
fn a_new_prompt_leaves_its_placed_pod_only_for_a_wait_longer_than_its_prefill() {
    // nothing in the index: placed by rendezvous; 11 blocks, 176 ms to prefill anywhere
    let keys = prompt(0, 7, 3_000);
    let store = MemoryStore::new(DEFAULT_SLOTS);
    let routed = |placed_wait: u64, others_wait: u64| {
        let mut t = table(4, Some(1.25));
        t.prefill_us_per_token = Some(250.0);
        let placed = rendezvous(&t, keys.key_past(0).unwrap());
        for p in &mut t.pods {
            p.wait_ms = Some(if p.id == placed {
                placed_wait
            } else {
                others_wait
            });
        }
        let r = route_prefix(&t, "m", &keys, &store, 1, HORIZON).unwrap();
        (r.primary.id == placed, r.matched_blocks)
    };
    assert_eq!(routed(0, 0), (true, 0));
    assert_eq!(
        routed(100, 0),
        (true, 0),
        "a shorter wait than the prompt's prefill"
    );
    assert_eq!(routed(1_000, 0), (false, 0));
    assert_eq!(routed(1_000, 900), (true, 0), "the others wait too");
}

#[test]
fn without_a_price_or_a_wait_the_load_cap_decides() {
    let (first, next) = (prompt(0, 1, 3_000), prompt(0, 1, 3_900));
    let mut t = table(4, Some(1.25));
    let (_, holder) = rendezvous_and_other(&t, &next);
    let mut store = MemoryStore::new(DEFAULT_SLOTS);
    record(&mut store, &first, &holder, 0, HORIZON);
    for p in &mut t.pods {
        p.load = Some(if p.id == holder { 0.9 } else { 0.2 });
        p.wait_ms = Some(0);
    }
    let moved = |t: &RoutingTable| {
        route_prefix(t, "m", &next, &store, 1, HORIZON)
            .unwrap()
            .primary
            .id
            != holder
    };
    assert!(moved(&t), "waits without a price: the cap");
    t.prefill_us_per_token = Some(250.0);
    for p in &mut t.pods {
        p.wait_ms = None;
    }
    assert!(moved(&t), "a price without the holder's wait: the cap");
}

#[test]
fn a_prompt_longer_than_the_index_sees_continues_past_its_deepest_key() {
    // Both turns run past the fingerprint's 32,768 tokens: their keys are the same, and the
    // second is the session's next turn, not a repeat to be placed afresh.
    let t = table(4, Some(1.25));
    let (first, next) = (prompt(0, 1, 140_000), prompt(0, 1, 150_000));
    assert_eq!(first.written(), next.written());
    let (_, holder) = rendezvous_and_other(&t, &next);
    let mut store = MemoryStore::new(DEFAULT_SLOTS);
    record(&mut store, &first, &holder, 0, HORIZON);
    let r = route_prefix(&t, "m", &next, &store, 1, HORIZON).unwrap();
    assert_eq!(
        (r.primary.id.as_str(), r.matched_blocks),
        (holder.as_str(), 512)
    );
}

#[test]
fn a_repeat_sticks_to_the_pod_holding_it() {
    // a prompt ending where its deepest entry ends: that pod holds every block it matched,
    // whatever its last partial block (3,071 bytes: 255 past the last full block), not where
    // rendezvous would place it
    let t = table(4, Some(1.25));
    let mut store = MemoryStore::new(DEFAULT_SLOTS);
    for (conv, bytes) in [(2, 3_000), (3, 3_071)] {
        let short = prompt(0, conv, bytes);
        let (_, other) = rendezvous_and_other(&t, &short);
        record(&mut store, &short, &other, 0, HORIZON);
        let r = route_prefix(&t, "m", &short, &store, 1, HORIZON).unwrap();
        assert_eq!(
            (r.primary.id.as_str(), r.matched_blocks),
            (other.as_str(), short.blocks.len()),
            "{bytes} bytes"
        );
    }
}

#[test]
fn a_prompt_bringing_more_than_it_finds_is_placed_like_a_new_one() {
    // 8 blocks of template found on one pod, 23 new ones brought: the request is mostly new
    // content, placed by rendezvous (its first shard, the template's), not kept by the holder
    let t = table(4, None);
    let a = prompt(2_048, 1, 1_000);
    let (placed, other) = rendezvous_and_other(&t, &a);
    let mut store = MemoryStore::new(DEFAULT_SLOTS);
    record(&mut store, &a, &other, 0, HORIZON);
    let long = prompt(2_048, 2, 6_000);
    let r = route_prefix(&t, "m", &long, &store, 1, HORIZON).unwrap();
    assert_eq!(
        (r.primary.id.as_str(), r.matched_blocks),
        (placed.as_str(), 0)
    );
    // one that finds as much as it brings stays with the template's pod
    let even = prompt(2_048, 3, 2_048);
    let r = route_prefix(&t, "m", &even, &store, 1, HORIZON).unwrap();
    assert_eq!(
        (r.primary.id.as_str(), r.matched_blocks),
        (other.as_str(), 8)
    );
}

#[test]
fn a_branch_sticks_to_its_prefixs_pod_until_the_prefix_is_common() {
    // a template (one shard) another conversation went on past: a branch off it sticks to
    // that pod, not to where its first shard would place it
    let t = table(4, None);
    let a = prompt(2_048, 1, 1_000);
    let (_, other) = rendezvous_and_other(&t, &a);
    let mut store = MemoryStore::new(DEFAULT_SLOTS);
    record(&mut store, &a, &other, 0, HORIZON);
    let b = prompt(2_048, 2, 1_000);
    let r = route_prefix(&t, "m", &b, &store, 1, HORIZON).unwrap();
    assert_eq!(r.primary.id, other);
    assert!(r.matched_blocks >= 8, "matched {}", r.matched_blocks);
    // sent to two more pods (two moves): common, so no pod is where it lives any more
    let ids: Vec<String> = t.pods.iter().map(|p| p.id.clone()).collect();
    let movers: Vec<&String> = ids.iter().filter(|id| **id != other).take(2).collect();
    for (i, id) in movers.iter().enumerate() {
        record(&mut store, &a, id, 2 + i as u64, HORIZON);
    }
    let r = route_prefix(&t, "m", &b, &store, 5, HORIZON).unwrap();
    assert_eq!(r.matched_blocks, 0);
    let past = b.key_past(8).unwrap();
    assert_eq!(r.key, past);
    assert_eq!(r.primary.id, rendezvous(&t, past));
}

#[test]
fn a_prompt_mostly_made_of_a_common_system_prompt_goes_to_a_pod_holding_it() {
    // a system prompt of two shards sent to three pods: it is common, so a new conversation
    // is keyed on its first shard past it; one that brings fewer blocks than the system
    // prompt's is placed by that key among the three holders, and so they share them
    let t = table(8, Some(1.25));
    let system = prompt(4_096, 0, 0);
    let mut store = MemoryStore::new(DEFAULT_SLOTS);
    let holders: Vec<String> = t
        .pods
        .iter()
        .skip(2)
        .take(3)
        .map(|p| p.id.clone())
        .collect();
    for (i, id) in holders.iter().enumerate() {
        record(&mut store, &system, id, i as u64, HORIZON);
    }
    let mut spread = std::collections::BTreeSet::new();
    for conv in 1..60 {
        let b = prompt(4_096, conv, 3_000);
        let r = route_prefix(&t, "m", &b, &store, 10, HORIZON).unwrap();
        assert_eq!(r.matched_blocks, 0);
        let past = b.key_past(16).unwrap();
        assert_ne!(past, b.first_shard_key().unwrap());
        assert_eq!(r.key, past);
        assert!(holders.contains(&r.primary.id), "{}", r.primary.id);
        spread.insert(r.primary.id.clone());
    }
    assert_eq!(spread.len(), 3, "{spread:?}");
    // a holder over the load cap is left out; none under it: the whole fleet, as for new content
    let mut busy = t.clone();
    busy.pods[2].load = Some(0.9);
    for conv in 1..30 {
        let b = prompt(4_096, conv, 3_000);
        let r = route_prefix(&busy, "m", &b, &store, 10, HORIZON).unwrap();
        assert!(holders[1..].contains(&r.primary.id), "{}", r.primary.id);
    }
    for p in busy.pods.iter_mut().skip(2).take(3) {
        p.load = Some(0.9);
    }
    let b = prompt(4_096, 7, 3_000);
    let r = route_prefix(&busy, "m", &b, &store, 10, HORIZON).unwrap();
    let past = b.key_past(16).unwrap();
    assert_eq!(
        r.primary.id,
        place_among(
            &busy.pods.iter().collect::<Vec<_>>(),
            past,
            busy.load_factor
        )
        .map(|i| busy.pods[i].id.clone())
        .unwrap()
    );
    // with the system prompt on one pod only, it is not common: they all go to that pod
    let mut single = MemoryStore::new(DEFAULT_SLOTS);
    record(&mut single, &system, &t.pods[5].id, 0, HORIZON);
    for conv in 1..20 {
        let r = route_prefix(&t, "m", &prompt(4_096, conv, 3_000), &single, 1, HORIZON).unwrap();
        assert_eq!(r.primary.id, t.pods[5].id);
    }
}

#[test]
fn a_prompt_bringing_more_than_a_common_system_prompt_is_placed_over_the_fleet() {
    // new content past a common system prompt fills the fleet's caches evenly: conversations
    // that bring more blocks than they share are placed by their own shards over every pod
    let t = table(8, None);
    let system = prompt(4_096, 0, 0);
    let mut store = MemoryStore::new(DEFAULT_SLOTS);
    for (i, p) in t.pods.iter().take(3).enumerate() {
        record(&mut store, &system, &p.id, i as u64, HORIZON);
    }
    let mut spread = std::collections::BTreeSet::new();
    for conv in 1..60 {
        let b = prompt(4_096, conv, 6_000);
        let r = route_prefix(&t, "m", &b, &store, 10, HORIZON).unwrap();
        let past = b.key_past(16).unwrap();
        assert_eq!((r.key, r.matched_blocks), (past, 0));
        assert_eq!(r.primary.id, rendezvous(&t, past));
        spread.insert(r.primary.id.clone());
    }
    assert!(spread.len() >= 6, "{spread:?}");
}

#[test]
fn a_busy_holder_passes_its_conversation_to_the_other_pod_holding_it() {
    // a conversation served on two pods (moved once): when the pod it went to last is over
    // the cap, the other pod that has it takes it, not the pod its key would place it on
    let mut t = table(6, Some(1.25));
    let first = prompt(0, 1, 3_000);
    let next = prompt(0, 1, 3_900);
    let (placed, _) = rendezvous_and_other(&t, &next);
    let others: Vec<String> = t
        .pods
        .iter()
        .map(|p| p.id.clone())
        .filter(|id| *id != placed)
        .collect();
    let mut store = MemoryStore::new(DEFAULT_SLOTS);
    record(&mut store, &first, &others[0], 0, HORIZON);
    record(&mut store, &first, &others[1], 1, HORIZON);
    let r = route_prefix(&t, "m", &next, &store, 2, HORIZON).unwrap();
    assert_eq!(
        (r.primary.id.as_str(), r.matched_blocks),
        (others[1].as_str(), 11)
    );
    for p in &mut t.pods {
        if p.id == others[1] {
            p.load = Some(0.9);
        }
    }
    let r = route_prefix(&t, "m", &next, &store, 2, HORIZON).unwrap();
    assert_eq!(
        (r.primary.id.as_str(), r.matched_blocks),
        (others[0].as_str(), 11)
    );
    // once the earlier holder's write is older than the horizon, it no longer counts
    record(&mut store, &first, &others[1], HORIZON, HORIZON);
    let r = route_prefix(&t, "m", &next, &store, HORIZON + 1, HORIZON).unwrap();
    assert_ne!(r.primary.id, others[0]);
}

#[test]
fn an_entry_names_the_pods_it_was_sent_to_most_recent_first() {
    let keys = prompt(1_024, 0, 0);
    let mut store = MemoryStore::new(DEFAULT_SLOTS);
    let named = |store: &MemoryStore, now: u64| -> Vec<u64> {
        let (found, _) = longest_match(store, &keys);
        found
            .map(|m| m.entry.holders(now, HORIZON).collect())
            .unwrap_or_default()
    };
    let h = |i: usize| pod_hash(&format!("pod-{i}"));
    record(&mut store, &keys, "pod-0", 0, HORIZON);
    record(&mut store, &keys, "pod-1", 10, HORIZON);
    record(&mut store, &keys, "pod-2", 20, HORIZON);
    record(&mut store, &keys, "pod-0", 30, HORIZON);
    assert_eq!(named(&store, 30), [h(0), h(2), h(1)]);
    // at most HOLDERS: the least recent goes
    for (i, now) in [(3, 40), (4, 50)] {
        record(&mut store, &keys, &format!("pod-{i}"), now, HORIZON);
    }
    assert_eq!(named(&store, 50), [h(4), h(3), h(0), h(2)]);
    assert_eq!(HOLDERS, 4);
    // each holder ages on its own: pod-2's last write (20) is older than the horizon at
    // 20 + HORIZON
    assert_eq!(named(&store, 20 + HORIZON), [h(4), h(3), h(0)]);
    // a seed puts the warmed pod first and keeps the others
    let placed = crate::wire::PlacedPrefix {
        pod: "pod-9".into(),
        keys: keys.placed().into_iter().map(crate::BlockHash).collect(),
    };
    seed(&mut store, &[placed], 60, HORIZON);
    assert_eq!(named(&store, 60), [h(9), h(4), h(3), h(0)]);
}

#[test]
fn an_entry_counts_the_pods_it_moved_to_while_fresh() {
    let keys = prompt(1_024, 0, 0);
    let mut store = MemoryStore::new(DEFAULT_SLOTS);
    let moves = |store: &MemoryStore| longest_match(store, &keys).0.map(|m| m.entry.moves);
    record(&mut store, &keys, "pod-0", 0, HORIZON);
    record(&mut store, &keys, "pod-0", 10, HORIZON);
    assert_eq!(moves(&store), Some(0));
    record(&mut store, &keys, "pod-1", 20, HORIZON);
    record(&mut store, &keys, "pod-2", 30, HORIZON);
    assert_eq!(moves(&store), Some(2));
    // stale: a new write starts over
    record(&mut store, &keys, "pod-3", 30 + HORIZON, HORIZON);
    assert_eq!(moves(&store), Some(0));
    // a prompt sent back to a pod that still holds it is not a move: two pods trading a
    // prefix do not make it common
    let mut bounced = MemoryStore::new(DEFAULT_SLOTS);
    for (i, pod) in ["pod-0", "pod-1", "pod-0", "pod-1", "pod-0"]
        .iter()
        .enumerate()
    {
        record(&mut bounced, &keys, pod, i as u64, HORIZON);
    }
    assert_eq!(moves(&bounced), Some(1));
    record(&mut bounced, &keys, "pod-2", 9, HORIZON);
    assert_eq!(moves(&bounced), Some(2));
}

/// A memory store that counts writes.
#[derive(Debug)]
struct Counting(MemoryStore, u32);

impl PrefixStore for Counting {
    fn slots(&self) -> u32 {
        self.0.slots()
    }
    fn read(&self, slot: u32) -> Option<Vec<u8>> {
        self.0.read(slot)
    }
    fn write(&mut self, slot: u32, entry: &[u8; ENTRY_BYTES]) -> bool {
        self.1 += 1;
        self.0.write(slot, entry)
    }
}

#[test]
fn an_unchanged_entry_is_rewritten_only_when_it_ages() {
    let keys = prompt(0, 1, 3_000);
    let n = keys.written().len() as u32;
    let mut store = Counting(MemoryStore::new(DEFAULT_SLOTS), 0);
    record(&mut store, &keys, "pod-0", 0, HORIZON);
    assert_eq!(store.1, n);
    record(
        &mut store,
        &keys,
        "pod-0",
        HORIZON / REFRESH_FRACTION - 1,
        HORIZON,
    );
    assert_eq!(store.1, n, "a repeat on the same pod writes nothing");
    record(
        &mut store,
        &keys,
        "pod-1",
        HORIZON / REFRESH_FRACTION - 1,
        HORIZON,
    );
    assert_eq!(store.1, 2 * n, "another pod rewrites");
    record(
        &mut store,
        &keys,
        "pod-1",
        2 * (HORIZON / REFRESH_FRACTION),
        HORIZON,
    );
    assert_eq!(store.1, 3 * n, "an aged entry is refreshed");
}

/// A store of arbitrary bytes in arbitrary slots.
#[derive(Debug)]
struct Junk {
    slots: u32,
    bytes: Vec<Vec<u8>>,
}

impl PrefixStore for Junk {
    fn slots(&self) -> u32 {
        self.slots
    }
    fn read(&self, slot: u32) -> Option<Vec<u8>> {
        self.bytes
            .get(slot as usize % self.bytes.len().max(1))
            .cloned()
    }
    fn write(&mut self, _slot: u32, _entry: &[u8; ENTRY_BYTES]) -> bool {
        false
    }
}

proptest! {
    #[test]
    fn never_panics_on_arbitrary_input(
        slots in any::<u32>(),
        bytes in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..=ENTRY_BYTES + 2), 0..8),
        text in proptest::collection::vec(any::<u8>(), 0..6_000),
        loads in proptest::collection::vec(any::<f64>(), 0..6),
        factor in proptest::option::of(any::<f64>()),
        now in any::<u64>(),
        horizon in any::<u64>(),
    ) {
        let mut store = Junk { slots, bytes };
        let keys = PromptKeys::of(&BlockChain::of("m", &text, &fp()), &fp());
        let mut t = table(loads.len(), factor);
        for (p, l) in t.pods.iter_mut().zip(&loads) {
            p.load = Some(*l);
        }
        let _ = route_prefix(&t, "m", &keys, &store, now, horizon);
        prop_assert_eq!(record(&mut store, &keys, "p", now, horizon), keys.written().len() as u64);
        let _ = eviction_horizon_ms(now, factor.unwrap_or(0.0));
    }

    /// Entries of the prompt's own keys with any holders, times, flags and moves, and any
    /// loads, waits and price: routing neither panics nor leaves the pool, and recording
    /// after it neither.
    #[test]
    fn any_entry_of_the_prompts_keys_routes_within_the_pool(
        text in proptest::collection::vec(any::<u8>(), 256..20_000),
        heads in proptest::collection::vec((0u8..6, any::<u64>(), any::<u8>()), 1..8),
        earlier in proptest::collection::vec((0u8..6, any::<u64>()), 0..4),
        loads in proptest::collection::vec((any::<f64>(), proptest::option::of(any::<u64>())), 1..6),
        price in proptest::option::of(any::<f64>()),
        now in any::<u64>(),
        horizon in any::<u64>(),
    ) {
        let keys = PromptKeys::of(&BlockChain::of("m", &text, &fp()), &fp());
        let mut t = table(loads.len(), Some(1.25));
        t.prefill_us_per_token = price;
        for (p, (load, wait)) in t.pods.iter_mut().zip(&loads) {
            p.load = Some(*load);
            p.wait_ms = *wait;
        }
        let pod = |i: u8| pod_hash(&format!("pod-{i}"));
        let mut store = MemoryStore::new(DEFAULT_SLOTS);
        for (key, (head, at, flags)) in keys.written().into_iter().zip(heads.iter().cycle()) {
            let mut entry = PrefixEntry {
                shard: key,
                pod: pod(*head),
                at_ms: *at,
                interior: flags & 1 == 1,
                moves: flags >> 1,
                earlier: [Holder::default(); HOLDERS - 1],
            };
            for (h, (i, at)) in entry.earlier.iter_mut().zip(&earlier) {
                *h = Holder { pod: pod(*i), at_ms: *at };
            }
            store.write(slot_of(key, store.slots()), &entry.encode());
        }
        let r = route_prefix(&t, "m", &keys, &store, now, horizon).unwrap();
        prop_assert!(t.pods.iter().any(|p| p.id == r.primary.id));
        let id = r.primary.id.clone();
        record(&mut store, &keys, &id, now, horizon);
    }

    /// Any routed prompt's repeat goes to the same pod while its load is under the cap.
    #[test]
    fn a_repeat_goes_where_its_prompt_went(conv in any::<u32>(), own in 64usize..20_000) {
        let t = table(6, Some(1.25));
        let mut store = MemoryStore::new(DEFAULT_SLOTS);
        let keys = prompt(1_024, conv, own);
        let first = route(&t, &mut store, &keys, 0);
        let again = route_prefix(&t, "m", &keys, &store, 1, HORIZON).unwrap();
        // (a slot collision among the prompt's own keys can hide its deepest one: then the
        // first-shard fallback places it, where it went the first time too)
        prop_assert_eq!(again.primary.id.clone(), first);
    }
}

#[test]
fn a_seeded_prefix_takes_its_branches_to_the_warmed_pod() {
    // a template served on one pod; the gateway warmed it on another and seeds the index
    let t = table(4, None);
    let template = prompt(2_048, 0, 0);
    let a = prompt(2_048, 1, 1_000);
    let (_, old) = rendezvous_and_other(&t, &a);
    let warmed = t.pods.iter().find(|p| p.id != old).unwrap().id.clone();
    let mut store = MemoryStore::new(DEFAULT_SLOTS);
    record(&mut store, &a, &old, 0, HORIZON);
    let b = prompt(2_048, 2, 1_000);
    assert_eq!(
        route_prefix(&t, "m", &b, &store, 1, HORIZON)
            .unwrap()
            .primary
            .id,
        old
    );
    let placed = [crate::wire::PlacedPrefix {
        keys: template
            .placed()
            .into_iter()
            .map(crate::BlockHash)
            .collect(),
        pod: warmed.clone(),
    }];
    assert_eq!(seed(&mut store, &placed, 2, HORIZON), 0);
    let r = route_prefix(&t, "m", &b, &store, 3, HORIZON).unwrap();
    assert_eq!(r.primary.id, warmed);
    assert!(r.matched_blocks >= 8);
    // the seed is not a move: the prefix does not become common by being placed
    let (found, _) = longest_match(&store, &b);
    assert_eq!(found.map(|m| m.entry.moves), Some(0));
}

#[test]
fn an_unchanged_seed_costs_no_write() {
    let template = prompt(2_048, 0, 0);
    let placed = [crate::wire::PlacedPrefix {
        keys: vec![crate::BlockHash(template.key().unwrap())],
        pod: "pod-1".into(),
    }];
    let mut store = Counting(MemoryStore::new(DEFAULT_SLOTS), 0);
    seed(&mut store, &placed, 0, HORIZON);
    seed(&mut store, &placed, 10, HORIZON);
    assert_eq!(store.1, 1);
    // older than the refresh interval: rewritten, so it stays fresh
    seed(&mut store, &placed, HORIZON / REFRESH_FRACTION + 1, HORIZON);
    assert_eq!(store.1, 2);
}

#[test]
fn a_short_prompt_goes_to_a_holder_of_its_adapter_and_otherwise_unrouted() {
    let mut t = table(4, Some(1.25));
    t.pods[1].adapters = vec!["lora".into()];
    t.pods[3].adapters = vec!["lora".into()];
    let short = PromptKeys::of(&BlockChain::of("lora", b"hi", &fp()), &fp());
    assert!(short.key().is_none());
    let store = MemoryStore::new(64);
    let r = route_prefix(&t, "lora", &short, &store, 0, HORIZON).unwrap();
    assert!(["pod-1", "pod-3"].contains(&r.primary.id.as_str()));
    assert_eq!((r.matched_blocks, r.reads), (0, 0));
    // Resident holders first: the other holder once only it has the adapter in a slot.
    let other = if r.primary.id == "pod-1" { 3 } else { 1 };
    t.pods[other].resident = vec!["lora".into()];
    let r = route_prefix(&t, "lora", &short, &store, 0, HORIZON).unwrap();
    assert_eq!(r.primary.id, t.pods[other].id);
    // The base model, and an adapter no pod lists, are left to the proxy.
    assert!(route_prefix(&t, "m", &short, &store, 0, HORIZON).is_none());
    assert!(route_prefix(&t, "other-lora", &short, &store, 0, HORIZON).is_none());
}

#[test]
fn residency_steers_only_short_prompts() {
    let mut t = table(4, Some(1.25));
    for p in &mut t.pods {
        p.adapters = vec!["lora".into()];
    }
    let keys = |own: usize| {
        let text: Vec<u8> = b"conversation 1 "
            .iter()
            .copied()
            .cycle()
            .take(own)
            .collect();
        PromptKeys::of(&BlockChain::of("lora", &text, &fp()), &fp())
    };
    let mut store = MemoryStore::new(1 << 12);
    let fresh = PromptKeys::of(&BlockChain::of("lora", &[b'q'; 4000], &fp()), &fp());
    let before = route_prefix(&t, "lora", &fresh, &store, 0, HORIZON)
        .unwrap()
        .primary
        .id
        .clone();
    let id = route_prefix(&t, "lora", &keys(4000), &store, 0, HORIZON)
        .unwrap()
        .primary
        .id
        .clone();
    record(&mut store, &keys(4000), &id, 0, HORIZON);
    // Only pods other than those two have the adapter in a slot now.
    for p in &mut t.pods {
        if p.id != id && p.id != before {
            p.resident = vec!["lora".into()];
        }
    }
    let next = route_prefix(&t, "lora", &keys(6000), &store, 1, HORIZON).unwrap();
    assert_eq!(next.primary.id, id, "a conversation keeps its pod");
    assert!(next.matched_blocks > 0);
    let again = route_prefix(&t, "lora", &fresh, &store, 1, HORIZON).unwrap();
    assert_eq!(again.primary.id, before, "a new prompt keeps its placement");
    let short = PromptKeys::of(&BlockChain::of("lora", b"hi", &fp()), &fp());
    let r = route_prefix(&t, "lora", &short, &store, 1, HORIZON).unwrap();
    assert!(r.primary.resident.iter().any(|a| a == "lora"));
}
