"""End to end, whole stack (real Envoy + filter .wasm + gateway + podsim pods): the gateway
restarts while its pods keep serving. Its first health round finds every pod up — to a fresh
process every pod is a join — and re-warms each from the restored snapshot; the pods that were
already serving stay in the routing table meanwhile (`Fleet::served_before_the_gateway`), so a
gateway restart costs no routing. Before, each left the table until its first tier was warm
again: with many hot prefixes, tens of seconds of a fleet the filters could not route to.
"""
from __future__ import annotations

import time

from harness.stack import BASE_MODEL, Stack, StackSpec
from test_e2e_scaleup import establish_templates

TEMPLATES = [(i, BASE_MODEL) for i in range(8)]
MAX_POLLS = 1500
"""Polls of the restarted gateway (each ≥ 20 ms: 30 s at most)."""


def test_pods_serving_through_a_gateway_restart_stay_routed_while_they_are_rewarmed(tmp_path):
    spec = StackSpec(
        pods=2,
        # every prefill takes 0.3 s of real time, one at a time: the re-warm lasts seconds
        podsim_flags=["--time-scale", "1", "--prefill-overhead-ms", "300", "--per-token-us", "0"],
        gateway={"warmup": {"first_tier_concurrency": 1},
                 "state": {"snapshot_interval_seconds": 0}},
    )
    stack = Stack(tmp_path, spec).start()
    try:
        establish_templates(stack, TEMPLATES)
        ids = sorted(p.id for p in stack.pods)
        stack.wait_routable(*ids)
        assert stack.gateway.admin("POST", "/admin/snapshot").status_code == 200
        stack.gateway.proc.kill()
        stack.restart_gateway()

        # From its first table on, both pods are in it, while their re-warm runs.
        seen_warming_in_table: set[str] = set()
        for _ in range(MAX_POLLS):
            routed = set(stack.routed_ids())
            warming = {i for i in ids if (stack.warmup(i) or {}).get("phase") in ("adapters", "first_tier")}
            if routed:
                assert routed == set(ids), f"a serving pod left the table: {routed}"
                seen_warming_in_table |= warming & routed
            done = all((stack.warmup(i) or {}).get("phase") == "done" for i in ids)
            if routed and done:
                break
            time.sleep(0.02)
        else:
            raise AssertionError("the restarted gateway never finished re-warming its pods")
        assert seen_warming_in_table, "no pod was seen in the table while it was re-warmed"
        for i in ids:
            status = stack.warmup(i)
            assert status["first_tier"]["done"] == status["first_tier"]["total"] > 0, status
    finally:
        stack.close()
