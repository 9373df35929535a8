"""The data policy in the path, through the local runner (``--data-policy FILE``).

A conversation's class rises (a turn's ``data_class``, a detector); every model call
of a classed conversation is routed by its class (``policy_decision`` events), and a
class with no allowed model is ``422 data_policy_unsatisfied`` with nothing stored; a
class without provider state makes every later call ``fresh``, ``store: false`` and
without ``previous_response_id``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig

from tests.functional.fake_openai import FakeOpenAI
from tests.functional.http_sink import HttpSink, Reply
from tests.http.conftest import ANN, start
from tests.http.test_http_runner_log import free_port
from tests.support.wire_demo import responses_demo

#: A card number the policy's detector knows (a test number, not a real card).
CARD = "4111111111111111"

POLICY: dict[str, Any] = {
    "version": "2026-12-06",
    "classes": [
        {"name": "public"},
        {
            "name": "pii",
            "models": ["demo-2"],
            "allow_fallbacks": True,
            "provider_state": False,
            "tools": ["crm_lookup"],
            "read_scope": "turnledger/pii",
        },
        {"name": "strict", "models": ["demo-2"], "allow_fallbacks": False},
    ],
    "detectors": [{"class": "pii", "name": "card", "pattern": "\\b4[0-9]{15}\\b"}],
}


@contextmanager
def serve(
    clock: ClockFile, tmp_path: Path, policy: dict[str, Any] | None = None, **overrides: Any
) -> Iterator[httpx.Client]:
    suffix = uuid.uuid4().hex[:8]
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps(policy or POLICY))
    env = {"DATA_POLICY_FILE": str(policy_file), "ALLOWED_MODELS": "demo-1,demo-2"}
    env.update(overrides.pop("env", {}))
    defaults = LocalConfig(
        port=0, ttl_seconds=3600, table=f"dp-{suffix}", bucket=f"dp-{suffix}", env=env
    )
    yield from start(dataclasses.replace(defaults, **overrides), clock)


def post_turn(
    http: httpx.Client, conversation: str, text: str, headers: dict[str, str] = ANN, **body: Any
) -> httpx.Response:
    return http.post(
        f"/v1/conversations/{conversation}/turns", json={"input": text, **body}, headers=headers
    )


def events_of(
    http: httpx.Client, conversation: str, headers: dict[str, str] = ANN
) -> list[dict[str, Any]]:
    page = http.get(f"/v1/conversations/{conversation}/events", headers=headers)
    assert page.status_code == 200, page.text
    events: list[dict[str, Any]] = page.json()["events"]
    return events


def test_a_pii_turn_is_answered_by_the_class_model_and_the_choice_is_recorded(
    runner_clock: ClockFile, tmp_path: Path
) -> None:
    with serve(runner_clock, tmp_path) as http:
        plain = post_turn(http, "r", "Hello.", model="demo-1")
        assert plain.status_code == 200, plain.text
        assert "data_class" not in http.get("/v1/conversations/r", headers=ANN).json()

        answered = post_turn(http, "r", "My id is on file.", model="demo-1", data_class="pii")
        assert answered.status_code == 200, answered.text
        events = events_of(http, "r")
        [raised] = [e for e in events if e["kind"] == "data_class_raised"]
        assert raised["payload"] == {
            "previous": None,
            "to": "pii",
            "source": "turn",
            "policy_version": "2026-12-06",
        }
        [decision] = [e for e in events if e["kind"] == "policy_decision"]
        assert decision["payload"]["class"] == "pii"
        assert decision["payload"]["policy_version"] == "2026-12-06"
        assert decision["payload"]["chosen"] == "demo-2"
        assert decision["payload"]["rejected"] == [
            {"model": "demo-1", "reason": "the class does not allow this model"}
        ]
        answer = [e for e in events if e["kind"] == "assistant_message"][-1]
        assert answer["payload"]["run"]["model"] == "demo-2"
        assert http.get("/v1/conversations/r", headers=ANN).json()["data_class"] == "pii"

        # The state route's may_send answers under the policy (issue 42's fourth question).
        may_send = http.get("/v1/conversations/r/state", headers=ANN).json()["may_send"]
        assert may_send["data_class"] == "pii"
        assert may_send["policy_version"] == "2026-12-06"
        assert may_send["allowed_models"] == ["demo-2"]
        assert may_send["provider_state"] is False

        # A caller may raise the class, never lower it.
        post_turn(http, "r", "Still here.", data_class="public")
        assert http.get("/v1/conversations/r", headers=ANN).json()["data_class"] == "pii"

        unknown = post_turn(http, "r", "Hi.", data_class="topsecret")
        assert unknown.status_code == 422
        assert unknown.json()["error"]["code"] == "unknown_data_class"

        # A replay compares the model it names: one the class forbids is refused.
        replays = "/v1/conversations/r/replays"
        refused = http.post(replays, json={"provider": "demo", "model": "demo-1"}, headers=ANN)
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["details"]["rejected"] == [
            {"model": "demo-1", "reason": "the class does not allow this model"}
        ]
        allowed = http.post(replays, json={"provider": "demo", "model": "demo-2"}, headers=ANN)
        assert allowed.status_code in (200, 201, 202), allowed.text


def test_a_class_without_fallbacks_refuses_and_stores_nothing(
    runner_clock: ClockFile, tmp_path: Path
) -> None:
    with serve(runner_clock, tmp_path) as http:
        assert post_turn(http, "s", "Hello.").status_code == 200
        before = http.get("/v1/conversations/s", headers=ANN).json()
        events_before = events_of(http, "s")

        refused = post_turn(http, "s", "A secret.", model="demo-1", data_class="strict")
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "data_policy_unsatisfied"
        assert error["details"]["class"] == "strict"
        assert error["details"]["rejected"] == [
            {"model": "demo-1", "reason": "the class does not allow this model"},
            {"model": "demo-2", "reason": "the class allows no fallback"},
        ]
        assert http.get("/v1/conversations/s", headers=ANN).json() == before
        assert events_of(http, "s") == events_before

        # The requested model the class allows answers.
        allowed = post_turn(http, "s", "A secret.", model="demo-2", data_class="strict")
        assert allowed.status_code == 200, allowed.text


def test_a_detected_card_number_makes_every_later_stateful_turn_fresh(
    runner_clock: ClockFile, tmp_path: Path
) -> None:
    with serve(runner_clock, tmp_path, provider="demo-stateful", model="demo-2") as http:
        first = post_turn(http, "c", "My name is Ann.").json()
        assert first["context"]["provider_state"] == "fresh"
        second = post_turn(http, "c", "I live in Oslo.").json()
        assert second["context"]["provider_state"] == "continued"

        carded = post_turn(http, "c", f"My card is {CARD}.")
        assert carded.status_code == 200, carded.text
        assert carded.json()["context"]["provider_state"] == "fresh"
        view = http.get("/v1/conversations/c", headers=ANN).json()
        assert view["data_class"] == "pii"
        [raised] = [e for e in events_of(http, "c") if e["kind"] == "data_class_raised"]
        assert raised["payload"]["source"] == "detector:card"
        for text in ("What is my name?", "Where do I live?"):
            later = post_turn(http, "c", text).json()
            assert later["context"]["provider_state"] == "fresh"
            assert later["context"]["messages_sent"] > 1


def test_the_responses_provider_stores_nothing_once_the_class_forbids_it(
    runner_clock: ClockFile, tmp_path: Path
) -> None:
    policy = {
        **POLICY,
        "classes": [
            {"name": "public"},
            {"name": "pii", "provider_state": False},
        ],
    }
    with FakeOpenAI() as fake:
        fake.default = responses_demo(fake)
        env = {
            "OPENAI_BASE_URL": fake.base_url,
            "PROVIDER_MAX_RETRIES": "0",
            "ALLOWED_MODELS": "gpt-test",
        }
        with serve(
            runner_clock,
            tmp_path,
            policy,
            provider="openai-responses",
            model="gpt-test",
            env=env,
        ) as http:
            assert post_turn(http, "o", "My name is Ann.").status_code == 200
            assert post_turn(http, "o", "I live in Oslo.").json()["context"]["provider_state"] == (
                "continued"
            )
            stored = len([r for r in fake.requests if r.method == "POST"])

            carded = post_turn(http, "o", f"My card is {CARD}.")
            assert carded.status_code == 200, carded.text
            for text in ("What is my name?", "Where do I live?"):
                assert post_turn(http, "o", text).status_code == 200

            posted = [r.json() for r in fake.requests if r.method == "POST"]
            assert posted[1]["previous_response_id"] == "resp_fake_1"
            after = posted[stored:]
            assert len(after) == 3
            for body in after:
                assert body["store"] is False
                assert "previous_response_id" not in body
            # The response the provider kept for the conversation is deleted at the rise.
            deleted = [r.path for r in fake.requests if r.method == "DELETE"]
            assert deleted and deleted[0].endswith("/resp_fake_2")


def tools_file(tmp_path: Path, sink: HttpSink) -> Path:
    """Two ``http`` tools on ``sink``: ``crm_lookup`` (the ``pii`` class names it) and
    ``notes`` (it does not)."""
    tools = [
        {
            "name": name,
            "parameters": {"type": "object", "properties": {"card": {"type": "string"}}},
            "executor": {"type": "http", "url": sink.url(f"/{name}")},
        }
        for name in ("crm_lookup", "notes")
    ]
    path = tmp_path / "tools.json"
    path.write_text(json.dumps({"tools": tools}))
    return path


#: A reader holding the ``pii`` class's read scope (in place of the approver scope).
PII_READER = {"Authorization": "Bearer local:acme:ann;scope=turnledger/pii"}


def test_tokens_for_the_model_the_tools_and_readers_without_the_scope(
    runner_clock: ClockFile, tmp_path: Path
) -> None:
    with HttpSink() as sink:
        sink.respond("/crm_lookup", Reply(body={"customer": "Ann"}))
        sink.respond("/notes", Reply(body={"noted": True}))
        tools = tools_file(tmp_path, sink)
        with serve(runner_clock, tmp_path, tools_file=tools, model="demo-2") as http:
            text = "\n".join(
                f"/tool {name} {json.dumps({'card': CARD})}" for name in ("crm_lookup", "notes")
            )
            answered = post_turn(http, "t", text)
            assert answered.status_code == 200, answered.text
            assert CARD not in answered.text

            [crm] = sink.requests_for("/crm_lookup")
            [notes] = sink.requests_for("/notes")
            assert crm.json()["arguments"] == {"card": CARD}
            token = notes.json()["arguments"]["card"]
            assert token.startswith("[pii:card:") and CARD not in notes.body.decode()

            context = http.get("/v1/conversations/t/turns/1/context", headers=ANN)
            assert context.status_code == 200, context.text
            assert CARD not in context.text and token in context.text

            events = http.get("/v1/conversations/t/events", headers=ANN)
            assert CARD not in events.text and token in events.text
            exported = http.get("/v1/conversations/t/export", headers=ANN)
            assert exported.status_code == 200
            assert CARD not in exported.text and token in exported.text

            assert CARD in http.get("/v1/conversations/t/events", headers=PII_READER).text
            assert CARD in http.get("/v1/conversations/t/export", headers=PII_READER).text


def test_the_runner_log_holds_no_raw_value(tmp_path: Path) -> None:
    """The whole log of ``turnledger local --data-policy FILE`` (debug level) after turns,
    reads and an export of a conversation holding a card number never holds it."""
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps(POLICY))
    port = free_port()
    log = tmp_path / "runner.log"
    args = ["--port", str(port), "--data-policy", str(policy_file), "--log-level", "DEBUG"]
    env = {**os.environ, "ALLOWED_MODELS": "demo-1,demo-2"}
    with log.open("w") as out:
        runner = subprocess.Popen(
            [sys.executable, "-m", "turnledger_local.cli", "local", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        first = post_turn(http, "l", f"My card is {CARD}.", model="demo-1")
                        break
                    except httpx.TransportError:
                        assert time.monotonic() < deadline, log.read_text()
                        time.sleep(0.2)
                assert first.status_code == 200, first.text
                assert post_turn(http, "l", f"echo: {CARD}").status_code == 200
                assert post_turn(http, "l", CARD, data_class="strict").status_code == 422
                assert CARD in http.get("/v1/conversations/l/events", headers=PII_READER).text
                assert CARD in http.get("/v1/conversations/l/export", headers=PII_READER).text
        finally:
            runner.terminate()
            runner.wait(timeout=30)
    text = log.read_text(encoding="utf-8")
    assert "/v1/conversations/l/turns" in text or "conversation" in text, text[:2000]
    assert CARD not in text


#: An admin of the tenant (the data policy's admin scope in place of the approver scope).
ADMIN = {"Authorization": "Bearer local:acme:ada;scope=turnledger/admin"}


def test_a_tenant_sets_its_own_policy_versions_and_its_turns_obey_it(
    runner_clock: ClockFile, tmp_path: Path
) -> None:
    env = {"DATA_POLICY_ADMIN_SCOPE": "turnledger/admin"}
    with serve(runner_clock, tmp_path, env=env) as http:
        first = http.get("/v1/data-policy", headers=ANN)
        assert first.status_code == 200, first.text
        assert first.json()["source"] == "deployment"
        assert first.json()["policy"]["version"] == "2026-12-06"
        assert first.json()["versions"] == []

        own = {
            "version": "acme-1",
            "classes": [{"name": "public"}, {"name": "pii", "models": ["demo-1"]}],
            "detectors": POLICY["detectors"],
        }
        refused = http.put("/v1/data-policy", json=own, headers=ANN)
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "admin_scope_missing"
        invalid = http.put("/v1/data-policy", json={**own, "classes": []}, headers=ADMIN)
        assert invalid.status_code == 422
        assert invalid.json()["error"]["code"] == "validation_error"

        put = http.put("/v1/data-policy", json=own, headers=ADMIN)
        assert put.status_code == 200, put.text
        assert put.json()["source"] == "tenant"
        assert [v["number"] for v in put.json()["versions"]] == [1]
        second = http.put("/v1/data-policy", json={**own, "version": "acme-2"}, headers=ADMIN)
        assert [v["version"] for v in second.json()["versions"]] == ["acme-1", "acme-2"]
        assert http.get("/v1/data-policy", headers=ANN).json()["policy"]["version"] == "acme-2"

        # The tenant's policy routes its turns: pii goes to demo-1 now, not demo-2.
        answered = post_turn(http, "tp", f"My card is {CARD}.", model="demo-2")
        assert answered.status_code == 200, answered.text
        [decision] = [e for e in events_of(http, "tp") if e["kind"] == "policy_decision"]
        assert (decision["payload"]["chosen"], decision["payload"]["policy_version"]) == (
            "demo-1",
            "acme-2",
        )
        # Another tenant still has the deployment's.
        other = {"Authorization": "Bearer local:globex:bob"}
        assert http.get("/v1/data-policy", headers=other).json()["source"] == "deployment"


def test_an_export_too_large_to_answer_inline_holds_tokens_too(
    runner_clock: ClockFile, tmp_path: Path
) -> None:
    env = {"EXPORT_INLINE_MAX_BYTES": "200"}
    with serve(runner_clock, tmp_path, env=env) as http:
        assert post_turn(http, "x", f"My card is {CARD}.").status_code == 200
        linked = http.get("/v1/conversations/x/export", headers=ANN)
        assert linked.status_code == 303, linked.text
        fetched = httpx.get(linked.headers["Location"], timeout=30)
        assert fetched.status_code == 200
        assert "[pii:card:" in fetched.text and CARD not in fetched.text


def test_the_openai_face_takes_metadata_data_class_and_refuses_in_its_own_shape(
    runner_clock: ClockFile, tmp_path: Path
) -> None:
    with serve(runner_clock, tmp_path) as http:
        answered = http.post(
            "/openai/v1/responses",
            json={"model": "demo-1", "input": "Hi.", "metadata": {"data_class": "pii"}},
            headers=ANN,
        )
        assert answered.status_code == 200, answered.text
        conversation = answered.json()["conversation"]["id"]
        [decision] = [e for e in events_of(http, conversation) if e["kind"] == "policy_decision"]
        assert (decision["payload"]["class"], decision["payload"]["chosen"]) == ("pii", "demo-2")
        refused = http.post(
            "/openai/v1/responses",
            json={"model": "demo-1", "input": "Hi.", "metadata": {"data_class": "strict"}},
            headers=ANN,
        )
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "data_policy_unsatisfied"


def test_a_summary_of_a_classed_conversation_is_routed_too(
    runner_clock: ClockFile, tmp_path: Path
) -> None:
    env = {"CONTEXT_MAX_TOKENS": "60", "SUMMARIZER_MODEL": "demo-1"}
    with serve(runner_clock, tmp_path, env=env) as http:
        for n in range(6):
            said = post_turn(
                http, "sm", f"Turn {n}: some words to fill the context up.", data_class="pii"
            )
            assert said.status_code == 200, said.text
        events = events_of(http, "sm")
        assert any(e["kind"] == "context_compacted" for e in events)
        summaries = [
            e["payload"]
            for e in events
            if e["kind"] == "policy_decision" and e["payload"]["purpose"] == "summary"
        ]
        assert summaries
        for decision in summaries:
            assert decision["chosen"] == "demo-2"
            assert decision["rejected"][0]["model"] == "demo-1"
        for event in events:
            if event["kind"] == "context_compacted":
                assert event["payload"]["summarizer_model"] == "demo-2"


def test_a_tools_result_class_raises_the_conversation(
    runner_clock: ClockFile, tmp_path: Path
) -> None:
    with HttpSink() as sink:
        sink.respond("/crm_lookup", Reply(body={"customer": "Ann"}))
        sink.respond("/notes", Reply(body={"noted": True}))
        path = tools_file(tmp_path, sink)
        registry = json.loads(path.read_text())
        registry["tools"][0]["result_class"] = "pii"
        path.write_text(json.dumps(registry))
        with serve(runner_clock, tmp_path, tools_file=path, model="demo-2") as http:
            answered = post_turn(http, "rc", '/tool crm_lookup {"card": "none"}')
            assert answered.status_code == 200, answered.text
            assert http.get("/v1/conversations/rc", headers=ANN).json()["data_class"] == "pii"
            events = events_of(http, "rc")
            [raised] = [e for e in events if e["kind"] == "data_class_raised"]
            assert raised["payload"]["source"] == "tool:crm_lookup"
            assert raised["actor"] == "tool:crm_lookup"
            # The answer after the result is routed by the risen class.
            assert [e["kind"] for e in events][-2:] == ["policy_decision", "assistant_message"]


def test_an_imported_conversation_keeps_the_class_its_export_rose_to(
    runner_clock: ClockFile, tmp_path: Path
) -> None:
    """A class only rises: an export carried to another conversation (or tenant) by an
    import must not come back classless, every model and tool free to see it again."""
    with serve(runner_clock, tmp_path) as http:
        assert post_turn(http, "src", f"My card is {CARD}.").status_code == 200
        exported = http.get("/v1/conversations/src/export", headers=ANN)
        assert exported.status_code == 200, exported.text
        imported = http.post("/v1/conversations/copy/import", content=exported.text, headers=ANN)
        assert imported.status_code == 201, imported.text
        assert imported.json()["data_class"] == "pii"
        head = http.get("/v1/conversations/copy", headers=ANN).json()
        assert head["data_class"] == "pii"
        # Routed as the class says: its next turn goes to the class's model, not demo-1.
        answered = post_turn(http, "copy", "And now?", model="demo-1")
        assert answered.status_code == 200, answered.text
        [decision] = [
            e
            for e in events_of(http, "copy")
            if e["kind"] == "policy_decision" and e.get("imported") is None
        ]
        assert decision["payload"]["chosen"] == "demo-2"
        assert [r["model"] for r in decision["payload"]["rejected"]] == ["demo-1"]
