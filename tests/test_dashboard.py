"""The gateway's dashboard in a real headless Chromium, against a real gateway and podsim pods.

The page is loaded once; what it shows (read from the DOM through the DevTools protocol) must
match the admin API — pods and their routing-table state, every heatmap cell, the top prefixes
and the pods they are placed on — and must follow a state change (a pod added and warmed, an
adapter pinned, a template added) without a reload. Screenshots go to `out/dashboard/`.

Chromium is Debian's `chromium` (`make setup` installs it), started with a fresh profile, no
network besides loopback, driven with a small stdlib websocket client (no driver package).
`fleet(tmp_path)` builds the known state `tests/test_status.py` uses too.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import struct
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest
import requests

from harness import REPO, ManagedProcess, wait_until
from harness.gateway import READ_TOKEN, Gateway, start_gateway
from harness.podsim import make_adapter, start_podsim

BASE = "meta-llama/Llama-3.1-8B-Instruct"
CHROMIUM = Path(os.environ.get("PREWARM_CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = REPO / "out" / "dashboard"


# ---------------------------------------------------------------------------------------------
# The known state: two LoRA pods (b joins later), two adapters, templates of distinct hotness.

def template_text(i: int, topic: str = "support") -> str:
    line = f"Template {i:02d} ({topic}): you are a careful assistant; answer tenant {i} briefly. "
    return (line * 30)[: 64 * 4 * 3 + 7]


def lora_pod(tmp_path: Path, name: str):
    return start_podsim(tmp_path, "--enable-lora", "--max-loras", "2", "--max-cpu-loras", "4",
                        "--enable-prompt-tokens-details", "--time-scale", "20", name=name)


def pod_spec(pod_id: str, url: str) -> dict:
    return {"id": pod_id, "address": url.removeprefix("http://"), "max_loras": 2, "max_cpu_loras": 4}


@dataclass
class Fleet:
    gw: Gateway
    pods: dict = field(default_factory=dict)  # id -> (process, url)
    tmp_path: Optional[Path] = None
    templates: dict = field(default_factory=dict)  # key -> (model, tenant)

    def add_template(self, i: int, model: str, tenant: Optional[str], boost: int, topic: str = "support"):
        body = {"model": model, "text": template_text(i, topic), "tags": [topic]}
        if tenant:
            body["tenant"] = tenant
        r = self.gw.admin("POST", "/admin/prompts", json=body)
        assert r.status_code == 201, r.text
        key = r.json()["key"]
        if boost:
            self.gw.feedback(model, key, boost)
        self.templates[key] = (model, tenant)
        return key

    def add_pod(self, pod_id: str) -> None:
        proc, url = lora_pod(self.tmp_path, f"pod-{pod_id}")
        self.pods[pod_id] = (proc, url)
        r = self.gw.admin("POST", "/admin/pods", json=pod_spec(pod_id, url))
        assert r.status_code == 201, r.text

    def wait_warm(self, ids) -> None:
        def warm():
            pods = {p["id"]: p for p in self.gw.get("/admin/pods").json()["pods"]}
            return all(pods.get(i, {}).get("routable") and pods[i]["warmup_phase"] == "done" for i in ids)
        wait_until(warm, timeout=60, interval=0.1, what=f"pods {ids} warm and in the table")

    def stop(self) -> None:
        self.gw.proc.stop()
        for proc, _ in self.pods.values():
            proc.stop()


def fleet(tmp_path: Path) -> Fleet:
    """Pod a with adapters sql-lora (gold, acme, pinned) and chat-lora (bronze), six templates
    of distinct hotness (two for sql-lora), all warm."""
    a, a_url = lora_pod(tmp_path, "pod-a")
    config = {
        "pods": {"base_model": BASE, "health_interval_ms": 100, "unhealthy_after": 2,
                 "static": [pod_spec("a", a_url)]},
        "warmup": {"first_tier": 20, "second_tier": 20, "deadline_ms": 60000},
    }
    gw = start_gateway(tmp_path, config, name="gateway")
    f = Fleet(gw, {"a": (a, a_url)}, tmp_path)
    try:
        f.wait_warm(["a"])
        for name, tier, tenant, pinned in (("sql-lora", "gold", "acme", True),
                                           ("chat-lora", "bronze", "globex", False)):
            path = make_adapter(tmp_path / "adapters", name)
            r = gw.admin("POST", "/admin/adapters", json={"name": name, "path": str(path), "tier": tier,
                                                          "tenant": tenant, "pinned": pinned})
            assert r.status_code == 201, r.text
        for i in range(4):
            f.add_template(i, BASE, "acme" if i % 2 else None, boost=i)
        for i in range(4, 6):
            f.add_template(i, "sql-lora", "acme", boost=i)
        # Re-plan a so its plan (and warm-up) covers the adapters and templates added after it joined.
        r = gw.admin("POST", "/admin/pods/a/warmup")
        assert r.status_code == 202, r.text
        f.wait_warm(["a"])
        wait_until(lambda: "sql-lora" in {x["name"] for x in gw.get("/admin/pods/a").json()["lora"]
                                          if x["in_gpu"]}, timeout=30, what="sql-lora resident on a")
        return f
    except BaseException:
        f.stop()
        raise


# ---------------------------------------------------------------------------------------------
# What the admin API says the dashboard must show.

def api_state(gw: Gateway, top: int) -> dict:
    pods = gw.get("/admin/pods").json()["pods"]
    heatmap = gw.get("/admin/adapters/heatmap").json()
    prompts = gw.get(f"/admin/prompts?k={top}").json()["prompts"]
    plans = {p["id"]: gw.get(f"/admin/pods/{p['id']}/plan").json() for p in pods}
    placed: dict = {}
    for p in pods:
        for key in plans[p["id"]]["first_tier"] + plans[p["id"]]["second_tier"]:
            placed.setdefault(key, []).append(p["id"] if p["routable"] else f"{p['id']}(warming)")
    return {
        "pods": [{"id": p["id"], "routable": p["routable"], "phase": p["warmup_phase"] or ""} for p in pods],
        "cells": sorted((a, pod, heatmap["cells"][i][j])
                        for i, a in enumerate(heatmap["adapters"]) for j, pod in enumerate(heatmap["pods"])),
        "prefixes": [(p["key"], round(p["hotness"], 6), ",".join(sorted(placed.get(p["key"], []))))
                     for p in prompts],
    }


# ---------------------------------------------------------------------------------------------
# Chromium over the DevTools protocol, with a minimal stdlib websocket client.

class WebSocket:
    """Client side of RFC 6455 for text messages: masked frames out, fragments reassembled."""

    def __init__(self, url: str, timeout: float = 30.0):
        assert url.startswith("ws://"), url
        hostport, _, path = url[len("ws://"):].partition("/")
        host, port = hostport.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            assert chunk, "websocket handshake: connection closed"
            head += chunk
        assert head.startswith(b"HTTP/1.1 101"), head

    def _exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            assert chunk, "websocket: connection closed"
            out += chunk
        return out

    def send(self, text: str) -> None:
        payload = text.encode()
        n = len(payload)
        header = bytes([0x81])
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def recv(self) -> str:
        message = b""
        while True:
            b0, b1 = self._exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            payload = self._exact(n)
            opcode = b0 & 0x0F
            if opcode == 0x8:
                raise ConnectionError("websocket closed by the browser")
            if opcode in (0x9, 0xA):  # ping/pong: nothing to do for a short-lived client
                continue
            message += payload
            if b0 & 0x80:
                return message.decode()

    def close(self) -> None:
        self.sock.close()


class Browser:
    """Headless Chromium with a fresh profile; `open(url)` gives a page to drive."""

    def __init__(self, workdir: Path):
        self.profile = Path(tempfile.mkdtemp(prefix="chromium-profile-"))
        argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
                "--remote-debugging-address=127.0.0.1", "--window-size=1400,1000", "about:blank"]
        self.proc = ManagedProcess(argv, Path(workdir) / "chromium.log", ready=r"DevTools listening on ws://",
                                   timeout=60)
        port_file = self.profile / "DevToolsActivePort"
        self.port = int(wait_until(lambda: port_file.read_text().split("\n")[0], timeout=30,
                                   what="DevToolsActivePort"))

    def open(self, url: str) -> "Page":
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/json/new?{url}", method="PUT")
        with urllib.request.urlopen(req, timeout=30) as r:
            target = json.loads(r.read())
        return Page(WebSocket(target["webSocketDebuggerUrl"]))

    def close(self) -> None:
        self.proc.stop()
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    def __init__(self, ws: WebSocket):
        self.ws = ws
        self.next_id = 0

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                assert "error" not in reply, reply
                return reply["result"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path


# What the page shows, read from its DOM (the data-* attributes the renderer writes).
DOM_VIEW = """JSON.stringify({
  refreshes: Number(document.getElementById('refreshed').dataset.refreshes),
  summary: document.getElementById('summary').textContent,
  pods: [...document.querySelectorAll('#pods tbody tr')].map(r => ({
    id: r.dataset.pod, routable: r.dataset.routable === 'true', phase: r.dataset.phase,
    state: r.dataset.state, text: r.innerText})),
  cells: [...document.querySelectorAll('#heatmap td[data-cell]')].map(c => [
    c.dataset.adapter, c.dataset.pod, c.dataset.cell, c.dataset.state]),
  heat: Object.fromEntries([...document.querySelectorAll('#heatmap tbody tr')].map(r => [
    r.dataset.adapter, [Number(r.dataset.hotness), Number(r.dataset.alpha)]])),
  prefixes: [...document.querySelectorAll('#prefixes tbody tr')].map(r => [
    r.dataset.key, Number(r.dataset.hotness), r.dataset.placed]),
  events: [...document.querySelectorAll('#events li')].map(li => li.innerText),
  decisions: Object.fromEntries([...document.querySelectorAll('#decisions [data-policy]')].map(d => [
    d.dataset.policy + ' ' + d.dataset.decision, Number(d.dataset.count)])),
  experiment: document.getElementById('experiment-title').textContent,
  arms: [...document.querySelectorAll('#experiment tbody tr')].map(r => [
    r.dataset.arm, Number(r.dataset.weight), Number(r.dataset.requests)]),
})"""

TOP = 15  # the page's default
DECISION = re.compile(r'^prewarm_policy_decisions_total\{policy="([^"]*)",decision="([^"]*)"\} (\S+)$', re.M)


def decisions(gw: Gateway) -> dict:
    """`prewarm_policy_decisions_total` from the gateway's /metrics: {"policy decision": count}."""
    return {f"{p} {d}": float(n) for p, d, n in DECISION.findall(gw.get("/metrics").text)}


SIGN_IN = """(() => {
  const form = document.getElementById('signin');
  if (!form || form.hidden) return false;
  document.getElementById('token').value = %s;
  form.requestSubmit();
  return true;
})()"""


def sign_in(page: Page, token: str) -> None:
    """Types `token` into the page's sign-in form once the page asks for it, and submits."""
    wait_until(lambda: page.evaluate(SIGN_IN % json.dumps(token)), timeout=30, interval=0.1,
               what="the dashboard's sign-in form")


def dom_view(page: Page) -> dict:
    return json.loads(page.evaluate(DOM_VIEW))


def matches(page: Page, gw: Gateway) -> Optional[dict]:
    """The DOM view when it equals what the API says now (the page refreshes on its own)."""
    dom = dom_view(page)
    api = api_state(gw, TOP)
    shown = {
        "pods": [{k: p[k] for k in ("id", "routable", "phase")} for p in dom["pods"]],
        "cells": sorted((a, pod, cell) for a, pod, cell, _ in dom["cells"]),
        "prefixes": [(k, placed) for k, _, placed in dom["prefixes"]],
    }
    # Hotness decays between the page's last refresh and this read: equal within 1 % (seconds
    # of decay on a loaded machine; a feedback or a signal moves it by far more).
    hot_api = [h for _, h, _ in api["prefixes"]]
    hot_shown = [h for _, h, _ in dom["prefixes"]]
    api = {**api, "prefixes": [(k, placed) for k, _, placed in api["prefixes"]]}
    same_hotness = len(hot_api) == len(hot_shown) and hot_shown == pytest.approx(hot_api, rel=1e-2)
    return dom if shown == api and same_hotness and dom["refreshes"] > 0 else None


@pytest.fixture
def browser(tmp_path):
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make setup` (it installs Debian's chromium)")
    b = Browser(tmp_path)
    yield b
    b.close()


def test_dashboard_shows_the_admin_api_and_follows_changes(tmp_path, browser):
    f = fleet(tmp_path)
    try:
        page = browser.open(f"{f.gw.url}/?refresh=500")
        # Before signing in the page shows no data; a wrong token is refused and asked again.
        sign_in(page, "wrong-token")
        wait_until(lambda: "refused" in (d := dom_view(page))["summary"] and d, timeout=15, interval=0.1,
                   what="the wrong token refused")
        assert dom_view(page)["pods"] == [] and dom_view(page)["refreshes"] == 0
        sign_in(page, READ_TOKEN)
        assert "token" not in page.evaluate("location.href")
        dom = wait_until(lambda: matches(page, f.gw), timeout=30, interval=0.2,
                         what="the dashboard showing the admin API's state")
        # The known state, as shown: a warm and routed, sql-lora resident (pinned) on a, the six
        # templates hottest first, each placed on a.
        (pod_a,) = dom["pods"]
        assert pod_a["state"] == "warm" and pod_a["routable"] and "a" in pod_a["text"]
        states = {(a, pod): s for a, pod, _, s in dom["cells"]}
        assert states[("sql-lora", "a")] == "resident"
        assert set(states) == {("sql-lora", "a"), ("chat-lora", "a")}
        # Heatmap rows are coloured by the adapter's hotness: its prompts' summed hotness.
        pool = f.gw.get("/admin/prompts?k=1000").json()["prompts"]
        for adapter, (hot, _) in dom["heat"].items():
            assert hot == pytest.approx(sum(p["hotness"] for p in pool if p["model"] == adapter),
                                        rel=1e-2, abs=1e-6)
        assert dom["heat"]["sql-lora"][0] > 0 == dom["heat"]["chat-lora"][0]
        assert dom["heat"]["sql-lora"][1] > dom["heat"]["chat-lora"][1]
        keys = [k for k, _, _ in dom["prefixes"]]
        assert sorted(keys) == sorted(f.templates) and len(keys) == 6
        hotness = [h for _, h, _ in dom["prefixes"]]
        assert hotness == sorted(hotness, reverse=True) and hotness[0] > hotness[-1]
        assert all(placed == "a" for _, _, placed in dom["prefixes"])
        assert any("warm-up started" in e for e in dom["events"]), dom["events"]
        assert any("loaded adapter sql-lora" in e for e in dom["events"]), dom["events"]
        page.screenshot(ARTIFACTS / "before.png")

        # Change the state under the open page: pod b joins and is warmed, chat-lora gets pinned
        # (it becomes resident where it is placed), a hotter template arrives.
        f.add_pod("b")
        r = f.gw.admin("POST", "/admin/adapters/chat-lora/pin")
        assert r.status_code == 200, r.text
        new_key = f.add_template(9, "chat-lora", "globex", boost=12, topic="chat")
        f.wait_warm(["a", "b"])
        refreshes = dom["refreshes"]
        dom = wait_until(lambda: (d := matches(page, f.gw)) and len(d["pods"]) == 2 and d, timeout=30,
                         interval=0.2, what="the dashboard following the new state")
        assert dom["refreshes"] > refreshes, "the page did not refresh on its own"
        assert [p["id"] for p in dom["pods"]] == ["a", "b"]
        assert all(p["state"] == "warm" and p["routable"] for p in dom["pods"])
        assert {pod for _, pod, _, _ in dom["cells"]} == {"a", "b"}
        assert any(s == "resident" for a, _, _, s in dom["cells"] if a == "chat-lora")
        assert dom["prefixes"][0][0] == new_key
        # a prefix is in every plan that lists it: the pod it moves to, and every joining pod's
        # when it was held on two pods (spread)
        placed_on = {pod for _, _, placed in dom["prefixes"] for pod in placed.split(",") if pod}
        # Placement follows the filter's rule (an adapter's prefixes only on pods serving it);
        # which pods win is the fixture's hashes, checked against the API by `agrees` above.
        assert placed_on <= {"a", "b"} and placed_on, placed_on
        assert "2 pods · 2 in the routing table" in dom["summary"]
        # The decision counters are the gateway's: same (policy, decision) pairs as /metrics,
        # counts no higher than /metrics says after the page read them.
        dom = wait_until(lambda: (d := dom_view(page))["decisions"].keys() == decisions(f.gw).keys() and d,
                         timeout=15, interval=0.2, what="decision counters as /metrics has them")
        after = decisions(f.gw)
        assert dom["decisions"].get("lora load", 0) >= 2, dom["decisions"]
        assert all(0 <= n <= after[k] for k, n in dom["decisions"].items()), (dom["decisions"], after)
        # An experiment starts and outcomes arrive: the page shows its arms and their figures.
        body = {"id": "ab", "arms": [{"name": "warm", "weight": 0.5},
                                     {"name": "cold", "weight": 0.5, "settings": {"warmup": False}}]}
        started = f.gw.admin("POST", "/admin/experiments", json=body)
        assert started.status_code == 201, started.text
        at = started.json()["started_ms"] + 1
        outcomes = [{"arm": f"ab/{arm}", "at_ms": at, "ttfb_ms": 10 + i, "status": 200, "stream": False}
                    for arm, n in (("warm", 3), ("cold", 5)) for i in range(n)]
        assert f.gw.signals({"version": "1.0", "signals": [], "outcomes": outcomes}).status_code == 202
        dom = wait_until(lambda: (d := dom_view(page))["arms"] == [["warm", 0.5, 3], ["cold", 0.5, 5]] and d,
                         timeout=15, interval=0.2, what="the experiment on the dashboard")
        assert dom["experiment"].startswith("ab · since"), dom["experiment"]
        shot = page.screenshot(ARTIFACTS / "dashboard.png")
        assert shot.stat().st_size > 10_000

        # The gateway goes away: the page says so and keeps the last data it read.
        f.gw.proc.stop()
        gone = wait_until(lambda: "cannot read the admin API" in (d := dom_view(page))["summary"] and d,
                          timeout=15, interval=0.2, what="the page noticing the gateway is gone")
        assert [p["id"] for p in gone["pods"]] == ["a", "b"] and gone["refreshes"] == dom_view(page)["refreshes"]
    finally:
        f.stop()


def test_dashboard_assets_are_served_read_only(tmp_path):
    gw = start_gateway(tmp_path, {}, name="gateway")
    try:
        page = gw.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "connect-src 'self'" in csp, csp
        for path, kind in (("/dashboard/app.js", "text/javascript"), ("/dashboard/style.css", "text/css")):
            assert path in page.text
            r = gw.get(path)
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind), path
            assert "https://" not in r.text and "http://" not in r.text
        assert requests.post(f"{gw.url}/", timeout=10).status_code == 405
        assert gw.get("/dashboard/nothing.js").status_code == 404
    finally:
        gw.proc.stop()
