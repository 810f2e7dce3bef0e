"""podsim against the official OpenAI Python client and plain HTTP, as a real process."""
from __future__ import annotations

import signal

import openai
import pytest
import requests

from harness import wait_until
from harness.podsim import make_adapter, start_podsim

BASE = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
def pod(tmp_path):
    adapters = tmp_path / "adapters"
    sql = make_adapter(adapters, "sql-lora", rank=8)
    proc, url = start_podsim(
        tmp_path,
        "--enable-lora", "--max-loras", "1", "--max-cpu-loras", "2",
        "--lora-modules", f"sql-lora={sql}",
        "--enable-prompt-tokens-details", "--time-scale", "20",
    )
    yield proc, url, adapters
    assert proc.stop() == 0


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


def llama31(system: str, turns: str) -> str:
    """Llama 3.1 instruct's layout (podsim's built-in chat template): a BOS, a system turn with
    the knowledge and today dates, then the turns."""
    return ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
            f"{system.strip()}<|eot_id|>{turns}")


def test_chat_completion_with_the_openai_client(pod):
    _, url, _ = pod
    system = "You answer with SQL only. " * 10
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "count users"}]
    first = client(url).chat.completions.create(model="sql-lora", messages=messages, max_tokens=5)
    assert first.object == "chat.completion"
    assert first.model == "sql-lora"
    assert first.choices[0].finish_reason == "length"
    assert first.choices[0].message.role == "assistant"
    assert len(first.choices[0].message.content) == 20  # 5 tokens of 4 bytes
    # The prompt is the chat template's rendering, not prewarm's canonical one.
    rendered = llama31(system, "<|start_header_id|>user<|end_header_id|>\n\ncount users<|eot_id|>"
                               "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert first.usage.prompt_tokens == -(-len(rendered) // 4)
    assert first.usage.completion_tokens == 5
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = client(url).chat.completions.create(model="sql-lora", messages=messages, max_tokens=1)
    assert again.usage.prompt_tokens_details.cached_tokens == (first.usage.prompt_tokens - 1) // 16 * 16


def test_streaming_chat_delivers_tokens_usage_and_done(pod):
    _, url, _ = pod
    stream = client(url).chat.completions.create(
        model=BASE,
        messages=[{"role": "user", "content": "stream please"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(content) == 24
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_list_models_shows_base_and_adapters(pod):
    _, url, adapters = pod
    models = client(url).models.list()
    ids = [m.id for m in models.data]
    assert ids == [BASE, "sql-lora"]
    card = models.data[1].model_dump()
    assert card["parent"] == BASE and card["root"] == str(adapters / "sql-lora")
    assert card["owned_by"] == "vllm"


def test_errors_reach_the_client_as_typed_exceptions(pod):
    _, url, _ = pod
    with pytest.raises(openai.NotFoundError) as e:
        client(url).completions.create(model="nope", prompt="x", max_tokens=1)
    assert e.value.status_code == 404
    assert e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError):
        client(url).completions.create(model=BASE, prompt="x", max_tokens=0)


def test_runtime_lora_load_then_prefix_warm_up_then_metrics(pod):
    _, url, adapters = pod
    path = make_adapter(adapters, "chat-lora", rank=16)
    r = requests.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "chat-lora", "lora_path": str(path)}, timeout=10)
    assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'chat-lora' added successfully.")
    system = "Warm me up please. " * 8
    # A completion of prewarm's canonical rendering warms nothing a chat request uses.
    canonical = client(url).completions.create(
        model="chat-lora", prompt=f"<|system|>\n{system}\n<|user|>\nhi there", max_tokens=1)
    assert canonical.usage.prompt_tokens_details.cached_tokens == 0
    # A chat warm call of the prefix: the last message cut and left open.
    warm = client(url).chat.completions.create(
        model="chat-lora",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
        max_tokens=1,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    assert warm.usage.prompt_tokens_details.cached_tokens == 0
    open_prefix = llama31(system, "<|start_header_id|>user<|end_header_id|>\n\nhi")
    assert warm.usage.prompt_tokens == -(-len(open_prefix) // 4)
    chat = client(url).chat.completions.create(
        model="chat-lora",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "hi there"}],
        max_tokens=1,
    )
    cached = chat.usage.prompt_tokens_details.cached_tokens
    assert cached == len(open_prefix) // 64 * 16 > 0, (cached, warm.usage)
    with pytest.raises(openai.BadRequestError) as e:
        client(url).chat.completions.create(
            model="chat-lora", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
            extra_body={"continue_final_message": True, "add_generation_prompt": True})
    assert "continue_final_message" in e.value.body["message"]
    metrics = requests.get(f"{url}/metrics", timeout=10).text
    assert 'vllm:lora_requests_info{max_lora="1"' in metrics
    hits = [l for l in metrics.splitlines() if l.startswith("vllm:prefix_cache_hits_total{")]
    assert hits and float(hits[0].rsplit(" ", 1)[1]) > 0


def test_sigterm_drains_and_exits_cleanly(tmp_path):
    proc, url = start_podsim(tmp_path, "--time-scale", "5", name="drain")
    assert requests.get(f"{url}/health", timeout=5).status_code == 200
    proc.signal(signal.SIGTERM)
    wait_until(lambda: not proc.alive(), timeout=10, what="podsim exit")
    assert proc.stop() == 0
    assert "podsim listening on http://127.0.0.1:" in proc.output()


def test_bad_flags_exit_64_naming_the_flag(tmp_path):
    import subprocess
    from harness import bin_path

    out = subprocess.run(
        [str(bin_path("podsim")), "--port", "0", "--block-size", "12", "--profile", "gpt"],
        capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 64
    assert "--block-size: 12:" in out.stderr and "--profile: gpt:" in out.stderr
