//! Stability vectors: fingerprints, sketches and placement choices of fixed inputs, committed as
//! constants. The filter (wasm32) and the gateway (x86_64) must compute exactly these; `make
//! test` runs this file natively, on wasm32-wasip1 (wasmtime) and on wasm32-unknown-unknown
//! (Node, through wasm-bindgen-test). If a change here is ever needed, it is a
//! wire-breaking change: bump the wire major version.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

use prewarm_core::canonical_prompt;
use prewarm_core::fingerprint::{chain_seed, BlockChain, BlockHash, FingerprintConfig};
use prewarm_core::placement::{place, rank, PlacementCandidate};
use prewarm_core::request::{parse_request, Endpoint};
use prewarm_core::similarity::Sketch;

fn chat_chain() -> BlockChain {
    let mut system = String::new();
    for i in 0..40 {
        system.push_str(&format!("Rule {i}: answer with valid SQL for the schema. "));
    }
    let body = serde_json::json!({
        "model": "sql-lora",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "How many orders shipped in March? ünïcödé ✓"}
        ]
    });
    let req = parse_request(
        Endpoint::ChatCompletions,
        body.to_string().as_bytes(),
        1 << 20,
    )
    .unwrap();
    BlockChain::of(
        &req.model,
        canonical_prompt(&req).as_bytes(),
        &FingerprintConfig::default(),
    )
}

fn hex(blocks: &[BlockHash]) -> Vec<String> {
    blocks.iter().map(|b| b.to_hex()).collect()
}

#[test]
fn seed_vector() {
    assert_eq!(format!("{:016x}", chain_seed("sql-lora")), SEED_SQL_LORA);
    assert_eq!(format!("{:016x}", chain_seed("")), SEED_EMPTY);
}

#[test]
fn chat_fingerprint_vector() {
    let chain = chat_chain();
    assert_eq!(chain.prompt_tokens, CHAT_PROMPT_TOKENS);
    assert_eq!(hex(&chain.blocks), CHAT_BLOCKS);
}

#[test]
fn completion_fingerprint_vector() {
    let text: String = (0..300).map(|i| format!("w{i} ")).collect();
    let cfg = FingerprintConfig {
        block_tokens: 16,
        max_prefix_tokens: 32_768,
    };
    let chain = BlockChain::of("meta-llama/Llama-3.1-8B-Instruct", text.as_bytes(), &cfg);
    assert_eq!(hex(&chain.blocks), COMPLETION_BLOCKS_16);
}

#[test]
fn sketch_vector() {
    let s = Sketch::of(
        "the quick brown fox jumps over the lazy dog and keeps on running far away",
        4,
    );
    let got: Vec<String> = s.hashes().iter().map(|h| format!("{h:016x}")).collect();
    assert_eq!(got, SKETCH_4);
}

#[test]
fn placement_vector() {
    let ids: Vec<String> = (0..5).map(|i| format!("vllm-{i}.pool:8000")).collect();
    let mut cands: Vec<PlacementCandidate<'_>> = ids
        .iter()
        .map(|id| PlacementCandidate::new(id, 1.0))
        .collect();
    cands[2].weight = 2.5;
    let choices: Vec<usize> = (0..24u64)
        .map(|k| place(k.wrapping_mul(0x9E37_79B9_7F4A_7C15), &cands).unwrap())
        .collect();
    assert_eq!(choices, PLACEMENT_24);
    let chain = chat_chain();
    let key = chain.routing_key(&FingerprintConfig::default()).unwrap();
    assert_eq!(rank(key.0, &cands), CHAT_RANK);
}

const SEED_SQL_LORA: &str = "b00dd0b8278780ad";
const SEED_EMPTY: &str = "1963607d616b2198";
const CHAT_PROMPT_TOKENS: usize = 486;
const CHAT_BLOCKS: &[&str] = &[
    "1685f84a766368a2",
    "f4adbe870384264d",
    "c0568bb96b25a71c",
    "2ba1c94131bb49b9",
    "7e611fef91c604a0",
    "c40298deba073b4c",
    "4b1d225b66937a03",
];
const COMPLETION_BLOCKS_16: &[&str] = &[
    "315d4617eb33ef19",
    "64de12b526315f5a",
    "71c5f6c809110ffc",
    "66fe0ddea650519e",
    "6092588702365520",
    "4d346120661ef938",
    "ec3f9b76bbb9cc44",
    "c8de05e0e09e4399",
    "76c8514ccff639de",
    "70b894db47bed81f",
    "3898bea486a63370",
    "fc23508a275d2883",
    "074993d1f60e2b2a",
    "35fb8314db451e7b",
    "d45144ca20ee427b",
    "c97c13d749c735ea",
    "186eb5db6d667c42",
    "f7973231bef1bc99",
    "d9186ffb852ffa7d",
    "405d9e8458d977cb",
    "dc09ba18bf7c5159",
];
const SKETCH_4: &[&str] = &[
    "00efa749a36edec3",
    "183c566c04c52b42",
    "1e0f0c54a951a786",
    "20f406cdc0c646a7",
];
const PLACEMENT_24: &[usize] = &[
    1, 0, 0, 4, 4, 3, 1, 0, 0, 2, 2, 2, 2, 2, 2, 2, 1, 3, 2, 2, 2, 0, 3, 0,
];
const CHAT_RANK: &[usize] = &[0, 2, 4, 1, 3];
