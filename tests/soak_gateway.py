"""Soak: the gateway's memory under a flood of distinct prompts (`make soak`, not part of `make test`).

The real gateway binary (target/debug) gets prefill signals for distinct 16 KiB prompts, each
with its real block hashes (`prewarm-gateway fingerprint --jsonl`, core's function), in batches
as a filter would send them, four times as much text as its prompt pool may hold
(`hotness.max_pool_bytes`), with a snapshot written every 2 s meanwhile. Its resident memory
(VmRSS) is printed as the flood goes on: it must level off once the pool is full instead of
growing with the flood. The figures are printed; the only assertion is that the second half of
the flood (pool full) grows RSS by less than a quarter of the pool bound, which an unbounded
pool (growing by the whole second half's text, twice the bound) cannot pass.

    .venv/bin/python tests/soak_gateway.py [--pool-mib 32] [--flood-factor 4]
"""
from __future__ import annotations

import argparse
import json
import random
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import bin_path  # noqa: E402
from harness.gateway import start_gateway  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PROMPT_BYTES = 16 * 1024  # 64 blocks of 64 tokens
PER_BATCH = 100  # 1.6 MiB of text: under the 4 MiB signal body limit
DEADLINE_S = 600


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def chains(texts: list[str]) -> list[list[str]]:
    """Core's block hashes of each text, from the gateway binary (one process per batch)."""
    out = subprocess.run([bin_path("prewarm-gateway"), "fingerprint", "--model", MODEL, "--jsonl"],
                         input="".join(json.dumps(t) + "\n" for t in texts).encode(),
                         capture_output=True, timeout=120, check=True).stdout
    return [json.loads(line)["blocks"] for line in out.splitlines()]


def batch(rng: random.Random) -> dict:
    texts = ["".join(rng.choices(string.ascii_letters + " ", k=PROMPT_BYTES)) for _ in range(PER_BATCH)]
    signals = [{"kind": "prefill", "model": MODEL, "endpoint": "completions", "prefix": blocks,
                "prefix_tokens": len(blocks) * 64, "prefix_text": text, "state": "new", "priority": 10}
               for text, blocks in zip(texts, chains(texts))]
    return {"version": "1.0", "source": "soak", "signals": signals}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pool-mib", type=int, default=32, help="hotness.max_pool_bytes, MiB")
    p.add_argument("--flood-factor", type=int, default=4, help="text sent, in multiples of the pool bound")
    args = p.parse_args()
    pool_bytes = args.pool_mib << 20
    rounds = args.flood_factor * pool_bytes // (PROMPT_BYTES * PER_BATCH)
    rng = random.Random(17)
    with tempfile.TemporaryDirectory(prefix="soak-gateway-") as tmp:
        gw = start_gateway(Path(tmp), {"hotness": {"max_pool_bytes": pool_bytes},
                                       "state": {"snapshot_interval_seconds": 2}}, name="soak")
        pid = gw.proc.proc.pid
        started = time.monotonic()
        samples: list[tuple[int, float, int]] = []
        try:
            base = rss_mib(pid)
            print(f"gateway pid {pid}: RSS {base:.1f} MiB at start; pool bound {args.pool_mib} MiB; "
                  f"flooding {rounds} batches x {PER_BATCH} prompts x {PROMPT_BYTES // 1024} KiB "
                  f"= {rounds * PER_BATCH * PROMPT_BYTES >> 20} MiB of distinct text")
            print(f"{'batch':>6} {'text sent MiB':>14} {'pool entries':>13} {'RSS MiB':>8}")
            for i in range(1, rounds + 1):
                if time.monotonic() - started > DEADLINE_S:
                    print(f"deadline of {DEADLINE_S}s reached after {i - 1} batches")
                    break
                r = gw.signals(batch(rng))
                r.raise_for_status()
                assert r.json()["rejected"] == 0, r.text
                total = gw.get("/admin/prompts?k=1").json()["total"]
                rss = rss_mib(pid)
                samples.append((i, rss, total))
                if i % max(1, rounds // 16) == 0 or i == rounds:
                    print(f"{i:>6} {i * PER_BATCH * PROMPT_BYTES / 2**20:>14.0f} {total:>13} {rss:>8.1f}")
            snapshot = gw.admin("POST", "/admin/snapshot").json()
            print(f"final snapshot: {snapshot['bytes'] / 2**20:.1f} MiB, {snapshot['prompts']} prompts; "
                  f"RSS {rss_mib(pid):.1f} MiB")
        finally:
            gw.proc.stop()
    half = len(samples) // 2
    if half == 0:
        print("too few batches to judge")
        return 1
    first, second = samples[half - 1][1] - base, samples[-1][1] - samples[half - 1][1]
    print(f"RSS growth: first half of the flood {first:.1f} MiB, second half (pool full) {second:.1f} MiB "
          f"(bound {args.pool_mib} MiB)")
    ok = second < args.pool_mib / 4
    print("RSS levels off" if ok else "RSS keeps growing with the flood")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
