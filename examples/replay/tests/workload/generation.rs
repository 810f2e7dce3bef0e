//! Generation: deterministic bytes, ServeGen rates, requests without `user`, flags.

use std::collections::HashMap;
use std::path::Path;

use prewarm_replay::trace::TraceRequest;
use prewarm_replay::workload::{generate, run_workload};

use super::{args, sources, temp_dir, workload};

#[test]
fn the_same_seed_writes_the_same_bytes() {
    let dir = temp_dir("same-seed");
    let write = |name: &str, seed: &str| {
        let out = dir.join(name);
        run_workload(&args(&out, &["--seed", seed])).unwrap();
        std::fs::read(out).unwrap()
    };
    let (a, b, other) = (write("a", "7"), write("b", "7"), write("c", "8"));
    assert!(!a.is_empty());
    assert_eq!(a, b);
    assert_ne!(a, other);
    std::fs::remove_dir_all(&dir).ok();
}

/// Mean and variance of a conversation's turns.
fn turn_moments(next: f64, max: i32) -> (f64, f64) {
    let p = |k: i32| {
        if k < max {
            next.powi(k - 1) * (1.0 - next)
        } else {
            next.powi(max - 1)
        }
    };
    let mean: f64 = (1..=max).map(|k| f64::from(k) * p(k)).sum();
    let square: f64 = (1..=max).map(|k| f64::from(k * k) * p(k)).sum();
    (mean, square - mean * mean)
}

#[test]
fn request_counts_follow_servegen_mean_rates_within_sampling_error() {
    let (rps, duration) = (20.0, 3600.0);
    let w = workload(&["--rps", "20", "--duration-s", "3600"]);
    let customers = sources().customers;
    let total: f64 = customers.iter().map(|c| c.mean_rate).sum();
    let mut counts: HashMap<&str, f64> = HashMap::new();
    for r in &w.requests {
        *counts.entry(r.app.as_deref().unwrap()).or_default() += 1.0;
    }
    let (turns, turn_var) = turn_moments(0.4, 3);
    let mut checked = 0;
    for (app, c) in w.applications.iter().zip(&customers) {
        let expected = rps * duration * c.mean_rate / total;
        if expected < 200.0 {
            continue;
        }
        // a renewal count's variance is ≈ cv² × its mean; each start brings a random number of turns
        let starts = expected / turns;
        let sigma = (starts * (turn_var + turns * turns * app.cv * app.cv)).sqrt();
        let got = counts.get(app.id.as_str()).copied().unwrap_or(0.0);
        // 5 σ, plus 3 % for the later turns the end of the span cuts off
        assert!(
            (got - expected).abs() <= 5.0 * sigma + 0.03 * expected,
            "{}: {got} requests, expected {expected:.0} ± {sigma:.0}",
            app.id
        );
        checked += 1;
    }
    assert!(checked >= 12, "{checked} applications checked");
    let all = w.requests.len() as f64;
    assert!((all - rps * duration).abs() < 0.1 * rps * duration, "{all}");
}

#[test]
fn the_no_user_share_is_near_the_flag_and_those_requests_send_no_user() {
    let w = workload(&[]);
    let share = w.summary.no_user_request_share;
    // 20 % of ≈ 2,250 conversations: a standard error near 1 point
    assert!((share - 0.2).abs() < 0.05, "{share}");
    let anonymous: Vec<&TraceRequest> = w.requests.iter().filter(|r| r.no_user).collect();
    assert!(anonymous
        .iter()
        .all(|r| r.user.is_none() && r.sent_user().is_none()));
    assert!(w
        .requests
        .iter()
        .filter(|r| !r.no_user)
        .all(|r| r.sent_user() == r.user));
    // offline, each is a user of its own: no stream of prompts for the filter to follow
    let keys: std::collections::HashSet<String> = anonymous.iter().map(|r| r.user_key()).collect();
    assert_eq!(keys.len(), anonymous.len());
    assert!(workload(&["--no-user-share", "0"])
        .requests
        .iter()
        .all(|r| !r.no_user));
    assert!(workload(&["--no-user-share", "1"])
        .requests
        .iter()
        .all(|r| r.no_user));
}

#[test]
fn bad_flags_are_refused_naming_the_flag() {
    let null = Path::new("/dev/null");
    let err = |extra: &[&str]| generate(&args(null, extra), &sources()).unwrap_err();
    for (flag, value) in [
        ("--rps", "0"),
        ("--duration-s", "=-1"),
        ("--apps", "44"),
        ("--apps", "0"),
        ("--tool-share", "1.5"),
        ("--adapter-share", "=-0.1"),
        ("--no-user-share", "2"),
        ("--next-turn-share", "1"),
        ("--max-turns", "0"),
        ("--think-time-s", "0"),
        ("--conversations-per-user", "0.5"),
        ("--max-cv", "0.1"),
        ("--max-tool-blocks", "0"),
        ("--system-prompt-min-tokens", "0"),
        ("--system-prompt-max-tokens", "100"),
    ] {
        let e = match value.strip_prefix('=') {
            Some(negative) => {
                let e = err(&[&format!("{flag}={negative}")]);
                assert!(e.starts_with(&format!("{flag}: {negative}")), "{e}");
                continue;
            }
            None => err(&[flag, value]),
        };
        assert!(
            e.starts_with(&format!("{flag}: {value}")),
            "{flag} {value}: {e}"
        );
    }
    let e = run_workload(&args(null, &["--traces-dir", "/nonexistent"])).unwrap_err();
    assert!(e.starts_with("--traces-dir:"), "{e}");
    let e = run_workload(&args(Path::new("/nonexistent/dir/t.jsonl"), &[])).unwrap_err();
    assert!(e.starts_with("--out:"), "{e}");
}
