"""The approval inbox over HTTP (``GET /v1/approvals``), through the local runner.

Three tenants with several conversations each ask for approvals; each tenant's
inbox lists exactly its own waiting calls, oldest first, page by page; filters
narrow it; deciding a call or letting its window close takes it out. Runs on
the embedded storage (moto's server, ``http``) and on DynamoDB Local (``ddb``),
and on the SQLite data folder.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from turnledger.tools import arguments_sha256
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig

from tests.http.conftest import on_storage, start, with_ask_operator

pytestmark = pytest.mark.http

TOOLS = Path(__file__).resolve().parents[2] / "events" / "local-tools.json"
TENANTS = ["acme", "globex", "initech"]


def bearer(tenant: str, user: str = "ann") -> dict[str, str]:
    return {"Authorization": f"Bearer local:{tenant}:{user}"}


@pytest.fixture(params=["moto", "sqlite", pytest.param("ddb", marks=pytest.mark.integration)])
def client(
    request: pytest.FixtureRequest,
    runner_config: LocalConfig,
    runner_clock: ClockFile,
    tmp_path: Path,
) -> Iterator[httpx.Client]:
    """A runner with the sample tool registry, on each storage."""
    config = dataclasses.replace(runner_config, tools_file=TOOLS)
    yield from start(on_storage(config, request, tmp_path / "data"), runner_clock)


def notifications(client: httpx.Client, tenant: str) -> list[dict[str, Any]]:
    """The runner's kept notifications about ``tenant``'s conversations."""
    answer = client.get("/_local/notifications", headers=bearer(tenant))
    assert answer.status_code == 200, answer.text
    told: list[dict[str, Any]] = answer.json()["notifications"]
    return told


def ask(
    client: httpx.Client, tenant: str, conversation: str, *calls: tuple[str, dict[str, Any]]
) -> httpx.Response:
    lines = "\n".join(f"/tool {name} {json.dumps(args)}" for name, args in calls)
    answer = client.post(
        f"/v1/conversations/{conversation}/turns", json={"input": lines}, headers=bearer(tenant)
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "awaiting_approval"
    return answer


def inbox(client: httpx.Client, tenant: str, **query: Any) -> list[dict[str, Any]]:
    """Every item of ``tenant``'s inbox, read in pages of 2."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        params = {"limit": 2, **query, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/approvals", params=params, headers=bearer(tenant))
        assert page.status_code == 200, page.text
        body = page.json()
        assert len(body["items"]) <= 2
        items.extend(body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            return items


def test_inbox_across_tenants_pages_filters_and_decisions(
    client: httpx.Client, runner_clock: ClockFile
) -> None:
    for tenant in TENANTS:
        for n in range(3):
            ask(
                client,
                tenant,
                f"conv-{n}",
                ("send_email", {"to": f"{tenant}-{n}@example.com"}),
                ("delete_record", {"id": f"r{n}", "environment": "production"}),
            )
            runner_clock.advance(1)
    for tenant in TENANTS:
        items = inbox(client, tenant)
        assert [(i["conversation_id"], i["tool"]) for i in items] == [
            (f"conv-{n}", tool) for n in range(3) for tool in ("send_email", "delete_record")
        ]
        first = items[0]
        assert first["kind"] == "approval"
        assert first["arguments"] == {"to": f"{tenant}-0@example.com"}
        assert first["requested_by"] == "ann"
        assert first["expires_at"] > first["requested_at"]
    # Each request was told to the runner's notification log (the local stand-in bus),
    # which shows each tenant its own.
    for tenant in TENANTS:
        told = notifications(client, tenant)
        requested = [n for n in told if n["detail-type"] == "approval.requested"]
        assert len(requested) == 6
        assert {n["detail"]["tenant"] for n in requested} == {tenant}
        assert all("arguments" not in n["detail"] for n in requested)
    # Filters.
    assert [i["conversation_id"] for i in inbox(client, "acme", tool="send_email")] == [
        "conv-0",
        "conv-1",
        "conv-2",
    ]
    assert {i["tool"] for i in inbox(client, "acme", conversation_id="conv-1")} == {
        "send_email",
        "delete_record",
    }
    # A decision takes the decided call out at once; the other stays until decided too.
    email = inbox(client, "acme", conversation_id="conv-0", tool="send_email")[0]
    decided = client.post(
        "/v1/conversations/conv-0/approvals",
        json={"reject": [{"id": email["id"], "reason": "wrong recipient"}]},
        headers=bearer("acme", "rita"),
    )
    assert decided.status_code == 200, decided.text
    assert [i["tool"] for i in inbox(client, "acme", conversation_id="conv-0")] == ["delete_record"]
    remaining = inbox(client, "acme", conversation_id="conv-0")[0]
    finished = client.post(
        "/v1/conversations/conv-0/approvals",
        json={"approve": [remaining["id"]]},
        headers=bearer("acme", "rita"),
    )
    assert finished.json()["status"] == "complete"
    decided = [
        n["detail"] for n in notifications(client, "acme") if n["detail-type"] == "approval.decided"
    ]
    assert [(d["conversation_id"], d["decision"], d["approver"]) for d in decided] == [
        ("conv-0", "rejected", "rita"),
        ("conv-0", "approved", "rita"),
    ]
    assert inbox(client, "acme", conversation_id="conv-0") == []
    assert len(inbox(client, "acme")) == 4
    assert len(inbox(client, "globex")) == 6  # untouched by acme's decisions
    # A clear takes a conversation's calls out.
    assert client.delete("/v1/conversations/conv-1", headers=bearer("acme")).status_code == 204
    assert [i["conversation_id"] for i in inbox(client, "acme")] == ["conv-2", "conv-2"]
    # Windows close: the calls leave the inbox at once, before anyone touches them.
    runner_clock.advance(2 * 86400)
    assert inbox(client, "acme") == []


def test_bad_limits_and_cursors_are_refused(client: httpx.Client) -> None:
    for limit in ("0", "101", "x"):
        answer = client.get("/v1/approvals", params={"limit": limit}, headers=bearer("acme"))
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["code"] == "validation_error"
    answer = client.get("/v1/approvals", params={"cursor": "nonsense"}, headers=bearer("acme"))
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_cursor"
    answer = client.get("/v1/approvals", params={"conversation_id": "-bad"}, headers=bearer("acme"))
    assert answer.status_code in {400, 422}
    assert client.get("/v1/approvals").status_code == 401
    empty = client.get("/v1/approvals", headers=bearer("acme"))
    assert empty.json() == {"items": [], "next_cursor": None}


def test_another_tenants_cursor_is_refused(client: httpx.Client) -> None:
    """A cursor names a position of the tenant it was handed to: another tenant's is
    ``400 invalid_cursor``, never a page of nothing."""
    for conversation in ("cur-1", "cur-2"):
        ask(client, "acme", conversation, ("send_email", {"to": "a@x.io"}))
    ask(client, "globex", "cur-1", ("send_email", {"to": "a@x.io"}))
    page = client.get("/v1/approvals", params={"limit": 1}, headers=bearer("acme")).json()
    cursor = page["next_cursor"]
    assert cursor is not None
    assert client.get("/v1/approvals", params={"cursor": cursor}, headers=bearer("acme")).json()[
        "items"
    ]
    answer = client.get("/v1/approvals", params={"cursor": cursor}, headers=bearer("globex"))
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "invalid_cursor"


def test_approving_with_edited_arguments(client: httpx.Client) -> None:
    """Edited arguments are checked against the tool's schema (422, nothing decided), then
    run instead of the requested ones; the decision records both hashes and the approver."""
    asked = ask(client, "acme", "edit-1", ("send_email", {"to": "mallory@example.com"}))
    [call] = asked.json()["pending_tool_calls"]
    url = "/v1/conversations/edit-1/approvals"
    refused = client.post(
        url,
        json={"approve": [{"id": call["id"], "arguments": {"to": 5}}]},
        headers=bearer("acme", "rita"),
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "validation_error"
    assert refused.json()["error"]["details"]["errors"][0]["id"] == call["id"]
    assert [i["id"] for i in inbox(client, "acme")] == [call["id"]]  # still waiting
    edited = {"to": "bob@example.com", "subject": "<b>hi</b>"}
    done = client.post(
        url,
        json={"approve": [{"id": call["id"], "arguments": edited}]},
        headers=bearer("acme", "rita"),
    )
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "complete"
    assert "bob@example.com" in done.json()["output_text"]
    assert "mallory" not in done.json()["output_text"]
    events = client.get(
        "/v1/conversations/edit-1/events", params={"limit": 100}, headers=bearer("acme")
    ).json()["events"]
    [decision] = [e for e in events if e["kind"] == "approval_resolved"]
    assert decision["actor"] == "rita"
    assert decision["payload"]["approver"] == "rita"
    assert decision["payload"]["arguments_sha256"] == arguments_sha256(call["arguments"])
    assert decision["payload"]["approved_arguments_sha256"] == arguments_sha256(edited)
    assert decision["payload"]["approved_arguments"] == edited
    [result] = [e for e in events if e["kind"] == "tool_result"]
    assert "bob@example.com" in result["payload"]["output"]
    assert inbox(client, "acme") == []


@pytest.fixture
def short_windows(runner_config: LocalConfig, runner_clock: ClockFile) -> Iterator[httpx.Client]:
    """A runner whose approval windows (10 min) close long before conversations expire."""
    config = dataclasses.replace(
        runner_config, tools_file=TOOLS, env={"APPROVAL_TTL_SECONDS": "600"}
    )
    yield from start(config, runner_clock)


def test_a_conversation_whose_only_approval_expired_is_ready_for_a_new_turn(
    short_windows: httpx.Client, runner_clock: ClockFile
) -> None:
    """Once the window closed, the head waits for nothing: ``complete`` with the call
    under ``expired_tool_calls`` before anything records the expiry, and after."""
    client = short_windows
    ask(client, "acme", "lapse-1", ("send_email", {"to": "a@x.io"}))
    runner_clock.advance(601)
    head = client.get("/v1/conversations/lapse-1", headers=bearer("acme")).json()
    assert (head["status"], head["awaiting"], head["pending_tool_calls"]) == ("complete", [], [])
    assert [c["name"] for c in head["expired_tool_calls"]] == ["send_email"]
    assert client.post("/_local/sweep", headers=bearer("acme")).json()["waits_expired"] == 1
    head = client.get("/v1/conversations/lapse-1", headers=bearer("acme")).json()
    assert (head["status"], head["expired_tool_calls"]) == ("complete", [])
    answer = client.post(
        "/v1/conversations/lapse-1/turns", json={"input": "And now?"}, headers=bearer("acme")
    )
    assert answer.status_code == 200, answer.text


def test_the_sweep_records_expiries_nobody_touches(
    short_windows: httpx.Client, runner_clock: ClockFile
) -> None:
    client = short_windows
    ask(client, "acme", "quiet", ("send_email", {"to": "a@example.com"}))
    runner_clock.advance(601)
    # Shown as expired at once, out of the inbox at once; nothing written yet.
    view = client.get("/v1/conversations/quiet", headers=bearer("acme")).json()
    assert view["pending_tool_calls"] == []
    assert [c["name"] for c in view["expired_tool_calls"]] == ["send_email"]
    assert inbox(client, "acme") == []
    report = client.post("/_local/sweep", headers=bearer("acme"))
    assert report.status_code == 200, report.text
    assert report.json()["waits_expired"] == 1
    assert client.post("/_local/sweep", headers=bearer("acme")).json()["waits_expired"] == 0
    events = client.get(
        "/v1/conversations/quiet/events", params={"limit": 100}, headers=bearer("acme")
    ).json()["events"]
    assert [e["kind"] for e in events][-3:] == [
        "approval_expired",
        "approval_resolved",
        "tool_result",
    ]
    view = client.get("/v1/conversations/quiet", headers=bearer("acme")).json()
    assert (view["status"], view["expired_tool_calls"]) == ("complete", [])
    told = notifications(client, "acme")
    assert [n["detail-type"] for n in told] == ["approval.requested", "approval.expired"]


@pytest.fixture(params=["moto", "sqlite", pytest.param("ddb", marks=pytest.mark.integration)])
def human(
    request: pytest.FixtureRequest,
    runner_config: LocalConfig,
    runner_clock: ClockFile,
    tmp_path: Path,
) -> Iterator[httpx.Client]:
    """A runner whose registry has the human-input tool ``ask_operator``, on each storage."""
    config = dataclasses.replace(runner_config, tools_file=with_ask_operator(tmp_path))
    yield from start(on_storage(config, request, tmp_path / "data"), runner_clock)


def test_input_calls_are_listed_and_answered_from_the_inbox(
    human: httpx.Client, runner_clock: ClockFile
) -> None:
    """A human-input call is listed as ``kind: "input"`` beside another conversation's
    approval; its output on the approvals route takes it out and the turn continues."""
    client = human
    ask(client, "acme", "orders-1", ("send_email", {"to": "bob@example.com"}))
    runner_clock.advance(1)
    paused = client.post(
        "/v1/conversations/budget-1/turns",
        json={"input": '/tool ask_operator {"question": "budget for Q1?"}'},
        headers=bearer("acme"),
    )
    assert paused.status_code == 200, paused.text
    assert paused.json()["status"] == "awaiting_hitl"
    [call] = paused.json()["pending_tool_calls"]
    assert call["requires"] == "input"

    items = inbox(client, "acme")
    assert [(i["kind"], i["conversation_id"], i["tool"]) for i in items] == [
        ("approval", "orders-1", "send_email"),
        ("input", "budget-1", "ask_operator"),
    ]
    asked = items[1]
    assert asked["id"] == call["id"]
    assert asked["arguments"] == {"question": "budget for Q1?"}
    assert asked["requested_by"] == "ann"
    assert inbox(client, "globex") == []  # another tenant sees none of it

    answered = client.post(
        "/v1/conversations/budget-1/approvals",
        json={"outputs": [{"id": call["id"], "output": "42k"}]},
        headers=bearer("acme", "rita"),
    )
    assert answered.status_code == 200, answered.text
    assert answered.json()["status"] == "complete"
    # The local model echoes the results it was given: it saw the person's answer.
    assert answered.json()["output_text"] == "Tool results: ask_operator: 42k"
    assert [(i["kind"], i["conversation_id"]) for i in inbox(client, "acme")] == [
        ("approval", "orders-1")
    ]
    events = client.get(
        "/v1/conversations/budget-1/events", params={"limit": 100}, headers=bearer("acme")
    ).json()["events"]
    [provided] = [e for e in events if e["kind"] == "tool_input_provided"]
    assert (provided["actor"], provided["payload"]["via"]) == ("rita", "approvals")
    [result] = [e for e in events if e["kind"] == "tool_result"]
    assert result["payload"]["output"] == "42k"
    # The request and the answer were told like approvals (the runner's notification log).
    told = [
        (n["detail-type"], n["detail"]["kind"], n["detail"].get("provided_by"))
        for n in notifications(client, "acme")
        if n["detail"]["conversation_id"] == "budget-1"
    ]
    assert told == [("input.requested", "input", None), ("input.provided", "input", "rita")]
    # Answered once: a second answer names no waiting call and stores nothing.
    again = client.post(
        "/v1/conversations/budget-1/approvals",
        json={"outputs": [{"id": call["id"], "output": "43k"}]},
        headers=bearer("acme", "rita"),
    )
    assert again.status_code == 422, again.text
    assert again.json()["error"]["code"] == "unknown_tool_call"
