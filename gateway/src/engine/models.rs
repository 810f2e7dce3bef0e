//! `GET /v1/models` decoding: the base model (a card whose `parent` is null) and the registered
//! adapters (cards with a `parent`), with the path each adapter was loaded from (`root`).
//!
//! This is what the pod *registered*, not what sits in a GPU slot: vLLM evicts silently from
//! both its slot LRU and its host-cache LRU, and neither shows here.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ServedModels {
    pub base: Option<String>,
    /// (adapter name, path) pairs.
    pub adapters: Vec<(String, String)>,
}

impl ServedModels {
    pub fn has_adapter(&self, name: &str) -> bool {
        self.adapters.iter().any(|(n, _)| n == name)
    }

    pub fn adapter_path(&self, name: &str) -> Option<&str> {
        self.adapters
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.as_str())
    }
}

#[derive(Deserialize)]
struct ModelList {
    data: Vec<Card>,
}

#[derive(Deserialize)]
struct Card {
    id: String,
    #[serde(default)]
    root: Option<String>,
    #[serde(default)]
    parent: Option<String>,
}

/// Decodes the list; SGLang names adapters `base:adapter` in some versions, which is cut back
/// to the adapter name.
pub fn parse_models(body: &[u8]) -> Result<ServedModels, String> {
    let list: ModelList = serde_json::from_slice(body).map_err(|e| format!("models: {e}"))?;
    let mut served = ServedModels::default();
    for card in list.data {
        match card.parent {
            None => {
                if served.base.is_none() {
                    served.base = Some(card.id);
                }
            }
            Some(parent) => {
                let name = card
                    .id
                    .strip_prefix(&format!("{parent}:"))
                    .map(str::to_string)
                    .unwrap_or(card.id);
                served.adapters.push((name, card.root.unwrap_or_default()));
            }
        }
    }
    Ok(served)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_and_adapters() {
        let body = br#"{"object":"list","data":[
          {"id":"base","object":"model","root":"/models/base","parent":null,"max_model_len":4096},
          {"id":"sql-lora","object":"model","root":"/adapters/sql","parent":"base","max_model_len":null}]}"#;
        let m = parse_models(body).unwrap();
        assert_eq!(m.base.as_deref(), Some("base"));
        assert_eq!(m.adapter_path("sql-lora"), Some("/adapters/sql"));
        assert!(parse_models(b"{}").is_err());
    }
}
