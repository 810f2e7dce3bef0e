"""Fixtures shared by the test files that run the filter in a real Envoy against fake pods and
a fake gateway (tests/harness/fake_servers.py): `envoys` (Envoy processes, closed after the
test), `gateway` (a fake gateway serving tables and collecting batches) and `fake_pods(n)` (n
fake upstream pods `pod0..`, stopped after the test). A test file's own fixture of the same name
takes precedence."""
import pytest

from harness.envoy import EnvoyFleet
from harness.fake_servers import FakeGateway, FakeUpstream


@pytest.fixture
def envoys(tmp_path):
    fleet = EnvoyFleet(tmp_path)
    yield fleet
    fleet.close()


@pytest.fixture
def gateway():
    g = FakeGateway().start()
    yield g
    g.stop()


@pytest.fixture
def fake_pods():
    started = []

    def start(n: int) -> list:
        servers = [FakeUpstream(f"pod{i}").start() for i in range(n)]
        started.extend(servers)
        return servers

    yield start
    for s in started:
        s.stop()
