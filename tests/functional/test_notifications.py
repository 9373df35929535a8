"""Approval notifications: EventBridge events (moto) and signed webhooks (a real HTTP sink).

A turn that pauses for approval, the decision, and an expiry each publish one
event on the bus after their commit (arguments only when configured); so do a
human-input call's request and its answer (``input.*``, kind ``input``) and a
cancel that ends a person's wait (``<kind>.cancelled``); a tool with a ``notify``
URL gets each one POSTed with a signature the receiver can check; a bus or
webhook that fails never fails the request.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import pytest
from moto import mock_aws
from turnledger.api.schemas import ApprovalRequest, CallOutput, Rejection, TurnRequest
from turnledger.core.config import Settings
from turnledger.core.models import (
    ConversationKey,
    Event,
    EventKind,
    Head,
    PendingCall,
    TurnInterrupted,
)
from turnledger.core.observability import logger
from turnledger.ops.notifications import (
    SIGNATURE_HEADER,
    Publisher,
    key_id,
    notifications_of,
    receiver_key,
)
from turnledger.providers.demo import DemoProvider
from turnledger.store.memory import MemoryConversationStore
from turnledger.tools import ToolRegistry, ToolRunner
from turnledger.turn.pipeline import Conversations

from tests.functional.http_sink import HttpSink, Reply
from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import FakeClock

ANN = Caller(tenant="acme", actor="ann")
RITA = Caller(tenant="acme", actor="rita")
SECRET = "s3cret-for-tests"


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        server.respond("/email", Reply(body={"sent": True}))
        server.respond("/hook", Reply(body={}))
        yield server


def service(sink: HttpSink, clock: FakeClock, publisher: Publisher) -> Conversations:
    registry = ToolRegistry.from_json(
        json.dumps(
            {
                "tools": [
                    {
                        "name": "send_email",
                        "parameters": {"type": "object"},
                        "require_approval": True,
                        "executor": {"type": "http", "url": sink.url("/email")},
                        "notify": sink.url("/hook"),
                    },
                    {
                        "name": "pay",
                        "parameters": {"type": "object"},
                        "require_approval": True,
                        "executor": {"type": "http", "url": sink.url("/email")},
                    },
                    {
                        "name": "ask_operator",
                        "parameters": {
                            "type": "object",
                            "properties": {"question": {"type": "string"}},
                        },
                        "executor": {"type": "human"},
                        "notify": sink.url("/hook"),
                    },
                ]
            }
        )
    )
    publisher.webhook_of = lambda tool: registry.get(tool).notify
    svc = Conversations(
        store=MemoryConversationStore(),
        provider=DemoProvider(),
        settings=Settings(approval_ttl_seconds=600),
        tools=registry,
        runner=ToolRunner(httpx.Client(timeout=5), None),
        clock=clock.now,
    )
    svc.on_commit = publisher.on_commit
    return svc


def ask(svc: Conversations, conversation: str, tool: str, **arguments: Any) -> str:
    reply = edge.turn(
        svc, ANN, conversation, TurnRequest(input=f"/tool {tool} {json.dumps(arguments)}")
    )
    assert reply.status == "awaiting_approval"
    return reply.pending_tool_calls[0].id


@pytest.fixture
def bus() -> Iterator[tuple[Any, str]]:
    """A bus whose turnledger events land in an SQS queue (moto), and that queue's URL."""
    with mock_aws():
        events = boto3.client("events", region_name="us-east-1")
        sqs = boto3.client("sqs", region_name="us-east-1")
        events.create_event_bus(Name="approvals")
        queue = sqs.create_queue(QueueName="approvals")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        events.put_rule(
            Name="all",
            EventBusName="approvals",
            EventPattern=json.dumps({"source": ["turnledger"]}),
        )
        events.put_targets(
            Rule="all", EventBusName="approvals", Targets=[{"Id": "queue", "Arn": arn}]
        )
        yield sqs, queue


def received(sqs: Any, queue: str) -> list[dict[str, Any]]:
    found = []
    while True:
        answer = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)
        if not answer.get("Messages"):
            return found
        for message in answer["Messages"]:
            found.append(json.loads(message["Body"]))
            sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])


def bus_publisher() -> Publisher:
    """A publisher to the ``approvals`` bus (the ``bus`` fixture's rule sends on to a queue)."""
    return Publisher(
        bus="approvals",
        events_client=lambda: boto3.client("events", region_name="us-east-1"),
        post=httpx.post,
        secret=lambda: SECRET,
    )


def test_requests_decisions_and_expiries_reach_the_bus(
    bus: tuple[Any, str], sink: HttpSink, clock: FakeClock
) -> None:
    sqs, queue = bus
    publisher = bus_publisher()
    svc = service(sink, clock, publisher)
    first = ask(svc, "c1", "pay", amount=12, iban="DE00")
    [requested] = received(sqs, queue)
    assert requested["source"] == "turnledger"
    assert requested["detail-type"] == "approval.requested"
    detail = requested["detail"]
    assert {k: detail[k] for k in ("tenant", "conversation_id", "call_id", "tool", "kind")} == {
        "tenant": "acme",
        "conversation_id": "c1",
        "call_id": first,
        "tool": "pay",
        "kind": "approval",
    }
    assert detail["expires_at"]
    assert "arguments" not in detail  # never, unless configured
    edge.approve(svc, RITA, "c1", ApprovalRequest(reject=[Rejection(id=first, reason="no")]))
    [decided] = received(sqs, queue)
    assert decided["detail-type"] == "approval.decided"
    assert (decided["detail"]["decision"], decided["detail"]["approver"]) == ("rejected", "rita")
    assert decided["detail"]["reason"] == "no"

    second = ask(svc, "c2", "pay", amount=3)
    received(sqs, queue)
    clock.advance(601)
    assert svc.expire_waits(ConversationKey(tenant="acme", conversation_id="c2")) == [second]
    [expired] = received(sqs, queue)
    assert expired["detail-type"] == "approval.expired"
    assert expired["detail"]["call_id"] == second

    publisher.include_arguments = True
    ask(svc, "c3", "pay", amount=7)
    [with_arguments] = received(sqs, queue)
    assert with_arguments["detail"]["arguments"] == {"amount": 7}


def test_webhooks_are_signed_and_failures_never_fail_the_request(
    sink: HttpSink, clock: FakeClock
) -> None:
    publisher = Publisher(
        bus="missing-bus",
        # A bus that refuses everything: the turn still answers.
        events_client=lambda: boto3.client(
            "events", region_name="us-east-1", endpoint_url="http://127.0.0.1:9"
        ),
        post=httpx.post,
        secret=lambda: SECRET,
        clock=lambda: 1_700_000_000.0,
    )
    svc = service(sink, clock, publisher)
    call = ask(svc, "c1", "send_email", to="bob@example.com")
    reply = edge.approve(svc, RITA, "c1", ApprovalRequest(approve=[call]))
    assert reply.status == "complete"
    hooks = sink.requests_for("/hook")
    assert [h.json()["detail-type"] for h in hooks] == ["approval.requested", "approval.decided"]
    for hook in hooks:
        header = hook.header(SIGNATURE_HEADER.lower()) or ""
        parts = dict(part.split("=", 1) for part in header.split(","))
        assert parts["t"] == "1700000000"
        key = receiver_key(SECRET, sink.url("/hook"))
        assert parts["kid"] == key_id(key)
        expected = hmac.new(
            key.encode(), f"{parts['t']}.".encode() + hook.body, hashlib.sha256
        ).hexdigest()
        assert hmac.compare_digest(parts["v1"], expected)
        assert hook.json()["detail"]["tool"] == "send_email"
        assert "arguments" not in hook.json()["detail"]
    # A tool without a webhook sends none; a webhook that answers 500 fails nothing.
    sink.respond("/hook", Reply(status=500, body={}))
    other = ask(svc, "c2", "send_email", to="x@example.com")
    assert edge.approve(svc, RITA, "c2", ApprovalRequest(approve=[other])).status == "complete"
    ask(svc, "c3", "pay", amount=1)
    assert len(sink.requests_for("/hook")) == 4


def ask_person(svc: Conversations, conversation: str, question: str) -> str:
    """A turn whose model asks the human-input tool; returns the call id."""
    line = f"/tool ask_operator {json.dumps({'question': question})}"
    reply = edge.turn(svc, ANN, conversation, TurnRequest(input=line))
    assert reply.status == "awaiting_hitl"
    return reply.pending_tool_calls[0].id


def test_input_requests_answers_and_cancels_reach_the_bus(
    bus: tuple[Any, str], sink: HttpSink, clock: FakeClock
) -> None:
    sqs, queue = bus
    publisher = bus_publisher()
    svc = service(sink, clock, publisher)

    # Requested: kind input, no deadline, no arguments unless configured.
    call = ask_person(svc, "c1", "budget?")
    [requested] = received(sqs, queue)
    assert requested["detail-type"] == "input.requested"
    assert requested["detail"] == {
        "event_id": requested["detail"]["event_id"],
        "tenant": "acme",
        "conversation_id": "c1",
        "call_id": call,
        "tool": "ask_operator",
        "kind": "input",
        "expires_at": None,
    }
    # Answered on the approvals route: who and how, never the answer itself.
    reply = edge.approve(
        svc, RITA, "c1", ApprovalRequest(outputs=[CallOutput(id=call, output="42k")])
    )
    assert reply.status == "complete"
    [provided] = received(sqs, queue)
    assert provided["detail-type"] == "input.provided"
    detail = provided["detail"]
    assert (detail["call_id"], detail["kind"], detail["provided_by"], detail["via"]) == (
        call,
        "input",
        "rita",
        "approvals",
    )
    assert "42k" not in json.dumps(provided)

    # Answered by a function_call_output item of a turn: via "turn".
    publisher.include_arguments = True
    call = ask_person(svc, "c2", "name?")
    [requested] = received(sqs, queue)
    assert requested["detail"]["arguments"] == {"question": "name?"}
    answer = TurnRequest.model_validate(
        {"input": [{"type": "function_call_output", "call_id": call, "output": "Ada"}]}
    )
    assert edge.turn(svc, ANN, "c2", answer).status == "complete"
    [provided] = received(sqs, queue)
    assert provided["detail-type"] == "input.provided"
    assert (provided["detail"]["provided_by"], provided["detail"]["via"]) == ("ann", "turn")
    publisher.include_arguments = False

    # A cancel ends the wait: told with who and why.
    call = ask_person(svc, "c3", "really?")
    received(sqs, queue)
    cancelled = edge.cancel(svc, RITA, "c3", reason="customer left")
    assert cancelled.cancelled_call_ids == [call]
    [told] = received(sqs, queue)
    assert told["detail-type"] == "input.cancelled"
    assert (told["detail"]["call_id"], told["detail"]["kind"]) == (call, "input")
    assert (told["detail"]["cancelled_by"], told["detail"]["reason"]) == ("rita", "customer left")


def test_a_cancel_tells_only_of_calls_a_person_waited_for(clock: FakeClock) -> None:
    """``<kind>.cancelled`` for an approval and an input call; nothing for a client call
    (nobody was told it waited)."""

    def pending(call_id: str, requires: str, state: str) -> PendingCall:
        return PendingCall.model_validate(
            {
                "id": call_id,
                "name": f"tool_{call_id}",
                "arguments": {},
                "requires": requires,
                "state": state,
                "idempotency_key": f"k-{call_id}",
                "arguments_sha256": "0" * 64,
            }
        )

    before = [
        pending("a", "approval", "awaiting_approval"),
        pending("i", "input", "awaiting_input"),
        pending("c", "client", "awaiting_client"),
    ]
    interrupted = Event(
        event_id="e1",
        conversation_id="c1",
        sequence=9,
        turn=1,
        kind=EventKind.TURN_INTERRUPTED,
        actor="rita",
        occurred_at=clock.now(),
        payload=TurnInterrupted(
            interrupted_by="rita", cancelled_call_ids=["a", "i", "c"], reason=None
        ).model_dump(mode="json"),
    )
    notes = notifications_of(
        ConversationKey(tenant="acme", conversation_id="c1"),
        before,
        Head.model_construct(pending=[]),
        [interrupted],
        include_arguments=False,
    )
    assert [(n.detail_type, n.detail["call_id"], n.detail["kind"]) for n in notes] == [
        ("approval.cancelled", "a", "approval"),
        ("input.cancelled", "i", "input"),
    ]


def test_input_webhooks_are_signed(sink: HttpSink, clock: FakeClock) -> None:
    publisher = Publisher(post=httpx.post, secret=lambda: SECRET, clock=lambda: 1_700_000_000.0)
    svc = service(sink, clock, publisher)
    call = ask_person(svc, "c1", "budget?")
    edge.approve(svc, RITA, "c1", ApprovalRequest(outputs=[CallOutput(id=call, output="42k")]))
    hooks = sink.requests_for("/hook")
    assert [(h.json()["detail-type"], h.json()["detail"]["kind"]) for h in hooks] == [
        ("input.requested", "input"),
        ("input.provided", "input"),
    ]
    for hook in hooks:
        parts = dict(
            part.split("=", 1) for part in (hook.header("turnledger-signature") or "").split(",")
        )
        expected = hmac.new(
            receiver_key(SECRET, sink.url("/hook")).encode(),
            f"{parts['t']}.".encode() + hook.body,
            hashlib.sha256,
        ).hexdigest()
        assert hmac.compare_digest(parts["v1"], expected)


def test_each_receiver_has_its_own_key_and_every_event_an_id(
    sink: HttpSink, clock: FakeClock
) -> None:
    """Issue 22: a key per receiver (another receiver's key does not verify), an event id
    that is the same when the same notification is sent again, times with ``Z``, and a
    failing webhook logged by its host only."""
    publisher = Publisher(post=httpx.post, secret=lambda: SECRET, clock=lambda: 1_700_000_000.0)
    svc = service(sink, clock, publisher)
    ask(svc, "wh-1", "send_email", to="bob@example.com")
    [hook] = sink.requests_for("/hook")
    parts = dict(p.split("=", 1) for p in (hook.header("turnledger-signature") or "").split(","))
    for key, verifies in (
        (receiver_key(SECRET, sink.url("/hook")), True),
        (receiver_key(SECRET, sink.url("/other-hook")), False),
        (SECRET, False),  # the deployment's secret itself signs nothing
    ):
        mac = hmac.new(key.encode(), f"{parts['t']}.".encode() + hook.body, hashlib.sha256)
        assert hmac.compare_digest(parts["v1"], mac.hexdigest()) is verifies
    detail = hook.json()["detail"]
    assert detail["event_id"].startswith("evt_") and len(detail["event_id"]) == 36
    assert detail["expires_at"].endswith("Z") and "+00:00" not in hook.body.decode()

    # The same commit told again (a retried publish) carries the same id; another call another.
    key = ConversationKey(tenant="acme", conversation_id="wh-1")
    head = svc.store.get_head(key)
    assert head is not None
    events = svc.store.read_events(key, head, after=0, limit=100)
    again = notifications_of(key, [], head, events, include_arguments=False)
    assert [n.detail["event_id"] for n in again] == [detail["event_id"]]
    ask(svc, "wh-2", "send_email", to="eve@example.com")
    assert sink.requests_for("/hook")[-1].json()["detail"]["event_id"] != detail["event_id"]

    # A webhook that cannot be reached: logged by scheme and host, never its path.
    publisher.webhook_of = lambda _tool: "http://127.0.0.1:9/private/token-abc?sig=xyz"
    stream = io.StringIO()
    previous = logger.registered_handler.setStream(stream)  # type: ignore[attr-defined]
    try:
        ask(svc, "wh-3", "send_email", to="x@example.com")
    finally:
        logger.registered_handler.setStream(previous)  # type: ignore[attr-defined]
    [line] = [json.loads(text) for text in stream.getvalue().splitlines() if "notification" in text]
    assert line["url"] == "http://127.0.0.1"
    assert "token-abc" not in stream.getvalue() and "sig=xyz" not in stream.getvalue()
