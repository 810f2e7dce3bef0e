"""bench-fleet: the real gateway against a fleet of simulated pods and 100 proxies (issue 39).

For each fleet size N (`BENCH_FLEET_PODS`, default `100,1000`), all on loopback:
1. one podsim process serves the N pods (`podsim --pods N --port 0`, time scale 100);
2. the release gateway (`prewarm-gateway serve`, from `PREWARM_BIN_DIR`, else
   `$CARGO_TARGET_DIR/release` or `target/release`) gets them as `[[pods.static]]`, with its
   defaults otherwise (a health round every second), and `BENCH_FLEET_PREFIXES` hot prefixes
   as prefill signals carrying their real block hashes (`prewarm-gateway fingerprint --jsonl`);
3. steady state: every pod up and in the table, no warm-up running and no prefill sent for 2 s
   (at most `BENCH_FLEET_SETTLE_TIMEOUT` seconds, default 180); then `BENCH_FLEET_IDLE_SECONDS`
   (5) with no proxy, to measure the gateway's CPU for the health checks alone;
4. the window (`BENCH_FLEET_SECONDS`, default 30): `BENCH_FLEET_PROXIES` (100) proxies, each
   on one keep-alive connection, once a second (start times spread over the first second):
   `GET /v1/routing?since=G` with `If-None-Match: "G"`, G the generation it holds (as the
   filter polls: a 304, a delta from G, or the whole table), then `POST /v1/signals` with one tick's batch in the filter's shape for
   `BENCH_FLEET_RPS` (10) requests a proxy a second: adopted and succeeded feedback per prefix
   used (the filter's tally), one served record and one outcome record a request;
5. the burst (`BENCH_FLEET_BURST_SECONDS`, default 5): `BENCH_FLEET_BURST_CONNECTIONS` (4)
   connections post batches of 10,000 feedback signals (the gateway's per-batch maximum) over
   the hot prefixes back to back, as fast as this tool can. On a 2-core machine the tool and
   the gateway share the cores, so the burst also prints the signals accepted per second of
   gateway CPU (what one core of the gateway ingests).

Printed per size: the gateway's CPU (utime+stime from /proc/PID/stat over the window, as a
share of one core) and resident memory (VmRSS at the window's end, VmHWM), table poll bytes a
second (every byte read for the polls: status line, headers and body, all proxies together)
and the share answered 304, the health rounds (their mean time from the gateway's
`prewarm_health_round_seconds`; the period between rounds from `GET /admin/pods/{id}`'s
`last_ok_ms` of three pods sampled four times a second — rounds start
`pods.health_interval_ms` apart — and the spread of every pod's `last_ok_ms` in the newest
round), and the signal ingest (signals/s the gateway accepted and its 2xx count, in the window
and in the burst). Also podsim's and this tool's own CPU: on a 2-core machine they share the
cores with the gateway. Figures are reported, never asserted. Writes
out/bench-fleet/results.json.

1,000 pods need more than 1,024 file descriptors in the gateway (a connection or more to each
pod's health checks) and in podsim (a listener and the gateway's connections per pod): this
tool raises its own RLIMIT_NOFILE soft limit to the hard limit before it starts them, and the
children inherit it (the tests' process helpers, reused here, take no preexec hook).

    .venv/bin/python tools/bench-fleet.py        # make bench-fleet builds the release binaries
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import re
import resource
import string
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
if "PREWARM_BIN_DIR" not in os.environ:
    os.environ["PREWARM_BIN_DIR"] = str(Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "release")

from harness import LISTENING, ManagedProcess, bin_path, wait_until  # noqa: E402
from harness.gateway import READ_TOKEN, SIGNAL_TOKEN, start_gateway  # noqa: E402


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


SIZES = [int(n) for n in os.environ.get("BENCH_FLEET_PODS", "100,1000").split(",") if n.strip()]
WINDOW_S = env_int("BENCH_FLEET_SECONDS", 30)
PROXIES = env_int("BENCH_FLEET_PROXIES", 100)
RPS = env_int("BENCH_FLEET_RPS", 10)
PREFIXES = env_int("BENCH_FLEET_PREFIXES", 256)
BURST_S = env_int("BENCH_FLEET_BURST_SECONDS", 5)
IDLE_S = env_int("BENCH_FLEET_IDLE_SECONDS", 5)
BURST_CONNECTIONS = env_int("BENCH_FLEET_BURST_CONNECTIONS", 4)
SETTLE_TIMEOUT_S = env_int("BENCH_FLEET_SETTLE_TIMEOUT", 180)
POD_BLOCKS = env_int("BENCH_FLEET_POD_BLOCKS", 4096)  # KV blocks a pod: podsim's memory is per block
MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # podsim's default served model
PREFIX_BYTES = 2048  # 512 tokens: 8 blocks of 64, one shard
BURST_SIGNALS = 10_000  # the gateway's per-batch maximum
REQUEST_TIMEOUT_S = 10.0
OUT = REPO / "out" / "bench-fleet"
GOALS = "goals at 1,000 pods and 100 proxies: table traffic <= 1 MB/s, gateway <= 50 % of a core, <= 1 GiB RSS; ingest >= 1 M signals/s"


def log(msg: str) -> None:
    print(f"[bench-fleet {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- /proc -------------------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid`, seconds (/proc/PID/stat fields 14 and 15)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} for {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def own_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def raise_fd_limit() -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


# --- a counting HTTP/1.1 client ------------------------------------------------------------------


class Http:
    """One keep-alive HTTP/1.1 connection, as a proxy's cluster holds to the gateway; counts the
    bytes it reads. Reconnects once when the server closed the connection."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: Optional[asyncio.StreamReader] = None
        self.writer: Optional[asyncio.StreamWriter] = None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, method: str, path: str, headers: dict, body: bytes = b"") -> tuple[int, dict, bytes, int]:
        """(status, lower-case headers, body, bytes read)."""
        for attempt in (0, 1):
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            try:
                return await asyncio.wait_for(self._exchange(method, path, headers, body), REQUEST_TIMEOUT_S)
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if attempt:
                    raise
            except BaseException:
                self.close()
                raise
        raise AssertionError("unreachable")

    async def _exchange(self, method: str, path: str, headers: dict, body: bytes) -> tuple[int, dict, bytes, int]:
        assert self.reader is not None and self.writer is not None
        head = f"{method} {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\ncontent-length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        self.writer.write(head.encode() + body)
        await self.writer.drain()
        status_line = await self.reader.readuntil(b"\r\n")
        read = len(status_line)
        reply_headers: dict = {}
        while True:
            line = await self.reader.readuntil(b"\r\n")
            read += len(line)
            if line == b"\r\n":
                break
            k, _, v = line.decode("latin-1").partition(":")
            reply_headers[k.strip().lower()] = v.strip()
        status = int(status_line.split()[1])
        if "content-length" in reply_headers:
            data = await self.reader.readexactly(int(reply_headers["content-length"]))
            read += len(data)
        elif reply_headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size_line = await self.reader.readuntil(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                chunk = await self.reader.readexactly(size + 2)
                read += len(size_line) + len(chunk)
                if size == 0:
                    break
                parts.append(chunk[:-2])
            data = b"".join(parts)
        elif status in (204, 304) or 100 <= status < 200:
            data = b""
        else:
            data = await self.reader.read()
            read += len(data)
            self.close()
        if reply_headers.get("connection", "").lower() == "close":
            self.close()
        return status, reply_headers, data, read


# --- the fleet and the gateway ---------------------------------------------------------------------


def start_podsim_fleet(tmp: Path, pods: int) -> tuple[ManagedProcess, list[str]]:
    """One podsim process serving `pods` pods; their addresses, in the order printed."""
    argv = [bin_path("podsim"), "--port", "0", "--pods", str(pods), "--time-scale", "100",
            "--num-gpu-blocks", str(POD_BLOCKS), "--shutdown-grace-seconds", "1"]
    proc = ManagedProcess(argv, tmp / "podsim.log", env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "0"})
    pattern = re.compile(LISTENING)

    def all_listening():
        if not proc.alive():
            raise RuntimeError(f"podsim exited: {proc.output()[-2000:]}")
        found = pattern.findall(proc.output())
        return found if len(found) >= pods else None

    addrs = wait_until(all_listening, timeout=120, interval=0.1, what=f"{pods} podsim pods listening")
    return proc, list(addrs)


def hot_prefixes(count: int) -> list[tuple[str, list[str]]]:
    """`count` distinct 512-token texts and their block hashes, from the gateway binary."""
    rng = random.Random(39)
    texts = ["".join(rng.choices(string.ascii_lowercase + " ", k=PREFIX_BYTES)) for _ in range(count)]
    out = subprocess.run([bin_path("prewarm-gateway"), "fingerprint", "--model", MODEL, "--jsonl"],
                         input="".join(json.dumps(t) + "\n" for t in texts).encode(),
                         capture_output=True, timeout=120, check=True).stdout
    return list(zip(texts, (json.loads(line)["blocks"] for line in out.splitlines())))


def metric_values(text: str, name: str) -> dict[str, float]:
    """Every sample of family `name` (label set -> value) in Prometheus text."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name):len(name) + 1] in ("{", " ")):
            key, _, value = line.rpartition(" ")
            out[key[len(name):]] = float(value)
    return out


def metric_sum(text: str, name: str) -> float:
    return sum(metric_values(text, name).values())


# --- one proxy ------------------------------------------------------------------------------------


@dataclass
class ProxyStats:
    polls: int = 0
    polls_304: int = 0
    polls_200: int = 0
    polls_failed: int = 0
    poll_bytes: int = 0
    table_bytes_200: int = 0
    deltas: int = 0
    delta_bytes: int = 0
    posts: int = 0
    posts_2xx: int = 0
    posts_failed: int = 0
    signals_sent: int = 0
    signals_accepted: int = 0
    records_sent: int = 0
    poll_ms: list = field(default_factory=list)
    post_ms: list = field(default_factory=list)


def tick_batch(rng: random.Random, source: str, prefixes: list[tuple[str, list[str]]], pods: list[str]) -> dict:
    """One filter tick's batch for RPS requests: feedback tallied by prefix (adopted, then
    succeeded, each with its count), a served and an outcome record a request."""
    now_ms = int(time.time() * 1000)
    adopted: dict[str, int] = {}
    served, outcomes = [], []
    weights = [1.0 / (k + 1) for k in range(len(prefixes))]  # a Zipf-like mix of hot prefixes
    for _ in range(RPS):
        _, blocks = rng.choices(prefixes, weights)[0]
        last = blocks[-1]
        adopted[last] = adopted.get(last, 0) + 1
        pod = rng.choice(pods) if pods else None
        if pod:
            served.append({"pod": pod, "model": MODEL, "shards": [last], "chained_tokens": 512,
                           "prompt_tokens": 530})
        outcomes.append({"pod": pod, "model": MODEL, "at_ms": now_ms - 200, "ttfb_ms": rng.randint(40, 200),
                         "status": 200, "stream": False, "prompt_tokens": 530, "cached_tokens": 512,
                         "prefix": last})
    signals = [{"kind": "feedback", "model": MODEL, "prefix": p, "outcome": o, "count": c}
               for o in ("adopted", "succeeded") for p, c in adopted.items()]
    return {"version": "1.0", "source": source, "sent_at_ms": now_ms, "dropped": 0, "signals": signals,
            "served": served, "outcomes": outcomes}


async def proxy(i: int, host: str, port: int, start: float, end: float, prefixes, stats: ProxyStats) -> None:
    rng = random.Random(i)
    http = Http(host, port)
    held: Optional[int] = None  # the generation held, as the filter keeps it
    pods: list[str] = []
    auth = {"authorization": f"Bearer {SIGNAL_TOKEN}"}
    tick = start + i / max(PROXIES, 1)  # spread over the first second
    try:
        while tick < end:
            await asyncio.sleep(max(0.0, tick - time.monotonic()))
            headers = dict(auth)
            path = "/v1/routing"
            if held is not None:  # as the filter polls: conditional on, and a delta from, its generation
                headers["if-none-match"] = f'"{held}"'
                path = f"/v1/routing?since={held}"
            t = time.monotonic()
            try:
                status, _, body, read = await http.request("GET", path, headers)
                stats.poll_ms.append((time.monotonic() - t) * 1e3)
                stats.polls += 1
                stats.poll_bytes += read
                if status == 304:
                    stats.polls_304 += 1
                elif status == 200:
                    stats.polls_200 += 1
                    reply = json.loads(body)
                    if "base" in reply:  # a delta: the pods it removes and upserts (core's table_delta)
                        stats.deltas += 1
                        stats.delta_bytes += len(body)
                        if reply["base"] != held:
                            stats.polls_failed += 1
                            held = None  # the filter fetches the whole table then
                        else:
                            gone = set(reply.get("removed", [])) | {p["id"] for p in reply.get("upserted", [])}
                            pods = [p for p in pods if p not in gone] + [p["id"] for p in reply.get("upserted", [])]
                            held = reply["generation"]
                    else:
                        stats.table_bytes_200 += len(body)
                        pods = [p["id"] for p in reply["pods"]]
                        held = reply["generation"]
                else:
                    stats.polls_failed += 1
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                stats.polls_failed += 1
            batch = tick_batch(rng, f"proxy-{i}", prefixes, pods)
            body = json.dumps(batch, separators=(",", ":")).encode()
            t = time.monotonic()
            try:
                status, _, reply, _ = await http.request(
                    "POST", "/v1/signals", {**auth, "content-type": "application/json"}, body)
                stats.post_ms.append((time.monotonic() - t) * 1e3)
                stats.posts += 1
                stats.signals_sent += len(batch["signals"])
                stats.records_sent += len(batch["served"]) + len(batch["outcomes"])
                if 200 <= status < 300:
                    stats.posts_2xx += 1
                    r = json.loads(reply)
                    stats.signals_accepted += r["prefills"] + r["feedback"] + r["pins"]
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                stats.posts_failed += 1
            tick += 1.0
    finally:
        http.close()


async def last_ok(http: "Http", pod: str) -> Optional[int]:
    """The pod's `last_ok_ms` (`GET /admin/pods/{id}`), None when the gateway does not answer 200."""
    try:
        status, _, body, _ = await http.request("GET", f"/admin/pods/{pod}",
                                                {"authorization": f"Bearer {READ_TOKEN}"})
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
        return None
    return json.loads(body)["last_ok_ms"] if status == 200 else None


async def sample_health(host: str, port: int, ids: list[str], end: float) -> dict[str, list[int]]:
    """`last_ok_ms` of pods `ids`, four times a second until `end`: the distinct values."""
    http = Http(host, port)
    seen: dict[str, list[int]] = {i: [] for i in ids}
    try:
        while time.monotonic() < end:
            for pod in ids:
                ok = await last_ok(http, pod)
                if ok is not None and (not seen[pod] or seen[pod][-1] != ok):
                    seen[pod].append(ok)
            await asyncio.sleep(0.25)
    finally:
        http.close()
    return seen


async def sweep_last_ok(host: str, port: int, ids: list[str]) -> list[int]:
    """Every pod's `last_ok_ms`, read on 16 connections."""
    queue = list(ids)
    out: list[int] = []

    async def worker():
        http = Http(host, port)
        try:
            while queue:
                ok = await last_ok(http, queue.pop())
                if ok is not None:
                    out.append(ok)
        finally:
            http.close()

    await asyncio.gather(*(worker() for _ in range(16)))
    return out


async def burst(host: str, port: int, prefixes) -> dict:
    """Batches of BURST_SIGNALS feedback signals, back to back on BURST_CONNECTIONS connections."""
    signals = [{"kind": "feedback", "model": MODEL, "prefix": prefixes[k % len(prefixes)][1][-1],
                "outcome": "adopted" if k % 2 else "succeeded", "count": 1} for k in range(BURST_SIGNALS)]
    body = json.dumps({"version": "1.0", "source": "burst", "signals": signals}, separators=(",", ":")).encode()
    headers = {"authorization": f"Bearer {SIGNAL_TOKEN}", "content-type": "application/json"}
    totals = {"posts": 0, "posts_2xx": 0, "accepted": 0, "failed": 0}
    start = time.monotonic()
    end = start + BURST_S

    async def poster():
        http = Http(host, port)
        try:
            while time.monotonic() < end:
                try:
                    status, _, reply, _ = await http.request("POST", "/v1/signals", headers, body)
                except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                    totals["failed"] += 1
                    continue
                totals["posts"] += 1
                if 200 <= status < 300:
                    totals["posts_2xx"] += 1
                    r = json.loads(reply)
                    totals["accepted"] += r["prefills"] + r["feedback"] + r["pins"]
        finally:
            http.close()

    await asyncio.gather(*(poster() for _ in range(BURST_CONNECTIONS)))
    elapsed = time.monotonic() - start
    return {**totals, "seconds": elapsed, "batch_bytes": len(body), "signals_per_batch": BURST_SIGNALS,
            "accepted_per_s": totals["accepted"] / elapsed, "bytes_per_s": totals["posts"] * len(body) / elapsed}


# --- one fleet size -------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> Optional[float]:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def run_size(n: int, tmp: Path, prefixes) -> dict:
    log(f"{n} pods: starting podsim --pods {n}")
    podsim, addrs = start_podsim_fleet(tmp, n)
    ids = [f"pod-{k:04d}" for k in range(n)]
    gw = None
    try:
        config = {"pods": {"base_model": MODEL,
                           "static": [{"id": i, "address": a} for i, a in zip(ids, addrs)]}}
        gw = start_gateway(tmp, config, name=f"gateway-{n}", timeout=60)
        pid, podsim_pid = gw.proc.proc.pid, podsim.proc.pid
        host, port = gw.url.removeprefix("http://").rsplit(":", 1)
        port = int(port)
        log(f"{n} pods: gateway pid {pid} at {gw.url}; {len(prefixes)} hot prefixes signalled")
        signals = [{"kind": "prefill", "model": MODEL, "endpoint": "completions", "prefix": blocks,
                    "prefix_tokens": len(blocks) * 64, "prefix_text": text, "state": "new", "priority": 40}
                   for text, blocks in prefixes]
        for k in range(0, len(signals), 100):
            r = gw.signals({"version": "1.0", "source": "bench-fleet-seed", "signals": signals[k:k + 100]})
            assert r.status_code == 202 and r.json()["rejected"] == 0, r.text

        settle_start = time.monotonic()
        last = {"prefills": -1.0, "at": 0.0}

        def steady():
            text = gw.get("/metrics").text
            pods = metric_values(text, "prewarm_pods")
            up, warming = pods.get('{state="up"}', 0), pods.get('{state="warming"}', 0)
            prefills = metric_sum(text, "prewarm_prefills_total")
            now = time.monotonic()
            if up < n or warming > 0 or prefills != last["prefills"]:
                last.update(prefills=prefills, at=now)
                return False
            return now - last["at"] >= 2.0

        wait_until(steady, timeout=SETTLE_TIMEOUT_S, interval=0.5, what=f"{n} pods up, warmed, no prefill for 2 s")
        settle_s = time.monotonic() - settle_start
        log(f"{n} pods: steady after {settle_s:.1f} s; measuring {WINDOW_S} s with {PROXIES} proxies")

        # the health checks alone, before any proxy: what the fleet's size costs by itself
        idle0, idle_t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(IDLE_S)
        idle_cpu = (cpu_seconds(pid) - idle0) / (time.monotonic() - idle_t0)

        metrics_before = gw.get("/metrics").text
        stats = [ProxyStats() for _ in range(PROXIES)]

        async def window():
            start = time.monotonic() + 0.1
            end = start + WINDOW_S
            sampled = [ids[0], ids[n // 2], ids[-1]]
            health = asyncio.create_task(sample_health(host, port, sampled, end))
            cpu0, podsim0, own0, t0 = cpu_seconds(pid), cpu_seconds(podsim_pid), own_cpu_seconds(), time.monotonic()
            await asyncio.gather(*(proxy(i, host, port, start, end, prefixes, stats[i]) for i in range(PROXIES)))
            t1 = time.monotonic()
            cpu1, podsim1, own1 = cpu_seconds(pid), cpu_seconds(podsim_pid), own_cpu_seconds()
            seen = await health
            rss, hwm = status_kib(pid, "VmRSS"), status_kib(pid, "VmHWM")
            podsim_rss = status_kib(podsim_pid, "VmRSS")
            fds = (open_fds(pid), open_fds(podsim_pid))
            sweep = await sweep_last_ok(host, port, ids)
            return {"elapsed": t1 - t0, "gateway_cpu": (cpu1 - cpu0) / (t1 - t0),
                    "podsim_cpu": (podsim1 - podsim0) / (t1 - t0), "tool_cpu": (own1 - own0) / (t1 - t0),
                    "rss_kib": rss, "hwm_kib": hwm, "podsim_rss_kib": podsim_rss, "fds": fds, "seen": seen, "sweep": sweep}

        w = asyncio.run(window())
        metrics_after = gw.get("/metrics").text
        log(f"{n} pods: burst of {BURST_SIGNALS}-signal batches for {BURST_S} s on {BURST_CONNECTIONS} connections")
        cpu_b0, own_b0, tb0 = cpu_seconds(pid), own_cpu_seconds(), time.monotonic()
        b = asyncio.run(burst(host, port, prefixes))
        tb = time.monotonic() - tb0
        b["gateway_cpu"] = (cpu_seconds(pid) - cpu_b0) / tb
        b["tool_cpu"] = (own_cpu_seconds() - own_b0) / tb
        # what one core of the gateway ingests, whatever share of the cores it got
        b["accepted_per_gateway_cpu_s"] = b["accepted_per_s"] / b["gateway_cpu"] if b["gateway_cpu"] else None
        b["rss_kib_after"] = status_kib(pid, "VmRSS")
    finally:
        if gw is not None:
            gw.proc.stop()
        podsim.stop()

    elapsed = w["elapsed"]
    total = lambda f: sum(getattr(s, f) for s in stats)  # noqa: E731
    polls = total("polls")
    periods = []
    for values in w["seen"].values():
        periods += [b_ - a_ for a_, b_ in zip(values, values[1:])]
    sweep = sorted(w["sweep"], reverse=True)
    mean_period = sum(periods) / len(periods) if periods else None
    # the newest round: the values within half a period of the newest one
    newest = [v for v in sweep if mean_period and v >= sweep[0] - mean_period / 2]
    gen = lambda t: metric_sum(t, "prewarm_routing_table_generation")  # noqa: E731
    delta = lambda name: metric_sum(metrics_after, name) - metric_sum(metrics_before, name)  # noqa: E731
    return {
        "pods": n, "proxies": PROXIES, "window_s": round(elapsed, 2), "settle_s": round(settle_s, 1),
        "gateway_cpu_share": round(w["gateway_cpu"], 4), "gateway_cpu_share_health_only": round(idle_cpu, 4),
        "gateway_fds": w["fds"][0], "podsim_fds": w["fds"][1],
        "gateway_rss_mib": round(w["rss_kib"] / 1024, 1), "gateway_hwm_mib": round(w["hwm_kib"] / 1024, 1),
        "podsim_cpu_share": round(w["podsim_cpu"], 4), "podsim_rss_mib": round(w["podsim_rss_kib"] / 1024, 1),
        "tool_cpu_share": round(w["tool_cpu"], 4),
        "polls": polls, "polls_304": total("polls_304"), "polls_200": total("polls_200"),
        "polls_failed": total("polls_failed"),
        "share_304": round(total("polls_304") / polls, 4) if polls else None,
        "poll_bytes_per_s": round(total("poll_bytes") / elapsed),
        "whole_tables": total("polls_200") - total("deltas"),
        "table_body_bytes_whole_mean": (round(total("table_bytes_200") / (total("polls_200") - total("deltas")))
                                        if total("polls_200") > total("deltas") else None),
        "deltas": total("deltas"),
        "delta_body_bytes_mean": round(total("delta_bytes") / total("deltas")) if total("deltas") else None,
        "poll_ms_p50": percentile([x for s in stats for x in s.poll_ms], 0.5),
        "poll_ms_p99": percentile([x for s in stats for x in s.poll_ms], 0.99),
        "table_generations_in_window": gen(metrics_after) - gen(metrics_before),
        "health_interval_ms": 1000,
        "health_period_ms_mean": round(mean_period, 1) if mean_period else None,
        "health_period_ms_max": max(periods) if periods else None,
        "health_rounds_in_window": delta("prewarm_health_round_seconds_count"),
        "health_round_ms_mean": (round(1000 * delta("prewarm_health_round_seconds_sum")
                                       / delta("prewarm_health_round_seconds_count"), 1)
                                 if delta("prewarm_health_round_seconds_count") else None),
        "last_ok_spread_ms_newest_round": (max(newest) - min(newest)) if newest else None,
        "last_ok_pods_in_newest_round": len(newest),
        "posts": total("posts"), "posts_2xx": total("posts_2xx"), "posts_failed": total("posts_failed"),
        "signals_sent": total("signals_sent"), "signals_accepted": total("signals_accepted"),
        "signals_accepted_per_s": round(total("signals_accepted") / elapsed, 1),
        "records_sent_per_s": round(total("records_sent") / elapsed, 1),
        "post_ms_p50": percentile([x for s in stats for x in s.post_ms], 0.5),
        "post_ms_p99": percentile([x for s in stats for x in s.post_ms], 0.99),
        "prefills_in_window": delta("prewarm_prefills_total"),
        "burst": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in b.items()},
    }


def report(r: dict) -> None:
    b = r["burst"]
    p = lambda v, fmt: "n/a" if v is None else format(v, fmt)  # noqa: E731
    print(f"""
== {r['pods']} pods, {r['proxies']} proxies, {r['window_s']} s window (steady after {r['settle_s']} s) ==
gateway CPU          {r['gateway_cpu_share'] * 100:.1f} % of one core   (health checks alone, before the proxies: {r['gateway_cpu_share_health_only'] * 100:.1f} %; podsim {r['podsim_cpu_share'] * 100:.1f} %, this tool {r['tool_cpu_share'] * 100:.1f} %)
gateway memory       VmRSS {r['gateway_rss_mib']} MiB, VmHWM {r['gateway_hwm_mib']} MiB   (podsim VmRSS {r['podsim_rss_mib']} MiB); open fds: gateway {r['gateway_fds']}, podsim {r['podsim_fds']}
table polls          {r['poll_bytes_per_s'] / 1e6:.3f} MB/s read by all proxies; {r['polls']} polls, {p(r['share_304'] and r['share_304'] * 100, '.1f')} % answered 304, {r['whole_tables']} whole tables of {p(r['table_body_bytes_whole_mean'], 'd')} bytes (mean), {r['deltas']} deltas of {p(r['delta_body_bytes_mean'], 'd')} bytes (mean), {r['polls_failed']} failed; {r['table_generations_in_window']:.0f} generations in the window; poll p50 {p(r['poll_ms_p50'], '.1f')} ms, p99 {p(r['poll_ms_p99'], '.1f')} ms
health rounds        period {p(r['health_period_ms_mean'], '.0f')} ms mean (max {p(r['health_period_ms_max'], 'd')}) at a {r['health_interval_ms']} ms interval; {r['health_rounds_in_window']:.0f} rounds of {p(r['health_round_ms_mean'], '.0f')} ms mean (prewarm_health_round_seconds); last_ok_ms spread over the newest round's {r['last_ok_pods_in_newest_round']} pods {p(r['last_ok_spread_ms_newest_round'], 'd')} ms
signals (window)     {r['signals_accepted_per_s']:.0f} signals/s accepted ({r['signals_accepted']} of {r['signals_sent']}), {r['posts_2xx']}/{r['posts']} posts 2xx, {r['posts_failed']} failed, {r['records_sent_per_s']:.0f} served+outcome records/s; post p50 {p(r['post_ms_p50'], '.1f')} ms, p99 {p(r['post_ms_p99'], '.1f')} ms; {r['prefills_in_window']:.0f} warm prefills sent
signals (burst)      {b['accepted_per_s']:.0f} signals/s accepted, {b['posts_2xx']}/{b['posts']} posts 2xx ({b['signals_per_batch']} signals, {b['batch_bytes']} bytes each; {b['bytes_per_s'] / 1e6:.1f} MB/s), {b['failed']} failed; gateway CPU {b['gateway_cpu'] * 100:.0f} % of one core (this tool {b['tool_cpu'] * 100:.0f} %): {p(b['accepted_per_gateway_cpu_s'], '.0f')} signals a gateway CPU-second; VmRSS after {b['rss_kib_after'] / 1024:.1f} MiB""")


def main() -> int:
    soft, hard = raise_fd_limit()
    log(f"RLIMIT_NOFILE {soft}/{hard} (inherited by podsim and the gateway); binaries from {os.environ['PREWARM_BIN_DIR']}")
    if max(SIZES) + 64 > soft:
        log(f"warning: {max(SIZES)} pods need more file descriptors than the limit {soft}")
    for b in ("podsim", "prewarm-gateway"):
        if not bin_path(b).exists():
            log(f"missing {bin_path(b)}: run make bench-fleet (it builds the release binaries)")
            return 2
    prefixes = hot_prefixes(PREFIXES)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        for n in SIZES:
            d = Path(tmp) / f"pods-{n}"
            d.mkdir()
            results.append(run_size(n, d, prefixes))
            report(results[-1])
    print(f"\n{GOALS}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": results}, indent=2) + "\n")
    log(f"wrote {OUT / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
