"""`make demo`: prewarm end to end on loopback through an autoscale, with warm-up, without, and the filter alone, side by side.

This script only orchestrates processes; the workload, the replay, the figures and the charts are
`prewarm-replay`'s (examples/replay):

1. `prewarm-replay workload` writes the application workload (docs/workload.md: ServeGen
   customers as applications with their own system prompts and tools, conversations of one to a
   few turns, some on LoRA adapters with gold/silver/bronze tenants, some clients without a
   `user`), and `prewarm-replay assignment` says which adapters (and tenant tiers) it has, so
   the stack registers exactly those;
2. each run starts the real Envoy (envoy/envoy.yaml, rewritten to free ports, with the prewarm
   filter .wasm and an `x-prewarm-upstream: %UPSTREAM_HOST%` response header), the gateway
   (static pool of 3 podsim pods, the adapters registered from real adapter directories with
   SHA-256 manifests, tenant tiers) and 3 podsim pods with the KV cache an 8B model has on one
   H100 (`llama-8b-h100`: 26,624 blocks, 426 k tokens) — all through tests/harness/stack.py —
   and runs `prewarm-replay live` through Envoy (chat requests). The fleet scales up as an
   autoscaler would: at each `--joins-at` second one more pod starts and is announced to the
   gateway (`POST /admin/pods`); at `--restart-at` pod-1's process is killed and started again
   on its port, cold, faster than a health check can see it down (a container restarted in
   place). It prints what is warming and how far (`GET /admin/pods/{id}/warmup`) and the
   replay's progress; after the replay, writes what it read from the stack (`fleet.json`: the
   joining and restarted pods' warm-ups, the gateway's prefill counter, the pods' prefix-cache
   counters). The second mode is the same with warm-up disabled (`warmup.first_tier =
   second_tier = 0`). The third, "filter alone", has no gateway at all: the filter runs
   standalone (`direct_calls: always`, every pod in `direct_pods`) and sends the prefills and
   adapter touches itself (its minute budgets scaled by the time scale, as the pods' model time
   is); the joining and restarted pods get no warm-up. Each mode runs `--repeats` times (3);
3. `prewarm-replay report` prints the side-by-side table (one column per mode: the median of its
   runs and their range) and writes summary.json and the charts under out/demo/.

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
from demo_outage import GATEWAY_LOG, Outage, OutageSpec, RunWatch, summarize as outage_summary  # noqa: E402

PROFILE = "llama-8b-h100"
PREFILL_US_PER_TOKEN = 250.0  # the profile's (examples/podsim/src/profile.rs)
ADAPTER_RANK = 16
MAX_OUTPUT_TOKENS = 128  # keeps a run short; the TTFTs the demo reports do not depend on it
RESTARTED_POD = 1  # the pod the demo restarts (pod-1)
HOT_REQUESTS = 2  # the filter's `triggers.similar_prompts` in the demo: a group is hot after 2 requests
LABELS = {"prewarm": "prewarm", "no-warmup": "warm-up disabled", "filter-alone": "filter alone"}
MODES = ["prewarm", "no-warmup", "filter-alone"]
DIRECT_METRICS = ["sent", "ok", "failed", "skipped_budget", "skipped_in_flight", "skipped_backoff", "skipped_no_pod"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--duration-s", type=float, default=900, help="seconds of workload (prewarm-replay workload)")
    p.add_argument("--rps", type=float, default=4, help="the workload's mean requests per second")
    p.add_argument("--seed", type=int, default=1, help="the workload's seed")
    p.add_argument("--joins-at", default="240,420",
                   help="trace seconds at which one more pod joins (pod-3, pod-4, ...), comma-separated")
    p.add_argument("--restart-at", type=float, default=540,
                   help=f"trace second at which pod-{RESTARTED_POD} restarts (negative: none)")
    p.add_argument("--repeats", type=int, default=3, choices=range(1, 5), metavar="{1..4}",
                   help="runs of each mode (the table shows their median and range)")
    p.add_argument("--time-scale", type=float, default=10, help="trace (and podsim model) seconds per real second")
    p.add_argument("--kv-blocks", type=int, default=None,
                   help="podsim KV blocks (16 tokens) per pod (default: the profile's, 26,624 for an 8B model on one H100)")
    p.add_argument("--max-loras", type=int, default=4)
    p.add_argument("--max-cpu-loras", type=int, default=8)
    p.add_argument("--out", type=Path, default=REPO / "out" / "demo")
    p.add_argument("--modes", default=",".join(MODES),
                   help=f"runs to make, comma-separated, of {', '.join(MODES)} (the report compares them)")
    p.add_argument("--keep", action="store_true", default=os.environ.get("KEEP", "") not in ("", "0"))
    p.add_argument("--gateway-outage", default=None, metavar="START:SECONDS",
                   help="also run each mode with a gateway with the gateway SIGKILLed at trace second START and "
                        "started again (same port, same state dir) after SECONDS of real time, and compare "
                        "(docs/demo.md, \"Gateway outage\"); e.g. 400:60")
    args = p.parse_args()
    try:
        args.outage = OutageSpec.parse(args.gateway_outage) if args.gateway_outage else None
    except ValueError as e:
        p.error(str(e))
    if args.outage and args.outage.restart_trace_s(args.time_scale) >= args.duration_s:
        p.error(f"--gateway-outage: {args.gateway_outage}: the restart falls at trace second "
                f"{args.outage.restart_trace_s(args.time_scale):g} (SECONDS is real time, x{args.time_scale:g}), "
                f"at or past the workload's end ({args.duration_s:g} s): nothing would measure the recovery")
    return args


OUTAGE_SUFFIX = "-outage"


def base_mode(kind: str) -> str:
    """The mode of a run kind (`prewarm-outage` is `prewarm` with the gateway outage)."""
    return kind.removesuffix(OUTAGE_SUFFIX)


def label(kind: str) -> str:
    return LABELS[base_mode(kind)] + (", gateway outage" if kind.endswith(OUTAGE_SUFFIX) else "")


def run_kinds(args, modes: list[str]) -> list[str]:
    """The runs of one repeat: each mode, and with `--gateway-outage` each mode with a gateway
    again with the outage, right after it."""
    kinds = []
    for m in modes:
        kinds.append(m)
        if args.outage and m != "filter-alone":
            kinds.append(m + OUTAGE_SUFFIX)
    return kinds


def joins_at(args) -> list[float]:
    """The trace seconds at which a pod joins, in order."""
    return sorted(float(t) for t in args.joins_at.split(",") if t.strip())


def new_pod_ids(joins: int) -> list[str]:
    """The ids of the pods that join (the spares, after the 3 the stack starts with)."""
    return [f"pod-{3 + i}" for i in range(joins)]


def event_pod_ids(args) -> list[str]:
    """The pods that join or restart: their warm-ups are what the demo is about."""
    restarted = [f"pod-{RESTARTED_POD}"] if args.restart_at >= 0 else []
    return new_pod_ids(len(joins_at(args))) + restarted


def replayer(*argv) -> list[str]:
    return [str(bin_path("prewarm-replay")), *[str(a) for a in argv]]


def trace_args(args) -> list:
    return ["--trace", args.out / "workload.jsonl"]


class Progress(threading.Thread):
    """Prints, every few seconds, the joining and restarted pods' warm-ups (phase, adapters, tiers)
    as the gateway's `GET /admin/pods/{id}/warmup` reports them, and the pool's hot-prefix count."""

    def __init__(self, stack: Stack, watched: list[str], every_s: float = 3.0, watch: RunWatch | None = None):
        super().__init__(daemon=True)
        self.stack, self.watched, self.every_s, self.watch = stack, watched, every_s, watch
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
        if self.watch and self.watch.down:
            f = self.watch.samples[-1]["filter"] if self.watch.samples else {}
            line = (f"gateway down: the filter's table is {f.get('table_age_seconds', '?')} s old, direct calls "
                    f"{'on' if f.get('direct_active') else 'off'} (sent {f.get('direct_sent_total', 0)}, "
                    f"ok {f.get('direct_ok_total', 0)}), signals dropped {f.get('signals_dropped_total', 0)}")
            if line != self.last:
                log(line)
                self.last = line
            return
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
        for pod in self.watched:
            if pod not in joined:
                continue
            w = self.stack.warmup(pod)
            if w and w.get("phase") != "done":
                def tier(t):
                    return f"{t['done']}/{t['total']}" + (f" ({t['in_flight']} in flight)" if t["in_flight"] else "") \
                        + (f" ({t['skipped']} skipped)" if t.get("skipped") else "")
                line += f" | {pod} warming: phase {w['phase']}, adapters {tier(w['adapters'])}, " \
                        f"first tier {tier(w['first_tier'])}, second tier {tier(w['second_tier'])}, " \
                        f"routable {w['routable']}"
            elif not w:
                line += f" | {pod}: announced, waiting for its first health check"
        if line != self.last:
            log(line)
            self.last = line


def filter_direct_calls(stack: Stack) -> dict:
    """The filter's direct-call counters (`prewarm_filter_direct_*_total`) in the run's Envoy."""
    return {k: (stack.envoy.metric("prewarm_filter_direct_skipped_total", reason=k.removeprefix("skipped_"))
                if k.startswith("skipped_") else stack.envoy.metric(f"prewarm_filter_direct_{k}_total"))
            for k in DIRECT_METRICS}


def summed_warmups(stack: Stack, pods: list[str]) -> dict | None:
    """The joining and restarted pods' warm-ups, summed step by step (`null` without a gateway);
    the phase lists each pod's."""
    if not stack.gateway:
        return None
    warmups = [(p, stack.warmup(p)) for p in pods]
    steps = ("adapters", "first_tier", "second_tier")
    total = {s: {"done": sum((w or {}).get(s, {}).get("done", 0) for _, w in warmups),
                 "total": sum((w or {}).get(s, {}).get("total", 0) for _, w in warmups)} for s in steps}
    return {"phase": ", ".join(f"{p} {(w or {}).get('phase', 'none')}" for p, w in warmups), **total}


def pod_counters(pod, name: str | None = None) -> dict:
    """A pod's prefix-cache token counters, as `fleet.json` lists them."""
    return {"pod": name or pod.id,
            "prefix_cache_queries": pod_metric(pod, "vllm:prefix_cache_queries_total"),
            "prefix_cache_hits": pod_metric(pod, "vllm:prefix_cache_hits_total")}


def fleet_observations(stack: Stack, pods: list[str], lost: list[dict] = ()) -> dict:
    """What the report needs from the stack after a run (`fleet.json`); `lost`: the counters of
    pods' lives before a restart (read just before it), which the pods' counters no longer hold."""
    return {
        "new_pod_warmup": summed_warmups(stack, pods),
        "gateway_prefills": stack.gateway_metric("prewarm_prefills_total") if stack.gateway else None,
        "gateway_restarts": stack.gateway_metric("prewarm_pod_restarts_total") if stack.gateway else None,
        "pods": [pod_counters(p) for p in stack.pods] + list(lost),
    }


def stack_spec(args, mode: str, assignment: dict, spares: int) -> StackSpec:
    """The stack of one run (`mode`: prewarm, no-warmup or filter-alone) with `spares` pods to join."""
    warm = mode == "prewarm"
    alone = mode == "filter-alone"
    s = args.time_scale
    return StackSpec(
        pods=3, spare_pods=spares,
        podsim_flags=["--time-scale", f"{s:g}", "--profile", PROFILE, "--max-model-len", "262144",
                      "--max-num-seqs", "512", *(["--num-gpu-blocks", str(args.kv_blocks)] if args.kv_blocks else [])],
        adapters=[AdapterSpec(a["name"], tier=a["tier"], tenant=a["tenant"], rank=ADAPTER_RANK)
                  for a in assignment["adapters"]],
        max_loras=args.max_loras, max_cpu_loras=args.max_cpu_loras,
        gateway={
            "pods": {"health_interval_ms": 500, "request_timeout_ms": 120000},
            "warmup": {"first_tier": 100, "second_tier": 1000} if warm else {"first_tier": 0, "second_tier": 0},
            # the filter's 32,768-token template prefixes (4 bytes a token) fit in the pool
            "hotness": {"max_prefix_bytes": 32768 * 4},
            # the move's price in real time, as the waits are measured: the profile's 250 µs a
            # token of model time, time-scaled (docs/routing.md)
            "routing": {"prefill_us_per_token": PREFILL_US_PER_TOKEN / s},
        },
        filter_config={"max_batch_signals": 16,
                       "triggers": {"similar_prompts": HOT_REQUESTS},
                       # the budgets are per real minute: scaled, they are the same share of a
                       # pod's model-time prefill capacity as the defaults (filter-config.md)
                       # (with --gateway-outage, the filter's takeover spends them too)
                       **({"direct_calls_per_min": int(60 * s),
                           "direct_prefill_tokens_per_min": int(240_000 * s)} if alone or args.outage else {})},
        with_gateway=not alone,
        **({"gateway_log": GATEWAY_LOG} if args.outage else {}),
    )


def run_once(args, kind: str, repeat: int, assignment: dict, keep: bool) -> Stack | None:
    """One run of `kind` (a mode, or a mode with the gateway outage; its `repeat`-th); returns the
    stack when it is kept up."""
    mode = base_mode(kind)
    alone = mode == "filter-alone"
    outage = kind.endswith(OUTAGE_SUFFIX)
    workdir = run_dir(args, kind, repeat)
    shutil.rmtree(workdir, ignore_errors=True)
    s = args.time_scale
    spec = stack_spec(args, mode, assignment, len(joins_at(args)))
    stack = Stack(workdir, spec)
    progress = None
    watch = None
    blocks = f"{args.kv_blocks} KV blocks each" if args.kv_blocks else f"{PROFILE}'s KV cache each"
    try:
        log(f"[{kind} #{repeat}] starting 3 podsim pods (time scale {s:g}, {blocks}), "
            + ("no gateway, Envoy with the prewarm filter alone (direct_calls: always)" if alone else
               f"the gateway ({len(assignment['adapters'])} adapters registered) and Envoy with the prewarm filter"))
        stack.start()
        log(f"[{kind} #{repeat}] Envoy {stack.envoy.url}  gateway {stack.gateway.url if stack.gateway else 'none'}  pods "
            + ", ".join(f"{p.id}={p.address}" for p in stack.pods) + f"  (joining: {', '.join(p.address for p in stack.spares)})")
        if args.outage and not alone:
            watch = Outage(stack, workdir, log, args.outage, s) if outage else RunWatch(stack, workdir, log)
        watched = event_pod_ids(args) + ([p.id for p in stack.pods] if outage else [])
        progress = Progress(stack, watched, watch=watch)
        progress.start()
        log(f"[{kind} #{repeat}] replaying {assignment['requests']} requests ({assignment['span_s']:.0f} s of workload) "
            f"at x{s:g}: about {assignment['span_s'] / s:.0f} s; {story(args, outage)}")
        lost = live(args, stack, workdir, trace_args(args), list(zip(joins_at(args), range(len(stack.spares)))),
                    args.restart_at if args.restart_at >= 0 else None, watch=watch)
        observed = fleet_observations(stack, event_pod_ids(args), lost)
        if watch:
            watch.finish()
            if outage:
                # the killed process's prefills, which the restarted one does not count
                observed["gateway_prefills"] += watch.before.get("prefills", 0)
        (workdir / "fleet.json").write_text(json.dumps(observed, indent=1))
        (workdir / "filter.json").write_text(json.dumps({"direct_calls": filter_direct_calls(stack)}, indent=1))
        return stack if keep else None
    finally:
        if progress:
            progress.stop_event.set()
        if not keep or sys.exc_info()[0] is not None:
            stack.stop()


def run_dir(args, mode: str, repeat: int) -> Path:
    return args.out / mode / f"run-{repeat}"


def story(args, outage: bool = False) -> str:
    """The fleet's events, for log lines."""
    joins = [f"{pod} joins at {t:g}s" for pod, t in zip(new_pod_ids(len(joins_at(args))), joins_at(args))]
    restart = [f"pod-{RESTARTED_POD} restarts at {args.restart_at:g}s"] if args.restart_at >= 0 else []
    gateway = [args.outage.describe(args.time_scale)] if outage and args.outage else []
    return ", ".join(joins + restart + gateway) or "no fleet events"


def live(args, stack: Stack, workdir: Path, trace: list, joins: list[tuple[float, int]],
         restart_at: float | None = None, api: str = "chat", watch: RunWatch | None = None) -> list[dict]:
    """`prewarm-replay live --api {api}` of `trace` through Envoy, its lines passed through; at each
    fleet event's trace second (timed from the replay's `replay: started` line) spare pod `i` of
    `joins` (`(second, i)`) is started and announced, or, at `restart_at`, pod-{RESTARTED_POD}'s
    process killed and started again on its port. The replayer is told each event's pod and time
    (`--pod-event`), so a pod's requests count as new from its latest join or restart. Returns
    the restarted pod's counters read just before its restart (its life the pod's counters lose).
    `watch` (`--gateway-outage`): the run's timeline and marks, started with the replay; an
    `Outage` also kills and restarts the gateway, and takes the joins while it is down.
    tools/bench-experiment.py replays completions of its own trace slice through it."""
    lost: list[dict] = []
    restarted = stack.pods[RESTARTED_POD] if restart_at is not None else None
    events = [f"{stack.spares[i].address}@{t:g}" for t, i in joins]
    if restarted:
        events.append(f"{restarted.address}@{restart_at:g}")
    argv = replayer("live", *trace, "--api", api, "--target", stack.envoy.url,
                    "--time-scale", f"{args.time_scale:g}", "--model-time",
                    "--pod-header", "x-prewarm-upstream", *[f"--pod-event={e}" for e in events],
                    "--hot-requests", HOT_REQUESTS, "--profile", PROFILE, "--adapter-rank", ADAPTER_RANK,
                    "--max-output-tokens", MAX_OUTPUT_TOKENS, "--model", BASE_MODEL, "--concurrency", 512,
                    "--progress-every", 10, "--outcomes", workdir / "outcomes.jsonl",
                    "--json", workdir / "replay.json")

    def join(i: int, t: float):
        def go():
            log(f"trace {t:g}s: starting pod-{3 + i} and announcing it (POST /admin/pods)")
            if watch:
                watch.join_pod(i)
            else:
                stack.join_spare(i)
        return go

    def restart():
        assert restarted is not None and restarted.process is not None
        log(f"trace {restart_at:g}s: restarting {restarted.id} (process killed, started again on {restarted.address})")
        lost.append(pod_counters(restarted, f"{restarted.id} before its restart"))
        restarted.process.kill()
        stack.restart_pod(restarted)

    timers = [threading.Timer(t / args.time_scale, join(i, t)) for t, i in joins]
    if restarted:
        timers.append(threading.Timer(restart_at / args.time_scale, restart))
    if watch:
        timers += watch.timers(args.outage, args.time_scale)
    for t in timers:
        t.daemon = True
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = time.monotonic()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("replay: started"):
                if watch:
                    watch.began()
                for t in timers:
                    if not t.is_alive() and not t.finished.is_set():
                        t.start()
            log("prewarm-replay: " + line.rstrip())
        proc.wait()
    finally:
        for t in timers:
            t.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"prewarm-replay live exited with {proc.returncode} after {time.monotonic() - started:.0f} s")
    return lost


def print_urls(stack: Stack) -> None:
    print("\nThe stack is up (KEEP=1). Ctrl-C stops it.", flush=True)
    if stack.gateway:
        print(f"  dashboard      {stack.gateway.url}/  (sign in with the read token: {READ_TOKEN})\n"
              f"  admin API      {stack.gateway.url}/admin/pods  (bearer token for mutations: {stack.gateway.token})\n"
              f"  routing table  {stack.gateway.url}/v1/routing", flush=True)
    print(f"  Envoy          {stack.envoy.url}/v1/chat/completions  (admin {stack.envoy.admin_url})\n", flush=True)


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
    workload = json.loads(subprocess.run(
        replayer("workload", "--out", args.out / "workload.jsonl", "--duration-s", f"{args.duration_s:g}",
                 "--rps", f"{args.rps:g}", "--seed", args.seed), check=True, capture_output=True, text=True).stdout)
    assignment = json.loads(subprocess.run(replayer("assignment", *trace_args(args)), check=True,
                                           capture_output=True, text=True).stdout)
    tiers = [a["tier"] for a in assignment["adapters"]]
    log(f"workload (docs/workload.md, seed {args.seed}): {assignment['requests']} chat requests over "
        f"{args.duration_s:g} s, {workload.get('applications_with_requests', '?')} applications with requests, "
        f"{assignment['users']} users, {len(tiers)} adapters ({tiers.count('gold')} gold, {tiers.count('silver')} silver)")
    modes = [m for m in MODES if m in chosen]
    if args.keep and "prewarm" in modes:  # the kept stack is the last one run
        modes = [m for m in modes if m != "prewarm"] + ["prewarm"]
    kept = None
    try:
        for repeat in range(1, args.repeats + 1):
            kinds = run_kinds(args, modes)
            for kind in kinds:
                last = kind == kinds[-1] and repeat == args.repeats
                kept = run_once(args, kind, repeat, assignment, keep=args.keep and last)
    except KeyboardInterrupt:
        log("interrupted: everything started was stopped")
        return 130
    try:
        print()
        print(f"prewarm demo: {assignment['requests']} chat requests of the application workload "
              f"(0-{args.duration_s:g}s, {args.rps:g}/s) at x{args.time_scale:g}, 3 pods; {story(args, bool(args.outage))}; "
              f"{args.repeats} run(s) a mode; times are model time ({PROFILE})", flush=True)
        modes_run = run_kinds(args, [m for m in MODES if m in modes])
        repeats = range(1, args.repeats + 1)
        runs = [f"--run={label(m)}={run_dir(args, m, r)}" for m in modes_run for r in repeats]
        subprocess.run(replayer("report", *runs, "--out", args.out), check=True)
        for m in modes_run:
            direct = [json.loads((run_dir(args, m, r) / "filter.json").read_text())["direct_calls"] for r in repeats]
            print(f"filter's direct calls, {label(m)}: "
                  + ", ".join(f"{k} {'/'.join(str(d[k]) for d in direct)}" for k in direct[0]))
        for m in modes_run:
            if args.outage and m.endswith(OUTAGE_SUFFIX):
                join = joins_at(args)
                figures = outage_summary([run_dir(args, m, r) for r in repeats],
                                         [run_dir(args, base_mode(m), r) for r in repeats],
                                         args.outage, args.time_scale, join[0] if join else None)
                (args.out / f"{m}.json").write_text(json.dumps(figures, indent=1))
                print(f"JSON: {args.out / f'{m}.json'}")
        print(f"\nJSON: {args.out / 'summary.json'}, per request: {args.out}/<mode>/run-<n>/outcomes.jsonl")
        print(f"charts: {args.out / 'charts' / 'ttft_p95.png'}, {args.out / 'charts' / 'token_hit_ratio.png'}")
        if kept:
            print_urls(kept)
            wait_for_ctrl_c()
    finally:
        if kept:
            kept.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
