"""Experiments: the admin API (bad input named, one experiment at a time, kept across restarts,
declared in the configuration), and through the real Envoy the filter's arms: sticky per user,
never chosen by the client's own header, each routed with its arm's settings."""
from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from harness import wait_until
from harness.gateway import READ_TOKEN, arms_of, compare, compare_run, start_gateway
from harness.stack import BASE_MODEL, AdapterSpec, Stack, StackSpec, question_text as question

ARM_HEADER = "x-prewarm-arm"
SEEN_ARM = "x-seen-arm"


def experiment(exp_id: str, weights=(0.5, 0.5), other_settings=None) -> dict:
    return {"id": exp_id, "arms": [
        {"name": "prefix", "weight": weights[0]},
        {"name": "other", "weight": weights[1], "settings": other_settings or {"warmup": False}},
    ]}


def metric(gw, prefix: str) -> float:
    text = gw.get("/metrics").text
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(prefix))


def test_the_experiment_api_names_bad_fields_runs_one_at_a_time_and_survives_a_restart(tmp_path):
    config = {"state": {"dir": str(tmp_path / "state"), "snapshot_interval_seconds": 0}}
    gw = start_gateway(tmp_path, config, name="gw-1")
    try:
        for body, field in [
            (experiment("e", (0.5, 0.4)), "arms: weights sum to 0.9"),
            (experiment("e", other_settings={"keep_warm": 1}), "arms[1].settings.keep_warm"),
            (experiment("e", other_settings={"budget": 1}), "arms[1].settings"),
            (experiment("e", other_settings={"routing": "random"}), "arms[1].settings.routing"),
            (experiment("e", other_settings={"residency_rule": "seed_keep"}), "arms[1].settings.residency_rule"),
            ({**experiment("e"), "unit": "pod"}, "unit"),
            (experiment("has space"), "id:"),
            ({"id": "e", "arms": [{"name": "only", "weight": 1}]}, "arms: 1 arms"),
            ({"id": "e"}, "body: missing field `arms`"),
        ]:
            r = gw.admin("POST", "/admin/experiments", json=body)
            assert r.status_code == 400 and r.json()["error"].startswith(field), (body, r.text)
        assert gw.get("/admin/experiments").json() == {"running": None}

        r = gw.admin("POST", "/admin/experiments", json=experiment("e", (0.05, 0.95)))
        assert r.status_code == 201, r.text
        started = r.json()["started_ms"]
        r = gw.admin("POST", "/admin/experiments", json=experiment("e", (0.25, 0.75)))
        assert r.status_code == 200 and r.json()["started_ms"] == started, r.text
        r = gw.admin("POST", "/admin/experiments", json=experiment("f"))
        assert r.status_code == 409 and '"e" is running' in r.json()["error"], r.text
        assert gw.get("/admin/experiments/f").status_code == 404
        detail = gw.get("/admin/experiments/e").json()
        assert [a["weight"] for a in detail["definition"]["arms"]] == [0.25, 0.75]
        assert detail["definition"]["arms"][1]["settings"] == {"warmup": False, "keep_warm": True,
                                                              "routing": "prefix"}
        assert gw.get("/v1/routing").json()["experiment"] == detail["definition"]
        assert metric(gw, 'prewarm_experiment_arm_weight{experiment="e",arm="other"}') == 0.75
        # only the admin token starts or ends one
        read_only = {"Authorization": f"Bearer {READ_TOKEN}"}
        assert requests.post(f"{gw.url}/admin/experiments", json=experiment("g"), headers=read_only,
                             timeout=30).status_code == 401

        # outcome records reach the report; impossible ones are dropped and counted
        at = detail["started_ms"] + 1
        outcomes = [{"arm": "e/prefix", "at_ms": at, "ttfb_ms": 40, "status": 200, "stream": False},
                    {"arm": "e/prefix", "at_ms": at, "ttfb_ms": 60, "status": 503, "stream": True},
                    {"arm": "e/other", "at_ms": at, "ttfb_ms": 5, "status": 42, "stream": False},
                    {"arm": "e/other", "at_ms": at, "ttfb_ms": 5, "status": 200, "stream": False,
                     "prompt_tokens": 10, "cached_tokens": 11}]
        r = gw.signals({"version": "1.0", "signals": [], "outcomes": outcomes, "outcomes_dropped": 3})
        assert r.status_code == 202, r.text
        arms = gw.get("/admin/experiments/e").json()["report"]["arms"]
        assert [(a["requests"], a["errors"]) for a in arms] == [(2, 1), (0, 0)], arms
        assert metric(gw, 'prewarm_outcomes_ingested_total{kind="rejected"}') == 2
        assert metric(gw, 'prewarm_outcomes_ingested_total{kind="dropped_by_filter"}') == 3

        gw.proc.signal(signal.SIGTERM)
        wait_until(lambda: not gw.proc.alive(), timeout=20, what="gateway exit")
        gw = start_gateway(tmp_path, config, name="gw-2")
        assert gw.get("/admin/experiments/e").json()["report"]["arms"] == arms, "the evidence is kept"
        kept = gw.get("/admin/experiments/e").json()
        assert (kept["definition"], kept["started_ms"]) == (detail["definition"], detail["started_ms"])
        assert gw.get("/v1/routing").json()["experiment"] == detail["definition"]

        assert gw.admin("DELETE", "/admin/experiments/f").status_code == 404
        assert gw.admin("DELETE", "/admin/experiments/e").json() == {"ended": "e"}
        assert gw.get("/admin/experiments").json() == {"running": None}
        assert "experiment" not in gw.get("/v1/routing").json()
        assert metric(gw, "prewarm_experiment_arm_weight") == 0
    finally:
        gw.proc.stop()


def test_a_declared_experiment_runs_from_the_start(tmp_path):
    config = {"experiment": experiment("declared", (0.3, 0.7), {"routing": "off"})}
    gw = start_gateway(tmp_path, config)
    try:
        running = gw.get("/admin/experiments").json()["running"]
        assert running["definition"]["id"] == "declared"
        assert running["definition"]["arms"][1]["settings"]["routing"] == "off"
        assert gw.get("/v1/routing").json()["experiment"]["id"] == "declared"
    finally:
        gw.proc.stop()


def seen_arm_header(config: dict) -> None:
    """Every response of the inference route echoes the arm header the pod received."""
    listener = config["static_resources"]["listeners"][0]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    for vhost in manager["route_config"]["virtual_hosts"]:
        vhost.setdefault("response_headers_to_add", []).append(
            {"header": {"key": SEEN_ARM, "value": f"%REQ({ARM_HEADER})%"},
             "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"})


def test_arms_are_sticky_per_user_never_chosen_by_the_client_and_routed_by_their_settings(tmp_path):
    stack = Stack(tmp_path, StackSpec(pods=2, envoy_mutate=seen_arm_header)).start()
    try:
        r = stack.gateway.admin("POST", "/admin/experiments",
                                json=experiment("exp", (0.5, 0.5), {"routing": "off"}))
        assert r.status_code == 201, r.text
        stack.wait_envoy_routes(*[p.address for p in stack.pods])
        unrouted_before = stack.envoy.metric("prewarm_filter_unrouted_total", reason="arm_off")
        arms: dict[str, str] = {}
        for n in range(60):
            user = f"user-{n % 20}"
            status, headers, _ = stack.post(
                "/v1/completions", {"model": BASE_MODEL, "prompt": question(n % 4, n), "max_tokens": 1},
                user=user, headers={ARM_HEADER: "exp/forged"})
            assert status == 200
            arm = headers.get(SEEN_ARM)
            assert arm in ("exp/prefix", "exp/other"), headers
            assert arms.setdefault(user, arm) == arm, f"{user} changed arm"
        assert set(arms.values()) == {"exp/prefix", "exp/other"}, arms
        # `prewarm-gateway arm` (core's rule, for tools) gives every user the arm the filter gave
        assert {u: f"exp/{a}" for u, a in arms_of(experiment("exp", (0.5, 0.5), {"routing": "off"}),
                                                  list(arms)).items()} == arms
        off = sum(3 for a in arms.values() if a == "exp/other")
        assert stack.envoy.metric("prewarm_filter_unrouted_total", reason="arm_off") - unrouted_before == off
        assert stack.envoy.metric("prewarm_filter_experiment_assigned_total") >= 60
        assert stack.envoy.wasm_failures() == {}
    finally:
        stack.close()


def test_an_arm_without_keep_warm_leaves_its_prefixes_to_the_pods_caches(tmp_path):
    """Arm `other` with `keep_warm: false`: through the real Envoy and filter, the prefix a user
    of that arm makes hot reaches the gateway's pool marked `keep_warm: false` (keep-warm leaves
    it alone), the one a user of the first arm makes hot is kept warm."""
    stack = Stack(tmp_path, StackSpec(pods=2)).start()
    try:
        definition = experiment("kw", (0.5, 0.5), {"keep_warm": False})
        r = stack.gateway.admin("POST", "/admin/experiments", json=definition)
        assert r.status_code == 201, r.text
        stack.wait_envoy_routes(*[p.address for p in stack.pods])
        candidates = [f"user-{n}" for n in range(40)]
        arm_of = arms_of(definition, candidates)
        users = {arm: next(u for u in candidates if arm_of[u] == arm) for arm in ("prefix", "other")}
        templates = {"prefix": 7101, "other": 7102}
        for arm, user in users.items():
            for k in range(4):  # a streak of similar prompts: the filter signals the prefix
                status, _, _ = stack.post("/v1/completions", {"model": BASE_MODEL, "max_tokens": 1,
                                                              "prompt": question(templates[arm], k)},
                                          user=user)
                assert status == 200

        def pool() -> dict:
            prompts = stack.gateway.get("/admin/prompts", params={"k": 100}).json()["prompts"]
            return {arm: [p["keep_warm"] for p in prompts if p["preview"].startswith(f"t{i} ")]
                    for arm, i in templates.items()}
        got = wait_until(lambda: (p := pool())["prefix"] and p["other"] and p, 30,
                         what="both arms' prefixes in the pool")
        assert got == {"prefix": [True], "other": [False]}, got
        assert stack.envoy.wasm_failures() == {}
    finally:
        stack.close()


def test_the_report_finds_envoys_own_balancing_worse_than_prefix_routing(tmp_path):
    """Arm `prefix` (the filter's routing) against arm `other` (routing off: Envoy's balancer) on the
    same traffic: each user holds one conversation of its own template, 3 turns. Prefix routing
    keeps a conversation on one pod (one miss in 3), the balancer spreads it over the 3 pods
    (about 2 misses in 3): the outcome records must show it, significantly."""
    spec = StackSpec(pods=3, podsim_flags=["--time-scale", "1", "--prefill-overhead-ms", "2",
                                           "--per-token-us", "150"])
    stack = Stack(tmp_path, spec).start()
    try:
        r = stack.gateway.admin("POST", "/admin/experiments",
                                json=experiment("ab", (0.5, 0.5), {"routing": "off"}))
        assert r.status_code == 201, r.text
        stack.wait_envoy_routes(*[p.address for p in stack.pods])
        users, turns = 60, 3

        def conversation(u: int) -> int:
            for k in range(turns):
                status, _, _ = stack.post("/v1/completions", {"model": BASE_MODEL, "max_tokens": 1,
                                                              "prompt": question(1000 + u, k)},
                                          user=f"user-{u}")
                assert status == 200
            return turns

        with ThreadPoolExecutor(max_workers=4) as pool:
            sent = sum(pool.map(conversation, range(users)))

        def arrived() -> int:
            # every outcome reaches the gateway but those of a batch the filter counted as
            # dropped (its dispatch timed out: a loaded CI machine can take > 500 ms to answer
            # one); such a batch may still have been ingested, so it is a lower bound
            return sent - stack.envoy.metric("prewarm_filter_outcomes_dropped_total")

        report = wait_until(
            lambda: (d := stack.gateway.get("/admin/experiments/ab").json()["report"])
            and sum(a["requests"] for a in d["arms"]) >= arrived() and d,
            30, what="every outcome at the gateway")
        prefix, off = report["arms"]
        assert arrived() >= sent // 2, "half of the outcomes lost"
        assert arrived() <= prefix["requests"] + off["requests"] <= sent
        assert min(prefix["requests"], off["requests"]) > 0
        assert prefix["error_rate"] == off["error_rate"] == 0.0
        assert prefix["with_usage"] == prefix["requests"], "podsim reports cached tokens"
        assert prefix["cached_token_ratio"] > off["cached_token_ratio"], report["arms"]
        c = report["comparisons"][0]
        assert (c["arm"], c["reference"]) == ("other", "prefix")
        assert c["significant"] and c["worse"] and not c["better"], c
        assert c["welch"]["p"] < 0.01 and c["mann_whitney"]["p"] < 0.01, c
        # every prompt here is a template of one size and a question of one length: no prompt
        # length to adjust for, so no adjusted comparison (rather than one by a made-up slope)
        assert c["prompt_adjusted"] is None, c
        assert report["hours"] and sum(a["requests"] for a in report["hours"][-1]["arms"]) > 0
        text = stack.gateway.get("/metrics").text
        assert 'prewarm_experiment_p_value{experiment="ab",arm="other",cohort="all",test="welch"}' in text
        # the histogram observed every record of the arm as it arrived: what the report counts
        assert metric(stack.gateway, 'prewarm_experiment_ttfb_seconds_count{experiment="ab",arm="prefix",cohort="all"}') \
            == prefix["requests"]
        assert 'prewarm_experiment_ttfb_seconds_bucket{le="+Inf",experiment="ab",arm="prefix",cohort="all"}' in text
        assert metric(stack.gateway, 'prewarm_outcomes_ingested_total{kind="accepted"}') >= arrived()
        # the power estimate: significant at this size, so the requests it needs are within it
        assert 0 < c["requests_needed"] <= max(prefix["requests"], off["requests"]) * 2, c
        # the first significance is an event, once, with the requests it took
        events = wait_until(
            lambda: [e["event"] for e in stack.gateway.get("/admin/experiments/ab").json()["events"]
                     if "significantly" in e["event"]] or None, 10, what="the significance event")
        raw = [e for e in events if "adjusted for prompt length" not in e]
        assert len(raw) == 1 and raw[0].startswith("arm other significantly slower than prefix after "), events
        assert all(" faster " not in e for e in events), events
        print(f"\n{raw[0]}; requests needed an arm at 80 % power: {c['requests_needed']}")
        print(f"\nA/B prefix vs routing off over {sent} requests: ttfb p50 {prefix['ttfb_p50_ms']} vs "
              f"{off['ttfb_p50_ms']} ms, p95 {prefix['ttfb_p95_ms']} vs {off['ttfb_p95_ms']} ms, cached "
              f"{prefix['cached_token_ratio']:.2f} vs {off['cached_token_ratio']:.2f}, welch p "
              f"{c['welch']['p']:.2e}, mann-whitney p {c['mann_whitney']['p']:.2e}")
    finally:
        stack.close()


def test_a_new_pods_first_requests_of_hot_prefixes_are_a_cohort_of_their_own(tmp_path):
    """Each of 40 users asks about its own template three times (a hot prefix: the filter's
    default streak), then a third pod joins and each asks twice more; the templates the joining
    pod's warm-up prefilled move to it (a repeat stays with the pod holding it unless the gateway
    placed it elsewhere). The report's `new_pods.first_requests` holds exactly the first of
    those the new pod served of each template (the prefix identity in the outcome records is the
    prompt's routing key, the same in both arms), and none of the pod's second requests."""
    spec = StackSpec(pods=2, spare_pods=1, podsim_flags=["--time-scale", "1", "--prefill-overhead-ms", "2",
                                                         "--per-token-us", "20"])
    stack = Stack(tmp_path, spec).start()
    try:
        r = stack.gateway.admin("POST", "/admin/experiments", json=experiment("firsts"))
        assert r.status_code == 201, r.text
        stack.wait_envoy_routes(*[p.address for p in stack.pods])
        users = range(40)
        for u in users:
            for k in range(3):
                stack.completion(question(3000 + u, k), user=f"user-{u}")
        new = stack.join_spare(0)
        wait_until(lambda: new.id in stack.routed_ids(), 60, interval=0.1, what="the new pod routed")
        stack.wait_envoy_routes(new.address)
        on_new: dict[int, int] = {}
        for u in users:
            for k in (3, 4):
                pod, _ = stack.completion(question(3000 + u, k), user=f"user-{u}")
                if pod is new:
                    on_new[u] = on_new.get(u, 0) + 1
        assert on_new, "no template moved to the new pod"
        want = {"new_pods": sum(on_new.values()), "first_requests": len(on_new)}

        def counts():
            rep = stack.gateway.get("/admin/experiments/firsts").json()["report"]
            got = {"new_pods": sum(a["requests"] for a in rep["new_pods"]["arms"]),
                   "first_requests": sum(a["requests"] for a in rep["new_pods"]["first_requests"]["arms"])}
            return got == want and rep
        report = wait_until(counts, 30, interval=0.2, what=f"the cohorts at {want}")
        assert report["new_pods"]["pods"] == [new.id]
        text = stack.gateway.get("/metrics").text
        assert 'cohort="new_pods_first_requests"' in text
    finally:
        stack.close()


def test_a_grey_release_that_is_worse_is_rolled_back_by_itself(tmp_path):
    """A release whose first arm leaves routing to Envoy's balancer (so a conversation's turns
    miss the cache on the pods it did not start on) starts at 50 % and must be rolled back to 0
    on time to first byte, with an event, a metric and the reason; the time from the harm
    starting (its first request) to the rollback is reported."""
    spec = StackSpec(pods=3, podsim_flags=["--time-scale", "1", "--prefill-overhead-ms", "2",
                                           "--per-token-us", "150"])
    stack = Stack(tmp_path, spec).start()
    try:
        body = {"id": "gr", "release": {"steps": [0.5], "step_seconds": 3600, "min_requests": 20},
                "arms": [{"name": "candidate", "weight": 0.5, "settings": {"routing": "off"}},
                         {"name": "control", "weight": 0.5}]}
        r = stack.gateway.admin("POST", "/admin/experiments", json=body)
        assert r.status_code == 201, r.text
        assert [a["weight"] for a in r.json()["definition"]["arms"]] == [0.5, 0.5]
        stack.wait_envoy_routes(*[p.address for p in stack.pods])

        def rolled_back():
            return stack.gateway.get("/admin/experiments/gr").json()["release"].get("rolled_back")

        def conversation(u: int) -> int:
            sent = 0
            for k in range(3):
                if k == 0 and rolled_back():
                    break
                status, _, _ = stack.post("/v1/completions", {"model": BASE_MODEL, "max_tokens": 1,
                                                              "prompt": question(2000 + u, k)},
                                          user=f"user-{u}")
                assert status == 200
                sent += 1
            return sent

        harm_started = time.time() * 1000
        with ThreadPoolExecutor(max_workers=4) as pool:
            sent = sum(pool.map(conversation, range(200)))
        rollback = wait_until(rolled_back, 30, what="the release rolled back")
        detail = stack.gateway.get("/admin/experiments/gr").json()
        assert rollback["reason"] == "ttfb", rollback
        assert [a["weight"] for a in detail["definition"]["arms"]] == [0.0, 1.0]
        assert stack.gateway.get("/v1/routing").json()["experiment"]["arms"][0]["weight"] == 0.0
        assert detail["events"][-1]["event"].startswith("rolled back (ttfb): arm control is faster")
        assert metric(stack.gateway, 'prewarm_experiment_rollbacks_total{experiment="gr",arm="candidate",'
                                     'reason="ttfb"}') == 1
        assert metric(stack.gateway, 'prewarm_experiment_release_step{experiment="gr"}') == -1
        arms = {a["arm"]: a["requests"] for a in detail["report"]["arms"]}
        print(f"\nrolled back {rollback['at_ms'] - harm_started:.0f} ms after the harm started, "
              f"after {sum(arms.values())} requests ({arms}); {sent} sent in all: {rollback['detail']}")
    finally:
        stack.close()


def test_a_release_whose_warm_up_is_slow_is_rolled_back_and_a_fast_one_is_not(tmp_path):
    """The third rollback criterion: the first arm alone brings warm-up and its keys' p95 in the
    step exceeds `warmup_p95_ms`. A fast joining pod's plan (podsim at 20x: a few ms a key)
    leaves the release alone; a pod whose every prefill costs 2 s rolls it back with the reason,
    an event and a metric. The limit is set at 1 s, far from both, so a loaded machine's
    latency cannot decide the test. No traffic: the keys are the gateway's own calls."""
    from harness.podsim import start_podsim
    from test_gateway import BASE, gateway_config, pod_spec, routed_ids, template_text

    a, a_url = start_podsim(tmp_path, "--time-scale", "20", name="pod-a")
    fast, fast_url = start_podsim(tmp_path, "--time-scale", "20", name="pod-fast")
    slow, slow_url = start_podsim(tmp_path, "--time-scale", "1", "--prefill-overhead-ms", "2000",
                                  name="pod-slow")
    warmup = {"first_tier": 30, "second_tier": 30, "first_tier_concurrency": 4,
              "second_tier_concurrency": 2, "deadline_ms": 120000}
    gw = start_gateway(tmp_path, gateway_config([pod_spec("a", a_url)], warmup=warmup))
    try:
        wait_until(lambda: routed_ids(gw) == ["a"], timeout=20, what="pod a routable")
        for i in range(80):  # a joining pod's placement gets a share of them
            r = gw.admin("POST", "/admin/prompts", json={"model": BASE, "text": template_text(i)})
            assert r.status_code == 201, r.text
        body = {"id": "wu", "release": {"steps": [0.5], "step_seconds": 3600, "min_requests": 20,
                            "warmup_p95_ms": 1000},
                "arms": [{"name": "warm", "weight": 0.5},
                         {"name": "cold", "weight": 0.5, "settings": {"warmup": False}}]}
        r = gw.admin("POST", "/admin/experiments", json=body)
        assert r.status_code == 201, r.text

        def warmed(pod: str):
            return (gw.get(f"/admin/pods/{pod}/warmup").json()["warmup"] or {}).get("phase") == "done"

        def prefills() -> float:
            return metric(gw, 'prewarm_warmup_key_seconds_count{kind="prefill"}')

        r = gw.admin("POST", "/admin/pods", json=pod_spec("fast", fast_url))
        assert r.status_code == 201, r.text
        wait_until(lambda: warmed("fast"), timeout=60, what="the fast pod's warm-up done")
        fast_keys = prefills()
        assert fast_keys >= 20, "enough keys for a p95"
        time.sleep(1.5)  # at least one release check after the last key
        assert gw.get("/admin/experiments/wu").json()["release"].get("rolled_back") is None

        r = gw.admin("POST", "/admin/pods", json=pod_spec("slow", slow_url))
        assert r.status_code == 201, r.text

        def rolled_back():
            return gw.get("/admin/experiments/wu").json()["release"].get("rolled_back")

        rollback = wait_until(rolled_back, timeout=90, what="the release rolled back")
        assert rollback["reason"] == "warmup", rollback
        assert rollback["detail"].startswith("warm-up p95 "), rollback
        assert rollback["detail"].endswith("above 1000 ms"), rollback
        detail = gw.get("/admin/experiments/wu").json()
        assert [a["weight"] for a in detail["definition"]["arms"]] == [0.0, 1.0]
        assert detail["events"][-1]["event"].startswith("rolled back (warmup)")
        assert metric(gw, 'prewarm_experiment_rollbacks_total{experiment="wu",arm="warm",'
                          'reason="warmup"}') == 1
        print(f"\nfast pod: {fast_keys:.0f} keys, no rollback; slow pod: {rollback['detail']} "
              f"after {prefills() - fast_keys:.0f} of its keys")
    finally:
        gw.proc.stop()
        for p in (a, fast, slow):
            p.stop()


def test_a_tenant_experiment_splits_by_tenant_and_gives_its_adapters_the_arms_residency_rule(tmp_path):
    """`unit: "tenant"`: through the real Envoy and filter, every user of a tenant gets the
    tenant's arm and a request without a tenant gets none; the gateway gives each registered
    adapter the residency rule of its tenant's arm on every pod (GET /admin/pods/{id})."""
    tenants = [f"tenant-{t}" for t in range(6)]
    adapters = [AdapterSpec(f"lora-{t}", tenant=tenant) for t, tenant in enumerate(tenants)]
    stack = Stack(tmp_path, StackSpec(pods=2, adapters=adapters, envoy_mutate=seen_arm_header)).start()
    try:
        definition = {"id": "slots", "unit": "tenant", "arms": [
            {"name": "keep", "weight": 0.5, "settings": {"residency_rule": "seed_keep"}},
            {"name": "lru", "weight": 0.5}]}
        r = stack.gateway.admin("POST", "/admin/experiments", json=definition)
        assert r.status_code == 201, r.text
        stack.wait_envoy_routes(*[p.address for p in stack.pods])
        wait_until(lambda: stack.envoy.metric("prewarm_filter_table_generation") >= stack.routing()["generation"]
                   and "experiment" in stack.routing(), 30, what="Envoy adopts the table with the experiment")
        arm_of = arms_of(definition, tenants)
        assert set(arm_of.values()) == {"keep", "lru"}, arm_of
        for n, tenant in enumerate(tenants):
            for user in ("alice", "bob"):
                status, headers, _ = stack.post(
                    "/v1/completions", {"model": f"lora-{n}", "prompt": question(n, 0), "max_tokens": 1},
                    user=user, tenant=tenant, headers={ARM_HEADER: "slots/keep"})
                assert status == 200
                assert headers.get(SEEN_ARM) == f"slots/{arm_of[tenant]}", (tenant, user, headers)
        no_unit = stack.envoy.metric("prewarm_filter_experiment_no_unit_total")
        status, headers, _ = stack.post("/v1/completions", {"model": BASE_MODEL, "prompt": question(9, 0),
                                                            "max_tokens": 1}, user="alice")
        assert status == 200 and not (headers.get(SEEN_ARM) or "").startswith("slots/"), headers
        assert stack.envoy.metric("prewarm_filter_experiment_no_unit_total") == no_unit + 1

        want = {f"lora-{n}": "seed_keep" if arm_of[t] == "keep" else "lru2" for n, t in enumerate(tenants)}

        def rules(pod: str) -> dict:
            lora = stack.gateway.get(f"/admin/pods/{pod}").json()["lora"]
            return {a["name"]: a["residency_rule"] for a in lora if a["name"] in want}
        for p in stack.pods:
            wait_until(lambda: rules(p.id) == want, 15, what=f"the arms' rules on {p.id}")
        r = stack.gateway.admin("DELETE", "/admin/experiments/slots")
        assert r.status_code == 200, r.text
        for p in stack.pods:
            wait_until(lambda: set(rules(p.id).values()) == {"lru2"}, 15, what=f"[lora]'s rule again on {p.id}")
        assert stack.envoy.wasm_failures() == {}
    finally:
        stack.close()


def test_compare_applies_the_reports_rule_to_samples_a_tool_holds():
    """`prewarm-gateway compare`: two samples in, the report's tests and verdict out; a shifted
    sample is significant, the same sample is not; bad input is exit 2 naming the field."""
    base = [100.0 + (i * 37) % 50 for i in range(150)]
    shifted = compare([x + 40 for x in base], base)
    assert shifted["significant"] and shifted["mean_diff"] == pytest.approx(40.0), shifted
    assert shifted["welch"]["p"] < 0.01 and shifted["mann_whitney"]["p"] < 0.01
    same = compare(base, base)
    assert not same["significant"] and same["welch"]["p"] > 0.9, same
    for body, field in (('{"arm": [1], "referenc": [2]}', "referenc"), ('{"arm": ["x"], "reference": []}', "line 1"),
                        (json.dumps({"arm": [], "reference": [0.0] * 1_000_001}), "reference:")):
        done = compare_run(body)
        assert done.returncode == 2 and field in done.stderr, (body[:60], done.stderr)
