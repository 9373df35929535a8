"""A conversation never depends on tools that no longer exist (issue 39): stored options
naming a tool the registry lost since, or an imported head naming one this deployment never
had, are ignored by later turns, on the native route and on the OpenAI face."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from turnledger_local.runner import LocalConfig, LocalRunner
from turnledger_local.template import PROJECT_ROOT

from tests.http.conftest import ANN

SAMPLE_TOOLS = PROJECT_ROOT / "events" / "local-tools.json"
GONE = "get_weather"


def tools_files(folder: Path) -> tuple[Path, Path]:
    """The sample registry, and the same without :data:`GONE`."""
    registry: dict[str, Any] = json.loads(SAMPLE_TOOLS.read_text(encoding="utf-8"))
    assert GONE in [tool["name"] for tool in registry["tools"]]
    without = {**registry, "tools": [t for t in registry["tools"] if t["name"] != GONE]}
    full, lacking = folder / "tools.json", folder / "tools-lacking.json"
    full.write_text(json.dumps(registry), encoding="utf-8")
    lacking.write_text(json.dumps(without), encoding="utf-8")
    return full, lacking


@contextmanager
def serving(data_dir: Path, tools: Path) -> Iterator[httpx.Client]:
    """A runner keeping conversations in ``data_dir`` (they outlive it), with ``tools``."""
    config = LocalConfig(port=0, data_dir=data_dir, tools_file=tools)
    with LocalRunner(config) as runner, httpx.Client(base_url=runner.url, timeout=60) as http:
        yield http


def native_turn(http: httpx.Client, conversation: str, **body: Any) -> httpx.Response:
    return http.post(f"/v1/conversations/{conversation}/turns", json=body, headers=ANN)


def face_turn(http: httpx.Client, conversation: str, **body: Any) -> httpx.Response:
    return http.post(
        "/openai/v1/responses",
        json={"model": "demo-1", "conversation": conversation, **body},
        headers={"Authorization": "Bearer local:acme:ann"},
    )


def test_a_tool_removed_from_the_registry_does_not_brick_the_conversations_that_named_it(
    tmp_path: Path,
) -> None:
    """Turns that named ``get_weather``; the runner restarted with a registry that lacks
    it: the next turns work, with no ``tools``, with ``[]`` and with a valid list, on the
    native route and on the face; naming the removed tool is still refused."""
    full, lacking = tools_files(tmp_path)
    data_dir = tmp_path / "data"
    with serving(data_dir, full) as http:
        named = native_turn(http, "stale-1", input="Hello.", tools=[GONE])
        assert named.status_code == 200, named.text
        created = http.post("/openai/v1/conversations", json={}, headers=ANN)
        assert created.status_code == 200, created.text
        face_id = created.json()["id"]
        declared = [{"type": "function", "name": GONE, "parameters": {"type": "object"}}]
        on_face = face_turn(http, face_id, input="Hello.", tools=declared)
        assert on_face.status_code == 200, on_face.text

    with serving(data_dir, lacking) as http:
        for body in ({}, {"tools": []}, {"tools": ["send_email"]}):
            answer = native_turn(http, "stale-1", input="Still there?", **body)
            assert answer.status_code == 200, (body, answer.text)
        refused = native_turn(http, "stale-1", input="Weather?", tools=[GONE])
        assert refused.status_code == 422
        assert refused.json()["error"]["code"] == "unknown_tool"
        again = face_turn(http, face_id, input="Still there?")
        assert again.status_code == 200, again.text
        assert again.json()["status"] == "completed"
        empty = face_turn(http, face_id, input="And now?", tools=[])
        assert empty.status_code == 200, empty.text


def test_an_import_whose_options_name_an_unknown_tool_is_accepted_and_its_turns_work(
    tmp_path: Path,
) -> None:
    """An export whose head names ``get_weather`` imported where no such tool exists: the
    import keeps the options as exported (201), and the imported conversation's turns
    ignore the unknown name (docs/API.md, "Export and import")."""
    full, lacking = tools_files(tmp_path)
    with serving(tmp_path / "a", full) as http:
        assert native_turn(http, "source", input="Hello.", tools=[GONE]).status_code == 200
        exported = http.get("/v1/conversations/source/export", headers=ANN)
        assert exported.status_code == 200, exported.text
        head = json.loads(exported.text.splitlines()[0])
        assert head["options"]["tools"] == [GONE]

    with serving(tmp_path / "b", lacking) as http:
        imported = http.post(
            "/v1/conversations/copy/import",
            content=exported.content,
            headers={**ANN, "Content-Type": "application/x-ndjson"},
        )
        assert imported.status_code == 201, imported.text
        answer = native_turn(http, "copy", input="Still there?")
        assert answer.status_code == 200, answer.text
        assert native_turn(http, "copy", input="And now?", tools=[]).status_code == 200


def test_a_call_pending_on_a_tool_removed_since_settles_when_approved(tmp_path: Path) -> None:
    """A ``send_email`` call waits for approval; the runner restarts with a registry that
    lacks ``send_email``. Approving it records the approval, settles the call with an error
    result that names the missing tool (nothing runs) and finishes the turn, instead of
    ``422 unknown_tool`` on every attempt (issue 39, point 5: the pending half); an edit
    of its arguments, with no schema left to check them, is refused first and decides
    nothing."""
    registry: dict[str, Any] = json.loads(SAMPLE_TOOLS.read_text(encoding="utf-8"))
    without = {**registry, "tools": [t for t in registry["tools"] if t["name"] != "send_email"]}
    full, lacking = tmp_path / "tools.json", tmp_path / "tools-lacking.json"
    full.write_text(json.dumps(registry), encoding="utf-8")
    lacking.write_text(json.dumps(without), encoding="utf-8")
    data_dir = tmp_path / "data"
    with serving(data_dir, full) as http:
        asked = native_turn(http, "pending-gone", input='/tool send_email {"to": "bob@x.org"}')
        assert asked.status_code == 200, asked.text
        assert asked.json()["status"] == "awaiting_approval"
        (call,) = asked.json()["pending_tool_calls"]

    with serving(data_dir, lacking) as http:
        edited = http.post(
            "/v1/conversations/pending-gone/approvals",
            json={"approve": [{"id": call["id"], "arguments": {"to": "carol@x.org"}}]},
            headers=ANN,
        )
        assert edited.status_code == 422, edited.text
        assert edited.json()["error"]["code"] == "validation_error"
        assert "no longer registered" in edited.text
        approved = http.post(
            "/v1/conversations/pending-gone/approvals",
            json={"approve": [call["id"]]},
            headers=ANN,
        )
        assert approved.status_code == 200, approved.text
        assert approved.json()["status"] == "complete"
        assert approved.json()["pending_tool_calls"] == []
        events = http.get("/v1/conversations/pending-gone/events", headers=ANN).json()["events"]
        kinds = [e["kind"] for e in events]
        assert "approval_resolved" in kinds
        (result,) = [e for e in events if e["kind"] == "tool_result"]
        assert result["payload"]["call_id"] == call["id"]
        assert result["payload"]["is_error"] is True
        assert "send_email" in json.dumps(result["payload"]["output"])
        assert "no longer registered" in json.dumps(result["payload"]["output"])
