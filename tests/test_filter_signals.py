"""The filter's signals, end to end: a real Envoy with the prewarm filter, a recording fake
gateway, a fake pod. Similar prompts of one user make one prefill signal carrying their common
prefix; a busy adapter makes one pin signal; signals travel batched; the bearer token is sent."""
import json

import pytest

from harness import wait_until
from harness.fake_servers import FakeGateway, FakeUpstream

BLOCK_BYTES = 64 * 4  # default block_tokens × 4 bytes a token
TEMPLATE = " ".join(f"Policy {i}: answer politely and cite the handbook section." for i in range(60))


@pytest.fixture
def servers():
    gateway, pod = FakeGateway().start(), FakeUpstream("pod").start()
    yield gateway, pod
    gateway.stop()
    pod.stop()


def start(envoys, servers, **filter_config):
    """Envoy with the filter; the count of prompts hot across users is off (its threshold out of
    reach) unless a test sets `triggers`, so these tests see the per-user streaks alone."""
    gateway, pod = servers
    config = {"tick_period_ms": 200, "base_models": ["base-model"], "triggers": {"shared_prompts": 100000},
              **filter_config}
    return envoys.start(pods=[pod.address], gateway=gateway.address, filter_config=config)


def chat(question, model="base-model", system=TEMPLATE):
    return {"model": model, "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}


def drained(envoy):
    """Everything enqueued has been sent (or dropped)."""
    return envoy.metric("prewarm_filter_signals_enqueued_total") == envoy.metric("prewarm_filter_signals_sent_total") + envoy.metric(
        "prewarm_filter_signals_dropped_total"
    )


def test_three_similar_prompts_make_exactly_one_prefill_with_the_common_prefix(envoys, servers):
    gateway, pod = servers
    envoy = start(envoys, servers)
    headers = {"x-prewarm-user": "alice", "x-prewarm-tenant": "acme"}
    questions = ["Alpha: where is my order?", "Bravo: can I get a refund?", "Charlie: change my address."]
    for i, q in enumerate(questions):
        status, _, _ = envoy.post("/v1/chat/completions", chat(q), headers)
        assert status == 200
        # observation happens before the request is forwarded: the count is exact here
        assert envoy.metric("prewarm_filter_signals_enqueued_total") == (1 if i == 2 else 0)
    wait_until(lambda: gateway.signals("prefill"), 10, what="prefill signal at the gateway")
    wait_until(lambda: drained(envoy), 10, what="queue drained")
    prefills = gateway.signals("prefill")
    # the streak's signal is the one `new` prefill; the filter's count of prompts hot across
    # users may signal the same prefix on its tick, as `known`
    fresh = [s for s in prefills if s["state"] == "new"]
    assert len(fresh) == 1, prefills
    p = fresh[0]
    assert all(s["prefix"] == p["prefix"] and s["state"] == "known" for s in prefills if s is not p), prefills
    common = f"<|system|>\n{TEMPLATE}\n<|user|>\n"  # the questions differ from their first byte
    assert p["model"] == "base-model" and p["tenant"] == "acme" and p["endpoint"] == "chat_completions"
    assert p["state"] == "new"
    assert len(p["prefix"]) == len(common) // BLOCK_BYTES > 0
    assert all(len(h) == 16 for h in p["prefix"])
    assert p["prefix_tokens"] == len(p["prefix"]) * 64
    assert p["prefix_text"] == common[: len(p["prefix"]) * BLOCK_BYTES]
    assert 0 <= p["priority"] < 100
    assert gateway.signals("pin") == [], "a base model is never pinned"
    # a fourth prompt of the now-hot template: adopted feedback for that prefix, no new prefill
    envoy.post("/v1/chat/completions", chat("Delta: cancel it."), headers)
    wait_until(lambda: gateway.signals("feedback"), 10, what="feedback signal")
    f = gateway.signals("feedback")[0]
    assert f["prefix"] == p["prefix"][-1] and f["outcome"] == "adopted" and f["count"] == 1
    assert [s for s in gateway.signals("prefill") if s["state"] == "new"] == [p], "no second new prefill"


def test_body_user_counts_when_no_header_and_dissimilar_prompts_do_not_trigger(envoys, servers):
    gateway, _ = servers
    envoy = start(envoys, servers)
    for i in range(3):
        body = {"model": "base-model", "user": "bob", "prompt": f"{i} " + " ".join(f"word{i}x{j}" for j in range(200))}
        assert envoy.post("/v1/completions", body)[0] == 200
    assert envoy.metric("prewarm_filter_signals_enqueued_total") == 0
    for q in ["One?", "Two?", "Three?"]:
        envoy.post("/v1/completions", {"model": "base-model", "user": "bob", "prompt": TEMPLATE + q})
    assert envoy.metric("prewarm_filter_signals_enqueued_total") == 1
    wait_until(lambda: len(gateway.signals("prefill")) == 1, 10, what="prefill from the body's user")


def test_adapter_crossing_the_pin_rate_makes_one_pin_signal(envoys, servers):
    gateway, _ = servers
    envoy = start(envoys, servers)
    for i in range(8):
        body = {"model": "sql-lora", "prompt": f"select {i} from somewhere"}
        assert envoy.post("/v1/completions", body, {"x-prewarm-tenant": "gold-co"})[0] == 200
    wait_until(lambda: gateway.signals("pin"), 10, what="pin signal")
    wait_until(lambda: drained(envoy), 10, what="queue drained")
    pins = gateway.signals("pin")
    assert len(pins) == 1, pins
    assert pins[0]["adapter"] == "sql-lora" and pins[0]["tenant"] == "gold-co"
    assert pins[0]["rate_per_minute"] >= 5


def test_signals_arrive_batched_with_version_source_and_token(envoys, servers):
    gateway, _ = servers
    envoy = start(envoys, servers, tick_period_ms=3000, gateway_token="t0ken-123", source="edge-1")
    users = [f"user{u}" for u in range(4)]
    for q in ["Alpha?", "Bravo?", "Charlie?"]:
        for u in users:
            envoy.post("/v1/chat/completions", chat(q), {"x-prewarm-user": u})
    assert envoy.metric("prewarm_filter_signals_enqueued_total") == 4
    wait_until(lambda: len(gateway.signals("prefill")) == 4, 10, what="4 prefill signals")
    batches = gateway.batches
    assert len(batches) < 4, "signals travel in batches, not one POST each"
    assert all(b["version"] == "1.0" and b["source"] == "edge-1" and b["dropped"] == 0 for b in batches)
    posts = gateway.received("/v1/signals")
    assert all(r.headers.get("authorization") == "Bearer t0ken-123" for r in posts)
    assert all(r.headers.get("content-type") == "application/json" for r in posts)
    # the table poll leaves on the same tick as the batch, so it may land a moment after it
    gets = wait_until(lambda: gateway.received("/v1/routing"), 10, what="a routing table poll")
    assert all(r.headers.get("authorization") == "Bearer t0ken-123" for r in gets)
    # a POST carries records: signals, or the served and outcome records a VM's tick appends
    assert all(any(json.loads(r.body).get(k) for k in ("signals", "served", "outcomes")) for r in posts)


def test_users_across_workers_each_make_exactly_one_prefill(envoys, servers):
    """Users' prompt streams land on both Envoy workers (a new connection per request); their
    patterns live in shared data with compare-and-swap, so each user still makes exactly one
    prefill signal."""
    from concurrent.futures import ThreadPoolExecutor

    gateway, _ = servers
    envoy = start(envoys, servers)
    users = [f"user-{u}" for u in range(8)]

    def stream(user):
        for q in ["Alpha?", "Bravo?", "Charlie?"]:
            assert envoy.post("/v1/chat/completions", chat(q), {"x-prewarm-user": user})[0] == 200

    with ThreadPoolExecutor(max_workers=len(users)) as pool:
        list(pool.map(stream, users))
    assert envoy.metric("prewarm_filter_signals_enqueued_total") == len(users)
    wait_until(lambda: len(gateway.signals("prefill")) == len(users), 15, what="one prefill per user")
    wait_until(lambda: drained(envoy), 10, what="queue drained")
    prefixes = {tuple(p["prefix"]) for p in gateway.signals("prefill")}
    assert len(prefixes) == 1, "the same template for every user"
    assert envoy.metric("prewarm_filter_shared_data_cas_give_ups_total") == 0
    workers = envoy.stats(r"listener\..*downstream_cx_total")
    assert sum(1 for k, v in workers.items() if "worker_" in k and v > 0) == 2, workers


def test_with_routing_off_no_envoy_setting_is_needed(envoys, servers):
    """Where allow_on_headers_stop_iteration cannot be set (Istio's WasmPlugin), `routing: false`
    lets the headers go at once and still observes the buffered body: nothing hangs and signals
    are made."""
    gateway, pod = servers

    def plain_plugin(config):
        from harness.envoy import wasm_plugin

        wasm_plugin(config).pop("allow_on_headers_stop_iteration")

    envoy = envoys.start(pods=[pod.address], gateway=gateway.address, mutate=plain_plugin,
                         filter_config={"tick_period_ms": 200, "routing": False, "base_models": ["base-model"],
                                        "triggers": {"shared_prompts": 100000}})
    for q in ["Alpha?", "Bravo?", "Charlie?"]:
        status, _, _ = envoy.post("/v1/chat/completions", chat(q), {"x-prewarm-user": "dave"}, timeout=5)
        assert status == 200
    assert envoy.metric("prewarm_filter_requests_inspected_total") == 3
    assert envoy.metric("prewarm_filter_unrouted_total", reason="disabled") == 3
    wait_until(lambda: len(gateway.signals("prefill")) == 1, 10, what="prefill without held headers")


@pytest.mark.parametrize("who", ["one_shot", "no_user"])
def test_a_system_prompt_many_senders_share_is_hot_whoever_sends_it(envoys, servers, who):
    """An application's system prompt sent once by each of many users (or by clients with no user)
    makes no streak, yet is hot across users: one `new` prefill of its prefix, with the chat shape
    (system message, tools) its traffic used."""
    gateway, _ = servers
    envoy = start(envoys, servers, triggers={})  # the default threshold: similar_prompts a window
    tools = [{"type": "function", "function": {"name": "lookup_order", "parameters": {"type": "object"}}}]
    for k, q in enumerate(["Alpha?", "Bravo?", "Charlie?", "Delta?"]):
        headers = {"x-prewarm-user": f"visitor-{k}"} if who == "one_shot" else {}
        assert envoy.post("/v1/chat/completions", {**chat(q), "tools": tools}, headers)[0] == 200
    wait_until(lambda: gateway.signals("prefill"), 10, what="the shared prompt's prefill")
    fresh = [s for s in gateway.signals("prefill") if s["state"] == "new"]
    assert len(fresh) == 1, gateway.signals("prefill")
    p = fresh[0]
    common = f"<|system|>\n{TEMPLATE}\n<|user|>\n"
    assert p["prefix_text"] == common[: len(p["prefix"]) * BLOCK_BYTES] and p["prefix"]
    assert p["shape"]["messages"][0]["role"] == "system"
    assert json.loads(p["shape"]["tools"]) == tools
    if who == "no_user":
        assert envoy.metric("prewarm_filter_no_user_total") == 4
