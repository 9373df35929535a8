"""Every turn read back over HTTP (issue 26), through the local runner, on the SQLite data
folder and on DynamoDB Local.

``GET .../turns/{n}`` answers any turn as the turn route answered it (answered, paused
for approval, continued by a decision, failed), follows a turn whose client went away
until it ends (``wait``), and ``GET .../turns`` pages a conversation's turns.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from turnledger.core.config import Settings
from turnledger.core.models import ConversationKey
from turnledger.runtime import Runtime
from turnledger.turn import drafts
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig, LocalRunner

from tests.http.conftest import ANN, BOB, on_storage, store_of
from tests.support.worker_hooks import FAIL_MID_STREAM

pytestmark = pytest.mark.http

ROOT = Path(__file__).resolve().parents[2]
#: 60 words: with a 20 ms delay per word the answer takes more than a second to write.
WORDS = " ".join(f"word{i}" for i in range(60))
EMAIL = '/tool send_email {"to": "bob@example.com"}'


@pytest.fixture(params=["sqlite", pytest.param("ddb", marks=pytest.mark.integration)])
def runner(
    request: pytest.FixtureRequest,
    runner_config: LocalConfig,
    runner_clock: ClockFile,
    tmp_path: Path,
) -> Iterator[LocalRunner]:
    """A runner with the sample tools and a slow demo model (chunks every 100 ms), whose
    demo fails mid-answer on :data:`FAIL_MID_STREAM`, on each storage."""
    config = dataclasses.replace(
        runner_config,
        clock_file=runner_clock.path,
        tools_file=ROOT / "events" / "local-tools.json",
        worker_hook="tests.support.worker_hooks:demo_fails_mid_stream",
        # Drafts begin after 200 ms: these turns (60 words, 20 ms each) are followed, and
        # cancelled, through drafts begun while they run (SYNC_DRAFT_AFTER_MS).
        env={"DEMO_TOKEN_DELAY_MS": "20", "DRAFT_FLUSH_MS": "100", "SYNC_DRAFT_AFTER_MS": "200"},
    )
    with LocalRunner(on_storage(config, request, tmp_path / "data")) as served:
        yield served


@pytest.fixture
def client(runner: LocalRunner) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=runner.url, timeout=30) as http:
        yield http


def post(client: httpx.Client, conversation: str, text: str) -> httpx.Response:
    return client.post(f"/v1/conversations/{conversation}/turns", json={"input": text}, headers=ANN)


def read(client: httpx.Client, conversation: str, turn: int, **query: Any) -> httpx.Response:
    return client.get(f"/v1/conversations/{conversation}/turns/{turn}", params=query, headers=ANN)


def page(client: httpx.Client, conversation: str, **query: Any) -> dict[str, Any]:
    answer = client.get(f"/v1/conversations/{conversation}/turns", params=query, headers=ANN)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def forget_drafts(runner: LocalRunner, conversation: str, turns: range) -> None:
    """Delete the turns' draft state items, as for turns run before drafts were written."""
    store = Runtime.from_settings(Settings.from_env(runner.environment)).store
    key = ConversationKey(tenant="acme", conversation_id=conversation)
    store.delete_side_items(key, [drafts.state_key(n) for n in turns])


def test_a_synchronous_turn_reads_back_as_its_own_answer(
    client: httpx.Client, runner: LocalRunner
) -> None:
    answered = post(client, "sync-1", "My name is Ann.")
    assert answered.status_code == 200, answered.text
    paused = post(client, "sync-1", EMAIL)
    assert paused.json()["status"] == "awaiting_approval"
    # Each GET is the turn's own answer, field for field.
    assert (read(client, "sync-1", 1).status_code, read(client, "sync-1", 1).json()) == (
        200,
        answered.json(),
    )
    assert read(client, "sync-1", 2).json() == paused.json()
    [call] = paused.json()["pending_tool_calls"]
    approved = client.post(
        "/v1/conversations/sync-1/approvals", json={"approve": [call["id"]]}, headers=ANN
    )
    assert approved.status_code == 200, approved.text
    assert approved.json()["output_text"].startswith("Tool results: send_email:")
    # The turn's answer is now the decision's: the request that ended it.
    assert read(client, "sync-1", 2).json() == approved.json()
    # A refused request (nothing left to decide) leaves the turn as it was.
    stale = client.post(
        "/v1/conversations/sync-1/approvals", json={"approve": [call["id"]]}, headers=ANN
    )
    assert stale.status_code == 409
    assert read(client, "sync-1", 2).json() == approved.json()
    failed = post(client, "sync-1", f"echo: one two three four {FAIL_MID_STREAM}")
    assert failed.status_code == 502
    again = read(client, "sync-1", 3)
    assert again.status_code == 502
    error, wanted = again.json()["error"], failed.json()["error"]
    assert (error["code"], error["message"]) == (wanted["code"], wanted["message"])
    assert error["details"] == {
        **wanted["details"],
        "turn": 3,
        "draft_status": "interrupted",
        "draft_text": "one two three",
    }
    beyond = read(client, "sync-1", 4)
    assert beyond.status_code == 404 and beyond.json()["error"]["code"] == "turn_not_found"
    assert read(client, "sync-1", 1, wait=21).status_code == 422
    assert client.get("/v1/conversations/sync-1/turns/1", headers=BOB).status_code == 404

    # Without drafts (turns run before them) every answer is rebuilt from the log alone.
    forget_drafts(runner, "sync-1", range(1, 4))
    assert read(client, "sync-1", 1).json() == answered.json()
    assert read(client, "sync-1", 2).json() == approved.json()
    logged = read(client, "sync-1", 3)
    assert logged.status_code == 502
    assert logged.json()["error"]["code"] == "provider_error"
    assert logged.json()["error"]["details"] == {"attempts": 1, "turn": 3}


def test_a_turn_whose_client_went_away_is_followed_from_another_client(
    client: httpx.Client, runner: LocalRunner
) -> None:
    assert post(client, "drop-1", "My name is Ann.").status_code == 200
    dropped = threading.Thread(target=_post_and_hang_up, args=(runner.url, "drop-1"))
    dropped.start()
    seen = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        answer = read(client, "drop-1", 2)
        if answer.status_code == 200 and answer.json().get("draft_text"):
            seen = answer.json()
            break
        time.sleep(0.05)
    dropped.join()
    assert seen is not None, "never saw the turn in progress"
    assert seen["status"] == "in_progress" and WORDS.startswith(seen["draft_text"])
    running = page(client, "drop-1")["turns"]
    assert [(t["turn"], t["status"]) for t in running][-1] == (2, "in_progress")
    # A second client long-polls until the turn ends: its answer, as the turn route's.
    final = read(client, "drop-1", 2, wait=20)
    assert final.status_code == 200, final.text
    body = final.json()
    assert (body["status"], body["output_text"]) == ("complete", WORDS)
    assert body["usage"]["output_tokens"] == 60
    events = client.get("/v1/conversations/drop-1/events", headers=ANN).json()["events"]
    assert [e["kind"] for e in events] == ["user_message", "assistant_message"] * 2
    done = page(client, "drop-1")["turns"][-1]
    assert (done["status"], done["output_text"]) == ("complete", WORDS)


def _post_and_hang_up(url: str, conversation: str) -> None:
    """Send a slow turn and drop the connection long before its answer is written."""
    with httpx.Client(base_url=url, timeout=0.3) as impatient, pytest.raises(httpx.ReadTimeout):
        post(impatient, conversation, f"echo: {WORDS}")


def test_the_turns_page_over_failure_approval_and_cancel(client: httpx.Client) -> None:
    first = post(client, "hist-1", "My name is Ann.").json()
    paused = post(client, "hist-1", EMAIL).json()
    waiting = page(client, "hist-1")
    assert waiting["next_after"] is None
    second = waiting["turns"][1]
    assert (second["status"], second["awaiting"]) == ("awaiting_approval", ["approval"])
    assert second["pending_tool_calls"] == paused["pending_tool_calls"]
    [call] = paused["pending_tool_calls"]
    approved = client.post(
        "/v1/conversations/hist-1/approvals", json={"approve": [call["id"]]}, headers=ANN
    ).json()
    cancelled = post(client, "hist-1", EMAIL).json()
    stop = client.post("/v1/conversations/hist-1/cancel", json={"reason": "no"}, headers=ANN)
    assert stop.status_code == 200, stop.text
    failed = post(client, "hist-1", f"echo: a b c d {FAIL_MID_STREAM}")
    assert failed.status_code == 502

    turns = page(client, "hist-1")["turns"]
    assert [(t["turn"], t["status"], t["reason"]) for t in turns] == [
        (1, "complete", None),
        (2, "complete", None),
        (3, "complete", "cancelled"),
        (4, "failed", "provider_error"),
    ]
    assert [t["input"] for t in turns] == [["My name is Ann."], [EMAIL], [EMAIL], []]
    assert [t["output_text"] for t in turns] == [
        first["output_text"],
        approved["output_text"],
        None,
        None,
    ]
    assert turns[3]["error"] == {
        "code": "provider_error",
        "status": 502,
        "message": "connection reset",
    }
    assert [len(t["run_ids"]) for t in turns] == [1, 2, 1, 0]
    usage = [t["usage"] for t in turns]
    assert usage[0] == first["usage"]
    assert usage[1]["output_tokens"] == (
        paused["usage"]["output_tokens"] + approved["usage"]["output_tokens"]
    )
    assert usage[2] == cancelled["usage"]
    assert all(t["pending_tool_calls"] == [] and t["awaiting"] == [] for t in turns)
    assert all(t["started_at"] <= t["ended_at"] for t in turns)
    events = client.get("/v1/conversations/hist-1/events", headers=ANN).json()["events"]
    answers = [e["event_id"] for e in events if e["kind"] == "assistant_message"]
    assert [i for t in turns for i in t["run_ids"]] == answers

    # Paged two at a time, as GET .../events is.
    one = page(client, "hist-1", limit=2)
    assert [t["turn"] for t in one["turns"]] == [1, 2] and one["next_after"] == 2
    two = page(client, "hist-1", after=2, limit=2)
    assert [t["turn"] for t in two["turns"]] == [3, 4] and two["next_after"] is None
    assert page(client, "hist-1", after=4)["turns"] == []
    for query in ({"limit": 0}, {"limit": 101}, {"after": -1}, {"limit": "x"}):
        bad = client.get("/v1/conversations/hist-1/turns", params=query, headers=ANN)
        assert bad.status_code == 422, query
        assert bad.json()["error"]["code"] == "validation_error"
    missing = client.get("/v1/conversations/nobody/turns", headers=ANN)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "conversation_not_found"


def test_without_sync_drafts_finished_turns_read_back_from_the_log_alone(
    runner_config: LocalConfig, runner_clock: ClockFile, tmp_path: Path
) -> None:
    config = dataclasses.replace(
        runner_config,
        data_dir=tmp_path / "data",
        tools_file=ROOT / "events" / "local-tools.json",
        env={"SYNC_TURN_DRAFTS": "false"},
    )
    with LocalRunner(config) as served, httpx.Client(base_url=served.url, timeout=30) as client:
        answered = post(client, "nodraft-1", "My name is Ann.")
        paused = post(client, "nodraft-1", EMAIL)
        assert read(client, "nodraft-1", 1).json() == answered.json()
        assert read(client, "nodraft-1", 2).json() == paused.json()
        store = Runtime.from_settings(Settings.from_env(served.environment)).store
        key = ConversationKey(tenant="acme", conversation_id="nodraft-1")
        assert [drafts.read_state(store, key, n) for n in (1, 2)] == [None, None]


def test_a_quick_synchronous_turn_writes_no_draft(served: LocalRunner, http: httpx.Client) -> None:
    """Plain synchronous turns that end within ``SYNC_DRAFT_AFTER_MS`` (the default second)
    write no draft item: their commit is their only write; they still read back (from the
    log), on the turn route and the turns page."""
    for text in ("My name is Ann.", "What is my name?"):
        answer = http.post("/v1/conversations/quick-1/turns", json={"input": text}, headers=ANN)
        assert answer.status_code == 200, answer.text
    store = store_of(served)
    key = ConversationKey(tenant="acme", conversation_id="quick-1")
    for turn in (1, 2):
        assert drafts.read_state(store, key, turn) is None
        assert store.get_side_item(key, drafts.chunk_key(turn, 1)) is None
    second = http.get("/v1/conversations/quick-1/turns/2", headers=ANN)
    assert second.status_code == 200, second.text
    assert (second.json()["status"], second.json()["output_text"]) == (
        "complete",
        answer.json()["output_text"],
    )
    listed = http.get("/v1/conversations/quick-1/turns", headers=ANN).json()["turns"]
    assert [(t["turn"], t["status"]) for t in listed] == [(1, "complete"), (2, "complete")]
