use super::*;
use crate::embeddings::kmeans::squared_distance;
use crate::embeddings::synthetic::topic_vectors;

/// Mean share of the exact top-`k` found in the index's top-`k` (re-ranked from `rerank × k`
/// candidates; 0 = PQ distances alone), over `queries`.
pub(crate) fn recall_at(
    index: &IvfPq,
    vectors: &[f32],
    dim: usize,
    queries: &[f32],
    k: usize,
    rerank: usize,
) -> f64 {
    let mut sum = 0.0;
    let mut count = 0;
    for q in queries.chunks_exact(dim) {
        let want: Vec<u32> = exact(vectors, dim, q, k)
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        let found = if rerank == 0 {
            index.search(q, k, None)
        } else {
            index.search_reranked(q, k, None, rerank, |id| {
                let i = id as usize;
                vectors
                    .get(i * dim..(i + 1) * dim)
                    .map(|v| squared_distance(v, q))
            })
        };
        let got: Vec<u32> = found.into_iter().map(|(i, _)| i).collect();
        sum += want.iter().filter(|i| got.contains(i)).count() as f64 / k as f64;
        count += 1;
    }
    sum / f64::from(count)
}

#[test]
fn recall_at_10_against_exact_search_on_topic_data() {
    let dim = 384;
    // Small enough for a debug build (training is O(n × codebook × dim) per iteration);
    // `cargo bench -p prewarm-gateway --bench prompt_index` measures 100,000 vectors.
    let vectors = topic_vectors(1000, dim, 7, 1);
    let queries = topic_vectors(40, dim, 7, 2);
    let params = IvfPqParams {
        codebook: 32,
        iterations: 4,
        ..IvfPqParams::default()
    };
    let index = IvfPq::build(&vectors, dim, params).unwrap();
    assert_eq!(index.len(), 1000);
    let pq_only = recall_at(&index, &vectors, dim, &queries, 10, 0);
    let recall = recall_at(&index, &vectors, dim, &queries, 10, 4);
    let flat = vectors.len() * 4;
    println!(
        "IVF-PQ recall@10 = {recall:.3} re-ranking 40 candidates, {pq_only:.3} on PQ distances alone, over 1,000 × 384-d ({} lists, {} subspaces of {} centroids, probe {}); {} bytes vs {flat} flat ({:.3})",
        index.params().lists,
        params.subspaces,
        params.codebook,
        params.probe,
        index.bytes(),
        index.bytes() as f64 / flat as f64
    );
    assert!(recall >= 0.95, "recall@10 {recall}");
    assert!(index.bytes() * 8 <= flat, "{} bytes", index.bytes());
}

#[test]
fn a_vector_finds_itself_first_and_build_is_deterministic() {
    let dim = 16;
    let vectors = topic_vectors(300, dim, 5, 3);
    let params = IvfPqParams {
        subspaces: 8,
        ..IvfPqParams::default()
    };
    let a = IvfPq::build(&vectors, dim, params).unwrap();
    let b = IvfPq::build(&vectors, dim, params).unwrap();
    for i in [0usize, 17, 299] {
        let q = &vectors[i * dim..(i + 1) * dim];
        let hits = a.search(q, 3, Some(a.params().lists));
        assert_eq!(hits.first().map(|h| h.0), Some(i as u32), "{hits:?}");
        assert_eq!(hits, b.search(q, 3, Some(b.params().lists)));
    }
}

#[test]
fn bad_shapes_are_refused_and_odd_queries_find_nothing() {
    let p = IvfPqParams::default();
    assert!(matches!(
        IvfPq::build(&[0.0; 10], 10, p),
        Err(IndexError::Subspaces { .. })
    ));
    let p = IvfPqParams { subspaces: 2, ..p };
    assert!(matches!(
        IvfPq::build(&[0.0; 5], 4, p),
        Err(IndexError::Ragged { .. })
    ));
    let empty = IvfPq::build(&[], 4, p).unwrap();
    assert!(empty.is_empty());
    assert!(empty.search(&[0.0; 4], 3, None).is_empty());
    let one = IvfPq::build(&[1.0, 0.0, 0.0, 0.0], 4, p).unwrap();
    assert!(one.search(&[1.0, 0.0], 3, None).is_empty());
    assert_eq!(one.search(&[1.0, 0.0, 0.0, 0.0], 0, None), vec![]);
    assert_eq!(one.search(&[1.0, 0.0, 0.0, 0.0], 5, None).len(), 1);
}
