//! Prompt embeddings in the gateway: all-MiniLM-L6-v2 run in process ([`minilm`]), the pool's
//! prompt vectors in an IVF-PQ index ([`ivf_pq`], over [`kmeans`]), what the API reads of them
//! (nearest prompts, semantic groups: [`search`]). The loop that follows the pool is the shell's
//! (`service::refresh_embeddings`), the `[embeddings]` configuration is `config::embeddings`.
//! Off unless `embeddings.model_dir` is set; the gateway builds and runs without the model files.

pub mod ivf_pq;
pub mod kmeans;
pub mod minilm;
pub mod search;
pub mod synthetic;

pub use crate::config::embeddings::{EmbeddingsConfig, MODEL_FILES};
