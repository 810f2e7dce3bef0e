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
from harness.stack import TEMPLATE_BYTES, Stack, StackSpec, cached_tokens, template_text

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


def test_beside_the_picker_prewarm_still_warms_a_joining_pod_for_what_it_will_be_sent(tmp_path):
    """The coexistence install end to end: the shipped beside-the-picker Envoy (filter
    `endpoint_header_owner: external`, the picker stand-in routing), the real gateway and podsim
    pods. The picker sends each application's conversations where it likes; prewarm routes
    nothing, yet learns the applications' system prompts from the traffic, warms a joining pod
    with those its placement gives it before the pod is routable, and when the picker then sends
    a new conversation of such an application to the new pod, it is served from cache."""
    spec = StackSpec(pods=2, spare_pods=1, podsim_flags=["--time-scale", "50"],
                     envoy_base=BESIDE, envoy_mutate=picker_stand_in,
                     filter_config={"endpoint_header_owner": "external", "routing": False})
    stack = Stack(tmp_path, spec).start()
    try:
        first = stack.pods[0]
        apps = range(8)

        def conversation(app: int, k: int) -> list:
            return [{"role": "system", "content": template_text(app)},
                    {"role": "user", "content": f"Question {k}: how do I reset item {k * 7 + app}?"}]

        for app in apps:  # the picker keeps every application on pod-0; three users each
            for k in range(3):
                pod, _ = stack.chat(conversation(app, k), user=f"user-{app}", headers={PICK: first.address})
                assert pod is first
        wait_until(lambda: stack.gateway.get("/admin/prompts?k=100").json()["total"] >= len(apps), 30,
                   what="every application's system prompt hot in the gateway")

        new, status = stack.join_warmed(0)
        plan = stack.gateway.get(f"/admin/pods/{new.id}/plan").json()
        planned = set(plan["first_tier"])
        assert planned and status["first_tier"]["done"] == len(planned), (status, plan)
        warmed = []
        for app in apps:
            pod, reply = stack.chat(conversation(app, 99), user=f"fresh-{app}", headers={PICK: new.address})
            assert pod is new, "the picker's choice, untouched"
            if cached_tokens(reply) >= TEMPLATE_BYTES // 4 - 64:
                warmed.append(app)
        assert len(warmed) == len(planned), (warmed, plan)
        assert stack.envoy.metric("prewarm_filter_routed_total") == 0
        assert stack.envoy.metric("prewarm_filter_external_recorded_total") >= 3 * len(apps)
    finally:
        stack.close()
