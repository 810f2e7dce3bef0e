"""bench-embedding-cache: what an embedding-cache hit costs, measured side by side.

On loopback: a podsim embedding pod (llama-8b-h100 latency profile, real time), an upstream Envoy
that answers every request at once (a pod that costs nothing), and three proxies built from the
shipped envoy/envoy.yaml by tests/harness/envoy.py, one worker each:
- `hit`: the filter with `embedding_cache` on, in front of podsim, asked one input it already
  holds (every request is answered by the filter);
- `envoy alone`: no filter, in front of the instant upstream (the floor of any proxied request);
- `miss path`: no filter, in front of podsim (what each request costs without the cache).
Plus `pod direct`: podsim without a proxy. One keep-alive client, requests in turn, ROUNDS
rounds of REQUESTS requests per side, the sides interleaved so drift hits them alike. Prints
p50/p95 per side and the hit's p50 against Envoy alone and against the pod.
"""
from __future__ import annotations

import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tools"))

from harness.envoy import EnvoyFleet  # noqa: E402
from harness.fake_servers import FakeGateway  # noqa: E402
from harness.podsim import start_podsim  # noqa: E402

REQUESTS = int(os.environ.get("BENCH_REQUESTS", "300"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # podsim's default model
BODY = json.dumps({"model": MODEL, "input": "How do I reset the password of my account?"}).encode()


def instant_upstream() -> dict:
    """An Envoy that answers every request at once with a fixed reply (bench-filter's)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_filter", REPO / "tools" / "bench-filter.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.UPSTREAM_YAML


def timed(url: str, n: int) -> list[float]:
    """`n` POSTs of BODY on one keep-alive connection; each one's latency in ms."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    out = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            conn.request("POST", "/v1/embeddings", BODY, {"content-type": "application/json"})
            r = conn.getresponse()
            r.read()
            out.append((time.perf_counter() - t) * 1e3)
            if r.status != 200:
                raise RuntimeError(f"{url}: {r.status}")
    finally:
        conn.close()
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="bench-embed-"))
    fleet = EnvoyFleet(work)
    gateway = FakeGateway().start()
    pod_proc = None
    try:
        pod_proc, pod_url = start_podsim(work, name="pod")
        pod = pod_url.removeprefix("http://")
        upstream = fleet.start(name="upstream", config=instant_upstream(), concurrency=1, log_level="warn")
        gateway.table = {"version": "1.0", "generation": 1, "block_tokens": 64,
                         "pods": [{"id": "pod-0", "address": pod}]}
        cache = {"embedding_cache": {"models": [MODEL]}, "base_models": [MODEL]}
        common = dict(gateway=gateway.address, concurrency=1, log_level="warn")
        hit = fleet.start(name="hit", pods=[pod], filter_config=cache, **common)
        alone = fleet.start(name="alone", pods=[upstream.url.removeprefix("http://")], with_filter=False, **common)
        miss = fleet.start(name="miss", pods=[pod], with_filter=False, **common)
        timed(hit.url, 1)  # stores the entry
        if hit.metric("prewarm_filter_embeddings_stored_total") != 1:
            raise RuntimeError("the hit proxy stored nothing")
        sides = {"hit (filter answers)": hit.url, "envoy alone (instant upstream)": alone.url,
                 "miss path (envoy + pod)": miss.url, "pod direct": pod_url}
        samples: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(ROUNDS):
            for name, url in sides.items():
                timed(url, 20)  # warm the connection path
                samples[name] += timed(url, REQUESTS)
        hits = hit.metric("prewarm_filter_embeddings_hit_total")
        print(f"bench-embedding-cache: {ROUNDS} rounds x {REQUESTS} requests per side, one client, "
              f"keep-alive; {hits} hits answered by the filter")
        print(f"{'side':34} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8}")
        for name, xs in samples.items():
            print(f"{name:34} {pct(xs, .5):8.3f} {pct(xs, .95):8.3f} {statistics.mean(xs):8.3f}")
        h, a, p = (pct(samples[k], .5) for k in ("hit (filter answers)", "envoy alone (instant upstream)",
                                                  "miss path (envoy + pod)"))
        print(f"hit p50 - envoy alone p50: {h - a:+.3f} ms; hit p50 / miss-path p50: {h / p:.3f}")
        return 0
    finally:
        fleet.close()
        gateway.stop()
        if pod_proc:
            pod_proc.stop()


if __name__ == "__main__":
    sys.exit(main())
