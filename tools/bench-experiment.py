"""bench-experiment: the A/B experiment "warm-up on vs off" on a scale-up, whole stack, measured.

Issue 20's headline test: through the real Envoy and filter, one stack (the gateway, 3 podsim
pods and a 4th joining mid-replay, exactly the demo's: tools/demo.py's trace slice, join time,
time scale, profile, KV blocks, LoRA slots and gateway/filter settings of its `prewarm` run; with
`--joins N`, N pods join at once — an autoscaler's scale-up by several pods), an experiment
`warm-vs-cold` posted before the replay:

- arm `warm` (first, the reference): `warmup: true`, prefix routing;
- arm `cold`: `warmup: false`, prefix routing — it withholds its prefill signals and routes to
  the joining pod as soon as it is up, before its warm-up;

0.5 / 0.5 by the filter's stable hash of each request's `user` (the trace's prefix group) and the
experiment's id (`--experiment-id`, default `warm-vs-cold`): the same id gives the same split
every run, another id another split (a re-randomisation of which groups each arm gets).
`prewarm-replay live` replays the demo's slice of the shared mooncake-synthetic trace through
Envoy (tools/demo.py's `live`, which also starts and announces the 4th pod at the join time).
While it runs, `GET /admin/experiments/{id}` is polled every `--poll-s` seconds; for each of
the report's new-pod comparisons (all their requests; their first requests of hot prefixes —
each raw and adjusted for prompt length) the first poll at which both tests (Welch,
Mann-Whitney) are at p < 0.01 is recorded with the cohort's requests then. At the end it prints one table (per arm,
overall and on the new pods: requests, time to first byte p50/p95 as the filter measured it
(real time), cached-token ratio, the p-values, which arm is faster, "significant after N
requests") and a breakdown of the replay's own records (model time) by arm and cohort, each
cohort tested by the report's rule (`prewarm-gateway compare`), and writes
`report.json` under `--out` (out/bench-experiment/).

The per-request breakdown needs each record's arm: the filter's assignment is core's
`Experiment::arm_of`, which `prewarm-gateway arm` prints for each record's user; the split is
cross-checked against the gateway's per-arm counts. An Envoy access log
(`access.log`, one JSON line a request: arm header, upstream, start) is written as well.

Everything is on loopback and stopped by process id (harness.stack); the whole run is bounded
by `--max-minutes` (SIGALRM), each loop by a deadline.
"""
from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "tests"))

import demo  # noqa: E402  (tools/demo.py: the slice, the stack's settings, the replay)
from demo import (PROFILE, fleet_observations,  # noqa: E402
                  log, new_pod_ids, replayer)
from harness import wait_until  # noqa: E402
from harness.gateway import arms_of, compare  # noqa: E402
from harness.envoy import _http_manager  # noqa: E402
from harness.stack import Stack, StackSpec, pod_metric  # noqa: E402

ARMS = ("warm", "cold")


def experiment(experiment_id: str) -> dict:
    """The experiment posted: warm-up on vs off, 0.5 / 0.5. The filter's hash of a unit mixes in
    the id, so another id is another split of the same units (a re-randomisation)."""
    return {"id": experiment_id, "arms": [
        {"name": "warm", "weight": 0.5, "settings": {"warmup": True, "routing": "prefix"}},
        {"name": "cold", "weight": 0.5, "settings": {"warmup": False, "routing": "prefix"}},
    ]}

FILTER_METRICS = ["prewarm_filter_experiment_assigned_total", "prewarm_filter_experiment_no_unit_total",
                  "prewarm_filter_experiment_signals_withheld_total", "prewarm_filter_outcomes_enqueued_total",
                  "prewarm_filter_outcomes_sent_total", "prewarm_filter_outcomes_dropped_total", "prewarm_filter_signals_sent_total",
                  "prewarm_filter_signals_dropped_total"]


TRACE = REPO.parent / "shared" / "traces" / "mooncake-synthetic" / "synthetic_trace.jsonl"
SERVEGEN = REPO.parent / "shared" / "traces" / "servegen-m-small"


def trace_args(args) -> list:
    """The trace slice this bench replays (completions of the mooncake-synthetic trace, ServeGen
    adapters), as issue 20 measured it."""
    return ["--trace", TRACE, "--adapters", f"servegen:{SERVEGEN}", "--until-s", f"{args.until_s:g}"]


def joining(args) -> str:
    """The pods that join, for log lines: "pod-3 joins", "pod-3, pod-4 join"."""
    ids = new_pod_ids(args.joins)
    return ", ".join(ids) + (" joins" if len(ids) == 1 else " join")


def demo_defaults() -> argparse.Namespace:
    """tools/demo.py's defaults (its parser, without this script's arguments)."""
    saved = sys.argv
    sys.argv = [saved[0]]
    try:
        return demo.parse_args()
    finally:
        sys.argv = saved


def parse_args() -> argparse.Namespace:
    d = demo_defaults()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--until-s", type=float, default=900, help="trace slice: requests before this trace second")
    p.add_argument("--join-s", type=float, default=600, help="trace second at which the 4th pod joins")
    p.add_argument("--joins", type=int, default=1, choices=range(1, 9), metavar="{1..8}",
                   help="pods that join at --join-s (pod-3, pod-4, ...): a scale-up by several pods at once")
    p.add_argument("--time-scale", type=float, default=6, help="trace (and podsim model) seconds per real second")
    p.add_argument("--kv-blocks", type=int, default=d.kv_blocks, help="podsim KV blocks (16 tokens) per pod")
    p.add_argument("--max-loras", type=int, default=d.max_loras)
    p.add_argument("--max-cpu-loras", type=int, default=d.max_cpu_loras)
    p.add_argument("--experiment-id", default="warm-vs-cold",
                   help="the experiment's id; the arms' split of the trace's users depends on it")
    p.add_argument("--poll-s", type=float, default=2.0, help="seconds between polls of the experiment's report")
    p.add_argument("--max-minutes", type=float, default=15.0, help="the whole run is stopped after this")
    p.add_argument("--out", type=Path, default=REPO / "out" / "bench-experiment")
    return p.parse_args()


# --- the run ----------------------------------------------------------------------------------

def spec(args, assignment: dict, access_log: Path) -> StackSpec:
    """The stack of the demo's `prewarm` run (tools/demo.py `stack_spec`), plus an access log."""

    def mutate(config: dict) -> None:
        _http_manager(config).setdefault("access_log", []).append({
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": str(access_log),
                "log_format": {"json_format": {
                    "start_ms": "%START_TIME(%s%3f)%", "path": "%REQ(:PATH)%", "arm": "%REQ(x-prewarm-arm)%",
                    "upstream": "%UPSTREAM_HOST%", "status": "%RESPONSE_CODE%",
                    "first_byte_ms": "%RESPONSE_DURATION%", "duration_ms": "%DURATION%"}}}})

    spec = demo.stack_spec(args, "prewarm", assignment, args.joins)
    spec.envoy_mutate = mutate
    return spec


def p_of(c: Optional[dict], test: str) -> Optional[float]:
    t = (c or {}).get(test)
    return t["p"] if t else None


# The report's cohorts on the new pods (all their requests; their first requests of hot
# prefixes) and the two readings of each comparison (raw; adjusted for prompt length).
COHORTS_NEW = (("new_pods", "new pods"), ("first_requests", "new pods' first requests of hot prefixes"))
READINGS = (("raw", ""), ("adjusted", " adjusted for prompt length"))


def cohort_of(new: dict, cohort: str) -> dict:
    """The report's `new_pods` or its `first_requests` part."""
    return new if cohort == "new_pods" else new.get("first_requests") or {"arms": [], "comparisons": []}


def comparison_of(new: dict, cohort: str, reading: str) -> Optional[dict]:
    """The cold-vs-warm comparison of a new-pod cohort, raw or adjusted for prompt length."""
    comps = cohort_of(new, cohort)["comparisons"]
    c = comps[0] if comps else None
    return c if reading == "raw" else (c or {}).get("prompt_adjusted")


class Poller(threading.Thread):
    """Polls the experiment's report (and the new pod's warm-up) every `every_s` seconds until
    stopped or `deadline` (monotonic); keeps every poll and, for each comparison of the new
    pods' cohorts, raw and adjusted for prompt length (`new_pods/raw` ...), the first at which
    it is significant (both tests p < 0.01), in either direction and with the warm arm
    faster."""

    def __init__(self, stack: Stack, experiment_id: str, every_s: float, deadline: float):
        super().__init__(daemon=True)
        self.stack, self.experiment_id, self.every_s, self.deadline = stack, experiment_id, every_s, deadline
        self.stop_event = threading.Event()
        self.started = time.monotonic()
        self.polls: list[dict] = []
        self.first_significant: dict[str, dict] = {}
        self.first_warm_better: dict[str, dict] = {}
        self.last_counts: tuple = ()

    def run(self) -> None:
        while not self.stop_event.wait(self.every_s) and time.monotonic() < self.deadline:
            try:
                self.poll()
            except Exception as e:  # noqa: BLE001 - one failed poll is reported, not fatal
                log(f"poll: {e!r}")

    def poll(self) -> None:
        gw = self.stack.gateway
        detail = gw.get(f"/admin/experiments/{self.experiment_id}").json()
        report = detail["report"]
        first_new = new_pod_ids(1)[0]
        warmup = self.stack.warmup(first_new) if any(p.id == first_new for p in self.stack.pods) else None
        table = self.stack.routing()
        new = report["new_pods"]
        c = new["comparisons"][0] if new["comparisons"] else None
        entry = {
            "t_s": round(time.monotonic() - self.started, 1),
            "wall_ms": int(time.time() * 1000),
            "requests": {a["arm"]: a["requests"] for a in report["arms"]},
            "new_pod_requests": {a["arm"]: a["requests"] for a in new["arms"]},
            "new_pod_ttfb_p50_ms": {a["arm"]: a["ttfb_p50_ms"] for a in new["arms"]},
            "new_pod_cached": {a["arm"]: a["cached_token_ratio"] for a in new["arms"]},
            "new_pods": new["pods"],
            "new_pod_comparison": c,
            "first_requests": {a["arm"]: a["requests"] for a in cohort_of(new, "first_requests")["arms"]},
            "new_pods_report": new,
            "comparison": report["comparisons"][0] if report["comparisons"] else None,
            "routed": [p["id"] for p in table["pods"]],
            "table": [{k: p.get(k) for k in ("id", "adapters", "resident", "load")} for p in table["pods"]],
            "warming": [p["id"] for p in table.get("warming", [])],
            "warmup": None if warmup is None else {
                "phase": warmup["phase"], "routable": warmup["routable"],
                "first_tier": warmup["first_tier"], "started_ms": warmup.get("started_ms"),
                "first_tier_done_ms": warmup.get("first_tier_done_ms")},
        }
        self.polls.append(entry)
        w, m = p_of(c, "welch"), p_of(c, "mann_whitney")
        line = (f"experiment: requests warm {entry['requests'].get('warm', 0)} cold {entry['requests'].get('cold', 0)}"
                f" | new pods {new['pods'] or '-'}: warm {entry['new_pod_requests'].get('warm', 0)}"
                f" cold {entry['new_pod_requests'].get('cold', 0)}")
        if c:
            line += (f", cold-warm mean {fmt(c['ttfb_mean_diff_ms'], '{:+.0f} ms')}, welch p {fmt(w, '{:.2g}')}, "
                     f"mann-whitney p {fmt(m, '{:.2g}')}")
            a = c.get("prompt_adjusted")
            if a:
                line += (f"; adjusted for prompt length {a['ttfb_mean_diff_ms']:+.0f} ms, "
                         f"p {fmt(p_of(a, 'welch'), '{:.2g}')} / {fmt(p_of(a, 'mann_whitney'), '{:.2g}')}")
        fc = comparison_of(new, "first_requests", "raw")
        line += (f" | first requests of hot prefixes: warm {entry['first_requests'].get('warm', 0)}"
                 f" cold {entry['first_requests'].get('cold', 0)}")
        if fc:
            line += f", p {fmt(p_of(fc, 'welch'), '{:.2g}')} / {fmt(p_of(fc, 'mann_whitney'), '{:.2g}')}"
        if warmup:
            line += f" | {first_new} warm-up {warmup['phase']} (routable {warmup['routable']})"
        counts = (tuple(entry["new_pod_requests"].items()), bool(warmup and warmup["routable"]))
        if counts != self.last_counts or len(self.polls) % 5 == 0:
            log(line)
        self.last_counts = counts
        for cohort, label in COHORTS_NEW:
            for reading, how in READINGS:
                comp = comparison_of(new, cohort, reading)
                if not (comp and comp["significant"]):
                    continue
                key, warm_faster = f"{cohort}/{reading}", comp["ttfb_mean_diff_ms"] > 0
                if key not in self.first_significant:
                    self.first_significant[key] = entry
                    log(f"{label}{how}: significant at this poll ({'warm' if warm_faster else 'cold'} faster)")
                if warm_faster:
                    self.first_warm_better.setdefault(key, entry)


def fmt(v, spec: str = "{:.0f}", none: str = "-") -> str:
    return none if v is None else spec.format(v)


def pct(xs: list[float], q: float) -> Optional[float]:
    """The gateway's quantile: linear interpolation between the closest ranks."""
    if not xs:
        return None
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


COHORTS = (("all", "all"), ("old_pods_after_join", "old pods, after the join"),
           ("new_pod", "new pod"), ("new_pod_before_first_tier_done", "new pod, before its first tier"),
           ("new_pod_first_hot_at_join", "new pod, first of a prefix hot at join"),
           ("new_pod_first_of_group", "new pod, first of its group there"),
           ("new_pod_groups_seen_before_join", "new pod, groups seen before the join"))


def records_by_arm(records: list[dict], join_s: float, warm_done_trace_s: Optional[float]) -> tuple[dict, dict]:
    """The replay's own records (model time) by arm: all, on the new pod, and on the new pod
    before/after its first tier was done, and its first requests of prefixes hot at the join;
    and each cohort's (TTFT, prompt tokens) by arm (for `cohort_tests`)."""
    out: dict = {}
    samples: dict = {}
    seen_before_join = {r["user"] for r in records if r["arrival_s"] < join_s}
    for arm in ARMS:
        mine = [r for r in records if r["arm"] == arm and r.get("ttft_ms") is not None]
        new = [r for r in mine if r.get("pod_new_since_s") is not None]
        window = [r for r in new if r["arrival_s"] < join_s + 300]

        def summary(rs: list[dict]) -> dict:
            prompt = sum(r["prompt_tokens"] for r in rs)
            return {"requests": len(rs),
                    "ttft_p50_ms": pct([r["ttft_ms"] for r in rs], 0.5),
                    "ttft_p95_ms": pct([r["ttft_ms"] for r in rs], 0.95),
                    "ttft_mean_ms": statistics.fmean(r["ttft_ms"] for r in rs) if rs else None,
                    "cached_ratio": sum(r["cached_tokens"] for r in rs) / prompt if prompt else None,
                    "with_cached_tokens": sum(1 for r in rs if r["cached_tokens"] > 0),
                    "prompt_tokens_mean": prompt / len(rs) if rs else None,
                    "uncached_tokens_mean": (prompt - sum(r["cached_tokens"] for r in rs)) / len(rs) if rs else None,
                    "cached_tokens": sum(r["cached_tokens"] for r in rs),
                    "ttft_sd_ms": statistics.stdev(r["ttft_ms"] for r in rs) if len(rs) > 1 else None}

        before = [r for r in new if warm_done_trace_s is not None and r["arrival_s"] < warm_done_trace_s]
        firsts, groups = [], set()
        for r in sorted(new, key=lambda r: r["arrival_s"]):
            if (r["pod"], r["user"]) not in groups:
                groups.add((r["pod"], r["user"]))
                firsts.append(r)
        cohorts = {
            "all": mine,
            "old_pods_after_join": [r for r in mine if r.get("pod_new_since_s") is None and r["arrival_s"] >= join_s],
            "new_pod": new,
            "new_pod_first_5min": window,
            "new_pod_before_first_tier_done": before,
            "new_pod_first_hot_at_join": [r for r in new if r["first_hot_at_join"]],
            # a group's first request on the new pod: cached tokens there came from a warm-up
            # (or another group's shared blocks), not from the group's own earlier requests
            "new_pod_first_of_group": firsts,
            "new_pod_groups_seen_before_join": [r for r in new if r["user"] in seen_before_join],
        }
        out[arm] = {key: summary(rs) for key, rs in cohorts.items()}
        out[arm]["failed"] = sum(1 for r in records if r["arm"] == arm and r.get("error"))
        for key, rs in cohorts.items():
            samples.setdefault(key, {})[arm] = [(r["ttft_ms"], r["prompt_tokens"]) for r in rs]
    return out, samples


def cohort_tests(samples: dict) -> dict:
    """Each cohort's cold TTFTs against the warm arm's (the report's orientation: `mean_diff` > 0
    when warm is faster), by the report's own rule: `prewarm-gateway compare` (Welch's t and
    Mann-Whitney U, significant when both p < 0.01), raw and adjusted for prompt length."""
    def side(arm: str, key: str) -> tuple[list, list]:
        pairs = samples[key].get(arm, [])
        return [t for t, _ in pairs], [p for _, p in pairs]
    out = {}
    for key in samples:
        (cold, cold_prompts), (warm, warm_prompts) = side("cold", key), side("warm", key)
        out[key] = compare(cold, warm, cold_prompts, warm_prompts)
    return out


def access_log_by_arm(path: Path, experiment_id: str, new_pod_addresses: set[str],
                      first_tier_done_ms: Optional[int]) -> dict:
    """Envoy's access log: per arm, completions and those sent to the new pods (before their
    first tiers were done)."""
    out = {arm: {"completions": 0, "to_new_pod": 0, "to_new_pod_before_first_tier_done": 0} for arm in ARMS}
    out["none"] = dict(out["warm"])
    if not path.exists():
        return out
    with path.open() as f:
        for i, line in enumerate(f):
            if i >= 1_000_000:
                break
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("path") != "/v1/completions":
                continue
            arm = (e.get("arm") or "").removeprefix(experiment_id + "/") or "none"
            a = out.setdefault(arm, {"completions": 0, "to_new_pod": 0, "to_new_pod_before_first_tier_done": 0})
            a["completions"] += 1
            if e.get("upstream") in new_pod_addresses:
                a["to_new_pod"] += 1
                if first_tier_done_ms is not None and int(e["start_ms"]) < first_tier_done_ms:
                    a["to_new_pod_before_first_tier_done"] += 1
    return out


class RunTooLong(BaseException):
    """Raised by SIGALRM past `--max-minutes`; a BaseException, so that no `except Exception`
    (harness.wait_until's) takes it for a failed condition."""


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))

    def too_long(*_):
        raise RunTooLong(f"bench-experiment: over --max-minutes {args.max_minutes:g}")
    signal.signal(signal.SIGALRM, too_long)
    signal.alarm(int(args.max_minutes * 60))

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "stack", ignore_errors=True)  # what a previous run wrote there, nothing else
    for name in ("report.json", "outcomes.jsonl", "replay.json", "access.log"):
        (out / name).unlink(missing_ok=True)
    assignment = json.loads(subprocess_run(replayer("assignment", *trace_args(args))))
    log(f"trace: {assignment['requests']} requests (trace 0-{args.until_s:g}s), {assignment['users']} prefix groups, "
        f"{len(assignment['adapters'])} ServeGen adapters; {joining(args)} at trace {args.join_s:g}s; x{args.time_scale:g}")
    access_log = out / "access.log"
    eid = args.experiment_id
    definition = experiment(eid)
    stack = Stack(out / "stack", spec(args, assignment, access_log))
    poller = progress = None
    t0 = time.monotonic()
    try:
        log(f"starting 3 podsim pods ({PROFILE}, time scale {args.time_scale:g}, {args.kv_blocks} KV blocks each), "
            "the gateway and Envoy with the prewarm filter")
        stack.start()
        r = stack.gateway.admin("POST", "/admin/experiments", json=definition)
        if r.status_code != 201:
            raise RuntimeError(f"POST /admin/experiments: {r.status_code} {r.text}")
        stack.wait_envoy_routes(*[p.address for p in stack.pods])
        wait_until(lambda: (stack.envoy.metric("prewarm_filter_table_generation")
                            >= stack.routing()["generation"]) and "experiment" in stack.routing(),
                   30, what="Envoy adopts the table with the experiment")
        log(f"experiment {eid} posted (warm 0.5 / cold 0.5) and adopted by Envoy; started_ms {r.json()['started_ms']}")

        join_wall_ms: dict = {}
        join_spare = stack.join_spare

        def timed_join(index: int = 0):
            join_wall_ms.setdefault("at", int(time.time() * 1000))
            return join_spare(index)
        stack.join_spare = timed_join  # demo.live calls it at the join time

        deadline = t0 + args.max_minutes * 60
        poller = Poller(stack, eid, args.poll_s, deadline)
        poller.start()
        new_pods = new_pod_ids(args.joins)
        progress = demo.Progress(stack, new_pods)
        progress.start()
        demo.live(args, stack, out, trace_args(args), [(args.join_s, i) for i in range(args.joins)],
                  api="completions")
        replay = json.loads((out / "replay.json").read_text())
        served = sum(1 for line in (out / "outcomes.jsonl").read_text().splitlines() if json.loads(line).get("error") is None)
        # the filter sends its outcome records with its signals, each tick: wait for the last ones
        try:
            wait_until(lambda: sum(a["requests"] for a in stack.gateway.get(f"/admin/experiments/{eid}")
                                   .json()["report"]["arms"]) >= served, 30, interval=0.5,
                       what="every served request's outcome at the gateway")
        except TimeoutError as e:
            log(f"not every outcome reached the gateway: {e}")
        poller.stop_event.set()
        poller.join(timeout=30)
        poller.poll()  # the final report
        final = stack.gateway.get(f"/admin/experiments/{eid}").json()
        warmup_replies = {p: stack.gateway.get(f"/admin/pods/{p}/warmup").json() for p in new_pods}
        warmups = {p: r.get("warmup") for p, r in warmup_replies.items()}
        fleet = fleet_observations(stack, new_pods)
        fleet["filter"] = {m: stack.envoy.metric(m) for m in FILTER_METRICS}
        fleet["pods_requests"] = {p.id: pod_metric(p, "vllm:request_success_total") for p in stack.pods}
        new_pod_addresses = {stack.pod(p).address for p in new_pods}
    finally:
        signal.alarm(0)
        if poller:
            poller.stop_event.set()
        if progress:
            progress.stop_event.set()
        stack.stop()

    records = [json.loads(line) for line in (out / "outcomes.jsonl").read_text().splitlines()]
    arm_by_user = arms_of(definition, [r["user"] for r in records])
    for r in records:
        r["arm"] = arm_by_user.get(r["user"])
    # the first tiers were all done when the last was (None while one was not)
    dones = [(w or {}).get("first_tier_done_ms") for w in warmups.values()]
    first_tier_done_ms = max(dones) if dones and None not in dones else None
    join_ms = join_wall_ms.get("at")
    # trace second at which the first tier was done: the join's trace second plus the real
    # seconds since the join, times the time scale
    warm_done_trace_s = (args.join_s + (first_tier_done_ms - join_ms) / 1000 * args.time_scale
                         if first_tier_done_ms and join_ms else None)
    by_arm, samples = records_by_arm(records, args.join_s, warm_done_trace_s)
    access = access_log_by_arm(access_log, eid, new_pod_addresses, first_tier_done_ms)
    power = None
    sds = {arm: by_arm[arm]["new_pod"]["ttft_sd_ms"] for arm in ARMS}
    means = {arm: by_arm[arm]["new_pod"]["ttft_mean_ms"] for arm in ARMS}
    if all(v is not None for v in (*sds.values(), *means.values())) and means["cold"] != means["warm"]:
        diff = (means["cold"] - means["warm"]) / args.time_scale
        sd = {arm: sds[arm] / args.time_scale for arm in ARMS}
        # n per arm = (z_{0.995} + z_{0.8})^2 (s1^2 + s2^2) / diff^2
        power = {"mean_diff_real_ms": diff, "sd_real_ms": sd,
                 "requests_per_arm": round((2.5758 + 0.8416) ** 2 * (sd["warm"] ** 2 + sd["cold"] ** 2) / diff ** 2)}
    result = {
        "experiment": definition,
        "run": {"trace": str(demo.TRACE), "until_s": args.until_s, "join_s": args.join_s, "joins": args.joins,
                "time_scale": args.time_scale, "kv_blocks": args.kv_blocks, "profile": PROFILE,
                "requests": assignment["requests"], "wall_s": round(time.monotonic() - t0, 1),
                "join_wall_ms": join_ms, "new_pod_first_tier_done_trace_s": warm_done_trace_s},
        "final": final,
        "first_significant_new_pods": poller.first_significant,
        "first_warm_better_new_pods": poller.first_warm_better,
        "polls": poller.polls,
        "replay": replay,
        "records_by_arm": records_by_arm_check(by_arm, final),
        "records_cohort_tests": cohort_tests(samples),
        "access_log_by_arm": access,
        "power": power,
        "new_pod_warmup": warmups,
        "new_pod_first_tier_warmed": {p: r.get("first_tier_warmed") for p, r in warmup_replies.items()},
        "fleet": fleet,
    }
    (out / "report.json").write_text(json.dumps(result, indent=1))
    print_table(result, args)
    print(f"\nJSON: {out / 'report.json'}; per request: {out / 'outcomes.jsonl'}, {access_log}")
    return 0


def records_by_arm_check(by_arm: dict, final: dict) -> dict:
    """Adds the gateway's per-arm counts next to the records' (the arm_of cross-check)."""
    gateway = {a["arm"]: a["requests"] for a in final["report"]["arms"]}
    gateway_new = {a["arm"]: a["requests"] for a in final["report"]["new_pods"]["arms"]}
    for arm in ARMS:
        by_arm[arm]["gateway_requests"] = gateway.get(arm)
        by_arm[arm]["gateway_new_pod_requests"] = gateway_new.get(arm)
    return by_arm


def subprocess_run(argv: list[str]) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120).stdout


def print_table(result: dict, args) -> None:
    rep = result["final"]["report"]
    arms = {a["arm"]: a for a in rep["arms"]}
    new = {a["arm"]: a for a in rep["new_pods"]["arms"]}
    c = rep["comparisons"][0] if rep["comparisons"] else None
    w = result["run"]
    print()
    print(f"bench-experiment: {w['requests']} mooncake-synthetic requests (trace 0-{w['until_s']:g}s) at x{w['time_scale']:g}, "
          f"3 pods + {joining(args)} at {w['join_s']:g}s, experiment {result['experiment']['id']} (warm 0.5 / cold 0.5); "
          f"{w['wall_s']:.0f} s")
    print("From the gateway's report (the filter's outcome records: time to first byte at the proxy, real time):")
    rows = [("requests", lambda a: fmt(a.get("requests"), "{:,}")),
            ("TTFB p50", lambda a: fmt(a.get("ttfb_p50_ms"), "{:,.0f} ms")),
            ("TTFB p95", lambda a: fmt(a.get("ttfb_p95_ms"), "{:,.0f} ms")),
            ("TTFB mean", lambda a: fmt(a.get("ttfb_mean_ms"), "{:,.0f} ms")),
            ("cached-token ratio", lambda a: fmt(a.get("cached_token_ratio"), "{:.1%}"))]
    print(f"{'':28}{'warm':>12}{'cold':>12}")
    for scope, table in (("overall", arms), ("new pods", new)):
        for name, f in rows:
            print(f"{scope + ' ' + name:28}" + "".join(f"{f(table.get(arm, {})):>12}" for arm in ARMS))

    def verdict(comp: Optional[dict]) -> str:
        if not comp:
            return "no comparison (too few outcomes)"
        d = comp["ttfb_mean_diff_ms"]
        faster = "none" if d is None else ("warm" if d > 0 else "cold")
        return (f"welch p {fmt(p_of(comp, 'welch'), '{:.3g}')}, mann-whitney p {fmt(p_of(comp, 'mann_whitney'), '{:.3g}')}, "
                f"cold - warm mean {fmt(d, '{:+,.0f} ms')} ({faster} faster), "
                + ("SIGNIFICANT (both p < 0.01)" if comp["significant"] else "not significant")
                + f"; requests an arm needs for p < 0.01 at 80 % power: {fmt(comp.get('requests_needed'), '{:,}')}")
    print(f"overall:  {verdict(c)}")
    print(f"new pods: {', '.join(rep['new_pods']['pods']) or 'none'}")
    for cohort, label in COHORTS_NEW:
        n = {a["arm"]: a["requests"] for a in cohort_of(rep["new_pods"], cohort)["arms"]}
        print(f"{label} (warm {n.get('warm', 0)}, cold {n.get('cold', 0)} requests):")
        for reading, how in READINGS:
            comp = comparison_of(rep["new_pods"], cohort, reading)
            slope = f" ({comp['ms_per_1k_prompt_tokens']:.1f} ms a 1,000 prompt tokens)" if reading == "adjusted" and comp else ""
            print(f"  {reading}{slope}: {verdict(comp)}")
            key = f"{cohort}/{reading}"
            first = result["first_significant_new_pods"].get(key)
            if not first:
                print("    not significant at any poll (both tests p < 0.01 never held)")
                continue
            def requests(poll: dict) -> int:
                return sum(a["requests"] for a in cohort_of(poll["new_pods_report"], cohort)["arms"])
            d = comparison_of(first["new_pods_report"], cohort, reading)["ttfb_mean_diff_ms"]
            print(f"    first significant at poll t={first['t_s']:.0f} s: after {requests(first)} requests "
                  f"of the cohort, {'warm' if d > 0 else 'cold'} faster")
            wb = result["first_warm_better_new_pods"].get(key)
            if wb is not first:
                print("    warm arm better at p < 0.01: " + (
                    f"after {requests(wb)} requests of the cohort" if wb else "never"))
    join = w["join_wall_ms"]
    for pod, ws in result["new_pod_warmup"].items():
        if not ws:
            print(f"{pod} warm-up: none reported")
            continue
        done = ws.get("first_tier_done_ms")
        print(f"{pod} warm-up: adapters {ws['adapters']['done']}/{ws['adapters']['total']}, first tier "
              f"{ws['first_tier']['done']}/{ws['first_tier']['total']}, second tier "
              f"{ws['second_tier']['done']}/{ws['second_tier']['total']}; first tier done "
              + (f"{(done - join) / 1000:.1f} s after the join (≈ trace "
                 f"{w['join_s'] + (done - join) / 1000 * w['time_scale']:.0f} s)" if done and join else "never"))
    acc = result["access_log_by_arm"]
    print("Envoy's access log, completions to the new pods (before their first tiers were done): "
          + ", ".join(f"{arm} {acc[arm]['to_new_pod']} ({acc[arm]['to_new_pod_before_first_tier_done']})" for arm in ARMS))
    ra = result["records_by_arm"]
    print("\nThe replay's records by arm (model time TTFT, the filter's arm_of on each record's user):")
    tests = result["records_cohort_tests"]
    print(f"{'':42}{'warm':>30}{'cold':>30}   welch p / M-W p (raw; adjusted for prompt length)")
    for key, label in COHORTS:
        def cell(s: dict) -> str:
            return (f"{s['requests']} | {fmt(s['ttft_p50_ms'], '{:,.0f}')}/{fmt(s['ttft_p95_ms'], '{:,.0f}')} ms"
                    f" | {fmt(s['cached_ratio'], '{:.0%}')}")
        t = tests.get(key, {})
        a = t.get("prompt_adjusted") or {}
        verdict = (f"   {fmt(p_of(t, 'welch'), '{:.2g}')} / {fmt(p_of(t, 'mann_whitney'), '{:.2g}')}"
                   + (" SIGNIFICANT" if t.get("significant") else "")
                   + f"; adjusted {fmt(p_of(a, 'welch'), '{:.2g}')} / {fmt(p_of(a, 'mann_whitney'), '{:.2g}')}"
                   + (" SIGNIFICANT" if a.get("significant") else ""))
        print(f"{label:42}" + "".join(f"{cell(ra[arm][key]):>30}" for arm in ARMS) + verdict)
    print("  (requests | TTFT p50/p95 | cached-token ratio; the tests: the report's rule on the cohort's cold vs warm TTFTs,"
          " `prewarm-gateway compare`, raw and adjusted for prompt length)")
    print("new pod: requests with cached tokens, of its groups' first requests there: "
          + ", ".join(f"{arm} {ra[arm]['new_pod_first_of_group']['with_cached_tokens']} of "
                      f"{ra[arm]['new_pod_first_of_group']['requests']}" for arm in ARMS)
          + "; mean uncached prompt tokens a new-pod request: "
          + ", ".join(f"{arm} {fmt(ra[arm]['new_pod']['uncached_tokens_mean'], '{:,.0f}')}" for arm in ARMS))
    firsts = {arm: ra[arm]["new_pod_first_of_group"]["cached_tokens"] for arm in ARMS}
    print("tokens cached at its groups' first requests on the new pod (what only a warm-up prefill, or blocks "
          "shared with another group, can have put there), a new-pod request on average: "
          + ", ".join(f"{arm} {firsts[arm] / max(1, ra[arm]['new_pod']['requests']):,.0f} "
                      f"({0.25 * firsts[arm] / max(1, ra[arm]['new_pod']['requests']) / result['run']['time_scale']:,.0f} ms real "
                      f"at the profile's 250 µs a token)" for arm in ARMS))
    power = result["power"]
    if power:
        print(f"power: new-pod TTFT mean difference {power['mean_diff_real_ms']:+,.0f} ms real, SDs "
              f"{power['sd_real_ms']['warm']:,.0f} / {power['sd_real_ms']['cold']:,.0f} ms: Welch's test at p < 0.01 with "
              f"80 % power needs ≈ {power['requests_per_arm']:,} new-pod requests an arm (normal approximation); "
              f"this run had {ra['warm']['new_pod']['requests']} / {ra['cold']['new_pod']['requests']}")
    print("arm_of check, records vs the gateway's counts: "
          + ", ".join(f"{arm} {ra[arm]['all']['requests']} vs {ra[arm]['gateway_requests']}, new pod "
                      f"{ra[arm]['new_pod']['requests']} vs {ra[arm]['gateway_new_pod_requests']}" for arm in ARMS))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted: everything started was stopped")
        sys.exit(130)
    except RunTooLong as e:
        log(f"{e}: everything started was stopped")
        sys.exit(124)
