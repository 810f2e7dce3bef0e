//! The gateway's layers, kept by a test (`docs/architecture.md`, CONVENTIONS 5a): every
//! top-level module of `gateway/src` belongs to one layer of [`LAYERS`] and imports (`crate::x`,
//! or `super::` climbing out of its top-level module) only from its own layer or lower ones, and
//! no two top-level modules import each other, directly or round a circle.
//!
//! Test-only code (`#[cfg(test)] mod x;` files and inline `#[cfg(test)] mod x { .. }` blocks) is
//! not checked: scenario tests of the policy build their fleet from a parsed `GatewayConfig`,
//! which ships nothing. Comment lines are not read (doc links name what they like).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Layers, lowest first; each lists its top-level modules (`src/<module>.rs` or
/// `src/<module>/`). `main` is the binary's module tree (`main.rs`, the `status` client).
const LAYERS: &[(&str, &[&str])] = &[
    // Shared vocabulary of the decisions: a tenant's tier, the error-rate rule.
    ("vocabulary", &["tier", "error_rate"]),
    // Pure decisions and the data they own: the fleet core, LoRA, tiers, placement, release
    // steps; the adapter registry and its rollout watches.
    ("policy", &["registry", "policy"]),
    // Reads outcomes and the policy's state: ledgers, reports, the release check.
    ("attribution", &["attribution"]),
    // Configuration of every layer (its sections' types); never a running feature.
    ("config", &["config"]),
    // The running gateway: executes decisions, pods' I/O, persistence, metrics, embeddings.
    (
        "shell",
        &[
            "engine",
            "traces",
            "telemetry",
            "embeddings",
            "warm_embeddings",
            "state",
            "service",
        ],
    ),
    // HTTP: the API and the dashboard it serves.
    ("api", &["dashboard", "api"]),
    // The process: the `serve` lifecycle, `main`, the terminal client.
    ("main", &["server", "main", "status"]),
];

/// Imports that break a rule and stay for now: (from module, to module, why). Empty is the goal.
const ALLOWED: &[(&str, &str, &str)] = &[];

/// One import of a top-level module from another.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Import {
    from: String,
    to: String,
    file: String,
    line: usize,
}

/// A file's path below `src/` split into its module path: `a/b.rs` and `a/b/mod.rs` are
/// `[a, b]`; `lib.rs` is `[]`; `main.rs` is `[main]` (the binary's root).
fn module_path(rel: &str) -> Vec<String> {
    let rel = rel.trim_end_matches(".rs");
    let mut parts: Vec<String> = rel.split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts == ["lib"] {
        parts.clear();
    }
    parts
}

/// The directory holding the children of the module in file `rel` (`a/b.rs` → `a/b`,
/// `a/mod.rs` → `a`, `lib.rs` → ``).
fn child_dir(rel: &str) -> String {
    let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
    if name == "mod.rs" || rel == "lib.rs" || rel == "main.rs" {
        dir.to_owned()
    } else {
        let stem = name.trim_end_matches(".rs");
        if dir.is_empty() {
            stem.to_owned()
        } else {
            format!("{dir}/{stem}")
        }
    }
}

/// Files declared as `#[cfg(test)] mod x;`, and everything below them.
fn test_only_files(files: &[(String, String)]) -> BTreeSet<String> {
    let mut test_dirs = BTreeSet::new();
    for (rel, text) in files {
        let dir = child_dir(rel);
        let mut after_cfg_test = false;
        for line in text.lines() {
            let t = line.trim();
            if t == "#[cfg(test)]" {
                after_cfg_test = true;
                continue;
            }
            if after_cfg_test && !t.starts_with("#[") {
                let decl = t
                    .trim_start_matches("pub(crate) ")
                    .trim_start_matches("pub ");
                if let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                    let child = if dir.is_empty() {
                        name.to_owned()
                    } else {
                        format!("{dir}/{name}")
                    };
                    test_dirs.insert(child);
                }
                after_cfg_test = false;
            }
        }
    }
    files
        .iter()
        .map(|(rel, _)| rel.clone())
        .filter(|rel| {
            let stem = rel.trim_end_matches(".rs").trim_end_matches("/mod");
            test_dirs
                .iter()
                .any(|d| stem == d || stem.starts_with(&format!("{d}/")))
        })
        .collect()
}

/// The text the check reads: without comment lines and inline `#[cfg(test)] mod x { .. }`
/// blocks (rustfmt closes them with a `}` at the `mod` line's indentation). Each kept line
/// keeps its number.
fn code_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        if t == "#[cfg(test)]" {
            if let Some((_, next)) = lines.peek() {
                let n = next.trim_start();
                if n.starts_with("mod ") && n.ends_with('{') {
                    let indent = &next[..next.len() - n.len()];
                    let close = format!("{indent}}}");
                    for (_, l) in lines.by_ref() {
                        if l == close {
                            break;
                        }
                    }
                    continue;
                }
            }
        }
        out.push((i + 1, line.to_owned()));
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The identifiers a path's group starts with, with their offsets in it: `{a::x, b, c::{d}}`
/// → `[a, b, c]`.
fn group_heads(group: &str) -> Vec<(String, usize)> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                heads.push((&group[start..i], start));
                start = i + 1;
            }
            _ => {}
        }
    }
    heads.push((&group[start..], start));
    heads
        .into_iter()
        .filter_map(|(item, at)| {
            let lead = item.len() - item.trim_start().len();
            let head: String = item.trim().chars().take_while(|&c| is_ident(c)).collect();
            (!head.is_empty() && head != "self").then_some((head, at + lead))
        })
        .collect()
}

/// The top-level modules a file's code names, with the line of each mention.
fn references(rel: &str, text: &str) -> Vec<(String, usize)> {
    let depth = module_path(rel).len();
    let lines = code_lines(text);
    // Joined so that a `use crate::{..}` group may span lines; `starts` maps offsets to lines.
    let mut joined = String::new();
    let mut starts = Vec::new();
    for (n, l) in &lines {
        starts.push((joined.len(), *n));
        joined.push_str(l);
        joined.push('\n');
    }
    let line_of = |offset: usize| {
        let i = starts.partition_point(|&(s, _)| s <= offset);
        starts[i.saturating_sub(1)].1
    };
    let mut found = Vec::new();
    let bytes = joined.as_bytes();
    // `offset` is where `rest` starts in `joined`.
    let heads_at = |offset: usize, rest: &str, found: &mut Vec<(String, usize)>| {
        if let Some(group) = rest.strip_prefix('{') {
            let mut d = 1;
            let end = group
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '{' => d += 1,
                        '}' => d -= 1,
                        _ => {}
                    }
                    d == 0
                })
                .map_or(group.len(), |(i, _)| i);
            let group_at = offset + (rest.len() - group.len());
            for (head, at) in group_heads(&group[..end]) {
                found.push((head, line_of(group_at + at)));
            }
        } else {
            let head: String = rest.chars().take_while(|&c| is_ident(c)).collect();
            if !head.is_empty() {
                found.push((head, line_of(offset)));
            }
        }
    };
    for (offset, _) in joined.match_indices("crate::") {
        let before = offset.checked_sub(1).map(|i| bytes[i] as char);
        if before.is_some_and(|c| is_ident(c) || c == '$') {
            continue;
        }
        let at = offset + "crate::".len();
        heads_at(at, &joined[at..], &mut found);
    }
    // `super::super::..` reaching the crate root from a file `depth` modules down.
    if depth > 0 {
        let mut offset = 0;
        while let Some(i) = joined[offset..].find("super::") {
            let at = offset + i;
            let before = at.checked_sub(1).map(|i| bytes[i] as char);
            let mut end = at;
            let mut climbs = 0;
            while joined[end..].starts_with("super::") {
                climbs += 1;
                end += "super::".len();
            }
            if !before.is_some_and(|c| is_ident(c) || c == ':') && climbs >= depth {
                heads_at(end, &joined[end..], &mut found);
            }
            offset = end;
        }
    }
    found
}

/// Every import between two top-level modules in `files` (paths relative to `src/`).
fn imports(files: &[(String, String)]) -> Vec<Import> {
    let tests = test_only_files(files);
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|(rel, _)| module_path(rel).first().cloned())
        .collect();
    let mut out = Vec::new();
    for (rel, text) in files {
        if tests.contains(rel) {
            continue;
        }
        let Some(from) = module_path(rel).first().cloned() else {
            continue;
        };
        for (to, line) in references(rel, text) {
            if to != from && modules.contains(&to) {
                out.push(Import {
                    from: from.clone(),
                    to,
                    file: rel.clone(),
                    line,
                });
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// What breaks the rules: unknown modules, imports from a higher layer, circles.
fn problems(files: &[(String, String)], layers: &[(&str, &[&str])]) -> Vec<String> {
    let layer_of = |m: &str| layers.iter().position(|(_, ms)| ms.contains(&m));
    let allowed = |i: &Import| ALLOWED.iter().any(|(f, t, _)| *f == i.from && *t == i.to);
    let mut out = Vec::new();
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|(rel, _)| module_path(rel).first().cloned())
        .collect();
    for m in &modules {
        if layer_of(m).is_none() {
            out.push(format!("module `{m}` is in no layer: add it to LAYERS"));
        }
    }
    let imports = imports(files);
    for i in imports.iter().filter(|i| !allowed(i)) {
        if let (Some(f), Some(t)) = (layer_of(&i.from), layer_of(&i.to)) {
            if t > f {
                out.push(format!(
                    "upward: {}:{}: {} ({}) imports {} ({})",
                    i.file, i.line, i.from, layers[f].0, i.to, layers[t].0
                ));
            }
        }
    }
    // Circles: groups of modules that reach each other.
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for i in imports.iter().filter(|i| !allowed(i)) {
        edges.entry(&i.from).or_default().insert(&i.to);
    }
    let reach = |start: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![start];
        while let Some(m) = todo.pop() {
            for &n in edges.get(m).into_iter().flatten() {
                if seen.insert(n) {
                    todo.push(n);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&str, BTreeSet<&str>> =
        modules.iter().map(|m| (m.as_str(), reach(m))).collect();
    let mut reported = BTreeSet::new();
    for m in &modules {
        if reported.contains(m.as_str()) || !reaches[m.as_str()].contains(m.as_str()) {
            continue;
        }
        let circle: BTreeSet<&str> = reaches[m.as_str()]
            .iter()
            .copied()
            .filter(|n| reaches[n].contains(m.as_str()))
            .collect();
        let through: Vec<String> = imports
            .iter()
            .filter(|i| {
                !allowed(i) && circle.contains(i.from.as_str()) && circle.contains(i.to.as_str())
            })
            .map(|i| format!("{} -> {} ({}:{})", i.from, i.to, i.file, i.line))
            .collect();
        out.push(format!(
            "circle between {:?}: {}",
            circle,
            through.join("; ")
        ));
        reported.extend(circle);
    }
    out
}

fn read_tree(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            read_tree(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            out.push((rel, std::fs::read_to_string(&path).unwrap()));
        }
    }
}

#[test]
fn the_gateway_keeps_its_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    read_tree(&src, &src, &mut files);
    assert!(files.len() > 50, "read {} files under {src:?}", files.len());
    let found = problems(&files, LAYERS);
    assert!(
        found.is_empty(),
        "{} layer problems (docs/architecture.md):\n{}",
        found.len(),
        found.join("\n")
    );
}

/// Lines a production file may have: past this a file holds more than one job
/// (docs/architecture.md).
const MAX_FILE_LINES: usize = 800;

/// The files outside test code longer than `max` lines, with their lengths.
fn long_files(files: &[(String, String)], max: usize) -> Vec<String> {
    let tests = test_only_files(files);
    files
        .iter()
        .filter(|(rel, _)| !tests.contains(rel))
        .map(|(rel, text)| (rel, text.lines().count()))
        .filter(|(_, n)| *n > max)
        .map(|(rel, n)| format!("{rel}: {n} lines"))
        .collect()
}

#[test]
fn no_production_file_is_longer_than_its_limit() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    read_tree(&src, &src, &mut files);
    let long = long_files(&files, MAX_FILE_LINES);
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines outside tests (split them by job):\n{}",
        long.join("\n")
    );
}

fn set(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect()
}

const TOY: &[(&str, &[&str])] = &[("low", &["a", "b"]), ("high", &["c"])];

#[test]
fn the_check_finds_a_seeded_upward_import_and_a_circle() {
    let files = set(&[
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        // upward, inside a grouped use spanning lines
        (
            "a/mod.rs",
            "mod x;\nuse crate::{\n    b::B,\n    c::C,\n};\n",
        ),
        // a circle: b -> a (a -> b above), climbing out of b with super::super
        ("b/mod.rs", "mod z;\npub struct B;\n"),
        ("b/z.rs", "\nuse super::super::a::A;\n"),
        ("c.rs", "pub struct C;\n"),
        ("a/x.rs", "pub struct A;\n"),
    ]);
    let found = problems(&files, TOY);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found[0].starts_with("upward: a/mod.rs:4: a (low) imports c (high)"),
        "{found:#?}"
    );
    assert!(
        found[1]
            .starts_with("circle between {\"a\", \"b\"}: a -> b (a/mod.rs:3); b -> a (b/z.rs:2)"),
        "{found:#?}"
    );
}

#[test]
fn the_check_skips_comments_and_test_code_but_not_unknown_modules() {
    let files = set(&[
        ("lib.rs", "pub mod a;\npub mod c;\npub mod d;\n"),
        (
            "a/mod.rs",
            "//! see [`crate::c`]\n#[cfg(test)]\nmod t;\nfn f() {}\n\n#[cfg(test)]\nmod tests {\n    \
             use crate::c::C;\n    fn g() {\n    }\n}\n",
        ),
        ("a/t.rs", "use crate::c::C;\n"),
        ("c.rs", "use crate::a::f;\n"),
        ("d.rs", ""),
    ]);
    let found = problems(&files, TOY);
    assert_eq!(
        found,
        ["module `d` is in no layer: add it to LAYERS"],
        "{found:#?}"
    );
}

#[test]
fn the_length_check_counts_production_files_only() {
    let long = "fn f() {}\n".repeat(MAX_FILE_LINES + 1);
    let files = set(&[
        ("policy.rs", "#[cfg(test)]\nmod tests;\n"),
        ("policy/tests.rs", &long),
        ("engine.rs", &long),
        ("api.rs", "fn g() {}\n"),
    ]);
    assert_eq!(
        long_files(&files, MAX_FILE_LINES),
        vec![format!("engine.rs: {} lines", MAX_FILE_LINES + 1)]
    );
}
