//! Rendering: applications' prompts and tools in chat, conversations as turns, the trace read
//! back as it is (old traces too) and served by the offline evaluator.

use std::collections::{BTreeMap, HashMap};

use clap::Parser;
use prewarm_replay::cli::{Cli, Command};
use prewarm_replay::live::chat::{ChatPrompt, Role};
use prewarm_replay::render::BlockTexts;
use prewarm_replay::trace::{parse_trace, TraceRequest};
use prewarm_replay::workload::to_jsonl;

use super::{render, temp_dir, traces_dir, workload};

#[test]
fn an_apps_system_prompt_and_tools_are_shared_byte_for_byte_by_its_users_and_differ_between_apps() {
    let w = workload(&[]);
    let rendered = render(&w.requests);
    let mut by_app: BTreeMap<&str, Vec<(&TraceRequest, &ChatPrompt)>> = BTreeMap::new();
    for (r, p) in w.requests.iter().zip(&rendered) {
        by_app
            .entry(r.app.as_deref().unwrap())
            .or_default()
            .push((r, p));
    }
    let mut systems = Vec::new();
    let mut apps_with_tools = 0;
    for (app, requests) in &by_app {
        let (first, prompt) = requests[0];
        let system = &prompt.messages[0];
        assert_eq!(system.role, Role::System, "{app}");
        assert_eq!(system.content.len(), first.system_blocks.unwrap() * 2048);
        assert_eq!(prompt.tools.len(), first.tool_blocks.unwrap_or(0), "{app}");
        apps_with_tools += usize::from(!prompt.tools.is_empty());
        for (r, p) in requests {
            assert_eq!(&p.messages[0], system, "{app}: {r:?}");
            assert_eq!(p.tools, prompt.tools, "{app}");
        }
        systems.push(system.content.clone());
    }
    let users: std::collections::HashSet<_> = w
        .requests
        .iter()
        .filter_map(|r| r.user.as_deref())
        .collect();
    assert!(
        users.len() > 100 && by_app.len() > 10,
        "{} {}",
        users.len(),
        by_app.len()
    );
    assert!(apps_with_tools > 0);
    let count = systems.len();
    systems.sort();
    systems.dedup();
    assert_eq!(
        systems.len(),
        count,
        "every application has a system prompt of its own"
    );
    // the messages and the tools' descriptions, in order, are the completion prompt's text
    let mut texts = BlockTexts::default();
    for (r, p) in w.requests.iter().zip(&rendered).take(300) {
        let mut text = p.messages[0].content.clone();
        text.extend(p.tools.iter().map(|t| t.function.description.as_str()));
        text.extend(p.messages[1..].iter().map(|m| m.content.as_str()));
        assert_eq!(text, texts.prompt(r));
    }
}

#[test]
fn a_later_turn_starts_with_the_earlier_turns_messages() {
    let w = workload(&[]);
    let rendered = render(&w.requests);
    let index: HashMap<&[u64], usize> = w
        .requests
        .iter()
        .enumerate()
        .map(|(i, r)| (r.hash_ids.as_slice(), i))
        .collect();
    let mut later = 0;
    for (i, r) in w.requests.iter().enumerate() {
        let framed = r.system_blocks.unwrap() + r.tool_blocks.unwrap_or(0);
        let earlier = (framed + 1..r.hash_ids.len())
            .rev()
            .find_map(|k| index.get(&r.hash_ids[..k]).copied());
        let Some(e) = earlier else { continue };
        assert!(e < i && w.requests[e].user == r.user && w.requests[e].app == r.app);
        let (before, now) = (&rendered[e], &rendered[i]);
        assert_eq!(
            now.messages.get(..before.messages.len()),
            Some(&before.messages[..])
        );
        assert_eq!(now.tools, before.tools);
        let roles: Vec<Role> = now.messages.iter().rev().take(2).map(|m| m.role).collect();
        assert_eq!(roles, [Role::User, Role::Assistant]);
        // the reply is the earlier turn's output
        let reply = &now.messages[before.messages.len()];
        assert_eq!(reply.content.len() as u64, w.requests[e].output_length * 4);
        later += 1;
    }
    assert_eq!(later, w.summary.requests - w.summary.conversations);
    assert!(
        later * 4 > w.requests.len(),
        "{later} of {}",
        w.requests.len()
    );
}

#[test]
fn old_traces_parse_unchanged() {
    for name in [
        "mooncake-synthetic/synthetic_trace.jsonl",
        "agentic-sessions/agentic_sessions.jsonl",
    ] {
        let text = std::fs::read_to_string(traces_dir().join(name)).unwrap();
        let mut lines: Vec<serde_json::Value> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        lines.sort_by_key(|v| v["timestamp"].as_u64());
        let trace = parse_trace(&text).unwrap();
        assert_eq!(trace.len(), lines.len());
        for (r, line) in trace.iter().zip(&lines) {
            assert!(r.app.is_none() && r.system_blocks.is_none() && r.tool_blocks.is_none());
            assert!(!r.no_user);
            // written back, a request is the line it was read from
            assert_eq!(&serde_json::to_value(r).unwrap(), line, "{name}");
        }
    }
}

#[test]
fn the_workload_reads_back_and_the_offline_evaluator_serves_every_request() {
    let dir = temp_dir("offline");
    let out = dir.join("apps.jsonl");
    let w = workload(&["--duration-s", "120", "--rps", "2"]);
    std::fs::write(&out, to_jsonl(&w.requests).unwrap()).unwrap();
    let read = parse_trace(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(read, w.requests);
    let json = dir.join("report.json");
    let argv = [
        "prewarm-replay",
        "offline",
        "--trace",
        out.to_str().unwrap(),
        "--pods",
        "2",
        "--policies",
        "round_robin,prewarm",
        "--json",
        json.to_str().unwrap(),
    ];
    let Command::Offline(offline) = Cli::parse_from(argv).command else {
        unreachable!("offline was asked for")
    };
    prewarm_replay::cli::run_offline(&offline).unwrap();
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for policy in report["policies"].as_array().unwrap() {
        assert_eq!(policy["requests"].as_u64(), Some(w.requests.len() as u64));
        assert_eq!(policy["failed"].as_u64(), Some(0));
        // the applications' system prompts are shared prefixes: some tokens hit on any pod
        assert!(policy["token_hit_ratio"].as_f64().unwrap() > 0.0);
    }
    std::fs::remove_dir_all(&dir).ok();
}
