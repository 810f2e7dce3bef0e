//! The status view as plain-text tables: whitespace-separated columns (every cell one word
//! except the prefix text, which is last), a title line per section.

use super::model::{PodRow, Residency, TierReply, View};

/// Characters of prefix text shown.
const TEXT_CHARS: usize = 48;

/// Left-aligned columns, two spaces apart.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                let pad = widths.get(i).copied().unwrap_or(0) - cell.chars().count();
                out.push_str(&" ".repeat(pad + 2));
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

fn or_dash(s: Option<&str>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or("-").to_string()
}

fn percent(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

fn warmup_text(pod: &PodRow) -> String {
    let Some(w) = &pod.warmup else {
        return "-".into();
    };
    let tier = |t: &TierReply| format!("{}/{}", t.finished(), t.total);
    let mut text = format!(
        "{}:adapters={},first={},second={}",
        pod.summary.warmup_phase.as_deref().unwrap_or("-"),
        tier(&w.adapters),
        tier(&w.first_tier),
        tier(&w.second_tier)
    );
    if w.lazy > 0 {
        text.push_str(&format!(",lazy={}", w.lazy));
    }
    if w.attempt > 1 {
        text.push_str(&format!(",attempt={}", w.attempt));
    }
    text
}

/// One line of printable text, at most `TEXT_CHARS` characters.
fn one_line(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let mut out: String = flat.chars().take(TEXT_CHARS).collect();
    if flat.chars().count() > TEXT_CHARS {
        out.push('…');
    }
    out
}

/// The whole view for the gateway at `url`.
pub fn render(url: &str, view: &View) -> String {
    let routed = view.pods.iter().filter(|p| p.summary.routable).count();
    let mut out = format!(
        "prewarm gateway {url}: {} pods, {routed} in the routing table, {} adapters, {} prefixes\n",
        view.pods.len(),
        view.adapters.len(),
        view.total_prefixes
    );
    out.push_str("\nPODS\n");
    out.push_str(&pods(view));
    out.push_str("\nADAPTERS x PODS (resident, loading, host, evicted, absent)\n");
    out.push_str(&residency(view));
    out.push_str("\nADAPTERS PER POD\n");
    out.push_str(&adapters_per_pod(view));
    out.push_str(&format!(
        "\nTOP PREFIXES ({} of {})\n",
        view.prefixes.len(),
        view.total_prefixes
    ));
    out.push_str(&prefixes(view));
    out
}

fn pods(view: &View) -> String {
    let rows: Vec<Vec<String>> = view
        .pods
        .iter()
        .map(|p| {
            let s = &p.summary;
            vec![
                s.id.clone(),
                s.health.clone(),
                p.state.as_str().to_string(),
                if s.routable { "yes" } else { "no" }.to_string(),
                p.progress().map_or("-".into(), percent),
                warmup_text(p),
                format!("{}/{}", s.waiting, s.running),
                percent(s.kv_usage),
                p.hit_ratio.map_or("-".into(), percent),
                s.address.clone(),
            ]
        })
        .collect();
    table(
        &[
            "POD", "HEALTH", "STATE", "TABLE", "PROGRESS", "WARM-UP", "WAIT/RUN", "KV", "HIT",
            "ADDRESS",
        ],
        &rows,
    )
}

fn residency(view: &View) -> String {
    let mut header = vec!["ADAPTER", "TIER", "PINNED", "TENANT", "HOTNESS"];
    header.extend(view.pods_in_heatmap.iter().map(String::as_str));
    let rows: Vec<Vec<String>> = view
        .adapters
        .iter()
        .map(|a| {
            let r = a.record.as_ref();
            let mut row = vec![
                a.name.clone(),
                or_dash(r.map(|r| r.tier.as_str())),
                if r.is_some_and(|r| r.pinned) {
                    "yes"
                } else {
                    "no"
                }
                .to_string(),
                or_dash(r.and_then(|r| r.tenant.as_deref())),
                format!("{:.2}", a.hotness),
            ];
            row.extend(a.cells.iter().map(|c| c.as_str().to_string()));
            row
        })
        .collect();
    table(&header, &rows)
}

/// `pod: name=residency ...` for every adapter not absent on the pod.
fn adapters_per_pod(view: &View) -> String {
    let mut out = String::new();
    for (j, pod) in view.pods_in_heatmap.iter().enumerate() {
        let held: Vec<String> = view
            .adapters
            .iter()
            .filter_map(|a| {
                let cell = a.cells.get(j)?;
                (*cell != Residency::Absent).then(|| format!("{}={}", a.name, cell.as_str()))
            })
            .collect();
        let held = if held.is_empty() {
            "-".to_string()
        } else {
            held.join(" ")
        };
        out.push_str(&format!("{pod}: {held}\n"));
    }
    out
}

fn prefixes(view: &View) -> String {
    let rows: Vec<Vec<String>> = view
        .prefixes
        .iter()
        .map(|p| {
            let q = &p.prompt;
            vec![
                q.key.clone(),
                format!("{:.2}", q.hotness),
                or_dash(q.tenant.as_deref()),
                q.model.clone(),
                q.origin.clone(),
                if p.placed_on.is_empty() {
                    "-".into()
                } else {
                    p.placed_on.join(",")
                },
                one_line(&q.preview),
            ]
        })
        .collect();
    table(
        &[
            "KEY",
            "HOTNESS",
            "TENANT",
            "MODEL",
            "ORIGIN",
            "PLACED-ON",
            "TEXT",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::{one_line, table};

    #[test]
    fn columns_are_aligned_and_the_last_is_not_padded() {
        let t = table(&["A", "BB"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "A    BB\nxyz  1\n");
    }

    #[test]
    fn prefix_text_is_one_bounded_line() {
        assert_eq!(one_line("a\nb\tc"), "a b c");
        assert_eq!(one_line(&"x".repeat(60)).chars().count(), 49);
    }
}
