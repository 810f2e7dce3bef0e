"""`make demo`: prewarm end to end on loopback, with warm-up, without, and the filter alone, side by side.

This script only orchestrates processes; the replay, the figures and the charts are
`prewarm-replay`'s (examples/replay):

1. `prewarm-replay assignment` says which ServeGen adapters (and tenant tiers) the trace slice
   gets, so the stack registers exactly those;
2. each run starts the real Envoy (envoy/envoy.yaml, rewritten to free ports, with the prewarm
   filter .wasm and an `x-prewarm-upstream: %UPSTREAM_HOST%` response header), the gateway
   (static pool of 3 podsim pods, those adapters registered from real adapter directories with
   SHA-256 manifests, tenant tiers) and 3 podsim pods (latency profile, time scale) — all through
   tests/harness/stack.py; runs `prewarm-replay live` through Envoy (chat requests; `--api
   completions` for completions), which writes every request's record (`outcomes.jsonl`); when
   the replay reaches the join time, starts a 4th pod and announces it to the gateway
   (`POST /admin/pods`); prints what is warming and how far (`GET /admin/pods/pod-3/warmup`)
   and the replay's progress; after the replay, writes what it read from the stack
   (`fleet.json`: the new pod's warm-up, the gateway's prefill counter, the pods' prefix-cache
   counters). The second run is the same with warm-up disabled
   (`warmup.first_tier = second_tier = 0`). The third, "filter alone", has no gateway at all:
   the filter runs standalone (`direct_calls: always`, the 4 pods in `direct_pods`) and sends
   the prefills and adapter touches itself (its minute budgets scaled by the time scale, as the
   pods' model time is); the 4th pod joins without any warm-up;
3. `prewarm-replay report` prints the side-by-side table and writes summary.json and the charts
   under out/demo/.

Everything started is stopped by process id (also on Ctrl-C, SIGTERM and failure). `--keep` (make
demo KEEP=1) runs the baseline first and leaves the prewarm stack up, printing its URLs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from harness import bin_path  # noqa: E402
from harness.stack import BASE_MODEL, AdapterSpec, Stack, StackSpec, pod_metric  # noqa: E402
from harness.gateway import READ_TOKEN  # noqa: E402

TRACE = REPO.parent / "shared" / "traces" / "mooncake-synthetic" / "synthetic_trace.jsonl"
SERVEGEN = REPO.parent / "shared" / "traces" / "servegen-m-small"
PROFILE = "llama-8b-h100"
ADAPTER_RANK = 16
MAX_OUTPUT_TOKENS = 128  # keeps a run short; the TTFTs the demo reports do not depend on it
NEW_POD = "pod-3"
HOT_REQUESTS = 2  # the filter's `triggers.similar_prompts` in the demo: a group is hot after 2 requests
LABELS = {"prewarm": "prewarm", "no-warmup": "warm-up disabled", "filter-alone": "filter alone"}
MODES = ["prewarm", "no-warmup", "filter-alone"]
DIRECT_METRICS = ["sent", "ok", "failed", "skipped_budget", "skipped_in_flight", "skipped_backoff", "skipped_no_pod"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--until-s", type=float, default=900, help="trace slice: requests before this trace second")
    p.add_argument("--join-s", type=float, default=600, help="trace second at which the 4th pod joins")
    p.add_argument("--joins", type=int, default=1, choices=range(1, 9), metavar="{1..8}",
                   help="pods that join at --join-s (pod-3, pod-4, ...): 1, or a scale-up by several at once")
    p.add_argument("--time-scale", type=float, default=6, help="trace (and podsim model) seconds per real second")
    p.add_argument("--kv-blocks", type=int, default=524288, help="podsim KV blocks (16 tokens) per pod")
    p.add_argument("--max-loras", type=int, default=4)
    p.add_argument("--max-cpu-loras", type=int, default=8)
    p.add_argument("--out", type=Path, default=REPO / "out" / "demo")
    p.add_argument("--modes", default=",".join(MODES),
                   help=f"runs to make, comma-separated, of {', '.join(MODES)} (the report compares them)")
    p.add_argument("--api", choices=["chat", "completions"], default="chat",
                   help="what the replay sends: chat requests (the trace rendered as messages) or completions")
    p.add_argument("--keep", action="store_true", default=os.environ.get("KEEP", "") not in ("", "0"))
    return p.parse_args()


def new_pod_ids(joins: int) -> list[str]:
    """The ids of the pods that join (the spares, after the 3 the stack starts with)."""
    return [f"pod-{3 + i}" for i in range(joins)]


def replayer(*argv) -> list[str]:
    return [str(bin_path("prewarm-replay")), *[str(a) for a in argv]]


def trace_args(args) -> list:
    return ["--trace", TRACE, "--adapters", f"servegen:{SERVEGEN}", "--until-s", f"{args.until_s:g}"]


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
        if gw is None:
            direct = filter_direct_calls(self.stack)
            line = "filter alone: direct calls " + ", ".join(f"{k} {v}" for k, v in direct.items())
            if line != self.last:
                log(line)
                self.last = line
            return
        prompts = gw.get("/admin/prompts?k=1").json()
        table = self.stack.routing()
        line = f"gateway: {prompts['total']} hot prefixes; routing table gen {table['generation']}: " \
               f"{', '.join(p['id'] for p in table['pods'])}"
        joined = {p.id for p in self.stack.pods}
        for pod in new_pod_ids(len(self.stack.spares)):
            if pod not in joined:
                continue
            w = self.stack.warmup(pod)
            if w:
                def tier(t):
                    return f"{t['done']}/{t['total']}" + (f" ({t['in_flight']} in flight)" if t["in_flight"] else "") \
                        + (f" ({t['skipped']} skipped)" if t.get("skipped") else "")
                line += f" | {pod} warming: phase {w['phase']}, adapters {tier(w['adapters'])}, " \
                        f"first tier {tier(w['first_tier'])}, second tier {tier(w['second_tier'])}, " \
                        f"routable {w['routable']}"
            else:
                line += f" | {pod}: announced, waiting for its first health check"
        if line != self.last:
            log(line)
            self.last = line


def filter_direct_calls(stack: Stack) -> dict:
    """The filter's direct-call counters (`prewarm.direct.*`) in the run's Envoy."""
    return {k: stack.envoy.metric(f"prewarm.direct.{k}") for k in DIRECT_METRICS}


def fleet_observations(stack: Stack) -> dict:
    """What the report needs from the stack after a run (`fleet.json`)."""
    return {
        "new_pod_warmup": stack.warmup(NEW_POD) if stack.gateway else None,
        "gateway_prefills": stack.gateway_metric("prewarm_prefills_total") if stack.gateway else None,
        "pods": [{"pod": p.id,
                  "prefix_cache_queries": pod_metric(p, "vllm:prefix_cache_queries_total"),
                  "prefix_cache_hits": pod_metric(p, "vllm:prefix_cache_hits_total")} for p in stack.pods],
    }


def stack_spec(args, mode: str, assignment: dict) -> StackSpec:
    """The stack of one run (`mode`: prewarm, no-warmup or filter-alone)."""
    warm = mode == "prewarm"
    alone = mode == "filter-alone"
    s = args.time_scale
    return StackSpec(
        pods=3, spare_pods=args.joins,
        podsim_flags=["--time-scale", f"{s:g}", "--profile", PROFILE, "--num-gpu-blocks", str(args.kv_blocks),
                      "--max-model-len", "262144", "--max-num-seqs", "512"],
        adapters=[AdapterSpec(a["name"], tier=a["tier"], tenant=a["tenant"], rank=ADAPTER_RANK)
                  for a in assignment["adapters"]],
        max_loras=args.max_loras, max_cpu_loras=args.max_cpu_loras,
        gateway={
            "pods": {"health_interval_ms": 500, "request_timeout_ms": 120000},
            "warmup": {"first_tier": 100, "second_tier": 1000} if warm else {"first_tier": 0, "second_tier": 0},
            # the filter's 32,768-token template prefixes (4 bytes a token) fit in the pool
            "hotness": {"max_prefix_bytes": 32768 * 4},
        },
        filter_config={"max_batch_signals": 16,
                       "triggers": {"similar_prompts": HOT_REQUESTS},
                       # the budgets are per real minute: scaled, they are the same share of a
                       # pod's model-time prefill capacity as the defaults (filter-config.md)
                       **({"direct_calls_per_min": int(60 * s),
                           "direct_prefill_tokens_per_min": int(240_000 * s)} if alone else {})},
        with_gateway=not alone,
    )


def run_once(args, mode: str, assignment: dict, keep: bool) -> Stack | None:
    """One run; returns the stack when it is kept up."""
    alone = mode == "filter-alone"
    workdir = args.out / mode
    shutil.rmtree(workdir, ignore_errors=True)
    s = args.time_scale
    spec = stack_spec(args, mode, assignment)
    stack = Stack(workdir, spec)
    progress = None
    try:
        log(f"[{mode}] starting 3 podsim pods (time scale {s:g}, {args.kv_blocks} KV blocks each), "
            + ("no gateway, Envoy with the prewarm filter alone (direct_calls: always)" if alone else
               f"the gateway ({len(assignment['adapters'])} adapters registered) and Envoy with the prewarm filter"))
        stack.start()
        log(f"[{mode}] Envoy {stack.envoy.url}  gateway {stack.gateway.url if stack.gateway else 'none'}  pods "
            + ", ".join(f"{p.id}={p.address}" for p in stack.pods) + f"  (joining: {', '.join(p.address for p in stack.spares)})")
        progress = Progress(stack)
        progress.start()
        log(f"[{mode}] replaying {assignment['requests']} requests ({assignment['span_s']:.0f} s of trace) "
            f"at x{s:g}: about {assignment['span_s'] / s:.0f} s; {joining(args)} at trace {args.join_s:g}s")
        live(args, stack, workdir, api=args.api)
        (workdir / "fleet.json").write_text(json.dumps(fleet_observations(stack), indent=1))
        (workdir / "filter.json").write_text(json.dumps({"direct_calls": filter_direct_calls(stack)}, indent=1))
        return stack if keep else None
    finally:
        if progress:
            progress.stop_event.set()
        if not keep or sys.exc_info()[0] is not None:
            stack.stop()


def joining(args) -> str:
    """The pods that join, for log lines: "pod-3 joins", "pod-3, pod-4 join"."""
    ids = new_pod_ids(args.joins)
    return ", ".join(ids) + (" joins" if len(ids) == 1 else " join")


def live(args, stack: Stack, workdir: Path, api: str = "completions") -> None:
    """`prewarm-replay live --api {api}` through Envoy, its lines passed through; the new pods are
    started and announced when the replay reaches `--join-s` (timed from its `replay: started`
    line). The demo passes its `--api`; tools/bench-experiment.py keeps completions (its access-log
    count reads `/v1/completions`)."""
    new_pod = ",".join(p.address for p in stack.spares)
    argv = replayer("live", *trace_args(args), "--api", api, "--target", stack.envoy.url,
                    "--time-scale", f"{args.time_scale:g}", "--model-time",
                    "--pod-header", "x-prewarm-upstream", "--new-pods", new_pod, "--scale-at", f"{args.join_s:g}",
                    "--hot-requests", HOT_REQUESTS, "--profile", PROFILE, "--adapter-rank", ADAPTER_RANK,
                    "--max-output-tokens", MAX_OUTPUT_TOKENS, "--model", BASE_MODEL, "--concurrency", 512,
                    "--progress-every", 10, "--outcomes", workdir / "outcomes.jsonl",
                    "--json", workdir / "replay.json")

    def join():
        log(f"trace {args.join_s:g}s: starting {', '.join(new_pod_ids(args.joins))} and announcing "
            f"{'it' if args.joins == 1 else 'them'} (POST /admin/pods)")
        for i in range(len(stack.spares)):
            stack.join_spare(i)

    timer = threading.Timer(args.join_s / args.time_scale, join)
    timer.daemon = True
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = time.monotonic()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("replay: started") and not timer.is_alive():
                timer.start()
            log("prewarm-replay: " + line.rstrip())
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"prewarm-replay live exited with {proc.returncode} after {time.monotonic() - started:.0f} s")


def print_urls(stack: Stack, api: str) -> None:
    print("\nThe stack is up (KEEP=1). Ctrl-C stops it.", flush=True)
    if stack.gateway:
        print(f"  dashboard      {stack.gateway.url}/  (sign in with the read token: {READ_TOKEN})\n"
              f"  admin API      {stack.gateway.url}/admin/pods  (bearer token for mutations: {stack.gateway.token})\n"
              f"  routing table  {stack.gateway.url}/v1/routing", flush=True)
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    print(f"  Envoy          {stack.envoy.url}{path}  (admin {stack.envoy.admin_url})\n", flush=True)


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
    chosen = [m for m in args.modes.split(",") if m]
    unknown = set(chosen) - set(MODES)
    if unknown or not chosen:
        log(f"--modes: {args.modes!r}: must name runs among {', '.join(MODES)}")
        return 64
    args.out.mkdir(parents=True, exist_ok=True)
    assignment = json.loads(subprocess.run(replayer("assignment", *trace_args(args)), check=True,
                                           capture_output=True, text=True).stdout)
    tiers = [a["tier"] for a in assignment["adapters"]]
    log(f"trace: {assignment['requests']} requests, {assignment['users']} prefix groups, "
        f"{len(tiers)} ServeGen adapters ({tiers.count('gold')} gold, {tiers.count('silver')} silver)")
    modes = [m for m in MODES if m in chosen]
    if args.keep and "prewarm" in modes:  # the kept stack is the last one run
        modes = [m for m in modes if m != "prewarm"] + ["prewarm"]
    kept = None
    try:
        for mode in modes:
            kept = run_once(args, mode, assignment, keep=args.keep and mode == modes[-1])
    except KeyboardInterrupt:
        log("interrupted: everything started was stopped")
        return 130
    try:
        print()
        print(f"prewarm demo: {assignment['requests']} mooncake-synthetic {args.api} requests (trace 0-{args.until_s:g}s) "
              f"at x{args.time_scale:g}, 3 pods + {joining(args)} at {args.join_s:g}s; "
              f"times are model time ({PROFILE})", flush=True)
        modes_run = [m for m in MODES if m in modes]
        runs = [f"--run={LABELS[m]}={args.out / m}" for m in modes_run]
        subprocess.run(replayer("report", *runs, "--out", args.out), check=True)
        for m in modes_run:
            direct = json.loads((args.out / m / "filter.json").read_text())["direct_calls"]
            print(f"filter's direct calls, {LABELS[m]}: "
                  + ", ".join(f"{k} {v}" for k, v in direct.items()))
        print(f"\nJSON: {args.out / 'summary.json'}, per request: "
              + ", ".join(str(args.out / m / "outcomes.jsonl") for m in modes_run))
        print(f"charts: {args.out / 'charts' / 'ttft_p95.png'}, {args.out / 'charts' / 'token_hit_ratio.png'}")
        if kept:
            print_urls(kept, args.api)
            wait_for_ctrl_c()
    finally:
        if kept:
            kept.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
