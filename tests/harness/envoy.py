"""Envoy for tests: the shipped `envoy/envoy.yaml`, rewritten programmatically, run as a real
process on loopback.

    from harness.envoy import Envoy
    with Envoy(tmp_path, pods=[pod.address], gateway=gw.address,
               filter_config={"tick_period_ms": 200}) as envoy:
        r = envoy.post("/v1/chat/completions", {...})
        envoy.metric("prewarm_filter_requests_seen_total")
        envoy.metric("prewarm_filter_unrouted_total", reason="no_table")
        assert envoy.wasm_failures() == {}

What is rewritten: the listener and admin ports become 0 (the real ones are discovered through
`--admin-address-path` and the admin `/listeners?format=json`), the pool's endpoints become
`pods`, the gateway cluster's endpoint becomes `gateway`, the `.wasm` path becomes
`filter_wasm_path()`, and the filter's JSON configuration is the shipped one updated with
`filter_config` (`replace_filter_config=True` uses `filter_config` alone). `with_filter=False`
removes the wasm filter (the baseline Envoy). The filter's tag extraction (`reason`, see
`REASON_TAG`) is added when the base config lacks it. `mutate(config_dict)` may change anything
else.
Each Envoy runs with `--use-dynamic-base-id`, so several can run at once.
"""
from __future__ import annotations

import copy
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Optional, Sequence

import yaml

from . import REPO, ManagedProcess, envoy_path, filter_wasm_path, wait_until

SHIPPED_CONFIG = REPO / "envoy" / "envoy.yaml"
POOL_CLUSTER = "inference-pool"
GATEWAY_CLUSTER = "prewarm-gateway"
WASM_FILTER = "envoy.filters.http.wasm"

# The filter's metrics write a reason into their name as Istio writes tags
# (`prewarm_filter_reason=.=no_table;.;unrouted_total`); this tag extraction, shipped in every
# config in envoy/, makes it the label of `prewarm_filter_unrouted_total{reason="no_table"}`.
REASON_TAG = {"tag_name": "reason", "regex": r"(reason=\.=(.*?);\.;)"}
FILTER_PREFIX = "prewarm_filter_"


def filter_stat(name: str, reason: Optional[str] = None) -> str:
    """A filter metric's proxy-wasm name from its Prometheus name and reason label:
    `filter_stat("prewarm_filter_unrouted_total", "no_table")` is
    `prewarm_filter_reason=.=no_table;.;unrouted_total`."""
    if reason is None:
        return name
    assert name.startswith(FILTER_PREFIX), name
    return f"{FILTER_PREFIX}reason=.={reason};.;{name[len(FILTER_PREFIX):]}"


# Envoy's wasm stats that mean a VM trapped, failed or was reloaded.
FAILURE_STAT = re.compile(r"^wasm\..*(fail|reload|crash|panic|trap)", re.IGNORECASE)


def load_shipped_config(path: Path = SHIPPED_CONFIG) -> dict:
    return yaml.safe_load(Path(path).read_text())


def _endpoint(address: str) -> dict:
    host, port = address.rsplit(":", 1)
    return {"endpoint": {"address": {"socket_address": {"address": host, "port_value": int(port)}}}}


def _http_manager(config: dict) -> dict:
    listener = config["static_resources"]["listeners"][0]
    return listener["filter_chains"][0]["filters"][0]["typed_config"]


def _cluster(config: dict, name: str) -> dict:
    for c in config["static_resources"]["clusters"]:
        if c["name"] == name:
            return c
    raise KeyError(name)


def wasm_plugin(config: dict) -> Optional[dict]:
    """The wasm filter's `config` (PluginConfig) in a config dict, if present."""
    for f in _http_manager(config)["http_filters"]:
        if f["name"] == WASM_FILTER:
            return f["typed_config"]["config"]
    return None


def build_config(
    pods: Sequence[str] = (),
    gateway: Optional[str] = None,
    filter_config: Optional[dict] = None,
    replace_filter_config: bool = False,
    with_filter: bool = True,
    mutate: Optional[Callable[[dict], None]] = None,
    base: Optional[dict] = None,
) -> dict:
    """The shipped configuration rewritten for a test (see the module docs)."""
    config = copy.deepcopy(base if base is not None else load_shipped_config())
    config["admin"]["address"]["socket_address"]["port_value"] = 0
    for listener in config["static_resources"]["listeners"]:
        listener["address"]["socket_address"]["port_value"] = 0
    if pods:
        _cluster(config, POOL_CLUSTER)["load_assignment"]["endpoints"] = [
            {"lb_endpoints": [_endpoint(p) for p in pods]}
        ]
    if gateway:
        _cluster(config, GATEWAY_CLUSTER)["load_assignment"]["endpoints"] = [
            {"lb_endpoints": [_endpoint(gateway)]}
        ]
    tags = config.setdefault("stats_config", {}).setdefault("stats_tags", [])
    if not any(t.get("tag_name") == REASON_TAG["tag_name"] for t in tags):
        tags.append(dict(REASON_TAG))
    manager = _http_manager(config)
    if not with_filter:
        manager["http_filters"] = [f for f in manager["http_filters"] if f["name"] != WASM_FILTER]
    else:
        plugin = wasm_plugin(config)
        assert plugin is not None, "the shipped config has no wasm filter"
        plugin["vm_config"]["code"]["local"]["filename"] = str(filter_wasm_path())
        shipped = json.loads(plugin["configuration"]["value"] or "{}")
        merged = dict(filter_config or {}) if replace_filter_config else {**shipped, **(filter_config or {})}
        plugin["configuration"]["value"] = json.dumps(merged)
    if mutate:
        mutate(config)
    return config


class Envoy:
    """One Envoy process (see the module docs). `start()` returns once the listener is bound
    and the server is LIVE; `expect_failure=True` starts it without waiting (for configs that
    must be refused): then use `wait_exit()` and `output()`."""

    def __init__(
        self,
        workdir: Path,
        pods: Sequence[str] = (),
        gateway: Optional[str] = None,
        filter_config: Optional[dict] = None,
        replace_filter_config: bool = False,
        with_filter: bool = True,
        mutate: Optional[Callable[[dict], None]] = None,
        concurrency: int = 2,
        log_level: str = "info",
        name: str = "envoy",
        config: Optional[dict] = None,
    ):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.config = config if config is not None else build_config(
            pods, gateway, filter_config, replace_filter_config, with_filter, mutate
        )
        self.concurrency = concurrency
        self.log_level = log_level
        self.process: Optional[ManagedProcess] = None
        self.admin_url = ""
        self.url = ""

    @property
    def config_path(self) -> Path:
        return self.workdir / f"{self.name}.yaml"

    def start(self, expect_failure: bool = False, timeout: float = 60.0) -> "Envoy":
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        admin_file = self.workdir / f"{self.name}.admin"
        admin_file.unlink(missing_ok=True)
        argv = [
            envoy_path(),
            "-c", self.config_path,
            "--admin-address-path", admin_file,
            "--use-dynamic-base-id",
            "--concurrency", str(self.concurrency),
            "--log-level", self.log_level,
            "--disable-hot-restart",
        ]
        self.process = ManagedProcess(argv, self.workdir / f"{self.name}.log", cwd=REPO)
        if expect_failure:
            return self
        admin = wait_until(
            lambda: self._alive() and admin_file.exists() and admin_file.read_text().strip(),
            timeout,
            what=f"{self.name} admin address",
        )
        self.admin_url = f"http://{admin}"
        wait_until(lambda: self._alive() and self.admin_get("/ready") == "LIVE\n", timeout, what=f"{self.name} LIVE")
        listeners = json.loads(self.admin_get("/listeners?format=json"))
        sock = listeners["listener_statuses"][0]["local_address"]["socket_address"]
        self.url = f"http://{sock['address']}:{sock['port_value']}"
        return self

    def _alive(self) -> bool:
        assert self.process is not None
        if not self.process.alive():
            raise RuntimeError(f"{self.name} exited: {self.process.output()[-3000:]}")
        return True

    def stop(self):
        if self.process:
            self.process.stop()

    def wait_exit(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        return self.process.proc.wait(timeout=timeout)

    def output(self) -> str:
        return self.process.output() if self.process else ""

    def __enter__(self) -> "Envoy":
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # --- admin -----------------------------------------------------------------------------

    def admin_get(self, path: str) -> str:
        with urllib.request.urlopen(self.admin_url + path, timeout=5) as r:
            return r.read().decode()

    def stats(self, filter_regex: str = "") -> dict:
        """Counters and gauges as `{name: int}` (`/stats`, text form)."""
        path = "/stats" + (f"?filter={urllib.parse.quote(filter_regex)}" if filter_regex else "")
        out = {}
        for line in self.admin_get(path).splitlines():
            name, _, value = line.partition(": ")
            if value.strip().lstrip("-").isdigit():
                out[name] = int(value)
        return out

    def metric(self, name: str, reason: Optional[str] = None) -> int:
        """One of the filter's metrics, by its Prometheus name and `reason` label
        (`metric("prewarm_filter_unrouted_total", reason="no_table")`)."""
        full = "wasmcustom." + filter_stat(name, reason)
        return self.stats("^" + re.escape(full) + "$").get(full, 0)

    def prometheus(self) -> tuple[dict, dict]:
        """`/stats/prometheus` parsed: ({series: value}, {name: type}), a series written as
        Envoy prints it (`prewarm_filter_unrouted_total{reason="no_table"}`)."""
        samples, types = {}, {}
        for line in self.admin_get("/stats/prometheus").splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ", 3)
                types[name] = kind
            elif line and not line.startswith("#"):
                series, _, value = line.rpartition(" ")
                samples[series] = float(value)
        return samples, types

    def wasm_failures(self) -> dict:
        """Envoy's wasm failure/reload stats that are not zero (must stay `{}`)."""
        return {k: v for k, v in self.stats("wasm").items() if FAILURE_STAT.search(k) and v != 0}

    def healthy_hosts(self, cluster: str = POOL_CLUSTER) -> int:
        return self.stats(f"cluster\\.{re.escape(cluster)}\\.membership_healthy$").get(
            f"cluster.{cluster}.membership_healthy", 0
        )

    # --- client ------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Optional[bytes] = None, headers: Optional[dict] = None,
                timeout: float = 30.0) -> tuple[int, dict, bytes]:
        """One request through the listener: (status, lower-cased headers, body)."""
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
        except urllib.error.HTTPError as e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()

    def post(self, path: str, obj, headers: Optional[dict] = None, timeout: float = 30.0):
        h = {"content-type": "application/json", **(headers or {})}
        return self.request("POST", path, json.dumps(obj).encode(), h, timeout)


class EnvoyFleet:
    """The Envoys of one test: `start(**Envoy kwargs)` starts one in its own subdirectory;
    `close()` checks that none of them saw a wasm failure or VM reload (a panic in the filter)
    and stops them all. Use it as a fixture:

        @pytest.fixture
        def envoys(tmp_path):
            fleet = EnvoyFleet(tmp_path)
            yield fleet
            fleet.close()
    """

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.envoys: list[Envoy] = []

    def start(self, **kwargs) -> Envoy:
        name = kwargs.pop("name", f"envoy{len(self.envoys)}")
        envoy = Envoy(self.workdir / name, name=name, **kwargs)
        self.envoys.append(envoy)
        return envoy.start()

    @staticmethod
    def wait_table(envoy: Envoy, generation: int, adopted_before: int = 0, timeout: float = 15.0):
        """Waits until every VM of `envoy` (its workers and the main thread) routes with table
        `generation`; `adopted_before` is `prewarm_filter_table_adopted_total` before that table
        was served."""
        wait_until(lambda: envoy.metric("prewarm_filter_table_generation") == generation, timeout,
                   what=f"table generation {generation}")
        wait_until(lambda: envoy.metric("prewarm_filter_table_adopted_total") >= adopted_before + envoy.concurrency + 1,
                   timeout, what="every VM adopted the table")

    def close(self):
        failures = {}
        try:
            for e in self.envoys:
                if e.process and e.process.alive() and e.admin_url:
                    bad = e.wasm_failures()
                    if bad:
                        failures[e.name] = bad
        finally:
            for e in self.envoys:
                e.stop()
        assert not failures, f"wasm VM failures/reloads (a filter panic?): {failures}"
