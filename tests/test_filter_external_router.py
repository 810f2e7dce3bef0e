"""prewarm beside another router, in a real Envoy: the shipped envoy/beside-endpoint-picker.yaml
(`endpoint_header_owner: external`, `routing: false`) with its ext_proc endpoint picker replaced,
at the same place in the filter chain, by a stand-in that does what the Inference Extension's
picker does to the request headers: it sets `x-gateway-destination-endpoint` (overwriting a
client's value) to its pick, here read from the test's `x-test-pick` header. The pick reaches
the named pod unchanged (fallback list included) and the pod serves it, whatever the client
sent; prewarm does not route, yet records each pick of a table pod as a served record for the
gateway and still signals hot prefixes. With the filter in its default mode the same chain
loses the picker's header: the coexistence problem this mode solves."""
import json

import pytest

from harness import REPO, wait_until
from harness.envoy import WASM_FILTER, build_config, load_shipped_config, wasm_plugin
from harness.fake_servers import receiver

ENDPOINT_HEADER = "x-gateway-destination-endpoint"
PICK = "x-test-pick"
BESIDE = REPO / "envoy" / "beside-endpoint-picker.yaml"
EXT_PROC = "envoy.filters.http.ext_proc"


def picker_stand_in(config: dict):
    """Replaces the ext_proc endpoint picker with a header mutation that sets the endpoint
    header from `x-test-pick`, as the picker's ext_proc `set_headers` would (overwrite)."""
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    filters = manager["http_filters"]
    names = [f["name"] for f in filters]
    assert names.index(EXT_PROC) < names.index(WASM_FILTER), names
    filters[names.index(EXT_PROC)] = {
        "name": "stand-in.endpoint-picker",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
            "mutations": {"request_mutations": [{"append": {
                "header": {"key": ENDPOINT_HEADER, "value": f"%REQ({PICK})%"},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            }}]},
        },
    }


@pytest.fixture
def pods(fake_pods):
    return fake_pods(3)


def start(envoys, pods, gateway, **filter_config):
    """The shipped beside-the-picker Envoy with the stand-in, on these pods and gateway; the
    table lists pods 0 and 1 (pod 2 is in Envoy's pool only: a pod the gateway does not know)."""
    gateway.table = {"version": "1.0", "generation": 1, "block_tokens": 64,
                     "pods": [{"id": f"pod-{i}", "address": p.address} for i, p in enumerate(pods[:2])]}
    config = build_config(pods=[p.address for p in pods], gateway=gateway.address,
                          filter_config={"tick_period_ms": 100, **filter_config},
                          mutate=picker_stand_in, base=load_shipped_config(BESIDE))
    envoy = envoys.start(config=config)
    envoys.wait_table(envoy, 1)
    return envoy


def chat(i: int) -> dict:
    system = " ".join(f"rule {k} of the support handbook says be kind." for k in range(150))
    return {"model": "base", "messages": [{"role": "system", "content": system},
                                          {"role": "user", "content": f"question {i}?"}]}


def send(envoy, pods, body: dict, pick: str, spoof: str, user: str = "u"):
    """One request the picker sends to `pick` while the client claims `spoof`; the pod that got
    it and the endpoint header it saw."""
    before = [len(p.received()) for p in pods]
    status, _, _ = envoy.post("/v1/chat/completions", body,
                              {PICK: pick, ENDPOINT_HEADER: spoof, "x-prewarm-user": user})
    assert status == 200
    got = receiver(pods, before)
    return got, got.received()[-1].headers.get(ENDPOINT_HEADER)


def test_the_pickers_header_reaches_the_named_pod_unchanged_and_prewarm_learns_from_it(envoys, pods, gateway):
    envoy = start(envoys, pods, gateway)
    a, b, c = pods
    # Each pick names a pod and a fallback; the client claims another pod each time.
    picks = [(a, f"{a.address},{b.address}", c), (b, b.address, a), (a, a.address, b),
             (c, f"{c.address},{a.address}", b)]
    for i, (target, pick, spoofed) in enumerate(picks):
        got, seen = send(envoy, pods, chat(i), pick, spoofed.address)
        assert got is target, f"request {i}"
        assert seen == pick, "the picker's value, untouched by prewarm"
    assert envoy.metric("prewarm_filter_requests_inspected_total") == len(picks)
    assert envoy.metric("prewarm_filter_routed_total") == 0
    # pod 2 is not in the gateway's table: its pick is counted, not recorded
    assert envoy.metric("prewarm_filter_external_recorded_total") == 3
    assert envoy.metric("prewarm_filter_external_unrecorded_total", reason="unknown_pod") == 1
    # the gateway's KV model learns where the table pods' requests went
    served = lambda: [r["pod"] for batch in gateway.batches for r in batch.get("served", [])]  # noqa: E731
    wait_until(lambda: len(served()) == 3, 10, what=f"three served records: {served()}")
    assert sorted(served()) == ["pod-0", "pod-0", "pod-1"]
    # the user's three similar prompts still make a prefill signal
    wait_until(lambda: gateway.signals("prefill"), 10, what="a prefill signal at the gateway")


def test_a_pick_prewarm_cannot_read_passes_as_it_is_and_is_counted(envoys, pods, gateway):
    """What reaches the pool is the picker's business: prewarm neither cleans nor fixes it."""
    envoy = start(envoys, pods, gateway)
    for pick in ["10.255.0.1:8000", "9" * 5000]:  # a pod the table lacks; garbage
        _, seen = send(envoy, pods, chat(0), pick, pods[0].address)
        assert seen == pick, "forwarded as the picker set it"
    assert envoy.metric("prewarm_filter_external_unrecorded_total", reason="unknown_pod") == 1
    assert envoy.metric("prewarm_filter_external_unrecorded_total", reason="malformed") == 1
    assert envoy.metric("prewarm_filter_external_recorded_total") == 0


def test_in_its_default_mode_the_filter_would_strip_the_pickers_header(envoys, pods, gateway):
    """The problem `endpoint_header_owner: external` solves: the same chain with the filter in
    its default mode (it owns the header; routing off) loses every pick."""
    envoy = start(envoys, pods, gateway, endpoint_header_owner="prewarm")
    assert json.loads(wasm_plugin(envoy.config)["configuration"]["value"])["routing"] is False
    for i, p in enumerate(pods):
        _, seen = send(envoy, pods, chat(i), p.address, p.address)
        assert seen is None
    assert envoy.metric("prewarm_filter_requests_inspected_total") == len(pods)
    assert envoy.metric("prewarm_filter_external_recorded_total") == 0
