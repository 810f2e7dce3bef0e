"""bench-embedding-warmup: the embedding cache's hit ratio with the gateway's warm-up and without,
in steady state, in the first minute after an Envoy restart, and in the first minute after a
gateway restart (issue 19's goal: within 5 % of steady).

On loopback, twice (`warm_from_gateway` true, then false): one podsim embedding pod (time scale
50), the real Envoy (2 workers) with the filter's `embedding_cache` on for the pod's model, the
gateway with `[warm_embeddings]`. The workload is `prewarm-replay embeddings` over the shared
ShareGPT-500 prompts (Zipf s = 1.0, RATE requests a second, seed 1), one sequence sent in phases
of PHASE_S seconds (`--start` continues it), so every phase draws from the same popularity:

1. fill (not reported): the cache starts empty;
2. steady;
3. after an Envoy restart (its caches empty), the phase starting as soon as Envoy routes again;
4. after a gateway restart (stopped, started again on its state directory).

The TTL is TTL_S (120 s, both the filter's and the gateway's) instead of the default 10 minutes
so that TTL boundaries fall inside the run; the gateway recomputes LEAD_S (10 s) before expiry.
Prints each phase's hit ratio (replies marked `x-prewarm-cache: hit` over requests) and the
phase's own repeat share (requests whose input appeared earlier in the same phase), and writes
out/bench-embedding-warmup/report.json.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from harness import bin_path  # noqa: E402
from harness.stack import BASE_MODEL, Stack, StackSpec  # noqa: E402

PROMPTS = REPO.parent / "shared" / "traces" / "sharegpt-500" / "prompts.json"
RATE = float(os.environ.get("BENCH_RATE", "20"))
PHASE_S = float(os.environ.get("BENCH_PHASE_S", "60"))
TTL_S = 120
LEAD_S = 10
PHASES = ["fill", "steady", "after an Envoy restart", "after a gateway restart"]
OUT = REPO / "out" / "bench-embedding-warmup"


def phase(stack: Stack, index: int) -> dict:
    per_phase = int(RATE * PHASE_S)
    out = subprocess.run(
        [str(bin_path("prewarm-replay")), "embeddings", "--prompts", str(PROMPTS),
         "--target", stack.envoy.url, "--model", BASE_MODEL, "--rate", f"{RATE:g}",
         "--requests", str(per_phase), "--start", str(index * per_phase),
         "--duration", f"{PHASE_S + 30:g}", "--seed", "1", "--concurrency", "32"],
        capture_output=True, text=True, timeout=PHASE_S + 120, check=True).stdout
    summary = json.loads(out.strip().splitlines()[-1])
    summary["hit_ratio"] = summary["cache_hits"] / max(summary["sent"], 1)
    return summary


def run(warm: bool, workdir: Path) -> list[dict]:
    # a fresh state directory: a previous run's snapshot would hand this one its warm entries
    shutil.rmtree(workdir, ignore_errors=True)
    cache = {"models": [BASE_MODEL], "ttl_ms": TTL_S * 1000, "warm_from_gateway": warm}
    stack = Stack(workdir, StackSpec(
        pods=1, podsim_flags=["--time-scale", "50"], envoy_concurrency=2,
        filter_config={"embedding_cache": cache},
        gateway={"warm_embeddings": {"ttl_ms": TTL_S * 1000, "lead_ms": LEAD_S * 1000}})).start()
    results = []
    try:
        for i, name in enumerate(PHASES):
            if name == "after an Envoy restart":
                stack.envoy.stop()
                stack.start_envoy()
            elif name == "after a gateway restart":
                stack.restart_gateway()
            started = time.monotonic()
            r = phase(stack, i)
            r["phase"] = name
            r["wall_s"] = round(time.monotonic() - started, 1)
            results.append(r)
            print(f"  {'warm' if warm else 'cold'} {name}: {r['cache_hits']}/{r['sent']} hits "
                  f"({r['hit_ratio']:.1%}), failed {r['failed']}, repeat share {r['repeat_share']:.1%}", flush=True)
        if warm:
            results[-1]["computations_ok"] = stack.gateway_metric(
                'prewarm_embedding_computations_total{outcome="ok"}')
        assert stack.envoy.wasm_failures() == {}
    finally:
        stack.close()
    return results


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"bench-embedding-warmup: ShareGPT-500, Zipf 1.0, {RATE:g} req/s, phases of {PHASE_S:g} s, "
          f"TTL {TTL_S} s, lead {LEAD_S} s", flush=True)
    report = {}
    for warm in (True, False):
        report["warm" if warm else "cold"] = run(warm, OUT / ("warm" if warm else "cold"))
    print(f"\n{'phase':28}{'with warm-up':>16}{'without':>12}{'repeat share':>16}")
    for i, name in enumerate(PHASES[1:], start=1):
        w, c = report["warm"][i], report["cold"][i]
        print(f"{name:28}{w['hit_ratio']:>16.1%}{c['hit_ratio']:>12.1%}{w['repeat_share']:>16.1%}")
    steady = report["warm"][1]["hit_ratio"]
    for i in (2, 3):
        first = report["warm"][i]["hit_ratio"]
        print(f"with warm-up, {PHASES[i]}: {first - steady:+.1%} against steady (goal: within 5 %)")
    (OUT / "report.json").write_text(json.dumps(report, indent=1))
    print(f"\nJSON: {OUT / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
