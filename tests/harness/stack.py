"""The whole prewarm stack on loopback, as real processes: N podsim pods, the gateway wired to
them, and the real Envoy (shipped `envoy/envoy.yaml`, rewritten by `harness.envoy`) with the
filter `.wasm` wired to both. Every port is discovered; nothing is fixed.

    from harness.stack import Stack, StackSpec
    with Stack(tmp_path, StackSpec(pods=3, spare_pods=1, adapters=["sg-0"])) as stack:
        stack.post("/v1/completions", {...}, user="u1")   # through Envoy
        stack.join_spare(0)                                # 4th pod starts and is announced
        stack.wait_routable("pod-3")
        stack.warmup("pod-3")                              # GET /admin/pods/pod-3/warmup
    # stopped, in reverse order, by process id; no port left bound

Spare pods: Envoy's pool is static (as an EDS/DNS-fed pool is in a mesh, the endpoint is known
to Envoy before it serves), so a spare pod's port is reserved at start (bound to :0, released)
and the pod is started on it later by `join_spare`, which then announces it to the gateway with
`POST /admin/pods` — what an operator or a DNS change would do. Until then Envoy's health check
keeps the endpoint out of the pool and the gateway does not know it.

Every response through Envoy carries `x-prewarm-upstream: <pod ip:port>` (added to the route by
the rewrite), so callers can attribute each request to the pod that served it.
"""
from __future__ import annotations

import json
import random
import socket
import string
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import requests

from . import ManagedProcess, wait_until
from .envoy import Envoy, build_config, load_shipped_config
from .gateway import SIGNAL_TOKEN, Gateway, start_gateway
from .podsim import make_adapter, start_podsim

BASE_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
UPSTREAM_HEADER = "x-prewarm-upstream"
USER_HEADER = "x-prewarm-user"
TENANT_HEADER = "x-prewarm-tenant"


@dataclass
class AdapterSpec:
    """An adapter the stack registers with the gateway (a real directory with a manifest) and
    serves on every pod (`--lora-modules`)."""

    name: str
    tier: str = "bronze"
    tenant: Optional[str] = None
    rank: int = 8
    pinned: bool = False


@dataclass
class StackSpec:
    pods: int = 3
    spare_pods: int = 0
    podsim_flags: Sequence[str] = ()
    """Extra podsim flags for every pod (`--time-scale`, `--num-gpu-blocks`, ...)."""
    adapters: Sequence[AdapterSpec] = ()
    gateway: dict = field(default_factory=dict)
    """Gateway configuration sections merged over the stack's defaults (per section)."""
    filter_config: dict = field(default_factory=dict)
    """Filter JSON configuration merged over the shipped one and the stack's defaults."""
    envoy_mutate: Optional[Callable[[dict], None]] = None
    envoy_base: Optional[Path] = None
    """A shipped Envoy configuration other than envoy/envoy.yaml (e.g. envoy/beside-endpoint-picker.yaml)."""
    max_loras: int = 2
    max_cpu_loras: int = 4
    preload_adapters: bool = True
    """Serve every adapter on every pod from the start (`--lora-modules`); when false, pods start
    with none and only the gateway's loads put adapters on them."""
    envoy_concurrency: int = 2
    log_level: str = "warning"
    gateway_log: str = "warn"
    """The gateway's `PREWARM_LOG` (EnvFilter syntax, e.g. `warn,prewarm_gateway::service::persist=info`)."""
    with_gateway: bool = True
    """False: no gateway at all; the filter runs standalone (`direct_calls: always`, every pod
    and spare in `direct_pods`), sending the prefills and adapter touches itself."""


def free_port() -> int:
    """A port that was free a moment ago (bound to :0 and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def add_upstream_header(config: dict) -> None:
    """Adds `x-prewarm-upstream: %UPSTREAM_HOST%` to every response of the inference route."""
    listener = config["static_resources"]["listeners"][0]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    for vhost in manager["route_config"]["virtual_hosts"]:
        headers = vhost.setdefault("response_headers_to_add", [])
        if not any(h["header"]["key"] == UPSTREAM_HEADER for h in headers):
            headers.append({"header": {"key": UPSTREAM_HEADER, "value": "%UPSTREAM_HOST%"},
                            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"})


def _merge(base: dict, over: dict) -> dict:
    out = json.loads(json.dumps(base))
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


@dataclass
class Pod:
    id: str
    address: str
    process: Optional[ManagedProcess] = None

    @property
    def url(self) -> str:
        return f"http://{self.address}"


class Stack:
    """See the module docs. `start()` returns once every pod is up and routable in the gateway,
    Envoy is LIVE with every initial pod healthy, and every Envoy VM has adopted a routing table
    that lists them."""

    def __init__(self, workdir: Path, spec: StackSpec, bin_dir: Optional[Path] = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.spec = spec
        self.pods: list[Pod] = []
        self.spares: list[Pod] = []
        self.gateway: Optional[Gateway] = None
        self.envoy: Optional[Envoy] = None
        self.adapter_dirs: dict[str, Path] = {}
        self._gateway_config: dict = {}

    # --- lifecycle ---------------------------------------------------------------------------

    def pod_flags(self) -> list[str]:
        flags = ["--enable-prompt-tokens-details", *self.spec.podsim_flags]
        if self.spec.adapters:
            flags += ["--enable-lora", "--max-loras", str(self.spec.max_loras),
                      "--max-cpu-loras", str(self.spec.max_cpu_loras),
                      "--max-lora-rank", str(max(16, max(a.rank for a in self.spec.adapters))),
                      ]
            if self.spec.preload_adapters:
                flags += ["--lora-modules", *[f"{n}={p}" for n, p in self.adapter_dirs.items()]]
        return flags

    def start_pod(self, pod: Pod, port: Optional[int] = None) -> Pod:
        flags = self.pod_flags() + (["--port", str(port)] if port else [])
        pod.process, url = start_podsim(self.workdir, *flags, name=pod.id)
        pod.address = url.removeprefix("http://")
        return pod

    def gateway_config(self) -> dict:
        base = {
            "server": {"max_signal_body_bytes": 16 << 20},
            "state": {"dir": str(self.workdir / "gateway-state"), "snapshot_interval_seconds": 5},
            "pods": {"base_model": BASE_MODEL, "health_interval_ms": 200, "unhealthy_after": 3,
                     "static": [self.pod_entry(p) for p in self.pods]},
        }
        return _merge(base, self.spec.gateway)

    def pod_entry(self, pod: Pod) -> dict:
        return {"id": pod.id, "address": pod.address, "max_loras": self.spec.max_loras,
                "max_cpu_loras": self.spec.max_cpu_loras}

    def filter_config(self) -> dict:
        # The filter presents the gateway's signal token, as a deployment's filter config does.
        base = {"tick_period_ms": 200, "base_models": [BASE_MODEL], "gateway_token": SIGNAL_TOKEN}
        if not self.spec.with_gateway:
            base = {"tick_period_ms": 200, "base_models": [BASE_MODEL], "direct_calls": "always",
                    "direct_pods": [{"id": p.id, "address": p.address} for p in self.pods + self.spares]}
        return {**base, **self.spec.filter_config}

    def start(self) -> "Stack":
        try:
            for a in self.spec.adapters:
                self.adapter_dirs[a.name] = make_adapter(self.workdir / "adapters", a.name, rank=a.rank)
            for i in range(self.spec.pods):
                self.pods.append(self.start_pod(Pod(f"pod-{i}", "")))
            for j in range(self.spec.spare_pods):
                i = self.spec.pods + j
                self.spares.append(Pod(f"pod-{i}", f"127.0.0.1:{free_port()}"))
            if not self.spec.with_gateway:
                self.start_envoy()
                return self
            self.start_gateway()
            for a in self.spec.adapters:
                self.register_adapter(a)
            self.wait_routable(*[p.id for p in self.pods])
            if self.spec.adapters and not self.spec.preload_adapters:
                # Registration loads nothing; a re-warm places the registered adapters.
                for p in self.pods:
                    r = self.gateway.admin("POST", f"/admin/pods/{p.id}/warmup")
                    assert r.status_code == 202, r.text
                names = {a.name for a in self.spec.adapters}
                wait_until(lambda: names <= {a for p in self.routing()["pods"] for a in p["adapters"]}, 30,
                           what="every adapter loaded on a routed pod")
            self.start_envoy()
        except BaseException:
            self.stop()
            raise
        return self

    def start_gateway(self) -> Gateway:
        self._gateway_config = self._gateway_config or self.gateway_config()
        self.gateway = self._try_start_gateway()
        return self.gateway

    def restart_gateway(self) -> Gateway:
        """Starts the gateway again (after `gateway.proc.kill()` or `.stop()`) on the same
        address and state directory, as a restarted deployment behind the same Service."""
        assert self.gateway is not None
        if self.gateway.proc.alive():
            self.gateway.proc.stop()
        self._gateway_config["server"]["listen"] = self.gateway.url.removeprefix("http://")
        self.gateway = wait_until(self._try_start_gateway, 30, interval=0.2, what="gateway restarts")
        return self.gateway

    def _try_start_gateway(self) -> Gateway:
        return start_gateway(self.workdir, self._gateway_config, name="gateway",
                             env={"PREWARM_LOG": self.spec.gateway_log})

    def start_envoy(self) -> Envoy:
        assert self.gateway is not None or not self.spec.with_gateway

        def mutate(config: dict) -> None:
            add_upstream_header(config)
            if self.spec.envoy_mutate:
                self.spec.envoy_mutate(config)

        config = build_config(
            pods=[p.address for p in self.pods + self.spares],
            gateway=self.gateway.url.removeprefix("http://") if self.gateway else None,
            filter_config=self.filter_config(),
            mutate=mutate,
            **({"base": load_shipped_config(self.spec.envoy_base)} if self.spec.envoy_base else {}),
        )
        self.envoy = Envoy(self.workdir / "envoy", config=config, concurrency=self.spec.envoy_concurrency,
                           log_level=self.spec.log_level)
        self.envoy.start()
        wait_until(lambda: self.envoy.healthy_hosts() >= len(self.pods), 30, what="Envoy sees the pods healthy")
        if self.gateway:
            self.wait_envoy_routes(*[p.address for p in self.pods])
        return self.envoy

    def stop(self) -> None:
        """Stops everything this stack started, newest first, by process id."""
        if self.envoy:
            self.envoy.stop()
        if self.gateway:
            self.gateway.proc.stop()
        for pod in reversed(self.pods + self.spares):
            if pod.process:
                pod.process.stop(grace=5)

    def close(self) -> None:
        """Checks that Envoy saw no wasm VM failure or reload (a filter panic), then stops
        everything; the check fails the test after the stop."""
        failures = {}
        try:
            if self.envoy and self.envoy.process and self.envoy.process.alive() and self.envoy.admin_url:
                failures = self.envoy.wasm_failures()
        finally:
            self.stop()
        assert not failures, f"wasm VM failures/reloads (a filter panic?): {failures}"

    def __enter__(self) -> "Stack":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- pods ------------------------------------------------------------------------------

    def join_spare(self, index: int = 0) -> Pod:
        """Starts spare pod `index` on its reserved port and announces it to the gateway (without
        a gateway, the standalone filter already lists it in `direct_pods`)."""
        pod = self.spares[index]
        port = int(pod.address.rsplit(":", 1)[1])
        self.start_pod(pod, port)
        self.pods.append(pod)
        if self.gateway:
            self.announce(pod)
        return pod

    def announce(self, pod: Pod) -> None:
        assert self.gateway is not None
        r = self.gateway.admin("POST", "/admin/pods", json=self.pod_entry(pod))
        assert r.status_code == 201, r.text

    def restart_pod(self, pod: Pod) -> Pod:
        """Starts a stopped pod again, cold, on the same port."""
        port = int(pod.address.rsplit(":", 1)[1])
        return self.start_pod(pod, port)

    def pod(self, pod_id: str) -> Pod:
        return next(p for p in self.pods + self.spares if p.id == pod_id)

    def pod_by_address(self, address: str) -> Optional[Pod]:
        return next((p for p in self.pods + self.spares if p.address == address), None)

    # --- gateway ---------------------------------------------------------------------------

    def register_adapter(self, a: AdapterSpec) -> dict:
        assert self.gateway is not None
        body = {"name": a.name, "path": str(self.adapter_dirs[a.name]), "tier": a.tier,
                "tenant": a.tenant or a.name, "pinned": a.pinned}
        r = self.gateway.admin("POST", "/admin/adapters", json=body)
        assert r.status_code in (200, 201), r.text
        return r.json()

    def routing(self) -> dict:
        assert self.gateway is not None
        return self.gateway.get("/v1/routing").json()

    def join_warmed(self, index: int = 0, timeout: float = 120.0) -> tuple[Pod, dict]:
        """Starts spare `index`, announces it, and waits until the gateway routes it with its first
        tier warmed (asserted whole: planned, all done, none failed) and Envoy routes to it:
        (the pod, its warm-up status)."""
        new = self.join_spare(index)
        status = wait_until(lambda: new.id in self.routed_ids() and self.warmup(new.id), timeout, interval=0.05,
                            what=f"{new.id} routable")
        assert status["first_tier"]["total"] > 0, status
        assert status["first_tier"]["done"] == status["first_tier"]["total"], status
        assert status["first_tier"]["failed"] == 0, status
        self.wait_envoy_routes(new.address)
        return new, status

    def routed_ids(self) -> list[str]:
        return [p["id"] for p in self.routing()["pods"]]

    def wait_routable(self, *pod_ids: str, timeout: float = 60.0) -> None:
        wait_until(lambda: set(pod_ids) <= set(self.routed_ids()), timeout,
                   what=f"{pod_ids} in the routing table")

    def warmup(self, pod_id: str) -> Optional[dict]:
        assert self.gateway is not None
        return self.gateway.get(f"/admin/pods/{pod_id}/warmup").json().get("warmup")

    def pod_detail(self, pod_id: str) -> dict:
        assert self.gateway is not None
        return self.gateway.get(f"/admin/pods/{pod_id}").json()

    def gateway_metric(self, prefix: str) -> float:
        assert self.gateway is not None
        text = self.gateway.get("/metrics").text
        return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(prefix))

    # --- Envoy -----------------------------------------------------------------------------

    def wait_envoy_routes(self, *addresses: str, timeout: float = 30.0) -> None:
        """Waits until every Envoy VM routes with the gateway's current table, which lists
        `addresses`."""
        assert self.envoy is not None
        table = wait_until(lambda: (t := self.routing()) and
                           set(addresses) <= {p["address"] for p in t["pods"]} and t,
                           timeout, what=f"{addresses} in the routing table")
        generation = table["generation"]
        wait_until(lambda: self.envoy.metric("prewarm_filter_table_generation") >= generation, timeout,
                   what=f"Envoy adopts table generation {generation}")

    def post(self, path: str, body: dict, user: Optional[str] = None, tenant: Optional[str] = None,
             headers: Optional[dict] = None, timeout: float = 60.0) -> tuple[int, dict, bytes]:
        """One JSON request through Envoy: (status, lower-cased headers, body)."""
        assert self.envoy is not None
        h = dict(headers or {})
        if user:
            h[USER_HEADER] = user
        if tenant:
            h[TENANT_HEADER] = tenant
        return self.envoy.post(path, body, headers=h, timeout=timeout)

    def completion(self, prompt: str, model: str = BASE_MODEL, user: Optional[str] = None,
                   max_tokens: int = 1, **kwargs) -> tuple[Optional[Pod], dict]:
        """A completion through Envoy that must succeed: (serving pod, reply JSON)."""
        status, headers, body = self.post("/v1/completions", {"model": model, "prompt": prompt,
                                                              "max_tokens": max_tokens}, user=user, **kwargs)
        assert status == 200, (status, body[:300])
        return self.pod_by_address(headers.get(UPSTREAM_HEADER, "")), json.loads(body)

    def chat(self, messages: list, model: str = BASE_MODEL, user: Optional[str] = None, max_tokens: int = 1,
             extra: Optional[dict] = None, **kwargs) -> tuple[Optional[Pod], dict]:
        """A chat completion through Envoy that must succeed: (serving pod, reply JSON). `extra`
        adds body fields (`tools`, `cache_salt`, ...)."""
        request = {"model": model, "messages": messages, "max_tokens": max_tokens, **(extra or {})}
        status, headers, body = self.post("/v1/chat/completions", request, user=user, **kwargs)
        assert status == 200, (status, body[:300])
        return self.pod_by_address(headers.get(UPSTREAM_HEADER, "")), json.loads(body)



TEMPLATE_BYTES = 64 * 4 * 10
"""A test template's size: 10 fingerprint blocks of 64 tokens (4 bytes a token)."""


def template_text(i: int, size: int = TEMPLATE_BYTES) -> str:
    """Template `i`: `size` bytes of distinct pseudo-words (the filter's similarity is over word
    shingles, so a repeated line would leave too few for a short question to stay similar)."""
    rng = random.Random(i)
    words = [f"t{i}"] + ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 8)))
                         for _ in range(size // 3)]
    return " ".join(words)[:size]


def question_text(i: int, k: int) -> str:
    """Template `i` followed by question `k`: the same template with another short tail."""
    return f"{template_text(i)}\nQuestion {k}: how do I reset item {k * 7 + i}?"


def cached_tokens(reply: dict) -> int:
    """podsim's `usage.prompt_tokens_details.cached_tokens` of a completion reply."""
    details = (reply.get("usage") or {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def pod_metric(pod: Pod, prefix: str) -> float:
    """Sum of a podsim `/metrics` series (e.g. `vllm:request_success_total{`)."""
    text = requests.get(f"{pod.url}/metrics", timeout=10).text
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(prefix))


def elapsed(since: float) -> float:
    return time.monotonic() - since
