"""End to end, whole stack (real Envoy + filter .wasm + gateway + podsim pods): a pod restarts
faster than the gateway's health checks can see it down — a container restarted in place, the
same identity and address, its prefix cache and runtime-loaded adapters gone — and the gateway
treats it as a joining pod (`gateway/src/policy/fleet/restart.rs`): it takes it out of the
routing table, forgets what it believed the pod held, warms it (adapters, then the prefixes it
wins), routes to it again once the first tier is warm, and counts the restart.

The pod's restart is seen in its `/metrics`: podsim, like vLLM's API server, exports
`process_start_time_seconds`, and a new process has a new one. `pods.unhealthy_after` × the
health interval (25 × 200 ms) is far longer than the restart takes, so the gateway never sees the
pod down: without the restart rule it would keep routing to it as if warm.

A second test pins the fact the rule reads on the real engine: vLLM (CPU) exports
`process_start_time_seconds`, constant across scrapes of one process (skipped without
`make setup-vllm`).
"""
from __future__ import annotations

import re
import time

import requests

from harness import wait_until
from harness.stack import (BASE_MODEL, TEMPLATE_BYTES, AdapterSpec, Stack, StackSpec, cached_tokens,
                           question_text as question)
from harness.vllm import LLAMA_FLAGS, requires_vllm, start_vllm, tiny_models
from test_e2e_pod_failure import warmed_templates
from test_e2e_scaleup import establish_templates

# (template index, model): base-model templates and some for the adapter.
TEMPLATES = [(i, BASE_MODEL) for i in range(6)] + [(i, "sql-lora") for i in range(6, 10)]
UNHEALTHY_AFTER = 25
MAX_POLLS = 3000
"""Admin-API polls while the restarted pod is away and warming (each ≥ 20 ms: a minute at most)."""


def served_adapters(pod) -> set[str]:
    models = requests.get(f"{pod.url}/v1/models", timeout=5).json()["data"]
    return {m["id"] for m in models} - {BASE_MODEL}


def test_a_pod_restarted_between_health_checks_is_warmed_before_it_routes_again(tmp_path):
    spec = StackSpec(
        pods=2,
        # every prefill takes 0.3 s of real time: the re-warm lasts long enough to be watched
        podsim_flags=["--time-scale", "1", "--prefill-overhead-ms", "300", "--per-token-us", "0"],
        adapters=[AdapterSpec("sql-lora", tier="bronze")],
        preload_adapters=False,
        gateway={"pods": {"adapter_replicas": 1, "unhealthy_after": UNHEALTHY_AFTER},
                 "warmup": {"first_tier_concurrency": 1, "adapter_concurrency": 1}},
    )
    stack = Stack(tmp_path, spec).start()
    try:
        establish_templates(stack, TEMPLATES)
        # the pod the gateway loaded the adapter on: its restart loses a runtime load too
        pod = next(p for p in stack.pods if "sql-lora" in served_adapters(p))
        before = stack.pod_detail(pod.id)
        assert before["routable"] and before["restarts"] == 0, before
        started_before = before["process_start_time_s"]
        assert started_before is not None, "podsim exports its process start time"

        killed_ms = time.time() * 1000
        pod.process.kill()
        stack.restart_pod(pod)

        # Watch the gateway until the pod is routable again in a new epoch: it must have been
        # out of the table, warming, in that epoch first — and never down.
        seen_health: set[str] = set()
        out_of_table_warming = False
        detail = before
        for _ in range(MAX_POLLS):
            detail = stack.pod_detail(pod.id)
            seen_health.add(detail["health"])
            restarted = detail["epoch"] > before["epoch"]
            if (restarted and not detail["routable"] and detail["warmup_phase"] in ("adapters", "first_tier")
                    and pod.id not in stack.routed_ids()):
                out_of_table_warming = True
            if restarted and detail["routable"]:
                break
            time.sleep(0.02)
        else:
            raise AssertionError(f"the restarted pod never routed again: {detail}")

        assert seen_health == {"up"}, f"the gateway saw the pod {seen_health}: the restart was not quick enough"
        assert out_of_table_warming, "the restarted pod was never seen out of the table, warming"
        assert detail["epoch"] == before["epoch"] + 1, detail
        assert detail["restarts"] == 1, detail
        assert detail["process_start_time_s"] > started_before, detail
        assert stack.gateway_metric(
            f'prewarm_pod_restarts_total{{pod="{pod.id}",evidence="start_time"}}') == 1
        assert stack.gateway_metric("prewarm_pod_restarts_total") == 1, "only the restarted pod"

        # It was warmed as a joining pod: a plan started after the restart, its adapter loaded
        # again and its first tier prefilled, none failed.
        status = stack.warmup(pod.id)
        assert status["started_ms"] >= killed_ms, (status, killed_ms)
        assert status["adapters"]["done"] == status["adapters"]["total"] >= 1, status
        assert status["first_tier"]["done"] == status["first_tier"]["total"] > 0, status
        assert status["first_tier"]["failed"] == 0, status
        assert "sql-lora" in served_adapters(pod), "the warm-up loaded the adapter again"
        warmed = warmed_templates(stack, pod.id)
        assert 0 < len(warmed) == status["first_tier"]["done"], (warmed, status)

        # Routed to again: the table places the prefixes warmed there, and their requests are
        # cache hits on the restarted pod.
        wait_until(lambda: any(p["pod"] == pod.id for p in stack.routing()["prefixes"]), 30,
                   what="the table places prefixes on the restarted pod")
        # The table's load of a pod is the share of its last minute's health checks that found
        # it busy, counted afresh from its (re)join: here the warm-up's own 0.3 s prefills make
        # it ~0.75 when the first tier is done, over the load cap (max(1.25 × mean, 0.5)), and
        # the filters send its templates elsewhere until idle checks bring it under the floor.
        # That holds for any joining pod (not the restart rule's doing); wait it out.
        wait_until(lambda: next(p["load"] for p in stack.routing()["pods"] if p["id"] == pod.id) < 0.5, 60,
                   interval=0.2, what="the restarted pod's published load under the load floor")
        stack.wait_envoy_routes(pod.address)
        moved = []
        # the warmed templates first: each request routed to the pod adds to its load again
        for i, model in sorted(TEMPLATES, key=lambda t: t[0] not in warmed):
            served_by, reply = stack.completion(question(i, 5000), model=model, user=f"after-{i}")
            if served_by is pod and i in warmed:
                moved.append(i)
                assert cached_tokens(reply) >= TEMPLATE_BYTES // 4 - 64, (i, reply["usage"])
        assert moved, f"none of the templates warmed on the restarted pod ({warmed}) went there"
    finally:
        stack.close()


PROCESS_START = re.compile(r"^process_start_time_seconds (\S+)$", re.MULTILINE)


@requires_vllm
def test_real_vllm_exports_a_process_start_time_constant_for_its_process(tmp_path):
    models = tiny_models(tmp_path / "vllm-models")
    proc, url = start_vllm(tmp_path, models.llama, *LLAMA_FLAGS, name="vllm-restart")
    try:
        first = PROCESS_START.findall(requests.get(f"{url}/metrics", timeout=30).text)
        r = requests.post(f"{url}/v1/completions", json={"model": BASE_MODEL, "prompt": "hello there",
                                                         "max_tokens": 1}, timeout=120)
        assert r.status_code == 200, r.text
        second = PROCESS_START.findall(requests.get(f"{url}/metrics", timeout=30).text)
        assert len(first) == 1 and first == second, (first, second)
        started = float(first[0])
        assert time.time() - 3600 < started <= time.time(), started
    finally:
        proc.stop(grace=10)
