"""A bounded load test through the local runner on DynamoDB Local (loopback only).

50 conversations x 20 turns, driven by 8 concurrent clients (each client plays its
conversations' turns one after the other). Every tenth turn asks for ``send_email``,
which needs approval: 3 clients race the same approval, against a real HTTP tool
endpoint that counts what it receives. Afterwards:

* no lost or duplicated events: each conversation's transcript holds exactly the
  user messages whose requests answered 200, in order, with sequences 1..n, no gaps,
  every event id once, every turn answered, one ``tool_result`` and one
  ``approval_resolved`` per approved call; and the conversation's summary
  (``GET /v1/conversations/{id}``: turns, events) agrees with its log;
* no duplicate tool executions: one POST per tool call (per ``Idempotency-Key``);
* no 5xx; a 409 only for an approval race (``conversation_busy`` or
  ``not_awaiting_approval``).

Runs on DynamoDB Local and on SQLite (``turnledger local --data-dir``): issue 21
changes how both store a turn. The figures (requests, answers by status, p50/p95
latency, wall time) are printed.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig

from tests.functional.http_sink import HttpSink
from tests.http.conftest import ANN, all_events, on_storage, start
from tests.http.test_http_tool_lease import registry

pytestmark = [pytest.mark.http, pytest.mark.integration]

CONVERSATIONS = 50
TURNS = 20
CLIENTS = 8
RACERS = 3
#: Turn indexes (0-based) that ask for a tool needing approval.
TOOL_TURNS = {4, 14}


@dataclasses.dataclass
class Tally:
    """Every answer, thread-safe."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    statuses: Counter[int] = dataclasses.field(default_factory=Counter)
    conflicts: Counter[str] = dataclasses.field(default_factory=Counter)
    latencies: list[float] = dataclasses.field(default_factory=list)
    unexpected: list[str] = dataclasses.field(default_factory=list)

    def send(
        self, http: httpx.Client, path: str, body: dict[str, Any], *, race: bool = False
    ) -> httpx.Response:
        began = time.perf_counter()
        answer = http.post(path, json=body, headers=ANN)
        elapsed = time.perf_counter() - began
        with self.lock:
            self.statuses[answer.status_code] += 1
            self.latencies.append(elapsed)
            if answer.status_code == 409:
                code = answer.json()["error"]["code"]
                self.conflicts[code] += 1
                if not race or code not in {"conversation_busy", "not_awaiting_approval"}:
                    self.unexpected.append(f"{path}: 409 {code}")
            elif answer.status_code != 200:
                self.unexpected.append(f"{path}: {answer.status_code} {answer.text[:200]}")
        return answer


@pytest.fixture(params=["dynamodb-local", "sqlite"])
def load_http(
    request: pytest.FixtureRequest,
    runner_config: LocalConfig,
    runner_clock: ClockFile,
    tmp_path: Path,
) -> Iterator[tuple[httpx.Client, HttpSink]]:
    with HttpSink() as sink:
        config = dataclasses.replace(
            runner_config,
            tools_file=registry(sink, tmp_path / "tools.json"),
            max_workers=CLIENTS + RACERS,
        )
        # One httpx client for every thread: its pool (100 connections) serves them all.
        for client in start(on_storage(config, request, tmp_path / "data"), runner_clock):
            yield client, sink


def _race_approval(http: httpx.Client, tally: Tally, base: str) -> list[httpx.Response]:
    """``RACERS`` clients send the same approval at the same moment."""
    go = threading.Barrier(RACERS)

    def approve(_: int) -> httpx.Response:
        go.wait()
        return tally.send(http, f"{base}/approvals", {"approve": ["call_1"]}, race=True)

    with ThreadPoolExecutor(RACERS) as racers:
        return list(racers.map(approve, range(RACERS)))


def _conversation(http: httpx.Client, tally: Tally, number: int) -> list[str]:
    """Play one conversation's turns; the inputs whose turns answered 200, in order."""
    base = f"/v1/conversations/load-{number}"
    sent: list[str] = []
    for turn in range(TURNS):
        if turn in TOOL_TURNS:
            text = f'/tool send_email {{"to": "c{number}-t{turn}@example.com"}}'
        else:
            text = f"conversation {number} turn {turn}"
        answer = tally.send(http, f"{base}/turns", {"input": text})
        if answer.status_code != 200:
            continue
        sent.append(text)
        if answer.json()["status"] != "awaiting_approval":
            continue
        answers = _race_approval(http, tally, base)
        won = [a for a in answers if a.status_code == 200]
        assert len(won) == 1, [a.text for a in answers]
    return sent


def test_fifty_conversations_of_twenty_turns_with_racing_approvals(
    load_http: tuple[httpx.Client, HttpSink],
) -> None:
    http, sink = load_http
    tally = Tally()
    began = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as clients:
        played = list(clients.map(lambda n: _conversation(http, tally, n), range(CONVERSATIONS)))
    wall = time.perf_counter() - began

    requests = sum(tally.statuses.values())
    latencies = sorted(tally.latencies)
    print(
        f"\nload: {requests} requests in {wall:.1f} s ({requests / wall:.0f}/s),"
        f" statuses {dict(sorted(tally.statuses.items()))}, 409s {dict(tally.conflicts)},"
        f" p50 {statistics.median(latencies) * 1000:.0f} ms,"
        f" p95 {latencies[int(len(latencies) * 0.95)] * 1000:.0f} ms"
    )
    assert tally.unexpected == []
    assert not [s for s in tally.statuses if s >= 500]

    for number, sent in enumerate(played):
        assert len(sent) == TURNS, (number, len(sent))
        events = all_events(http, f"load-{number}")
        assert [e["sequence"] for e in events] == list(range(1, len(events) + 1)), number
        assert len({e["event_id"] for e in events}) == len(events), number
        users = [e for e in events if e["kind"] == "user_message"]
        assert [e["payload"]["content"] for e in users] == sent, number
        assert [e["turn"] for e in users] == list(range(1, TURNS + 1)), number
        answered = {e["turn"] for e in events if e["kind"] == "assistant_message"}
        assert answered == set(range(1, TURNS + 1)), number
        kinds = Counter(e["kind"] for e in events)
        assert kinds["tool_result"] == kinds["approval_resolved"] == len(TOOL_TURNS), number
        view = http.get(f"/v1/conversations/load-{number}", headers=ANN).json()
        assert (view["turns"], view["events"], view["status"]) == (TURNS, len(events), "complete")

    posts = sink.requests_for("/email")
    keys = Counter(request.idempotency_key for request in posts)
    assert len(posts) == CONVERSATIONS * len(TOOL_TURNS)
    assert set(keys.values()) == {1}, [k for k, n in keys.items() if n > 1]
