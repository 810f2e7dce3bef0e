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
- With a gold pool (`pods.gold_pool_share`), the gold adapter is listed, and routed, on the gold
  pool's pods only and the bronze ones on the others; base-model requests use every pod.

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


def test_a_gold_pool_serves_gold_adapters_on_its_pods_only(tmp_path):
    """`pods.gold_pool_share = 0.5` over 4 pods that all serve every adapter: the table lists the
    gold adapter on the 2 gold-pool pods only and the bronze ones on the other 2, so Envoy
    sends each adapter's requests only to its pool, while base-model requests use every pod."""
    spec = StackSpec(
        pods=4,
        podsim_flags=["--time-scale", "50"],
        adapters=[AdapterSpec("gold-lora", tier="gold")] + [AdapterSpec(b) for b in BRONZE[:2]],
        max_loras=2, max_cpu_loras=4,
        gateway={"pods": {"gold_pool_share": 0.5}},
    )
    stack = Stack(tmp_path, spec).start()
    try:
        def listed():
            pods = stack.routing()["pods"]
            by_adapter = {a: {p["id"] for p in pods if a in p["adapters"]} for a in ["gold-lora", *BRONZE[:2]]}
            return by_adapter if len(pods) == 4 and all(by_adapter.values()) else None

        by_adapter = wait_until(listed, 30, what="every adapter listed in the table")
        gold = by_adapter["gold-lora"]
        assert len(gold) == 2, by_adapter
        for b in BRONZE[:2]:
            assert by_adapter[b] and not by_adapter[b] & gold, by_adapter
        ids = {p.id for p in stack.pods}
        stack.wait_envoy_routes(*(p.address for p in stack.pods))
        seen = {"gold-lora": set(), BRONZE[0]: set(), "base": set()}
        for i in range(40):
            for model in ("gold-lora", BRONZE[0]):
                pod, _ = stack.completion(question(i, 0), model=model, user=f"u-{model}-{i}")
                seen[model].add(pod.id)
            pod, _ = stack.completion(question(i, 0), user=f"u-base-{i}")
            seen["base"].add(pod.id)
        assert seen["gold-lora"] <= gold and seen[BRONZE[0]] <= ids - gold, (seen, by_adapter)
        assert seen["gold-lora"] == gold, "the gold adapter's requests use both gold pods"
        assert seen["base"] == ids, "base-model requests still use every pod"
        wait_until(lambda: "prewarm_gold_pool_pods 2\n" in stack.gateway.get("/metrics").text, 10,
                   what="the gold pool's size in the gateway's metrics")
    finally:
        stack.close()
