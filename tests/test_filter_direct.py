"""The filter's direct calls, end to end with the real Envoy, the real filter .wasm and real
podsim pods (and, for the takeover, the real gateway), all on loopback.

- standalone (`direct_calls: always`, no gateway): three similar prompts from one user make
  exactly one one-token prefill, on the pod the next request of the template is routed to, and
  that request is a cache hit there; an adapter crossing the pin rate is touched on its pod;
  a flood of distinct users' templates stays within the minute budget;
- a client request carrying the direct-call header is not honoured (the header never reaches a
  pod, and the request is routed as without it);
- `when_gateway_down`: with the gateway killed the filter takes over the warming, and once the
  gateway answers again the filter stops (the gateway's own calls resume; no double calls).

A prefill is told apart from client traffic by its output: clients here ask for
`CLIENT_TOKENS` tokens, a warming call for one, so a pod's `vllm:generation_tokens_total` minus
`CLIENT_TOKENS` per client request it served is the number of warming calls it received.
"""
from __future__ import annotations

import json

import pytest
import requests

from harness import wait_until
from harness.envoy import Envoy, _endpoint, build_config
from harness.podsim import make_adapter, start_podsim
from harness.stack import (BASE_MODEL, UPSTREAM_HEADER, USER_HEADER, AdapterSpec, Pod, Stack, StackSpec,
                           add_upstream_header, cached_tokens, pod_metric, template_text)
from harness.stack import question_text as question

CLIENT_TOKENS = 4
DIRECT_HEADER = "x-prewarm-direct-host"


def override_host_direct_cluster(config: dict, pods: list[str]) -> None:
    """The alternative measured against the shipped ORIGINAL_DST cluster: `prewarm-direct` as a
    STATIC cluster of the pods whose override_host policy reads the direct header."""
    cluster = next(c for c in config["static_resources"]["clusters"] if c["name"] == "prewarm-direct")
    cluster.clear()
    lb = "type.googleapis.com/envoy.extensions.load_balancing_policies"
    cluster.update({
        "name": "prewarm-direct", "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": "prewarm-direct",
                            "endpoints": [{"lb_endpoints": [_endpoint(p) for p in pods]}]},
        "load_balancing_policy": {"policies": [{"typed_extension_config": {
            "name": "envoy.load_balancing_policies.override_host",
            "typed_config": {"@type": f"{lb}.override_host.v3.OverrideHost",
                             "override_host_sources": [{"header": DIRECT_HEADER}],
                             "fallback_policy": {"policies": [{"typed_extension_config": {
                                 "name": "envoy.load_balancing_policies.least_request",
                                 "typed_config": {"@type": f"{lb}.least_request.v3.LeastRequest"}}}]}}}}]}})


def generated(pod: Pod) -> int:
    return int(pod_metric(pod, "vllm:generation_tokens_total"))


class Standalone:
    """N podsim pods and one Envoy whose filter runs alone (`direct_calls: always`)."""

    def __init__(self, tmp_path, pods: int, filter_config: dict | None = None, podsim_flags=(),
                 direct_cluster: str = "original_dst"):
        self.tmp_path = tmp_path
        self.pods: list[Pod] = []
        self.served: dict[str, int] = {}
        self.envoy: Envoy | None = None
        try:
            for i in range(pods):
                proc, url = start_podsim(tmp_path, "--enable-prompt-tokens-details", *podsim_flags, name=f"pod-{i}")
                self.pods.append(Pod(f"pod-{i}", url.removeprefix("http://"), proc))
                self.served[f"pod-{i}"] = 0
            config = {"tick_period_ms": 200, "base_models": [BASE_MODEL], "direct_calls": "always",
                      "direct_pods": [{"id": p.id, "address": p.address} for p in self.pods],
                      **(filter_config or {})}
            def mutate(c: dict) -> None:
                add_upstream_header(c)
                if direct_cluster == "override_host":
                    override_host_direct_cluster(c, [p.address for p in self.pods])

            self.envoy = Envoy(tmp_path / "envoy", config=build_config(
                pods=[p.address for p in self.pods], filter_config=config, mutate=mutate))
            self.envoy.start()
            wait_until(lambda: self.envoy.healthy_hosts() >= pods, 30, what="Envoy sees the pods healthy")
        except BaseException:
            self.close()
            raise

    def pod_by_address(self, address: str) -> Pod:
        return next(p for p in self.pods if p.address == address)

    def completion(self, prompt: str, user: str, model: str = BASE_MODEL, headers: dict | None = None):
        """A client completion of CLIENT_TOKENS tokens: (serving pod, reply JSON)."""
        status, h, body = self.envoy.post("/v1/completions", {"model": model, "prompt": prompt,
                                                              "max_tokens": CLIENT_TOKENS},
                                          headers={USER_HEADER: user, **(headers or {})})
        assert status == 200, (status, body[:300])
        pod = self.pod_by_address(h[UPSTREAM_HEADER])
        self.served[pod.id] += 1
        return pod, json.loads(body)

    def warming_calls(self) -> dict[str, int]:
        """Warming calls each pod received (see the module docs)."""
        return {p.id: generated(p) - CLIENT_TOKENS * self.served[p.id] for p in self.pods}

    def close(self):
        failures = {}
        try:
            if self.envoy and self.envoy.process and self.envoy.process.alive() and self.envoy.admin_url:
                failures = self.envoy.wasm_failures()
        finally:
            if self.envoy:
                self.envoy.stop()
            for p in reversed(self.pods):
                p.process.stop(grace=5)
        assert not failures, f"wasm VM failures/reloads (a filter panic?): {failures}"


@pytest.fixture
def standalone(tmp_path):
    made = []

    def start(pods: int = 4, **kwargs) -> Standalone:
        s = Standalone(tmp_path / f"s{len(made)}", pods, **kwargs)
        made.append(s)
        return s

    yield start
    for s in made:
        s.close()


def test_standalone_three_similar_prompts_make_one_prefill_where_the_next_request_goes(standalone):
    s = standalone(4)
    for k in range(3):
        s.completion(question(0, k), user="alice")
    wait_until(lambda: s.envoy.metric("prewarm_filter_direct_ok_total") == 1, 20, what="the direct prefill answered")
    calls = s.warming_calls()
    assert sum(calls.values()) == 1, calls
    assert s.envoy.metric("prewarm_filter_direct_sent_total") == 1
    assert s.envoy.metric("prewarm_filter_direct_failed_total") == 0
    # another user's prompt of the template goes to the prefilled pod and hits its cache
    pod, reply = s.completion(question(0, 9), user="bob")
    assert calls[pod.id] == 1, (pod.id, calls)
    template_tokens = len(template_text(0)) // 4
    assert cached_tokens(reply) >= template_tokens // 64 * 64, reply["usage"]
    assert s.envoy.metric("prewarm_filter_batches_sent_total") == 0, "standalone: nothing sent to a gateway"
    assert s.envoy.metric("prewarm_filter_table_fetches_total") == 0


@pytest.mark.parametrize("cluster", ["original_dst", "override_host"])
def test_a_dispatched_call_reaches_the_pod_its_header_names(standalone, cluster):
    """The measurement behind the shipped direct cluster (docs/proxy-wasm-facts.md): both an
    ORIGINAL_DST cluster with use_http_header and override_host honour a header on a call the
    filter dispatches. Four templates on four pods: each one's prefill lands on the pod its next
    request is routed to (a fallback's least-request choice would match all four by chance once
    in 256)."""
    s = standalone(4, direct_cluster=cluster)
    previous = s.warming_calls()
    for t in range(4):
        for k in range(3):
            s.completion(question(60 + t, k), user=f"m{t}")
        wait_until(lambda: s.envoy.metric("prewarm_filter_direct_ok_total") == t + 1, 20, what=f"prefill {t}")
        now = s.warming_calls()
        pod, _ = s.completion(question(60 + t, 99), user=f"n{t}")
        new = {pid: n - previous[pid] for pid, n in now.items() if n != previous[pid]}
        assert new == {pod.id: 1}, (t, pod.id, new)
        previous = now


def lora_admitted(pod: Pod, adapter: str) -> bool:
    """Whether podsim's `vllm:lora_requests_info` shows `adapter` running at some admission."""
    text = requests.get(f"{pod.url}/metrics", timeout=10).text
    return any(l.startswith("vllm:lora_requests_info{") and f'running_lora_adapters="{adapter}"' in l
               for l in text.splitlines())


def test_standalone_pin_touches_the_adapter_on_its_pod(standalone, tmp_path):
    adapter = make_adapter(tmp_path / "adapters", "sql-lora")
    flags = ["--enable-lora", "--max-loras", "1", "--max-cpu-loras", "2", "--lora-modules", f"sql-lora={adapter}"]
    # the prompt six users share is also hot across users (a prefill where it is served): off
    # here, so the touch is the one warming call
    s = standalone(3, podsim_flags=flags, filter_config={"triggers": {"shared_prompts": 100000}})
    # pin rate 5 a minute: six requests of one prompt from six users (no streak), all routed to
    # one pod; the adapter's pod by core's rule is another one (placement is over pod ids and
    # names only, so this holds on every run), where nothing but the touch can make it resident
    served = {s.completion(template_text(7), user=f"user-{k}", model="sql-lora")[0].id for k in range(6)}
    assert len(served) == 1, served
    wait_until(lambda: s.envoy.metric("prewarm_filter_direct_ok_total") == 1, 20, what="the adapter touch answered")
    calls = s.warming_calls()
    assert sum(calls.values()) == 1, calls
    (touched,) = [pid for pid, n in calls.items() if n == 1]
    assert touched not in served, (touched, served)
    by_id = {p.id: p for p in s.pods}
    assert lora_admitted(by_id[touched], "sql-lora"), "resident on the pod the filter pinned it to"
    (untouched,) = set(by_id) - served - {touched}
    assert not lora_admitted(by_id[untouched], "sql-lora")


def _without_envoy_strip(config: dict) -> None:
    """Leaves the direct header's removal to the filter alone (the shipped header_mutation also
    removes it, before the filter)."""
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    for f in manager["http_filters"]:
        if f["name"] == "envoy.filters.http.header_mutation":
            mutations = f["typed_config"]["mutations"]["request_mutations"]
            mutations.remove({"remove": DIRECT_HEADER})


@pytest.mark.parametrize("stripper", ["filter", "envoy"])
def test_a_client_request_carrying_the_direct_header_is_not_honoured(envoys, fake_pods, stripper):
    """Whether the filter (shipped strip removed) or Envoy's header_mutation (no wasm filter)
    strips it, no pod sees a client's direct header, and no client request reaches the direct
    cluster (no route references it)."""
    pods = fake_pods(2)
    # the six requests share one template with no user: hot across users, which would send a
    # (legitimate) prefill through the direct cluster; off, so only clients' requests are counted
    config = {"direct_calls": "always", "tick_period_ms": 200, "base_models": ["m"],
              "direct_pods": [{"id": p.name, "address": p.address} for p in pods],
              "triggers": {"shared_prompts": 100000}}
    envoy = envoys.start(pods=[p.address for p in pods], filter_config=config,
                         with_filter=stripper == "filter",
                         mutate=_without_envoy_strip if stripper == "filter" else None)
    for i in range(6):
        body = {"model": "m", "prompt": question(5, i), "max_tokens": 1}
        status, _, _ = envoy.post("/v1/completions", body, headers={DIRECT_HEADER: pods[i % 2].address})
        assert status == 200
        status, _, _ = envoy.request("GET", "/v1/models", headers={DIRECT_HEADER: pods[i % 2].address})
        assert status == 200
    seen = [r for p in pods for r in p.received()]
    assert len(seen) == 12
    assert not [r.headers for r in seen if DIRECT_HEADER in {k.lower() for k in r.headers}]
    direct = envoy.stats("cluster\\.prewarm-direct\\.upstream_rq_total$")
    assert direct.get("cluster.prewarm-direct.upstream_rq_total", 0) == 0


def test_budgets_hold_under_a_flood_of_distinct_users(standalone):
    budget = 3
    s = standalone(2, filter_config={"direct_calls_per_min": budget})
    templates = 8
    for i in range(templates):
        for k in range(3):
            s.completion(question(20 + i, k), user=f"flood-{i}")
    skipped = lambda: (s.envoy.metric("prewarm_filter_direct_skipped_total", reason="budget")
                       + s.envoy.metric("prewarm_filter_direct_skipped_total", reason="in_flight"))
    wait_until(lambda: s.envoy.metric("prewarm_filter_direct_sent_total") + skipped() == templates, 20,
               what="every prefill sent or skipped")
    wait_until(lambda: s.envoy.metric("prewarm_filter_direct_ok_total") == s.envoy.metric("prewarm_filter_direct_sent_total"), 20,
               what="the calls answered")
    assert s.envoy.metric("prewarm_filter_direct_sent_total") == budget
    assert s.envoy.metric("prewarm_filter_direct_skipped_total", reason="budget") >= 1
    assert sum(s.warming_calls().values()) == budget


def test_when_gateway_down_the_filter_takes_over_and_hands_back(tmp_path):
    spec = StackSpec(pods=2, filter_config={"direct_takeover_after_ms": 1000})
    stack = Stack(tmp_path, spec).start()
    try:
        envoy = stack.envoy
        metric = envoy.metric
        for k in range(3):
            stack.completion(question(40, k), user="before", max_tokens=CLIENT_TOKENS)
        wait_until(lambda: metric("prewarm_filter_signals_sent_total") >= 1, 20, what="the prefill signal reached the gateway")
        assert metric("prewarm_filter_direct_sent_total") == 0, "the gateway answers: it warms, not the filter"

        stack.gateway.proc.kill()
        wait_until(lambda: metric("prewarm_filter_direct_active") == 1, 20, what="the filter takes over")
        for k in range(3):
            stack.completion(question(41, k), user="while-down", max_tokens=CLIENT_TOKENS)
        wait_until(lambda: metric("prewarm_filter_direct_ok_total") == 1, 20, what="the filter prefilled")
        assert metric("prewarm_filter_direct_sent_total") == 1

        stack.restart_gateway()
        wait_until(lambda: metric("prewarm_filter_direct_active") == 0, 30, what="a gateway call succeeded: handed back")
        signals = metric("prewarm_filter_signals_sent_total")
        for k in range(3):
            stack.completion(question(42, k), user="after", max_tokens=CLIENT_TOKENS)
        wait_until(lambda: metric("prewarm_filter_signals_sent_total") > signals, 20, what="the signal went to the gateway")
        assert metric("prewarm_filter_direct_sent_total") == 1, "handed back: the gateway warms, the filter does not"
        assert metric("prewarm_filter_direct_failed_total") == 0
    finally:
        stack.close()
