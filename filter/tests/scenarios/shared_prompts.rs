//! Native scenario tests of the cross-user trigger: prefixes many requests share become hot
//! whoever sends them (`signals::prompt_tally`, `signals::observe::fold_tally`, core's
//! `trigger::shared`).

use prewarm_core::experiment::{Arm, ArmSettings, Experiment, Unit};
use prewarm_core::wire::{PatternState, PrefillSignal, Signal};
use prewarm_core::{BlockChain, FingerprintConfig};

use prewarm_filter::config::{FilterConfig, SharedDataConfig, SignalsConfig};
use prewarm_filter::host::fake::FakeHost;
use prewarm_filter::host::Metric;
use prewarm_filter::root::RootTasks;
use prewarm_filter::signals::prompt_tally::MAX_GROUPS;
use prewarm_filter::worker::Worker;

use crate::requests::{queued, send, table};

const TEMPLATES: usize = 4;

/// Application `k`'s system prompt (~3,000 bytes: past the first 512-token shard).
fn system(k: usize) -> String {
    (0..60)
        .map(|i| format!("App {k} rule {i}: answer precisely and cite the policy."))
        .collect::<Vec<_>>()
        .join(" ")
}

fn body(k: usize, question: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "model": "base",
        "messages": [
            {"role": "system", "content": system(k)},
            {"role": "user", "content": question},
        ],
        "tools": [{"type": "function", "function": {"name": format!("app_{k}_lookup")}}],
    }))
    .unwrap()
}

fn worker() -> Worker {
    Worker::new(FilterConfig {
        signals: SignalsConfig {
            base_models: vec!["base".into()],
            ..SignalsConfig::default()
        },
        ..FilterConfig::default()
    })
}

/// Who sends request `n`.
#[derive(Clone, Copy)]
enum Sender {
    /// A new user each request.
    OneShotUser,
    /// No user, no credential.
    Nobody,
}

/// One round: request `n` for each template, each from a new sender, then a tick's fold.
/// Returns the prefill signals the fold made.
fn round(host: &FakeHost, worker: &Worker, n: &mut usize, sender: Sender) -> Vec<PrefillSignal> {
    for k in 0..TEMPLATES {
        let user = format!("one-shot-user-{n}");
        let headers: Vec<(&str, &[u8])> = match sender {
            Sender::OneShotUser => vec![("x-prewarm-user", user.as_bytes())],
            Sender::Nobody => vec![],
        };
        let question = format!("Question {n}: what happened to my order number {n}?");
        send(
            host,
            worker,
            "/v1/chat/completions",
            &headers,
            &body(k, &question),
        );
        *n += 1;
    }
    let before = queued(host).len();
    RootTasks::default().fold_tally(host, worker);
    queued(host)
        .into_iter()
        .skip(before)
        .filter_map(|s| match s {
            Signal::Prefill(p) => Some(p),
            _ => None,
        })
        .collect()
}

/// The template a signal is of.
fn template_of(p: &PrefillSignal) -> usize {
    (0..TEMPLATES)
        .find(|k| {
            p.prefix_text
                .starts_with(&format!("<|system|>\nApp {k} rule 0:"))
        })
        .expect("a template's text")
}

/// Four templates sent by one-shot senders: not hot before their third request, then one
/// signal each with its text and shape; hot traffic within the window makes no other; a window
/// after, one more each (known).
fn templates_become_hot_once_a_window(sender: Sender) -> FakeHost {
    let host = FakeHost::new();
    let worker = worker();
    let t0 = host.now_ms_for_tests();
    let mut n = 0;
    // 24 senders, one request each: 6 per template, a round a second
    for r in 0..6u64 {
        host.set_now(t0 + r * 1_000);
        let signals = round(&host, &worker, &mut n, sender);
        if r != 2 {
            assert!(signals.is_empty(), "round {r}: {signals:?}");
            continue;
        }
        // the third request of each template crosses the threshold (3 = similar_prompts)
        assert_eq!(signals.len(), TEMPLATES, "round {r}");
        let mut seen: Vec<usize> = signals.iter().map(template_of).collect();
        seen.sort();
        assert_eq!(seen, (0..TEMPLATES).collect::<Vec<_>>(), "one signal each");
        let fp = FingerprintConfig::default();
        for p in &signals {
            let k = template_of(p);
            let canonical = format!("<|system|>\n{}\n<|user|>\nQuestion ", system(k));
            let whole = BlockChain::of("base", canonical.as_bytes(), &fp);
            assert!(canonical.starts_with(&p.prefix_text));
            assert_eq!(
                p.prefix,
                whole.blocks[..p.prefix.len()],
                "the template's blocks"
            );
            assert!(
                p.prefix.len() >= whole.blocks.len() - 1,
                "the whole template, not its first shard only"
            );
            assert_eq!(
                BlockChain::of("base", p.prefix_text.as_bytes(), &fp).blocks,
                p.prefix
            );
            assert_eq!(p.state, PatternState::New);
            assert!(p.keep_warm);
            let shape = p.shape.as_ref().expect("a chat template's shape");
            shape.check(&p.prefix_text).unwrap();
            assert_eq!(shape.messages[0].role, "system");
            assert!(shape
                .tools
                .as_ref()
                .unwrap()
                .get()
                .contains(&format!("app_{k}_lookup")));
        }
    }
    let signalled = t0 + 2_000;
    // still hot within the window: nothing more
    for r in 0..3 {
        host.set_now(signalled + 50_000 + r * 1_000);
        assert!(round(&host, &worker, &mut n, sender).is_empty());
    }
    // a window after the signal, still hot: one more each, known
    host.set_now(signalled + 61_000);
    let again = round(&host, &worker, &mut n, sender);
    assert_eq!(again.len(), TEMPLATES);
    assert!(again.iter().all(|p| p.state == PatternState::Known));
    assert_eq!(
        host.metric(Metric::SharedPromptSignals),
        2 * TEMPLATES as u64
    );
    assert_eq!(host.metric(Metric::SignalsUnshaped), 0);
    host
}

#[test]
fn one_shot_users_make_each_shared_template_hot_once_a_window() {
    let host = templates_become_hot_once_a_window(Sender::OneShotUser);
    assert_eq!(host.metric(Metric::NoUser), 0);
}

#[test]
fn requests_without_any_user_make_shared_templates_hot_the_same_way() {
    let host = templates_become_hot_once_a_window(Sender::Nobody);
    assert_eq!(host.metric(Metric::NoUser), 40);
    assert_eq!(host.metric(Metric::UserFromCredential), 0);
}

#[test]
fn workers_count_one_prefix_together_and_one_holding_its_text_signals_it() {
    let host = FakeHost::new();
    let other = host.sibling();
    let (a, b) = (worker(), worker());
    // a sees the template twice (so it holds its text): two in the proxy
    send(&host, &a, "/v1/chat/completions", &[], &body(0, "q1"));
    send(&host, &a, "/v1/chat/completions", &[], &body(0, "q2"));
    RootTasks::default().fold_tally(&host, &a);
    // b's one request makes three: hot, but b has no text of it and leaves the signal
    send(&other, &b, "/v1/chat/completions", &[], &body(0, "q3"));
    RootTasks::default().fold_tally(&other, &b);
    assert!(queued(&host).is_empty());
    // a's next request folds into a hot prefix a holds the text of: one signal, new
    send(&host, &a, "/v1/chat/completions", &[], &body(0, "q4"));
    RootTasks::default().fold_tally(&host, &a);
    RootTasks::default().fold_tally(&other, &b);
    let signals = queued(&host);
    assert_eq!(signals.len(), 1, "{signals:?}");
    assert!(matches!(&signals[0], Signal::Prefill(p) if p.state == PatternState::New));
}

#[test]
fn the_worker_holding_the_text_signals_a_prefix_another_worker_made_hot_without_a_new_request() {
    let host = FakeHost::new();
    let other = host.sibling();
    let (a, b) = (worker(), worker());
    send(&host, &a, "/v1/chat/completions", &[], &body(0, "q1"));
    send(&host, &a, "/v1/chat/completions", &[], &body(0, "q2"));
    RootTasks::default().fold_tally(&host, &a);
    send(&other, &b, "/v1/chat/completions", &[], &body(0, "q3"));
    RootTasks::default().fold_tally(&other, &b);
    assert!(queued(&host).is_empty());
    // no more requests: a's next tick still takes its group and signals it, once
    RootTasks::default().fold_tally(&host, &a);
    RootTasks::default().fold_tally(&host, &a);
    let signals = queued(&host);
    assert_eq!(signals.len(), 1, "{signals:?}");
    assert!(matches!(&signals[0], Signal::Prefill(p) if p.state == PatternState::New));
}

#[test]
fn a_prompt_seen_once_never_copies_its_text() {
    let host = FakeHost::new();
    let worker = worker();
    for i in 0..50 {
        let unique = format!("{i} {}", system(i));
        send(
            &host,
            &worker,
            "/v1/completions",
            &[],
            &serde_json::to_vec(&serde_json::json!({"model": "base", "prompt": unique})).unwrap(),
        );
    }
    RootTasks::default().fold_tally(&host, &worker);
    assert_eq!(worker.prompts.len(), 50);
    assert_eq!(worker.prompts.text_copies(), 0);
    assert_eq!(worker.prompts.text_bytes(), 0);
    assert!(queued(&host).is_empty());
    // the second request of one of them copies its text, once
    let again = format!("7 {}", system(7));
    send(
        &host,
        &worker,
        "/v1/completions",
        &[],
        &serde_json::to_vec(&serde_json::json!({"model": "base", "prompt": again})).unwrap(),
    );
    assert_eq!(worker.prompts.text_copies(), 1);
    assert!(worker.prompts.text_bytes() > 0);
}

#[test]
fn the_tally_and_the_shared_slots_stay_bounded_under_a_flood_of_distinct_prompts() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig {
        signals: SignalsConfig {
            base_models: vec!["base".into()],
            ..SignalsConfig::default()
        },
        shared_data: SharedDataConfig {
            shared_prompt_slots: 64,
            shared_prompt_tally_bytes: 64 << 10,
            ..SharedDataConfig::default()
        },
        ..FilterConfig::default()
    });
    for i in 0..(MAX_GROUPS + 300) {
        let prompt = format!("{i:06} {}", "flood ".repeat(60));
        send(
            &host,
            &worker,
            "/v1/completions",
            &[],
            &serde_json::to_vec(&serde_json::json!({"model": "base", "prompt": prompt})).unwrap(),
        );
        assert!(worker.prompts.len() <= MAX_GROUPS);
        assert!(worker.prompts.bytes() <= 64 << 10);
        if i % 500 == 499 {
            RootTasks::default().fold_tally(&host, &worker);
        }
    }
    RootTasks::default().fold_tally(&host, &worker);
    let slots = host
        .shared_keys()
        .into_iter()
        .filter(|k| k.starts_with("prewarm/shared_prompt/"))
        .count();
    assert!(slots > 0 && slots <= 64, "{slots} slots");
    assert!(host.metric(Metric::SharedPromptEvicted) > 0);
    assert_eq!(worker.prompts.text_copies(), 0);
    assert!(queued(&host).is_empty());
}

#[test]
fn a_prompt_without_a_full_block_is_not_counted() {
    let host = FakeHost::new();
    let worker = worker();
    for _ in 0..5 {
        send(
            &host,
            &worker,
            "/v1/chat/completions",
            &[],
            &crate::requests::chat_body("base", "hi", "short"),
        );
    }
    assert!(worker.prompts.is_empty());
    RootTasks::default().fold_tally(&host, &worker);
    assert!(queued(&host).is_empty());
}

#[test]
fn an_arm_with_warmup_off_keeps_its_prompts_out_of_the_shared_tally() {
    let host = FakeHost::new();
    let worker = worker();
    let cold = ArmSettings {
        warmup: false,
        ..ArmSettings::default()
    };
    let arm = |name: &str| Arm {
        name: name.into(),
        weight: 0.5,
        settings: cold,
    };
    let mut t = table(&[("p1", "127.0.0.1:1001", &[])]);
    t.experiment = Some(Experiment {
        id: "exp".into(),
        unit: Unit::User,
        arms: vec![arm("a"), arm("b")],
        release: None,
    });
    worker.table.install(7, t);
    for u in 0..6 {
        let user = format!("user-{u}");
        send(
            &host,
            &worker,
            "/v1/chat/completions",
            &[("x-prewarm-user", user.as_bytes())],
            &body(0, "q"),
        );
    }
    assert_eq!(host.metric(Metric::ArmAssigned), 6);
    assert!(worker.prompts.is_empty());
    RootTasks::default().fold_tally(&host, &worker);
    assert!(queued(&host).is_empty());
}
