"""The filter's configuration in a real Envoy: an invalid configuration is refused at
on_configure with a log line naming the field, the value and the rule, and Envoy does not come
up with it; the shipped envoy/envoy.yaml (with the filter's documented defaults) starts and
serves."""
import pytest

from harness.envoy import Envoy
from harness.fake_servers import FakeGateway, FakeUpstream


@pytest.mark.parametrize(
    "config, logged",
    [
        ({"tick_period_ms": 0}, "invalid configuration: tick_period_ms: 0: must be between 10 and 60000"),
        ({"triggers": {"similarity_threshold": 1.5}}, "invalid configuration: triggers.similarity_threshold: 1.5: must be in (0, 1]"),
        ({"block_tokens": 48}, "invalid configuration: block_tokens: 48: must be a divisor of 512"),
        ({"max_body_bytes": "big"}, 'invalid configuration: max_body_bytes: "big": invalid type'),
        ({"endpoint_hedaer": "x"}, "invalid configuration: endpoint_hedaer: \"x\": unknown field `endpoint_hedaer`"),
    ],
)
def test_invalid_configuration_is_refused_naming_the_field(config, logged, tmp_path):
    envoy = Envoy(tmp_path, filter_config=config)
    envoy.start(expect_failure=True)
    try:
        code = envoy.wait_exit(timeout=60)
    finally:
        envoy.stop()
    assert code != 0, "Envoy must not come up with a refused filter configuration"
    assert logged in envoy.output(), envoy.output()[-3000:]


def test_shipped_configuration_starts_with_documented_defaults(envoys):
    pod, gateway = FakeUpstream("pod").start(), FakeGateway().start()
    try:
        envoy = envoys.start(pods=[pod.address], gateway=gateway.address)
        status, _, _ = envoy.post("/v1/completions", {"model": "m", "prompt": "hello"})
        assert status == 200
        assert envoy.metric("prewarm_filter_requests_inspected_total") == 1
        assert "invalid configuration" not in envoy.output()
    finally:
        pod.stop()
        gateway.stop()
