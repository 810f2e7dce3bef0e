"""Routing through the filter in a real Envoy: with a table served by the fake gateway, eachrequest reaches the pod that the filter's own code and core's placement choose (asked of the
`choose_pod` example, so the test does not reimplement placement); adapter holders are
preferred; a client-sent endpoint header never steers a request; a table cut with another block
size is not used; a newer table replaces the old within ticks; a prompt shorter than a block
goes to its adapter's holder and, for the base model, is left to Envoy's load balancer."""
import json
import subprocess

import pytest

from harness import REPO, wait_until
from harness.fake_servers import FakeGateway, FakeUpstream, receiver

ENDPOINT_HEADER = "x-gateway-destination-endpoint"


@pytest.fixture(scope="module")
def choose_pod_binary():
    subprocess.run(
        ["cargo", "build", "-q", "-p", "prewarm-filter", "--example", "choose_pod"],
        cwd=REPO, check=True, timeout=600,
    )
    return REPO / "target" / "debug" / "examples" / "choose_pod"


@pytest.fixture
def pods(fake_pods):
    return fake_pods(3)


def table(pods, generation=1, adapters=None, block_tokens=64):
    adapters = adapters or {}
    return {
        "version": "1.0",
        "generation": generation,
        "block_tokens": block_tokens,
        "pods": [{"id": f"pod-{i}", "address": p.address, "adapters": adapters.get(i, [])} for i, p in enumerate(pods)],
    }


def expected_header(binary, tmp_path, tbl, path, body) -> str:
    """The endpoint header the filter sets: `primary,alternative,...`."""
    t, b = tmp_path / "table.json", tmp_path / "body.json"
    t.write_text(json.dumps(tbl))
    b.write_bytes(json.dumps(body).encode())
    out = subprocess.run([binary, t, path, b], check=True, capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


def expected_address(binary, tmp_path, tbl, path, body) -> str:
    """The pod the request must reach: the header's first address."""
    return expected_header(binary, tmp_path, tbl, path, body).split(",")[0]


def prompt(i):
    return {"model": "base", "prompt": f"Template {i % 4}: " + "lorem ipsum dolor sit amet " * 40 + f"#{i}"}


def test_requests_reach_the_pod_placement_chooses(envoys, pods, gateway, choose_pod_binary, tmp_path):
    tbl = table(pods, adapters={2: ["sql-lora"]})
    gateway.table = tbl
    envoy = envoys.start(pods=[p.address for p in pods], gateway=gateway.address,
                         filter_config={"tick_period_ms": 200})
    envoys.wait_table(envoy, 1)
    chosen = set()
    for i in range(12):
        body = prompt(i)
        header = expected_header(choose_pod_binary, tmp_path, tbl, "/v1/completions", body)
        want = header.split(",")[0]
        before = [len(p.received()) for p in pods]
        assert envoy.post("/v1/completions", body)[0] == 200
        got = receiver(pods, before)
        assert got.address == want, f"request {i}"
        assert got.received()[-1].headers[ENDPOINT_HEADER] == header
        assert sorted(header.split(",")) == sorted(p.address for p in pods), "two retry alternatives"
        chosen.add(want)
    assert len(chosen) >= 2, "four templates spread over more than one pod"
    # the adapter's requests go to the pod holding it, whatever the prompt: short ones too
    # (shorter than a block: no cache to look for, but the adapter is only resident there)
    for i in range(4):
        before = [len(p.received()) for p in pods]
        envoy.post("/v1/completions", {**prompt(i), "model": "sql-lora"})
        assert receiver(pods, before) is pods[2]
    for i in range(4):
        before = [len(p.received()) for p in pods]
        envoy.post("/v1/completions", {"model": "sql-lora", "prompt": f"Hi #{i}"})
        assert receiver(pods, before) is pods[2]
    # a short base-model prompt is left to Envoy's load balancer
    envoy.post("/v1/completions", {"model": "base", "prompt": "Hi"})
    assert envoy.metric("prewarm_filter_routed_total") == 20
    assert envoy.metric("prewarm_filter_unrouted_total", reason="no_full_block") == 1
    assert envoy.metric("prewarm_filter_unrouted_total", reason="no_table") == 0


def test_client_endpoint_header_never_steers(envoys, pods, gateway, choose_pod_binary, tmp_path):
    tbl = table(pods)
    gateway.table = tbl
    envoy = envoys.start(pods=[p.address for p in pods], gateway=gateway.address,
                         filter_config={"tick_period_ms": 200})
    envoys.wait_table(envoy, 1)
    outside = "127.0.0.1:1"  # not a host of the pool
    body = prompt(1)
    want = expected_address(choose_pod_binary, tmp_path, tbl, "/v1/completions", body)
    other = next(p for p in pods if p.address != want)
    for forged in [outside, other.address]:
        before = [len(p.received()) for p in pods]
        status, _, _ = envoy.post("/v1/completions", body, {ENDPOINT_HEADER: forged})
        assert status == 200
        assert receiver(pods, before).address == want
    # not inspected (not an inference path, or no content-length): the header is still removed
    for method, path, data in [("GET", "/v1/models", None), ("POST", "/v1/other", b"{}")]:
        before = [len(p.received()) for p in pods]
        status, _, _ = envoy.request(method, path, data, {ENDPOINT_HEADER: other.address})
        assert status == 200
        rec = receiver(pods, before).received()[-1]
        assert ENDPOINT_HEADER not in rec.headers


def test_table_with_another_block_size_is_not_used(envoys, pods, gateway):
    gateway.table = table(pods, block_tokens=16)
    envoy = envoys.start(pods=[p.address for p in pods], gateway=gateway.address,
                         filter_config={"tick_period_ms": 200})
    envoys.wait_table(envoy, 1)
    for i in range(3):
        assert envoy.post("/v1/completions", prompt(i))[0] == 200
    assert envoy.metric("prewarm_filter_unrouted_total", reason="block_tokens_mismatch") == 3
    assert envoy.metric("prewarm_filter_routed_total") == 0


def test_a_new_generation_replaces_the_table(envoys, pods, gateway):
    gateway.table = table(pods[:1])
    envoy = envoys.start(pods=[p.address for p in pods], gateway=gateway.address,
                         filter_config={"tick_period_ms": 200})
    envoys.wait_table(envoy, 1)
    wait_until(lambda: envoy.metric("prewarm_filter_table_unchanged_total") >= 2, 10, what="304s for an unchanged table")
    for i in range(4):
        before = [len(p.received()) for p in pods]
        envoy.post("/v1/completions", prompt(i))
        assert receiver(pods, before) is pods[0]
    adopted = envoy.metric("prewarm_filter_table_adopted_total")
    gateway.table = {**table(pods[1:2]), "generation": 2}
    envoys.wait_table(envoy, 2, adopted_before=adopted)
    for i in range(4):
        before = [len(p.received()) for p in pods]
        envoy.post("/v1/completions", prompt(i))
        assert receiver(pods, before) is pods[1]
    routing_gets = gateway.received("/v1/routing")
    assert any(r.headers.get("if-none-match") == '"1"' for r in routing_gets)


def test_a_dead_pod_in_the_table_costs_no_failed_request(envoys, pods, gateway, choose_pod_binary, tmp_path):
    """The table still names a pod that died: the retry policy (connect-failure) sends the
    requests chosen for it to the next pod of the endpoint header, and once the active health
    check marks it down, the override_host policy stops honouring it."""
    tbl = table(pods[:2])
    gateway.table = tbl

    def fast_health_checks(config):
        pool = next(c for c in config["static_resources"]["clusters"] if c["name"] == "inference-pool")
        pool["health_checks"][0].update({"interval": "0.3s", "no_traffic_interval": "0.3s", "timeout": "1s"})

    envoy = envoys.start(pods=[p.address for p in pods[:2]], gateway=gateway.address,
                         filter_config={"tick_period_ms": 200}, mutate=fast_health_checks)
    envoys.wait_table(envoy, 1)
    wait_until(lambda: envoy.healthy_hosts() == 2, 10, what=f"both pods healthy {envoy.stats('membership')}")
    bodies = [prompt(i) for i in range(8)]
    targets = [expected_address(choose_pod_binary, tmp_path, tbl, "/v1/completions", b) for b in bodies]
    dead = next(p for p in pods[:2] if p.address in targets)
    alive = next(p for p in pods[:2] if p is not dead)
    dead.stop()
    for body in bodies:
        assert envoy.post("/v1/completions", body)[0] == 200
    wait_until(lambda: envoy.healthy_hosts() == 1, 10, what="the dead pod marked unhealthy")
    before = len(alive.received())
    for body in bodies:
        assert envoy.post("/v1/completions", body)[0] == 200
    assert len(alive.received()) == before + len(bodies)
