"""End to end, whole stack: the official OpenAI Python client (from the project's .venv) chats and
streams through Envoy with the filter, exactly as it does against the pod directly."""
from __future__ import annotations

import openai
import pytest
import requests

from harness import wait_until
from harness.stack import AdapterSpec, BASE_MODEL, Stack, StackSpec
from harness.stack import question_text as question

MESSAGES = [{"role": "system", "content": question(3, 0)}, {"role": "user", "content": "What is new?"}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("stack"),
              StackSpec(pods=2, podsim_flags=["--time-scale", "50"], adapters=[AdapterSpec("sql-lora", tier="gold")]))
    s.start()
    yield s
    s.close()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.mark.parametrize("model", [BASE_MODEL, "sql-lora"])
def test_chat_is_what_the_pod_answers(stack, model):
    direct = client(stack.pods[0].url).chat.completions.create(model=model, messages=MESSAGES, max_tokens=5)
    via = client(stack.envoy.url).chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, max_tokens=5, extra_headers={"x-prewarm-user": "alice"})
    reply = via.parse()
    assert stack.pod_by_address(via.headers["x-prewarm-upstream"]) is not None
    assert reply.choices[0].message.content == direct.choices[0].message.content
    assert reply.choices[0].finish_reason == direct.choices[0].finish_reason == "length"
    assert reply.model == model
    assert reply.usage.prompt_tokens == direct.usage.prompt_tokens
    assert reply.usage.completion_tokens == 5


def test_streaming_chat_and_completion_arrive_whole(stack):
    routed = stack.envoy.metric("prewarm_filter_routed_total")
    c = client(stack.envoy.url)
    chunks = list(c.chat.completions.create(model=BASE_MODEL, messages=MESSAGES, max_tokens=6, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == 6 and len(text) > 0
    direct = client(stack.pods[0].url).completions.create(model=BASE_MODEL, prompt=question(4, 1), max_tokens=4)
    streamed = list(c.completions.create(model=BASE_MODEL, prompt=question(4, 1), max_tokens=4, stream=True))
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == direct.choices[0].text
    assert streamed[-1].choices[0].finish_reason == "length"
    assert stack.envoy.metric("prewarm_filter_routed_total") == routed + 2


def test_client_errors_pass_through_unchanged(stack):
    with pytest.raises(openai.NotFoundError) as via:
        client(stack.envoy.url).chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=2)
    with pytest.raises(openai.NotFoundError) as direct:
        client(stack.pods[0].url).chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=2)
    assert via.value.body == direct.value.body
    with pytest.raises(openai.BadRequestError) as bad:
        client(stack.envoy.url).chat.completions.create(model=BASE_MODEL, messages=MESSAGES, max_tokens=0)
    assert bad.value.body["param"] == "max_tokens"


def test_routed_requests_reach_the_gateways_kv_model(stack):
    """The filter's served records (which pod each routed request went to) arrive with its
    batches, and the gateway's KV model of that pod holds the prompt's shards: before the fleet
    core, the shipped gateway never fed served traffic to its KV model."""
    sent = stack.envoy.metric("prewarm_filter_served_sent_total")
    via = client(stack.envoy.url).completions.with_raw_response.create(
        model=BASE_MODEL, prompt=question(6, 2), max_tokens=2)
    pod = stack.pod_by_address(via.headers["x-prewarm-upstream"])
    assert pod is not None
    wait_until(lambda: stack.envoy.metric("prewarm_filter_served_sent_total") > sent, timeout=15,
               what="the served record sent with a batch")
    detail = wait_until(lambda: (d := stack.gateway.get(f"/admin/pods/{pod.id}").json())["resident_shards"] > 0
                        and d, timeout=15, what="the pod's KV model to hold the prompt's shards")
    assert detail["modelled_hit_ratio"] is not None
    # The same prompt again, a hit in the pod's cache and in the model: once the pod's
    # prefix-cache counters are scraped, the model's hit ratio over that interval is the pod's,
    # up to block rounding (the model counts 512-token shards, podsim 16-token blocks).
    for _ in range(3):
        again = client(stack.envoy.url).completions.with_raw_response.create(
            model=BASE_MODEL, prompt=question(6, 2), max_tokens=2)
        assert stack.pod_by_address(again.headers["x-prewarm-upstream"]) is pod

    def gap():
        text = requests.get(f"{stack.gateway.url}/metrics", timeout=10).text
        line = next(l for l in text.splitlines() if l.startswith(f'prewarm_kv_model_hit_gap{{pod="{pod.id}"}}'))
        return float(line.rsplit(" ", 1)[1])
    wait_until(lambda: abs(gap()) < 0.2, timeout=15, what="the KV model's hit ratio to match the pod's")
