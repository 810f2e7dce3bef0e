//! Memory per tracked prefix in the prompt pool, beyond its stored text: a counting global
//! allocator measures the heap the pool holds after ingesting N distinct prefill signals, less
//! the bytes of their texts. `cargo bench -p prewarm-gateway --bench pool_memory`.
//!
//! Prints the figure for several pool sizes, with and without the block hashes (8 bytes per
//! 64-token block of the prefix; 8 blocks here), since those grow with the prefix like the text.

// A global allocator is `unsafe impl` by definition; it only forwards to `System` and counts.
#![allow(unsafe_code, clippy::unwrap_used, clippy::indexing_slicing)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use prewarm_core::fingerprint::{BlockChain, FingerprintConfig};
use prewarm_core::request::Endpoint;
use prewarm_core::wire::{PatternState, PrefillSignal};
use prewarm_gateway::policy::{HotnessConfig, PromptPool};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const PREFIX_BYTES: usize = 2_048;

fn signal(i: usize, fp: &FingerprintConfig) -> PrefillSignal {
    let unit = format!("You are the assistant of tenant {i}. Answer politely and precisely. ");
    let text = unit.repeat(PREFIX_BYTES / unit.len() + 1)[..PREFIX_BYTES].to_string();
    let chain = BlockChain::of("llama-3-8b", text.as_bytes(), fp);
    PrefillSignal {
        model: "llama-3-8b".into(),
        tenant: Some(format!("tenant-{}", i % 100)),
        endpoint: Endpoint::ChatCompletions,
        prefix_tokens: chain.blocks.len() * 64,
        prefix: chain.blocks,
        prefix_text: text,
        state: PatternState::New,
        priority: (i % 100) as u8,
        keep_warm: true,
        shape: None,
    }
}

fn main() {
    let fp = FingerprintConfig::default();
    println!("pool_memory: heap held per tracked prefix beyond its text ({PREFIX_BYTES}-byte prefixes, 8 blocks)");
    println!(
        "{:>10} {:>14} {:>16} {:>22}",
        "prefixes", "heap MiB", "bytes/prefix", "bytes/prefix - hashes"
    );
    for n in [10_000usize, 50_000, 100_000] {
        // Everything allocated from here on and still live at the end is held by the pool: the
        // signals' texts and hashes move into it, the rest of the signals is freed.
        let before = LIVE.load(Ordering::Relaxed);
        let signals: Vec<PrefillSignal> = (0..n).map(|i| signal(i, &fp)).collect();
        let text_bytes: usize = signals.iter().map(|s| s.prefix_text.len()).sum();
        let hash_bytes: usize = signals.iter().map(|s| s.prefix.len() * 8).sum();
        let mut pool = PromptPool::new(
            HotnessConfig {
                max_entries: n,
                ..HotnessConfig::default()
            },
            0,
        );
        for s in signals {
            pool.apply_prefill(s, 0).unwrap();
        }
        let held = (LIVE.load(Ordering::Relaxed) - before) as usize;
        assert_eq!(pool.len(), n);
        let beyond = held.saturating_sub(text_bytes) as f64 / n as f64;
        let beyond_hashes = held.saturating_sub(text_bytes + hash_bytes) as f64 / n as f64;
        println!(
            "{n:>10} {:>14.1} {beyond:>16.1} {beyond_hashes:>22.1}",
            held as f64 / (1 << 20) as f64
        );
        drop(pool);
    }
    println!("goal: <= 256 bytes per tracked prefix beyond its text");
}
