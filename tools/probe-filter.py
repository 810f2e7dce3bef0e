"""probe-filter: two faults the filter must survive, measured against the real Envoy.

    .venv/bin/python tools/probe-filter.py [--wasm LABEL=PATH ...] [--stalled N] [--users N]

For each filter build given (default: the one `make wasm` builds; `--wasm base=/path/old.wasm`
adds a baseline so the figures sit side by side in one run):

1. Stalled requests. N sockets (default 3000) each send the headers of an inference POST with
   `content-length: 1048576` and 16 body bytes, then stall. Then one normal request. Prints
   Envoy's resident memory growth (VmRSS of the process, which includes the wasm VMs' linear
   memory as V8 commits it), the normal request's status and Envoy's wasm failure stats. A
   filter that sizes an allocation from the header grows its VM per stalled socket.
2. A full signal queue. The gateway is made slow (every batch stays in flight), and users
   complete prompt streaks until the queue's slots are full of prefill signals (~9 KB each).
   Then the requests that complete a streak (the ones that enqueue) are timed, one connection,
   against the same requests with the queue drained: prints p50/p99 of both and the p99 added.
   An enqueue that rewrites the whole queue pays for the queue on every such request.

Every loop is bounded in count and time; ports come from :0 binds.
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from harness import filter_wasm_path, wait_until  # noqa: E402
from harness.envoy import Envoy  # noqa: E402
from harness.fake_servers import FakeGateway  # noqa: E402


def _bench_filter():
    """tools/bench-filter.py, for its upstream (an Envoy answering with direct_response: a
    Python pod's unbatched writes would add Nagle/delayed-ACK stalls of ~40 ms)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_filter", REPO / "tools" / "bench-filter.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Upstream:
    def __init__(self, work: Path):
        self.envoy = Envoy(work / "upstream", config=_bench_filter().UPSTREAM_YAML, concurrency=1,
                           log_level="warn", name="upstream").start()
        self.address = self.envoy.url.removeprefix("http://")

    def stop(self):
        self.envoy.stop()

TEMPLATE = " ".join(f"rule {k} of the support handbook says be kind." for k in range(200))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def chat(user_question: str) -> bytes:
    return json.dumps({"model": "m", "messages": [
        {"role": "system", "content": TEMPLATE}, {"role": "user", "content": user_question}]}).encode()


def start_envoy(work: Path, wasm: Path, pods, gateway, filter_config) -> Envoy:
    import os
    os.environ["PREWARM_FILTER_WASM"] = str(wasm)
    envoy = Envoy(work / "proxy", pods=[p.address for p in pods], gateway=gateway.address,
                  filter_config=filter_config, concurrency=2, log_level="warn")
    return envoy.start()


def stalled(work: Path, wasm: Path, n: int) -> dict:
    pod, gateway = Upstream(work), FakeGateway().start()
    envoy = start_envoy(work, wasm, [pod], gateway, {"tick_period_ms": 200})
    socks = []
    try:
        host, port = envoy.url.removeprefix("http://").split(":")
        before = rss_kib(envoy.process.proc.pid)
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: probe\r\ncontent-type: application/json\r\n"
                b"content-length: 1048576\r\n\r\n" + b'{"model":"m","m')
        deadline = time.monotonic() + 120
        for _ in range(n):
            if time.monotonic() > deadline:
                break
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(head)
            socks.append(s)
        # every stalled request reached the filter (its headers were seen), or a VM failed
        try:
            wait_until(lambda: envoy.metric("prewarm_filter_requests_seen_total") >= len(socks) or envoy.wasm_failures(),
                       60, what="every stalled request seen")
        except TimeoutError:
            pass  # reported below as fewer requests seen than sockets
        after = rss_kib(envoy.process.proc.pid)
        try:
            status, _, _ = envoy.post("/v1/chat/completions", json.loads(chat("after the stall")), timeout=30)
        except OSError as e:
            status = f"{type(e).__name__}"
        return {"sockets": len(socks), "seen": envoy.metric("prewarm_filter_requests_seen_total"),
                "rss_growth_mib": (after - before) / 1024, "status": status,
                "wasm_failures": envoy.wasm_failures()}
    finally:
        for s in socks:
            s.close()
        envoy.stop()
        pod.stop()
        gateway.stop()


class Client:
    """One keep-alive HTTP/1.1 connection with TCP_NODELAY, each request written in one send
    (urllib writes headers and body apart, and Nagle + delayed ACK then adds ~40 ms)."""

    def __init__(self, url: str):
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def post(self, path: str, body: bytes, headers: dict) -> int:
        head = f"POST {path} HTTP/1.1\r\nhost: probe\r\ncontent-type: application/json\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        head += f"content-length: {len(body)}\r\n\r\n"
        self.sock.sendall(head.encode() + body)
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            assert chunk, "connection closed"
            self.buffer += chunk
        header, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = header.decode("latin-1").split("\r\n")
        length = next(int(l.split(":", 1)[1]) for l in lines if l.lower().startswith("content-length:"))
        while len(self.buffer) < length:
            chunk = self.sock.recv(65536)
            assert chunk, "connection closed"
            self.buffer += chunk
        self.buffer = self.buffer[length:]
        return int(lines[0].split()[1])

    def close(self):
        self.sock.close()


def timed_streaks(client: Client, users: range) -> list[float]:
    """Each user sends three similar prompts; the third completes the streak and enqueues a
    prefill signal: its latency (µs)."""
    out = []
    for u in users:
        h = {"x-prewarm-user": f"user-{u}"}
        for q in range(2):
            client.post("/v1/chat/completions", chat(f"warm-up {q}?"), h)
        t = time.perf_counter()
        status = client.post("/v1/chat/completions", chat("the third?"), h)
        out.append((time.perf_counter() - t) * 1e6)
        assert status == 200, status
    return out


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def full_queue(work: Path, wasm: Path, users: int) -> dict:
    pod, gateway = Upstream(work), FakeGateway().start()
    config = {"tick_period_ms": 100, "gateway_timeout_ms": 60000, "routing": False}
    envoy = start_envoy(work, wasm, [pod], gateway, config)
    client = Client(envoy.url)
    try:
        drained = timed_streaks(client, range(0, users))
        gateway.mode, gateway.slow_seconds = "slow", 120.0
        # fill the queue: 256 slots (the default) plus what the in-flight batches took
        fill_until = time.monotonic() + 300
        u = 10_000
        while envoy.metric("prewarm_filter_signals_enqueued_total") < 256 + 3 * 64 + users and time.monotonic() < fill_until:
            timed_streaks(client, range(u, u + 16))
            u += 16
        full = timed_streaks(client, range(20_000, 20_000 + users))
        return {"drained_p50": p(drained, 50), "drained_p99": p(drained, 99),
                "full_p50": p(full, 50), "full_p99": p(full, 99),
                "dropped": envoy.metric("prewarm_filter_signals_dropped_total"),
                "enqueued": envoy.metric("prewarm_filter_signals_enqueued_total"),
                "wasm_failures": envoy.wasm_failures()}
    finally:
        client.close()
        gateway.mode = "ok"
        envoy.stop()
        pod.stop()
        gateway.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wasm", action="append", default=[], help="LABEL=PATH (repeatable)")
    ap.add_argument("--stalled", type=int, default=3000)
    ap.add_argument("--users", type=int, default=200)
    args = ap.parse_args()
    builds = [tuple(w.split("=", 1)) for w in args.wasm] or [("current", str(filter_wasm_path()))]
    work = Path(tempfile.mkdtemp(prefix="probe-filter-"))
    print(f"{'build':<10} {'stalled':>8} {'seen':>6} {'RSS growth MiB':>15} {'after':>6}  wasm failures")
    for label, path in builds:
        r = stalled(work / f"stalled-{label}", Path(path), args.stalled)
        print(f"{label:<10} {r['sockets']:>8} {r['seen']:>6} {r['rss_growth_mib']:>15.1f} {r['status']!s:>6}"
              f"  {r['wasm_failures'] or '-'}", flush=True)
    print()
    print(f"{'build':<10} {'drained p50/p99 us':>20} {'full p50/p99 us':>18} {'p50 added':>10} {'p99 added':>10}"
          "  enqueued/dropped")
    for label, path in builds:
        r = full_queue(work / f"queue-{label}", Path(path), args.users)
        print(f"{label:<10} {r['drained_p50']:>9.0f}/{r['drained_p99']:<9.0f} {r['full_p50']:>8.0f}/{r['full_p99']:<8.0f}"
              f" {r['full_p50'] - r['drained_p50']:>+10.0f} {r['full_p99'] - r['drained_p99']:>+10.0f}"
              f"  {r['enqueued']}/{r['dropped']}"
              f"  {r['wasm_failures'] or ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
