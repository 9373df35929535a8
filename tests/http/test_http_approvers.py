"""Who may decide, through the local runner: the approvals routes need the approver scope
(``APPROVER_CLAIM``/``APPROVER_SCOPE``), a ``four_eyes`` tool (or ``APPROVAL_FOUR_EYES``) is
approved only by someone other than the person whose turn asked for it, and the decision
records the claims it relied on."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig

from tests.http.conftest import start

ANN = {"Authorization": "Bearer local:acme:ann"}
BOB = {"Authorization": "Bearer local:acme:bob"}
#: Same tenant, no approver scope: a user, or a machine token, that may not decide.
EVE = {"Authorization": "Bearer local:acme:eve;scope=read write"}
SOURCE = Path(__file__).resolve().parents[2] / "events" / "local-tools.json"


def tools_file(tmp_path: Path) -> Path:
    """The sample registry plus ``wire_money``: approval and four-eyes."""
    document = json.loads(SOURCE.read_text())
    send_email = next(t for t in document["tools"] if t["name"] == "send_email")
    document["tools"].append({**send_email, "name": "wire_money", "four_eyes": True})
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(document))
    return path


def client_with(
    runner_config: LocalConfig, runner_clock: ClockFile, tmp_path: Path, **env: str
) -> Iterator[httpx.Client]:
    config = dataclasses.replace(runner_config, tools_file=tools_file(tmp_path), env=env)
    yield from start(config, runner_clock)


@pytest.fixture
def client(
    runner_config: LocalConfig, runner_clock: ClockFile, tmp_path: Path
) -> Iterator[httpx.Client]:
    yield from client_with(runner_config, runner_clock, tmp_path)


def ask(client: httpx.Client, conversation: str, tool: str, who: dict[str, str]) -> str:
    answer = client.post(
        f"/v1/conversations/{conversation}/turns",
        json={"input": f'/tool {tool} {{"to": "a@x.io"}}'},
        headers=who,
    )
    assert answer.status_code == 200, answer.text
    call: str = answer.json()["pending_tool_calls"][0]["id"]
    return call


def approve(
    client: httpx.Client, conversation: str, call: str, who: dict[str, str]
) -> httpx.Response:
    return client.post(
        f"/v1/conversations/{conversation}/approvals", json={"approve": [call]}, headers=who
    )


def error_code(response: httpx.Response) -> str:
    code: str = response.json()["error"]["code"]
    return code


def resolved(client: httpx.Client, conversation: str) -> list[dict[str, Any]]:
    events = client.get(f"/v1/conversations/{conversation}/events", headers=ANN).json()["events"]
    return [e for e in events if e["kind"] == "approval_resolved"]


def test_deciding_needs_the_approver_scope(client: httpx.Client) -> None:
    """A caller of the tenant without the scope: 403 on the approvals route, the inbox and the
    OpenAI face's approval items; nothing is decided. With it (the local identity's default),
    the decision records the claims it relied on."""
    call = ask(client, "scope-1", "send_email", ANN)
    refused = approve(client, "scope-1", call, EVE)
    assert refused.status_code == 403 and error_code(refused) == "approver_scope_missing"
    assert refused.json()["error"]["details"] == {
        "claim": "scope",
        "required": "turnledger/approve",
    }
    inbox = client.get("/v1/approvals", headers=EVE)
    assert inbox.status_code == 403 and error_code(inbox) == "approver_scope_missing"
    face = client.post(
        "/openai/v1/responses",
        json={
            "conversation": "scope-1",
            "input": [
                {"type": "mcp_approval_response", "approval_request_id": call, "approve": True}
            ],
        },
        headers=EVE,
    )
    assert face.status_code == 403, face.text
    head = client.get("/v1/conversations/scope-1", headers=EVE).json()
    assert head["status"] == "awaiting_approval" and resolved(client, "scope-1") == []

    assert approve(client, "scope-1", call, BOB).status_code == 200
    (decision,) = resolved(client, "scope-1")
    assert decision["actor"] == "bob"
    assert decision["payload"]["approver_claims"] == {"sub": "bob", "scope": "turnledger/approve"}


def test_a_four_eyes_tool_is_not_approved_by_its_requester(client: httpx.Client) -> None:
    """``four_eyes`` tool: the person whose turn asked gets 403 approver_is_requester (and may
    still reject); another person of the tenant approves. Other tools stay as they were."""
    call = ask(client, "eyes-1", "wire_money", ANN)
    own = approve(client, "eyes-1", call, ANN)
    assert own.status_code == 403 and error_code(own) == "approver_is_requester"
    assert own.json()["error"]["details"] == {"calls": [call], "requested_by": "ann"}
    assert resolved(client, "eyes-1") == []
    assert approve(client, "eyes-1", call, BOB).status_code == 200
    assert [e["payload"]["approver"] for e in resolved(client, "eyes-1")] == ["bob"]

    other = ask(client, "eyes-2", "send_email", ANN)
    assert approve(client, "eyes-2", other, ANN).status_code == 200  # no four-eyes there

    rejected = ask(client, "eyes-3", "wire_money", ANN)
    answer = client.post(
        "/v1/conversations/eyes-3/approvals", json={"reject": [rejected]}, headers=ANN
    )
    assert answer.status_code == 200, answer.text


def test_the_deployment_can_require_four_eyes_for_every_tool(
    runner_config: LocalConfig, runner_clock: ClockFile, tmp_path: Path
) -> None:
    for client in client_with(runner_config, runner_clock, tmp_path, APPROVAL_FOUR_EYES="true"):
        call = ask(client, "eyes-all", "send_email", ANN)
        own = approve(client, "eyes-all", call, ANN)
        assert own.status_code == 403 and error_code(own) == "approver_is_requester"
        assert approve(client, "eyes-all", call, BOB).status_code == 200


def test_the_scope_is_configurable_and_can_be_turned_off(
    runner_config: LocalConfig, runner_clock: ClockFile, tmp_path: Path
) -> None:
    """``APPROVER_CLAIM=cognito:groups``, ``APPROVER_SCOPE=approvers``: the group decides; with
    ``APPROVER_SCOPE`` empty anyone of the tenant does (the decision records only ``sub``)."""
    groups = {"APPROVER_CLAIM": "cognito:groups", "APPROVER_SCOPE": "approvers"}
    for client in client_with(runner_config, runner_clock, tmp_path, **groups):
        call = ask(client, "groups-1", "send_email", ANN)
        member = {"Authorization": "Bearer local:acme:bob;cognito:groups=[staff approvers]"}
        outsider = {"Authorization": "Bearer local:acme:eve;cognito:groups=[staff]"}
        assert error_code(approve(client, "groups-1", call, outsider)) == "approver_scope_missing"
        assert approve(client, "groups-1", call, member).status_code == 200
        (decision,) = resolved(client, "groups-1")
        assert decision["payload"]["approver_claims"] == {
            "sub": "bob",
            "cognito:groups": "approvers",
        }
    for client in client_with(runner_config, runner_clock, tmp_path, APPROVER_SCOPE=""):
        call = ask(client, "open-1", "send_email", ANN)
        assert approve(client, "open-1", call, EVE).status_code == 200
        (decision,) = resolved(client, "open-1")
        assert decision["payload"]["approver_claims"] == {"sub": "eve"}
