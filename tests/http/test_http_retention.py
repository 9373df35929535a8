"""Retention per data class, through the local runner (issue 41).

A ``pii`` conversation whose class keeps content 60 s: once the runner's clock moved past
that and the sweep ran (``POST /_local/sweep`` for the conversation), its events show a
removal marker where the card number and the words were, for every reader, in the
events and the export alike; a later turn still works. The scheduled sweep (``POST
/_local/sweep`` with no body, what EventBridge runs hourly) finds such a conversation by
itself, naming none.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from turnledger_local.clock import ClockFile

from tests.http.conftest import ANN
from tests.http.test_http_data_policy import CARD, PII_READER, POLICY, events_of, serve

WORDS = "please keep my card on file"


def _retained(seconds: int) -> dict[str, Any]:
    policy = copy.deepcopy(POLICY)
    for data_class in policy["classes"]:
        if data_class["name"] == "pii":
            data_class["retention_seconds"] = seconds
    return policy


def test_the_sweep_removes_a_class_content_when_its_retention_is_due(
    runner_clock: ClockFile, tmp_path: Path
) -> None:
    with serve(runner_clock, tmp_path, _retained(60), model="demo-2") as http:
        first = http.post(
            "/v1/conversations/r-1/turns", json={"input": f"{WORDS}: {CARD}"}, headers=ANN
        )
        assert first.status_code == 200, first.text
        assert CARD in http.get("/v1/conversations/r-1/events", headers=PII_READER).text

        # Not due yet: the sweep leaves the content.
        runner_clock.advance(30)
        early = http.post("/_local/sweep", json={"conversation_ids": ["r-1"]}, headers=ANN)
        assert early.status_code == 200, early.text
        assert early.json()["contents_removed"] == 0
        assert CARD in http.get("/v1/conversations/r-1/events", headers=PII_READER).text

        runner_clock.advance(31)
        swept = http.post("/_local/sweep", json={"conversation_ids": ["r-1"]}, headers=ANN)
        assert swept.status_code == 200, swept.text
        assert swept.json()["contents_removed"] >= 2  # the user's message and the answer

        for reader in (ANN, PII_READER):
            events = events_of(http, "r-1", reader)
            text = str(events)
            assert CARD not in text and WORDS not in text
            [user] = [e for e in events if e["kind"] == "user_message"]
            assert user["payload"]["content"].startswith(
                '{"removed":"retention","class":"pii","at":'
            )
        # The events stay (the class's rise, the routing, the messages), in order.
        kinds = [e["kind"] for e in events_of(http, "r-1")]
        assert "data_class_raised" in kinds and "assistant_message" in kinds

        later = http.post("/v1/conversations/r-1/turns", json={"input": "hello again"}, headers=ANN)
        assert later.status_code == 200, later.text
        exported = http.get("/v1/conversations/r-1/export", headers=PII_READER)
        assert exported.status_code == 200, exported.text
        assert CARD not in exported.text and WORDS not in exported.text
        assert "hello again" in exported.text
        again = http.post("/_local/sweep", json={"conversation_ids": ["r-1"]}, headers=ANN)
        assert again.json()["contents_removed"] == 0


def test_the_scheduled_sweep_finds_the_content_whose_retention_is_due(
    runner_clock: ClockFile, tmp_path: Path
) -> None:
    with serve(runner_clock, tmp_path, _retained(60), model="demo-2") as http:
        first = http.post(
            "/v1/conversations/r-2/turns", json={"input": f"{WORDS}: {CARD}"}, headers=ANN
        )
        assert first.status_code == 200, first.text

        # Not due yet: the scheduled sweep leaves the content.
        runner_clock.advance(30)
        early = http.post("/_local/sweep", headers=ANN)
        assert early.status_code == 200, early.text
        assert early.json()["contents_removed"] == 0
        assert CARD in http.get("/v1/conversations/r-2/events", headers=PII_READER).text

        runner_clock.advance(31)
        swept = http.post("/_local/sweep", headers=ANN)
        assert swept.status_code == 200, swept.text
        assert swept.json()["contents_removed"] >= 2  # the user's message and the answer
        events = events_of(http, "r-2", PII_READER)
        assert CARD not in str(events) and WORDS not in str(events)
        [user] = [e for e in events if e["kind"] == "user_message"]
        assert user["payload"]["content"].startswith('{"removed":"retention","class":"pii","at":')

        # A later turn's content is due in its own time: the next hourly runs find it.
        later = http.post(
            "/v1/conversations/r-2/turns", json={"input": f"again {CARD}"}, headers=ANN
        )
        assert later.status_code == 200, later.text
        runner_clock.advance(61)
        again = http.post("/_local/sweep", headers=ANN)
        assert again.json()["contents_removed"] >= 2
        assert CARD not in http.get("/v1/conversations/r-2/events", headers=PII_READER).text
        assert http.post("/_local/sweep", headers=ANN).json()["contents_removed"] == 0
