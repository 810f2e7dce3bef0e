"""Chat traffic through the whole stack against real vLLM: Envoy + filter .wasm + gateway + two
vLLM pods serving the tiny Llama of tools/vllm/make_model.py with a chat template of Llama 3's
layout (tools/chat_templates/llama3.jinja: BOS, role headers, the knowledge-date lines in the
system turn, end-of-turn tokens) — a template that renders nothing like prewarm's canonical
`<|role|>` rendering. Skipped without `make setup-vllm`.

Applications send chat requests: a long system prompt each, a short question. A pod joins; the
gateway warms it with calls in the traffic's own shape (the prefix messages through
`/v1/chat/completions`, `continue_final_message`); each application's next request that Envoy
sends to the new pod must find its system prompt in vLLM's own prefix cache
(`usage.prompt_tokens_details.cached_tokens`). Three kinds of senders make the prefixes hot:
one user per application sending a streak, one-shot users (every request a new user), and no user
at all — the last two only through the filter's count of prefixes hot across users.
"""
from __future__ import annotations

import pytest

from harness import wait_until
from harness.stack import StackSpec, cached_tokens, template_text
from harness.vllm import VllmStack, requires_vllm

pytestmark = requires_vllm

APPLICATIONS = range(8)
SYSTEM_BYTES = 64 * 4 * 14
"""A system prompt: 14 fingerprint blocks of pseudo-words (~2 k vLLM tokens of this tokenizer)."""


def messages(app: int, k: int) -> list[dict]:
    return [{"role": "system", "content": template_text(app, SYSTEM_BYTES)},
            {"role": "user", "content": f"Question {k}: how do I reset item {k * 7 + app}?"}]


def sender(who: str, app: int, k: int):
    return {"streak": f"user-{app}", "one_shot": f"visitor-{app}-{k}", "no_user": None}[who]


@pytest.mark.parametrize("who", ["streak", "one_shot", "no_user"])
def test_a_joining_vllm_pod_warmed_for_chat_traffic_finds_its_first_chat_requests_cached(tmp_path, who):
    stack = VllmStack(tmp_path, StackSpec(pods=1, spare_pods=1)).start()
    try:
        for app in APPLICATIONS:
            for k in range(3):
                stack.chat(messages(app, k), user=sender(who, app, k))
        wait_until(lambda: stack.gateway.get("/admin/prompts?k=100").json()["total"] >= len(APPLICATIONS), 30,
                   what="every application's system prompt hot in the gateway")

        new, _ = stack.join_warmed(0)

        firsts = []
        for app in APPLICATIONS:
            pod, reply = stack.chat(messages(app, 99), user=None if who == "no_user" else f"fresh-{app}")
            if pod is new:
                usage = reply["usage"]
                firsts.append((app, cached_tokens(reply), usage["prompt_tokens"]))
        table = stack.routing()
        assert firsts, ("no application moved to the new pod; the table's pods (id, load, wait_ms), "
                        f"load factor and placed prefixes: {[(p['id'], p.get('load'), p.get('wait_ms')) for p in table['pods']]}, "
                        f"{table.get('load_factor')}, {[(p['pod'], len(p['keys'])) for p in table.get('prefixes', [])]}")
        print(f"\n{who}: new pod's first chat requests (app, cached, prompt tokens): {firsts}")
        with_cache = [f for f in firsts if f[1] > 0]
        assert len(with_cache) == len(firsts), firsts
        share = sum(c for _, c, _ in firsts) / sum(p for _, _, p in firsts)
        # What cannot be cached: the question, the vLLM block the question starts in, and the
        # fingerprint block where the warmed prefix is cut (at most 64 canonical tokens).
        assert share >= 0.8, (share, firsts)
    finally:
        stack.close()
