//! Chat requests as the engine sees them: the served model's chat template applied to
//! `messages`, `tools` and `chat_template_kwargs`, with vLLM's (or SGLang's) handling of
//! `add_generation_prompt`, `continue_final_message` and `cache_salt`. The rendered text is the
//! prompt podsim tokenizes (4 bytes a token) and hashes into KV blocks, so a chat request is
//! cached only by requests that render to the same leading bytes, as on a real engine.
//!
//! - [`template`]: where the template comes from, the transformers-like environment, rendering.
//! - [`messages`]: `messages` and `tools` reshaped as each engine hands them to the template.
//! - [`fields`]: the body fields read here, leniently parsed, and the cache salt's rules.
//! - [`render`]: the whole rendering of one request, flags included.
//! - [`pyjson`], [`strftime`]: the template functions transformers provides.

pub mod fields;
pub mod messages;
pub mod pyjson;
pub mod render;
pub mod strftime;
pub mod template;

pub use fields::{cache_salt, EngineFields};
pub use render::render_chat;
pub use template::{ChatTemplate, ContentFormat, ContentFormatArg};

/// Why a chat request (or its cache salt) was refused: every one is the client's (a 400).
/// Messages are the engine's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChatError {
    #[error("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")]
    BothGenerationFlags,
    /// The template did not compile, raised an exception, or failed while rendering.
    #[error("{0}")]
    Template(String),
    /// `continue_final_message` could not find the final message in the rendering.
    #[error("{0}")]
    ContinueFinalMessage(String),
    #[error("{field}: {rule}")]
    Field { field: &'static str, rule: String },
    #[error("messages.{index}: {rule}")]
    InvalidMessage { index: usize, rule: String },
    #[error("`tools` must not be an empty array. Either provide at least one tool or omit the field entirely. (parameter=tools)")]
    EmptyTools,
    #[error("Found unexpected chat template kwargs from request: {{{}}}", .0.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(", "))]
    UnexpectedKwargs(Vec<String>),
    #[error("{0}")]
    CacheSalt(String),
}
