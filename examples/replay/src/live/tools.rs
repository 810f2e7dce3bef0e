//! An application's tool definitions as OpenAI function tools (`prewarm-replay live --api chat`).
//!
//! A trace states an application's tools as `tool_blocks` blocks after its system prompt
//! ([`crate::trace::TraceRequest::tool_blocks`]). Each block is one function tool: its name
//! derived from the block id, its description the block's rendered text (so the bytes the
//! completion prompt would carry there reach the engine, rendered by its chat template), and a
//! small fixed parameters schema. Equal ids give byte-identical tools, so an application's
//! requests send an identical `tools` array. The request also carries `tool_choice: "none"`:
//! vLLM refuses tools under its default (`auto`) unless the server runs with automatic tool
//! choice, and renders them under `none` (SGLang renders none then; docs/workload.md).

use serde::Serialize;
use serde_json::{json, Value};

/// One function tool as the request body carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolDefinition {
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionSpec,
}

/// The function of a [`ToolDefinition`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FunctionSpec {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

impl ToolDefinition {
    /// The tool of trace block `id`, whose rendered text is `text`.
    pub fn of_block(id: u64, text: &str) -> Self {
        Self {
            kind: "function",
            function: FunctionSpec {
                name: format!("tool_{id:016x}"),
                description: text.to_string(),
                parameters: json!({
                    "type": "object",
                    "properties": {"query": {"type": "string"}},
                    "required": ["query"],
                }),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::block_text;

    #[test]
    fn a_block_is_one_function_tool_named_by_its_id_and_described_by_its_text() {
        let tool = ToolDefinition::of_block(0xA0, &block_text(0xA0));
        let body = serde_json::to_value(&tool).unwrap();
        assert_eq!(body["type"], "function");
        assert_eq!(body["function"]["name"], "tool_00000000000000a0");
        assert_eq!(body["function"]["description"], block_text(0xA0).as_str());
        assert_eq!(body["function"]["parameters"]["type"], "object");
        assert_eq!(tool, ToolDefinition::of_block(0xA0, &block_text(0xA0)));
    }
}
