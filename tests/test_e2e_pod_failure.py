"""End to end, whole stack: a joining pod dies in the middle of its warm-up, under client traffic,
and comes back cold on the same address.

Clients see no error (the pod was not in the routing table yet, and Envoy's retry policy on
connect failure/reset covers the rest); the gateway notices, stops the warm-up, and when the pod
returns plans it again and warms it before it enters the table, so its first requests for the
prefixes it wins are cache hits.

The client traffic keeps running while the pod is away, so the bounded-load rule moves some
templates between the two old pods; a template the filters saw move twice counts as common
(`prewarm_core::prefix::COMMON_MOVES`) and its requests are placed by their own continuation,
which may land on the returned pod before anything warmed it there. Those first misses are the
prefix rule's documented cost, not the re-warm's, so the hits asserted are those of the templates
the returned pod's warm-up prefilled.
"""
from __future__ import annotations

import threading

from harness import wait_until
from harness.stack import TEMPLATE_BYTES, AdapterSpec, Stack, StackSpec, cached_tokens, question_text as question
from test_e2e_scaleup import TEMPLATES, establish_templates

MAX_CLIENT_REQUESTS = 400


def warmed_templates(stack: Stack, pod_id: str) -> set[int]:
    """The templates (by index) the pod's current warm-up prefilled in its first tier."""
    keys = set(stack.gateway.get(f"/admin/pods/{pod_id}/warmup").json()["first_tier_warmed"])
    prompts = stack.gateway.get("/admin/prompts?k=100").json()["prompts"]
    return {int(p["preview"].split()[0][1:]) for p in prompts if p["key"] in keys}


def test_a_pod_killed_during_its_warmup_is_rewarmed_when_it_returns(tmp_path):
    spec = StackSpec(
        pods=2, spare_pods=1,
        # every prefill takes 0.3 s of real time: the warm-up lasts long enough to be interrupted
        podsim_flags=["--time-scale", "1", "--prefill-overhead-ms", "300", "--per-token-us", "0"],
        adapters=[AdapterSpec("sql-lora", tier="gold"), AdapterSpec("chat-lora")],
        preload_adapters=False,
        gateway={"pods": {"adapter_replicas": 1, "unhealthy_after": 1},
                 "warmup": {"first_tier_concurrency": 1, "adapter_concurrency": 1}},
    )
    stack = Stack(tmp_path, spec).start()
    stop = threading.Event()
    statuses: list[int] = []
    try:
        establish_templates(stack)

        def client():
            n = 0
            while not stop.is_set() and n < MAX_CLIENT_REQUESTS:
                i, model = TEMPLATES[n % len(TEMPLATES)]
                status, _, _ = stack.post("/v1/completions", {"model": model, "prompt": question(i, 1000 + n),
                                                              "max_tokens": 1}, user=f"load-{n % 3}")
                statuses.append(status)
                n += 1

        threads = [threading.Thread(target=client, daemon=True) for _ in range(2)]
        for t in threads:
            t.start()
        new = stack.join_spare(0)
        first = wait_until(lambda: (w := stack.warmup(new.id)) and w["phase"] == "first_tier"
                           and w["first_tier"]["done"] < w["first_tier"]["total"] and w,
                           30, interval=0.02, what="new pod in its first warm-up tier")
        new.process.kill()
        wait_until(lambda: stack.pod_detail(new.id)["health"] == "down", 30, what="gateway sees the pod down")
        assert new.id not in stack.routed_ids()

        stack.restart_pod(new)
        status = wait_until(lambda: new.id in stack.routed_ids() and stack.warmup(new.id), 60,
                            what="the returned pod warmed and routable")
        warmed = warmed_templates(stack, new.id)
        assert status["attempt"] > first["attempt"] or stack.pod_detail(new.id)["epoch"] >= 2, status
        assert status["first_tier"]["done"] == status["first_tier"]["total"] > 0, status
        # the table places the prefixes warmed there on the returned pod (recomputed every
        # keep-warm period) and the filters seed their index with them
        wait_until(lambda: any(p["pod"] == new.id for p in stack.routing()["prefixes"]), 30,
                   what="the table places prefixes on the returned pod")
        stack.wait_envoy_routes(new.address)
        stop.set()
        for t in threads:
            t.join(timeout=60)

        assert statuses and set(statuses) == {200}, [s for s in statuses if s != 200][:5]
        assert 0 < len(warmed) == status["first_tier"]["done"], (warmed, status)
        moved = []
        for i, model in TEMPLATES:
            pod, reply = stack.completion(question(i, 5000), model=model, user=f"after-{i}")
            if pod is new and i in warmed:
                moved.append(i)
                assert cached_tokens(reply) >= TEMPLATE_BYTES // 4 - 64, (i, reply["usage"])
        assert moved, f"none of the templates warmed on the returned pod ({warmed}) went there"
    finally:
        stop.set()
        stack.close()
