"""The demo's gateway outage: `tools/demo.py --gateway-outage START:SECONDS` (docs/demo.md,
"Gateway outage").

START is a trace second, as `--joins-at` is; SECONDS is real time. The gateway's process is
SIGKILLed at START and started again after SECONDS of real time, on the same port with the same
state directory (the harness's `Stack.restart_gateway`), so it restores its snapshot. Real time,
because what the outage exercises runs in real time: the filter's takeover
(`direct_takeover_after_ms`), its table polls and the gateway's restart, health rounds and
warm-ups; the trace's clock only paces the requests (×`--time-scale`).

A pod that joins while the gateway is down is started (Envoy's health check finds it, as in any
run) and announced (`POST /admin/pods`) as soon as the restarted gateway accepts admin calls, as
an autoscaler's retry or the gateway's DNS discovery would, at best.

`RunWatch` records, in every run of an invocation with `--gateway-outage` (with and without the
outage, so they compare): a timeline of the filter's metrics (Envoy's admin `/stats`) and the
gateway's readiness, table generation and table pods every half second (`timeline.jsonl`), and
the real times of the run's events (`outage.json`). `Outage` adds the kill, the restart and the
recovery's marks, each polled for with a deadline. `summarize` turns the runs' files into the
figures docs/demo.md quotes; how each is defined is in its docstring and in the doc.
"""
from __future__ import annotations

import json
import re
import shutil
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from harness import wait_until
from harness.stack import Pod, Stack

SAMPLE_EVERY_S = 0.5
POLL_S = 0.05
RECOVERY_DEADLINE_S = 240.0
GATEWAY_LOG = "warn,prewarm_gateway::service::persist=info,prewarm_gateway::server=info"
"""The gateway's log filter in these runs: warnings, and the snapshot lines (`snapshot loaded`)."""
LOST = ["signals_dropped_total", "served_dropped_total", "outcomes_dropped_total", "dispatch_failures_total",
        "table_fetch_failures_total"]
DIRECT = ["direct_sent_total", "direct_ok_total", "direct_failed_total", "direct_skipped_total{budget}",
          "direct_skipped_total{in_flight}", "direct_skipped_total{backoff}", "direct_skipped_total{no_pod}"]
AFTER_RESTART_S = 10.0
"""Real seconds after the restart over which the routing counters are read again."""
ROUTING = ["routed_total", "unrouted_total{no_table}", "unrouted_total{no_pod}", "unrouted_total{no_full_block}",
           "requests_inspected_total", "signals_enqueued_total", "signals_sent_total", "served_enqueued_total",
           "outcomes_enqueued_total"]


@dataclass(frozen=True)
class OutageSpec:
    start_s: float
    """Trace second of the kill."""
    down_s: float
    """Real seconds from the kill to the restart."""

    @staticmethod
    def parse(text: str) -> "OutageSpec":
        start, sep, down = text.partition(":")
        try:
            spec = OutageSpec(float(start), float(down))
        except ValueError:
            spec = None
        if not sep or spec is None or spec.start_s < 0 or spec.down_s <= 0:
            raise ValueError(f"--gateway-outage: {text!r}: must be START:SECONDS (trace second >= 0, "
                             "real seconds > 0), e.g. 400:60")
        return spec

    def restart_trace_s(self, scale: float) -> float:
        return self.start_s + self.down_s * scale

    def describe(self, scale: float) -> str:
        return (f"gateway killed at {self.start_s:g}s, restarted {self.down_s:g} s of real time later "
                f"(trace {self.restart_trace_s(scale):g}s)")


def filter_metrics(stack: Stack) -> dict:
    """Every filter metric in Envoy's `/stats`, by its Prometheus name without the
    `prewarm_filter_` prefix, a reason as `{reason}` (`unrouted_total{no_table}`)."""
    out = {}
    for name, value in stack.envoy.stats("^wasmcustom\\.prewarm_filter_").items():
        short = name.removeprefix("wasmcustom.prewarm_filter_")
        m = re.fullmatch(r"reason=\.=(.*?);\.;(.*)", short)
        out[f"{m.group(2)}{{{m.group(1)}}}" if m else short] = value
    return out


def gateway_view(stack: Stack) -> dict:
    """The gateway's readiness, table generation (`/metrics`) and table pods (`/v1/routing`);
    `{"up": False}` when it does not answer."""
    gw = stack.gateway
    try:
        ready = gw.get("/readyz").status_code
        generation = gateway_gauge(stack, "prewarm_routing_table_generation")
        pods = [p["id"] for p in stack.routing()["pods"]]
    except Exception:  # noqa: BLE001 - down is a value here
        return {"up": False}
    return {"up": True, "ready": ready == 200, "generation": generation, "pods": pods}


def gateway_gauge(stack: Stack, name: str) -> Optional[float]:
    for line in stack.gateway.get("/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def pool(stack: Stack) -> dict:
    """The gateway's hot prefixes: their count and keys (`GET /admin/prompts?k=1000`)."""
    body = stack.gateway.get("/admin/prompts?k=1000").json()
    return {"total": body["total"], "keys": [p["key"] for p in body["prompts"]]}


def warmups(stack: Stack) -> dict:
    """Every pod's last warm-up (`GET /admin/pods/{id}/warmup`): its tiers and the first tier's
    prefixes prefilled."""
    out = {}
    for pod in stack.pods:
        body = stack.gateway.get(f"/admin/pods/{pod.id}/warmup").json()
        w = body.get("warmup") or {}
        out[pod.id] = {"attempt": w.get("attempt"), "first_tier": w.get("first_tier"),
                       "second_tier": w.get("second_tier"), "adapters": w.get("adapters"),
                       "first_tier_warmed": body.get("first_tier_warmed", [])}
    return out


def prefills_by_pod(stack: Stack) -> dict:
    """`prewarm_prefills_total{pod,outcome="ok"}` by pod, of the running gateway process."""
    out: dict = {}
    for line in stack.gateway.get("/metrics").text.splitlines():
        m = re.match(r'prewarm_prefills_total\{pod="([^"]*)",outcome="ok"\} (\S+)', line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0) + float(m.group(2))
    return out


class RunWatch(threading.Thread):
    """The timeline and event marks of one run (see the module docs)."""

    def __init__(self, stack: Stack, workdir: Path, log: Callable[[str], None]):
        super().__init__(daemon=True)
        self.stack, self.workdir, self.log = stack, workdir, log
        self.t0: Optional[float] = None
        self.marks: dict = {}
        self.samples: list[dict] = []
        self.errors: list[str] = []
        self.stop_event = threading.Event()
        self.down = False
        self.lock = threading.Lock()

    def began(self) -> None:
        """The replay started: time 0 of the marks and the timeline."""
        if self.t0 is None:
            self.t0 = time.monotonic()
            self.start()

    def now(self) -> float:
        return round(time.monotonic() - (self.t0 or time.monotonic()), 3)

    def mark(self, name: str, **extra) -> None:
        if name not in self.marks:
            self.marks[name] = {"t": self.now(), **extra}

    def run(self) -> None:
        while not self.stop_event.wait(SAMPLE_EVERY_S):
            try:
                sample = {"t": self.now(), "filter": filter_metrics(self.stack),
                          "gateway": {"up": False} if self.down else gateway_view(self.stack)}
                self.samples.append(sample)
            except Exception as e:  # noqa: BLE001 - a missed sample is not a failure of the run
                self.errors.append(f"sample at {self.now()}: {e!r}")

    def timers(self, spec: Optional[OutageSpec], scale: float) -> list[threading.Timer]:
        """Without the outage: the gateway's pool read when the outage would begin, to compare."""
        if spec is None:
            return []
        return [threading.Timer(spec.start_s / scale, self.read_pool_at_kill)]

    def read_pool_at_kill(self) -> None:
        try:
            self.pool_at_kill = pool(self.stack)
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"pool at the kill: {e!r}")

    pool_at_kill: dict = {}

    def join_pod(self, index: int) -> None:
        """Spare `index` joins (the demo's join event)."""
        pod = self.stack.spares[index]
        self.mark(f"{pod.id} joins")
        self.stack.join_spare(index)
        self.mark(f"{pod.id} announced")

    def finish(self, extra: Optional[dict] = None) -> dict:
        self.stop_event.set()
        if self.is_alive():
            super().join(timeout=5)
        with open(self.workdir / "timeline.jsonl", "w") as f:
            for s in self.samples:
                f.write(json.dumps(s) + "\n")
        end: dict = {}
        try:
            end = {"pool": pool(self.stack), "warmups": warmups(self.stack)}
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"end: {e!r}")
        record = {"marks": self.marks, "errors": self.errors, "pool_at_kill": self.pool_at_kill, "end": end,
                  **(extra or {})}
        (self.workdir / "outage.json").write_text(json.dumps(record, indent=1))
        return record


class Outage(RunWatch):
    """`RunWatch` plus the outage: the kill at `spec.start_s` (trace), the restart `spec.down_s`
    real seconds later, joins during it deferred, and the recovery's marks."""

    def __init__(self, stack: Stack, workdir: Path, log: Callable[[str], None], spec: OutageSpec, scale: float):
        super().__init__(stack, workdir, log)
        self.spec, self.scale = spec, scale
        self.pending: list[Pod] = []
        self.before: dict = {}
        self.after: dict = {}

    def timers(self, spec: Optional[OutageSpec] = None, scale: float = 0) -> list[threading.Timer]:
        kill_at = self.spec.start_s / self.scale
        return [threading.Timer(kill_at, self.guarded(self.kill)),
                threading.Timer(kill_at + self.spec.down_s, self.guarded(self.restart))]

    def guarded(self, step: Callable[[], None]) -> Callable[[], None]:
        def go():
            try:
                step()
            except Exception as e:  # noqa: BLE001 - recorded, and the summary says so
                self.errors.append(f"{step.__name__}: {e!r}")
                self.log(f"gateway outage: {step.__name__} failed: {e!r}")
        return go

    def kill(self) -> None:
        stack = self.stack
        gw = stack.gateway
        self.read_pool_at_kill()
        self.before = {"prompts": self.pool_at_kill.get("total"),
                       "prefills": stack.gateway_metric("prewarm_prefills_total{"),
                       "prefills_ok_by_pod": prefills_by_pod(stack),
                       **gateway_view(stack)}
        with self.lock:
            gw.proc.kill()
            self.down = True
            self.mark("gateway killed")
        self.log(f"gateway outage: trace {self.spec.start_s:g}s: gateway SIGKILLed (pid {gw.proc.proc.pid}); "
                 f"{self.before['prompts']} hot prefixes, table generation {self.before['generation']:g} "
                 f"({', '.join(self.before['pods'])}); back in {self.spec.down_s:g} s")
        shutil.copy(gw.proc.log_path, self.workdir / "gateway-before-outage.log")
        wait_until(lambda: filter_metrics(stack).get("direct_active") == 1, 60, interval=POLL_S,
                   what="the filter takes over the warm calls")
        self.mark("filter takes over")
        self.log(f"gateway outage: the filter took over the warm calls {self.marks['filter takes over']['t'] - self.marks['gateway killed']['t']:.1f} s after the kill")

    def join_pod(self, index: int) -> None:
        with self.lock:
            if self.down:
                pod = self.stack.spares[index]
                self.mark(f"{pod.id} joins")
                self.stack.start_pod(pod, int(pod.address.rsplit(":", 1)[1]))
                self.stack.pods.append(pod)
                self.pending.append(pod)
                self.log(f"gateway outage: {pod.id} started on {pod.address}; the gateway is down: "
                         "announced when it is back")
                return
        super().join_pod(index)

    def restart(self) -> None:
        stack = self.stack
        self.mark("gateway restarted")
        stack.restart_gateway()
        self.mark("gateway listening")
        with self.lock:
            self.down = False
            pending, self.pending = self.pending, []
        for pod in pending:
            wait_until(lambda: stack.gateway.admin("POST", "/admin/pods", json=stack.pod_entry(pod)).status_code == 201,
                       30, interval=POLL_S, what=f"{pod.id} announced")
            self.mark(f"{pod.id} announced")
        self.log(f"gateway outage: gateway restarted on {stack.gateway.url} (same state dir)"
                 + (f"; announced {', '.join(p.id for p in pending)}" if pending else ""))
        self.watch_recovery()

    def watch_recovery(self) -> None:
        """Polls, from the restart, for each step of the recovery (module docs), with a deadline."""
        stack = self.stack
        first: dict = {}
        everyone = {p.id for p in stack.pods}
        updates_before = filter_metrics(stack).get("table_updates_total", 0)

        def step() -> bool:
            gw = gateway_view(stack)
            f = filter_metrics(stack)
            if gw.get("ready"):
                self.mark("readyz 200")
            if gw.get("generation") is not None and not first:
                first.update(generation=gw["generation"], pods=gw["pods"])
                self.mark("gateway first table", generation=gw["generation"], pods=gw["pods"])
            if first and f.get("table_updates_total", 0) > updates_before:
                # a 200 from the restarted gateway: its generations may sit below the filter's
                # (the snapshot is up to `snapshot_interval_seconds` old), so not compared
                self.mark("filter adopts a table of the restarted gateway", generation=f.get("table_generation"))
            if gw.get("up") and set(gw.get("pods", [])) >= everyone:
                self.mark("gateway table lists every pod", generation=gw["generation"])
            listed = self.marks.get("gateway table lists every pod")
            if listed and "filter adopts a table of the restarted gateway" in self.marks \
                    and f.get("table_generation", -1) >= listed["generation"]:
                self.mark("filter adopts a table listing every pod", generation=f.get("table_generation"))
            if "gateway listening" in self.marks and f.get("direct_active") == 0:
                self.mark("filter hands the warm calls back")
            return all(k in self.marks for k in ("readyz 200", "filter adopts a table listing every pod",
                                                  "filter hands the warm calls back"))

        wait_until(step, RECOVERY_DEADLINE_S, interval=POLL_S, what="the gateway's recovery")
        self.after = {"restored": snapshot_loaded(stack.gateway.proc.log_path)}
        r = lambda k: self.marks[k]["t"] - self.marks["gateway restarted"]["t"]  # noqa: E731
        self.log(f"gateway outage: recovered: /readyz 200 {r('readyz 200'):.2f} s after the restart, "
                 f"the filter's first table of it {r('filter adopts a table of the restarted gateway'):.2f} s, "
                 f"a table listing every pod {r('filter adopts a table listing every pod'):.2f} s; "
                 f"restored: {self.after['restored']}")

    def finish(self, extra: Optional[dict] = None) -> dict:
        stack = self.stack
        after = dict(self.after)
        try:
            after["prompts"] = stack.gateway.get("/admin/prompts?k=1").json()["total"]
            after["prefills_ok_by_pod"] = prefills_by_pod(stack)
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"after: {e!r}")
        return super().finish({"outage": {"start_s": self.spec.start_s, "down_s": self.spec.down_s,
                                          "scale": self.scale}, "before": self.before, "after": after,
                               **(extra or {})})


def snapshot_loaded(log_path: Path) -> Optional[dict]:
    """The `snapshot loaded` line of a gateway's log: its generation, prompts and adapters."""
    for line in Path(log_path).read_text(errors="replace").splitlines():
        if "snapshot loaded" in line:
            fields = dict(re.findall(r"(\w+)=(\S+)", line))
            return {k: (int(v) if v.isdigit() else v) for k, v in fields.items()
                    if k in ("generation", "prompts", "adapters")}
    return None


# --- the figures -------------------------------------------------------------------------------

def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def minute_shares(records: list[dict], minute_s: float = 60.0) -> dict[int, float]:
    """The cached share of prompt tokens of the requests arriving in each trace minute (served
    ones; a failed request has no usage)."""
    cached: dict[int, float] = {}
    prompt: dict[int, float] = {}
    for r in records:
        if r.get("error") is None and r.get("ttft_ms") is not None:
            m = int(r["arrival_s"] // minute_s)
            cached[m] = cached.get(m, 0) + r["cached_tokens"]
            prompt[m] = prompt.get(m, 0) + r["prompt_tokens"]
    return {m: cached[m] / prompt[m] for m in sorted(prompt) if prompt[m]}


def first_hot_from_first_served(records: list[dict], join_s: float, hot_requests: int = 2,
                                window_s: float = 300.0) -> list[dict]:
    """The replay's *first hot at join* (examples/replay/src/live/records.rs: a new pod's first
    request of each prefix group with at least `hot_requests` requests before the join), with
    its 5-minute window starting at the pod's first served request instead of its join: a pod
    that joins while the gateway is down gets no request until the gateway is back and lists it,
    so the replay's window from the join holds none of its requests."""
    before: dict[str, int] = {}
    for r in records:
        if r["arrival_s"] < join_s:
            g = r.get("group") or r["user"]
            before[g] = before.get(g, 0) + 1
    mine = [r for r in records if r.get("pod_new_since_s") == join_s and r.get("error") is None]
    if not mine:
        return []
    start = min(r["arrival_s"] for r in mine)
    seen, out = set(), []
    for r in sorted(mine, key=lambda r: r["request"]):
        g = r.get("group") or r["user"]
        if r["arrival_s"] >= start + window_s or g in seen:
            continue
        seen.add(g)
        if before.get(g, 0) >= hot_requests:
            out.append(r)
    return out


def share(records: list[dict]) -> Optional[float]:
    p = sum(r["prompt_tokens"] for r in records)
    return sum(r["cached_tokens"] for r in records) / p if p else None


def p50(values: list[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def at(samples: list[dict], t: float) -> dict:
    """The last sample at or before real time `t` (the first sample if none)."""
    best = samples[0] if samples else {"filter": {}, "gateway": {}}
    for s in samples:
        if s["t"] <= t:
            best = s
    return best


def delta(samples: list[dict], key: str, t0: float, t1: float) -> float:
    return at(samples, t1)["filter"].get(key, 0) - at(samples, t0)["filter"].get(key, 0)


def run_figures(workdir: Path, spec: OutageSpec, scale: float, join_s: Optional[float]) -> dict:
    """One run's figures over the outage window (the same trace window in a run without it)."""
    records = read_jsonl(workdir / "outcomes.jsonl")
    samples = read_jsonl(workdir / "timeline.jsonl")
    watch = json.loads((workdir / "outage.json").read_text())
    marks = watch["marks"]
    outage = "gateway killed" in marks
    kill_t = marks["gateway killed"]["t"] if outage else spec.start_s / scale
    restart_t = marks["gateway restarted"]["t"] if outage else kill_t + spec.down_s
    end_t = samples[-1]["t"] if samples else restart_t
    window = [r for r in records if spec.start_s <= r["arrival_s"] < spec.restart_trace_s(scale)]
    joiner = [r for r in records if join_s is not None and r.get("pod_new_since_s") == join_s]
    first_hot = [r for r in joiner if r["first_hot_at_join"] and r.get("error") is None]
    first_hot_served = first_hot_from_first_served(records, join_s) if join_s is not None else []
    out: dict = {
        "requests": len(records),
        "failed": sum(r.get("error") is not None for r in records),
        "failed_in_outage_window": sum(r.get("error") is not None for r in window),
        "errors": sorted({r["error"] for r in records if r.get("error")})[:5],
        "share_in_outage_window": share([r for r in window if r.get("error") is None]),
        "share_all": share([r for r in records if r.get("error") is None]),
        "joiner_first_request_s": min((r["arrival_s"] for r in joiner), default=None),
        "joiner_requests_in_outage_window": sum(spec.start_s <= r["arrival_s"] < spec.restart_trace_s(scale)
                                                and r.get("error") is None for r in joiner),
        "joiner_first_hot": len(first_hot),
        "joiner_first_hot_share": share(first_hot),
        "joiner_first_hot_ttft_p50_ms": p50([r["ttft_ms"] for r in first_hot]),
        "joiner_first_hot_served": len(first_hot_served),
        "joiner_first_hot_served_share": share(first_hot_served),
        "joiner_first_hot_served_ttft_p50_ms": p50([r["ttft_ms"] for r in first_hot_served]),
        "minute_shares": minute_shares(records),
        "direct": {k: delta(samples, k, kill_t, end_t) for k in DIRECT},
        "lost": {k: delta(samples, k, kill_t, end_t) for k in LOST},
        "routing": {k: delta(samples, k, kill_t, restart_t) for k in ROUTING},
        "routing_after_restart": {k: delta(samples, k, restart_t, restart_t + AFTER_RESTART_S) for k in ROUTING},
        "pool_at_kill": (watch.get("pool_at_kill") or {}).get("total"),
        "pool_at_end": ((watch.get("end") or {}).get("pool") or {}).get("total"),
        "max_table_age_s": max((s["filter"].get("table_age_seconds", 0) for s in samples
                                if kill_t <= s["t"] <= end_t), default=None),
        "takeover_samples": [(s["t"], s["filter"].get("direct_active")) for s in samples],
        "marks": marks,
        "errors_of_the_watch": watch.get("errors", []),
        "before": watch.get("before"),
        "after": watch.get("after"),
    }
    if join_s is not None:
        joins = [k for k in marks if k.endswith(" joins")]
        pod = joins[0].removesuffix(" joins") if joins else None
        listed = next((s["t"] for s in samples if pod and s["t"] >= marks[joins[0]]["t"]
                       and pod in s["gateway"].get("pods", [])), None)
        out["joiner"] = pod
        out["joiner_routable_after_join_s"] = (listed - marks[joins[0]]["t"]) if listed is not None else None
        w = ((watch.get("end") or {}).get("warmups") or {}).get(pod) or {}
        out["joiner_first_tier"] = w.get("first_tier_warmed", [])
        out["rewarmed"] = {p: (v.get("first_tier") or {}).get("done") for p, v in
                           ((watch.get("end") or {}).get("warmups") or {}).items() if p != pod}
    return out


def steady_state(out_minutes: dict, base_minutes: list[dict], kill_m: int, restart_m: int) -> tuple:
    """The first whole trace minute from the restart on from which every later minute of the run
    with the outage is within the runs without it at that minute, widened by the noise: the
    largest gap between any two runs (with and without the outage: they are the same experiment)
    in any whole minute before the kill, the first minute left out (cold pods). Returns (the
    minute, the noise)."""
    runs = [out_minutes] + base_minutes
    gaps = [max(r[m] for r in runs) - min(r[m] for r in runs)
            for m in range(1, kill_m) if all(m in r for r in runs)]
    noise = max(gaps, default=0.0)
    last = max(out_minutes)
    steady = None
    for m in range(last - 1, restart_m - 1, -1):  # the last minute may be partial: left out
        lo = min(b.get(m, 1.0) for b in base_minutes) - noise
        hi = max(b.get(m, 0.0) for b in base_minutes) + noise
        if not lo <= out_minutes.get(m, -1.0) <= hi:
            break
        steady = m
    return steady, noise


def summarize(out_dirs: list[Path], base_dirs: list[Path], spec: OutageSpec, scale: float,
              join_s: Optional[float]) -> dict:
    """Prints the outage's figures (runs with it against runs without) and returns them."""
    outs = [run_figures(d, spec, scale, join_s) for d in out_dirs]
    bases = [run_figures(d, spec, scale, join_s) for d in base_dirs]
    kill_m = int(spec.start_s // 60)
    restart_m = int(-(-spec.restart_trace_s(scale) // 60))  # the first whole minute after the restart
    for o in outs:
        minutes = {int(k): v for k, v in o["minute_shares"].items()}
        m, noise = steady_state(minutes, [{int(k): v for k, v in b["minute_shares"].items()} for b in bases],
                                kill_m, restart_m)
        o["steady_from_minute"] = m
        o["steady_noise"] = noise
        restart_trace = spec.restart_trace_s(scale)
        o["steady_after_restart_trace_s"] = (m * 60 - restart_trace) if m is not None else None

    def fmt(v, unit="", digits=1):
        if v is None:
            return "n/a"
        if unit == "%":
            return f"{v * 100:.{digits}f} %"
        return f"{v:.{digits}f}{unit}"

    def row(label, key, unit="", digits=1, src=None):
        get = src or (lambda f: f.get(key))
        print(f"  {label:<66} without: {' / '.join(fmt(get(b), unit, digits) for b in bases):<28} "
              f"with: {' / '.join(fmt(get(o), unit, digits) for o in outs)}")

    print(f"\ngateway outage ({spec.describe(scale)}); runs without / with the outage, one figure a run:")
    row("requests failed", "failed", digits=0)
    row("  of them arriving during the outage", "failed_in_outage_window", digits=0)
    row("cached share, requests arriving during the outage", "share_in_outage_window", "%")
    row("cached share, all requests", "share_all", "%")
    row("joining pod: first request served (trace s)", "joiner_first_request_s", "s", 0)
    row("joining pod: requests served during the outage window", "joiner_requests_in_outage_window", digits=0)
    row("joining pod: join to listed in the gateway's table (real s)", "joiner_routable_after_join_s", " s")
    row("joining pod: first requests of prefixes hot at the join (report's)", "joiner_first_hot", digits=0)
    row("  their cached share", "joiner_first_hot_share", "%")
    row("  their TTFT p50 (model time)", "joiner_first_hot_ttft_p50_ms", " ms", 0)
    row("  the same, 5 min from its first request served", "joiner_first_hot_served", digits=0)
    row("    their cached share", "joiner_first_hot_served_share", "%")
    row("    their TTFT p50 (model time)", "joiner_first_hot_served_ttft_p50_ms", " ms", 0)
    row("joining pod: first-tier prefixes prefilled", None, digits=0, src=lambda f: len(f.get("joiner_first_tier", [])))
    for i, o in enumerate(outs):
        if i < len(bases):
            o["joiner_first_tier_shared_with_run_without"] = len(set(o.get("joiner_first_tier", []))
                                                                 & set(bases[i].get("joiner_first_tier", [])))
    row("  of them also in the run without's (same repeat)", "joiner_first_tier_shared_with_run_without", digits=0)
    row("initial pods: first-tier prefixes of their last warm-up", None, digits=0,
        src=lambda f: sum(v or 0 for v in f.get("rewarmed", {}).values()) if f.get("rewarmed") is not None else None)
    row("gateway's hot prefixes at the kill (same time without)", "pool_at_kill", digits=0)
    row("gateway's hot prefixes at the end", "pool_at_end", digits=0)
    row("max filter table age, from the kill (s)", "max_table_age_s", " s", 0)
    for k in DIRECT:
        row(f"filter direct calls, from the kill: {k}", None, digits=0, src=lambda f, k=k: f["direct"][k])
    for k in LOST:
        row(f"filter {k}, from the kill", None, digits=0, src=lambda f, k=k: f["lost"][k])
    for k in ROUTING:
        row(f"filter {k}, during the outage", None, digits=0, src=lambda f, k=k: f["routing"][k])
    for k in ROUTING[:3]:
        row(f"filter {k}, first {AFTER_RESTART_S:g} s after the restart", None, digits=0,
            src=lambda f, k=k: f["routing_after_restart"][k])
    for i, o in enumerate(outs, 1):
        marks = o["marks"]
        kill, restart = marks["gateway killed"]["t"], marks.get("gateway restarted", {}).get("t")
        since = lambda k, t0: (f"{marks[k]['t'] - t0:.2f} s" if k in marks and t0 is not None else "never")  # noqa: E731
        first = marks.get("gateway first table", {})
        print(f"  run {i} with the outage (real seconds):\n"
              f"    takeover: the filter's direct_active = 1 {since('filter takes over', kill)} after the kill\n"
              f"    from the restart: listening {since('gateway listening', restart)}, /readyz 200 "
              f"{since('readyz 200', restart)}, the gateway first table (generation {first.get('generation')}, "
              f"pods {first.get('pods')}) {since('gateway first table', restart)}, "
              f"the filter adopts a table of it {since('filter adopts a table of the restarted gateway', restart)}, "
              f"the gateway table lists every pod {since('gateway table lists every pod', restart)}, "
              f"the filter adopts that {since('filter adopts a table listing every pod', restart)}, "
              f"hand-back (direct_active = 0) {since('filter hands the warm calls back', restart)}\n"
              f"    before the kill: {o['before'].get('prompts')} hot prefixes, table generation "
              f"{o['before'].get('generation')}; restored: {o['after'].get('restored')}; at the end: "
              f"{o['after'].get('prompts')} hot prefixes\n"
              f"    gateway prefills (ok) by pod, before the kill: {o['before'].get('prefills_ok_by_pod')}; "
              f"after the restart: {o['after'].get('prefills_ok_by_pod')}\n"
              f"    steady state (every later minute's cached share within the runs without the outage "
              f"± {o['steady_noise'] * 100:.1f} points): from trace minute {o['steady_from_minute']} "
              f"({fmt(o['steady_after_restart_trace_s'], ' s', 0)} of trace after the restart)"
              + (f"\n    errors: {o['errors_of_the_watch']}" if o["errors_of_the_watch"] else ""))
    minutes = sorted({int(k) for f in outs + bases for k in f["minute_shares"]})
    print("  cached share by trace minute (without | with):")
    for m in minutes:
        if m < kill_m - 2:
            continue
        cells = lambda fs: " ".join(fmt(f["minute_shares"].get(m, f["minute_shares"].get(str(m))), "%")  # noqa: E731
                                    for f in fs)
        tag = " <- kill" if m == kill_m else (" <- restart" if m == restart_m - 1 else "")
        print(f"    {m:>3} ({m * 60:>5}s)  {cells(bases)} | {cells(outs)}{tag}")
    return {"with": outs, "without": bases}
