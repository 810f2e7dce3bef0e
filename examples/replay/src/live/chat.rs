//! A trace request as OpenAI chat messages (`prewarm-replay live --api chat`).
//!
//! The messages' texts and the tools' descriptions, concatenated in order, are the completion
//! prompt ([`BlockTexts::prompt`]); what chat adds is where that text is cut into messages:
//!
//! - the leading system-prompt blocks are the `system` message, so requests sharing the system
//!   prompt share an identical one: the request's own `system_blocks` (an application
//!   workload's), else the `--system-prompt-tokens` blocks ([`crate::system_prompt`]); the
//!   request's `tool_blocks` after them are its `tools` ([`super::tools`]: one function tool a
//!   block, described by the block's text), not a message;
//! - a request whose block ids extend an earlier request's is that request's next turn (a trace
//!   states conversations only this way: agentic-sessions' prompts grow turn by turn, Mooncake's
//!   synthetic trace has none). Its messages are the earlier turn's, then an `assistant` message
//!   (the earlier turn's reply: up to its `output_length` tokens of the new text, leaving the
//!   user at least one token), then a `user` message with the rest. The earlier turn is the
//!   longest such request whose prompt covered all its blocks (one cut inside its last block
//!   is not a prefix of the later prompt's text). So a later turn's messages start with every
//!   earlier turn's, under any chat template, and turns of one request cut their new text at
//!   the same place;
//! - the rest is the last `user` message. Requests that only share leading blocks (a prefix
//!   group) are not turns of each other: each is one `user` message, and their canonical
//!   renderings (`<|user|>\n` + text + `\n`, core's) share the common blocks' text as their
//!   completion prompts did.
//!
//! The same ids and length render the same messages (the first rendering is kept), so a
//! request repeated later is not rendered differently by a turn registered in between.

use std::collections::{BTreeSet, HashMap};

use prewarm_core::tokens::{token_bytes, BYTES_PER_TOKEN};
use serde::Serialize;

use super::tools::ToolDefinition;
use crate::render::{BlockTexts, BLOCK_BYTES};
use crate::system_prompt::SYSTEM_PROMPT_FIRST_ID;
use crate::trace::TraceRequest;

/// A chat message's author.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

/// One message as the request body carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

/// What a span of a prompt's text becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    Message(Role),
    /// The request's tools, one a block.
    Tools,
}

/// Where a prompt's text is cut: each piece and its end byte, in order; the last is the `user`
/// message ending at the text's end.
type Cuts = Vec<(Piece, usize)>;

/// A request as chat: its messages and its tools (empty: none sent).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChatPrompt {
    pub messages: Vec<Message>,
    pub tools: Vec<ToolDefinition>,
}

/// A request already rendered.
#[derive(Debug)]
struct Rendered {
    cuts: Cuts,
    /// Bytes of its text.
    bytes: usize,
    /// Whether its text covers all its blocks (only then can it be an earlier turn).
    whole: bool,
    output_length: u64,
}

/// The chat rendering of a trace's requests, in trace order; see the module docs.
#[derive(Debug, Default)]
pub struct ChatRenderer {
    /// Renderings by block ids (the first of each ids kept).
    rendered: HashMap<Vec<u64>, Rendered>,
    /// Id counts of the whole renderings, to look up earlier turns by prefix.
    whole_lengths: BTreeSet<usize>,
}

impl ChatRenderer {
    /// The messages of `request`; call in trace order (a turn extends only earlier requests).
    pub fn messages(&mut self, request: &TraceRequest, texts: &mut BlockTexts) -> Vec<Message> {
        self.prompt(request, texts).messages
    }

    /// The messages and tools of `request`; call in trace order.
    pub fn prompt(&mut self, request: &TraceRequest, texts: &mut BlockTexts) -> ChatPrompt {
        let text = texts.prompt(request);
        let cuts = self.cuts(request, text.len());
        let mut out = ChatPrompt::default();
        let mut start = 0;
        for (piece, end) in cuts {
            let content = text.get(start..end).unwrap_or_default();
            match piece {
                Piece::Message(role) => out.messages.push(Message {
                    role,
                    content: content.to_string(),
                }),
                // tool spans are whole blocks starting on a block boundary
                Piece::Tools => {
                    let first = start / BLOCK_BYTES;
                    let ids = request.hash_ids.iter().skip(first);
                    let blocks = content.as_bytes().chunks(BLOCK_BYTES);
                    out.tools.extend(ids.zip(blocks).map(|(id, block)| {
                        ToolDefinition::of_block(*id, &String::from_utf8_lossy(block))
                    }));
                }
            }
            start = end;
        }
        out
    }

    fn cuts(&mut self, request: &TraceRequest, bytes: usize) -> Cuts {
        let ids = &request.hash_ids;
        if let Some(r) = self.rendered.get(ids.as_slice()) {
            if r.bytes == bytes {
                return r.cuts.clone();
            }
        }
        let cuts = match self.earlier_turn(ids, bytes) {
            Some(turn) => {
                let new = bytes - turn.bytes;
                let reply = token_bytes(turn.output_length as usize)
                    .min(new.saturating_sub(BYTES_PER_TOKEN));
                let mut cuts = turn.cuts.clone();
                cuts.push((Piece::Message(Role::Assistant), turn.bytes + reply));
                cuts.push((Piece::Message(Role::User), bytes));
                cuts
            }
            None => first_turn_cuts(request, bytes),
        };
        let whole = bytes == ids.len().saturating_mul(BLOCK_BYTES);
        let rendered = Rendered {
            cuts: cuts.clone(),
            bytes,
            whole,
            output_length: request.output_length,
        };
        match self.rendered.get_mut(ids.as_slice()) {
            None => {
                self.rendered.insert(ids.clone(), rendered);
            }
            // a whole rendering can be an earlier turn; a cut one of the same ids cannot
            Some(kept) if whole && !kept.whole => *kept = rendered,
            Some(_) => {}
        }
        if whole {
            self.whole_lengths.insert(ids.len());
        }
        cuts
    }

    /// The longest earlier whole rendering whose ids are a strict prefix of `ids` and whose
    /// text is shorter than `bytes`.
    fn earlier_turn(&self, ids: &[u64], bytes: usize) -> Option<&Rendered> {
        self.whole_lengths.range(..ids.len()).rev().find_map(|&k| {
            let turn = self.rendered.get(ids.get(..k)?)?;
            (turn.whole && turn.bytes < bytes).then_some(turn)
        })
    }
}

/// The cuts of a request that continues no earlier one: system prompt, tools, the rest.
fn first_turn_cuts(request: &TraceRequest, bytes: usize) -> Cuts {
    let system_blocks = request
        .system_blocks
        .unwrap_or_else(|| reserved_system_blocks(&request.hash_ids));
    let system = system_blocks.saturating_mul(BLOCK_BYTES);
    let tools = system.saturating_add(request.tool_blocks.unwrap_or(0).saturating_mul(BLOCK_BYTES));
    let mut cuts = Vec::with_capacity(3);
    if tools < bytes {
        if system > 0 {
            cuts.push((Piece::Message(Role::System), system));
        }
        if tools > system {
            cuts.push((Piece::Tools, tools));
        }
    }
    cuts.push((Piece::Message(Role::User), bytes));
    cuts
}

/// How many of `ids`' leading blocks are the `--system-prompt-tokens` prompt's.
fn reserved_system_blocks(ids: &[u64]) -> usize {
    ids.iter()
        .zip(SYSTEM_PROMPT_FIRST_ID..)
        .take_while(|(id, want)| **id == *want)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::system_prompt::with_system_prompt;
    use prewarm_core::{canonical_prompt, parse_request, Endpoint};

    fn req(ids: &[u64], input_length: u64, output_length: u64) -> TraceRequest {
        TraceRequest::synthetic(0, ids, input_length, output_length)
    }

    fn render(trace: &[TraceRequest]) -> Vec<Vec<Message>> {
        let mut texts = BlockTexts::default();
        let mut chat = ChatRenderer::default();
        trace.iter().map(|r| chat.messages(r, &mut texts)).collect()
    }

    /// What prewarm hashes for these messages: core's canonical rendering of the body sent.
    fn canonical(messages: &[Message]) -> String {
        let body = serde_json::json!({"model": "m", "messages": messages});
        let parsed = parse_request(
            Endpoint::ChatCompletions,
            body.to_string().as_bytes(),
            1 << 26,
        )
        .unwrap();
        canonical_prompt(&parsed)
    }

    fn roles(messages: &[Message]) -> Vec<Role> {
        messages.iter().map(|m| m.role).collect()
    }

    fn joined(messages: &[Message]) -> String {
        messages.iter().map(|m| m.content.as_str()).collect()
    }

    #[test]
    fn a_conversations_later_turn_starts_with_the_earlier_turns_messages() {
        // agentic-sessions-shaped: each turn's ids extend the previous turn's
        let trace = vec![
            req(&[1, 2], 1024, 100),
            req(&[1, 2, 3, 4], 2048, 700),
            req(&[1, 2, 3, 4, 5], 2100, 5),
        ];
        let rendered = render(&trace);
        let mut texts = BlockTexts::default();
        for (r, m) in trace.iter().zip(&rendered) {
            assert_eq!(
                joined(m),
                texts.prompt(r),
                "the text is the completion prompt's"
            );
        }
        for pair in rendered.windows(2) {
            let (earlier, later) = (&pair[0], &pair[1]);
            assert_eq!(later.get(..earlier.len()), Some(earlier.as_slice()));
            assert!(canonical(later).starts_with(&canonical(earlier)));
        }
        use Role::{Assistant, User};
        assert_eq!(roles(&rendered[0]), [User]);
        assert_eq!(roles(&rendered[1]), [User, Assistant, User]);
        assert_eq!(
            roles(&rendered[2]),
            [User, Assistant, User, Assistant, User]
        );
        // the reply is the earlier turn's output_length tokens of the new text
        assert_eq!(rendered[1][1].content.len(), 400);
        // ... leaving the user at least one token when the reply is longer than the new text
        assert_eq!(rendered[2][3].content.len(), 52 * 4 - 4);
        assert_eq!(rendered[2][4].content.len(), 4);
    }

    #[test]
    fn the_agentic_sessions_trace_renders_as_conversations() {
        use std::collections::hash_map::DefaultHasher;
        use std::hash::{Hash, Hasher};
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/traces/agentic-sessions/agentic_sessions.jsonl");
        let trace = crate::trace::load_trace(&path).unwrap();
        // the sessions of at most 1,500 blocks in all (18 sessions, 182 requests)
        let mut blocks: HashMap<u64, usize> = HashMap::new();
        for r in &trace {
            *blocks.entry(r.hash_ids[0]).or_default() += r.hash_ids.len();
        }
        let trace: Vec<TraceRequest> = trace
            .into_iter()
            .filter(|r| blocks[&r.hash_ids[0]] <= 1500)
            .collect();
        assert!(trace.len() > 150, "{}", trace.len());
        let mut texts = BlockTexts::default();
        let mut chat = ChatRenderer::default();
        // each request's messages as (role, hash of the content)
        let mut rendered: Vec<Vec<(Role, u64)>> = Vec::new();
        let mut turns = 0;
        for (i, r) in trace.iter().enumerate() {
            let messages = chat.messages(r, &mut texts);
            let want: Vec<Role> = (0..messages.len())
                .map(|k| {
                    if k % 2 == 0 {
                        Role::User
                    } else {
                        Role::Assistant
                    }
                })
                .collect();
            assert_eq!(roles(&messages), want, "request {i}");
            let keyed: Vec<(Role, u64)> = messages
                .iter()
                .map(|m| {
                    let mut h = DefaultHasher::new();
                    m.content.hash(&mut h);
                    (m.role, h.finish())
                })
                .collect();
            // the longest earlier request whose ids this one's extend, found naively
            let earlier = (0..i)
                .filter(|&j| {
                    let e = &trace[j].hash_ids;
                    e.len() < r.hash_ids.len()
                        && r.hash_ids.starts_with(e)
                        && trace[j].input_length >= (e.len() * 512) as u64
                })
                .max_by_key(|&j| (trace[j].hash_ids.len(), std::cmp::Reverse(j)));
            if let Some(j) = earlier {
                assert_eq!(
                    keyed.get(..rendered[j].len()),
                    Some(&rendered[j][..]),
                    "{i} {j}"
                );
                turns += 1;
            }
            rendered.push(keyed);
        }
        // nearly every request continues its session
        assert!(turns * 10 > trace.len() * 8, "{turns} of {}", trace.len());
    }

    #[test]
    fn turns_of_one_request_cut_their_new_text_at_the_same_place() {
        let rendered = render(&[
            req(&[1], 512, 64),
            req(&[1, 2, 3], 1400, 4),
            req(&[1, 2, 4], 1500, 4),
        ]);
        assert_eq!(rendered[1].get(..2), rendered[2].get(..2));
        assert_ne!(rendered[1][2], rendered[2][2]);
    }

    #[test]
    fn only_a_prompt_covering_all_its_blocks_is_an_earlier_turn() {
        // the first prompt ends inside block 2, so it is no prefix of the second's text
        let rendered = render(&[req(&[1, 2], 700, 4), req(&[1, 2, 3], 1400, 4)]);
        assert_eq!(roles(&rendered[1]), [Role::User]);
        // a prefix group without turns still shares its common blocks' canonical text
        let (a, b) = (canonical(&rendered[0]), canonical(&rendered[1]));
        let shared = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        assert_eq!(shared, "<|user|>\n".len() + 700 * 4);
    }

    #[test]
    fn requests_sharing_a_system_prompt_get_an_identical_system_message() {
        let trace = with_system_prompt(
            vec![
                req(&[1, 2], 1000, 4),
                req(&[7], 300, 4),
                req(&[1, 2], 1024, 4),
                req(&[1, 2, 3], 1100, 4),
            ],
            1024,
        );
        let rendered = render(&trace);
        let system = &rendered[0][0];
        assert_eq!(system.role, Role::System);
        assert_eq!(system.content.len(), 2 * BLOCK_BYTES);
        for m in &rendered {
            assert_eq!(&m[0], system);
        }
        assert_eq!(roles(&rendered[1]), [Role::System, Role::User]);
        assert_ne!(rendered[0][1], rendered[1][1]);
        // a turn after the system prompt: the system message, then the turns
        assert_eq!(
            roles(&rendered[3]),
            [Role::System, Role::User, Role::Assistant, Role::User]
        );
        assert_eq!(rendered[3].get(..2), Some(rendered[2].as_slice()));
    }

    #[test]
    fn the_same_request_renders_the_same_messages_whatever_came_between() {
        let rendered = render(&[
            req(&[1, 2, 3], 1200, 4),
            req(&[1, 2], 1024, 4), // could be an earlier turn of a later [1, 2, 3]
            req(&[1, 2, 3], 1200, 4),
        ]);
        assert_eq!(rendered[2], rendered[0]);
        assert_eq!(roles(&rendered[2]), [Role::User]);
    }
}
