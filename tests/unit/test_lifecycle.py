"""The tables of tool calls, drafts and statuses (turnledger.turn.lifecycle), and the signed
callback tokens of deferred calls (turnledger.turn.callbacks). The turn's state machine
that makes the moves is tested in test_turn_machine.py."""

from __future__ import annotations

import base64
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

import pytest
from turnledger.core.exceptions import ApprovalPending, CallbackInvalid, InputPending
from turnledger.core.models import CallState, ConversationStatus, PendingCall
from turnledger.turn import callbacks
from turnledger.turn.lifecycle import (
    CALL_MOVES,
    CALL_TRANSITIONS,
    DRAFT_MOVES,
    WAIT_OF_STATE,
    CallMove,
    DraftMove,
    IllegalTransition,
    awaiting,
    call_target,
    draft_move,
    move,
    status_for,
    waits_for_person,
)

NOW = datetime(2099, 1, 15, 12, 0, tzinfo=UTC)


def call(state: str, call_id: str = "c1", **extra: Any) -> PendingCall:
    return PendingCall.model_validate(
        {
            "id": call_id,
            "name": "tool",
            "arguments": {},
            "requires": "none",
            "state": state,
            "idempotency_key": "k" * 32,
            "arguments_sha256": "0" * 64,
            **extra,
        }
    )


STATES = list(get_args(CallState))
PLACES: list[str | None] = [None, *STATES, "settled"]


def test_every_stored_state_is_in_the_table() -> None:
    stored = set(get_args(PendingCall.model_fields["state"].annotation))
    assert stored == set(STATES) == {s for s in CALL_TRANSITIONS if s is not None}


@pytest.mark.parametrize(("place", "how"), list(itertools.product(PLACES, list(CallMove))))
def test_every_call_move_from_every_place_follows_the_table(
    place: str | None, how: CallMove
) -> None:
    sources, target = CALL_MOVES[how]
    if place in sources:
        assert call_target(place, how) == target  # type: ignore[arg-type]
        if place not in (None, "settled") and target != "settled":
            assert move(call(place), how).state == target  # type: ignore[arg-type]
    else:
        with pytest.raises(IllegalTransition) as refused:
            call_target(place, how)  # type: ignore[arg-type]
        assert refused.value.details["move"] == how.value


def test_a_settling_move_never_leaves_a_call_pending() -> None:
    with pytest.raises(IllegalTransition):
        move(call("ready"), CallMove.SETTLE)


def test_settled_calls_never_come_back() -> None:
    # Only a call being recorded starts anywhere; nothing moves back to waiting for a decision
    # once it ran or was deferred, and nothing leaves "settled".
    for state in ("deferred", "awaiting_client", "rejected"):
        assert CALL_TRANSITIONS[state] == frozenset({"settled"})
    assert "settled" not in CALL_TRANSITIONS
    # A call whose tool asked a person mid-call (an MCP elicitation) runs again once
    # answered, and only then: nothing else leads back from waiting for input.
    assert CALL_TRANSITIONS["awaiting_input"] == frozenset({"settled", "ready"})
    assert [m for m, (sources, _) in CALL_MOVES.items() if "awaiting_input" in sources] == [
        CallMove.ANSWER,
        CallMove.SETTLE,
        CallMove.CANCEL,
    ]
    assert CALL_MOVES[CallMove.ELICIT] == (frozenset({"ready"}), "awaiting_input")


@pytest.mark.parametrize(
    ("current", "how"),
    list(itertools.product([None, "in_progress", "done", "interrupted"], DraftMove)),
)
def test_every_draft_move_follows_the_table(current: Any, how: DraftMove) -> None:
    sources, target = DRAFT_MOVES[how]
    if current in sources:
        assert draft_move(current, how) == target
    else:
        with pytest.raises(IllegalTransition):
            draft_move(current, how)


@pytest.mark.parametrize(
    ("states", "status", "waits"),
    [
        ([], ConversationStatus.COMPLETE, []),
        (["ready"], ConversationStatus.RUNNING_TOOLS, []),
        (["deferred"], ConversationStatus.AWAITING_ASYNC_TOOLS, ["async"]),
        (
            ["awaiting_client", "deferred"],
            ConversationStatus.AWAITING_CLIENT_TOOLS,
            ["client", "async"],
        ),
        (["deferred", "awaiting_input"], ConversationStatus.AWAITING_HITL, ["input", "async"]),
        (
            ["deferred", "awaiting_client", "awaiting_input", "awaiting_approval"],
            ConversationStatus.AWAITING_APPROVAL,
            ["approval", "input", "client", "async"],
        ),
        (["outcome_unknown", "ready"], ConversationStatus.AWAITING_APPROVAL, ["approval"]),
    ],
)
def test_status_is_the_first_wait_by_priority(
    states: list[str], status: ConversationStatus, waits: list[str]
) -> None:
    pending = [call(state, f"c{i}") for i, state in enumerate(states)]
    assert status_for(pending) is status
    assert awaiting(pending) == waits


def test_the_inbox_lists_what_a_person_acts_on() -> None:
    assert waits_for_person(call("awaiting_approval")) == "approval"
    assert waits_for_person(call("outcome_unknown")) == "approval"
    assert waits_for_person(call("awaiting_input")) == "input"
    for state in ("awaiting_client", "deferred", "ready", "rejected"):
        assert waits_for_person(call(state)) is None
    assert set(WAIT_OF_STATE) == {
        "awaiting_approval",
        "outcome_unknown",
        "awaiting_input",
        "awaiting_client",
        "deferred",
    }


def test_require_settled_names_what_blocks_a_new_turn() -> None:
    from turnledger.turn.lifecycle import require_settled

    require_settled([call("awaiting_client")])
    with pytest.raises(ApprovalPending):
        require_settled([call("awaiting_input"), call("awaiting_approval", "c2")])
    with pytest.raises(InputPending) as waiting:
        require_settled([call("deferred", task_id="t")])
    [listed] = waiting.value.pending
    assert (listed.state, listed.task_id) == ("deferred", "t")
    require_settled([call("awaiting_input")], answered=["c1"])


# --- callback tokens -----------------------------------------------------------------------

KEY = bytes(range(32))
CLAIMS = callbacks.CallbackClaims(
    tenant="acme",
    conversation_id="c-1",
    created_at="2099-01-15T12:00:00+00:00",
    call_id="call_1",
    idempotency_key="a" * 32,
    deadline=int((NOW + timedelta(minutes=10)).timestamp()),
)


def test_a_token_verifies_to_its_claims() -> None:
    token = callbacks.sign(KEY, CLAIMS)
    assert callbacks.verify(KEY, token, now=NOW) == CLAIMS
    assert len(token) < callbacks.MAX_TOKEN_CHARS


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),
        lambda t: t[:40] + ("A" if t[40] != "A" else "B") + t[41:],
        lambda t: t[:-1],
        lambda t: t + "A",
        lambda t: t + ".x",
        lambda t: "x" * 3000,
        lambda t: "",
        lambda t: "%%%.%%%",
    ],
)
def test_a_mangled_token_is_refused(mangle: Any) -> None:
    with pytest.raises(CallbackInvalid):
        callbacks.verify(KEY, mangle(callbacks.sign(KEY, CLAIMS)), now=NOW)


def test_other_claims_or_another_key_are_refused() -> None:
    token = callbacks.sign(KEY, CLAIMS)
    forged = callbacks.sign(b"another key", CLAIMS)
    with pytest.raises(CallbackInvalid):
        callbacks.verify(KEY, forged, now=NOW)
    # Another tenant's token with this token's MAC (the last 32 bytes) spliced on.
    other = callbacks.sign(KEY, callbacks.CallbackClaims(**{**CLAIMS.__dict__, "tenant": "globex"}))
    raw = base64.urlsafe_b64decode(other + "=" * (-len(other) % 4))
    mac = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))[-32:]
    spliced = base64.urlsafe_b64encode(raw[:-32] + mac).decode().rstrip("=")
    with pytest.raises(CallbackInvalid):
        callbacks.verify(KEY, spliced, now=NOW)
    with pytest.raises(CallbackInvalid):
        callbacks.verify(None, token, now=NOW)


def test_a_token_is_opaque() -> None:
    """Issue 22: whoever holds the callback URL cannot read whose call it is."""
    token = callbacks.sign(KEY, CLAIMS)
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    for claim in (CLAIMS.tenant, CLAIMS.conversation_id, CLAIMS.call_id, CLAIMS.idempotency_key):
        assert claim.encode() not in raw and claim not in token
    # Each token is another text, even for the same claims (a random IV).
    assert callbacks.sign(KEY, CLAIMS) != token


def test_an_expired_token_is_refused() -> None:
    token = callbacks.sign(KEY, CLAIMS)
    with pytest.raises(CallbackInvalid):
        callbacks.verify(KEY, token, now=NOW + timedelta(minutes=10))


def test_the_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALLBACK_KEY", KEY.hex())
    monkeypatch.setenv("PUBLIC_BASE_URL", "https://api.example.com/")
    url = callbacks.callback_url(CLAIMS)
    assert url is not None and url.startswith("https://api.example.com/v1/callbacks/")
    assert callbacks.verify(KEY, url.rpartition("/")[2], now=NOW) == CLAIMS
    monkeypatch.delenv("CALLBACK_KEY")
    monkeypatch.delenv("CALLBACK_SECRET_ARN", raising=False)
    assert callbacks.callback_url(CLAIMS) is None
