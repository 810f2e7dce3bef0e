"""prewarm-replay live against real podsim processes: streamed completions and chat requests
(`--api`), real TTFT, prompt and cached tokens read from usage, progress lines while running, the
report's JSON keys, the new-pod window, per-request records (`--outcomes`) and
`prewarm-replay report` over them, refused flags, and `make demo`'s orchestration
(tools/demo.py) in miniature."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness import REPO, bin_path, envoy_path, filter_wasm_path
from harness.podsim import start_podsim

KEYS = {
    "token_hit_ratio",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "adapter_hit_ratio",
    "gold_adapter_hit_ratio",
    "warmup_prefill_tokens",
    "new_pod_ttft_p95_ms",
    "steady_ttft_p95_ms",
}


def write_trace(path: Path, n: int, gap_ms: int = 500) -> Path:
    """n requests with one 3-block prefix (1,536 tokens), `gap_ms` apart."""
    lines = [
        json.dumps({"timestamp": i * gap_ms, "input_length": 1536, "output_length": 3, "hash_ids": [1, 2, 3]})
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def replay(*args: str, timeout: float = 120, command: str = "live") -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(bin_path("prewarm-replay")), command, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_live_replay_measures_ttft_and_cached_tokens(tmp_path):
    pod, url = start_podsim(
        tmp_path, "--enable-prompt-tokens-details", "--time-scale", "20", name="pod-live"
    )
    try:
        trace = write_trace(tmp_path / "trace.jsonl", 8)
        out = tmp_path / "live.json"
        lines = tmp_path / "outcomes.jsonl"
        done = replay(
            "--target", url, "--api", "completions", "--trace", str(trace), "--time-scale", "4",
            "--progress-every", "0.2", "--json", str(out), "--new-pods", url,
            "--plot", str(tmp_path / "charts"), "--outcomes", str(lines),
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("replay: started: 8 requests over 4 trace seconds at x4\n")
        progress = [line for line in done.stdout.splitlines() if line.startswith("progress: sent")]
        assert len(progress) >= 2, done.stdout
        assert progress[-1].startswith("progress: sent 8 done 8 failed 0")
        report = json.loads(out.read_text())
        assert report["scenario"]["api"] == "completions"
        row = report["policies"][0]
        assert KEYS <= set(row)
        assert row["requests"] == 8 and row["failed"] == 0
        # the first request is cold, the seven others reuse 1,520 of 1,536 tokens (podsim's
        # usage.prompt_tokens_details.cached_tokens)
        assert abs(row["token_hit_ratio"] - 7 * 1520 / (8 * 1536)) < 1e-9
        assert 0 < row["ttft_p50_ms"] <= row["ttft_p95_ms"] <= row["ttft_p99_ms"]
        # no header from a bare pod: attributed to the target, which --new-pods marks new
        assert report["scenario"]["pods"] == [url]
        assert row["new_pod_requests"] == 8 and row["new_pod_ttft_p95_ms"] > 0
        assert row["adapter_hit_ratio"] is None and row["warmup_prefill_tokens"] is None
        charts = sorted(p.name for p in (tmp_path / "charts").iterdir())
        assert charts == ["token_hit_ratio.png", "ttft_p95.png"]
        assert all((tmp_path / "charts" / c).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for c in charts)
        # one record a request, in trace order, with what the report row was built from
        rows = records(lines)
        assert [r["request"] for r in rows] == list(range(8))
        assert all(r["pod"] == url and r["pod_new_since_s"] == 0.0 and r["error"] is None for r in rows)
        assert [r["cached_tokens"] for r in rows] == [0] + [1520] * 7
        assert all(r["prompt_tokens"] == 1536 and r["ttft_ms"] > 0 for r in rows)
        assert abs(sorted(r["ttft_ms"] for r in rows)[3] - row["ttft_p50_ms"]) < 1e-9
        assert all(r["adapter"] is None and r["adapter_hit"] is None for r in rows)
    finally:
        pod.stop()


def test_live_replay_bounds_requests_and_reports_failures(tmp_path):
    pod, url = start_podsim(tmp_path, "--max-model-len", "1024", name="pod-small")
    try:
        trace = write_trace(tmp_path / "trace.jsonl", 20, gap_ms=10)
        out = tmp_path / "live.json"
        lines = tmp_path / "outcomes.jsonl"
        done = replay("--target", url, "--trace", str(trace), "--max-requests", "5", "--json", str(out),
                      "--outcomes", str(lines))
        assert done.returncode == 0, done.stderr
        row = json.loads(out.read_text())["policies"][0]
        # every prompt is longer than the pod's context: the pod refuses them, the run counts them
        assert (row["requests"], row["failed"]) == (0, 5)
        assert "HTTP 400" in done.stderr
        rows = records(lines)
        assert len(rows) == 5 and all("HTTP 400" in r["error"] and r["ttft_ms"] is None for r in rows)
        # --until-s slices by trace time: requests at 0, 10, ..., 40 ms
        done = replay("--target", url, "--trace", str(trace), "--until-s", "0.045", "--outcomes", str(lines))
        assert done.returncode == 0, done.stderr
        assert [r["request"] for r in records(lines)] == [0, 1, 2, 3, 4]
    finally:
        pod.stop()


def conversation_trace(path: Path, sessions: int, turns: int, gap_ms: int = 200) -> Path:
    """`sessions` conversations of `turns` turns (agentic-sessions-shaped: each turn's block ids
    extend the previous turn's by two whole blocks), interleaved, `gap_ms` apart."""
    lines = []
    for t in range(turns):
        for s in range(sessions):
            ids = [1000 * (s + 1) + k for k in range(2 * (t + 1))]
            lines.append(json.dumps({"timestamp": (t * sessions + s) * gap_ms, "input_length": 512 * len(ids),
                                     "output_length": 4, "hash_ids": ids}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_live_replay_sends_chat_whose_turns_and_system_prompt_are_cached(tmp_path):
    """`--api chat` (the default) against a pod: every request is a chat request (its usage counts
    the chat template's tokens on top of the trace's), a conversation's later turn finds the
    earlier turn's whole prompt cached, and every session's first turn finds the shared system
    prompt cached; the records carry the usage."""
    pod, url = start_podsim(tmp_path, "--enable-prompt-tokens-details", "--time-scale", "20", name="pod-chat")
    try:
        sessions, turns = 3, 3
        trace = conversation_trace(tmp_path / "trace.jsonl", sessions, turns)
        out, lines = tmp_path / "live.json", tmp_path / "outcomes.jsonl"
        done = replay("--target", url, "--trace", str(trace), "--system-prompt-tokens", "512",
                      "--time-scale", "4", "--json", str(out), "--outcomes", str(lines))
        assert done.returncode == 0, done.stderr
        report = json.loads(out.read_text())
        assert report["scenario"]["api"] == "chat"
        assert (report["policies"][0]["requests"], report["policies"][0]["failed"]) == (sessions * turns, 0)
        rows = records(lines)
        trace_rows = [json.loads(line) for line in trace.read_text().splitlines()]
        for r, t in zip(rows, trace_rows):
            assert r["error"] is None and r["ttft_ms"] > 0
            # the pod's usage: the trace's tokens, the system prompt's and the template's
            assert r["prompt_tokens"] > t["input_length"] + 512, r
            assert 0 <= r["cached_tokens"] < r["prompt_tokens"]
        block = 16  # podsim's KV block
        for k, r in enumerate(rows):
            session, turn = k % sessions, k // sessions
            if turn == 0:
                # the identical system message: its 512 tokens (and the template's) are cached
                # for every session but the first
                assert (r["cached_tokens"] >= 512 - block) == (session > 0), (k, r)
            else:
                earlier = rows[k - sessions]
                assert r["cached_tokens"] >= (earlier["prompt_tokens"] // block - 1) * block, (k, r, earlier)
    finally:
        pod.stop()


def test_bad_flags_are_refused_with_the_flag_named(tmp_path):
    trace = write_trace(tmp_path / "trace.jsonl", 1)
    done = replay("--target", "http://127.0.0.1:9", "--trace", str(trace), "--time-scale", "0")
    assert done.returncode == 64
    assert "--time-scale: 0" in done.stderr
    done = replay("--target", "127.0.0.1:9", "--trace", str(trace))
    assert done.returncode == 64 and "--target:" in done.stderr
    done = replay("--target", "http://127.0.0.1:9", "--trace", str(trace), "--profile", "gpt-5")
    assert done.returncode == 64 and "--profile: \"gpt-5\"" in done.stderr
    done = replay("--target", "http://127.0.0.1:9", "--trace", str(trace), "--profile", "llama-8b-h100",
                  "--time-scale", "6")
    assert done.returncode == 64 and "needs --model-time" in done.stderr
    done = replay("--target", "http://127.0.0.1:9", "--trace", str(trace), "--until-s=-1")
    assert done.returncode == 64 and "--until-s: -1" in done.stderr
    done = replay("--target", "http://127.0.0.1:9", "--trace", str(trace), "--api", "responses")
    assert done.returncode == 2 and "--api" in done.stderr
    done = replay("--run", "no-label", command="report")
    assert done.returncode == 64 and "--run: \"no-label\"" in done.stderr


def test_live_replay_through_envoy_attributes_requests_to_pods(tmp_path):
    """Through the whole stack (Envoy with the filter, the gateway, two pods): each request is
    attributed to the pod Envoy names in `x-prewarm-upstream`, and templates' second requests
    reuse the first ones' cache on their pod."""
    from harness.stack import Stack, StackSpec

    lines = []
    for rnd in range(2):
        for g in range(10):
            ids = [g * 10, g * 10 + 1, g * 10 + 2]
            lines.append(json.dumps({"timestamp": rnd * 2000 + g * 50, "input_length": 1536,
                                     "output_length": 2, "hash_ids": ids}))
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    out = tmp_path / "live.json"
    run = tmp_path / "run"
    run.mkdir()
    with Stack(tmp_path / "stack", StackSpec(pods=2, podsim_flags=["--time-scale", "20"])) as stack:
        done = replay("--target", stack.envoy.url, "--api", "completions", "--trace", str(trace),
                      "--time-scale", "4", "--json", str(out), "--progress-every", "0.5",
                      "--outcomes", str(run / "outcomes.jsonl"))
        assert done.returncode == 0, done.stderr
        addresses = {p.address for p in stack.pods}
    report = json.loads(out.read_text())
    row = report["policies"][0]
    assert (row["requests"], row["failed"]) == (20, 0)
    assert set(report["scenario"]["pods"]) == addresses
    # a second request that reaches the pod of its first reuses exactly 1,520 of 1,536 tokens, and
    # every Envoy worker routes a template's two requests with the same table, so all ten hit
    templates = row["token_hit_ratio"] * 20 * 1536 / 1520
    assert abs(templates - round(templates)) < 1e-9
    assert round(templates) == 10, report
    # every record names one of the pods; a template's second request went where its first did
    rows = records(run / "outcomes.jsonl")
    assert {r["pod"] for r in rows} == addresses
    for g in range(10):
        first, second = rows[g], rows[10 + g]
        assert first["user"] == second["user"] == f"group-{g * 10}"
        assert (second["pod"] == first["pod"]) == (second["cached_tokens"] == 1520), (first, second)
    # `prewarm-replay report` rebuilds the live run's figures from its records
    summary_dir = tmp_path / "summary"
    done = replay(f"--run=through envoy={run}", "--out", str(summary_dir), command="report")
    assert done.returncode == 0, done.stderr
    assert "token hit ratio (all requests)" in done.stdout and "20 / 0" in done.stdout
    again = json.loads((summary_dir / "summary.json").read_text())["runs"][0]
    assert again["policy"] == "through envoy"
    assert (again["requests"], again["failed"]) == (row["requests"], row["failed"])
    # the same figures, up to the last bit of a float that went through JSON
    for key in ("token_hit_ratio", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms"):
        assert abs(again[key] - row[key]) <= 1e-9 * abs(row[key]), key
    assert sorted(p.name for p in (summary_dir / "charts").iterdir()) == ["token_hit_ratio.png", "ttft_p95.png"]


def test_live_chat_replay_through_envoy_keeps_conversations_on_their_pod(tmp_path):
    """`--api chat` through the whole stack (Envoy with the filter, the gateway, two pods): each
    conversation's second turn extends its first turn's messages, so the filter sends it to the
    first turn's pod, which finds the first turn's whole prompt cached; records carry the pods'
    usage (the chat template's tokens on top of the trace's)."""
    from harness.stack import Stack, StackSpec

    sessions = 8
    lines = []
    for turn in range(2):
        for s in range(sessions):
            ids = [100 * (s + 1) + k for k in range(2 + 2 * turn)]
            lines.append(json.dumps({"timestamp": turn * 2000 + s * 50, "input_length": 512 * len(ids),
                                     "output_length": 2, "hash_ids": ids}))
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    run.mkdir()
    with Stack(tmp_path / "stack", StackSpec(pods=2, podsim_flags=["--time-scale", "20"])) as stack:
        done = replay("--target", stack.envoy.url, "--api", "chat", "--trace", str(trace), "--time-scale", "4",
                      "--json", str(run / "replay.json"), "--outcomes", str(run / "outcomes.jsonl"))
        assert done.returncode == 0, done.stderr
        addresses = {p.address for p in stack.pods}
    assert json.loads((run / "replay.json").read_text())["scenario"]["api"] == "chat"
    rows = records(run / "outcomes.jsonl")
    assert len(rows) == 2 * sessions and all(r["error"] is None and r["pod"] in addresses for r in rows)
    for r, line in zip(rows, lines):
        assert r["prompt_tokens"] > json.loads(line)["input_length"], r
    block = 16  # podsim's KV block
    for s in range(sessions):
        first, second = rows[s], rows[sessions + s]
        assert first["user"] == second["user"] == f"group-{100 * (s + 1)}"
        assert second["pod"] == first["pod"], (first, second)
        assert second["cached_tokens"] >= (first["prompt_tokens"] // block - 1) * block, (first, second)


def test_demo_orchestrates_live_replays_and_reports_them(tmp_path):
    """`make demo` in miniature (2 minutes of the application workload at x20, pod-3 joining at
    40 s, pod-1 restarting at 70 s, one run a mode): the three runs replayed by `prewarm-replay
    live` through Envoy (the whole stack, or the filter alone), the joining pod announced mid-run
    and served, the restarted pod's process killed and started again on its port, and
    `prewarm-replay report` building the table and summary from the records. The filter's direct
    calls warm only where no gateway answers."""
    out = tmp_path / "demo"
    env = {**os.environ, "PREWARM_ENVOY": str(envoy_path()), "PREWARM_FILTER_WASM": str(filter_wasm_path())}
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "demo.py"), "--duration-s", "120", "--joins-at", "40",
         "--restart-at", "70", "--repeats", "1", "--time-scale", "20", "--out", str(out)],
        capture_output=True, text=True, timeout=450, env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "starting pod-3 and announcing it" in done.stdout
    assert "restarting pod-1 (process killed" in done.stdout
    assert "new-pod TTFT p50 (first 5 min)" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    runs = {r["policy"]: r for r in summary["runs"]}
    assert list(runs) == ["prewarm", "warm-up disabled", "filter alone"]
    workload = [json.loads(line) for line in (out / "workload.jsonl").read_text().splitlines()]
    for mode, label in (("prewarm", "prewarm"), ("no-warmup", "warm-up disabled"), ("filter-alone", "filter alone")):
        rows = records(out / mode / "run-1" / "outcomes.jsonl")
        run = runs[label]
        assert run["sent"] == len(rows) == len(workload), (mode, run)
        failed = [r for r in rows if r["error"] is not None]
        if mode == "filter-alone":
            # standalone, the static table names every pod in `direct_pods` whether it is up or
            # not (the spare before it starts, pod-1 while it restarts): a request sent to one
            # that is down fails to connect (Envoy's retries stay on the override host). Only
            # those, and few
            assert all("remote connection failure" in r["error"] for r in failed), failed
            assert len(failed) <= 0.05 * len(rows), len(failed)
        else:
            # with the gateway only a request on pod-1 when its process was killed can fail (a
            # reply already streaming is not retried)
            assert all(55.0 <= r["arrival_s"] <= 75.0 for r in failed), (mode, failed[:3])
        # the joined pod's requests count as new from its join, the restarted pod's from its
        # restart (and not before)
        fleet = json.loads((out / mode / "run-1" / "fleet.json").read_text())
        assert [p["pod"] for p in fleet["pods"]] == ["pod-0", "pod-1", "pod-2", "pod-3", "pod-1 before its restart"]
        since = {r["pod_new_since_s"] for r in rows if r["pod_new_since_s"] is not None}
        assert since == {40.0, 70.0}, (mode, since)
        assert all(r["arrival_s"] >= r["pod_new_since_s"] for r in rows if r["pod_new_since_s"] is not None)
        assert run["new_pod_requests"] > 0
        direct = json.loads((out / mode / "run-1" / "filter.json").read_text())["direct_calls"]
        if mode == "filter-alone":
            assert direct["ok"] > 0, direct
            assert fleet["gateway_prefills"] is None and fleet["new_pod_warmup"] is None
        else:
            assert direct["sent"] == 0, (mode, direct)
    # warm-up disabled: the gateway planned nothing for the joining or the restarted pod
    assert runs["warm-up disabled"]["warmup_prefixes"] == 0
    # the gateway saw pod-1's restart although no health check failed
    for mode in ("prewarm", "no-warmup"):
        fleet = json.loads((out / mode / "run-1" / "fleet.json").read_text())
        assert fleet["gateway_restarts"] == 1, (mode, fleet)
    assert sorted(p.name for p in (out / "charts").iterdir()) == ["token_hit_ratio.png", "ttft_p95.png"]
