//! The prompt index at pool scale: IVF-PQ over 100,000 synthetic 384-d sentence-embedding-like
//! unit vectors (`embeddings::synthetic`) with the gateway's defaults (⌈√n⌉ lists, 48 subspaces
//! of 256 centroids, probe 8, 4 × k re-ranked). Prints build time, recall@10 against exact
//! search (with and without re-ranking), query time of both, and the index's bytes against flat
//! f32. `cargo bench -p prewarm-gateway --bench prompt_index` (`PROMPT_INDEX_N` changes n).

use std::time::Instant;

use prewarm_gateway::embeddings::ivf_pq::{exact, IvfPq, IvfPqParams};
use prewarm_gateway::embeddings::kmeans::squared_distance;
use prewarm_gateway::embeddings::search::RERANK;
use prewarm_gateway::embeddings::synthetic::topic_vectors;

const DIM: usize = 384;
const QUERIES: usize = 100;
const K: usize = 10;

fn main() {
    let n: usize = std::env::var("PROMPT_INDEX_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let vectors = topic_vectors(n, DIM, 7, 1);
    let queries = topic_vectors(QUERIES, DIM, 7, 2);
    let params = IvfPqParams::default();
    let started = Instant::now();
    let index = IvfPq::build(&vectors, DIM, params).expect("index");
    let build_s = started.elapsed().as_secs_f64();

    let mut exact_s = 0.0;
    let mut pq_s = 0.0;
    let mut reranked_s = 0.0;
    let (mut pq_hits, mut reranked_hits) = (0usize, 0usize);
    for q in queries.chunks_exact(DIM) {
        let t = Instant::now();
        let want: Vec<u32> = exact(&vectors, DIM, q, K)
            .into_iter()
            .map(|h| h.0)
            .collect();
        exact_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let pq = index.search(q, K, None);
        pq_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let reranked = index.search_reranked(q, K, None, RERANK, |id| {
            let i = id as usize;
            vectors
                .get(i * DIM..(i + 1) * DIM)
                .map(|v| squared_distance(v, q))
        });
        reranked_s += t.elapsed().as_secs_f64();
        pq_hits += pq.iter().filter(|h| want.contains(&h.0)).count();
        reranked_hits += reranked.iter().filter(|h| want.contains(&h.0)).count();
    }
    let flat = vectors.len() * 4;
    let per_query = |s: f64| s / QUERIES as f64 * 1e3;
    println!(
        "prompt index: {n} x {DIM}-d, {} lists, {} subspaces x {} centroids, probe {}",
        index.params().lists,
        params.subspaces,
        params.codebook,
        params.probe
    );
    println!("  build                {build_s:.1} s");
    println!(
        "  recall@{K} re-ranked   {:.3} ({RERANK} x {K} candidates)",
        reranked_hits as f64 / (QUERIES * K) as f64
    );
    println!(
        "  recall@{K} PQ only     {:.3}",
        pq_hits as f64 / (QUERIES * K) as f64
    );
    println!(
        "  query: exact {:.2} ms, PQ {:.2} ms, re-ranked {:.2} ms",
        per_query(exact_s),
        per_query(pq_s),
        per_query(reranked_s)
    );
    println!(
        "  index bytes          {} ({:.3} of flat f32 {flat})",
        index.bytes(),
        index.bytes() as f64 / flat as f64
    );
}
