//! What the pool keeps of an entry's traffic shape ([`WarmShape`]: chat message spans over the
//! canonical text, `tools`, `chat_template_kwargs`, `cache_salt`), and what of it may leave the
//! gateway's memory.
//!
//! The `cache_salt` is a client's secret: it reaches every warm call (vLLM mixes it into the
//! first block's hash, so a call without it fills blocks no request of the traffic looks up),
//! and nowhere else. [`SharedShape`] is shared by reference count between the pool and the warm
//! calls in flight, and its `Debug` shows a [`ShapeSummary`] (which says whether the shape is
//! salted, never the salt), so a log of an entry, a view or an action cannot print it.
//! Snapshots write [`Unsalted`] (the shape without its salt) and a flag that one was dropped;
//! the admin API shows the summary.

use std::fmt;
use std::sync::Arc;

use prewarm_core::request::JsonText;
use prewarm_core::warm_shape::{MessageSpan, WarmShape};
use serde::{Serialize, Serializer};

/// An entry's shape, shared with the warm calls that send it. `Debug` never shows the salt.
#[derive(Clone, PartialEq, Eq)]
pub struct SharedShape(Arc<WarmShape>);

impl SharedShape {
    pub fn new(shape: WarmShape) -> Self {
        Self(Arc::new(shape))
    }

    pub fn get(&self) -> &WarmShape {
        &self.0
    }

    /// What the admin API shows of it.
    pub fn summary(&self) -> ShapeSummary {
        ShapeSummary::of(&self.0)
    }
}

impl std::ops::Deref for SharedShape {
    type Target = WarmShape;

    fn deref(&self) -> &WarmShape {
        &self.0
    }
}

impl fmt::Debug for SharedShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.summary().fmt(f)
    }
}

/// A shape as the admin API shows it: its messages' count and roles, the bytes of its `tools`
/// and `chat_template_kwargs`, and whether it carries a salt (never the salt).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShapeSummary {
    /// Chat messages the prefix covers (0: a completion's shape).
    pub messages: usize,
    /// Their roles, in order.
    pub roles: Vec<String>,
    pub tools_bytes: usize,
    pub chat_template_kwargs_bytes: usize,
    /// The traffic carries a `cache_salt` (the gateway holds it; it is never shown).
    pub salted: bool,
}

impl ShapeSummary {
    pub fn of(shape: &WarmShape) -> Self {
        Self {
            messages: shape.messages.len(),
            roles: shape.messages.iter().map(|m| m.role.clone()).collect(),
            tools_bytes: shape.tools.as_ref().map_or(0, JsonText::len),
            chat_template_kwargs_bytes: shape
                .chat_template_kwargs
                .as_ref()
                .map_or(0, JsonText::len),
            salted: shape.salted(),
        }
    }
}

/// A shape serialised without its salt: the JSON of [`WarmShape::without_salt`], borrowed (a
/// snapshot is serialised outside the pool's lock, from the shared shape, without a copy).
pub struct Unsalted<'a>(pub &'a WarmShape);

#[derive(Serialize)]
struct UnsaltedFields<'a> {
    #[serde(skip_serializing_if = "<[MessageSpan]>::is_empty")]
    messages: &'a [MessageSpan],
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a JsonText>,
    #[serde(skip_serializing_if = "Option::is_none")]
    chat_template_kwargs: Option<&'a JsonText>,
}

impl Serialize for Unsalted<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        UnsaltedFields {
            messages: &self.0.messages,
            tools: self.0.tools.as_ref(),
            chat_template_kwargs: self.0.chat_template_kwargs.as_ref(),
        }
        .serialize(serializer)
    }
}

/// Serialises an optional shape without its salt (for `#[serde(serialize_with)]`).
pub fn serialize_unsalted<S: Serializer>(
    shape: &Option<SharedShape>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    shape
        .as_ref()
        .map(|s| Unsalted(s.get()))
        .serialize(serializer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn salted() -> WarmShape {
        serde_json::from_str(
            r#"{"messages":[{"role":"system","len":12},{"role":"user","len":3,"parts":true}],
            "tools":"[{\"type\":\"function\",\"function\":{\"name\":\"lookup\"}}]",
            "chat_template_kwargs":"{\"enable_thinking\":false}","cache_salt":"tenant-secret-9"}"#,
        )
        .unwrap()
    }

    #[test]
    fn unsalted_json_is_the_shape_without_its_salt() {
        let shape = salted();
        let json = serde_json::to_string(&Unsalted(&shape)).unwrap();
        assert!(!json.contains("tenant-secret-9"), "{json}");
        let back: WarmShape = serde_json::from_str(&json).unwrap();
        assert_eq!(back, shape.without_salt());
        let bare = WarmShape::default();
        assert_eq!(serde_json::to_string(&Unsalted(&bare)).unwrap(), "{}");
    }

    #[test]
    fn debug_and_summary_say_salted_without_the_salt() {
        let shared = SharedShape::new(salted());
        let debug = format!("{shared:?}");
        assert!(!debug.contains("tenant-secret-9"), "{debug}");
        let summary = shared.summary();
        assert_eq!(summary.messages, 2);
        assert_eq!(summary.roles, ["system", "user"]);
        assert!(summary.salted && summary.tools_bytes > 0);
        assert_eq!(
            summary.chat_template_kwargs_bytes,
            r#"{"enable_thinking":false}"#.len()
        );
    }
}
