"""`envoy/k8s/grafana-dashboard.json` may only query metrics that prewarm's processes export.

The names are not listed here: they are scraped from real processes — the gateway's `/metrics`
(driven until every family the dashboard uses has a series: warm-up, prefills, a failed prefill,
adapter loads and unloads, signals, a snapshot, the modelled hit ratio), Envoy's
`/stats/prometheus` with the prewarm filter loaded, and a podsim pod's `/metrics` (vLLM's names).
"""
from __future__ import annotations

import json
import re

import requests

from harness import REPO, wait_until
from harness.envoy import EnvoyFleet
from harness.gateway import SIGNAL_TOKEN, start_gateway
from harness.podsim import make_adapter, start_podsim

DASHBOARD = REPO / "envoy" / "k8s" / "grafana-dashboard.json"
BASE = "meta-llama/Llama-3.1-8B-Instruct"
PROMQL_WORDS = {"and", "or", "unless", "offset", "bool", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: identifiers that are neither functions nor
    aggregations (followed by `(`), label names (in `{...}` and `by/without (...)`), ranges,
    Grafana variables nor PromQL keywords."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\$\{?\w+\}?", "", expr)
    names = set()
    for m in re.finditer(r"(?<![0-9.])[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if expr[m.end():].lstrip().startswith("(") or m.group() in PROMQL_WORDS:
            continue
        names.add(m.group())
    return names


def exported(text: str) -> set[str]:
    """Series names in a Prometheus text exposition."""
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def panels(dashboard: dict) -> list[dict]:
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out += p.get("panels", [])
    return out


def test_metric_name_extraction():
    assert metric_names('histogram_quantile(0.95, sum by (le, pod) (rate(vllm:ttft_bucket{pod="a"}[$__rate_interval])))') == {"vllm:ttft_bucket"}
    assert metric_names("max(prewarm_table_age_ms) / 1000 + on (pod) x_total offset 5m") == {"prewarm_table_age_ms", "x_total"}


def test_dashboard_is_well_formed():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    (ds,) = dashboard["templating"]["list"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    for p in panels(dashboard):
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"]), p["title"]
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]


def drive_gateway(tmp_path, pod_url: str):
    """A gateway whose /metrics has a series in every family: a warmed pod (prefills, warm-up
    duration), a template longer than the pod's context (a failed prefill), an adapter
    loaded then removed (load, unload), signals, a snapshot, the modelled hit ratio."""
    gw = start_gateway(tmp_path, {
        "pods": {"base_model": BASE, "health_interval_ms": 100,
                 "static": [{"id": "a", "address": pod_url.removeprefix("http://"), "max_loras": 2}]},
        "warmup": {"first_tier": 8, "second_tier": 8, "deadline_ms": 60000, "max_attempts": 1},
    }, name="gateway")
    text = "You answer questions about invoices for tenant acme, politely and briefly. " * 60
    # The pod's context is 512 tokens: the 300-byte template prefills, the 4,000-byte one fails.
    for size in (300, 4000):
        r = gw.admin("POST", "/admin/prompts", json={"model": BASE, "text": text[:size]})
        assert r.status_code == 201, r.text
    path = make_adapter(tmp_path / "adapters", "sql-lora")
    r = gw.admin("POST", "/admin/adapters", json={"name": "sql-lora", "path": str(path), "pinned": True})
    assert r.status_code == 201, r.text
    wait_until(lambda: gw.get("/admin/pods/a").json()["health"] == "up", timeout=30, what="pod up")
    assert gw.admin("POST", "/admin/pods/a/warmup").status_code == 202
    wait_until(lambda: gw.get("/admin/pods/a/warmup").json()["warmup"]["phase"] == "done", timeout=60,
               what="warm-up done")
    key = gw.get("/admin/prompts").json()["prompts"][0]["key"]
    batch = {"version": "1.0", "source": "test", "signals": [
        {"kind": "feedback", "model": BASE, "prefix": key.split("-")[1], "outcome": "succeeded"}]}
    assert gw.signals(batch).status_code == 202
    assert gw.admin("DELETE", "/admin/adapters/sql-lora").status_code == 200
    assert gw.admin("POST", "/admin/snapshot").status_code == 200
    return gw


def test_dashboard_queries_only_exported_metrics(tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    used = set()
    for p in panels(dashboard):
        for t in p.get("targets", []):
            used |= metric_names(t["expr"])
    pod, pod_url = start_podsim(tmp_path, "--enable-lora", "--max-loras", "2", "--max-model-len", "512",
                                "--time-scale", "20", name="pod")
    gw = drive_gateway(tmp_path, pod_url)
    fleet = EnvoyFleet(tmp_path)
    try:
        envoy = fleet.start(pods=[pod_url.removeprefix("http://")], gateway=gw.url.removeprefix("http://"),
                            filter_config={"gateway_token": SIGNAL_TOKEN})
        status, _, _ = envoy.post("/v1/completions", {"model": BASE, "prompt": "hello " * 100, "max_tokens": 1})
        assert status == 200
        filter_names = {n for n in exported(envoy.admin_get("/stats/prometheus")) if n.startswith("prewarm_")}
        pod_names = exported(requests.get(f"{pod_url}/metrics", timeout=10).text)
        # Families with labels appear once they have a series: wait for the ones the gateway
        # sets from background loops.
        gateway_names = wait_until(
            lambda: (names := exported(gw.get("/metrics").text)) >= {n for n in used if n.startswith("prewarm_")} - filter_names and names,
            timeout=30, interval=0.2, what="every gateway family the dashboard uses")
        missing = used - filter_names - pod_names - gateway_names
        assert not missing, f"the dashboard queries metrics nobody exports: {sorted(missing)}"
        # It covers all three sources.
        assert used & filter_names and used & pod_names and used & (gateway_names - filter_names)
        assert {"prewarm_warmup_duration_seconds_bucket", "prewarm_warmup_key_errors_total",
                "prewarm_adapter_loads_total", "prewarm_adapter_unloads_total", "prewarm_signals_ingested_total",
                "prewarm_modelled_hit_ratio", "prewarm_filter_table_age_seconds", "vllm:time_to_first_token_seconds_bucket",
                "vllm:num_requests_waiting"} <= used
    finally:
        fleet.close()
        gw.proc.stop()
        pod.stop()
