"""Live replay of a Mooncake-format trace through an OpenAI endpoint, for `make demo` while
`prewarm-replay live` is not available (the demo prefers the Rust replayer when it is).

It follows the replayer's conventions (examples/replay/src/{render,assign}.rs), so both drive the
stack the same way:
- each 512-token block id is rendered as the same 2,048 bytes of pseudo-words (splitmix64 seeded
  by the id), a prompt is its blocks cut to `input_length` tokens, sent as a completion prompt;
- the user (the filter's `x-prewarm-user`) is `group-<first block id>`: the requests that share
  a prefix;
- adapters come from ServeGen customers (`sg-<i>`, one per CSV), drawn per prefix group at the
  group's first arrival with the customers' rates in the window mapped onto the trace there;
  tenant = adapter; the top 10 % of tenants by requests are gold, the next 20 % silver.

Every request streams; TTFT is the time to the first token chunk, scaled by `time_scale` into
model time (podsim runs with the same `--time-scale`). The serving pod comes from Envoy's
`x-prewarm-upstream` response header; `cached_tokens` from the final usage chunk.
"""
from __future__ import annotations

import csv
import http.client
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import urlparse

MASK = (1 << 64) - 1
BLOCK_TOKENS = 512
BLOCK_BYTES = BLOCK_TOKENS * 4


def splitmix64(state: int) -> tuple[int, int]:
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def block_text(block_id: int) -> str:
    """examples/replay/src/render.rs `block_text`, byte for byte."""
    state = (block_id ^ 0x7072657761726D62) & MASK
    out = bytearray()
    while len(out) < BLOCK_BYTES:
        state, r = splitmix64(state)
        length = 2 + r % 7
        out.extend(97 + ((r >> (8 + 5 * k)) % 26) for k in range(length))
        out.append(32)
    return out[:BLOCK_BYTES].decode()


@dataclass
class TraceRequest:
    index: int
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: list
    adapter: Optional[str] = None
    tenant: Optional[str] = None

    @property
    def user(self) -> str:
        return f"group-{self.hash_ids[0]}"


def load_trace(path: Path, until_s: float) -> list[TraceRequest]:
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            row = json.loads(line)
            if row["timestamp"] / 1000.0 >= until_s:
                break
            out.append(TraceRequest(i, row["timestamp"], row["input_length"], row["output_length"],
                                    row["hash_ids"]))
    return out


def read_servegen(folder: Path) -> tuple[list[str], list[list[float]]]:
    chunks = []
    for p in folder.glob("chunk-*-trace.csv"):
        m = re.fullmatch(r"chunk-(\d+)-trace\.csv", p.name)
        if m:
            chunks.append((int(m.group(1)), p))
    chunks.sort()
    names, rates = [], []
    for n, p in chunks:
        with open(p) as f:
            rates.append([float(r[1] or 0) for r in csv.reader(f) if r])
        names.append(f"sg-{n}")
    width = min(len(r) for r in rates)
    return names, [r[:width] for r in rates]


def assign_adapters(trace: list[TraceRequest], folder: Path, seed: int = 1,
                    gold_share: float = 0.1, silver_share: float = 0.2) -> dict[str, str]:
    """Sets `adapter`/`tenant` per prefix group; returns the tier of every tenant."""
    names, rates = read_servegen(folder)
    windows = len(rates[0])
    span = max(trace[-1].timestamp_ms / 1000.0, 1e-9)
    state = seed & MASK
    groups: dict[int, str] = {}
    for r in trace:
        g = r.hash_ids[0]
        if g not in groups:
            w = min(int(r.timestamp_ms / 1000.0 / span * windows), windows - 1)
            weights = [c[w] for c in rates]
            if sum(weights) <= 0:
                weights = [sum(c) for c in rates]
            state, x = splitmix64(state)
            pick = (x / 2**64) * sum(weights)
            chosen = len(weights) - 1
            for k, wgt in enumerate(weights):
                pick -= wgt
                if pick < 0:
                    chosen = k
                    break
            groups[g] = names[chosen]
        r.adapter = r.tenant = groups[g]
    counts: dict[str, int] = {}
    for r in trace:
        counts[r.tenant] = counts.get(r.tenant, 0) + 1
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    gold = max(1, round(len(ranked) * gold_share))
    silver = round(len(ranked) * silver_share)
    return {t: "gold" if i < gold else "silver" if i < gold + silver else "bronze"
            for i, t in enumerate(ranked)}


@dataclass
class Outcome:
    index: int
    arrival_s: float
    """Trace time of the request, seconds."""
    status: int
    ttft_ms: Optional[float]
    """Model time (real × time scale)."""
    latency_ms: Optional[float]
    pod: str
    prompt_tokens: int
    cached_tokens: int
    adapter: Optional[str]
    user: str
    error: Optional[str] = None


class Prompts:
    def __init__(self):
        self._blocks: dict[int, str] = {}
        self._lock = threading.Lock()

    def prompt(self, r: TraceRequest) -> str:
        want = r.input_length * 4
        parts, size = [], 0
        for block_id in r.hash_ids:
            if size >= want:
                break
            with self._lock:
                text = self._blocks.get(block_id)
                if text is None:
                    text = self._blocks[block_id] = block_text(block_id)
            take = min(want - size, len(text))
            parts.append(text[:take])
            size += take
        return "".join(parts)


def send(target: str, r: TraceRequest, prompt: str, model: str, max_tokens: int, time_scale: float,
         started: float) -> Outcome:
    url = urlparse(target)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    headers = {"content-type": "application/json", "x-prewarm-user": r.user}
    if r.tenant:
        headers["x-prewarm-tenant"] = r.tenant
    arrival = r.timestamp_ms / 1000.0
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=300)
    try:
        conn.request("POST", "/v1/completions", body, headers)
        resp = conn.getresponse()
        pod = resp.getheader("x-prewarm-upstream") or ""
        if resp.status != 200:
            text = resp.read()[:200].decode(errors="replace")
            return Outcome(r.index, arrival, resp.status, None, None, pod, 0, 0, r.adapter, r.user, text)
        ttft = None
        usage = {}
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if ttft is None and chunk.get("choices"):
                ttft = time.monotonic() - t0
            if chunk.get("usage"):
                usage = chunk["usage"]
        total = time.monotonic() - t0
        details = usage.get("prompt_tokens_details") or {}
        return Outcome(r.index, arrival, 200, None if ttft is None else ttft * 1000 * time_scale,
                       total * 1000 * time_scale, pod, int(usage.get("prompt_tokens") or 0),
                       int(details.get("cached_tokens") or 0), r.adapter, r.user)
    except (OSError, http.client.HTTPException, ValueError) as e:
        return Outcome(r.index, arrival, 0, None, None, "", 0, 0, r.adapter, r.user, repr(e))
    finally:
        conn.close()


def replay(target: str, trace: list[TraceRequest], base_model: str, time_scale: float,
           max_tokens_cap: int = 128, on_progress: Optional[Callable[[str], None]] = None,
           progress_every_s: float = 10.0, events: Optional[list] = None,
           stop: Optional[threading.Event] = None) -> list[Outcome]:
    """Sends every request of `trace` at `timestamp / time_scale` after the start (real
    seconds); `events` are `(trace_s, callable)` run (in their own thread) when the replay
    reaches that trace time. Returns the outcomes in trace order."""
    prompts = Prompts()
    outcomes: list[Optional[Outcome]] = [None] * len(trace)
    pending = sorted(events or [], key=lambda e: e[0])
    started = time.monotonic()
    done = threading.Semaphore(0)
    lock = threading.Lock()
    counts = {"sent": 0, "done": 0, "errors": 0}

    def run(i: int, r: TraceRequest):
        model = r.adapter or base_model
        o = send(target, r, prompts.prompt(r), model, max(1, min(r.output_length, max_tokens_cap)),
                 time_scale, started)
        outcomes[i] = o
        with lock:
            counts["done"] += 1
            counts["errors"] += o.status != 200
        done.release()

    last_report = started
    with ThreadPoolExecutor(max_workers=192) as pool:
        for i, r in enumerate(trace):
            due = started + r.timestamp_ms / 1000.0 / time_scale
            while True:
                now = time.monotonic()
                while pending and pending[0][0] <= (now - started) * time_scale:
                    _, action = pending.pop(0)
                    threading.Thread(target=action, daemon=True).start()
                if on_progress and now - last_report >= progress_every_s:
                    last_report = now
                    with lock:
                        on_progress(f"replay: trace {int((now - started) * time_scale)}s/"
                                    f"{int(trace[-1].timestamp_ms / 1000)}s  sent {counts['sent']}  "
                                    f"done {counts['done']}  errors {counts['errors']}")
                if now >= due or (stop and stop.is_set()):
                    break
                time.sleep(min(0.05, due - now))
            if stop and stop.is_set():
                break
            with lock:
                counts["sent"] += 1
            pool.submit(run, i, r)
    return [o for o in outcomes if o is not None]


def outcomes_json(outcomes: list[Outcome]) -> list[dict]:
    return [asdict(o) for o in outcomes]
