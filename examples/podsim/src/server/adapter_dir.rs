//! Reading an adapter directory as vLLM does before registering it: the path must exist and
//! hold `adapter_config.json` (PEFT format); its `r` is the LoRA rank.

use serde::Deserialize;

/// Largest `adapter_config.json` read.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// PEFT's default rank when `r` is absent.
const DEFAULT_RANK: u32 = 8;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterDirError {
    /// No directory or no `adapter_config.json` in it (vLLM: "No adapter found").
    #[error("no adapter found at {path}")]
    Missing { path: String },
    #[error("{path}/adapter_config.json: {reason}")]
    BadConfig { path: String, reason: String },
}

#[derive(Deserialize)]
struct PeftConfig {
    #[serde(default)]
    r: Option<u32>,
}

/// The rank of the adapter in directory `path`.
pub async fn read_adapter_rank(path: &str) -> Result<u32, AdapterDirError> {
    let file = std::path::Path::new(path).join("adapter_config.json");
    let missing = || AdapterDirError::Missing {
        path: path.to_string(),
    };
    let meta = tokio::fs::metadata(&file).await.map_err(|_| missing())?;
    if !meta.is_file() {
        return Err(missing());
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(AdapterDirError::BadConfig {
            path: path.to_string(),
            reason: format!(
                "{} bytes exceeds the limit of {MAX_CONFIG_BYTES}",
                meta.len()
            ),
        });
    }
    let bytes = tokio::fs::read(&file).await.map_err(|_| missing())?;
    let config: PeftConfig =
        serde_json::from_slice(&bytes).map_err(|e| AdapterDirError::BadConfig {
            path: path.to_string(),
            reason: e.to_string(),
        })?;
    Ok(config.r.unwrap_or(DEFAULT_RANK))
}
