"""Longest-prefix routing through the filter in a real Envoy (docs/routing.md): conversations
that share a 2,000-token system prompt go to the pods holding it and spread over more pods as
those fill, and each conversation's next turn reaches the pod its first turn reached — the prefix index the filter keeps in shared data, one
key per slot, written on every routed request. The fake gateway serves tables whose loads follow
what each pod received (as the gateway's health rounds report them) with a bounded-load factor."""
import pytest

from harness.fake_servers import FakeGateway, FakeUpstream

CONVERSATIONS = 8
SYSTEM = "You are a careful assistant for the travel desk; answer briefly. " * 130  # ~8.5 KB


@pytest.fixture
def pods(fake_pods):
    return fake_pods(4)


def table(pods, generation, loads):
    return {
        "version": "1.0",
        "generation": generation,
        "block_tokens": 64,
        "load_factor": 1.25,
        "pods": [{"id": f"pod-{i}", "address": p.address, "load": load}
                 for i, (p, load) in enumerate(zip(pods, loads))],
    }


def first_turn(c):
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Conversation {c}: which trains leave Lyon before noon? " * 12}]


def second_turn(c):
    return first_turn(c) + [
        {"role": "assistant", "content": f"For conversation {c}: three trains, at 8:04, 9:30 and 11:12. " * 6},
        {"role": "user", "content": "And which of them has a dining car? " * 10},
    ]


def receiver(pods, before):
    grown = [i for i, (p, n) in enumerate(zip(pods, before)) if len(p.received()) > n]
    assert len(grown) == 1, grown
    return grown[0]


def serve(envoys, envoy, gateway, tbl):
    adopted = envoy.metric("prewarm_filter_table_adopted_total")
    gateway.table = tbl
    envoys.wait_table(envoy, tbl["generation"], adopted)


def test_conversations_sharing_a_system_prompt_spread_and_their_turns_stick(envoys, pods, gateway):
    generation = 1
    gateway.table = table(pods, generation, [0.0] * len(pods))
    envoy = envoys.start(pods=[p.address for p in pods], gateway=gateway.address,
                         filter_config={"tick_period_ms": 200})
    envoys.wait_table(envoy, generation)
    where = []
    for c in range(CONVERSATIONS):
        before = [len(p.received()) for p in pods]
        status = envoy.post("/v1/chat/completions", {"model": "base", "messages": first_turn(c)})[0]
        assert status == 200
        where.append(receiver(pods, before))
        # the gateway's next table: each pod's busy share grows with its conversations (half
        # busy with two), so they reach more pods as the ones holding the system prompt fill
        generation += 1
        loads = [min(1.0, where.count(i) / 4) for i in range(len(pods))]
        serve(envoys, envoy, gateway, table(pods, generation, loads))
    assert len(set(where)) >= 3, f"new conversations on pods {where}"
    matched = envoy.metric("prewarm_filter_prefix_matched_total")
    # loads even again: every next turn goes where its conversation's first turn went
    generation += 1
    serve(envoys, envoy, gateway, table(pods, generation, [0.25] * len(pods)))
    for c in range(CONVERSATIONS):
        before = [len(p.received()) for p in pods]
        status = envoy.post("/v1/chat/completions", {"model": "base", "messages": second_turn(c)})[0]
        assert status == 200
        assert receiver(pods, before) == where[c], f"conversation {c}"
    assert envoy.metric("prewarm_filter_prefix_matched_total") == matched + CONVERSATIONS
    assert envoy.metric("prewarm_filter_prefix_write_failures_total") == 0
    assert envoy.metric("prewarm_filter_routed_total") == 2 * CONVERSATIONS
