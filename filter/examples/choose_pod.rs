//! `choose_pod TABLE.json PATH BODY_FILE`: prints the endpoint header the filter (default
//! configuration) sets for that request with that routing table (`primary,alternative,...`),
//! or `unrouted: <reason>`, for a proxy whose prefix index holds nothing for the prompt (its
//! first request: core's bounded-load rendezvous on the prompt's chain).
//! The end-to-end tests use it to know which upstream must receive a request: the answer comes
//! from the filter's own code and core's placement, not from a reimplementation.

use prewarm_core::prefix::{MemoryStore, PromptKeys};
use prewarm_core::wire::RoutingTable;
use prewarm_core::{canonical_prompt, parse_request, BlockChain};
use prewarm_filter::config::FilterConfig;
use prewarm_filter::routing::{choose_pod, PrefixLookup};

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let [_, table, path, body] = args.as_slice() else {
        return Err("usage: choose_pod TABLE.json PATH BODY_FILE".into());
    };
    let config = FilterConfig::default();
    let table = std::fs::read(table).map_err(|e| format!("{table}: {e}"))?;
    let table = RoutingTable::decode(&table).map_err(|e| e.to_string())?;
    let body = std::fs::read(body).map_err(|e| format!("{body}: {e}"))?;
    let endpoint = config
        .requests
        .endpoint_of(path)
        .ok_or_else(|| format!("{path}: not an inference path"))?;
    let request = parse_request(endpoint, &body, config.requests.max_body_bytes)
        .map_err(|e| e.to_string())?;
    let fingerprint = config.requests.fingerprint();
    let chain = BlockChain::of(
        &request.model,
        canonical_prompt(&request).as_bytes(),
        &fingerprint,
    );
    let alternatives = config.routing.endpoint_alternatives;
    let keys = PromptKeys::of(&chain, &fingerprint);
    let empty = MemoryStore::new(config.shared_data.prefix_slots);
    let lookup = PrefixLookup {
        store: &empty,
        keys: &keys,
        now_ms: 0,
        horizon_ms: config.shared_data.prefix_horizon_ms,
    };
    match choose_pod(
        Some(&table),
        &request.model,
        &fingerprint,
        &lookup,
        alternatives,
    ) {
        Ok(route) => println!("{}", route.header_value()),
        Err(why) => println!("unrouted: {why:?}"),
    }
    Ok(())
}
