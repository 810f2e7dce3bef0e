//! An application's conversations as trace requests.
//!
//! A conversation has 1 to `max_turns` turns: each turn is followed by another with probability
//! `next_turn_share`. Turn 1's user message has the length of a ShareGPT first prompt, later
//! turns' that of an MT-Bench second turn; every turn's reply (its `output_length`) that of a
//! Mooncake request. Turn `k + 1` arrives an exponential think time after turn `k` (counted from
//! its arrival: a trace has no reply times); turns due after the span are dropped.
//!
//! Blocks: a request is the application's system-prompt blocks, its tool blocks, then the
//! conversation's own blocks (fresh ids from [`BlockIds`]). Turn `k + 1`'s ids are turn `k`'s
//! followed by the blocks of turn `k`'s reply and the new user message, so the chat replayer
//! renders it as turn `k`'s messages, an `assistant` reply and a `user` message. It does so only
//! for an earlier turn whose prompt covers all its blocks, so the user message of every turn
//! that has a successor is padded up to the end of its last block (Mooncake's 512-token
//! granularity); the last turn keeps its length. A conversation's client either sends a `user`
//! on every turn (one of the application's pool, drawn uniformly) or on none.

use super::apps::{Application, CONVERSATION_FIRST_ID};
use super::draws::Draws;
use super::sources::Sources;
use super::spec::WorkloadArgs;
use crate::trace::{TraceRequest, TRACE_BLOCK_TOKENS};

/// The next fresh conversation block id.
#[derive(Debug, Clone)]
pub struct BlockIds {
    next: u64,
}

impl Default for BlockIds {
    fn default() -> Self {
        Self {
            next: CONVERSATION_FIRST_ID,
        }
    }
}

impl BlockIds {
    fn take(&mut self, n: usize) -> impl Iterator<Item = u64> {
        let first = self.next;
        self.next = self.next.saturating_add(n as u64);
        first..first.saturating_add(n as u64)
    }
}

/// What the padding of non-final turns added, for the summary.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Padding {
    /// Turns that were padded (they have a successor).
    pub turns: usize,
    /// Tokens added to their user messages.
    pub tokens: u64,
}

/// The requests of one conversation of `app` starting at `start_s`, with their arrivals.
pub fn conversation(
    app: &Application,
    start_s: f64,
    args: &WorkloadArgs,
    sources: &Sources,
    draws: &mut Draws,
    ids: &mut BlockIds,
    padding: &mut Padding,
) -> Vec<TraceRequest> {
    let block = TRACE_BLOCK_TOKENS as u64;
    let mut turns = 1;
    while turns < args.max_turns && draws.chance(args.next_turn_share) {
        turns += 1;
    }
    let user = if draws.chance(args.no_user_share) {
        None
    } else {
        Some(format!("{}-user-{}", app.id, draws.below(app.users)))
    };
    let mut hash_ids: Vec<u64> = app
        .system_ids
        .iter()
        .chain(&app.tool_ids)
        .copied()
        .collect();
    let mut input_length = hash_ids.len() as u64 * block;
    let mut previous_reply = 0u64;
    let mut at_s = start_s;
    let mut out = Vec::with_capacity(turns);
    for turn in 0..turns {
        if turn > 0 {
            at_s += draws.exponential(args.think_time_s);
        }
        if at_s >= args.duration_s {
            break;
        }
        let pool = if turn == 0 {
            &sources.first_turn_tokens
        } else {
            &sources.follow_up_tokens
        };
        let asked = draws.pick(pool).unwrap_or(1).max(1);
        let reply = draws.pick(&sources.output_tokens).unwrap_or(1).max(1);
        let mut new_tokens = previous_reply + asked;
        if turn + 1 < turns {
            let padded = new_tokens.div_ceil(block) * block;
            padding.turns += 1;
            padding.tokens += padded - new_tokens;
            new_tokens = padded;
        }
        let covered = hash_ids.len() as u64 * block;
        input_length += new_tokens;
        let blocks = input_length.saturating_sub(covered).div_ceil(block) as usize;
        hash_ids.extend(ids.take(blocks));
        out.push(TraceRequest {
            timestamp: (at_s * 1000.0).floor() as u64,
            input_length,
            output_length: reply,
            hash_ids: hash_ids.clone(),
            adapter: app.adapter.clone(),
            tenant: app.tenant.clone(),
            user: user.clone(),
            app: Some(app.id.clone()),
            system_blocks: Some(app.system_ids.len()),
            tool_blocks: (!app.tool_ids.is_empty()).then_some(app.tool_ids.len()),
            no_user: user.is_none(),
        });
        previous_reply = reply;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app() -> Application {
        Application {
            id: "app-7".into(),
            customer: 7,
            rate_per_s: 1.0,
            cv: 1.0,
            system_ids: vec![100, 101],
            tool_ids: vec![200],
            adapter: None,
            tenant: None,
            users: 3,
        }
    }

    fn sources() -> Sources {
        Sources {
            customers: Vec::new(),
            first_turn_tokens: vec![30],
            follow_up_tokens: vec![20],
            output_tokens: vec![700],
        }
    }

    #[test]
    fn turns_extend_the_earlier_turn_in_whole_blocks_and_the_last_keeps_its_length() {
        let mut args = crate::workload::tests_support::args(&["--max-turns", "3"]);
        args.next_turn_share = 0.999_999;
        args.no_user_share = 0.0;
        let (mut ids, mut padding) = (BlockIds::default(), Padding::default());
        let mut draws = Draws::new(1, super::super::draws::Purpose::Conversations, 0);
        let turns = conversation(
            &app(),
            5.0,
            &args,
            &sources(),
            &mut draws,
            &mut ids,
            &mut padding,
        );
        assert_eq!(turns.len(), 3);
        // turn 1: 3 framing blocks + 30 tokens padded to a block
        assert_eq!(turns[0].input_length, 4 * 512);
        // turn 2: + 700 reply + 20 asked = 720, padded to 1,024
        assert_eq!(turns[1].input_length, 6 * 512);
        // turn 3: + 700 + 20, not padded
        assert_eq!(turns[2].input_length, 6 * 512 + 720);
        assert_eq!(
            padding,
            Padding {
                turns: 2,
                tokens: 482 + 304
            }
        );
        for pair in turns.windows(2) {
            assert!(pair[1].hash_ids.starts_with(&pair[0].hash_ids));
            assert!(pair[1].timestamp >= pair[0].timestamp);
        }
        assert_eq!(turns[2].hash_ids.len(), 8);
        assert_eq!(turns[0].hash_ids.get(..3), Some(&[100, 101, 200][..]));
        assert!(turns
            .iter()
            .all(|t| t.user == turns[0].user && t.user.is_some()));
        assert_eq!(
            (turns[0].system_blocks, turns[0].tool_blocks),
            (Some(2), Some(1))
        );
    }
}
