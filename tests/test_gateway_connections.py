"""The gateway at its file-descriptor limit: 1,100 half-sent requests held on `server.listen`
against a limit of 1,024. The filters' own listener (`server.filter_listen`) keeps answering table
polls while `listen` is starved, and the pods' health checks keep their descriptors (the pod
stays in the table). Real gateway binary under `prlimit`, a real podsim pod, loopback only.
Prints the polls' latencies on both listeners against the filter's 500 ms timeout (figures, not
asserted: a loaded machine may be slow; what is asserted is answered against starved)."""
from __future__ import annotations

import resource
import socket
import statistics
import time

import requests

from harness import wait_until
from harness.gateway import SIGNAL_TOKEN, start_gateway
from harness.podsim import start_podsim

FD_LIMIT = 1024
HALF_SENT = 1100
# How long a poll may take to count as answered: far above any latency (figures are printed),
# far below the 60 s a starved connection waits for the header timeout.
ANSWERED_WITHIN_S = 5.0
# The filter's default `gateway_timeout_ms`, for the printed count of polls it would have taken.
FILTER_TIMEOUT_S = 0.5
POLLS = 40


def _poll(url: str, timeout: float) -> float | None:
    """Seconds a table poll took, or None when it failed or timed out."""
    start = time.monotonic()
    try:
        r = requests.get(f"{url}/v1/routing", headers={"Authorization": f"Bearer {SIGNAL_TOKEN}"},
                         timeout=timeout)
    except requests.RequestException:
        return None
    return time.monotonic() - start if r.status_code == 200 else None


def _table_pods(url: str) -> list[str]:
    r = requests.get(f"{url}/v1/routing", headers={"Authorization": f"Bearer {SIGNAL_TOKEN}"}, timeout=5)
    return [p["id"] for p in r.json()["pods"]] if r.status_code == 200 else []


def _half_sent(host: str, port: int, n: int) -> list[socket.socket]:
    """`n` connections, each with a request whose headers never end (those the kernel has not
    completed within 5 s stay half-open: the gateway's cap and backlog are full by then)."""
    held = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((host, port))
        held.append(s)
    deadline = time.monotonic() + 5
    pending = list(held)
    while pending and time.monotonic() < deadline:
        still = []
        for s in pending:
            try:
                s.send(b"GET /admin/pods HTTP/1.1\r\nHost: gateway\r\n")
            except (BlockingIOError, OSError):
                still.append(s)
        pending = still
        if pending:
            time.sleep(0.01)
    return held


def test_a_flood_on_the_main_listener_at_the_fd_limit_never_delays_a_filters_poll(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = HALF_SENT + 256
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= need, "this test needs 1,356 descriptors"
    pod, pod_url = start_podsim(tmp_path, "--time-scale", "50", name="pod-a")
    gw = start_gateway(tmp_path, {
        # A slowloris client at its worst: headers held open for a minute, the whole test.
        "server": {"filter_listen": "127.0.0.1:0", "header_read_timeout_ms": 60000},
        "pods": {"base_model": "meta-llama/Llama-3.1-8B-Instruct",
                 "static": [{"id": "pod-a", "address": pod_url.removeprefix("http://")}]},
    }, fd_limit=FD_LIMIT)
    held: list[socket.socket] = []
    try:
        filters = "http://" + gw.proc.wait_for_output(r"serving filters on http://(\S+)").group(1)
        assert "connection caps" in gw.proc.wait_for_output(r"connection caps.*").group(0)
        wait_until(lambda: _table_pods(filters) == ["pod-a"], 30, what="pod-a in the table")
        quiet = [t for t in (_poll(filters, ANSWERED_WITHIN_S) for _ in range(10)) if t is not None]
        main_host, main_port = gw.url.removeprefix("http://").split(":")
        held = _half_sent(main_host, int(main_port), HALF_SENT)
        time.sleep(1.0)  # let the gateway accept up to its cap
        filter_polls = []
        for _ in range(POLLS):
            filter_polls.append(_poll(filters, ANSWERED_WITHIN_S))
            time.sleep(0.1)
        main_poll = _poll(gw.url, ANSWERED_WITHIN_S)
        pods_during = _table_pods(filters)
        answered = [t for t in filter_polls if t is not None]
        print(f"\nfilter_listen polls before the flood: p50 {statistics.median(quiet) * 1000:.1f} ms")
        print(f"fd limit {FD_LIMIT}, {HALF_SENT} half-sent requests on listen: "
              f"filter_listen polls answered {len(answered)}/{POLLS} "
              f"({sum(t <= FILTER_TIMEOUT_S for t in answered)} within the filter's 500 ms), "
              f"p50 {statistics.median(answered) * 1000 if answered else float('nan'):.1f} ms, "
              f"max {max(answered) * 1000 if answered else float('nan'):.1f} ms; "
              f"a poll on listen: {'no answer within 5 s' if main_poll is None else f'{main_poll * 1000:.0f} ms'}")
        assert len(answered) == POLLS, f"filter polls unanswered while listen is starved: {filter_polls}"
        # Health checks every second kept their descriptors: the pod stayed up through ~5 s.
        assert pods_during == ["pod-a"], pods_during
    finally:
        for s in held:
            s.close()
    try:
        wait_until(lambda: gw.get("/readyz").status_code == 200, 30, what="listen serves again")
        metrics = gw.get("/metrics").text
        at_cap = [l for l in metrics.splitlines() if l.startswith('prewarm_listener_at_cap_total{listener="main"}')]
        assert at_cap and float(at_cap[0].split()[-1]) >= 1, at_cap
        assert 'prewarm_listener_connection_cap{listener="main"} 512' in metrics
        assert 'prewarm_listener_connection_cap{listener="filter"} 256' in metrics
        # The data plane's listener serves the filters and the warm gates, nothing of the admin's.
        assert requests.get(f"{filters}/v1/pods/pod-a/ready", timeout=5).json()["pod"] == "pod-a"
        assert requests.get(f"{filters}/admin/pods", timeout=5).status_code == 404
        assert requests.get(f"{filters}/metrics", timeout=5).status_code == 404
    finally:
        gw.proc.stop()
        pod.stop()
