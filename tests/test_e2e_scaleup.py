"""End to end, whole stack (real Envoy + filter .wasm + gateway + podsim pods): a pod joins a
fleet whose hot templates were established by traffic, is warmed before it takes traffic, and
serves its first requests for the prefixes it now wins from cache.
"""
from __future__ import annotations

import pytest
import requests

from harness import wait_until
from harness.stack import (BASE_MODEL, TEMPLATE_BYTES, AdapterSpec, Stack, StackSpec, cached_tokens,
                           question_text as question)

# (template index, model): base-model templates and eight for an adapter.
TEMPLATES = [(i, BASE_MODEL) for i in range(8)] + [(i, "sql-lora") for i in range(8, 16)]


def scaleup_spec(preload_adapters: bool) -> StackSpec:
    return StackSpec(
        pods=2, spare_pods=1,
        podsim_flags=["--time-scale", "50"],
        adapters=[AdapterSpec("sql-lora", tier="gold"), AdapterSpec("chat-lora", tier="bronze")],
        preload_adapters=preload_adapters,
        gateway={"pods": {"adapter_replicas": 1}},
    )


def establish_templates(stack: Stack, templates: list = TEMPLATES) -> None:
    """Each template's user sends 3 similar prompts (the filter's default streak)."""
    for i, model in templates:
        for k in range(3):
            stack.completion(question(i, k), model=model, user=f"user-{i}")
    wait_until(lambda: stack.gateway.get("/admin/prompts?k=100").json()["total"] >= len(templates), 30,
               what="every template hot in the gateway")


@pytest.mark.parametrize("preload_adapters", [False, True], ids=["adapters-loaded-by-gateway", "adapters-static"])
def test_a_joining_pod_is_warmed_before_it_is_routed_and_serves_hits(tmp_path, preload_adapters):
    """Adapters either reach pods only through the gateway's loads, or every pod serves them
    from its start (`--lora-modules`): then the joining pod wins a share of the adapter's
    prefixes too, and its plan must know that before it is routable."""
    stack = Stack(tmp_path, scaleup_spec(preload_adapters)).start()
    try:
        establish_templates(stack)
        new = stack.join_spare(0)

        # The first time the new pod is in the table, its warm-up's first tier and adapters are
        # done, and its adapters are registered on it.
        def routable_status():
            if new.id in stack.routed_ids():
                return stack.warmup(new.id), requests.get(f"{new.url}/v1/models", timeout=5).json()
            return None

        status, models = wait_until(routable_status, 60, interval=0.05, what="new pod routable")
        assert status["first_tier"]["done"] == status["first_tier"]["total"], status
        assert status["first_tier"]["failed"] == 0 and status["adapters"]["failed"] == 0, status
        assert status["adapters"]["done"] == status["adapters"]["total"], status
        assert status["first_tier_done_ms"] is not None
        plan = stack.gateway.get(f"/admin/pods/{new.id}/plan").json()
        served = {m["id"] for m in models["data"]} - {BASE_MODEL}
        assert set(plan["adapters"]) <= served, (plan, served)
        # The table lists an adapter on the pods of its replica set that serve it (from their
        # /v1/models, reconciled when a pod joins and every 5th health round, so the gateway's own
        # loads show a round later): until then the filter sends that adapter's requests to its
        # other holders. Once the table lists the adapters placed on the new pod, every prefix of
        # those adapters the pod wins must be warm.
        placed = set(plan["adapters"])
        wait_until(lambda: placed <= next(
            set(p["adapters"]) for p in stack.routing()["pods"] if p["id"] == new.id), 30,
            what="the table lists the adapters placed on the new pod")
        stack.wait_envoy_routes(new.address)

        # The first real request of every template Envoy now sends to the new pod is a cache hit
        # covering the template, and those templates are exactly its warm-up's first tier.
        moved = []
        for i, model in TEMPLATES:
            pod, reply = stack.completion(question(i, 99), model=model, user=f"fresh-{i}")
            if pod is new:
                moved.append(i)
                assert cached_tokens(reply) >= TEMPLATE_BYTES // 4 - 64, (i, reply["usage"])
        assert moved, "no template moved to the new pod: choose more templates"
        if preload_adapters:
            assert any(dict(TEMPLATES)[i] != BASE_MODEL for i in moved), \
                f"no adapter template moved to the new pod ({moved}): choose more templates"
        # exactly the templates it now wins were prefilled before it was routable
        assert len(moved) == status["first_tier"]["done"] == len(plan["first_tier"]), \
            (moved, status, plan, stack.routing())
    finally:
        stack.close()
