"""A reader with a class's read scope sees real values in answers too (issue 41).

The model sees tokens, so an answer that repeats a protected value holds its token. A
reader whose claims hold the class's ``read_scope`` sees the value in that answer, in
the turn's own response, ``GET .../turns/{n}``, ``GET .../turns``, events and export
alike; a reader without it sees the token everywhere (``GET .../turns`` showed it the
raw input before).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
from turnledger_local.clock import ClockFile

from tests.http.conftest import ANN
from tests.http.test_http_data_policy import CARD, PII_READER, events_of, post_turn, serve

TOKEN = re.compile(r"\[pii:card:[0-9a-f]{10}\]")


def _answers(events: list[dict[str, Any]]) -> str:
    answers = [e["payload"] for e in events if e["kind"] == "assistant_message"]
    assert answers
    return json.dumps(answers)


def _export_answers(http: httpx.Client, headers: dict[str, str]) -> str:
    exported = http.get("/v1/conversations/s/export", headers=headers)
    assert exported.status_code == 200, exported.text
    lines = [json.loads(line) for line in exported.text.splitlines() if line]
    events = [x["event"] for x in lines if x["type"] == "event"]
    answers = [e for e in events if e["kind"] == "assistant_message"]
    assert answers
    return json.dumps(answers)


def test_an_answer_holding_a_token_shows_the_value_to_a_scoped_reader(
    runner_clock: ClockFile, tmp_path: Path
) -> None:
    with serve(runner_clock, tmp_path, model="demo-2") as http:
        # The model is sent the token; it echoes what it sees.
        plain = post_turn(http, "s", f"echo: {CARD}")
        assert plain.status_code == 200, plain.text
        assert CARD not in plain.text and TOKEN.search(plain.text)
        assert TOKEN.search(_answers(events_of(http, "s")))

        scoped = post_turn(http, "s", f"echo: {CARD}", headers=PII_READER)
        assert scoped.status_code == 200, scoped.text
        assert CARD in scoped.text and not TOKEN.search(scoped.text)

        for turn in (1, 2):
            for headers, shows_value in ((PII_READER, True), (ANN, False)):
                got = http.get(f"/v1/conversations/s/turns/{turn}", headers=headers)
                assert got.status_code == 200, got.text
                assert (CARD in got.text) is shows_value, got.text
                assert bool(TOKEN.search(got.text)) is not shows_value, got.text

        for headers, shows_value in ((PII_READER, True), (ANN, False)):
            turns = http.get("/v1/conversations/s/turns", headers=headers)
            assert turns.status_code == 200, turns.text
            assert (CARD in turns.text) is shows_value, turns.text
            assert bool(TOKEN.search(turns.text)) is not shows_value, turns.text

        answers = _answers(events_of(http, "s", PII_READER))
        assert CARD in answers and not TOKEN.search(answers)
        answers = _answers(events_of(http, "s", ANN))
        assert CARD not in answers and TOKEN.search(answers)

        answers = _export_answers(http, PII_READER)
        assert CARD in answers and not TOKEN.search(answers)
        answers = _export_answers(http, ANN)
        assert CARD not in answers and TOKEN.search(answers)


def test_the_openai_faces_items_show_tokens_to_a_reader_without_the_scope(
    runner_clock: ClockFile, tmp_path: Path
) -> None:
    """The face's transcript reads answer as the events route does: the card number to a
    reader with the class's read scope, its token to any other."""
    with serve(runner_clock, tmp_path) as http:
        assert post_turn(http, "f", f"My card is {CARD}.").status_code == 200
        items = "/openai/v1/conversations/f/items"
        for headers, shows_value in ((PII_READER, True), (ANN, False)):
            listed = http.get(items, headers=headers)
            assert listed.status_code == 200, listed.text
            assert (CARD in listed.text) is shows_value
            assert ("[pii:card:" in listed.text) is not shows_value
            first = listed.json()["data"][-1]["id"]
            one = http.get(f"{items}/{first}", headers=headers)
            assert one.status_code == 200, one.text
            assert (CARD in one.text) is shows_value
        added = http.post(
            items,
            json={"items": [{"type": "message", "role": "user", "content": f"Again {CARD}"}]},
            headers=ANN,
        )
        assert added.status_code == 200, added.text
        assert CARD not in added.text and "[pii:card:" in added.text
