"""End to end, whole stack: bad client input through Envoy with the filter, a real gateway (with a
routing table and a real pod behind it) — against the same Envoy without the filter.

Each case reaches the upstream exactly as the filterless Envoy delivers it (method, path, body,
headers, except those Envoy itself generates) and the client gets the same reply, or both refuse
it alike; a client-sent endpoint header never reaches the upstream as sent; and nothing in the
gateway changes (prompt pool, adapters, routing generation, signals ingested).

The pool of both Envoys is one recording upstream (tests/harness/fake_servers.py); the filter's
endpoint header names the gateway's pod, which is not in that pool, so Envoy's override_host
falls back to the recorder and everything it delivers is seen.
"""
from __future__ import annotations

import http.client
import json
from urllib.parse import urlparse

import pytest

from harness import wait_until
from harness.envoy import POOL_CLUSTER, Envoy, _cluster, _endpoint
from harness.fake_servers import FakeUpstream
from harness.stack import BASE_MODEL, Stack, StackSpec

ENVOY_MADE = {"x-request-id", "x-envoy-expected-rq-timeout-ms", "x-forwarded-proto", "x-envoy-attempt-count"}
ENDPOINT_HEADER = "x-gateway-destination-endpoint"

CHAT = json.dumps({"model": BASE_MODEL, "messages": [{"role": "user", "content": "hello " * 80}]}).encode()
CASES = [
    # name, method, path, headers, body, chunked
    ("malformed-json", "POST", "/v1/chat/completions", {}, b'{"model": "m", "messages": [{"role": ', False),
    ("not-json", "POST", "/v1/completions", {}, b"\x00\xff garbage \xfe", False),
    ("wrong-types", "POST", "/v1/completions", {}, b'{"model": 7, "prompt": {"a": []}, "max_tokens": "x"}', False),
    ("huge-with-length", "POST", "/v1/completions", {}, b'{"prompt": "' + b"a" * (3 << 20) + b'"}', False),
    ("huge-chunked", "POST", "/v1/chat/completions", {}, b'{"prompt": "' + b"b" * (2 << 20) + b'"}', True),
    ("non-utf8-headers", "POST", "/v1/chat/completions",
     {"x-prewarm-user": b"\xff\xfeuser", "x-prewarm-tenant": b"t\xe9\xff", "x-other": b"\xc3\x28"}, CHAT, False),
    ("unknown-path-post", "POST", "/v1/unknown/thing", {}, CHAT, False),
    ("unknown-path-get", "GET", "/admin/pods?x=%ff", {}, None, False),
    ("empty-body", "POST", "/v1/completions", {}, b"", False),
]


def raw_request(url: str, method: str, path: str, headers: dict, body, chunked: bool):
    """(status, reply body) of one request sent byte for byte with http.client."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("host", "inference.local")  # the same for both Envoys
        for k, v in headers.items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("content-type", "application/json")
            conn.putheader("transfer-encoding" if chunked else "content-length", "chunked" if chunked else str(len(body)))
        conn.endheaders()
        if body is not None:
            if chunked:
                for i in range(0, len(body), 65536):
                    piece = body[i:i + 65536]
                    conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
                conn.send(b"0\r\n\r\n")
            else:
                conn.send(body)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def delivered(rec) -> tuple:
    headers = {k: v for k, v in rec.headers.items() if k not in ENVOY_MADE and k != ENDPOINT_HEADER}
    return rec.method, rec.path, rec.body, tuple(sorted(headers.items()))


def gateway_state(stack: Stack) -> tuple:
    gw = stack.gateway
    return (json.dumps(gw.get("/admin/prompts?k=1000").json(), sort_keys=True),
            json.dumps(gw.get("/admin/adapters").json(), sort_keys=True),
            stack.routing()["generation"],
            # Signals, not the served records a routed request sends (those are traffic).
            stack.gateway_metric("prewarm_signals_ingested_total")
            - stack.gateway_metric('prewarm_signals_ingested_total{kind="served"}'))


def to_recorder(recorder: FakeUpstream):
    def mutate(config: dict) -> None:
        _cluster(config, POOL_CLUSTER)["load_assignment"]["endpoints"] = [{"lb_endpoints": [_endpoint(recorder.address)]}]
    return mutate


@pytest.fixture(scope="module")
def recorder():
    r = FakeUpstream("recorder").start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def stack(recorder, tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("stack"), StackSpec(pods=1, podsim_flags=["--time-scale", "50"],
                                                          envoy_mutate=to_recorder(recorder)))
    s.start()
    yield s
    s.close()


@pytest.fixture(scope="module")
def baseline(recorder, tmp_path_factory):
    e = Envoy(tmp_path_factory.mktemp("baseline"), pods=[recorder.address], with_filter=False, name="baseline")
    e.start()
    yield e
    e.stop()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_reaches_the_upstream_as_without_the_filter(case, stack, baseline, recorder):
    _, method, path, headers, body, chunked = case
    before = gateway_state(stack)
    recorder.clear()
    want = raw_request(baseline.url, method, path, headers, body, chunked)
    want_seen = [delivered(r) for r in recorder.received() if r.path != "/health"]
    recorder.clear()
    got = raw_request(stack.envoy.url, method, path, headers, body, chunked)
    got_seen = [delivered(r) for r in recorder.received() if r.path != "/health"]
    assert got == want
    assert got_seen == want_seen
    # Two more filter ticks (signal flush and table poll) and the gateway has not changed.
    fetches = stack.envoy.metric("prewarm_filter_table_fetches_total")
    wait_until(lambda: stack.envoy.metric("prewarm_filter_table_fetches_total") >= fetches + 2, 10, what="two filter ticks")
    assert gateway_state(stack) == before
    assert stack.envoy.wasm_failures() == {}


def test_a_client_sent_endpoint_header_never_reaches_the_upstream(stack, baseline, recorder):
    before = gateway_state(stack)
    table_pods = {p["address"] for p in stack.routing()["pods"]}
    for body in (CHAT, b"{malformed", None):
        recorder.clear()
        method = "GET" if body is None else "POST"
        status, _ = raw_request(stack.envoy.url, method, "/v1/chat/completions",
                                {ENDPOINT_HEADER: "10.9.8.7:80"}, body, False)
        assert status == 200
        seen = [r for r in recorder.received() if r.path != "/health"]
        assert len(seen) == 1
        # removed, or replaced by the filter's own choice from the routing table
        assert seen[0].headers.get(ENDPOINT_HEADER) in (None, *table_pods), seen[0].headers
    fetches = stack.envoy.metric("prewarm_filter_table_fetches_total")
    wait_until(lambda: stack.envoy.metric("prewarm_filter_table_fetches_total") >= fetches + 2, 10, what="two filter ticks")
    assert gateway_state(stack) == before
