"""KV-cache events from the engine to the gateway (`gateway/src/service/kv_events.rs`,
`policy/fleet/engine_blocks.rs`): the real gateway binary listening (`[pods]
kv_events_listen`, loopback) for the events a podsim pod and a real vLLM publish
(`--kv-events-config` with a non-wildcard endpoint: both connect their ZeroMQ PUB socket to it,
the topic naming the pod; msgspec batches; the vLLM test is skipped without `make setup-vllm`).
The other way — the pod binds a wildcard endpoint, the gateway connects (`[[pods.static]]
kv_events`) — binds every interface, so it is tested in the gateway's own tests
(`service/kv_events.rs`) against a publisher bound on loopback.

- The gateway's ledger holds what the engine's cache holds: every full prompt block the pod
  registered, nothing it evicted, complete when the gateway read the process's first batch.
- A cache lost without a restart the scrapes could show (`POST /reset_prefix_cache`, vLLM's
  development route) is a restart with evidence `kv_events`: the pod is re-warmed as a joining
  pod (new epoch).
- A restarted pod is one restart, whichever of its scrape and its events shows it first.
- Batches the gateway missed — here all those a pod published before the gateway started — are
  asked for again from the pod's replay socket (`kv_events_replay`), so the ledger is exact.
"""
from __future__ import annotations

import json
import time

import requests

from harness import wait_until
from harness.gateway import start_gateway
from harness.podsim import start_podsim
from harness.stack import free_port, template_text
from harness.vllm import LLAMA_FLAGS, requires_vllm, start_vllm, tiny_models

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
BLOCK_TOKENS = 16


def events_flag(port: int) -> str:
    """The pod's flag: connect to the gateway's listener, the topic naming the pod ("p")."""
    return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                       "endpoint": f"tcp://127.0.0.1:{port}", "topic": "p"})


def gateway_for(tmp_path, address: str, events_port: int, name: str = "gateway", replay_port=None):
    pod = {"id": "p", "address": address}
    if replay_port:
        pod["kv_events_replay"] = f"127.0.0.1:{replay_port}"
    return start_gateway(tmp_path, {
        "pods": {"health_interval_ms": 100, "unhealthy_after": 50,
                 "kv_events_listen": f"127.0.0.1:{events_port}", "static": [pod]},
    }, name=name)


def detail(gw) -> dict:
    return gw.get("/admin/pods/p").json()


def connected(url: str) -> None:
    """Waits until the pod's publisher has connected to the gateway's listener: a request
    before would register blocks whose batch no subscriber takes (podsim connects at its next
    step with a change, vLLM at start; ZeroMQ's subscription follows the connection)."""
    time.sleep(1.0)


def restarts(gw, evidence: str) -> float:
    line = f'prewarm_pod_restarts_total{{pod="p",evidence="{evidence}"}}'
    return sum(float(l.rsplit(" ", 1)[1]) for l in gw.get("/metrics").text.splitlines() if l.startswith(line))


def complete(url: str, prompt: str) -> dict:
    r = requests.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_gateway_holds_the_blocks_a_podsim_pod_registered_and_not_those_it_evicted(tmp_path):
    port = free_port()
    pod, url = start_podsim(tmp_path, "--kv-events-config", events_flag(port), "--time-scale", "1000")
    gw = gateway_for(tmp_path, url.removeprefix("http://"), port)
    try:
        connected(url)
        expected = 0
        for i in range(6):
            reply = complete(url, template_text(i, 64 * 4 * 5))
            expected += reply["usage"]["prompt_tokens"] // BLOCK_TOKENS
        wait_until(lambda: (detail(gw)["kv_events"] or {}).get("cached_blocks") == expected, 10,
                   what=f"the ledger at {expected} blocks: {detail(gw)['kv_events']}")
        ledger = detail(gw)["kv_events"]
        assert ledger["complete"], ledger
        assert (ledger["stored"], ledger["removed"], ledger["missed_batches"]) == (expected, 0, 0), ledger
    finally:
        gw.proc.stop()
        pod.stop()

    # a cache of 40 blocks: the same prompts evict each other's
    port = free_port()
    pod, url = start_podsim(tmp_path, "--kv-events-config", events_flag(port), "--time-scale", "1000",
                            "--num-gpu-blocks", "40", "--enable-prompt-tokens-details")
    gw = gateway_for(tmp_path, url.removeprefix("http://"), port, name="gateway-small")
    try:
        connected(url)
        for i in range(6):
            complete(url, template_text(i, 64 * 4 * 5))
        wait_until(lambda: (detail(gw)["kv_events"] or {}).get("removed", 0) > 0, 10, what="evictions reported")
        time.sleep(0.2)
        ledger = detail(gw)["kv_events"]
        assert ledger["cached_blocks"] == ledger["stored"] - ledger["removed"] <= 39, ledger
        # the last prompt's blocks are the ones the pod still holds: a repeat finds them
        again = complete(url, template_text(5, 64 * 4 * 5))
        assert ledger["cached_blocks"] > 0 and again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, ledger
    finally:
        gw.proc.stop()
        pod.stop()


def test_batches_published_before_the_gateway_listened_are_replayed(tmp_path):
    port, replay = free_port(), free_port()
    flag = json.loads(events_flag(port)) | {"replay_endpoint": f"tcp://127.0.0.1:{replay}"}
    pod, url = start_podsim(tmp_path, "--kv-events-config", json.dumps(flag), "--time-scale", "1000")
    gw = None
    try:
        expected = 0
        for i in range(4):
            expected += complete(url, template_text(i, 64 * 4 * 5))["usage"]["prompt_tokens"] // BLOCK_TOKENS
            time.sleep(0.05)  # all published before any subscriber (one batch or several)
        gw = gateway_for(tmp_path, url.removeprefix("http://"), port, replay_port=replay)
        connected(url)
        expected += complete(url, template_text(9, 64 * 4 * 5))["usage"]["prompt_tokens"] // BLOCK_TOKENS
        wait_until(lambda: (detail(gw)["kv_events"] or {}).get("cached_blocks") == expected, 10,
                   what=f"the ledger at {expected} blocks: {detail(gw)['kv_events']}")
        ledger = detail(gw)["kv_events"]
        assert ledger["complete"] and ledger["missed_batches"] == 0 and ledger["last_seq"] >= 1, ledger
        replayed = 'prewarm_kv_event_batches_total{pod="p",outcome="replayed"}'
        assert any(l.startswith(replayed) and float(l.rsplit(" ", 1)[1]) >= 1
                   for l in gw.get("/metrics").text.splitlines()), "batches replayed"
    finally:
        if gw:
            gw.proc.stop()
        pod.stop()


def test_a_cache_reset_no_scrape_shows_re_warms_the_pod_and_a_restart_counts_once(tmp_path):
    port = free_port()
    flags = ("--kv-events-config", events_flag(port), "--time-scale", "1000", "--enable-prompt-tokens-details")
    pod, url = start_podsim(tmp_path, *flags, env={"VLLM_SERVER_DEV_MODE": "1"})
    address = url.removeprefix("http://")
    gw = gateway_for(tmp_path, address, port)
    try:
        connected(url)
        wait_until(lambda: detail(gw)["routable"], 30, what="the pod routable")
        epoch = detail(gw)["epoch"]
        complete(url, template_text(1, 64 * 4 * 5))
        wait_until(lambda: (detail(gw)["kv_events"] or {}).get("cached_blocks", 0) > 0, 10, what="blocks reported")

        reset = requests.post(f"{url}/reset_prefix_cache", timeout=5)
        assert reset.json() == {"success": True}, reset.text
        wait_until(lambda: detail(gw)["epoch"] > epoch, 10, what="the pod re-joined after its cache was reset")
        d = detail(gw)
        assert d["kv_events"]["cached_blocks"] == 0 and d["kv_events"]["cleared"] == 1, d["kv_events"]
        assert restarts(gw, "kv_events") == 1
        assert restarts(gw, "start_time") == 0 and restarts(gw, "counters") == 0

        # The process restarts on the same ports: its scrape (start time) and its events
        # (sequence back to 0) both show it; it is one restart.
        wait_until(lambda: detail(gw)["routable"], 30, what="the pod routable again")
        epoch = detail(gw)["epoch"]
        pod.kill()
        pod, url = start_podsim(tmp_path, *flags, "--port", address.rsplit(":", 1)[1],
                                env={"VLLM_SERVER_DEV_MODE": "1"}, name="podsim-again")
        wait_until(lambda: detail(gw)["epoch"] > epoch, 30, what="the restart seen")
        connected(url)
        for i in range(3):
            complete(url, template_text(10 + i, 64 * 4 * 5))
        wait_until(lambda: (detail(gw)["kv_events"] or {}).get("restarts", 0) >= 1, 10,
                   what=f"the ledger saw the new process: {detail(gw)['kv_events']}")
        time.sleep(0.5)  # two health rounds: a second restart would show by now
        d = detail(gw)
        assert d["epoch"] == epoch + 1, d
        assert d["restarts"] == 2, d  # the reset and this restart
    finally:
        gw.proc.stop()
        pod.stop()


@requires_vllm
def test_a_real_vllms_kv_events_reach_the_gateway_and_its_replay_fills_what_was_missed(tmp_path):
    models = tiny_models(tmp_path / "models")
    port, replay = free_port(), free_port()
    flag = json.loads(events_flag(port)) | {"replay_endpoint": f"tcp://127.0.0.1:{replay}"}
    proc, url = start_vllm(tmp_path, models.llama, *LLAMA_FLAGS, "--kv-events-config", json.dumps(flag),
                           env={"VLLM_SERVER_DEV_MODE": "1"})
    gw = None
    try:
        served = requests.get(f"{url}/v1/models", timeout=5).json()["data"][0]["id"]

        def chat(app: int) -> int:
            messages = [{"role": "system", "content": template_text(app, 64 * 4 * 8)},
                        {"role": "user", "content": "What is item 7?"}]
            r = requests.post(f"{url}/v1/chat/completions",
                              json={"model": served, "messages": messages, "max_tokens": 1}, timeout=120)
            assert r.status_code == 200, r.text
            return r.json()["usage"]["prompt_tokens"]

        before = chat(3)  # published while nothing listens: only the replay socket keeps it
        gw = gateway_for(tmp_path, url.removeprefix("http://"), port, replay_port=replay)
        connected(url)
        wait_until(lambda: detail(gw)["routable"], 60, what="the vLLM pod routable")
        epoch = detail(gw)["epoch"]
        after = chat(4)
        wait_until(lambda: (detail(gw)["kv_events"] or {}).get("last_seq", -1) >= 1, 30,
                   what="vLLM's second batch applied")
        ledger = detail(gw)["kv_events"]
        print(f"\nvLLM kv events: {before} and {after} prompt tokens; ledger {ledger}")
        assert ledger["complete"] and ledger["missed_batches"] == 0 and ledger["unknown"] == 0, ledger
        block = detail(gw)["load"]["block_size"]  # from vllm:cache_config_info (128 on CPU)
        assert ledger["cached_blocks"] == before // block + after // block, ledger

        reset = requests.post(f"{url}/reset_prefix_cache", timeout=30)
        assert reset.json().get("success") is True, reset.text
        chat(5)  # vLLM publishes the clear with its next scheduler step's batch
        wait_until(lambda: detail(gw)["epoch"] > epoch, 30, what="the pod re-joined after vLLM reset its cache")
        assert restarts(gw, "kv_events") == 1
        assert detail(gw)["kv_events"]["cleared"] >= 1
    finally:
        if gw:
            gw.proc.stop()
        proc.stop(grace=10)
