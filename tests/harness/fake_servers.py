"""Recording HTTP servers for tests: stand-ins for the prewarm gateway and for inference pods.

Each server is a threaded HTTP/1.1 server on 127.0.0.1 port 0 that records every request it
receives (method, path, lower-cased headers, body; chunked request bodies are decoded) and
answers through a replaceable `responder`. Ready-made responders cover what the tests need:
fast echo, slow, 500, garbage, server-sent events; `MisbehavingPod` hangs, redirects or streams
an endless `/metrics` at the gateway.

    upstream = FakeUpstream("pod-a").start()
    gateway = FakeGateway().start(); gateway.table = {...}    # served on GET /v1/routing
    ...
    upstream.requests   # [Recorded(...)], gateway.batches  # decoded SignalBatch JSON
    upstream.stop()
"""
from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterable, Optional


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict
    body: bytes
    at: float = field(default_factory=time.monotonic)

    def json(self):
        return json.loads(self.body)


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict = field(default_factory=dict)
    delay: float = 0.0
    # When set, the body is sent as these chunks (chunked encoding) with `chunk_delay` between.
    chunks: Optional[Iterable[bytes]] = None
    chunk_delay: float = 0.0


Responder = Callable[[Recorded], Reply]


def json_reply(obj, status: int = 200) -> Reply:
    return Reply(status, json.dumps(obj).encode(), {"content-type": "application/json"})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, *args):  # quiet
        pass

    def _read_body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self):
        rec = Recorded(
            self.command,
            self.path,
            {k.lower(): v for k, v in self.headers.items()},
            self._read_body(),
        )
        owner = self.server.owner
        if rec.path != "/health":
            with owner.lock:
                owner.requests.append(rec)
        reply = owner.respond(rec)
        if reply.delay:
            time.sleep(reply.delay)
        try:
            self.send_response(reply.status)
            for k, v in reply.headers.items():
                self.send_header(k, v)
            if reply.chunks is None:
                self.send_header("content-length", str(len(reply.body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(reply.body)
            else:
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for chunk in reply.chunks:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                    if reply.chunk_delay:
                        time.sleep(reply.chunk_delay)
                self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, owner: "RecordingServer"):
        self.owner = owner
        self.connections: set = set()
        self.connections_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request, client_address):
        with self.connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self):
        """Resets every open connection: a stopped server must look dead to kept-alive peers."""
        with self.connections_lock:
            connections = list(self.connections)
        for c in connections:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request, client_address):
        pass  # a peer resetting its connection (Envoy's health checker, a stopped test) is normal


class RecordingServer:
    """A threaded HTTP server recording what it receives; `responder` decides the replies
    (`/health` always answers 200 unless `healthy` is False)."""

    def __init__(self, name: str = "server", responder: Optional[Responder] = None):
        self.name = name
        self.lock = threading.Lock()
        self.requests: list[Recorded] = []
        self.responder: Optional[Responder] = responder
        self.healthy = True
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "RecordingServer":
        self._server = _Server(self)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server.close_connections()
            self._server = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    @property
    def address(self) -> str:
        """`127.0.0.1:PORT`, the form the routing table and Envoy's endpoints use."""
        return f"127.0.0.1:{self.port}"

    def respond(self, rec: Recorded) -> Reply:
        if rec.path == "/health":
            return Reply(200 if self.healthy else 503, b"ok")
        if self.responder is not None:
            return self.responder(rec)
        return self.default_reply(rec)

    def default_reply(self, rec: Recorded) -> Reply:
        return Reply(404, b"not found")

    def received(self, path: Optional[str] = None) -> list[Recorded]:
        with self.lock:
            return [r for r in self.requests if path is None or r.path.split("?")[0] == path]

    def clear(self):
        with self.lock:
            self.requests.clear()


def receiver(servers: list, before: list[int]) -> "RecordingServer":
    """The one server of `servers` whose request count grew since `before` (their counts then,
    in the same order)."""
    grown = [s for s, n in zip(servers, before) if len(s.received()) > n]
    assert len(grown) == 1, [s.name for s in grown]
    return grown[0]


def sse_events(n: int = 3) -> list[bytes]:
    """`n` OpenAI-style stream chunks and the final `[DONE]`."""
    events = [
        b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": f"tok{i}"}}]}).encode() + b"\n\n"
        for i in range(n)
    ]
    return events + [b"data: [DONE]\n\n"]


class FakeUpstream(RecordingServer):
    """An inference pod: answers every request with a deterministic JSON echo of what it got
    (path, method, body length and SHA-256) — or, when the body asks `"stream": true`, with
    server-sent events — so two Envoys can be compared byte for byte."""

    def default_reply(self, rec: Recorded) -> Reply:
        try:
            streaming = json.loads(rec.body).get("stream") is True
        except (ValueError, AttributeError):
            streaming = False
        if streaming:
            return Reply(200, headers={"content-type": "text/event-stream"}, chunks=sse_events(), chunk_delay=0.01)
        return json_reply(
            {
                "method": rec.method,
                "path": rec.path,
                "body_len": len(rec.body),
                "body_sha256": hashlib.sha256(rec.body).hexdigest(),
            }
        )


class FakeGateway(RecordingServer):
    """The prewarm gateway's filter-facing API: records `POST /v1/signals` batches and serves
    `GET /v1/routing` with `table` (304 when the request's `if-none-match` names its
    generation; 404 while `table` is None). `mode` turns it bad: "slow" (answers after
    `slow_seconds`), "500", "garbage"."""

    def __init__(self, name: str = "gateway"):
        super().__init__(name)
        self.table: Optional[dict] = None
        self.mode = "ok"
        self.slow_seconds = 3.0

    @property
    def batches(self) -> list[dict]:
        return [r.json() for r in self.received("/v1/signals") if r.method == "POST"]

    def signals(self, kind: Optional[str] = None) -> list[dict]:
        return [s for b in self.batches for s in b.get("signals", []) if kind is None or s.get("kind") == kind]

    def default_reply(self, rec: Recorded) -> Reply:
        if self.mode == "slow":
            return Reply(200, b"{}", delay=self.slow_seconds)
        if self.mode == "500":
            return Reply(500, b"internal error")
        if self.mode == "garbage":
            return Reply(200, b"\x00\xffnot json at all{{{", {"content-type": "application/json"})
        path = rec.path.split("?")[0]
        if rec.method == "POST" and path == "/v1/signals":
            return json_reply({"accepted": len(json.loads(rec.body).get("signals", []))})
        if rec.method == "GET" and path == "/v1/routing":
            table = self.table
            if table is None:
                return Reply(404, b"no table yet")
            if rec.headers.get("if-none-match") == f'"{table["generation"]}"':
                return Reply(304, b"")
            return json_reply(table)
        return Reply(404, b"not found")


class MisbehavingPod(RecordingServer):
    """An inference pod that misbehaves towards the gateway, by `mode`:
    - "hang": accepts every request (`/health` included) and never answers (until `stop()`);
    - "redirect": answers every request (`/health` included) with a 302 to `redirect_to` plus
      the path (point it at a canary `RecordingServer` and check it received nothing);
    - "huge_metrics": healthy, but `GET /metrics` streams `huge_bytes` (chunked, no length);
      `metrics_sent` lists the bytes each such reply got out before the peer hung up.
    Every request, `/health` included, is counted in `hits`."""

    def __init__(self, mode: str, name: str = "misbehaving-pod", redirect_to: str = "",
                 huge_bytes: int = 256 << 20):
        super().__init__(name)
        self.mode = mode
        self.redirect_to = redirect_to
        self.huge_bytes = huge_bytes
        self.hits = 0
        self.metrics_sent: list[int] = []
        self._release = threading.Event()

    def stop(self):
        self._release.set()
        super().stop()

    def respond(self, rec: Recorded) -> Reply:
        with self.lock:
            self.hits += 1
        if self.mode == "hang":
            self._release.wait(timeout=600)
            return Reply(503, b"released")
        if self.mode == "redirect":
            return Reply(302, b"", {"location": f"{self.redirect_to}{rec.path}"})
        if self.mode == "huge_metrics" and rec.path == "/metrics":
            return Reply(200, headers={"content-type": "text/plain"}, chunks=self._huge())
        return super().respond(rec)

    def _huge(self):
        chunk = b"# " + b"x" * (64 * 1024 - 3) + b"\n"
        with self.lock:
            self.metrics_sent.append(0)
            slot = len(self.metrics_sent) - 1
        sent = 0
        while sent < self.huge_bytes:
            yield chunk
            sent += len(chunk)
            with self.lock:
                self.metrics_sent[slot] = sent
