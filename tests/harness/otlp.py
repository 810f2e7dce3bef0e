"""A small OTLP/HTTP receiver on loopback, for the gateway's traces (no collector package is
available here): `OtlpReceiver().start()` answers `POST /v1/traces` with 200 and keeps every
request; `spans()` decodes the OTLP JSON bodies (`ExportTraceServiceRequest`) into flat dicts:
`name`, `trace_id`, `span_id`, `parent` ("" for a root), `service` (the resource's
`service.name`), `status` (the status code, 0 unset / 2 error) and `attrs` (key -> value; OTLP
JSON's int64 strings become ints).
"""
from __future__ import annotations

import json

from .fake_servers import Recorded, RecordingServer, Reply

TRACES_PATH = "/v1/traces"


def _value(v: dict):
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    return v


def _attrs(items: list) -> dict:
    return {a["key"]: _value(a.get("value", {})) for a in items or []}


class OtlpReceiver(RecordingServer):
    def __init__(self):
        super().__init__("otlp")

    def default_reply(self, rec: Recorded) -> Reply:
        if rec.method == "POST" and rec.path == TRACES_PATH:
            return Reply(200, b"{}", {"content-type": "application/json"})
        return Reply(404, b"not found")

    @property
    def endpoint(self) -> str:
        return f"http://{self.address}{TRACES_PATH}"

    def spans(self) -> list[dict]:
        out = []
        for rec in self.received(TRACES_PATH):
            body = json.loads(rec.body)
            for rs in body.get("resourceSpans", []):
                service = _attrs(rs.get("resource", {}).get("attributes")).get("service.name")
                for ss in rs.get("scopeSpans", []):
                    for s in ss.get("spans", []):
                        out.append({
                            "name": s["name"],
                            "trace_id": s["traceId"],
                            "span_id": s["spanId"],
                            "parent": s.get("parentSpanId", ""),
                            "service": service,
                            "status": s.get("status", {}).get("code", 0),
                            "attrs": _attrs(s.get("attributes")),
                        })
        return out
