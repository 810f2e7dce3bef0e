"""`prewarm-gateway status --url URL` against the dashboard test's known state (a real gateway
with real podsim pods): its tables must say what the admin API says, before and after a change.
"""
from __future__ import annotations

import os
import subprocess
from typing import Optional

from harness import bin_path, wait_until
from harness.gateway import READ_TOKEN, start_gateway
from harness.podsim import start_podsim
from test_dashboard import api_state, fleet, pod_spec


def status(url: str, *flags: str, token: Optional[str] = READ_TOKEN) -> subprocess.CompletedProcess:
    """Runs `status`, the read token in `PREWARM_READ_TOKEN` (none when `token` is None)."""
    env = {k: v for k, v in os.environ.items() if k != "PREWARM_READ_TOKEN"}
    if token is not None:
        env["PREWARM_READ_TOKEN"] = token
    return subprocess.run([bin_path("prewarm-gateway"), "status", "--url", url, *flags],
                          capture_output=True, text=True, timeout=60, env=env)


def sections(text: str) -> dict:
    """Title line -> the section's lines (tables: header first)."""
    out: dict = {}
    title = None
    for line in text.splitlines()[1:]:
        if not line.strip():
            title = None
        elif title is None:
            title = line.split(" (")[0]
            out[title] = []
        else:
            out[title].append(line)
    return out


def rows(lines: list[str]) -> list[dict]:
    header = lines[0].split()
    return [dict(zip(header, line.split(None, len(header) - 1))) for line in lines[1:]]


def shown(text: str) -> dict:
    """What the status output shows, in `api_state`'s shape."""
    s = sections(text)
    pods = rows(s["PODS"])
    heat = rows(s["ADAPTERS x PODS"])
    pod_ids = s["ADAPTERS x PODS"][0].split()[5:]
    return {
        "pods": [{"id": p["POD"], "routable": p["TABLE"] == "yes", "state": p["STATE"],
                  "progress": p["PROGRESS"]} for p in pods],
        "cells": sorted((r["ADAPTER"], pod, r[pod]) for r in heat for pod in pod_ids),
        "per_pod": dict(line.split(": ", 1) for line in s["ADAPTERS PER POD"]),
        "prefixes": [(p["KEY"], float(p["HOTNESS"]), "" if p["PLACED-ON"] == "-" else p["PLACED-ON"],
                      p.get("TENANT")) for p in rows(s["TOP PREFIXES"])],
    }


# The API's cells (gpu / registered / absent) as the status refines them once the pod confirmed.
REFINED = {"gpu": {"resident", "loading"}, "registered": {"host", "loading"}, "absent": {"absent", "evicted"}}


def agrees(text: str, gw, top: int) -> bool:
    view, api = shown(text), api_state(gw, top)
    return (
        [(p["id"], p["routable"]) for p in view["pods"]] == [(p["id"], p["routable"]) for p in api["pods"]]
        and [(a, p) for a, p, _ in view["cells"]] == [(a, p) for a, p, _ in api["cells"]]
        and all(s in REFINED[c] for (_, _, s), (_, _, c) in zip(view["cells"], api["cells"]))
        and [(k, round(h, 2), placed) for k, h, placed, _ in view["prefixes"]]
        == [(k, round(h, 2), placed) for k, h, placed in api["prefixes"]]
    )


def test_status_prints_what_the_admin_api_says(tmp_path):
    f = fleet(tmp_path)
    try:
        gw = f.gw
        r = wait_until(lambda: (r := status(gw.url, "--top", "5")).returncode == 0 and agrees(r.stdout, gw, 5) and r,
                       timeout=20, interval=0.2, what="status agreeing with the admin API")
        assert r.stdout.startswith(f"prewarm gateway {gw.url}: 1 pods, 1 in the routing table, 2 adapters, 6 prefixes")
        view = shown(r.stdout)
        assert view["pods"] == [{"id": "a", "routable": True, "state": "warm", "progress": "100%"}]
        assert ("sql-lora", "a", "resident") in view["cells"]
        assert "sql-lora=resident" in view["per_pod"]["a"]
        assert len(view["prefixes"]) == 5 and all(p[2] == "a" for p in view["prefixes"])
        assert {p[3] for p in view["prefixes"]} == {"acme", "-"}

        f.add_pod("b")
        assert gw.admin("POST", "/admin/adapters/chat-lora/pin").status_code == 200
        new_key = f.add_template(9, "chat-lora", "globex", boost=12, topic="chat")
        f.wait_warm(["a", "b"])
        r = wait_until(lambda: (r := status(gw.url)).returncode == 0 and agrees(r.stdout, gw, 10) and r,
                       timeout=20, interval=0.2, what="status agreeing after the change")
        view = shown(r.stdout)
        assert [p["id"] for p in view["pods"]] == ["a", "b"]
        assert all(p["state"] == "warm" and p["routable"] for p in view["pods"])
        assert view["prefixes"][0][0] == new_key and view["prefixes"][0][3] == "globex"
        # an adapter's prefixes go only to pods serving it (the filter's rule); which pods win
        # is the fixture's hashes, checked against the API by `agrees` above. A prefix held on
        # both pods is in both plans (a joining pod's plan takes it), so it lists both.
        assert {pod for p in view["prefixes"] for pod in p[2].split(",") if pod} <= {"a", "b"}
        assert set(view["per_pod"]) == {"a", "b"}

        # A slow pod joins: while its first tier is being prefilled it is shown warming, outside
        # the table, partly done, and the prefixes moving to it as placed on c(warming).
        proc, url = start_podsim(tmp_path, "--prefill-overhead-ms", "5000", "--per-token-us", "0", name="pod-c")
        f.pods["c"] = (proc, url)
        assert gw.admin("POST", "/admin/pods", json=pod_spec("c", url)).status_code == 201
        wait_until(lambda: (gw.get("/admin/pods/c/warmup").json()["warmup"] or {}).get("phase") == "first_tier",
                   timeout=30, interval=0.05, what="c prefilling its first tier")
        r = status(gw.url)
        assert r.returncode == 0, r.stderr
        c = next(p for p in shown(r.stdout)["pods"] if p["id"] == "c")
        assert c["state"] == "warming" and not c["routable"] and c["progress"] != "100%", c
        plan = gw.get("/admin/pods/c/plan").json()
        moving = {k for k, _, placed, _ in shown(r.stdout)["prefixes"] if placed == "c(warming)"}
        assert moving and moving <= set(plan["first_tier"] + plan["second_tier"]), (moving, plan)
    finally:
        f.stop()


def test_status_names_the_url_when_the_gateway_is_unreachable(tmp_path):
    r = status("http://127.0.0.1:9", "--timeout-ms", "2000")
    assert r.returncode == 1 and "http://127.0.0.1:9/admin/pods" in r.stderr, r.stderr
    bad = status("http://127.0.0.1:9", "--top", "0")
    assert bad.returncode == 2 and "--top" in bad.stderr


def test_status_needs_the_read_token(tmp_path):
    gw = start_gateway(tmp_path, {}, name="gateway")
    try:
        for token in (None, "wrong"):
            r = status(gw.url, token=token)
            assert r.returncode == 1 and "401" in r.stderr and "read token" in r.stderr, r.stderr
        ok = status(gw.url, "--token", READ_TOKEN, token=None)
        assert ok.returncode == 0 and "pods" in ok.stdout.lower(), ok.stderr
    finally:
        gw.proc.stop()
