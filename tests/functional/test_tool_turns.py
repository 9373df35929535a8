"""Tool calling with human approval and client tools, over every storage backend.

Each test drives :class:`Conversations` with the demo model (or a scripted one),
real ``http`` tools served by :class:`HttpSink` on 127.0.0.1 and an injected
clock; the ``store`` fixture runs it on memory, moto and DynamoDB Local. Every
model request is checked against the strict history rules before it is
answered, so no test can pass on a history a strict provider would refuse.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any
from unittest import mock

import httpx
import pytest
from turnledger.api.schemas import (
    ApprovalRequest,
    FunctionCallOutput,
    InputMessage,
    Rejection,
    TurnRequest,
    TurnResponse,
)
from turnledger.context.assembly import build_messages
from turnledger.core.config import ModelSpec, Settings
from turnledger.core.exceptions import (
    ApprovalPending,
    ConversationBusy,
    ConversationNotFound,
    InternalError,
    NotAwaitingApproval,
    UnknownModel,
    UnknownTool,
    UnknownToolCall,
)
from turnledger.core.models import ConversationKey, Event, ToolCall
from turnledger.ops.sweep import Sweeper
from turnledger.providers.base import Message, ModelReply, ModelRequest, Provider
from turnledger.providers.history import check_strict_history
from turnledger.store import codec
from turnledger.store.base import ConversationStore
from turnledger.tools import ToolRegistry, ToolRunner, arguments_sha256
from turnledger.turn.pipeline import Conversations

from tests.functional.http_sink import HttpSink, Reply
from tests.support import edge
from tests.support.concurrency import all_at_once
from tests.support.edge import Caller
from tests.support.factories import FakeClock, corrupt, opened_item, raw_sort_keys
from tests.support.providers import Recording

ANN = Caller(tenant="tenant-a", actor="ann")
#: A second approver of the same tenant.
BEN = Caller(tenant="tenant-a", actor="ben")

#: ``deploy`` needs approval for these environments, or whenever ``force`` is true.
DEPLOY_RULE = {
    "any": [
        {"when": {"argument": "environment", "in": ["production", "staging"]}},
        {"when": {"argument": "force", "equals": True}},
    ]
}


def tool_definitions(sink: HttpSink, *, timeout_seconds: float = 0.5) -> list[dict[str, Any]]:
    """The registry entries the tests use, with ``http`` tools served by ``sink``."""
    return [
        {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
            "executor": {
                "type": "http",
                "url": sink.url("/weather"),
                "timeout_seconds": timeout_seconds,
            },
        },
        {
            "name": "send_email",
            "description": "Send an email.",
            "parameters": {
                "type": "object",
                "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
                "required": ["to"],
            },
            "require_approval": True,
            "executor": {"type": "http", "url": sink.url("/email")},
        },
        {
            "name": "deploy",
            "parameters": {
                "type": "object",
                "properties": {"environment": {"type": "string"}, "force": {"type": "boolean"}},
                "required": ["environment"],
            },
            "require_approval": DEPLOY_RULE,
            "executor": {"type": "http", "url": sink.url("/deploy")},
        },
        {
            "name": "lookup_user",
            "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}}},
            "executor": {"type": "client"},
        },
    ]


def registry(sink: HttpSink, *, timeout_seconds: float = 0.5) -> ToolRegistry:
    """The test registry, loaded through the JSON loader a deployment uses."""
    definitions = tool_definitions(sink, timeout_seconds=timeout_seconds)
    return ToolRegistry.from_json(json.dumps({"tools": definitions}))


def script_tools(sink: HttpSink) -> None:
    """Every tool endpoint answers a small JSON object by default."""
    sink.respond("/weather", Reply(body={"temp": 21}))
    sink.respond("/email", Reply(body={"sent": True}))
    sink.respond("/deploy", Reply(body={"deployed": True}))


def tool_line(name: str, **arguments: Any) -> str:
    """One ``/tool`` line of the demo model."""
    return f"/tool {name} {json.dumps(arguments)}"


def lines(*parts: str) -> str:
    return "\n".join(parts)


class Strict(Recording):
    """The demo model (or scripted replies), refusing any history a strict API would refuse."""

    def __init__(self, *replies: ModelReply) -> None:
        super().__init__()
        self.replies = list(replies)

    def complete(self, request: ModelRequest) -> ModelReply:
        check_strict_history(request.messages)
        answer = super().complete(request)
        if not self.replies:
            return answer
        # Scripted: in order, the last one repeating.
        return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        script_tools(server)
        yield server


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client() as client:
        yield client


class Harness:
    """Builds services over one store, sink and clock; each build is a fresh "process"."""

    def __init__(
        self, store: ConversationStore, clock: FakeClock, sink: HttpSink, http: httpx.Client
    ) -> None:
        self.store = store
        self.clock = clock
        self.sink = sink
        self.http = http

    def service(self, provider: Provider | None = None, **settings: Any) -> Conversations:
        return Conversations(
            store=self.store,
            provider=provider or Strict(),
            settings=replace(Settings(), **settings),
            tools=registry(self.sink),
            runner=ToolRunner(self.http, None),
            clock=self.clock.now,
        )


@pytest.fixture
def harness(
    store: ConversationStore, clock: FakeClock, sink: HttpSink, http: httpx.Client
) -> Harness:
    return Harness(store, clock, sink, http)


def turn(
    svc: Conversations, text: str, conversation: str = "conv-1", **fields: Any
) -> TurnResponse:
    return edge.turn(svc, ANN, conversation, TurnRequest(input=text, **fields))


def decide(
    svc: Conversations,
    conversation: str = "conv-1",
    who: Caller = ANN,
    *,
    approve: list[str] | None = None,
    reject: list[str | Rejection] | None = None,
) -> TurnResponse:
    request = ApprovalRequest(approve=approve or [], reject=reject or [])
    return edge.approve(svc, who, conversation, request)


def transcript(svc: Conversations, conversation: str = "conv-1") -> list[Event]:
    page = edge.events(svc, ANN, conversation, after=0, limit=1000)
    assert page.next_after is None
    return [Event.model_validate(view.model_dump()) for view in page.events]


def of_kind(events: list[Event], kind: str) -> list[dict[str, Any]]:
    return [e.payload for e in events if e.kind.value == kind]


def assert_history_is_strict(svc: Conversations, conversation: str = "conv-1") -> None:
    """The rebuilt context, plus the next user message, is a history strict APIs accept."""
    messages = build_messages(transcript(svc, conversation))
    check_strict_history([*messages, Message(role="user", content="next")])


def bodies(sink: HttpSink, path: str) -> list[dict[str, Any]]:
    return [request.json() for request in sink.requests_for(path)]


# --- approvals --------------------------------------------------------------------------


def test_approve_all_runs_each_call_once_and_the_model_gets_every_result(
    harness: Harness, clock: FakeClock
) -> None:
    """Approval calls pause with an expiry; approving both runs each once, then the model."""
    svc = harness.service()
    first = turn(
        svc, lines(tool_line("send_email", to="a@x.org"), tool_line("send_email", to="b@x"))
    )
    assert first.status == "awaiting_approval"
    assert [(p.id, p.requires, p.arguments) for p in first.pending_tool_calls] == [
        ("call_1", "approval", {"to": "a@x.org"}),
        ("call_2", "approval", {"to": "b@x"}),
    ]
    deadline = clock.now() + timedelta(hours=24)
    assert all(p.expires_at == deadline for p in first.pending_tool_calls)
    assert [o.type for o in first.output] == ["function_call", "function_call"]
    assert harness.sink.requests_for("/email") == []
    view = edge.get(svc, ANN, "conv-1")
    assert view.status == "awaiting_approval"
    assert [(p.id, p.expires_at) for p in view.pending_tool_calls] == [
        ("call_1", deadline),
        ("call_2", deadline),
    ]

    clock.advance(90)
    done = decide(svc, approve=["call_1", "call_2"])
    assert done.status == "complete"
    assert done.pending_tool_calls == []
    assert done.turn == 1
    assert done.output_text == 'Tool results: send_email: {"sent":true}; send_email: {"sent":true}'

    sent = harness.sink.requests_for("/email")
    assert sorted(r.json()["arguments"]["to"] for r in sent) == ["a@x.org", "b@x"]
    events = transcript(svc)
    requested = {p["call_id"]: p for p in of_kind(events, "tool_call_requested")}
    assert {r.json()["call_id"]: r.idempotency_key for r in sent} == {
        call_id: p["idempotency_key"] for call_id, p in requested.items()
    }
    assert len({r.idempotency_key for r in sent}) == 2
    resolved = [e for e in events if e.kind.value == "approval_resolved"]
    assert [(e.payload["call_id"], e.payload["decision"]) for e in resolved] == [
        ("call_1", "approved"),
        ("call_2", "approved"),
    ]
    for event in resolved:
        call = requested[event.payload["call_id"]]
        assert event.payload["approver"] == "ann" and event.actor == "ann"
        assert event.occurred_at == clock.now()
        assert event.payload["arguments_sha256"] == arguments_sha256(call["arguments"])
    assert [p["call_id"] for p in of_kind(events, "tool_result")] == ["call_1", "call_2"]
    assert edge.get(svc, ANN, "conv-1").status == "complete"
    assert_history_is_strict(svc)


def test_reject_all_runs_nothing_and_tells_the_model_why(harness: Harness) -> None:
    """Rejected calls never run; the model gets a tool error naming the rejection and reason."""
    provider = Strict()
    svc = harness.service(provider)
    turn(svc, lines(tool_line("send_email", to="a@x"), tool_line("send_email", to="b@x")))
    done = decide(svc, reject=[Rejection(id="call_1", reason="wrong recipient"), "call_2"])
    assert done.status == "complete"
    assert harness.sink.requests == []
    assert done.output_text == (
        "Tool results: send_email: tool call send_email was not run: rejected by ann: "
        "wrong recipient; send_email: tool call send_email was not run: rejected by ann"
    )
    tool_messages = [m for m in provider.requests[-1].messages if m.role == "tool"]
    assert [(m.tool_call_id, m.is_error) for m in tool_messages] == [
        ("call_1", True),
        ("call_2", True),
    ]
    resolved = of_kind(transcript(svc), "approval_resolved")
    assert [(p["decision"], p["reason"]) for p in resolved] == [
        ("rejected", "wrong recipient"),
        ("rejected", None),
    ]
    assert_history_is_strict(svc)


def test_partial_decisions_wait_for_the_last_one(harness: Harness) -> None:
    """One decision of two: still awaiting, nothing runs, turns refused until all are decided."""
    svc = harness.service()
    turn(svc, lines(tool_line("send_email", to="a@x"), tool_line("send_email", to="b@x")))
    partial = decide(svc, approve=["call_1"])
    assert partial.status == "awaiting_approval"
    assert [p.id for p in partial.pending_tool_calls] == ["call_2"]
    assert harness.sink.requests == []

    with pytest.raises(ApprovalPending) as refused:
        turn(svc, "Hello?")
    assert [p.id for p in refused.value.pending] == ["call_2"]
    assert harness.sink.requests == []  # a refused turn runs nothing, not even approved calls

    done = decide(svc, reject=["call_2"])
    assert done.status == "complete"
    assert [b["arguments"] for b in bodies(harness.sink, "/email")] == [{"to": "a@x"}]
    assert done.output_text == (
        'Tool results: send_email: {"sent":true}; '
        "send_email: tool call send_email was not run: rejected by ann"
    )
    assert_history_is_strict(svc)


def test_mixed_auto_and_approval_calls_in_one_turn(harness: Harness) -> None:
    """A call needing no approval runs at once; it never runs again when the others are decided."""
    svc = harness.service()
    first = turn(
        svc,
        lines(
            tool_line("send_email", to="a@x"),
            tool_line("get_weather", city="Oslo"),
            tool_line("send_email", to="b@x"),
        ),
    )
    assert first.status == "awaiting_approval"
    assert [p.id for p in first.pending_tool_calls] == ["call_1", "call_3"]
    assert [b["arguments"] for b in bodies(harness.sink, "/weather")] == [{"city": "Oslo"}]
    assert [p["call_id"] for p in of_kind(transcript(svc), "tool_result")] == ["call_2"]

    done = decide(svc, approve=["call_3"], reject=["call_1"])
    assert done.status == "complete"
    assert len(harness.sink.requests_for("/weather")) == 1
    assert [b["arguments"] for b in bodies(harness.sink, "/email")] == [{"to": "b@x"}]
    # Results reach the model in the calls' order, whatever order they were recorded in.
    assert done.output_text == (
        "Tool results: send_email: tool call send_email was not run: rejected by ann; "
        'get_weather: {"temp":21}; send_email: {"sent":true}'
    )
    assert_history_is_strict(svc)


def test_parallel_auto_calls_run_concurrently(harness: Harness) -> None:
    """Calls needing no approval run at the same time (the sink's rendezvous proves it)."""
    harness.sink.rendezvous("/weather", 2)
    svc = harness.service()
    done = turn(
        svc, lines(tool_line("get_weather", city="Oslo"), tool_line("get_weather", city="Rome"))
    )
    assert done.status == "complete"
    assert done.output_text == 'Tool results: get_weather: {"temp":21}; get_weather: {"temp":21}'


@pytest.mark.parametrize(
    ("arguments", "needs_approval"),
    [
        ({"environment": "dev"}, False),
        ({"environment": "production"}, True),
        ({"environment": "staging"}, True),
        ({"environment": "dev", "force": True}, True),
        ({"environment": "dev", "force": 1}, None),  # invalid: force must be a boolean
    ],
)
def test_conditional_approval_follows_the_arguments(
    harness: Harness, arguments: dict[str, Any], needs_approval: bool | None
) -> None:
    """``require_approval`` conditions (``any`` of ``in``/``equals``) decide per call."""
    svc = harness.service()
    reply = turn(svc, tool_line("deploy", **arguments))
    if needs_approval:
        assert reply.status == "awaiting_approval"
        assert harness.sink.requests == []
        reply = decide(svc, approve=["call_1"])
    assert reply.status == "complete"
    ran = bodies(harness.sink, "/deploy")
    if needs_approval is None:
        assert ran == []
        assert reply.output_text is not None and "invalid arguments for tool deploy" in (
            reply.output_text
        )
    else:
        assert [b["arguments"] for b in ran] == [arguments]
        assert reply.output_text == 'Tool results: deploy: {"deployed":true}'


def test_call_level_require_approval_adds_and_lasts_the_whole_turn(harness: Harness) -> None:
    """A turn's ``require_approval`` pauses a tool the registry runs freely, after approvals too."""
    oslo = ToolCall(id="c1", name="get_weather", arguments={"city": "Oslo"})
    rome = ToolCall(id="c2", name="get_weather", arguments={"city": "Rome"})
    provider = Strict(
        ModelReply(tool_calls=[oslo]), ModelReply(tool_calls=[rome]), ModelReply(text="Done.")
    )
    svc = harness.service(provider)
    first = turn(svc, "Weather twice, please.", require_approval=["get_weather"])
    assert first.status == "awaiting_approval"
    assert harness.sink.requests == []
    second = decide(svc, approve=["c1"])
    # The model's next call of the same tool in the same turn still needs a human.
    assert second.status == "awaiting_approval"
    assert [p.id for p in second.pending_tool_calls] == ["c2"]
    assert [b["arguments"] for b in bodies(harness.sink, "/weather")] == [{"city": "Oslo"}]
    done = decide(svc, approve=["c2"])
    assert done.output_text == "Done."
    # The next turn without the addition runs the tool at once again.
    provider.replies = [ModelReply(tool_calls=[oslo]), ModelReply(text="Sunny.")]
    assert turn(svc, "Once more.").status == "complete"
    assert len(harness.sink.requests_for("/weather")) == 3


def test_a_turn_may_name_only_an_allowed_model(harness: Harness) -> None:
    """Issue 22: the default model, those MODELS describes and ALLOWED_MODELS; another is
    422 unknown_model and nothing is stored; ``*`` allows any."""
    svc = harness.service(
        allowed_models=("gpt-cheap",), models={"described": ModelSpec(8192, 1024)}
    )
    for allowed in ("demo-1", "gpt-cheap", "described"):
        assert turn(svc, "Hello.", model=allowed).status == "complete"
    with pytest.raises(UnknownModel) as refused:
        turn(svc, "Hello.", model="gpt-expensive")
    assert refused.value.status == 422 and refused.value.code == "unknown_model"
    assert refused.value.details == {
        "model": "gpt-expensive",
        "allowed": ["demo-1", "described", "gpt-cheap"],
    }
    assert len(transcript(svc)) == 6  # three turns, nothing of the refused one
    anything = harness.service(allowed_models=("*",))
    assert turn(anything, "Hello.", model="gpt-expensive").status == "complete"


def test_an_approval_continues_the_turn_with_its_model_and_tools(harness: Harness) -> None:
    """Model, tool subset and call-level approvals of a turn hold when another process
    continues it after an approval."""
    first = Strict()
    turn(
        harness.service(first, allowed_models=("custom-model",)),
        tool_line("send_email", to="a@x"),
        model="custom-model",
        tools=["send_email", "get_weather"],
        require_approval=["get_weather"],
    )
    later = Strict()
    done = decide(harness.service(later), approve=["call_1"])
    assert done.status == "complete"
    [continued] = later.requests
    assert continued.model == "custom-model"
    assert [t.name for t in continued.tools] == ["send_email", "get_weather"]
    assert edge.get(harness.service(), ANN, "conv-1").status == "complete"


def test_call_level_require_approval_never_waives_the_registrys(harness: Harness) -> None:
    """Naming other tools (or none) leaves a registry approval in force."""
    svc = harness.service()
    for conversation, extra in [("c-none", []), ("c-other", ["get_weather"])]:
        reply = turn(svc, tool_line("send_email", to="a@x"), conversation, require_approval=extra)
        assert reply.status == "awaiting_approval"
    assert harness.sink.requests == []


def test_unknown_tools_in_a_turn_are_rejected_before_anything_is_stored(harness: Harness) -> None:
    """``tools`` and ``require_approval`` naming unregistered tools: 422 unknown_tool, no trace."""
    svc = harness.service()
    with pytest.raises(UnknownTool) as unknown:
        turn(svc, "hi", tools=["get_weather", "teleport"])
    assert unknown.value.details["unknown"] == ["teleport"]
    with pytest.raises(UnknownTool):
        turn(svc, "hi", require_approval=["teleport"])
    with pytest.raises(ConversationNotFound):
        edge.get(svc, ANN, "conv-1")


def test_a_turn_offers_only_the_tools_it_names(harness: Harness) -> None:
    """The model sees the selected tools; a call of another tool is answered as unknown."""
    provider = Strict()
    svc = harness.service(provider)
    reply = turn(svc, tool_line("send_email", to="a@x"), tools=["get_weather"])
    assert [t.name for t in provider.requests[0].tools] == ["get_weather"]
    assert reply.status == "complete"
    assert reply.output_text == "Tool results: send_email: unknown tool 'send_email'"
    assert harness.sink.requests == []


def test_unknown_call_ids_are_refused_and_nothing_is_recorded(harness: Harness) -> None:
    """Deciding a call that is not pending is 422 unknown_tool_call; no decision is stored."""
    svc = harness.service()
    turn(svc, lines(tool_line("send_email", to="a@x"), tool_line("send_email", to="b@x")))
    before = edge.get(svc, ANN, "conv-1")
    with pytest.raises(UnknownToolCall) as unknown:
        decide(svc, approve=["call_1", "call_9"])
    assert unknown.value.details["unknown"] == ["call_9"]
    assert unknown.value.details["pending"] == ["call_1", "call_2"]
    assert edge.get(svc, ANN, "conv-1") == before
    assert harness.sink.requests == []


def test_approvals_with_nothing_pending(harness: Harness) -> None:
    """A complete conversation: 409 not_awaiting_approval; a missing one: 404."""
    svc = harness.service()
    with pytest.raises(ConversationNotFound):
        decide(svc, approve=["call_1"])
    turn(svc, "Hello.")
    with pytest.raises(NotAwaitingApproval):
        decide(svc, approve=["call_1"])
    turn(svc, tool_line("send_email", to="a@x"), "c2")
    decide(svc, "c2", approve=["call_1"])
    # A second approval of a call that already ran never runs it again.
    with pytest.raises(NotAwaitingApproval):
        decide(svc, "c2", approve=["call_1"])
    assert len(harness.sink.requests_for("/email")) == 1


def test_another_tenant_cannot_approve(harness: Harness) -> None:
    """An approval under another tenant finds no conversation (404, never 403)."""
    svc = harness.service()
    turn(svc, tool_line("send_email", to="a@x"))
    with pytest.raises(ConversationNotFound):
        edge.approve(svc, Caller("tenant-b", "eve"), "conv-1", ApprovalRequest(approve=["call_1"]))
    assert harness.sink.requests == []


def test_approval_after_a_process_restart_days_later(harness: Harness, clock: FakeClock) -> None:
    """The decision may come from another process, days later, within the approval window."""
    settings = {"approval_ttl_seconds": 5 * 24 * 3600, "ttl_seconds": 30 * 24 * 3600}
    turn(harness.service(**settings), tool_line("send_email", to="a@x"))
    clock.advance(3 * 24 * 3600)
    restarted = harness.service(**settings)
    assert [p.id for p in edge.get(restarted, ANN, "conv-1").pending_tool_calls] == ["call_1"]
    done = decide(restarted, who=BEN, approve=["call_1"])
    assert done.status == "complete"
    assert len(harness.sink.requests_for("/email")) == 1
    [resolved] = of_kind(transcript(restarted), "approval_resolved")
    assert resolved["approver"] == "ben"


def test_two_approvers_racing_one_wins_the_tool_runs_once(harness: Harness) -> None:
    """Both read the pending call; one commits its decision first, the other is busy."""
    turn(harness.service(), tool_line("send_email", to="a@x"))
    both_loaded = threading.Barrier(2)
    original = harness.store.load

    def load_then_wait(*args: Any, **kwargs: Any) -> Any:
        snapshot = original(*args, **kwargs)
        both_loaded.wait(timeout=10)
        return snapshot

    approvers = [ANN, BEN]

    def approve(index: int) -> object:
        try:
            return decide(harness.service(), who=approvers[index], approve=["call_1"])
        except ConversationBusy as exc:
            return exc

    with mock.patch.object(harness.store, "load", side_effect=load_then_wait):
        answers = all_at_once(len(approvers), approve)
    outcomes = {who.actor: outcome for who, outcome in zip(approvers, answers, strict=True)}
    busy = [who for who, outcome in outcomes.items() if isinstance(outcome, ConversationBusy)]
    won = [who for who, outcome in outcomes.items() if isinstance(outcome, TurnResponse)]
    assert len(busy) == 1 and len(won) == 1
    assert len(harness.sink.requests_for("/email")) == 1
    svc = harness.service()
    [resolved] = of_kind(transcript(svc), "approval_resolved")
    assert resolved["approver"] == won[0]
    assert edge.get(svc, ANN, "conv-1").status == "complete"


def test_approval_is_bound_to_the_exact_arguments(harness: Harness) -> None:
    """Arguments changed behind the approval's back are never run under it."""
    svc = harness.service()
    turn(svc, tool_line("send_email", to="a@x"))
    key = ConversationKey(tenant=ANN.tenant, conversation_id="conv-1")

    def redirect(body: dict[str, Any]) -> None:
        body["pending"][0]["arguments"] = {"to": "attacker@evil"}

    # The pending calls are the newest turn item's head state (docs/STORAGE.md).
    newest = [sk for sk in raw_sort_keys(harness.store, key) if sk.startswith("E#")][-1]
    # Its arguments are sealed apart (attribute c) by a store that seals: edited opened,
    # then sealed again, as someone holding the key would.
    state = opened_item(harness.store, key, newest)
    assert state is not None and codec.A_STATE in state
    body = json.loads(state[codec.A_STATE])
    redirect(body)
    bare = {k: v for k, v in state.items() if k != codec.A_BODY}
    edited = harness.store.sealer.seal({**bare, codec.A_STATE: json.dumps(body)})
    names = (codec.A_STATE, codec.A_CONTENT)
    corrupt(harness.store, key, newest, **{n: edited[n] for n in names if n in edited})
    with pytest.raises(InternalError):
        decide(svc, approve=["call_1"])
    assert harness.sink.requests == []


# --- expiry -----------------------------------------------------------------------------


def test_expired_approval_is_rejected_recorded_and_told_to_the_model(
    harness: Harness, clock: FakeClock
) -> None:
    """Past its window a call is rejected (``approval expired``); the next turn goes on."""
    provider = Strict()
    svc = harness.service(provider, approval_ttl_seconds=3600)
    first = turn(
        svc, lines(tool_line("send_email", to="a@x"), tool_line("get_weather", city="Oslo"))
    )
    assert first.pending_tool_calls[0].expires_at == clock.now() + timedelta(hours=1)
    clock.advance(3601)
    reply = turn(svc, "Never mind. What is my name?")
    assert reply.status == "complete"
    assert reply.output_text == "I don't know your name yet."
    assert harness.sink.requests_for("/email") == []
    tool_messages = [m for m in provider.requests[-1].messages if m.role == "tool"]
    assert [(m.tool_call_id, m.content, m.is_error) for m in tool_messages] == [
        ("call_1", "tool call send_email was not run: approval expired", True),
        ("call_2", '{"temp":21}', False),
    ]
    events = transcript(svc)
    expired = [e for e in events if e.kind.value == "approval_resolved"]
    assert [(e.payload["decision"], e.payload["reason"], e.actor) for e in expired] == [
        ("rejected", "approval expired", "system")
    ]
    # The expired call's result belongs to its own turn, before the new input.
    [result] = [
        e for e in events if e.kind.value == "tool_result" and e.payload["call_id"] == "call_1"
    ]
    [message] = [e for e in events if e.kind.value == "user_message" and e.turn == 2]
    assert result.turn == 1 and result.sequence < message.sequence
    assert_history_is_strict(svc)


def test_a_decision_after_expiry_is_refused_and_the_expiry_recorded(
    harness: Harness, clock: FakeClock
) -> None:
    """Deciding an expired call: 409 not_awaiting_approval; the expiry is stored, nothing runs."""
    svc = harness.service(approval_ttl_seconds=600)
    turn(svc, tool_line("send_email", to="a@x"))
    clock.advance(601)
    with pytest.raises(NotAwaitingApproval) as late:
        decide(svc, approve=["call_1"])
    assert late.value.details["expired"] == ["call_1"]
    view = edge.get(svc, ANN, "conv-1")
    assert (view.status, view.pending_tool_calls) == ("complete", [])
    [result] = of_kind(transcript(svc), "tool_result")
    assert result["output"] == "tool call send_email was not run: approval expired"
    assert harness.sink.requests == []
    assert turn(svc, "Hello.").status == "complete"
    assert_history_is_strict(svc)


def test_partial_approval_then_expiry_runs_the_approved_call(
    harness: Harness, clock: FakeClock
) -> None:
    """An approved call whose sibling expires still runs, once, before the next turn's input."""
    svc = harness.service(approval_ttl_seconds=600)
    turn(svc, lines(tool_line("send_email", to="a@x"), tool_line("send_email", to="b@x")))
    decide(svc, approve=["call_1"])
    clock.advance(601)
    assert turn(svc, "Next.").status == "complete"
    assert [b["arguments"] for b in bodies(harness.sink, "/email")] == [{"to": "a@x"}]
    outputs = {p["call_id"]: p["output"] for p in of_kind(transcript(svc), "tool_result")}
    assert outputs == {
        "call_1": '{"sent":true}',
        "call_2": "tool call send_email was not run: approval expired",
    }
    assert_history_is_strict(svc)


def test_approval_window_never_outlives_the_conversation(
    harness: Harness, clock: FakeClock
) -> None:
    """With a conversation TTL shorter than the approval window, the TTL bounds the expiry."""
    svc = harness.service(ttl_seconds=600)
    reply = turn(svc, tool_line("send_email", to="a@x"))
    assert reply.pending_tool_calls[0].expires_at == clock.now() + timedelta(seconds=600)


# --- client tools -----------------------------------------------------------------------


def test_client_tools_wait_for_the_callers_output(harness: Harness) -> None:
    """A client tool pauses the turn; its ``function_call_output`` continues the same turn."""
    svc = harness.service()
    first = turn(svc, tool_line("lookup_user", user_id="u1"))
    assert first.status == "awaiting_client_tools"
    assert [(p.id, p.requires, p.expires_at) for p in first.pending_tool_calls] == [
        ("call_1", "client", None)
    ]
    assert edge.get(svc, ANN, "conv-1").status == "awaiting_client_tools"
    with pytest.raises(NotAwaitingApproval):
        decide(svc, approve=["call_1"])

    with pytest.raises(UnknownToolCall):
        edge.turn(
            svc,
            ANN,
            "conv-1",
            TurnRequest(
                input=[FunctionCallOutput(type="function_call_output", call_id="x", output="?")]
            ),
        )
    done = edge.turn(
        svc,
        ANN,
        "conv-1",
        TurnRequest(
            input=[FunctionCallOutput(type="function_call_output", call_id="call_1", output="Ada")]
        ),
    )
    assert done.status == "complete"
    assert done.turn == 1
    assert done.output_text == "Tool results: lookup_user: Ada"
    [result] = [e for e in transcript(svc) if e.kind.value == "tool_result"]
    assert (result.actor, result.turn, result.payload["output"]) == ("client", 1, "Ada")
    assert harness.sink.requests == []
    assert_history_is_strict(svc)


def test_some_client_outputs_keep_waiting_for_the_rest(harness: Harness) -> None:
    """Outputs for some client calls are recorded; the turn waits for the others."""
    svc = harness.service()
    turn(svc, lines(tool_line("lookup_user", user_id="u1"), tool_line("lookup_user", user_id="u2")))
    output = FunctionCallOutput(type="function_call_output", call_id="call_2", output="Bo")
    waiting = edge.turn(svc, ANN, "conv-1", TurnRequest(input=[output]))
    assert waiting.status == "awaiting_client_tools"
    assert [p.id for p in waiting.pending_tool_calls] == ["call_1"]
    output = FunctionCallOutput(type="function_call_output", call_id="call_1", output="Al")
    done = edge.turn(svc, ANN, "conv-1", TurnRequest(input=[output]))
    assert done.output_text == "Tool results: lookup_user: Al; lookup_user: Bo"
    assert_history_is_strict(svc)


def test_a_new_message_while_client_tools_wait_clears_them(harness: Harness) -> None:
    """Plain input instead of outputs: the calls are closed as unresolved and the turn proceeds."""
    provider = Strict()
    svc = harness.service(provider)
    turn(svc, "My name is Ada.")
    turn(svc, tool_line("lookup_user", user_id="u1"))
    reply = turn(svc, "Forget it. What is my name?")
    assert (reply.status, reply.turn) == ("complete", 3)
    assert reply.output_text == "Your name is Ada."
    [result] = of_kind(transcript(svc), "tool_result")
    assert result["is_error"] and "unresolved" in result["output"]
    assert edge.get(svc, ANN, "conv-1").pending_tool_calls == []
    assert_history_is_strict(svc)


def test_outputs_and_a_message_in_one_input(harness: Harness) -> None:
    """An input may carry the output and a new message together: both are recorded, in order."""
    svc = harness.service()
    turn(svc, tool_line("lookup_user", user_id="u1"))
    reply = edge.turn(
        svc,
        ANN,
        "conv-1",
        TurnRequest(
            input=[
                FunctionCallOutput(type="function_call_output", call_id="call_1", output="Ada"),
                InputMessage(type="message", role="user", content="My name is Ada."),
            ]
        ),
    )
    assert reply.status == "complete" and reply.turn == 2
    assert reply.output_text == "Noted (2 user messages so far)."
    assert [p["output"] for p in of_kind(transcript(svc), "tool_result")] == ["Ada"]
    assert_history_is_strict(svc)


# --- invalid calls, failing tools, the step limit -----------------------------------------


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (
            tool_line("get_weather", town="Oslo"),
            "invalid arguments for tool get_weather: arguments is missing required property 'city'",
        ),
        ('/tool get_weather {"city": ', "the arguments were not a JSON object"),
        # As deep as a request body may not be: refused by the same limit, never a crash.
        (
            "/tool get_weather " + '{"a": ' * 900 + "1" + "}" * 900,
            "invalid arguments for tool get_weather: "
            "the arguments' JSON nests deeper than 64 levels",
        ),
        (tool_line("teleport", to="moon"), "unknown tool 'teleport'"),
    ],
)
def test_invalid_calls_run_nothing_and_the_model_gets_the_error(
    harness: Harness, line: str, error: str
) -> None:
    """Arguments failing the schema (or no JSON, or no such tool): the error is the result."""
    svc = harness.service()
    reply = turn(svc, line)
    assert reply.status == "complete"
    assert reply.output_text is not None and error in reply.output_text
    assert harness.sink.requests == []
    [result] = of_kind(transcript(svc), "tool_result")
    assert result["is_error"] is True and error in result["output"]
    assert_history_is_strict(svc)


def test_an_invalid_call_needing_approval_never_asks_for_it(harness: Harness) -> None:
    """Validation comes first: an invalid call of an approval tool is answered at once."""
    svc = harness.service()
    reply = turn(svc, tool_line("send_email", body="no recipient"))
    assert reply.status == "complete"
    assert reply.output_text is not None and "missing required property 'to'" in reply.output_text
    assert of_kind(transcript(svc), "approval_requested") == []


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (Reply(status=503, body={"error": "down"}), "tool get_weather failed: HTTP 503"),
        (Reply(delay=30, body={}), "tool get_weather timed out after 0.5s"),
        (
            Reply(raw=b"<html>oops</html>"),
            "tool get_weather returned malformed JSON: the answer is not JSON: "
            "expecting value at line 1, column 1",
        ),
    ],
    ids=["5xx", "timeout", "bad-json"],
)
def test_failing_tools_answer_the_model_and_the_conversation_stays_usable(
    harness: Harness, reply: Reply, error: str
) -> None:
    """5xx, timeout, bad JSON: the model gets the error as the result; the next turn works."""
    harness.sink.respond("/weather", reply)
    svc = harness.service()
    turn(svc, "My name is Ada.")
    answer = turn(svc, tool_line("get_weather", city="Oslo"))
    assert answer.status == "complete"
    assert answer.output_text is not None and answer.output_text.startswith(
        f"Tool results: get_weather: {error}"
    )
    [result] = of_kind(transcript(svc), "tool_result")
    assert result["is_error"] is True
    assert turn(svc, "What is my name?").output_text == "Your name is Ada."
    assert_history_is_strict(svc)


def test_the_step_limit_ends_the_turn_with_a_reason(harness: Harness) -> None:
    """A model that keeps calling tools is stopped after ``max_tool_steps`` calls, visibly."""
    again = ModelReply(tool_calls=[ToolCall(id="c1", name="get_weather", arguments={"city": "X"})])
    provider = Strict(again)
    svc = harness.service(provider, max_tool_steps=3)
    reply = turn(svc, "Loop forever.")
    assert reply.status == "complete"
    assert reply.status_reason == "max_tool_steps"
    assert reply.output_text is None
    assert len(provider.requests) == 3
    assert len(harness.sink.requests_for("/weather")) == 3
    assert [o.type for o in reply.output] == ["function_call"] * 3
    assert edge.get(svc, ANN, "conv-1").status == "complete"
    # Every result is recorded; the conversation goes on.
    assert len(of_kind(transcript(svc), "tool_result")) == 3
    provider.replies = [ModelReply(text="Fine.")]
    nxt = turn(svc, "Stop now.")
    assert (nxt.output_text, nxt.status_reason) == ("Fine.", None)
    assert_history_is_strict(svc)


def test_a_text_answer_within_the_limit_has_no_reason(harness: Harness) -> None:
    """The ordinary tool loop: call, result, text; no status reason."""
    svc = harness.service(max_tool_steps=2)
    reply = turn(svc, tool_line("get_weather", city="Oslo"))
    assert (reply.status_reason, reply.output_text) == (
        None,
        'Tool results: get_weather: {"temp":21}',
    )


def test_a_repeated_call_id_in_one_reply_keeps_the_history_valid(harness: Harness) -> None:
    """Providers may repeat a call id in one reply: each call still gets its own result."""
    calls = [
        ToolCall(id="dup", name="get_weather", arguments={"city": "Oslo"}),
        ToolCall(id="dup", name="get_weather", arguments={"city": "Rome"}),
    ]
    provider = Strict(ModelReply(tool_calls=calls), ModelReply(text="Both done."))
    svc = harness.service(provider)
    reply = turn(svc, "Two cities.")
    assert reply.output_text == "Both done."
    assert sorted(b["arguments"]["city"] for b in bodies(harness.sink, "/weather")) == [
        "Oslo",
        "Rome",
    ]
    [assistant, *_] = of_kind(transcript(svc), "assistant_message")
    assert [c["id"] for c in assistant["tool_calls"]] == ["dup", "dup_2"]
    assert_history_is_strict(svc)


# --- exact expiry: shown at once, recorded by the sweep's pass, out of the inbox ----------


def test_expiry_is_shown_at_once_then_recorded_by_expire_waits(
    harness: Harness, clock: FakeClock
) -> None:
    """A call whose window closed is shown by GET among ``expired_tool_calls`` at once;
    ``expire_waits`` (the sweep's pass) records ``approval_expired``, the rejection and the
    model's error result in one commit, once, which also deletes its inbox entry."""
    svc = harness.service(approval_ttl_seconds=600)
    key = ConversationKey(tenant=ANN.tenant, conversation_id="conv-1")
    first = turn(svc, lines(tool_line("send_email", to="a@x")))
    [call] = first.pending_tool_calls
    assert svc.expire_waits(key) == []  # nothing due yet: nothing written
    listed = harness.store.inbox_page(ANN.tenant, now=clock.now(), limit=10).entries
    assert [(e.call_id, e.requested_by) for e in listed] == [(call.id, "ann")]
    clock.advance(601)
    view = edge.get(svc, ANN, "conv-1")
    assert view.pending_tool_calls == []
    assert [c.id for c in view.expired_tool_calls] == [call.id]
    assert harness.store.inbox_page(ANN.tenant, now=clock.now(), limit=10).entries == []
    assert svc.expire_waits(key) == [call.id]
    assert svc.expire_waits(key) == []  # recorded once
    events = transcript(svc)
    assert [e.kind.value for e in events][-3:] == [
        "approval_expired",
        "approval_resolved",
        "tool_result",
    ]
    assert events[-3].payload["call_id"] == call.id
    assert events[-1].payload["output"] == "tool call send_email was not run: approval expired"
    view = edge.get(svc, ANN, "conv-1")
    assert (view.status, view.pending_tool_calls, view.expired_tool_calls) == ("complete", [], [])
    # The entry is gone from the index itself, not only hidden by its expiry.
    before = first.pending_tool_calls[0].expires_at - timedelta(seconds=1)
    assert harness.store.inbox_page(ANN.tenant, now=before, limit=10).entries == []


def test_the_sweep_records_expired_approvals_nobody_touches(
    harness: Harness, clock: FakeClock
) -> None:
    """The sweep's pass over ``by-wait`` records each expired approval once (its report's
    ``waits_expired``), leaves calls still in their window alone, and empties the inbox."""
    svc = harness.service(approval_ttl_seconds=600)
    turn(svc, lines(tool_line("send_email", to="a@x")), conversation="late")
    clock.advance(300)
    turn(svc, lines(tool_line("send_email", to="b@x")), conversation="fresh")
    clock.advance(301)
    sweeper = Sweeper(harness.store, clock=clock.now, expire_waits=svc.expire_waits)
    report = sweeper.expired()
    assert report.waits_expired == 1 and report.complete
    assert [e.kind.value for e in transcript(svc, "late")][-3:] == [
        "approval_expired",
        "approval_resolved",
        "tool_result",
    ]
    assert edge.get(svc, ANN, "fresh").pending_tool_calls != []
    assert [
        e.conversation_id
        for e in harness.store.inbox_page(ANN.tenant, now=clock.now(), limit=9).entries
    ] == ["fresh"]
    assert sweeper.expired().waits_expired == 0
    clock.advance(300)
    assert sweeper.expired().waits_expired == 1
    assert harness.store.inbox_page(ANN.tenant, now=clock.now(), limit=9).entries == []


def _counting_wait_queries(
    store: ConversationStore, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[int, int]]:
    """The ``by-wait`` queries (bucket, shard) the store answers from now on."""
    asked: list[tuple[int, int]] = []
    due_in = store.due_in

    def counted(bucket: int, shard: int) -> Iterator[ConversationKey]:
        asked.append((bucket, shard))
        return due_in(bucket, shard)

    monkeypatch.setattr(store, "due_in", counted)
    return asked


def _hour(clock: FakeClock, *, settled: bool = False) -> int:
    """The clock's hour bucket; with ``settled``, the last one the sweep may move past (it
    ended a minute ago: ``turnledger.ops.sweep.INDEX_SETTLE_SECONDS``)."""
    return (int(clock.now().timestamp()) - (60 if settled else 0)) // 3600


def test_the_sweeps_waits_pass_reads_from_its_cursor_not_the_whole_look_back(
    harness: Harness, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first run reads 48 hours of ``by-wait`` buckets and leaves the pass's cursor at
    the last settled hour; the next runs read from the cursor on (a bucket or two), and
    still record a window that closes in a later hour."""
    svc = harness.service(approval_ttl_seconds=7200)
    turn(svc, lines(tool_line("send_email", to="a@x")), conversation="waiting")
    sweeper = Sweeper(harness.store, clock=clock.now, expire_waits=svc.expire_waits)
    asked = _counting_wait_queries(harness.store, monkeypatch)

    assert sweeper.expired().waits_expired == 0
    assert len({bucket for bucket, _ in asked}) == 49
    cursor = harness.store.read_sweep_cursor("waits")
    assert cursor == _hour(clock, settled=True)

    asked.clear()
    clock.advance(1800)
    assert sweeper.expired().waits_expired == 0
    assert {bucket for bucket, _ in asked} == set(range(cursor, _hour(clock) + 1))
    assert len(asked) <= 2 * 4  # two buckets of four shards, at most

    clock.advance(7200)  # the window closed, in a later hour
    cursor = harness.store.read_sweep_cursor("waits")
    assert cursor is not None
    asked.clear()
    assert sweeper.expired().waits_expired == 1
    assert {bucket for bucket, _ in asked} == set(range(cursor, _hour(clock) + 1))
    assert harness.store.read_sweep_cursor("waits") == _hour(clock, settled=True)


@pytest.mark.parametrize(
    "failure",
    [RuntimeError("the store hiccupped"), ConversationBusy("a run holds its lease")],
    ids=["failed", "busy"],
)
def test_a_conversation_whose_expiry_fails_holds_the_waits_cursor_until_it_is_recorded(
    harness: Harness, clock: FakeClock, failure: Exception
) -> None:
    """A failure, or a request holding the conversation, is retried by the next run: the
    cursor stays at its bucket meanwhile."""
    svc = harness.service(approval_ttl_seconds=600)
    turn(svc, lines(tool_line("send_email", to="a@x")), conversation="stuck")
    filed = int(clock.now().timestamp() + 600) // 3600
    failures = iter([failure])

    def flaky(key: ConversationKey) -> list[str]:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return svc.expire_waits(key)

    sweeper = Sweeper(harness.store, clock=clock.now, expire_waits=flaky)
    clock.advance(3 * 3600)
    assert sweeper.expired().waits_expired == 0
    assert harness.store.read_sweep_cursor("waits") == filed
    assert sweeper.expired().waits_expired == 1
    assert harness.store.read_sweep_cursor("waits") == _hour(clock, settled=True)


def test_a_targeted_sweep_records_expired_approvals_as_the_full_sweep_does(
    harness: Harness, clock: FakeClock
) -> None:
    """``POST /_local/sweep {"conversation_ids": [...]}`` (``Sweeper.conversations``) does the
    full sweep's work for the conversations it names, the expiry pass included; the others
    are left to their own sweep."""
    svc = harness.service(approval_ttl_seconds=600)
    for conversation in ("named", "unnamed"):
        turn(svc, lines(tool_line("send_email", to="a@x")), conversation=conversation)
    clock.advance(601)
    sweeper = Sweeper(harness.store, clock=clock.now, expire_waits=svc.expire_waits)
    named = ConversationKey(tenant=ANN.tenant, conversation_id="named")
    report = sweeper.conversations([named])
    assert report.waits_expired == 1 and report.complete
    assert [e.kind.value for e in transcript(svc, "named")][-3:] == [
        "approval_expired",
        "approval_resolved",
        "tool_result",
    ]
    assert "approval_expired" not in [e.kind.value for e in transcript(svc, "unnamed")]
    assert sweeper.conversations([named]).waits_expired == 0  # recorded once
    assert sweeper.expired().waits_expired == 1  # the one the targeted sweep did not name
