"""Success feedback end to end (issue 20, item 5): the real Envoy and filter, the real gateway, a
podsim pod. Once a user's template is hot, each request that uses it and gets a successful
answer — JSON or streamed, a `length` stop counting only when the request asked for
`max_tokens` — is `succeeded` feedback, and the gateway's prompt pool counts it (`successes`)
beside the adopted uses; failed answers are not."""
from __future__ import annotations

import pytest

from harness import wait_until
from harness.stack import BASE_MODEL, Stack, StackSpec, question_text


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("stack"), StackSpec(pods=1, podsim_flags=["--time-scale", "50"],
                                                           filter_config={"tick_period_ms": 200}))
    s.start()
    yield s
    s.close()


def pool_entry(stack: Stack, template: int) -> dict | None:
    prompts = stack.gateway.get("/admin/prompts?k=100").json()["prompts"]
    marker = question_text(template, 0)[:40]
    return next((p for p in prompts if p["preview"].startswith(marker)), None)


def test_successful_answers_to_a_hot_template_raise_its_successes(stack):
    for k in range(3):  # three similar prompts: the template becomes hot (a prefill signal)
        stack.completion(question_text(0, k), user="alice", max_tokens=1)
    wait_until(lambda: pool_entry(stack, 0) is not None, 15, what="the template in the pool")
    assert pool_entry(stack, 0)["successes"] == 0
    # two JSON answers stopped at the max_tokens they asked for, one streamed
    stack.completion(question_text(0, 3), user="alice", max_tokens=1)
    stack.completion(question_text(0, 4), user="alice", max_tokens=2)
    status, _, body = stack.post("/v1/completions", {"model": BASE_MODEL, "prompt": question_text(0, 5),
                                                      "max_tokens": 2, "stream": True}, user="alice")
    assert status == 200 and b"finish_reason" in body
    # an error answer to the hot template is no success
    status, _, _ = stack.post("/v1/completions", {"model": BASE_MODEL, "prompt": question_text(0, 6),
                                                   "max_tokens": -1}, user="alice")
    assert status == 400
    wait_until(lambda: pool_entry(stack, 0)["successes"] >= 3, 15, what="three successes")
    entry = pool_entry(stack, 0)
    assert entry["successes"] == 3, entry
    assert entry["adoptions"] >= 3, entry
    assert stack.envoy.wasm_failures() == {}
