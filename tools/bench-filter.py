"""bench-filter: the cost of the prewarm filter on the request path, measured.

Four Envoys on loopback: an upstream answering every request with a direct_response (a fast
pod), and three proxies built from the shipped envoy/envoy.yaml by tests/harness/envoy.py —
without the filter, with the filter, and with the filter loaded but inspecting nothing (the
floor any proxy-wasm filter costs) — all in front of that upstream (the filter's routing table, served
by a fake gateway, names it, so the filtered requests are inspected, observed and routed). wrk
POSTs chat bodies of 2, 16, 64 and 128 KB, each request a new prompt (a shared system prompt, then
a question with the request's own number) (`BENCH_SIZES_KB=2,16` picks fewer) through each; runs
alternate with/without so drift hits both.
Prints requests/s and p50/p99 latency for both and their ratio, the floor (loaded no-op minus no
filter) and the filter's own work (with minus the floor) separately, the own work's growth per KB
from the smallest body to the largest, and rewrites the filter
section of docs/benchmarks.md. `BENCH_BASELINE_WASM=/path/old.wasm` adds a fourth proxy running
that build with the same configuration, so before/after sit side by side in one run
(`BENCH_BASELINE_LABEL` names it in the table). The stage ladder: one more proxy per stage of
the request path (`bench_stop_after`: headers held while the body buffers, body copied into the
VM, parsed, fingerprinted, observed), loaded runs only, so the CPU each stage adds is the
difference between neighbouring rungs (`BENCH_LADDER=` empty skips it). Each wrk
run is short (RUN_SECONDS).
"""
from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from harness import envoy_path  # noqa: E402
from harness.envoy import Envoy, EnvoyFleet, build_config, wasm_plugin  # noqa: E402
from harness.fake_servers import FakeGateway  # noqa: E402

RUN_SECONDS = int(os.environ.get("BENCH_SECONDS", "5"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "16"))
BASELINE_WASM = os.environ.get("BENCH_BASELINE_WASM", "")
BASELINE_LABEL = os.environ.get("BENCH_BASELINE_LABEL", "baseline build")
LADDER = [s for s in os.environ.get("BENCH_LADDER", "headers,body,parse,fingerprint,observe").split(",") if s]
SIZES = [int(kb) * 1024 for kb in os.environ.get("BENCH_SIZES_KB", "2,16,64,128").split(",")]
DOC = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench-filter:begin -->", "<!-- bench-filter:end -->"

UPSTREAM_YAML = {
    "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
    "static_resources": {
        "listeners": [{
            "name": "upstream",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "upstream",
                    "route_config": {"virtual_hosts": [{
                        "name": "all", "domains": ["*"],
                        "routes": [{"match": {"prefix": "/"}, "direct_response": {
                            "status": 200,
                            "body": {"inline_string": '{"id":"cmpl-1","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}'},
                        }}],
                    }]},
                    "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
                },
            }]}],
        }],
    },
}


# Where each request's own number goes in the body (wrk's script writes it, fixed width).
COUNTER = "0000000000"


def chat_body(size: int) -> bytes:
    """A chat body of exactly `size` bytes: a system prompt of about half of it, the rest the
    user's message, which starts with `COUNTER` (each request sends its own number there, so
    every request is a new prompt behind a shared system prompt, as an application's are)."""
    system = " ".join(f"Guideline {i}: answer with care and cite sources." for i in range(size // 50))
    body = {"model": "base-model", "messages": [{"role": "system", "content": system[: size // 2]},
                                                {"role": "user", "content": ""}]}
    question = COUNTER + " "
    body["messages"][1]["content"] = question + "q" * (size - len(json.dumps(body)) - len(question))
    out = json.dumps(body).encode()
    assert len(out) == size and out.count(COUNTER.encode()) == 1
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(envoy, body_file: Path, lua: Path, connections: int = CONNECTIONS) -> dict:
    url = envoy.url
    cpu_before = cpu_seconds(envoy.process.proc.pid)
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{RUN_SECONDS}s", "--latency", "-s", str(lua),
         url + "/v1/chat/completions"],
        check=True, capture_output=True, text=True, timeout=RUN_SECONDS + 60,
        env={**os.environ, "BENCH_BODY": str(body_file)},
    ).stdout

    def latency_us(label: str) -> float:
        m = re.search(rf"^\s*{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if not m:
            raise RuntimeError(f"no {label} in wrk output:\n{out}")
        return float(m.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(2)]

    cpu = cpu_seconds(envoy.process.proc.pid) - cpu_before
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {"rps": rps, "p50": latency_us("50%"), "p99": latency_us("99%"),
            "cpu_us": cpu * 1e6 / max(requests, 1),
            "errors": int(non2xx.group(1)) if non2xx else 0}


LUA = """
local f = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
local body = f:read("*a")
f:close()
local at = assert(string.find(body, "%s", 1, true))
local head, tail = string.sub(body, 1, at - 1), string.sub(body, at + %d)
local n = 0
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.headers["x-prewarm-user"] = "bench-user"
request = function()
  n = n + 1
  return wrk.format(nil, nil, nil, head .. string.format("%%0%dd", n) .. tail)
end
""" % (COUNTER, len(COUNTER), len(COUNTER))


def best(runs: list[dict]) -> dict:
    """The median-throughput run of a side (robust to one disturbed run)."""
    runs = sorted(runs, key=lambda r: r["rps"])
    return runs[len(runs) // 2]


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="bench-filter-"))
    fleet = EnvoyFleet(work)
    gateway = FakeGateway().start()
    results = []
    try:
        upstream = fleet.start(name="upstream", config=UPSTREAM_YAML, concurrency=1, log_level="warn")
        pod = upstream.url.removeprefix("http://")
        gateway.table = {"version": "1.0", "generation": 1, "block_tokens": 64,
                         "pods": [{"id": "pod-0", "address": pod}]}
        common = dict(pods=[pod], gateway=gateway.address, concurrency=1, log_level="warn")
        with_filter = fleet.start(name="with-filter", **common)
        without = fleet.start(name="without-filter", with_filter=False, **common)
        # the floor: the filter loaded but inspecting nothing (no path is an inference path)
        floor = fleet.start(name="filter-floor", filter_config={"inference_paths": {"/none": "completions"}}, **common)
        sides = {"without": without, "floor": floor, "with": with_filter}
        rungs = {stage: fleet.start(name=f"stop-{stage}", filter_config={"bench_stop_after": stage}, **common)
                 for stage in LADDER}
        if BASELINE_WASM:
            def baseline_code(config):
                wasm_plugin(config)["vm_config"]["code"]["local"]["filename"] = BASELINE_WASM
            sides["baseline"] = fleet.start(name="with-baseline", mutate=baseline_code, **common)
            fleet.wait_table(sides["baseline"], 1)
        fleet.wait_table(with_filter, 1)
        lua = work / "post.lua"
        lua.write_text(LUA)
        for size in SIZES:
            body_file = work / f"body-{size}.json"
            body_file.write_bytes(chat_body(size))
            runs = {name: [] for name in sides}
            latency = {name: [] for name in sides}
            ladder = {stage: [] for stage in rungs}
            for _ in range(ROUNDS):
                for name, proxy in sides.items():
                    runs[name].append(wrk(proxy, body_file, lua))
                    latency[name].append(wrk(proxy, body_file, lua, connections=1))
                for stage, proxy in rungs.items():
                    ladder[stage].append(wrk(proxy, body_file, lua))
            # req/s and CPU from the loaded runs; p50/p99 from one connection (service time,
            # not queueing behind other connections)
            measured = {n: {**best(runs[n]), "p50": best(latency[n])["p50"], "p99": best(latency[n])["p99"]}
                        for n in sides}
            results.append({"size": size, **measured, "ladder": {st: best(r) for st, r in ladder.items()}})
            wo, fl = measured["without"], measured["floor"]
            for name, r in measured.items():
                print(f"{size // 1024:>3} KB  {name:<9} {r['rps']:9.0f} req/s  p50 {r['p50']:7.0f} us"
                      f"  p99 {r['p99']:7.0f} us  proxy CPU {r['cpu_us']:6.1f} us/req")
            print(f"{size // 1024:>3} KB  floor (loaded no-op - without): p50 {fl['p50'] - wo['p50']:+.0f} us"
                  f"  CPU {fl['cpu_us'] - wo['cpu_us']:+.1f} us/req")
            for name in [n for n in ("with", "baseline") if n in measured]:
                w = measured[name]
                print(f"{size // 1024:>3} KB  {name}: ratio {w['rps'] / wo['rps']:.3f}  own work (- floor):"
                      f" p50 {w['p50'] - fl['p50']:+.0f} us  CPU {w['cpu_us'] - fl['cpu_us']:+.1f} us/req"
                      f"  errors {w['errors']}")
        for line in growth_lines(results):
            print(line)
        for line in ladder_lines(results):
            print(line)
        calls = host_calls()
        print("host calls of a routed chat request (native count):")
        for line in calls:
            print("  " + line)
        inspected = with_filter.metric("prewarm_filter_requests_inspected_total")
        routed = with_filter.metric("prewarm_filter_routed_total")
        print(f"filter: {inspected} requests inspected, {routed} routed")
        assert inspected > 0 and routed > 0, "the filter did not see the benchmark's requests"
    finally:
        fleet.close()
        gateway.stop()
    write_doc(results, inspected, routed, calls)
    return 0


def host_calls() -> list[str]:
    """Host calls of a routed chat request by body size, counted on the filter's native host
    double (the scenario tests `host_call` and `new_prompts_host_calls`): the same code the wasm
    build runs, every host call it makes counted by kind; and what a new prompt costs with its
    share of the tick (its index keys and records are written there)."""
    out = subprocess.run(
        ["cargo", "test", "-q", "-p", "prewarm-filter", "--test", "scenarios", "host_calls", "--", "--nocapture",
         "--test-threads=1"],
        cwd=REPO, capture_output=True, text=True, check=True)
    out = (out.stdout + out.stderr).splitlines()
    if not any("host calls of a routed" in line for line in out):
        raise RuntimeError("the host_call scenario printed no counts")
    return ([line for line in out if " KB, " in line]
            + [line for line in out if " KB: request path" in line])


def own_cpu(r: dict, name: str) -> float:
    """The filter's own CPU µs a request at one body size: its proxy's minus the floor's."""
    return r[name]["cpu_us"] - r["floor"]["cpu_us"]


def growth_lines(results: list[dict]) -> list[str]:
    """The own work's growth per KB of body, from the smallest body measured to the largest
    (goal ≤ 0.5 µs a KB from 2 to 128 KB)."""
    if len(results) < 2:
        return []
    first, last = results[0], results[-1]
    kb = (last["size"] - first["size"]) / 1024
    return [f"own work growth {first['size'] // 1024} → {last['size'] // 1024} KB, {name}: "
            f"{(own_cpu(last, name) - own_cpu(first, name)) / kb:+.2f} µs CPU a KB"
            for name in ("with", "baseline") if name in first and name in last]


def ladder_lines(results: list[dict]) -> list[str]:
    """The stage ladder as a table: each rung's proxy CPU µs a request above the floor, and what
    the stage adds to the rung before it (the last rung: the whole path, `with`)."""
    if not LADDER:
        return []
    head = "| body | " + " | ".join(LADDER + ["route (whole path)"]) + " |"
    out = [head, "|---|" + "---|" * (len(LADDER) + 1)]
    for r in results:
        floor = r["floor"]["cpu_us"]
        cells, before = [], floor
        for cpu in [r["ladder"][st]["cpu_us"] for st in LADDER] + [r["with"]["cpu_us"]]:
            cells.append(f"{cpu - floor:+.0f} ({cpu - before:+.0f})")
            before = cpu
        out.append(f"| {r['size'] // 1024} KB | " + " | ".join(cells) + " |")
    return out


def write_doc(results: list[dict], inspected: int, routed: int, calls: list[str]):
    envoy_version = subprocess.run([str(envoy_path()), "--version"], capture_output=True, text=True).stdout.strip()
    lines = [
        BEGIN,
        "## Filter (`make bench-filter`)",
        "",
        f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on {os.cpu_count()} CPUs shared with",
        f"other work (load average {os.getloadavg()[0]:.1f} at the end); Envoy with one worker each, wrk 1 thread / "
        f"{CONNECTIONS} connections for req/s and CPU, 1 connection for p50/p99 (service time),",
        f"{RUN_SECONDS} s runs, median of {ROUNDS} alternating runs a side;",
        "upstream: a third Envoy answering with direct_response. CPU µs/req is the proxy process's user+system",
        "time over the run divided by its requests (less sensitive to other load than req/s and latency).",
        "Every request is a new prompt: half the body a system prompt all share, then a question with the",
        "request's own number (as an application's traffic; the runs before 2026-12-07 14:30 sent one body over",
        "and over). The filtered proxy inspects, fingerprints,",
        "observes (one user, so every request updates that user's pattern in shared data and tallies its adapter)",
        f"and routes every request ({inspected} inspected, {routed} routed in the run).",
        f"`{envoy_version.split(' ')[-1] if envoy_version else 'envoy'}`",
        "",
        "| body | proxy | req/s | p50 µs | p99 µs | CPU µs/req | throughput vs without | added p50 µs | added CPU µs/req | own work p50 µs (vs floor) | own work CPU µs/req (vs floor) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    labels = {"without": "without filter", "floor": "filter loaded, inspecting nothing (floor)",
              "with": "with filter", "baseline": f"with filter, {BASELINE_LABEL}"}
    for r in results:
        wo, fl = r["without"], r["floor"]
        for name, label in labels.items():
            if name not in r:
                continue
            x = r[name]
            own = (f"{x['p50'] - fl['p50']:+.0f} | {x['cpu_us'] - fl['cpu_us']:+.0f}"
                   if name in ("with", "baseline") else "– | –")
            lines.append(
                f"| {r['size'] // 1024} KB | {label} | {x['rps']:.0f} | {x['p50']:.0f} | {x['p99']:.0f} | {x['cpu_us']:.0f} | "
                f"{x['rps'] / wo['rps']:.3f} | {x['p50'] - wo['p50']:+.0f} | {x['cpu_us'] - wo['cpu_us']:+.0f} | {own} |"
            )
    lines += [""] + [f"- {line}" for line in growth_lines(results)]
    if LADDER:
        lines += ["", "Stage ladder: proxy CPU µs a request above the floor with the path cut after each stage",
                  "(`bench_stop_after`; loaded runs), and in brackets what that stage adds to the one before.",
                  "`headers`: the headers held while Envoy buffers the body; `body`: the body copied into the VM;",
                  "`parse`: parsed; `fingerprint`: canonical prompt, block chain, index keys; `observe`: sketch,",
                  "the user's pattern, tallies; the last column: routing, the index lookups and the served and",
                  "outcome records, i.e. the whole filter.", "", *ladder_lines(results)]
    lines += ["", "Host calls of a routed chat request (request, answer and end; counted by kind on the filter's",
              "native host double, `cargo test -p prewarm-filter --test scenarios host_calls -- --nocapture`;",
              "goal ≤ 16 shared-data and metric calls whatever the prompt length); then a new prompt's, 100 a tick,",
              "with its share of the tick, where its index keys and its served and outcome records are written:", "", "```", *calls, "```"]
    lines += [
        "",
        "\"Filter loaded, inspecting nothing\" is the floor any proxy-wasm filter pays here (a VM context per",
        "request, the header callback); \"own work\" is the filtered proxy minus that floor: what the",
        "filter's code costs (goal: ≤ 20 µs at p50 for 16 KB).",
        "",
        "Caveat: read the load average above. On a machine shared with builds, Envoy alone spends a",
        "few hundred µs of CPU per proxied request (several times what it needs on a quiet host) and runs",
        "seconds apart differ by tens of percent, so these figures bound the cost loosely; rerun",
        "`make bench-filter` on a quiet machine before quoting them.",
        "",
        "Goals: ratio ≥ 0.90, ≤ 30 µs added at p50. Published costs to compare: a V8 filter in Istio",
        "~81 µs and 17–20% throughput (istio#27636); an ext_proc callout ~3 ms (envoy#16905).",
        END,
    ]
    section = "\n".join(lines)
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)
    print(f"recorded in {DOC.relative_to(REPO)}")


if __name__ == "__main__":
    sys.exit(main())
