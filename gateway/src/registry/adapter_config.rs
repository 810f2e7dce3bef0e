//! Reading PEFT's `adapter_config.json` (`r`, `lora_alpha`, `target_modules`) from a local
//! adapter directory, so registration can fill in what the operator did not say.

use std::path::Path;

use serde::Deserialize;

/// What `adapter_config.json` says about an adapter.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct PeftConfig {
    #[serde(default)]
    pub r: Option<u32>,
    #[serde(default)]
    pub lora_alpha: Option<f64>,
    #[serde(default)]
    pub target_modules: Option<TargetModules>,
}

/// PEFT writes `target_modules` as a list or as one regex string.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum TargetModules {
    List(Vec<String>),
    One(String),
}

impl TargetModules {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::List(v) => v,
            Self::One(s) => vec![s],
        }
    }
}

/// Largest `adapter_config.json` read, bytes.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// `Ok(None)` when the directory has no `adapter_config.json`; `Err` names the problem when it
/// has an unreadable one.
pub fn read_peft_config(dir: &Path) -> Result<Option<PeftConfig>, String> {
    let path = dir.join("adapter_config.json");
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(format!(
            "{}: larger than {MAX_CONFIG_BYTES} bytes",
            path.display()
        ));
    }
    let text = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rank_alpha_and_modules() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_peft_config(dir.path()).unwrap(), None);
        std::fs::write(
            dir.path().join("adapter_config.json"),
            br#"{"r": 16, "lora_alpha": 32, "target_modules": ["q_proj","v_proj"], "peft_type": "LORA"}"#,
        )
        .unwrap();
        let c = read_peft_config(dir.path()).unwrap().unwrap();
        assert_eq!(c.r, Some(16));
        assert_eq!(c.lora_alpha, Some(32.0));
        assert_eq!(c.target_modules.unwrap().into_vec(), ["q_proj", "v_proj"]);
        std::fs::write(dir.path().join("adapter_config.json"), b"{bad").unwrap();
        assert!(read_peft_config(dir.path()).is_err());
    }
}
