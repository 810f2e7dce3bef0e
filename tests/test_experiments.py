"""Experiments: the admin API (bad input named, one experiment at a time, kept across restarts,
declared in the configuration), and through the real Envoy the filter's arms: sticky per user,
never chosen by the client's own header, each routed with its arm's settings."""
from __future__ import annotations

import signal

import requests

from harness import wait_until
from harness.gateway import READ_TOKEN, start_gateway
from harness.stack import BASE_MODEL, Stack, StackSpec, question_text as question

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
            (experiment("e", other_settings={"keep_warm": 1}), "arms[1].settings"),
            (experiment("e", other_settings={"routing": "random"}), "arms[1].settings.routing"),
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
        assert detail["definition"]["arms"][1]["settings"] == {"warmup": False, "routing": "prefix"}
        assert gw.get("/v1/routing").json()["experiment"] == detail["definition"]
        assert metric(gw, 'prewarm_experiment_arm_weight{experiment="e",arm="other"}') == 0.75
        # only the admin token starts or ends one
        read_only = {"Authorization": f"Bearer {READ_TOKEN}"}
        assert requests.post(f"{gw.url}/admin/experiments", json=experiment("g"), headers=read_only,
                             timeout=30).status_code == 401

        gw.proc.signal(signal.SIGTERM)
        wait_until(lambda: not gw.proc.alive(), timeout=20, what="gateway exit")
        gw = start_gateway(tmp_path, config, name="gw-2")
        assert gw.get("/admin/experiments/e").json() == detail, "kept across the restart"
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
        unrouted_before = stack.envoy.metric("prewarm.unrouted.arm_off")
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
        off = sum(3 for a in arms.values() if a == "exp/other")
        assert stack.envoy.metric("prewarm.unrouted.arm_off") - unrouted_before == off
        assert stack.envoy.metric("prewarm.experiment.assigned") >= 60
        assert stack.envoy.wasm_failures() == {}
    finally:
        stack.close()
