"""Fail-open, end to end: whatever goes wrong around the filter, a client gets exactly the
response it gets from the same Envoy configuration without the filter. Each gateway condition
(down, slow past the timeout, 500, garbage, no table yet) is checked with a set of awkward
requests: bodies over the limit with and without content-length, chunked bodies, malformed JSON,
non-UTF-8 header values, streamed (SSE) responses, non-inference paths, empty bodies."""
import http.client
import json
import socket
import time
from urllib.parse import urlparse

import pytest

from harness import wait_until
from harness.envoy import EnvoyFleet
from harness.fake_servers import FakeGateway, FakeUpstream

LIMIT = 8192
TEMPLATE = " ".join(f"Rule {i}: stay on topic and be brief." for i in range(80))


def chat(q, **extra):
    return json.dumps({"model": "m", "messages": [{"role": "system", "content": TEMPLATE}, {"role": "user", "content": q}], **extra}).encode()


def chunks(data: bytes, size: int = 1000):
    return [data[i : i + size] for i in range(0, len(data), size)]


BIG = json.dumps({"model": "m", "prompt": "x" * (3 * LIMIT)}).encode()
USER = [("x-prewarm-user", b"carol")]
# (name, method, path, headers, body, chunked)
CASES = [
    ("chat", "POST", "/v1/chat/completions", USER, chat("Alpha?"), False),
    ("chat-again", "POST", "/v1/chat/completions", USER, chat("Bravo?"), False),
    ("chat-third", "POST", "/v1/chat/completions", USER, chat("Charlie?"), False),
    ("stream", "POST", "/v1/chat/completions", USER, chat("Delta?", stream=True), False),
    ("over-limit-with-length", "POST", "/v1/completions", [], BIG, False),
    ("over-limit-chunked", "POST", "/v1/completions", [], BIG, True),
    ("small-chunked", "POST", "/v1/completions", [], json.dumps({"model": "m", "prompt": "hi"}).encode(), True),
    ("malformed-json", "POST", "/v1/chat/completions", [], b'{"model": "m", "messages": [', False),
    ("not-json", "POST", "/v1/completions", [], b"\x00\xff\xfe binary", False),
    ("non-utf8-headers", "POST", "/v1/completions",
     [("x-prewarm-user", b"\xff\xfe\xfd"), ("x-prewarm-tenant", b"caf\xe9"), ("x-gateway-destination-endpoint", b"\xff:99")],
     json.dumps({"model": "m", "prompt": TEMPLATE}).encode(), False),
    ("embeddings", "POST", "/v1/embeddings", [], json.dumps({"model": "e", "input": ["a", "b"]}).encode(), False),
    ("empty-body", "POST", "/v1/chat/completions", [], b"", False),
    ("models", "GET", "/v1/models", [], None, False),
    ("other-post", "POST", "/v2/whatever", [], b"{}", False),
]


def raw_request(base_url, method, path, headers, body, chunked, timeout=20.0):
    """(status, content-type, body) of one request sent byte for byte with http.client."""
    u = urlparse(base_url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.putrequest(method, path)
        for k, v in headers:
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("content-type", "application/json")
            if chunked:
                conn.putheader("transfer-encoding", "chunked")
            else:
                conn.putheader("content-length", str(len(body)))
        conn.endheaders()
        if body is not None:
            if chunked:
                for c in chunks(body):
                    conn.send(b"%x\r\n%s\r\n" % (len(c), c))
                conn.send(b"0\r\n\r\n")
            else:
                conn.send(body)
        r = conn.getresponse()
        return r.status, r.getheader("content-type"), r.read()
    finally:
        conn.close()


def closed_port_address() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def upstream():
    u = FakeUpstream("pod").start()
    yield u
    u.stop()


@pytest.fixture(scope="module")
def baseline(upstream, tmp_path_factory):
    fleet = EnvoyFleet(tmp_path_factory.mktemp("baseline"))
    envoy = fleet.start(name="baseline", pods=[upstream.address], with_filter=False)
    yield envoy
    fleet.close()


@pytest.fixture(scope="module")
def expected(baseline):
    return {name: raw_request(baseline.url, m, p, h, b, c) for name, m, p, h, b, c in CASES}


@pytest.mark.parametrize("condition", ["down", "slow", "500", "garbage", "no-table"])
def test_responses_are_exactly_those_without_the_filter(condition, upstream, expected, envoys):
    gateway = FakeGateway().start()
    try:
        gateway.mode = {"slow": "slow", "500": "500", "garbage": "garbage"}.get(condition, "ok")
        address = closed_port_address() if condition == "down" else gateway.address
        envoy = envoys.start(
            pods=[upstream.address], gateway=address,
            filter_config={"tick_period_ms": 200, "gateway_timeout_ms": 300, "max_body_bytes": LIMIT},
        )
        wait_until(lambda: envoy.metric("prewarm_filter_table_fetch_failures_total") >= 1, 10, what="a failed table fetch")
        for name, m, p, h, b, c in CASES:
            started = time.monotonic()
            got = raw_request(envoy.url, m, p, h, b, c)
            assert got == expected[name], f"{condition}: {name}"
            assert time.monotonic() - started < 2.0, f"{condition}: {name} waited on the gateway"
        assert expected["stream"][1] == "text/event-stream" and expected["stream"][2].endswith(b"data: [DONE]\n\n")
        assert expected["chat"][0] == 200 and expected["over-limit-with-length"][0] == 200
        assert expected["non-utf8-headers"][0] == 200, "Envoy passes obs-text header values to the filter"
        # the skips were taken for the right reasons
        assert envoy.metric("prewarm_filter_skipped_total", reason="too_large") == 1
        assert envoy.metric("prewarm_filter_skipped_total", reason="no_content_length") == 2
        assert envoy.metric("prewarm_filter_skipped_total", reason="malformed") == 2
        assert envoy.metric("prewarm_filter_unrouted_total", reason="no_table") >= 1
        # the third similar prompt made a signal: where the gateway fails, its batch is counted
        # as dropped (never retried forever); a 2xx, whatever its body, is a delivery
        assert envoy.metric("prewarm_filter_signals_enqueued_total") >= 1
        if condition in ("down", "slow", "500"):
            wait_until(lambda: envoy.metric("prewarm_filter_signals_dropped_total") >= 1, 10, what="failed batch counted")
            assert envoy.metric("prewarm_filter_signals_sent_total") == 0
            assert envoy.metric("prewarm_filter_dispatch_failures_total") >= 1
        else:
            wait_until(lambda: envoy.metric("prewarm_filter_signals_sent_total") >= 1, 10, what="batch delivered")
    finally:
        gateway.stop()


def test_a_1_mib_body_is_inspected_and_never_413(upstream, baseline, envoys):
    """The shipped limits: the filter's default max_body_bytes (1 MiB) fits the route's
    request_body_buffer_limit, so the largest inspected body still reaches the pod."""
    gateway = FakeGateway().start()
    try:
        envoy = envoys.start(pods=[upstream.address], gateway=gateway.address)
        head = b'{"model": "m", "prompt": "'
        body = head + b"y" * (1048576 - len(head) - 2) + b'"}'
        assert len(body) == 1048576
        want = raw_request(baseline.url, "POST", "/v1/completions", [], body, False)
        assert want[0] == 200
        assert raw_request(envoy.url, "POST", "/v1/completions", [], body, False) == want
        assert envoy.metric("prewarm_filter_requests_inspected_total") == 1
        over = body[:-2] + b'yy"}'
        assert raw_request(envoy.url, "POST", "/v1/completions", [], over, False)[0] == 200
        assert envoy.metric("prewarm_filter_skipped_total", reason="too_large") == 1
    finally:
        gateway.stop()
