"""End to end, whole stack: adapter pinning.

Every pod serves every adapter (`--lora-modules`, as a vLLM deployment would) but holds only a
few in its host cache and four in GPU slots, evicting least-recently-used ones silently; a
request for an evicted adapter waits for a disk load (1 s here, real time as model time).

- An adapter crossing the filter's pin threshold (5 requests a minute) makes a pin signal; the
  gateway makes it resident (GPU slot in its model, with priority) on the pods it is placed on,
  which are the pods Envoy routes its requests to.
- Under bronze pressure (a stream of requests cycling through more bronze adapters than the
  host cache holds), the gold adapter is never evicted: the gateway never unloads it, and none of
  its requests waits for a load — read from the serving pod's own TTFT histogram (model time),
  not from a wall clock.

Known limit (seen): with a single GPU slot (`max_loras = 1`) the gateway stops touching the gold
adapter once bronze traffic holds the slot in its model (keep-warm touches only adapters modelled
in a slot), and the pod's host LRU then evicts it; with four slots the gold tier's slot share
keeps it modelled in a slot and touched.
"""
from __future__ import annotations

import requests

from harness import wait_until
from harness.stack import AdapterSpec, Pod, Stack, StackSpec
from harness.stack import question_text as question

LOAD_MS = 1000
BRONZE = [f"bronze-{k}" for k in range(5)]


def ttft_counts(pod: Pod, le: str = "0.5") -> tuple[float, float]:
    """(requests with TTFT ≤ `le` seconds, all requests) from the pod's TTFT histogram."""
    under = total = 0.0
    for line in requests.get(f"{pod.url}/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:time_to_first_token_seconds_bucket{"):
            value = float(line.rsplit(" ", 1)[1])
            if f'le="{le}"' in line:
                under += value
            elif 'le="+Inf"' in line:
                total += value
    return under, total


def resident(detail: dict, pod_id: str) -> bool:
    """The gateway's LoRA model holds the adapter on the pod, in a GPU slot, with the priority
    the pin signal gave it."""
    e = detail["pods"].get(pod_id) or {}
    return bool(e.get("registered") and e.get("in_gpu") and (e.get("pinned") or e.get("priority", 0) > 0))


def test_a_hot_gold_adapter_is_pinned_where_routed_and_never_waits_under_bronze_pressure(tmp_path):
    spec = StackSpec(
        pods=2,
        podsim_flags=["--time-scale", "1", "--adapter-load-ms", str(LOAD_MS), "--adapter-activation-ms", "5",
                      "--per-token-us", "0"],
        adapters=[AdapterSpec("gold-a", tier="gold")] + [AdapterSpec(b) for b in BRONZE],
        max_loras=4, max_cpu_loras=4,
        gateway={"pods": {"health_interval_ms": 100}, "lora": {"touch_interval_ms": 1000}},
    )
    stack = Stack(tmp_path, spec).start()
    try:
        # 6 requests a minute crosses the default threshold of 5: one pin signal.
        gold_pods = set()
        for n in range(6):
            pod, _ = stack.completion(question(n, n), model="gold-a", user=f"g-{n}")
            gold_pods.add(pod.id)
        wait_until(lambda: stack.gateway_metric('prewarm_signals_ingested_total{kind="pin"}') >= 1, 15,
                   what="the filter's pin signal reaches the gateway")
        detail = wait_until(lambda: (d := stack.gateway.get("/admin/adapters/gold-a").json())
                            and all(resident(d, p) for p in gold_pods) and d, 15,
                            what="gold-a resident where it is routed")
        pinned_on = {p for p in detail["pods"] if resident(detail, p)}
        assert gold_pods <= pinned_on, (gold_pods, detail["pods"])
        for p in pinned_on:
            served = requests.get(f"{stack.pod(p).url}/v1/models", timeout=5).json()
            assert "gold-a" in {m["id"] for m in served["data"]}

        # Bursts of bronze requests (5 adapters through 4-entry host caches), each followed by
        # one gold-a request alone: the bronze ones wait for loads, the gold one never does.
        unloads = stack.gateway_metric("prewarm_adapter_unloads_total")
        bronze_waits = 0
        for burst in range(3):
            before = {p.id: ttft_counts(p) for p in stack.pods}
            for n in range(10):
                stack.completion(question(n % 7, 100 * burst + n), model=BRONZE[n % len(BRONZE)], user=f"b-{n}")
            mid = {p.id: ttft_counts(p) for p in stack.pods}
            bronze_waits += sum((mid[i][1] - mid[i][0]) - (before[i][1] - before[i][0]) for i in mid)
            pod, _ = stack.completion(question(20 + burst, burst), model="gold-a", user=f"g2-{burst}")
            after = ttft_counts(pod)
            waited = (after[1] - after[0]) - (mid[pod.id][1] - mid[pod.id][0])
            assert waited == 0, f"burst {burst}: a gold-a request (or its touch) waited for a load on {pod.id}"
            assert resident(stack.gateway.get("/admin/adapters/gold-a").json(), pod.id)
        assert bronze_waits > 0, "no bronze request waited for a load: there was no pressure"
        outcomes = [o for p in pinned_on for o in stack.pod_detail(p).get("errors", []) if "gold-a" in o]
        assert not outcomes, outcomes
        assert stack.gateway_metric("prewarm_adapter_unloads_total") == unloads
        heat = stack.gateway.get("/admin/adapters/heatmap").json()
        row = heat["cells"][heat["adapters"].index("gold-a")]
        for p in pinned_on:
            assert row[heat["pods"].index(p)] in ("gpu", "registered"), heat
    finally:
        stack.close()
