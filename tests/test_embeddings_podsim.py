"""podsim's `/v1/embeddings` through the real Envoy and filter (issue 19, item 5): the reply is
the pod's own, byte for byte in its vectors, bad bodies come back as the pod's 4xx naming the
field, and `prewarm-replay embeddings` drives a bounded ShareGPT/Zipf workload through it."""
from __future__ import annotations

import json
import subprocess

import pytest
import requests

from harness import REPO, bin_path
from harness.stack import BASE_MODEL, Stack, StackSpec

SHAREGPT = REPO.parent / "shared" / "traces" / "sharegpt-500" / "prompts.json"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("stack"), StackSpec(pods=1, podsim_flags=["--time-scale", "50"]))
    s.start()
    yield s
    s.close()


def test_embeddings_through_envoy_are_the_pods_vectors(stack):
    body = {"model": BASE_MODEL, "input": ["How do I reset my password?", "sunny Lisbon"]}
    status, _, via = stack.post("/v1/embeddings", body)
    assert status == 200, via[:300]
    direct = requests.post(f"{stack.pods[0].url}/v1/embeddings", json=body, timeout=30)
    assert direct.status_code == 200, direct.text
    got, want = json.loads(via), direct.json()
    assert got["object"] == "list" and len(got["data"]) == 2
    assert [d["embedding"] for d in got["data"]] == [d["embedding"] for d in want["data"]]
    assert got["usage"] == want["usage"]
    assert len(got["data"][0]["embedding"]) == 384


@pytest.mark.parametrize("body,param", [
    ({"model": BASE_MODEL}, "input"),
    ({"model": BASE_MODEL, "input": "x", "dimensions": 0}, "dimensions"),
    ({"model": BASE_MODEL, "input": "x", "encoding_format": "hex"}, "encoding_format"),
])
def test_bad_embeddings_bodies_get_the_pods_400(stack, body, param):
    status, _, reply = stack.post("/v1/embeddings", body)
    assert status == 400, reply[:300]
    assert json.loads(reply)["error"]["param"] == param


def test_replay_embeddings_workload_runs_bounded(stack):
    out = subprocess.run(
        [str(bin_path("prewarm-replay")), "embeddings", "--prompts", str(SHAREGPT),
         "--target", stack.envoy.url, "--model", BASE_MODEL, "--requests", "60", "--rate", "300",
         "--batch", "2", "--zipf-s", "1.1", "--seed", "5", "--duration", "60"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["sent"] == 60 and summary["failed"] == 0, summary
    assert 0.0 < summary["repeat_share"] < 1.0
    bad = subprocess.run([str(bin_path("prewarm-replay")), "embeddings", "--prompts", str(SHAREGPT),
                          "--target", stack.envoy.url, "--zipf-s", "9"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 64 and "--zipf-s" in bad.stderr
