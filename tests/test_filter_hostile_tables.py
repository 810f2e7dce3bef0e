"""Routing tables with addresses Envoy would refuse or misread never reach a request header.

The gateway (here a fake) serves, one after another, tables whose pod addresses carry a list
(`a:1,b:2`), userinfo (`u@h:80`), control characters, header injection, an empty string or a
port out of range. Core's decoder refuses each whole table (counted in
`prewarm_filter_table_fetch_failures_total`), the last good table keeps routing, every request is answered
200 by a pod, no VM traps (the fleet checks Envoy's wasm failure stats on close), and no pod sees
any part of a hostile address.
"""
import pytest

from harness import wait_until
from harness.envoy import EnvoyFleet

ENDPOINT_HEADER = "x-gateway-destination-endpoint"

HOSTILE = [
    "",
    "{a},{b}",
    "u@{a}",
    "{a}\r\nx-injected: 1",
    "{a}\u0000",
    "{a}\u0007",
    "127.0.0.1:0",
    "127.0.0.1:65536",
    " {a}",
    "http://{a}",
]


@pytest.fixture
def pods(fake_pods):
    return fake_pods(2)


def body(i):
    system = " ".join(f"rule {k} of the handbook says be kind." for k in range(200))
    return {"model": "m", "messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": f"question {i}?"}]}


def test_hostile_addresses_are_refused_and_the_last_good_table_routes(envoys, pods, gateway):
    a, b = pods
    good = {"version": "1.0", "generation": 1, "block_tokens": 64, "pods": [{"id": "a", "address": a.address}]}
    gateway.table = good
    envoy = envoys.start(pods=[p.address for p in pods], gateway=gateway.address,
                         filter_config={"tick_period_ms": 100})
    EnvoyFleet.wait_table(envoy, 1)
    for i, template in enumerate(HOSTILE):
        hostile = template.format(a=a.address, b=b.address)
        failures = envoy.metric("prewarm_filter_table_fetch_failures_total")
        gateway.table = {**good, "generation": i + 2,
                         "pods": [{"id": "a", "address": a.address}, {"id": "evil", "address": hostile}]}
        wait_until(lambda: envoy.metric("prewarm_filter_table_fetch_failures_total") > failures, 15,
                   what=f"table with {hostile!r} refused")
        status, _, _ = envoy.post("/v1/chat/completions", body(i))
        assert status == 200, hostile
    assert envoy.metric("prewarm_filter_table_generation") == 1, "the last good table stays"
    seen = [r.headers.get(ENDPOINT_HEADER) for p in pods for r in p.received() if r.method == "POST"]
    assert len(seen) == len(HOSTILE)
    assert set(seen) == {a.address}, seen
    assert all("x-injected" not in r.headers for p in pods for r in p.received())
    assert envoy.metric("prewarm_filter_host_errors_total") == 0
