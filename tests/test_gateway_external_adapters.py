"""`[lora] loads = "external"`: another controller (llm-d, AIBrix) owns the pods' LoRA adapters.

The real prewarm-gateway binary against a real podsim pod on loopback. Before the gateway knows
the pod, the test plays the other controller: it loads two adapters on the pod through vLLM's
runtime route, filling the pod's two registration slots. The gateway has its own adapter
registered (pinned, gold) and a hot prompt (a template, `POST /admin/prompts`). Then the pod
joins, and the adapter is pinned by an operator and by a filter's pin signal.

Asserted outcomes, read from the pod itself (`/v1/models`, its prefix cache) and the table:
- with "external", the pod holds exactly the other controller's two adapters: prewarm neither
  loaded its own nor unloaded one of theirs to make room; its hot prompt is cached on the pod
  all the same, and the routing table lists the adapters the pod holds;
- with the default ("prewarm"), the same script does load the gateway's adapter (unloading one
  of the others to make room): the assertions above can fail.
"""
from __future__ import annotations

import pytest
import requests

from harness import wait_until
from harness.gateway import start_gateway
from harness.podsim import make_adapter, start_podsim
from test_gateway import BASE, cached_tokens, template_text  # the gateway tests' templates

EXTERNAL = {"ext-a", "ext-b"}


def served_adapters(pod_url: str) -> set[str]:
    cards = requests.get(f"{pod_url}/v1/models", timeout=10).json()["data"]
    return {c["id"] for c in cards if c.get("parent")}


def routed_adapters(gw, pod_id: str) -> set[str]:
    pods = gw.get("/v1/routing").json()["pods"]
    return {a for p in pods if p["id"] == pod_id for a in p.get("adapters", [])}


def metric(gw, prefix: str) -> float:
    text = gw.get("/metrics").text
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(prefix))


def load_as_the_other_controller(pod_url: str, name: str, path) -> None:
    r = requests.post(f"{pod_url}/v1/load_lora_adapter",
                      json={"lora_name": name, "lora_path": str(path)}, timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("loads", ["external", "prewarm"])
def test_external_loads_leave_adapters_to_the_other_controller_and_still_warm_prompts(tmp_path, loads):
    pod, url = start_podsim(tmp_path, "--enable-lora", "--max-loras", "2", "--max-cpu-loras", "2",
                            "--enable-prompt-tokens-details", "--time-scale", "20", name="pod")
    adapters = tmp_path / "adapters"
    for name in sorted(EXTERNAL):
        load_as_the_other_controller(url, name, make_adapter(adapters, name))
    assert served_adapters(url) == EXTERNAL
    config = {
        "pods": {"base_model": BASE, "health_interval_ms": 100, "unhealthy_after": 1},
        "warmup": {"first_tier": 4, "second_tier": 4, "deadline_ms": 120000},
        "lora": {"loads": loads},
    }
    gw = start_gateway(tmp_path, config, name=f"gw-{loads}")
    try:
        key = gw.admin("POST", "/admin/prompts", json={"model": BASE, "text": template_text(1)})
        assert key.status_code == 201, key.text
        r = gw.admin("POST", "/admin/adapters", json={
            "name": "ours", "path": str(make_adapter(adapters, "ours")), "tier": "gold", "pinned": True})
        assert r.status_code == 201, r.text
        r = gw.admin("POST", "/admin/pods", json={
            "id": "p", "address": url.removeprefix("http://"), "max_loras": 2, "max_cpu_loras": 2})
        assert r.status_code == 201, r.text
        wait_until(lambda: gw.get("/admin/pods/p/warmup").json()["warmup"]["phase"] == "done",
                   timeout=30, what="the pod's warm-up done")
        # An operator's pin and a filter's pin signal ask for the adapter again.
        pin = gw.admin("POST", "/admin/adapters/ours/pin")
        assert pin.status_code == 200, pin.text
        batch = {"version": "1.0", "source": "test", "signals": [
            {"kind": "pin", "adapter": "ours", "rate_per_minute": 30.0, "priority": 90}]}
        assert gw.signals(batch).status_code == 202
        # The gateway has seen the pod's adapters (its /v1/models reconciliation) and routes them.
        wait_until(lambda: EXTERNAL & served_adapters(url) <= routed_adapters(gw, "p")
                   and routed_adapters(gw, "p"), timeout=20, what="the pod's adapters in the table")
        # The hot prompt was prefilled on the pod: its blocks are cached there.
        assert cached_tokens(url, template_text(1)) >= 1536 // 4 // 16 * 16
        if loads == "external":
            assert served_adapters(url) == EXTERNAL
            assert routed_adapters(gw, "p") == EXTERNAL
            assert [o for o in pin.json().get("outcomes", []) if o["action"] in ("load", "unload")] == []
            assert metric(gw, "prewarm_adapter_loads_total") == 0
        else:
            held = served_adapters(url)
            assert "ours" in held and not EXTERNAL <= held, held
            assert metric(gw, 'prewarm_adapter_loads_total{pod="p",outcome="ok"}') >= 1
    finally:
        gw.proc.stop()
        pod.stop()


def test_a_bad_lora_loads_value_is_refused_naming_the_key(tmp_path):
    import subprocess

    from harness import bin_path
    from harness.gateway import write_config

    path = write_config(tmp_path, {"lora": {"loads": "llm-d"}}, "bad")
    r = subprocess.run([bin_path("prewarm-gateway"), "check-config", "--config", path],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 64, r.stderr
    assert 'lora.loads: "llm-d": must be "prewarm"' in r.stderr, r.stderr
