"""`tools/demo.py --gateway-outage` in miniature (700 s of the application workload at x20,
prewarm mode, the gateway down 8 s of real time from trace 240 s, pod-3 joining at 300 s while it
is down): the gateway's process is SIGKILLed and started again on its port with its state
directory; no request fails (the filter fails open), the filter takes the warm calls over while
the gateway is away and sends some, the joining pod is announced only once the gateway is back,
the restarted gateway restores its snapshot and the filter adopts a table of it listing every pod
and hands the warm calls back. Event order only: no duration is asserted. The kill comes 12 s of
real time into the replay, past two of the gateway's 5 s snapshots, so that the restarted gateway
has a snapshot holding hot prefixes to restore (a kill before the first would test an empty
restore)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from harness import REPO, envoy_path, filter_wasm_path


def test_the_demo_kills_and_restarts_the_gateway_and_nothing_fails(tmp_path):
    out = tmp_path / "demo"
    env = {**os.environ, "PREWARM_ENVOY": str(envoy_path()), "PREWARM_FILTER_WASM": str(filter_wasm_path())}
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "demo.py"), "--duration-s", "700", "--joins-at", "300",
         "--restart-at", "-1", "--gateway-outage", "240:8", "--repeats", "1", "--time-scale", "20",
         "--modes", "prewarm", "--out", str(out)],
        capture_output=True, text=True, timeout=450, env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [r["policy"] for r in summary["runs"]] == ["prewarm", "prewarm, gateway outage"]

    run = out / "prewarm-outage" / "run-1"
    rows = [json.loads(line) for line in (run / "outcomes.jsonl").read_text().splitlines()]
    assert rows and [r for r in rows if r["error"] is not None] == []
    watch = json.loads((run / "outage.json").read_text())
    assert watch["errors"] == []
    t = {k: v["t"] for k, v in watch["marks"].items()}
    assert t["gateway killed"] < t["filter takes over"] < t["gateway restarted"]
    assert t["gateway killed"] < t["pod-3 joins"] < t["gateway restarted"] <= t["pod-3 announced"]
    assert t["gateway restarted"] <= t["readyz 200"]
    assert t["gateway restarted"] <= t["filter adopts a table of the restarted gateway"] \
        <= t["filter adopts a table listing every pod"]
    assert t["gateway restarted"] <= t["filter hands the warm calls back"]
    assert watch["after"]["restored"]["prompts"] > 0, watch["after"]
    samples = [json.loads(line) for line in (run / "timeline.jsonl").read_text().splitlines()]
    direct = [s["filter"].get("direct_sent_total", 0) for s in samples]
    assert direct[-1] > 0, "the filter sent warm calls while the gateway was down"
    assert all(s["filter"].get("direct_active", 0) == 0 for s in samples if s["t"] < t["gateway killed"])

    baseline = json.loads((out / "prewarm" / "run-1" / "outage.json").read_text())
    assert "gateway killed" not in baseline["marks"]
    assert [r for r in (json.loads(line) for line in (out / "prewarm" / "run-1" / "outcomes.jsonl")
                        .read_text().splitlines()) if r["error"] is not None] == []
    assert (out / "prewarm-outage.json").exists()
