"""A client's `x-gateway-destination-endpoint` never steers the pool, whatever the filter does.

The shipped configs where the filter owns that header (its default `endpoint_header_owner`) strip
it with Envoy's own `header_mutation` before the wasm filter, so the guarantee does not depend on
the VM. The matrix: routing on/off × gateway up/down × request
shapes (POST with content-length, chunked POST, GET, HTTP/2 cleartext with trailers, a 2 MiB
body the filter does not inspect), plus a listener whose wasm filter does nothing at all (what
a VM that is unconfigured, failed open or mid-reload amounts to). Pods A and B are in the
routing table; the canary C is in the pool but never in a table, and every request names C
(alone, or first in a list). No pod may see the client's value, so override_host never read it.
"""
import json
import socket
import struct

import pytest

from harness import REPO
from harness.envoy import EnvoyFleet
from harness.fake_servers import FakeGateway, FakeUpstream

ENDPOINT_HEADER = "x-gateway-destination-endpoint"


@pytest.fixture
def pods():
    servers = [FakeUpstream(name).start() for name in ("pod-a", "pod-b", "canary")]
    yield servers
    for s in servers:
        s.stop()


def chat(i: int, pad: int = 0) -> bytes:
    system = " ".join(f"rule {k} of the handbook says be kind." for k in range(200))
    return json.dumps({"model": "m", "messages": [
        {"role": "system", "content": system + "x" * pad},
        {"role": "user", "content": f"question {i}?"}]}).encode()


# --- a minimal HTTP/2 cleartext client (prior knowledge), enough for one request with trailers

def _hpack_int(value: int, prefix_bits: int = 7) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out, value = [limit], value - limit
    while value >= 128:
        out.append((value % 128) + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def _hpack(headers) -> bytes:
    """Every header as a literal without indexing, new name, no Huffman."""
    out = b""
    for name, value in headers:
        n, v = name.encode(), value.encode()
        out += b"\x00" + _hpack_int(len(n)) + n + _hpack_int(len(v)) + v
    return out


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def h2c_post(url: str, path: str, headers: dict, body: bytes, trailers: dict) -> int:
    """POST over h2c with trailers; the response's `:status`."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        request = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "test"),
                   *headers.items()]
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0, b"")
                  + _frame(1, 0x4, 1, _hpack(request))  # HEADERS, END_HEADERS
                  + _frame(0, 0, 1, body)  # DATA (under the default 64 KiB window)
                  + _frame(1, 0x5, 1, _hpack(trailers.items())))  # trailers, END_STREAM
        buffer = b""
        while True:
            while len(buffer) < 9 or len(buffer) < 9 + int.from_bytes(buffer[:3], "big"):
                chunk = s.recv(65536)
                assert chunk, "connection closed before a response"
                buffer += chunk
            length = int.from_bytes(buffer[:3], "big")
            kind, flags, stream = buffer[3], buffer[4], struct.unpack(">I", buffer[5:9])[0] & 0x7FFFFFFF
            payload, buffer = buffer[9:9 + length], buffer[9 + length:]
            if kind == 4 and not flags & 1:
                s.sendall(_frame(4, 1, 0, b""))  # SETTINGS ACK
            elif kind == 7:
                raise AssertionError(f"GOAWAY {payload!r}")
            elif kind == 1 and stream == 1:
                # `:status: 200` is static table entry 8 (0x88); any other status fails the test
                return 200 if payload[:1] == b"\x88" else -payload[0]


def send_matrix(envoy, spoof: str) -> list:
    """Every request shape once, spoofing `spoof`; the statuses."""
    h = {ENDPOINT_HEADER: spoof, "content-type": "application/json", "x-prewarm-user": "u"}
    statuses = [
        envoy.request("POST", "/v1/chat/completions", chat(1), h)[0],
        envoy.request("POST", "/v1/chat/completions", iter([chat(2)[:100], chat(2)[100:]]), h)[0],
        envoy.request("GET", "/v1/models", None, {ENDPOINT_HEADER: spoof})[0],
        h2c_post(envoy.url, "/v1/chat/completions", {**h, "content-length": str(len(chat(3)))}, chat(3),
                 {"x-trailer": "t"}),
        envoy.request("POST", "/v1/chat/completions", chat(4, pad=2 << 20), h)[0],
    ]
    return statuses


def check_untouched(pods, spoof_values):
    """No pod saw a client's value. (Which pod served a request is not the check: the canary is
    in the pool, so the fallback policy may pick it for a request the filter did not route;
    a client's header that got through is forwarded to the pod and shows there.)"""
    canary = pods[2]
    seen = [r.headers.get(ENDPOINT_HEADER) for p in pods for r in p.received()]
    assert len(seen) == 10, seen
    assert not set(seen) & set(spoof_values), seen
    assert all(v is None or canary.address not in v for v in seen), seen


@pytest.mark.parametrize("routing", [True, False])
@pytest.mark.parametrize("gateway_up", [True, False])
def test_a_client_endpoint_header_never_reaches_a_pod(envoys, pods, routing, gateway_up):
    a, b, canary = pods
    gateway = FakeGateway().start()
    gateway.table = {"version": "1.0", "generation": 1, "block_tokens": 64,
                     "pods": [{"id": "a", "address": a.address}, {"id": "b", "address": b.address}]}
    address = gateway.address
    try:
        if not gateway_up:
            gateway.stop()  # its port is closed: every call to it fails
        envoy = envoys.start(pods=[p.address for p in pods], gateway=address,
                             filter_config={"routing": routing, "tick_period_ms": 100})
        if gateway_up:
            EnvoyFleet.wait_table(envoy, 1)
        spoofs = [canary.address, f"{canary.address},{a.address}"]
        for spoof in spoofs:
            assert send_matrix(envoy, spoof) == [200] * 5
        check_untouched(pods, spoofs)
        if routing and gateway_up:
            assert envoy.metric("prewarm_filter_routed_total") >= 1
    finally:
        gateway.stop()


def test_without_the_wasm_filter_acting_the_header_is_still_stripped(envoys, pods):
    """What an unconfigured VM, one failed open or one mid-reload amounts to: no filter work at
    all. Only Envoy's header mutation stands between the client and override_host."""
    a, b, canary = pods
    envoy = envoys.start(pods=[p.address for p in pods], with_filter=False)
    spoofs = [canary.address, f"{canary.address},{a.address}"]
    for spoof in spoofs:
        assert send_matrix(envoy, spoof) == [200] * 5
    check_untouched(pods, spoofs)


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "envoy").glob("*.yaml")))
def test_every_shipped_envoy_config_strips_the_header_before_the_filter_it_owns(name):
    """Every plain-Envoy config under envoy/: where the filter owns the endpoint header (its
    default), Envoy strips a client's before the filter; where another router owns it
    (`endpoint_header_owner: external`, envoy/beside-endpoint-picker.yaml), nothing strips it and
    that router (ext_proc) runs first, overwriting a client's value. The Istio EnvoyFilters are
    checked against these files by tests/test_manifests.py."""
    import yaml

    config = yaml.safe_load((REPO / "envoy" / name).read_text())
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    names = [f["name"] for f in manager["http_filters"]]
    wasm = names.index("envoy.filters.http.wasm")
    plugin = json.loads(manager["http_filters"][wasm]["typed_config"]["config"]["configuration"]["value"])
    strip = names.index("envoy.filters.http.header_mutation")
    assert strip < wasm, names
    mutations = manager["http_filters"][strip]["typed_config"]["mutations"]["request_mutations"]
    if plugin.get("endpoint_header_owner", "prewarm") == "prewarm":
        assert {"remove": ENDPOINT_HEADER} in mutations
    else:
        assert {"remove": ENDPOINT_HEADER} not in mutations
        assert names.index("envoy.filters.http.ext_proc") < wasm, names
