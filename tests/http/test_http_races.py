"""20-way races through the local runner, on DynamoDB Local and on SQLite (issue 21).

Issue 21 moves the optimistic lock of a plain turn from the head's version to the
turn's own slot (one conditional put of the next turn item; the head is rewritten
only when what it holds changes). These black-box tests hold whatever the layout:

* 20 clients send a turn to one conversation at the same moment, several rounds: every
  answer is 200 or ``409 conversation_busy``; the transcript holds exactly the winners'
  messages, once each, every one answered, sequences 1..n with no gap or duplicate event,
  turn numbers consecutive; and what ``GET /v1/conversations/{id}`` says (turns, events)
  agrees with the log;
* 20 clients approve one waiting call at the same moment: the tool runs once, one
  approval wins, the others are told (409), and the conversation continues.

Both run on the two engines a deployment or ``make run`` uses: DynamoDB Local (the real
engine's conditions and transactions) and SQLite (``turnledger local --data-dir``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig

from tests.functional.http_sink import HttpSink
from tests.http.conftest import ANN, all_events, on_storage, start
from tests.http.test_http_tool_lease import registry
from tests.support.concurrency import all_at_once

pytestmark = [pytest.mark.http, pytest.mark.integration]

RACERS = 20
ROUNDS = 3


@pytest.fixture(params=["dynamodb-local", "sqlite"])
def race_http(
    request: pytest.FixtureRequest,
    runner_config: LocalConfig,
    runner_clock: ClockFile,
    tmp_path: Path,
) -> Iterator[tuple[httpx.Client, HttpSink]]:
    """The runner with enough workers for every racer, its table on DynamoDB Local or its
    conversations in a SQLite data folder, and a tool endpoint that counts its calls."""
    with HttpSink() as sink:
        config = dataclasses.replace(
            runner_config,
            tools_file=registry(sink, tmp_path / "tools.json"),
            max_workers=RACERS + 2,
        )
        for client in start(on_storage(config, request, tmp_path / "data"), runner_clock):
            yield client, sink


def assert_log_whole(http: httpx.Client, conversation: str, sent: list[str]) -> None:
    """The transcript holds exactly ``sent``, in order, each once and answered; no event is
    lost or duplicated; the conversation's summary agrees with its log."""
    events = all_events(http, conversation)
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    assert len({e["event_id"] for e in events}) == len(events)
    users = [e for e in events if e["kind"] == "user_message"]
    assert [e["payload"]["content"] for e in users] == sent
    assert [e["turn"] for e in users] == list(range(1, len(sent) + 1))
    answered = Counter(e["turn"] for e in events if e["kind"] == "assistant_message")
    assert all(answered[turn] >= 1 for turn in range(1, len(sent) + 1)), answered
    view = http.get(f"/v1/conversations/{conversation}", headers=ANN).json()
    assert (view["turns"], view["events"]) == (len(sent), len(events))


def test_twenty_racing_turns_on_one_conversation(
    race_http: tuple[httpx.Client, HttpSink],
) -> None:
    http, _ = race_http
    path = "/v1/conversations/race-turns/turns"
    first = http.post(path, json={"input": "start"}, headers=ANN)
    assert first.status_code == 200, first.text
    sent = ["start"]
    for round_number in range(ROUNDS):

        def fire(index: int, round_number: int = round_number) -> tuple[str, httpx.Response]:
            text = f"round {round_number} racer {index}"
            return text, http.post(path, json={"input": text}, headers=ANN)

        answers = all_at_once(RACERS, fire)
        codes = Counter(a.status_code for _, a in answers)
        assert set(codes) <= {200, 409}, codes
        losers = [a for _, a in answers if a.status_code == 409]
        assert all(a.json()["error"]["code"] == "conversation_busy" for a in losers)
        winners = sorted((a.json()["turn"], text) for text, a in answers if a.status_code == 200)
        assert winners, "no racer won"
        # Each winner took the next turn: no two answers name the same turn.
        numbers = [turn for turn, _ in winners]
        assert numbers == list(range(len(sent) + 1, len(sent) + 1 + len(winners)))
        sent.extend(text for _, text in winners)
        assert_log_whole(http, "race-turns", sent)


def test_twenty_racing_approvals_run_the_tool_once_and_the_conversation_goes_on(
    race_http: tuple[httpx.Client, HttpSink],
) -> None:
    http, sink = race_http
    base = "/v1/conversations/race-approvals"
    asked = http.post(
        f"{base}/turns", json={"input": '/tool send_email {"to": "bob@example.com"}'}, headers=ANN
    )
    assert asked.json()["status"] == "awaiting_approval", asked.text

    def approve(_: int) -> httpx.Response:
        return http.post(f"{base}/approvals", json={"approve": ["call_1"]}, headers=ANN)

    answers = all_at_once(RACERS, approve)
    codes = Counter(a.status_code for a in answers)
    assert codes[200] == 1 and set(codes) <= {200, 409}, codes
    for answer in answers:
        if answer.status_code == 409:
            assert answer.json()["error"]["code"] in {"conversation_busy", "not_awaiting_approval"}
    assert len(sink.requests_for("/email")) == 1
    after = http.post(f"{base}/turns", json={"input": "and then?"}, headers=ANN)
    assert after.status_code == 200 and after.json()["turn"] == 2, after.text
    events = all_events(http, "race-approvals")
    kinds = Counter(e["kind"] for e in events)
    assert kinds["tool_result"] == 1 and kinds["approval_resolved"] == 1, kinds
    assert_log_whole(
        http, "race-approvals", ['/tool send_email {"to": "bob@example.com"}', "and then?"]
    )
