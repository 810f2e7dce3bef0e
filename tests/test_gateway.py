"""The real prewarm-gateway binary against real podsim processes on loopback.

Asserted outcomes: what the pods hold (prefix cache hits reported by podsim, adapters listed by
its /v1/models), what the routing table contains and when, and what survives a restart.
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from harness import bin_path, wait_until
from harness.fake_servers import MisbehavingPod, RecordingServer
from harness.gateway import fingerprint, start_gateway, write_config
from harness.podsim import make_adapter, start_podsim

BASE = "meta-llama/Llama-3.1-8B-Instruct"
SUFFIX = "\n>>>"  # the gateway's prefill suffix: one token


def template_text(i: int) -> str:
    # 6 blocks of 64 tokens (1,536 bytes) and a bit, distinct from the first byte.
    line = f"Template {i:03d}: you are a careful assistant for tenant number {i}. "
    return (line * 40)[: 1536 + 10]


def cached_tokens(pod_url: str, text: str) -> int:
    r = requests.post(
        f"{pod_url}/v1/completions",
        json={"model": BASE, "prompt": text + SUFFIX, "max_tokens": 1},
        timeout=30,
    )
    r.raise_for_status()
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def completions_served(pod_url: str) -> float:
    text = requests.get(f"{pod_url}/metrics", timeout=10).text
    return sum(
        float(l.rsplit(" ", 1)[1])
        for l in text.splitlines()
        if l.startswith("vllm:request_success_total{")
    )


def routed_ids(gw) -> list[str]:
    return [p["id"] for p in gw.get("/v1/routing").json()["pods"]]


def pod_spec(pod_id: str, url: str, **extra) -> dict:
    return {"id": pod_id, "address": url.removeprefix("http://"), **extra}


def metric(gw, prefix: str) -> float:
    text = gw.get("/metrics").text
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(prefix))


SLOW_POD = ("--enable-prompt-tokens-details", "--prefill-overhead-ms", "150", "--per-token-us", "0")


def gateway_config(pods: list[dict], **sections) -> dict:
    config = {
        "pods": {"base_model": BASE, "health_interval_ms": 100, "unhealthy_after": 1, "static": pods},
        "warmup": {"first_tier": 4, "second_tier": 4, "first_tier_concurrency": 1,
                   "second_tier_concurrency": 1, "deadline_ms": 120000},
    }
    config.update(sections)
    return config


def test_check_config_lists_every_problem_and_exits_64(tmp_path):
    path = write_config(tmp_path, {"server": {"listen": "nowhere"}, "warmup": {"kv_usage_high": 2.0},
                                   "pods": {"static": [{"id": "a", "address": "no-port"}]}}, "bad")
    r = subprocess.run([bin_path("prewarm-gateway"), "check-config", "--config", path],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 64
    for field in ("server.listen", "warmup.kv_usage_high", "pods.static[0].address"):
        assert field in r.stderr, r.stderr
    served = subprocess.run([bin_path("prewarm-gateway"), "serve", "--config", path],
                            capture_output=True, text=True, timeout=30)
    assert served.returncode == 64 and "listening" not in served.stdout
    good = write_config(tmp_path, {}, "good")
    ok = subprocess.run([bin_path("prewarm-gateway"), "check-config", "--config", good],
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr


def test_joining_pod_is_warmed_before_it_enters_the_table(tmp_path):
    a, a_url = start_podsim(tmp_path, "--enable-prompt-tokens-details", "--time-scale", "20", name="pod-a")
    b, b_url = start_podsim(tmp_path, *SLOW_POD, name="pod-b")
    gw = start_gateway(tmp_path, gateway_config([pod_spec("a", a_url)]))
    try:
        wait_until(lambda: routed_ids(gw) == ["a"], timeout=20, what="pod a routable")
        texts = {}
        for i in range(16):
            r = gw.admin("POST", "/admin/prompts", json={"model": BASE, "text": template_text(i)})
            assert r.status_code == 201, r.text
            texts[r.json()["key"]] = template_text(i)
        # The demo's way: announce the new pod through the admin API.
        r = gw.admin("POST", "/admin/pods", json=pod_spec("b", b_url))
        assert r.status_code == 201, r.text
        plan = wait_until(lambda: gw.get("/admin/pods/b/warmup").json()["warmup"], timeout=20, what="b plan")
        expected = gw.get("/admin/pods/b/plan").json()
        moved = expected["first_tier"] + expected["second_tier"]
        assert 0 < len(expected["first_tier"]) <= 4 and expected["adapters"] == []
        # Until the first tier is done, b is not routed to; once routed, its first tier is warm.
        saw_warming = False
        while True:
            table = routed_ids(gw)
            status = gw.get("/admin/pods/b/warmup").json()["warmup"]
            if "b" in table:
                break
            if status["first_tier"]["done"] < status["first_tier"]["total"]:
                saw_warming = True
            assert status["phase"] != "interrupted"
        assert saw_warming, "the first tier finished before the table was ever read"
        after = gw.get("/admin/pods/b/warmup").json()["warmup"]
        assert after["first_tier_done_ms"] is not None and after["routable"]
        assert plan["first_tier"]["total"] == len(expected["first_tier"])
        wait_until(lambda: gw.get("/admin/pods/b/warmup").json()["warmup"]["phase"] == "done",
                   timeout=30, what="b warm-up done")
        # Exactly the moved prefixes were prefilled on b, and they are cached there.
        assert completions_served(b_url) == len(moved)
        for key in moved:
            assert cached_tokens(b_url, texts[key]) >= 1536 // 4 // 16 * 16
        for key in set(texts) - set(moved):
            assert cached_tokens(b_url, texts[key]) == 0
        assert r.status_code == 201
        assert requests.get(f"{gw.url}/v1/pods/b/ready", timeout=5).status_code == 200
        assert metric(gw, "prewarm_warmup_duration_seconds_count") >= 2
        assert metric(gw, 'prewarm_prefills_total{pod="b",outcome="ok"}') == len(moved)
        # Every hot prefix routed to b is modelled resident there.
        wait_until(lambda: metric(gw, 'prewarm_modelled_hit_ratio{pod="b"}') == 1.0, timeout=10,
                   what="b's modelled hit ratio")
    finally:
        gw.proc.stop()
        a.stop()
        b.stop()


def test_pod_that_dies_mid_warmup_is_replanned_when_it_returns(tmp_path):
    a, a_url = start_podsim(tmp_path, "--enable-prompt-tokens-details", "--time-scale", "20", name="pod-a")
    b, b_url = start_podsim(tmp_path, *SLOW_POD, name="pod-b1")
    gw = start_gateway(tmp_path, gateway_config([pod_spec("a", a_url), pod_spec("b", b_url)],
                                                warmup={"first_tier": 8, "second_tier": 8,
                                                        "first_tier_concurrency": 1,
                                                        "deadline_ms": 120000}))
    try:
        texts = {}
        for i in range(40):
            r = gw.admin("POST", "/admin/prompts", json={"model": BASE, "text": template_text(i)})
            texts[r.json()["key"]] = template_text(i)
        # Templates arrived after the first plans: trigger b's warm-up to plan them.
        wait_until(lambda: gw.get("/admin/pods/b").json()["health"] == "up", timeout=20, what="b up")
        r = gw.admin("POST", "/admin/pods/b/warmup")
        assert r.status_code == 202, r.text
        wait_until(lambda: gw.get("/admin/pods/b/warmup").json()["warmup"]["first_tier"]["done"] >= 1,
                   timeout=20, what="b partly warmed")
        status = gw.get("/admin/pods/b/warmup").json()["warmup"]
        assert status["first_tier"]["done"] < status["first_tier"]["total"]
        port = b_url.rsplit(":", 1)[1]
        b.kill()
        wait_until(lambda: gw.get("/admin/pods/b").json()["health"] == "down", timeout=20, what="b down")
        assert "b" not in routed_ids(gw)
        b2, _ = start_podsim(tmp_path, *SLOW_POD, "--port", port, name="pod-b2")
        try:
            wait_until(lambda: "b" in routed_ids(gw), timeout=60, what="b back in the table")
            status = gw.get("/admin/pods/b/warmup").json()["warmup"]
            assert status["attempt"] == 2 and status["first_tier_done_ms"] is not None
            plan = gw.get("/admin/pods/b/plan").json()
            for key in plan["first_tier"]:
                assert cached_tokens(b_url, texts[key]) > 0
        finally:
            b2.stop()
    finally:
        gw.proc.stop()
        a.stop()
        b.stop()


def lora_pod(tmp_path, name, *flags):
    return start_podsim(tmp_path, "--enable-lora", "--max-loras", "2", "--max-cpu-loras", "2",
                        "--time-scale", "20", *flags, name=name)


def served_adapters(pod_url: str) -> set[str]:
    cards = requests.get(f"{pod_url}/v1/models", timeout=10).json()["data"]
    return {c["id"] for c in cards if c.get("parent")}


def pin_signal(gw, adapter: str, priority: int = 50) -> None:
    batch = {"version": "1.0", "source": "test", "signals": [
        {"kind": "pin", "adapter": adapter, "rate_per_minute": 30.0, "priority": priority}]}
    r = gw.signals(batch)
    assert r.status_code == 202 and r.json()["pins"] == 1, r.text


def test_gold_adapter_survives_bronze_pressure(tmp_path):
    pod, url = lora_pod(tmp_path, "lora-pod")
    spec = pod_spec("p", url, max_loras=2, max_cpu_loras=2)
    config = gateway_config([spec])
    config["pods"]["adapter_replicas"] = 1
    gw = start_gateway(tmp_path, config)
    try:
        wait_until(lambda: routed_ids(gw) == ["p"], timeout=20, what="pod routable")
        root = tmp_path / "adapters"
        names = ["gold-a"] + [f"bronze-{i}" for i in range(5)]
        for n in names:
            tier = "gold" if n.startswith("gold") else "bronze"
            r = gw.admin("POST", "/admin/adapters",
                         json={"name": n, "path": str(make_adapter(root, n)), "tier": tier, "tenant": n})
            assert r.status_code == 201, r.text
            assert r.json()["adapter"]["current"]["rank"] == 8
        pin_signal(gw, "gold-a", priority=10)
        wait_until(lambda: "gold-a" in served_adapters(url), timeout=20, what="gold loaded")
        seen = set()
        for rnd in range(2):
            for i in range(5):
                b = f"bronze-{i}"
                pin_signal(gw, b, priority=90)
                wait_until(lambda: b in served_adapters(url), timeout=20, what=f"{b} loaded")
                now = served_adapters(url)
                assert "gold-a" in now, now
                assert len(now) <= 2
                seen.add(b)
        assert len(seen) == 5
        assert metric(gw, 'prewarm_adapter_unloads_total{pod="p",outcome="ok"}') >= 4
        table = gw.get("/v1/routing").json()
        assert "gold-a" in table["pods"][0]["adapters"]
        heat = gw.get("/admin/adapters/heatmap").json()
        assert heat["pods"] == ["p"] and heat["cells"][heat["adapters"].index("gold-a")][0] != "absent"
    finally:
        gw.proc.stop()
        pod.stop()


def test_manifest_mismatch_refuses_the_load(tmp_path):
    pod, url = lora_pod(tmp_path, "lora-pod")
    spec = pod_spec("p", url, max_loras=2, max_cpu_loras=2)
    gw = start_gateway(tmp_path, gateway_config([spec]))
    try:
        wait_until(lambda: routed_ids(gw) == ["p"], timeout=20, what="pod routable")
        path = make_adapter(tmp_path / "adapters", "sql-lora")
        r = gw.admin("POST", "/admin/adapters", json={"name": "sql-lora", "path": str(path), "version": "v1"})
        assert r.status_code == 201, r.text
        manifest = r.json()["adapter"]["current"]["manifest"]
        assert {f["path"] for f in manifest["files"]} == {"adapter_config.json", "adapter_model.safetensors"}
        weights = Path(path) / "adapter_model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-1] + b"\x01")
        r = gw.admin("POST", "/admin/adapters/sql-lora/pin")
        assert r.status_code == 200, r.text
        outcomes = r.json()["outcomes"]
        assert [o["outcome"] for o in outcomes if o["action"] == "load"] == ["refused_manifest"]
        assert "adapter_model.safetensors" in outcomes[0]["error"]
        assert "sql-lora" not in served_adapters(url)
        assert metric(gw, 'prewarm_adapter_loads_total{pod="p",outcome="refused_manifest"}') == 1
        # Re-registering the files as they are now (a new version) lets the load through.
        r = gw.admin("POST", "/admin/adapters", json={"name": "sql-lora", "path": str(path), "version": "v2"})
        assert r.status_code == 200 and r.json()["rollout"]["consistent"], r.text
        r = gw.admin("POST", "/admin/adapters/sql-lora/pin")
        assert [o["outcome"] for o in r.json()["outcomes"] if o["action"] == "load"] == ["ok"]
        assert "sql-lora" in served_adapters(url)
    finally:
        gw.proc.stop()
        pod.stop()


def state_of(gw) -> tuple[set, dict]:
    prompts = {p["key"] for p in gw.get("/admin/prompts").json()["prompts"] if p["origin"] == "static"}
    adapters = {a["name"]: a["pinned"] for a in gw.get("/admin/adapters").json()["adapters"]}
    return prompts, adapters


def test_restart_keeps_templates_registry_and_pins(tmp_path):
    config = {"pods": {"base_model": BASE}, "state": {"dir": str(tmp_path / "state"),
                                                     "snapshot_interval_seconds": 0}}
    gw = start_gateway(tmp_path, config, name="gw-1")
    key = gw.admin("POST", "/admin/prompts", json={"model": BASE, "text": template_text(1)}).json()["key"]
    path = make_adapter(tmp_path / "adapters", "kept")
    assert gw.admin("POST", "/admin/adapters", json={"name": "kept", "path": str(path), "tier": "gold"}).status_code == 201
    assert gw.admin("POST", "/admin/adapters/kept/pin").status_code == 200
    before = state_of(gw)
    assert before == ({key}, {"kept": True})
    gw.proc.signal(signal.SIGTERM)
    wait_until(lambda: not gw.proc.alive(), timeout=20, what="gateway exit")
    assert gw.proc.stop() == 0

    gw = start_gateway(tmp_path, config, name="gw-2")
    assert gw.get("/readyz").status_code == 200
    assert state_of(gw) == before
    # SIGKILL after an explicit snapshot: what the snapshot holds survives.
    key2 = gw.admin("POST", "/admin/prompts", json={"model": BASE, "text": template_text(2)}).json()["key"]
    assert gw.admin("POST", "/admin/snapshot").status_code == 200
    gw.proc.kill()
    gw = start_gateway(tmp_path, config, name="gw-3")
    assert state_of(gw) == ({key, key2}, {"kept": True})
    gw.proc.kill()
    # A truncated current snapshot falls back to the previous generation, with a metric.
    current = tmp_path / "state" / "snapshot.json"
    current.write_bytes(current.read_bytes()[:-7])
    gw = start_gateway(tmp_path, config, name="gw-4")
    try:
        assert gw.get("/readyz").status_code == 200
        assert state_of(gw) == before
        assert metric(gw, 'prewarm_snapshot_fallbacks_total{reason="previous_generation"}') == 1
        assert "previous" in gw.proc.output()
    finally:
        gw.proc.stop()


def test_parallel_snapshots_then_sigkill_leave_a_loadable_state(tmp_path):
    """16 `POST /admin/snapshot` at once (beside the periodic writer) all succeed, each a whole
    generation; a SIGKILL in the middle of another burst leaves a state a restart loads as it
    was, nothing set aside as corrupt."""
    state = tmp_path / "state"
    config = {"pods": {"base_model": BASE}, "state": {"dir": str(state), "snapshot_interval_seconds": 1}}
    gw = start_gateway(tmp_path, config, name="gw-1")
    keys = {gw.admin("POST", "/admin/prompts", json={"model": BASE, "text": template_text(i) * 20}).json()["key"]
            for i in range(40)}
    assert len(keys) == 40

    def burst() -> list[int]:
        def one(_) -> int:
            try:
                return gw.admin("POST", "/admin/snapshot").status_code
            except requests.RequestException:
                return 0  # the connection died with the process
        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(one, range(16)))

    assert burst() == [200] * 16
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(burst)
        wait_until(lambda: (state / "snapshot.json.tmp").exists() or pending.done(), timeout=20, interval=0.001,
                   what="a snapshot write under way")
        gw.proc.kill()
        pending.result(timeout=60)
    assert not list(state.glob("*.unusable-*")), "nothing set aside"
    gw = start_gateway(tmp_path, config, name="gw-2")
    try:
        assert gw.get("/readyz").status_code == 200
        assert state_of(gw)[0] == keys
        assert metric(gw, 'prewarm_snapshot_fallbacks_total{reason="none_usable"}') == 0
    finally:
        gw.proc.stop()


def test_plan_command_prints_the_plan_without_touching_pods(tmp_path):
    state = tmp_path / "state"
    config = {"pods": {"base_model": BASE, "static": [{"id": "a", "address": "127.0.0.1:9"},
                                                       {"id": "b", "address": "127.0.0.1:9"}]},
              "state": {"dir": str(state), "snapshot_interval_seconds": 0}}
    gw = start_gateway(tmp_path, config, name="planner")
    for i in range(12):
        gw.admin("POST", "/admin/prompts", json={"model": BASE, "text": template_text(i)})
    assert gw.admin("POST", "/admin/snapshot").status_code == 200
    gw.proc.stop()
    path = write_config(tmp_path, config, "plan")
    out = {}
    for pod in ("a", "b"):
        r = subprocess.run([bin_path("prewarm-gateway"), "plan", "--config", path, "--pod", pod],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        import json
        out[pod] = json.loads(r.stdout)
    a, b = out["a"], out["b"]
    assert a["considered"] == b["considered"] == 12
    moved_a = set(a["first_tier"] + a["second_tier"])
    moved_b = set(b["first_tier"] + b["second_tier"])
    assert a["lazy"] == b["lazy"] == 0
    assert moved_a.isdisjoint(moved_b) and len(moved_a | moved_b) == 12
    r = subprocess.run([bin_path("prewarm-gateway"), "plan", "--config", path, "--pod", "zz"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "zz" in r.stderr


@pytest.mark.parametrize("engine,error_format", [("vllm", "nested"), ("vllm", "flat"), ("sglang", "nested")])
def test_engine_dialects_load_prefill_and_report_errors(tmp_path, engine, error_format):
    pod, url = start_podsim(tmp_path, "--engine", engine, "--error-format", error_format,
                            "--enable-lora", "--max-loras", "2", "--max-cpu-loras", "2",
                            "--enable-prompt-tokens-details", "--time-scale", "20", name=f"{engine}-pod")
    spec = pod_spec("p", url, engine=engine, max_loras=2, max_cpu_loras=2)
    gw = start_gateway(tmp_path, gateway_config([spec]))
    try:
        wait_until(lambda: routed_ids(gw) == ["p"], timeout=20, what="pod routable")
        good = make_adapter(tmp_path / "adapters", "good-lora")
        assert gw.admin("POST", "/admin/adapters", json={"name": "good-lora", "path": str(good)}).status_code == 201
        r = gw.admin("POST", "/admin/adapters/good-lora/pin")
        assert [o["outcome"] for o in r.json()["outcomes"]] == ["ok", "ok"], r.text  # load, touch
        wait_until(lambda: "good-lora" in routed_ids_adapters(gw), timeout=10, what="adapter in table")
        # A path the pod cannot read: the pod's error (either shape) is reported, nothing loaded.
        assert gw.admin("POST", "/admin/adapters", json={"name": "ghost-lora", "path": "/nonexistent/ghost"}).status_code == 201
        assert gw.admin("POST", "/admin/adapters/good-lora/unpin").status_code == 200  # one pin per 2 slots
        r = gw.admin("POST", "/admin/adapters/ghost-lora/pin")
        load = [o for o in r.json()["outcomes"] if o["action"] == "load"]
        assert load and load[0]["outcome"] == "rejected", r.text
        detail = gw.get("/admin/pods/p").json()
        assert "ghost-lora" not in detail["adapters"]
        assert any("ghost" in e for e in detail["errors"])
        # A template warmed on this pod is served from its cache afterwards.
        key = gw.admin("POST", "/admin/prompts", json={"model": BASE, "text": template_text(7)}).json()["key"]
        assert gw.admin("POST", "/admin/pods/p/warmup").status_code == 202
        wait_until(lambda: gw.get("/admin/pods/p/warmup").json()["warmup"]["phase"] == "done",
                   timeout=20, what="warm-up done")
        assert key in gw.get("/admin/pods/p/plan").json()["first_tier"]
        if engine == "vllm":
            assert cached_tokens(url, template_text(7)) > 0
        assert metric(gw, 'prewarm_prefills_total{pod="p",outcome="ok"}') >= 1
    finally:
        gw.proc.stop()
        pod.stop()


def routed_ids_adapters(gw) -> list[str]:
    return [a for p in gw.get("/v1/routing").json()["pods"] for a in p["adapters"]]


def test_dns_discovery_adds_resolved_pods(tmp_path):
    pod, url = start_podsim(tmp_path, "--time-scale", "20", name="dns-pod")
    port = int(url.rsplit(":", 1)[1])
    gw = start_gateway(tmp_path, {"pods": {"base_model": BASE, "health_interval_ms": 100,
                                           "dns": {"name": "localhost", "port": port, "interval_seconds": 1}}})
    try:
        wait_until(lambda: f"127.0.0.1:{port}" in routed_ids(gw), timeout=20, what="discovered pod routable")
        pods = gw.get("/admin/pods").json()["pods"]
        assert {p["source"] for p in pods} == {"dns"}
    finally:
        gw.proc.stop()
        pod.stop()


def test_signalled_hot_prefix_is_prefilled_where_it_is_routed(tmp_path):
    pod, url = start_podsim(tmp_path, "--enable-prompt-tokens-details", "--time-scale", "20", name="pod")
    gw = start_gateway(tmp_path, gateway_config([pod_spec("p", url)]))
    try:
        wait_until(lambda: routed_ids(gw) == ["p"], timeout=20, what="pod routable")
        text = template_text(42)[:1536]  # 6 full blocks of 64 tokens
        blocks = fingerprint(BASE, text)
        assert len(blocks) == 6

        def batch(prefix: list[str], prefix_text: str) -> dict:
            return {"version": "1.0", "source": "envoy-test", "signals": [
                {"kind": "prefill", "model": BASE, "endpoint": "completions", "prefix": prefix,
                 "prefix_tokens": 384, "prefix_text": prefix_text, "state": "new", "priority": 40}]}

        # Hashes that are not the text's (forged, or another text's) are refused: nobody can
        # file text under a prefix key it does not fingerprint to.
        forged = [f"{0x1000 + i:016x}" for i in range(6)]
        other = template_text(43)[:1536]
        for prefix, prefix_text in ((forged, text), (blocks, other)):
            r = gw.signals(batch(prefix, prefix_text))
            assert r.status_code == 202 and r.json()["rejected"] == 1, r.text
            assert r.json()["reasons"][0].startswith("prefix: does not match the text"), r.text
        assert gw.get("/admin/prompts").json()["total"] == 0
        r = gw.signals(batch(blocks, text))
        assert r.status_code == 202 and r.json()["prefills"] == 1, r.text
        wait_until(lambda: metric(gw, 'prewarm_prefills_total{pod="p",outcome="ok"}') >= 1,
                   timeout=20, what="keep-warm prefill of the signalled prefix")
        assert cached_tokens(url, text) == 384
        top = gw.get("/admin/prompts?k=1").json()["prompts"][0]
        assert (top["origin"], top["blocks"]) == ("dynamic", 6)
        assert gw.get("/admin/pods/p").json()["warm_prefixes"] == 1
    finally:
        gw.proc.stop()
        pod.stop()


def adapter_roots(pod_url: str) -> dict:
    cards = requests.get(f"{pod_url}/v1/models", timeout=10).json()["data"]
    return {c["id"]: c["root"] for c in cards if c.get("parent")}


class ChatRollout:
    """Two LoRA pods (`pod_b_flags` for pod b), a gateway placing every adapter on both, and
    `chat` v1 (rank 8) registered and pinned everywhere; v2 (rank 16) ready to roll out."""

    def __init__(self, tmp_path, *pod_b_flags: str, registry: dict | None = None):
        self.pa = self.pb = self.gw = None
        try:
            self._start(tmp_path, pod_b_flags, registry or {})
        except BaseException:
            self.close()
            raise

    def _start(self, tmp_path, pod_b_flags, registry):
        self.pa, self.ua = lora_pod(tmp_path, "pod-a")
        self.pb, self.ub = lora_pod(tmp_path, "pod-b", *pod_b_flags)
        specs = [pod_spec("a", self.ua, max_loras=2, max_cpu_loras=2),
                 pod_spec("b", self.ub, max_loras=2, max_cpu_loras=2)]
        config = gateway_config(specs)
        config["pods"]["adapter_replicas"] = 2  # at least 2 replicas: on both pods
        config["registry"] = registry
        self.gw = start_gateway(tmp_path, config)
        wait_until(lambda: sorted(routed_ids(self.gw)) == ["a", "b"], timeout=20, what="pods routable")
        self.v1 = make_adapter(tmp_path / "v1", "chat", rank=8)
        self.v2 = make_adapter(tmp_path / "v2", "chat", rank=16)
        r = self.gw.admin("POST", "/admin/adapters",
                          json={"name": "chat", "path": str(self.v1), "version": "v1", "pinned": True})
        assert r.status_code == 201, r.text
        assert {o["pod"] for o in r.json()["pin_outcomes"] if o["action"] == "load"} == {"a", "b"}
        assert self.roots() == (str(self.v1), str(self.v1))

    def roots(self) -> tuple[str, str]:
        return adapter_roots(self.ua)["chat"], adapter_roots(self.ub)["chat"]

    def close(self):
        if self.gw is not None:
            self.gw.proc.stop()
        for pod in (self.pa, self.pb):
            if pod is not None:
                pod.stop()


def test_rollout_and_rollback_are_consistent_across_pods(tmp_path):
    t = ChatRollout(tmp_path)
    gw, v1, v2 = t.gw, t.v1, t.v2
    try:
        r = gw.admin("POST", "/admin/adapters", json={"name": "chat", "path": str(v2), "version": "v2"})
        assert r.status_code == 200, r.text
        rollout = r.json()["rollout"]
        assert rollout["before"] == {"a": "v1", "b": "v1"} and rollout["after"] == {"a": "v2", "b": "v2"}
        assert rollout["consistent"] is True
        assert t.roots() == (str(v2), str(v2))
        assert r.json()["adapter"]["current"]["rank"] == 16
        r = gw.admin("POST", "/admin/adapters/chat/rollback", json={"version": "v1"})
        assert r.status_code == 200 and r.json()["rollout"]["after"] == {"a": "v1", "b": "v1"}, r.text
        assert t.roots() == (str(v1), str(v1))
        # A version whose files changed after registration is refused before any pod is touched.
        (Path(v2) / "adapter_model.safetensors").write_bytes(b"tampered")
        r = gw.admin("POST", "/admin/adapters/chat/rollback", json={"version": "v2"})
        assert r.status_code == 409 and "adapter_model.safetensors" in r.json()["error"], r.text
        assert t.roots() == (str(v1), str(v1))
        assert gw.get("/admin/adapters/chat").json()["adapter"]["current"]["version"] == "v1"
    finally:
        t.close()


# Misbehaving clients and pods (issue 17, item 13).

def test_slowloris_and_idle_connections_are_closed(tmp_path):
    """A client that never finishes its request headers, and a kept-alive connection left idle,
    are closed after `server.header_read_timeout_ms`, not held forever."""
    gw = start_gateway(tmp_path, {"server": {"header_read_timeout_ms": 300}})
    host, port = gw.url.removeprefix("http://").rsplit(":", 1)
    try:
        slow = socket.create_connection((host, int(port)), timeout=20)
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Slow: 1")  # never the blank line
        idle = socket.create_connection((host, int(port)), timeout=20)
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        first = idle.recv(4096)
        assert first.startswith(b"HTTP/1.1 200"), first
        for conn in (slow, idle):
            # Whatever the server says on the way out (a 408 at most), then end of stream; a
            # socket timeout here means the connection was held.
            data = b""
            while chunk := conn.recv(4096):
                data += chunk
            assert b"200 OK" not in data, data
            conn.close()
        assert gw.get("/healthz").status_code == 200
    finally:
        gw.proc.stop()


def test_a_hung_pod_does_not_hold_up_the_other_pods_health(tmp_path):
    """With a pod that accepts and never answers (and a request timeout of 30 s), another pod
    going down still leaves the routing table within a few health rounds."""
    hung = MisbehavingPod("hang", name="hung").start()
    b, b_url = start_podsim(tmp_path, name="pod-b")
    config = gateway_config([pod_spec("hung", f"http://{hung.address}"), pod_spec("b", b_url)])
    config["pods"].update({"request_timeout_ms": 30000, "retries": 0})
    gw = start_gateway(tmp_path, config)
    try:
        wait_until(lambda: routed_ids(gw) == ["b"], timeout=30, what="pod b routable")
        b.stop()
        wait_until(lambda: routed_ids(gw) == [], timeout=15, interval=0.1,
                   what="pod b leaving the table while the hung pod hangs")
        assert hung.hits >= 1
    finally:
        gw.proc.stop()
        hung.stop()


def test_redirects_from_a_pod_are_not_followed(tmp_path):
    canary = RecordingServer("canary").start()
    pod = MisbehavingPod("redirect", name="redirecting", redirect_to=f"http://{canary.address}/stolen").start()
    gw = start_gateway(tmp_path, gateway_config([pod_spec("r", f"http://{pod.address}")]))
    try:
        wait_until(lambda: pod.hits >= 5, timeout=20, what="several health rounds")
        assert gw.get("/admin/pods/r").json()["health"] != "up"
        assert canary.received() == [], [r.path for r in canary.received()]
    finally:
        gw.proc.stop()
        pod.stop()
        canary.stop()


def test_a_huge_metrics_reply_is_cut_off(tmp_path):
    """A pod streaming an endless `/metrics` is read up to the gateway's reply limit (4 MiB), not
    to the end: the pod gets to send little more than the limit before the gateway hangs up."""
    pod = MisbehavingPod("huge_metrics", name="huge").start()
    gw = start_gateway(tmp_path, gateway_config([pod_spec("h", f"http://{pod.address}")]))
    try:
        wait_until(lambda: len(pod.metrics_sent) >= 3, timeout=60, what="three /metrics reads")
        done = pod.metrics_sent[:-1]  # the last may still be under way
        assert done and all(sent < 32 << 20 for sent in done), done
        assert gw.get("/healthz").status_code == 200
    finally:
        gw.proc.stop()
        pod.stop()


def test_a_rollout_a_pod_refuses_rolls_back_by_itself(tmp_path):
    """Issue 20, item 5: pod b serves LoRA ranks up to 8 (`--max-lora-rank 8`), so it refuses v2
    (rank 16) while pod a takes it. The gateway finds the holders inconsistent, makes v1 current
    again and re-loads it on both: a 409 naming pod b, both reports, a counted rollback, and
    both pods serving v1 afterwards."""
    t = ChatRollout(tmp_path, "--max-lora-rank", "8")
    gw, v2 = t.gw, t.v2
    try:
        r = gw.admin("POST", "/admin/adapters", json={"name": "chat", "path": str(v2), "version": "v2"})
        assert r.status_code == 409, r.text
        body = r.json()
        assert body["rollout"]["consistent"] is False
        assert "b=" in body["error"] and "rolled back to \"v1\"" in body["error"], body["error"]
        undone = body["auto_rollback"]
        assert undone["to"] == "v1" and undone["rollout"]["consistent"] is True, undone
        assert undone["rollout"]["after"] == {"a": "v1", "b": "v1"}
        assert t.roots() == (str(t.v1), str(t.v1))
        assert gw.get("/admin/adapters/chat").json()["adapter"]["current"]["version"] == "v1"
        metrics = gw.get("/metrics").text
        assert 'prewarm_adapter_auto_rollbacks_total{reason="inconsistent"} 1' in metrics, metrics[-2000:]
    finally:
        t.close()


def test_a_rollout_whose_requests_err_rolls_back_by_itself(tmp_path):
    """Issue 20, item 5: a consistent rollout is watched. Outcome records as the filters send
    them (`POST /v1/signals`, the adapter as the request's `model`): errors of other models and
    of requests before the rollout do not count, nor a client error (404); a clean start holds;
    then one 429 among 32 requests (above 0.5 %, with `rollout_min_requests` 20) rolls `chat`
    back to v1 on both pods, with the watch's figures on the adapter record and a counted
    rollback."""
    t = ChatRollout(tmp_path, registry={"rollout_watch_seconds": 3600, "rollout_min_requests": 20})
    gw = t.gw
    try:
        r = gw.admin("POST", "/admin/adapters", json={"name": "chat", "path": str(t.v2), "version": "v2"})
        assert r.status_code == 200 and r.json()["rollout"]["consistent"] is True, r.text
        watch = gw.get("/admin/adapters/chat").json()["adapter"]["watch"]
        assert (watch["version"], watch["previous"], watch.get("ended")) == ("v2", "v1", None), watch
        started = watch["started_ms"]

        def outcome(model: str, status: int, at_ms: int) -> dict:
            return {"model": model, "pod": "a", "at_ms": at_ms, "ttfb_ms": 30, "status": status,
                    "stream": False}

        def send(records: list[dict]):
            r = gw.signals({"version": "1.0", "source": "envoy-test", "signals": [], "outcomes": records})
            assert r.status_code == 202, r.text

        now = int(time.time() * 1000)
        send([outcome("chat", 500, started - 1_000)] * 5  # before the rollout
             + [outcome("base-model", 503, now)] * 5  # not the adapter's
             + [outcome("chat", 200, now)] * 30 + [outcome("chat", 404, now)])
        time.sleep(1.5)  # a verdict round or more
        watch = gw.get("/admin/adapters/chat").json()["adapter"]["watch"]
        assert (watch["requests"], watch["errors"], watch.get("ended")) == (31, 0, None), watch
        assert t.roots() == (str(t.v2), str(t.v2))

        send([outcome("chat", 429, now)])

        def ended():
            return gw.get("/admin/adapters/chat").json()["adapter"]["watch"].get("ended")

        end = wait_until(ended, timeout=10, what="the watch's verdict")
        assert end["outcome"] == "rolled_back", end
        assert "1 errors in 32 requests" in end["detail"] and 'rolled back to "v1"' in end["detail"], end
        record = gw.get("/admin/adapters/chat").json()["adapter"]
        assert record["current"]["version"] == "v1"
        wait_until(lambda: t.roots() == (str(t.v1), str(t.v1)), timeout=10, what="v1 re-loaded on both pods")
        metrics = gw.get("/metrics").text
        assert 'prewarm_adapter_auto_rollbacks_total{reason="errors"} 1' in metrics, metrics[-2000:]
    finally:
        t.close()


def test_a_pod_whose_batch_is_full_publishes_its_queue_wait(tmp_path):
    """One batch place and 0.4 s a request: six requests at once queue behind each other; the
    gateway reads the queue (vllm:num_requests_waiting) and the completions
    (vllm:request_success_total) and publishes the predicted wait beside the move's price."""
    pod, url = start_podsim(tmp_path, "--max-num-seqs", "1", "--prefill-overhead-ms", "400",
                            "--per-token-us", "0", name="pod")
    gw = start_gateway(tmp_path, gateway_config([pod_spec("pod", url)]))
    try:
        wait_until(lambda: routed_ids(gw) == ["pod"], timeout=30, what="pod routable")
        assert gw.get("/v1/routing").json()["prefill_us_per_token"] == 250
        # no queue: no wait, once a check after the join read the completion counter
        wait_until(lambda: gw.get("/v1/routing").json()["pods"][0].get("wait_ms") == 0, timeout=10,
                   what="a zero wait in the table")

        def send(i: int) -> None:
            requests.post(f"{url}/v1/completions", timeout=60,
                          json={"model": BASE, "prompt": f"question {i} " * 20, "max_tokens": 1})

        with ThreadPoolExecutor(6) as pool:
            list(pool.map(send, range(6)))

        def waits() -> tuple:
            pod_view = gw.get("/admin/pods").json()["pods"][0]
            return pod_view["queue_wait_ms"], gw.get("/v1/routing").json()["pods"][0].get("wait_ms")

        wait_until(lambda: waits()[1] and waits()[1] > 0, timeout=30,
                   what="a queue wait in the table")
        summary, published = waits()
        assert summary > 0 and published % 100 == 0, (summary, published)
    finally:
        gw.proc.stop()
        pod.stop()
