"""OpenTelemetry traces of warm-up, end to end: the real gateway binary exports over OTLP/HTTP
(JSON) to a small receiver on loopback (`harness.otlp`) while it warms a joining podsim pod.

Asserted: one `warmup.plan` span for the joining pod (a root, outcome `done`, its tiers' sizes,
the time to routable), a `warmup.prefill` child per key it prefilled (same trace, the plan as
parent, the documented attributes), as many as the pod served, and the resource's service name.
"""
from __future__ import annotations

from harness import wait_until
from harness.gateway import start_gateway
from harness.otlp import OtlpReceiver
from harness.podsim import start_podsim
from test_gateway import completions_served, gateway_config, pod_spec, routed_ids, template_text, BASE


def test_a_joining_pods_warm_up_arrives_as_a_plan_span_parenting_its_prefills(tmp_path):
    receiver = OtlpReceiver().start()
    a, a_url = start_podsim(tmp_path, "--time-scale", "20", name="pod-a")
    b, b_url = start_podsim(tmp_path, "--time-scale", "20", name="pod-b")
    traces = {"otlp_endpoint": receiver.endpoint, "protocol": "http/json",
              "service_name": "prewarm-gateway-e2e", "export_delay_ms": 100}
    gw = start_gateway(tmp_path, gateway_config([pod_spec("a", a_url)], traces=traces))
    try:
        wait_until(lambda: routed_ids(gw) == ["a"], timeout=20, what="pod a routable")
        keys = set()
        for i in range(12):
            r = gw.admin("POST", "/admin/prompts", json={"model": BASE, "text": template_text(i)})
            assert r.status_code == 201, r.text
            keys.add(r.json()["key"])
        r = gw.admin("POST", "/admin/pods", json=pod_spec("b", b_url))
        assert r.status_code == 201, r.text
        wait_until(lambda: (gw.get("/admin/pods/b/warmup").json()["warmup"] or {}).get("phase") == "done",
                   timeout=60, what="b's warm-up done")

        def plan_of_b():
            return [s for s in receiver.spans()
                    if s["name"] == "warmup.plan" and s["attrs"].get("prewarm.pod") == "b"]

        plans = wait_until(plan_of_b, timeout=30, what="b's plan span exported")
        assert len(plans) == 1, plans
        plan = plans[0]
        assert plan["parent"] in ("", "0" * 16), "a plan is a root"
        assert plan["service"] == "prewarm-gateway-e2e"
        a_ = plan["attrs"]
        assert a_["prewarm.outcome"] == "done"
        assert a_["prewarm.first_tier"] >= 1 and a_["prewarm.first_tier_seconds"] >= 0
        assert a_["prewarm.arms"] == ""

        served = completions_served(b_url)
        assert served >= a_["prewarm.first_tier"]

        def children():
            kids = [s for s in receiver.spans() if s["parent"] == plan["span_id"]]
            return kids if len(kids) >= served else None

        kids = wait_until(children, timeout=30, what="every prefill of b's plan exported")
        assert len(kids) == served, (len(kids), served)
        for k in kids:
            assert k["name"] == "warmup.prefill"
            assert k["trace_id"] == plan["trace_id"]
            attrs = k["attrs"]
            assert attrs["prewarm.pod"] == "b" and attrs["prewarm.source"] == "plan"
            assert attrs["prewarm.model"] == BASE and attrs["prewarm.key"] in keys
            assert attrs["prewarm.outcome"] == "ok"
            assert attrs["prewarm.tokens"] >= 64 and attrs["prewarm.latency_ms"] > 0
        # Nothing but warm-up spans leaves the gateway.
        assert {s["name"] for s in receiver.spans()} <= {"warmup.plan", "warmup.prefill", "warmup.adapter"}
    finally:
        gw.proc.stop()
        a.stop()
        b.stop()
        receiver.stop()
