"""The filter's embedding cache (issue 19, item 1) through the real Envoy, the real filter .wasm,
the real gateway and a podsim embedding pod, on loopback.

- a repeated input is answered by the filter (`x-prewarm-cache: hit`) with exactly the vectors
  the pod returned, and the pod's cluster sees no request for it (Envoy's upstream counter);
- a batch hits only when every input was seen; a changed parameter or a model not opted in never
  hits; two different inputs never share an entry;
- malformed bodies, unknown models, huge inputs and the pod's errors go to the pod and come back
  as the pod's answer, never stored; a cache smaller than the traffic evicts, with no error;
- with the gateway stopped, hits and misses go on (the cache is the proxy's own).

Envoy runs one worker in most tests so that every request meets the same VM's cache; with two,
what one worker stored answers the other through the proxy's shared level.
"""
from __future__ import annotations

import json

import pytest
import requests

from harness.envoy import POOL_CLUSTER
from harness.stack import BASE_MODEL, Stack, StackSpec

CACHE = {"embedding_cache": {"models": [BASE_MODEL], "ttl_ms": 600_000}}


def make_stack(tmp_path_factory, name: str, cache: dict) -> Stack:
    s = Stack(tmp_path_factory.mktemp(name), StackSpec(
        pods=1, podsim_flags=["--time-scale", "50"], envoy_concurrency=1,
        filter_config={"embedding_cache": cache}))
    return s.start()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = make_stack(tmp_path_factory, "stack", CACHE["embedding_cache"])
    yield s
    s.close()


def upstream_requests(stack: Stack) -> int:
    name = f"cluster.{POOL_CLUSTER}.upstream_rq_total"
    return stack.envoy.stats(name.replace(".", "\\.") + "$").get(name, 0)


def embed(stack: Stack, body: dict) -> tuple[int, dict, bytes]:
    return stack.post("/v1/embeddings", body)


def raw_vectors(reply: bytes) -> list[str]:
    """Each `embedding` value's JSON text as sent, in index order (byte equality, not float)."""
    data = json.loads(reply)["data"]
    text = reply.decode()
    out = []
    for item in sorted(data, key=lambda d: d["index"]):
        want = json.dumps(item["embedding"], separators=(",", ":"))
        assert want in text.replace(" ", "")
        out.append(want)
    return out


def test_a_repeated_input_is_the_pods_vectors_and_never_reaches_the_pod(stack):
    body = {"model": BASE_MODEL, "input": "How do I reset my password?"}
    status, headers, first = embed(stack, body)
    assert status == 200 and "x-prewarm-cache" not in headers, first[:200]
    before = upstream_requests(stack)
    status, headers, second = embed(stack, body)
    assert status == 200, second[:200]
    assert headers.get("x-prewarm-cache") == "hit"
    assert upstream_requests(stack) == before, "a hit never calls the pod"
    assert json.loads(second)["data"][0]["embedding"] == json.loads(first)["data"][0]["embedding"]
    # byte-equal: the hit carries the pod's own JSON text of the vector
    pod_text = first.decode()
    vector = pod_text[pod_text.index('"embedding":') + len('"embedding":'):]
    vector = vector[:vector.index("]") + 1]
    assert vector in second.decode()
    reply = json.loads(second)
    assert reply["object"] == "list" and reply["model"] == BASE_MODEL
    assert reply["usage"]["prompt_tokens"] == json.loads(first)["usage"]["prompt_tokens"]
    assert stack.envoy.metric("prewarm_filter_embeddings_hit_total") >= 1
    assert stack.envoy.wasm_failures() == {}


def test_a_batch_hits_only_when_every_input_was_seen(stack):
    a, b, c = "alpha chunk of the manual", "beta chunk of the manual", "gamma chunk"
    status, _, ab = embed(stack, {"model": BASE_MODEL, "input": [a, b]})
    assert status == 200
    _, headers, _ = embed(stack, {"model": BASE_MODEL, "input": [b, c]})
    assert "x-prewarm-cache" not in headers, "c was never seen"
    _, headers, ba = embed(stack, {"model": BASE_MODEL, "input": [b, a]})
    assert headers.get("x-prewarm-cache") == "hit"
    got = [d["embedding"] for d in sorted(json.loads(ba)["data"], key=lambda d: d["index"])]
    want = [d["embedding"] for d in sorted(json.loads(ab)["data"], key=lambda d: d["index"])]
    assert got == [want[1], want[0]], "in the request's order"
    assert got[0] != got[1], "two inputs, two entries"


@pytest.mark.parametrize("change", [
    {"dimensions": 64},
    {"encoding_format": "base64"},
    {"input": "How do I reset my password? "},
])
def test_a_changed_parameter_or_input_is_a_miss_with_the_pods_answer(stack, change):
    body = {"model": BASE_MODEL, "input": "How do I reset my password?"}
    embed(stack, body)
    before = upstream_requests(stack)
    status, headers, reply = embed(stack, {**body, **change})
    assert status == 200, reply[:200]
    assert "x-prewarm-cache" not in headers
    assert upstream_requests(stack) == before + 1
    direct = requests.post(f"{stack.pods[0].url}/v1/embeddings", json={**body, **change}, timeout=30).json()
    assert json.loads(reply)["data"][0]["embedding"] == direct["data"][0]["embedding"]


@pytest.mark.parametrize("body,status", [
    (b'{"model": "base", "input": ', 400),
    (json.dumps({"model": "no-such-model", "input": "x"}).encode(), 404),
    (json.dumps({"model": BASE_MODEL, "input": "x", "dimensions": 0}).encode(), 400),
    (json.dumps({"model": BASE_MODEL, "input": {"odd": 1}}).encode(), 400),
])
def test_bad_bodies_get_the_pods_answer_twice_and_are_never_stored(stack, body, status):
    for _ in range(2):
        got, headers, reply = stack.envoy.request(
            "POST", "/v1/embeddings", body, {"content-type": "application/json"})
        assert got == status, reply[:200]
        assert "x-prewarm-cache" not in headers


def test_a_huge_input_passes_through_untouched(stack):
    body = json.dumps({"model": BASE_MODEL, "input": "word " * 400_000}).encode()
    assert len(body) > (1 << 20), "over the filter's max_body_bytes"
    for _ in range(2):
        status, headers, reply = stack.envoy.request(
            "POST", "/v1/embeddings", body, {"content-type": "application/json"}, timeout=60)
        assert "x-prewarm-cache" not in headers
        assert status == requests.post(f"{stack.pods[0].url}/v1/embeddings", data=body,
                                       headers={"content-type": "application/json"}, timeout=60).status_code


def test_hits_need_no_gateway(stack):
    body = {"model": BASE_MODEL, "input": "asked while the gateway is down"}
    embed(stack, body)
    stack.gateway.proc.kill()
    try:
        status, headers, _ = embed(stack, body)
        assert status == 200 and headers.get("x-prewarm-cache") == "hit"
        status, headers, _ = embed(stack, {"model": BASE_MODEL, "input": "never seen before"})
        assert status == 200 and "x-prewarm-cache" not in headers
    finally:
        stack.restart_gateway()


def test_a_full_cache_evicts_the_least_recent_without_errors(tmp_path_factory):
    # 384 floats are about 8 KiB of JSON: a 32 KiB cache holds three or four (no shared level,
    # which would still answer what the worker's own cache evicted)
    s = make_stack(tmp_path_factory, "small", {"models": [BASE_MODEL], "max_bytes": 32 << 10,
                                               "max_response_bytes": 16 << 10, "shared_slots": 0})
    try:
        texts = [f"document number {i}" for i in range(12)]
        for t in texts:
            status, _, _ = embed(s, {"model": BASE_MODEL, "input": t})
            assert status == 200
        _, headers, _ = embed(s, {"model": BASE_MODEL, "input": texts[-1]})
        assert headers.get("x-prewarm-cache") == "hit", "the most recent stays"
        _, headers, _ = embed(s, {"model": BASE_MODEL, "input": texts[0]})
        assert "x-prewarm-cache" not in headers, "the oldest was evicted"
        assert s.envoy.metric("prewarm_filter_embeddings_evicted_total") >= 8
        assert 0 < s.envoy.metric("prewarm_filter_embeddings_bytes") <= 32 << 10
        assert s.envoy.wasm_failures() == {}
    finally:
        s.close()


def test_with_two_workers_what_one_stored_answers_both(tmp_path_factory):
    """Each request opens a new connection, so the kernel spreads them over Envoy's two workers:
    after one miss every repeat is a hit, the other worker's through the shared level."""
    s = Stack(tmp_path_factory.mktemp("two"), StackSpec(
        pods=1, podsim_flags=["--time-scale", "50"], envoy_concurrency=2,
        filter_config={"embedding_cache": {"models": [BASE_MODEL]}}))
    s.start()
    try:
        body = {"model": BASE_MODEL, "input": "one chunk, two workers"}
        status, headers, first = embed(s, body)
        assert status == 200 and "x-prewarm-cache" not in headers
        before = upstream_requests(s)
        for _ in range(12):
            status, headers, again = embed(s, body)
            assert status == 200 and headers.get("x-prewarm-cache") == "hit"
            assert json.loads(again)["data"][0]["embedding"] == json.loads(first)["data"][0]["embedding"]
        assert upstream_requests(s) == before
        assert s.envoy.metric("prewarm_filter_embeddings_shared_hit_total") <= 1, "then in the worker's own cache"
        assert s.envoy.wasm_failures() == {}
    finally:
        s.close()
