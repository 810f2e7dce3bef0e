"""`make demo`: prewarm end to end on loopback, with warm-up and without, side by side.

Each run starts the real Envoy (envoy/envoy.yaml, rewritten to free ports, with the prewarm
filter .wasm and an `x-prewarm-upstream: %UPSTREAM_HOST%` response header), the gateway (static
pool of 3 podsim pods, the trace's ServeGen adapters registered from real adapter directories with
SHA-256 manifests, tenant tiers) and 3 podsim pods (latency profile, time scale) — all through
tests/harness/stack.py; replays a slice of `../shared/traces/mooncake-synthetic` with ServeGen
adapters through Envoy; midway starts a 4th pod and announces it to the gateway
(`POST /admin/pods`); prints what is warming and how far (`GET /admin/pods/pod-3/warmup`) and the
replay's progress while it runs. The second run is the same with warm-up disabled
(`warmup.first_tier = second_tier = 0`). Then one table (tools/demo_report.py), and the JSON and
charts under out/demo/.

The replayer: tools/demo_replay.py by default (the conventions of examples/replay, and
per-request outcomes, which the table's moved-prefix and adapter rows need); `--replayer rust`
drives `prewarm-replay live` instead, whose report has per-run figures only (those rows: n/a).

Everything started is stopped by process id (also on Ctrl-C, SIGTERM and failure). `--keep` (make
demo KEEP=1) runs the baseline first and leaves the prewarm stack up, printing its URLs.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tools"))

import demo_replay  # noqa: E402
import demo_report  # noqa: E402
from harness import bin_path  # noqa: E402
from harness.stack import BASE_MODEL, AdapterSpec, Stack, StackSpec, pod_metric  # noqa: E402
from harness.gateway import READ_TOKEN  # noqa: E402

TRACE = REPO.parent / "shared" / "traces" / "mooncake-synthetic" / "synthetic_trace.jsonl"
SERVEGEN = REPO.parent / "shared" / "traces" / "servegen-m-small"
PROFILE = {"name": "llama-8b-h100", "overhead_ms": 30.0, "per_token_ms": 0.25}
ADAPTER_RANK = 16
DISK_LOAD_MS = 40 + 5 * ADAPTER_RANK  # the profile's disk load for that rank
NEW_POD = "pod-3"
HOT_REQUESTS = 2  # the filter's `triggers.similar_prompts` in the demo: a group is hot after 2 requests


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--until-s", type=float, default=900, help="trace slice: requests before this trace second")
    p.add_argument("--join-s", type=float, default=600, help="trace second at which the 4th pod joins")
    p.add_argument("--time-scale", type=float, default=6, help="trace (and podsim model) seconds per real second")
    p.add_argument("--kv-blocks", type=int, default=524288, help="podsim KV blocks (16 tokens) per pod")
    p.add_argument("--max-loras", type=int, default=4)
    p.add_argument("--max-cpu-loras", type=int, default=8)
    p.add_argument("--out", type=Path, default=REPO / "out" / "demo")
    p.add_argument("--keep", action="store_true", default=os.environ.get("KEEP", "") not in ("", "0"))
    p.add_argument("--replayer", choices=["rust", "python"], default="python",
                   help="python: tools/demo_replay.py (per-request outcomes, the full table); "
                        "rust: prewarm-replay live")
    return p.parse_args()


class Progress(threading.Thread):
    """Prints, every few seconds, the new pod's warm-up (phase, adapters, tiers) as the gateway's
    `GET /admin/pods/{id}/warmup` reports it, and the pool's hottest-prefix count."""

    def __init__(self, stack: Stack, every_s: float = 3.0):
        super().__init__(daemon=True)
        self.stack, self.every_s = stack, every_s
        self.stop_event = threading.Event()
        self.last = ""

    def run(self) -> None:
        while not self.stop_event.wait(self.every_s):
            try:
                self.report()
            except Exception as e:  # noqa: BLE001 - progress is best effort
                log(f"progress: {e!r}")

    def report(self) -> None:
        gw = self.stack.gateway
        prompts = gw.get("/admin/prompts?k=1").json()
        table = self.stack.routing()
        line = f"gateway: {prompts['total']} hot prefixes; routing table gen {table['generation']}: " \
               f"{', '.join(p['id'] for p in table['pods'])}"
        if any(p.id == NEW_POD for p in self.stack.pods):
            w = self.stack.warmup(NEW_POD)
            if w:
                def tier(t):
                    return f"{t['done']}/{t['total']}" + (f" ({t['in_flight']} in flight)" if t["in_flight"] else "") \
                        + (f" ({t['skipped']} skipped)" if t.get("skipped") else "")
                line += f" | {NEW_POD} warming: phase {w['phase']}, adapters {tier(w['adapters'])}, " \
                        f"first tier {tier(w['first_tier'])}, second tier {tier(w['second_tier'])}, " \
                        f"routable {w['routable']}"
            else:
                line += f" | {NEW_POD}: announced, waiting for its first health check"
        if line != self.last:
            log(line)
            self.last = line


def pod_counters(stack: Stack) -> dict:
    """Prefix-cache token counters (`vllm:prefix_cache_{queries,hits}_total`) summed over the pods."""
    total = {"queries": 0.0, "hits": 0.0}
    for pod in stack.pods:
        total["queries"] += pod_metric(pod, "vllm:prefix_cache_queries_total")
        total["hits"] += pod_metric(pod, "vllm:prefix_cache_hits_total")
    return total


def run_once(args, mode: str, trace, tiers: dict, keep: bool) -> dict:
    warm = mode == "prewarm"
    workdir = args.out / mode
    shutil.rmtree(workdir, ignore_errors=True)
    s = args.time_scale
    spec = StackSpec(
        pods=3, spare_pods=1,
        podsim_flags=["--time-scale", f"{s:g}", "--profile", PROFILE["name"], "--num-gpu-blocks", str(args.kv_blocks),
                      "--max-model-len", "262144", "--max-num-seqs", "512"],
        adapters=[AdapterSpec(name, tier=tier, rank=ADAPTER_RANK) for name, tier in sorted(tiers.items())],
        max_loras=args.max_loras, max_cpu_loras=args.max_cpu_loras,
        gateway={
            "pods": {"health_interval_ms": 500, "request_timeout_ms": 120000},
            "warmup": {"first_tier": 100, "second_tier": 1000} if warm else {"first_tier": 0, "second_tier": 0},
            # the filter's 32,768-token template prefixes (4 bytes a token) fit in the pool
            "hotness": {"max_prefix_bytes": 32768 * 4},
        },
        filter_config={"max_batch_signals": 16,
                       "triggers": {"similar_prompts": HOT_REQUESTS}},
    )
    stack = Stack(workdir, spec)
    progress = None
    try:
        log(f"[{mode}] starting 3 podsim pods (time scale {s:g}, {args.kv_blocks} KV blocks each), "
            f"the gateway ({len(tiers)} adapters registered) and Envoy with the prewarm filter")
        stack.start()
        log(f"[{mode}] Envoy {stack.envoy.url}  gateway {stack.gateway.url}  pods "
            + ", ".join(f"{p.id}={p.address}" for p in stack.pods) + f"  (spare {stack.spares[0].address})")
        progress = Progress(stack)
        progress.start()

        def join():
            log(f"[{mode}] trace {args.join_s:g}s: starting {NEW_POD} and announcing it (POST /admin/pods)")
            stack.join_spare(0)

        real_s = trace[-1].timestamp_ms / 1000 / s
        log(f"[{mode}] replaying {len(trace)} requests ({trace[-1].timestamp_ms / 1000:.0f} s of trace) "
            f"at x{s:g}: about {real_s:.0f} s; {NEW_POD} joins at trace {args.join_s:g}s")
        json_path = workdir / "replay.json"
        if args.replayer == "rust":
            summary = rust_live(args, stack, trace, json_path, join)
        else:
            results = demo_replay.replay(stack.envoy.url, trace, BASE_MODEL, s,
                                         on_progress=log, events=[(args.join_s, join)])
            outcomes = demo_replay.outcomes_json(results)
            summary = demo_report.summarize(
                outcomes, stack.pod(NEW_POD).address, args.join_s, args.until_s - args.join_s,
                args.until_s * 0.25, PROFILE, DISK_LOAD_MS / 2, HOT_REQUESTS)
            for o in outcomes:
                o["pod"] = pod_name(stack, o["pod"])
        if args.replayer == "python":
            counters = pod_counters(stack)
            client_uncached = sum(o["prompt_tokens"] - o["cached_tokens"] for o in outcomes)
            summary["warmup_prefill_computed_tokens"] = max(0, int(counters["queries"] - counters["hits"] - client_uncached))
        summary["warmup"] = warmup = stack.warmup(NEW_POD)
        summary["warmup_prefixes"] = sum(warmup[t]["done"] for t in ("first_tier", "second_tier")) if warmup else 0
        summary["prefills"] = stack.gateway_metric("prewarm_prefills_total")
        if args.replayer == "python":
            json_path.write_text(json.dumps({"mode": mode, "summary": summary, "outcomes": outcomes}, indent=1))
        summary["json"] = str(json_path)
        kept = stack if keep else None
        return {"summary": summary, "outcomes": outcomes if args.replayer != "rust" else [], "stack": kept}
    finally:
        if progress:
            progress.stop_event.set()
        if not keep or sys.exc_info()[0] is not None:
            stack.stop()


def pod_name(stack: Stack, address: str) -> str:
    pod = stack.pod_by_address(address)
    return pod.id if pod else address


def rust_live(args, stack: Stack, trace, json_path: Path, join) -> dict:
    """`prewarm-replay live` through Envoy; its progress lines are passed through, its JSON
    report and PNG charts land next to this run's files. Its report has per-run figures only
    (no per-request outcomes): the rows that need them show n/a."""
    plot_dir = json_path.parent / "charts"
    new_pod = stack.spares[0].address
    argv = [bin_path("prewarm-replay"), "live", "--trace", TRACE, "--adapters", f"servegen:{SERVEGEN}",
            "--max-requests", str(len(trace)), "--target", stack.envoy.url, "--time-scale", f"{args.time_scale:g}",
            "--pod-header", "x-prewarm-upstream", "--new-pods", new_pod, "--model", BASE_MODEL, "--concurrency", "512",
            "--json", json_path, "--plot", plot_dir]
    proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = time.monotonic()
    timer = threading.Timer(args.join_s / args.time_scale, join)
    timer.daemon = True
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log("prewarm-replay: " + line.rstrip())
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise RuntimeError(f"prewarm-replay live exited with {proc.returncode} after {time.monotonic() - started:.0f} s")
    row = (json.loads(json_path.read_text()).get("policies") or [{}])[0]
    return {"requests": row.get("requests", 0), "failed": row.get("failed", 0),
            "new_pod_requests": row.get("new_pod_requests"), "new_pod_ttft_p95_ms": row.get("new_pod_ttft_p95_ms"),
            "new_pod_token_hit_ratio": row.get("new_pod_token_hit_ratio"),
            "fleet_steady_ttft_p95_ms": row.get("steady_ttft_p95_ms"), "token_hit_ratio": row.get("token_hit_ratio"),
            "adapter_hit_ratio": row.get("adapter_hit_ratio")}


def print_urls(stack: Stack) -> None:
    print(f"\nThe prewarm stack is up (KEEP=1). Ctrl-C stops it.\n"
          f"  dashboard      {stack.gateway.url}/  (sign in with the read token: {READ_TOKEN})\n"
          f"  admin API      {stack.gateway.url}/admin/pods  (bearer token for mutations: {stack.gateway.token})\n"
          f"  routing table  {stack.gateway.url}/v1/routing\n"
          f"  Envoy          {stack.envoy.url}/v1/completions  (admin {stack.envoy.admin_url})\n", flush=True)


def wait_for_ctrl_c() -> None:
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


def main() -> int:
    args = parse_args()
    # Ctrl-C even when started with SIGINT ignored (a background job), and SIGTERM alike.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    args.out.mkdir(parents=True, exist_ok=True)
    trace = demo_replay.load_trace(TRACE, args.until_s)
    tiers = demo_replay.assign_adapters(trace, SERVEGEN)
    if args.replayer == "rust":
        # prewarm-replay draws its own assignment: serve every ServeGen customer's adapter
        names, _ = demo_replay.read_servegen(SERVEGEN)
        tiers = {name: tiers.get(name, "bronze") for name in names}
    log(f"trace: {len(trace)} requests, {len({r.user for r in trace})} prefix groups, "
        f"{len(tiers)} ServeGen adapters ({sum(t == 'gold' for t in tiers.values())} gold, "
        f"{sum(t == 'silver' for t in tiers.values())} silver)")
    modes = ["no-warmup", "prewarm"] if args.keep else ["prewarm", "no-warmup"]
    runs = {}
    try:
        for mode in modes:
            runs[mode] = run_once(args, mode, trace, tiers, keep=args.keep and mode == modes[-1])
    except KeyboardInterrupt:
        log("interrupted: everything started was stopped")
        return 130
    kept = runs[modes[-1]].get("stack")
    try:
        window_min = (args.until_s - args.join_s) / 60
        text = demo_report.table([("prewarm", runs["prewarm"]["summary"]),
                                  ("warm-up disabled", runs["no-warmup"]["summary"])], window_min)
        charts = args.out / "charts"
        charts.mkdir(exist_ok=True)
        series = {f"{m} {scope}": demo_report.bucketed_p95(runs[m]["outcomes"], 30, pod)
                  for m in ("prewarm", "no-warmup") for scope, pod in (("new pod", NEW_POD),)}
        (charts / "new-pod-ttft-p95.svg").write_text(demo_report.svg_chart(
            series, "new pod TTFT p95 per 30 s (model ms)", args.join_s, "TTFT p95 (ms)"))
        fleet = {f"{m} fleet": demo_report.bucketed_p95(runs[m]["outcomes"], 30) for m in ("prewarm", "no-warmup")}
        (charts / "fleet-ttft-p95.svg").write_text(demo_report.svg_chart(
            fleet, "fleet TTFT p95 per 30 s (model ms)", args.join_s, "TTFT p95 (ms)"))
        hits = {f"{m} new pod": demo_report.bucketed_hit_ratio(runs[m]["outcomes"], 30, NEW_POD)
                for m in ("prewarm", "no-warmup")}
        (charts / "new-pod-token-hit-ratio.svg").write_text(demo_report.svg_chart(
            hits, "new pod token hit ratio per 30 s", args.join_s, "cached / prompt tokens"))
        summary_path = args.out / "summary.json"
        summary_path.write_text(json.dumps({m: r["summary"] for m, r in runs.items()}, indent=2))
        print()
        print(f"prewarm demo: {len(trace)} mooncake-synthetic requests (trace 0-{args.until_s:g}s) at x{args.time_scale:g}, "
              f"3 pods + {NEW_POD} joining at {args.join_s:g}s; times are model time ({PROFILE['name']})")
        print(text)
        print(f"\nJSON: {summary_path}, {runs['prewarm']['summary']['json']}, {runs['no-warmup']['summary']['json']}")
        print(f"charts: {charts}/new-pod-token-hit-ratio.svg, {charts}/new-pod-ttft-p95.svg, "
              f"{charts}/fleet-ttft-p95.svg")
        if kept:
            print_urls(kept)
            wait_for_ctrl_c()
    finally:
        if kept:
            kept.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
