"""The gateway's metrics and logs as an operator's tools read them: the real prewarm-gateway binary
against real podsim processes on loopback.

Asserted outcomes: the series `/metrics` serves for a pod that joins, leaves (gone) or is merely
down (kept), and the log lines on the gateway's stderr (one JSON object each with
`--log-format json` / `PREWARM_LOG_FORMAT=json`; `RUST_LOG` as the filter when `PREWARM_LOG` is
unset; a bad format refused naming the flag or the variable).
"""
from __future__ import annotations

import json
import re
import subprocess

from harness import LISTENING, ManagedProcess, bin_path, wait_until
from harness.gateway import start_gateway, write_config
from harness.podsim import start_podsim

BASE = "meta-llama/Llama-3.1-8B-Instruct"


def template_text(i: int) -> str:
    # 6 blocks of 64 tokens and a bit, distinct from the first byte.
    line = f"Template {i:03d}: you are a careful assistant for tenant number {i}. "
    return (line * 40)[: 1536 + 10]


def pod_spec(pod_id: str, url: str) -> dict:
    return {"id": pod_id, "address": url.removeprefix("http://")}


def gateway_config(pods: list[dict]) -> dict:
    return {
        "pods": {"base_model": BASE, "health_interval_ms": 100, "unhealthy_after": 1, "static": pods},
        "warmup": {"first_tier": 4, "second_tier": 4, "deadline_ms": 120000},
    }


def pod_series(gw, pod: str) -> set[str]:
    """The series (name and labels, no value) of `/metrics` labelled `pod="<pod>"`."""
    text = gw.get("/metrics").text
    return {l.rsplit(" ", 1)[0] for l in text.splitlines()
            if not l.startswith("#") and f'pod="{pod}"' in l}


def routed_ids(gw) -> list[str]:
    return [p["id"] for p in gw.get("/v1/routing").json()["pods"]]


def test_a_removed_pods_series_leave_metrics_and_a_down_pods_stay(tmp_path):
    a, a_url = start_podsim(tmp_path, "--enable-prompt-tokens-details", "--time-scale", "20", name="pod-a")
    b, b_url = start_podsim(tmp_path, "--enable-prompt-tokens-details", "--time-scale", "20", name="pod-b")
    gw = start_gateway(tmp_path, gateway_config([pod_spec("a", a_url)]))
    try:
        wait_until(lambda: routed_ids(gw) == ["a"], timeout=20, what="pod a routable")
        for i in range(8):
            r = gw.admin("POST", "/admin/prompts", json={"model": BASE, "text": template_text(i)})
            assert r.status_code == 201, r.text
        r = gw.admin("POST", "/admin/pods", json=pod_spec("b", b_url))
        assert r.status_code == 201, r.text
        # b's warm-up prefills its share of the hot prompts: counted per pod.
        b_series = wait_until(
            lambda: (s := pod_series(gw, "b")) and any(n.startswith("prewarm_prefills_total{") for n in s) and s,
            timeout=30, what="pod b's prefills in /metrics")
        a_series = wait_until(lambda: pod_series(gw, "a"), timeout=30, what="a series of pod a")

        assert gw.admin("DELETE", "/admin/pods/b").status_code == 200
        assert pod_series(gw, "b") == set(), f"{b_series} stayed"

        # A pod that is down is still in the fleet: its series stay.
        a.stop()
        wait_until(lambda: gw.get("/admin/pods/a").json()["health"] == "down", timeout=20, what="pod a down")
        assert a_series <= pod_series(gw, "a")
        # Later rounds of the background loops do not bring b's back.
        assert pod_series(gw, "b") == set()
    finally:
        gw.proc.stop()
        a.stop()
        b.stop()


LOG_FIELDS = {"timestamp", "level", "target", "message"}


def log_records(output: str) -> list[dict]:
    """Every line of a gateway's merged output but its readiness line (stdout, by design), each
    parsed as JSON: a line that is not JSON fails."""
    readiness = re.compile(LISTENING)
    records = []
    for line in output.splitlines():
        if readiness.search(line) and not line.startswith("{"):
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise AssertionError(f"not a JSON log line: {line!r}") from e
    return records


def test_json_logs_one_object_a_line_by_flag_or_environment(tmp_path):
    pod, pod_url = start_podsim(tmp_path, "--time-scale", "20", name="pod")
    config = write_config(tmp_path, gateway_config([pod_spec("p", pod_url)]), "json-flag")
    by_flag = ManagedProcess([bin_path("prewarm-gateway"), "serve", "--config", config, "--log-format", "json"],
                             tmp_path / "json-flag.log", ready=LISTENING, env={"PREWARM_LOG": "info"})
    # RUST_LOG is the filter when PREWARM_LOG is unset (empty counts as unset): the pods' info
    # lines, not the table's.
    by_env = start_gateway(tmp_path, gateway_config([pod_spec("p", pod_url)]), name="json-env",
                           env={"PREWARM_LOG_FORMAT": "json", "PREWARM_LOG": "",
                                "RUST_LOG": "warn,prewarm_gateway::service::pods=info"})
    try:
        for proc in (by_flag, by_env.proc):
            proc.wait_for_output(r'"message":"pod up: warm-up will start"', timeout=20)
    finally:
        by_flag.stop()
        by_env.proc.stop()
        pod.stop()
    flagged, env = log_records(by_flag.output()), log_records(by_env.proc.output())
    for records in (flagged, env):
        assert records
        for record in records:
            assert LOG_FIELDS <= record.keys(), record
            assert record["level"] in {"TRACE", "DEBUG", "INFO", "WARN", "ERROR"}, record
        added = [r for r in records if r["message"] == "pod added"]
        assert added and added[0]["pod"] == "p", added
        assert added[0]["level"] == "INFO" and added[0]["target"] == "prewarm_gateway::service::pods", added
    # PREWARM_LOG=info logs the table's publications (one at start, before the port is bound);
    # RUST_LOG's warn for everything but the pods leaves them out.
    assert any(r["target"] == "prewarm_gateway::service::table" for r in flagged), flagged
    assert {r["target"] for r in env if r["level"] == "INFO"} == {"prewarm_gateway::service::pods"}, env


def test_a_bad_log_format_is_refused_naming_the_flag_or_the_variable(tmp_path):
    config = write_config(tmp_path, gateway_config([]), "bad-format")
    gateway = str(bin_path("prewarm-gateway"))
    for argv, env, named in (
        ([gateway, "serve", "--config", str(config), "--log-format", "xml"], {}, "--log-format"),
        ([gateway, "serve", "--config", str(config)], {"PREWARM_LOG_FORMAT": "xml"}, "PREWARM_LOG_FORMAT"),
        ([gateway, "serve", "--config", str(config)], {"PREWARM_LOG": "prewarm_gateway=loud"}, "PREWARM_LOG"),
    ):
        done = subprocess.run(argv, env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=30)
        assert done.returncode == 2, (argv, env, done.stderr)
        assert named in done.stderr and ("xml" in done.stderr or "loud" in done.stderr), done.stderr
        assert "listening" not in done.stdout
