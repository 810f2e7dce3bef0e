"""Warm-up of the filters' embedding cache by the gateway (issue 19, item 2), through the real
Envoy, the real filter .wasm, the real gateway and a podsim embedding pod on loopback.

- After an Envoy restart (its caches empty), the inputs that were hot are answered from the
  cache from the first request on: the gateway computed them and the restarted proxy's first
  poll wrote them into its shared level. Inputs seen only once were not hot and miss. The same
  sequence without the gateway's warm-up (`warm_from_gateway: false`) misses every one.
- Across TTL boundaries (a 4 s TTL here), an input asked every half second is a hit every time
  after its first request with warm-up (recomputed 2 s before each expiry); without, it misses
  once a TTL.
- The store survives a gateway restart (snapshot), and the filter keeps answering hits while
  the gateway is down.

Figures are printed, not asserted beyond what the mechanism guarantees.
"""
from __future__ import annotations

import time

import pytest

from harness import wait_until
from harness.stack import BASE_MODEL, Stack, StackSpec


def make_stack(tmp_path_factory, name: str, warm: bool, ttl_ms: int = 600_000, lead_ms: int = 60_000) -> Stack:
    cache = {"models": [BASE_MODEL], "ttl_ms": ttl_ms, "warm_from_gateway": warm}
    return Stack(tmp_path_factory.mktemp(name), StackSpec(
        pods=1, podsim_flags=["--time-scale", "50"], envoy_concurrency=1,
        filter_config={"embedding_cache": cache},
        gateway={"warm_embeddings": {"ttl_ms": ttl_ms, "lead_ms": lead_ms}},
    )).start()


def embed(stack: Stack, text: str) -> bool:
    """Whether the request for `text` was a cache hit."""
    status, headers, body = stack.post("/v1/embeddings", {"model": BASE_MODEL, "input": text})
    assert status == 200, body[:200]
    return headers.get("x-prewarm-cache") == "hit"


def restart_envoy(stack: Stack) -> None:
    stack.envoy.stop()
    stack.start_envoy()


HOT = [f"a chunk re-indexed every night, number {i}" for i in range(20)]
ONCE = [f"a query asked only once, number {i}" for i in range(10)]


def first_requests_after_an_envoy_restart(stack: Stack, warm: bool) -> tuple[int, int]:
    """Hits among the first request for each hot and each once-seen input after a restart."""
    for t in HOT:
        assert not embed(stack, t)
        assert embed(stack, t), "a repeat is a hit"
    for t in ONCE:
        assert not embed(stack, t)
    if warm:
        wait_until(lambda: stack.gateway_metric('prewarm_embedding_computations_total{outcome="ok"}') >= len(HOT),
                   30, what="the hot inputs computed by the gateway")
    else:
        time.sleep(2)  # the same pause: nothing to wait for
    restart_envoy(stack)
    if warm:
        wait_until(lambda: stack.envoy.metric("prewarm_filter_embeddings_warm_entries_total") >= len(HOT), 30,
                   what="the restarted proxy's first poll wrote the warm entries")
    hot_hits = sum(embed(stack, t) for t in HOT)
    once_hits = sum(embed(stack, t) for t in ONCE)
    return hot_hits, once_hits


def test_after_an_envoy_restart_the_hot_inputs_hit_from_the_first_request(tmp_path_factory):
    figures = {}
    for warm in (True, False):
        stack = make_stack(tmp_path_factory, f"restart-{warm}", warm)
        try:
            figures[warm] = first_requests_after_an_envoy_restart(stack, warm)
            if warm:
                assert stack.gateway_metric("prewarm_warm_embeddings") >= len(HOT)
                # only hot inputs were computed: the once-seen ones were reported, not computed
                assert stack.gateway_metric('prewarm_embedding_computations_total{outcome="ok"}') == len(HOT)
            assert stack.envoy.wasm_failures() == {}
        finally:
            stack.close()
    (warm_hot, warm_once), (cold_hot, cold_once) = figures[True], figures[False]
    print(f"\nfirst request after an Envoy restart: hot inputs {warm_hot}/{len(HOT)} hits with warm-up, "
          f"{cold_hot}/{len(HOT)} without; once-seen inputs {warm_once}/{len(ONCE)} and {cold_once}/{len(ONCE)}")
    assert warm_hot == len(HOT)
    assert cold_hot == 0 and warm_once == 0 and cold_once == 0


def requests_across_ttl_boundaries(stack: Stack, text: str, seconds: float) -> list[bool]:
    hits = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        hits.append(embed(stack, text))
        time.sleep(0.5)
    return hits


def test_an_input_asked_all_along_stays_a_hit_across_ttl_boundaries(tmp_path_factory):
    figures = {}
    for warm in (True, False):
        stack = make_stack(tmp_path_factory, f"ttl-{warm}", warm, ttl_ms=4_000, lead_ms=2_000)
        try:
            figures[warm] = requests_across_ttl_boundaries(stack, "the nightly re-index's first chunk", 14)
            assert stack.envoy.wasm_failures() == {}
        finally:
            stack.close()
    warm_misses = figures[True].count(False)
    cold_misses = figures[False].count(False)
    print(f"\nover 14 s with a 4 s TTL, one input every 0.5 s: {warm_misses} misses of {len(figures[True])} "
          f"with warm-up, {cold_misses} of {len(figures[False])} without")
    assert figures[True][0] is False and warm_misses == 1, figures[True]
    assert cold_misses >= 3, figures[False]


def test_the_store_survives_a_gateway_restart_and_hits_need_no_gateway(tmp_path_factory):
    stack = make_stack(tmp_path_factory, "gw-restart", True)
    try:
        for t in HOT[:5]:
            embed(stack, t)
            embed(stack, t)
        wait_until(lambda: stack.gateway_metric('prewarm_embedding_computations_total{outcome="ok"}') >= 5,
                   30, what="computed")
        r = stack.gateway.admin("POST", "/admin/snapshot")
        assert r.status_code == 200, r.text
        stack.gateway.proc.stop()
        assert all(embed(stack, t) for t in HOT[:5]), "hits while the gateway is down"
        stack.restart_gateway()
        warm = stack.gateway.get("/v1/embeddings/warm?after=0").json()
        assert len(warm["entries"]) == 5 and warm["generation"] >= 5, warm
        bad = stack.gateway.get("/v1/embeddings/warm?after=-1")
        assert bad.status_code == 400 and "after" in bad.text, bad.text
        unauthorised = stack.gateway.get("/v1/embeddings/warm", headers={"Authorization": "Bearer nope"})
        assert unauthorised.status_code == 401
        restart_envoy(stack)
        wait_until(lambda: stack.envoy.metric("prewarm_filter_embeddings_warm_entries_total") >= 5, 30,
                   what="the restarted proxy warmed from the restarted gateway")
        assert all(embed(stack, t) for t in HOT[:5])
    finally:
        stack.close()
