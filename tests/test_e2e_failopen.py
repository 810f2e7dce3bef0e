"""End to end, whole stack: the gateway dies under client traffic and comes back.

While it is down no client request fails or changes (the filter keeps routing with the table it
has and drops its signals). Restarted on the same address, the gateway resumes from its snapshot
(templates, pins, adapter registry) and routing recovers: Envoy adopts its table again.
"""
from __future__ import annotations

import json
import threading

import requests

from harness import wait_until
from harness.stack import AdapterSpec, BASE_MODEL, Stack, StackSpec
from harness.stack import question_text as question

CLIENT_REQUESTS = 150


def expected_reply(pod_url: str, body: dict) -> tuple:
    r = requests.post(f"{pod_url}/v1/completions", json=body, timeout=30)
    r.raise_for_status()
    return shape(r.json())


def shape(reply: dict) -> tuple:
    """What a request's outcome is, without per-response ids and timestamps."""
    usage = reply["usage"]
    return (reply["model"], reply["choices"][0]["text"], reply["choices"][0]["finish_reason"],
            usage["prompt_tokens"], usage["completion_tokens"])


def registry_view(stack: Stack) -> dict:
    adapters = stack.gateway.get("/admin/adapters").json()["adapters"]
    return {a["name"]: (a["tier"], a["pinned"], a["current"]["version"], a["current"]["manifest"]["digest"])
            for a in adapters}


def prompt_keys(stack: Stack) -> set:
    return {p["key"] for p in stack.gateway.get("/admin/prompts?k=1000").json()["prompts"]}


def test_gateway_killed_under_traffic_then_restored_from_its_snapshot(tmp_path):
    spec = StackSpec(pods=2, podsim_flags=["--time-scale", "50"],
                     adapters=[AdapterSpec("gold-a", tier="gold", pinned=True), AdapterSpec("bronze-b")])
    stack = Stack(tmp_path, spec).start()
    try:
        for i in range(3):
            for k in range(3):
                stack.completion(question(i, k), user=f"user-{i}")
        wait_until(lambda: len(prompt_keys(stack)) >= 3, 30, what="templates hot")
        r = stack.gateway.admin("POST", "/admin/prompts", json={"model": BASE_MODEL, "text": question(7, 0)})
        assert r.status_code == 201, r.text
        assert stack.gateway.admin("POST", "/admin/snapshot").status_code == 200
        keys_before, registry_before = prompt_keys(stack), registry_view(stack)
        generation_before = stack.routing()["generation"]
        assert registry_before["gold-a"][1] is True

        bodies = [{"model": m, "prompt": question(10 + n % 5, n), "max_tokens": 3}
                  for n, m in zip(range(CLIENT_REQUESTS), [BASE_MODEL, "gold-a", "bronze-b"] * CLIENT_REQUESTS)]
        expected = [expected_reply(stack.pods[0].url, b) for b in bodies[:6]]
        outcomes: list = [None] * len(bodies)
        progress = threading.Semaphore(0)

        def client():
            for n, body in enumerate(bodies):
                status, _, raw = stack.post("/v1/completions", body, user=f"client-{n % 4}")
                outcomes[n] = (status, shape(json.loads(raw)) if status == 200 else raw[:200])
                progress.release()

        t = threading.Thread(target=client, daemon=True)
        t.start()
        for _ in range(CLIENT_REQUESTS // 3):
            progress.acquire(timeout=60)
        stack.gateway.proc.kill()
        failures_before = stack.envoy.metric("prewarm_filter_table_fetch_failures_total")
        wait_until(lambda: stack.envoy.metric("prewarm_filter_table_fetch_failures_total") > failures_before, 30,
                   what="the filter notices the gateway is gone")
        for _ in range(CLIENT_REQUESTS // 3):
            progress.acquire(timeout=60)
        stack.restart_gateway()
        t.join(timeout=120)
        assert not t.is_alive()

        assert [o[0] for o in outcomes] == [200] * len(bodies), [o for o in outcomes if o[0] != 200][:3]
        assert [o[1] for o in outcomes[:6]] == expected
        for body, (_, got) in zip(bodies, outcomes):
            assert got[0] == body["model"] and got[4] == 3, got

        # Resumed from the snapshot: templates, pins and registry as they were.
        assert keys_before <= prompt_keys(stack)
        assert registry_view(stack) == registry_before
        stack.wait_routable(*[p.id for p in stack.pods])
        assert stack.routing()["generation"] > generation_before
        stack.wait_envoy_routes(*[p.address for p in stack.pods])
        routed = stack.envoy.metric("prewarm_filter_routed_total")
        pod, _ = stack.completion(question(1, 50), user="after-restart")
        assert pod is not None and stack.envoy.metric("prewarm_filter_routed_total") == routed + 1
    finally:
        stack.close()
