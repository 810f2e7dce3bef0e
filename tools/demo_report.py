"""The demo's figures from one run's outcomes, the side-by-side table, and a small SVG chart.

Definitions (all times are model time: real time × the run's time scale):
- new-pod TTFT p50/p95: requests served by the pod that joined, arriving within `window_s` of
  trace time after it joined;
- fleet steady-state TTFT p95: every request arriving after `steady_after_s` of trace time;
- token hit ratio: Σ cached_tokens / Σ prompt_tokens over every successful request (podsim's
  `usage.prompt_tokens_details.cached_tokens`), also for the new pod's window;
- adapter hit ratio: share of adapter requests that did not pay an adapter disk load. HTTP does
  not say so; a request's TTFT beyond what its uncached tokens explain
  (`prefill_overhead + per_token × (prompt − cached)`, the latency profile) counts as a load when
  it exceeds `load_threshold_ms` (half of the profile's disk load for the adapters' rank);
- moved hot prefixes: the new pod's first request of each prefix group that was hot when the
  pod joined (at least `hot_requests` requests of the group before, the filter's streak), i.e. the
  requests a warm-up can serve warm; the rest of the new pod's traffic is mostly groups the trace
  had never sent before, which no warm-up can know;
- warm-up prefill cost: prompt tokens the gateway's prefills made the pods compute (the pods'
  uncached prefix-cache queries, `vllm:prefix_cache_queries_total − hits`, minus the clients'
  uncached tokens), and the number of prefills the gateway sent (`prewarm_prefills_total`).
"""
from __future__ import annotations

import math
from typing import Iterable, Optional


def percentile(values: list[float], p: float) -> Optional[float]:
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


def hit_ratio(outcomes: Iterable[dict]) -> Optional[float]:
    prompt = cached = 0
    for o in outcomes:
        prompt += o["prompt_tokens"]
        cached += o["cached_tokens"]
    return cached / prompt if prompt else None


def moved_hot_firsts(ok: list[dict], new: list[dict], join_s: float, hot_requests: int) -> list[dict]:
    before: dict[str, int] = {}
    for o in ok:
        if o["arrival_s"] < join_s:
            before[o["user"]] = before.get(o["user"], 0) + 1
    firsts: dict[str, dict] = {}
    for o in new:
        firsts.setdefault(o["user"], o)
    return [o for u, o in firsts.items() if before.get(u, 0) >= hot_requests]


def summarize(outcomes: list[dict], new_pod: str, join_s: float, window_s: float, steady_after_s: float,
              profile: dict, load_threshold_ms: float, hot_requests: int) -> dict:
    ok = [o for o in outcomes if o["status"] == 200 and o["ttft_ms"] is not None]
    new = [o for o in ok if o["pod"] == new_pod and join_s <= o["arrival_s"] < join_s + window_s]
    moved = moved_hot_firsts(ok, new, join_s, hot_requests)
    steady = [o for o in ok if o["arrival_s"] >= steady_after_s]
    adapter = [o for o in ok if o["adapter"]]

    def excess(o: dict) -> float:
        expected = profile["overhead_ms"] + profile["per_token_ms"] * (o["prompt_tokens"] - o["cached_tokens"])
        return o["ttft_ms"] - expected

    adapter_hits = sum(1 for o in adapter if excess(o) < load_threshold_ms)
    return {
        "requests": len(outcomes),
        "failed": len(outcomes) - len([o for o in outcomes if o["status"] == 200]),
        "new_pod_requests": len(new),
        "new_pod_ttft_p50_ms": percentile([o["ttft_ms"] for o in new], 50),
        "new_pod_ttft_p95_ms": percentile([o["ttft_ms"] for o in new], 95),
        "new_pod_token_hit_ratio": hit_ratio(new),
        "moved_hot_requests": len(moved),
        "moved_hot_ttft_p50_ms": percentile([o["ttft_ms"] for o in moved], 50),
        "moved_hot_token_hit_ratio": hit_ratio(moved),
        "fleet_steady_ttft_p95_ms": percentile([o["ttft_ms"] for o in steady], 95),
        "fleet_steady_ttft_p50_ms": percentile([o["ttft_ms"] for o in steady], 50),
        "token_hit_ratio": hit_ratio(ok),
        "adapter_hit_ratio": adapter_hits / len(adapter) if adapter else None,
    }


ROWS = [
    ("new-pod TTFT p50 (first {window} min)", "new_pod_ttft_p50_ms", "ms"),
    ("new-pod TTFT p95 (first {window} min)", "new_pod_ttft_p95_ms", "ms"),
    ("new-pod token hit ratio", "new_pod_token_hit_ratio", "ratio"),
    ("new-pod requests", "new_pod_requests", "count"),
    ("  of which first of a prefix hot at the join", "moved_hot_requests", "count"),
    ("  their TTFT p50", "moved_hot_ttft_p50_ms", "ms"),
    ("  their token hit ratio", "moved_hot_token_hit_ratio", "ratio"),
    ("fleet steady-state TTFT p50", "fleet_steady_ttft_p50_ms", "ms"),
    ("fleet steady-state TTFT p95", "fleet_steady_ttft_p95_ms", "ms"),
    ("token hit ratio (all requests)", "token_hit_ratio", "ratio"),
    ("adapter hit ratio (no disk load)", "adapter_hit_ratio", "ratio"),
    ("new-pod warm-up: prefixes prefilled", "warmup_prefixes", "count"),
    ("gateway prefills sent (all pods)", "prefills", "count"),
    ("warm-up prefill cost (tokens computed)", "warmup_prefill_computed_tokens", "count"),
    ("requests / failed", None, "requests"),
]


def _cell(summary: dict, key: Optional[str], kind: str) -> str:
    if key is None:
        return f"{summary['requests']} / {summary['failed']}"
    v = summary.get(key)
    if v is None:
        return "n/a"
    if kind == "ms":
        return f"{v:,.0f} ms"
    if kind == "ratio":
        return f"{100 * v:.1f} %"
    return f"{int(v):,}"


def table(columns: list[tuple[str, dict]], window_min: float) -> str:
    header = ["", *[name for name, _ in columns]]
    rows = [header]
    for label, key, kind in ROWS:
        rows.append([label.format(window=f"{window_min:g}"), *[_cell(s, key, kind) for _, s in columns]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for n, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def svg_chart(series: dict[str, list[tuple[float, float]]], title: str, join_s: float, y_label: str) -> str:
    """A line chart (x: trace seconds, y: value) of a few named series, as standalone SVG."""
    w, h, pad = 760, 360, 64
    xs = [x for pts in series.values() for x, _ in pts] + [join_s]
    ys = [y for pts in series.values() for _, y in pts] or [0.0, 1.0]
    x0, x1 = min(xs), max(max(xs), min(xs) + 1.0)
    y1 = max(ys) * 1.1 or 1.0

    def px(x: float) -> float:
        return pad + (x - x0) / max(x1 - x0, 1e-9) * (w - 2 * pad)

    def py(y: float) -> float:
        return h - pad - y / y1 * (h - 2 * pad)

    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
           f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
           f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">trace time (s)</text>',
           f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">{y_label}</text>',
           f'<line x1="{px(join_s)}" y1="{pad}" x2="{px(join_s)}" y2="{h - pad}" stroke="grey" stroke-dasharray="4"/>',
           f'<text x="{px(join_s) + 4}" y="{pad + 12}" fill="grey">pod joins</text>']
    for k in range(5):
        y = y1 * k / 4
        out.append(f'<text x="{pad - 4}" y="{py(y) + 4}" text-anchor="end">{y:,.{0 if y1 > 10 else 2}f}</text>')
    for k in range(6):
        x = x0 + (x1 - x0) * k / 5
        out.append(f'<text x="{px(x)}" y="{h - pad + 16}" text-anchor="middle">{x:,.0f}</text>')
    for n, (name, pts) in enumerate(series.items()):
        c = colours[n % len(colours)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{path}"/>')
        out.append(f'<text x="{w - pad - 150}" y="{pad + 16 * n + 10}" fill="{c}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out)


def bucketed_hit_ratio(outcomes: list[dict], bucket_s: float, pod: Optional[str] = None) -> list[tuple[float, float]]:
    buckets: dict[int, list[dict]] = {}
    for o in outcomes:
        if o["status"] == 200 and (pod is None or o["pod"] == pod):
            buckets.setdefault(int(o["arrival_s"] // bucket_s), []).append(o)
    return [((b + 0.5) * bucket_s, hit_ratio(v) or 0.0) for b, v in sorted(buckets.items())]


def bucketed_p95(outcomes: list[dict], bucket_s: float, pod: Optional[str] = None) -> list[tuple[float, float]]:
    buckets: dict[int, list[float]] = {}
    for o in outcomes:
        if o["status"] != 200 or o["ttft_ms"] is None or (pod and o["pod"] != pod):
            continue
        buckets.setdefault(int(o["arrival_s"] // bucket_s), []).append(o["ttft_ms"])
    return [((b + 0.5) * bucket_s, percentile(v, 95) or 0.0) for b, v in sorted(buckets.items())]
