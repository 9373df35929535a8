"""Telling people that a call waits for them, was decided, answered, expired or cancelled.

After a commit lands (never before: a commit that fails told nobody anything),
every approval it requested, decided or expired, every human-input call it
requested or got the answer of, and every such wait a cancel ended is published:

* as an EventBridge event on the deployment's bus (``NOTIFICATIONS_BUS``, the
  template's ``NotificationsBus``): source ``turnledger``, detail-type
  ``approval.requested`` / ``approval.decided`` / ``approval.expired`` and
  ``input.requested`` / ``input.provided`` (a human-input tool's call: kind
  ``input``), and ``approval.cancelled`` / ``input.cancelled`` when ``POST
  .../cancel`` ends such a wait; detail ``{tenant, conversation_id, call_id,
  tool, kind, expires_at}`` (plus ``decision``, ``approver``, ``reason`` for a
  decision; ``provided_by``, ``via`` for an answer, never the answer itself;
  ``cancelled_by``, ``reason`` for a cancel) and the arguments only when
  ``NOTIFY_INCLUDE_ARGUMENTS`` is true: a team routes them with rules to Slack,
  e-mail or a ticket queue, and closes the message when the wait ends;
* to the tool's own ``notify`` webhook (tool registry), when it has one: a POST
  of ``{"source", "detail-type", "detail"}`` signed with HMAC-SHA256 over
  ``"<timestamp>.<body>"`` under a shared secret (Secrets Manager
  ``NOTIFY_SECRET_ARN``, or ``NOTIFY_SECRET``), in the header
  ``Turnledger-Signature: t=<timestamp>,v1=<hex>``; receivers recompute it and
  refuse old timestamps;
* locally, to the runner (``NOTIFICATIONS_LOCAL_URL``), which prints them and
  keeps the last 100 at ``GET /_local/notifications``.

A notification that cannot be delivered never fails the request that caused it
(the decision is recorded either way): it is logged and counted
(``NotificationsFailed``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from ..core.models import (
    ApprovalExpired,
    ApprovalRequested,
    ApprovalResolved,
    ConversationKey,
    Event,
    Head,
    PendingCall,
    ToolCallRequested,
    ToolInputProvided,
    TurnInterrupted,
)
from ..core.observability import logger, metrics
from ..turn import lifecycle

SOURCE = "turnledger"
REQUESTED = "approval.requested"
DECIDED = "approval.decided"
EXPIRED = "approval.expired"
INPUT_REQUESTED = "input.requested"
INPUT_PROVIDED = "input.provided"
#: ``<kind>.cancelled``: a cancel ended a call that waited for a person.
CANCELLED = "cancelled"
SIGNATURE_HEADER = "Turnledger-Signature"
#: Seconds one webhook delivery may take: it runs inside the request that caused it.
WEBHOOK_TIMEOUT_SECONDS = 3.0
#: PutEvents takes at most 10 entries a call.
_PUT_EVENTS_BATCH = 10


@dataclass(frozen=True)
class Notification:
    """One event to publish: its detail-type, its detail, and the tool it is about."""

    detail_type: str
    detail: dict[str, Any]
    tool: str


def notifications_of(
    key: ConversationKey,
    before: Sequence[PendingCall],
    head: Head,
    events: Sequence[Event],
    *,
    include_arguments: bool,
) -> list[Notification]:
    """What one commit (``events``, replacing pending calls ``before`` by ``head``'s) tells."""
    calls = {p.id: p for p in [*before, *head.pending]}
    # What each call waited for before this commit: a cancel is told only of person waits.
    waited = {p.id: lifecycle.waits_for_person(p) for p in before}
    expired = {b.call_id for e in events if isinstance(b := e.body(), ApprovalExpired)}
    # A cancel rejects the approvals it ends: told once, as cancelled, not also as decided.
    cancelled = {
        call_id
        for e in events
        if isinstance(b := e.body(), TurnInterrupted)
        for call_id in b.cancelled_call_ids
    }
    found: list[Notification] = []
    for event in events:
        body = event.body()
        told: list[tuple[str, str, dict[str, Any]]] = []  # (detail-type, call id, extra)
        extra: dict[str, Any]
        if isinstance(body, ApprovalRequested):
            told.append((REQUESTED, body.call_id, {}))
        elif isinstance(body, ApprovalExpired):
            told.append((EXPIRED, body.call_id, {}))
        elif isinstance(body, ApprovalResolved) and body.call_id not in expired | cancelled:
            extra = {"decision": body.decision, "approver": body.approver, "reason": body.reason}
            if body.approved_arguments_sha256:
                extra["edited"] = True
            told.append((DECIDED, body.call_id, extra))
        elif isinstance(body, ToolCallRequested) and body.requires == "input":
            # A human-input call has no approval_requested event: its request is this one.
            told.append((INPUT_REQUESTED, body.call_id, {}))
        elif isinstance(body, ToolInputProvided):
            extra = {"provided_by": body.provided_by, "via": body.via}
            told.append((INPUT_PROVIDED, body.call_id, extra))
        elif isinstance(body, TurnInterrupted):
            extra = {"cancelled_by": body.interrupted_by, "reason": body.reason}
            for call_id in body.cancelled_call_ids:
                kind = waited.get(call_id)
                if kind is not None:
                    told.append((f"{kind}.{CANCELLED}", call_id, extra))
        for detail_type, call_id, extra in told:
            call = calls.get(call_id)
            if call is None:
                # Not pending before or after this commit (e.g. a human-input call whose
                # arguments were refused got its error result at once): nobody waits.
                continue
            detail: dict[str, Any] = {
                "tenant": key.tenant,
                "conversation_id": key.conversation_id,
                "call_id": call.id,
                "tool": call.name,
                "kind": "input" if call.requires == "input" else "approval",
                "expires_at": call.expires_at.isoformat() if call.expires_at else None,
                **extra,
            }
            if include_arguments:
                detail["arguments"] = call.arguments
            found.append(Notification(detail_type, detail, call.name))
    return found


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Turnledger-Signature`` header value of ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def envelope(note: Notification) -> bytes:
    """The JSON a webhook (and the local runner) receives."""
    return json.dumps(
        {"source": SOURCE, "detail-type": note.detail_type, "detail": note.detail},
        separators=(",", ":"),
    ).encode()


@dataclass
class Publisher:
    """Publishes a commit's notifications on the bus, the tools' webhooks and locally."""

    #: The EventBridge bus (``None``: none configured).
    bus: str | None = None
    include_arguments: bool = False
    #: The local runner's collector (``None`` when deployed).
    local_url: str | None = None
    #: A tool's ``notify`` webhook URL, or ``None``.
    webhook_of: Callable[[str], str | None] = lambda _tool: None
    #: The webhook secret (read on first use).
    secret: Callable[[], str | None] = lambda: None
    #: ``PutEvents`` (an EventBridge client's ``put_events``), built on first use.
    events_client: Callable[[], Any] | None = None
    #: How webhooks and the local collector are POSTed (an ``httpx.Client.post``).
    post: Callable[..., Any] | None = None
    clock: Callable[[], float] = time.time
    _client: Any = field(default=None, init=False, repr=False)

    def on_commit(
        self,
        key: ConversationKey,
        before: Sequence[PendingCall],
        head: Head,
        events: Sequence[Event],
    ) -> None:
        """Publish what a commit that landed tells (never raises)."""
        try:
            notes = notifications_of(
                key, before, head, events, include_arguments=self.include_arguments
            )
        except Exception:  # a notification is never worth failing a committed request
            logger.exception("notifications could not be built")
            metrics.add_metric("NotificationsFailed", MetricUnit.Count, 1)
            return
        if notes:
            self.publish(notes)

    def publish(self, notes: Sequence[Notification]) -> None:
        """Deliver ``notes`` everywhere configured; failures are logged and counted only."""
        failed = 0
        if self.bus is not None and self.events_client is not None:
            failed += self._put_events(notes)
        for note in notes:
            url = self._webhook(note.tool)
            if url is not None:
                failed += self._deliver(url, note, signed=True)
            if self.local_url is not None:
                failed += self._deliver(self.local_url, note, signed=False)
        if failed:
            metrics.add_metric("NotificationsFailed", MetricUnit.Count, failed)

    def _webhook(self, tool: str) -> str | None:
        try:
            return self.webhook_of(tool)
        except Exception:
            return None  # an unknown tool (the registry changed): no webhook

    def _put_events(self, notes: Sequence[Notification]) -> int:
        failed = 0
        for start in range(0, len(notes), _PUT_EVENTS_BATCH):
            batch = notes[start : start + _PUT_EVENTS_BATCH]
            entries = [
                {
                    "Source": SOURCE,
                    "DetailType": note.detail_type,
                    "Detail": json.dumps(note.detail),
                    "EventBusName": self.bus,
                }
                for note in batch
            ]
            try:
                if self._client is None:
                    assert self.events_client is not None
                    self._client = self.events_client()
                answer = self._client.put_events(Entries=entries)
                failed += int(answer.get("FailedEntryCount", 0))
            except Exception:
                logger.exception("EventBridge refused the notifications", extra={"bus": self.bus})
                failed += len(batch)
        return failed

    def _deliver(self, url: str, note: Notification, *, signed: bool) -> int:
        if self.post is None:
            return 1
        body = envelope(note)
        headers = {"Content-Type": "application/json"}
        try:
            if signed:
                secret = self.secret()
                if not secret:
                    logger.warning("a notify webhook is set but no secret is", extra={"url": url})
                    return 1
                headers[SIGNATURE_HEADER] = signature(secret, int(self.clock()), body)
            response = self.post(
                url, content=body, headers=headers, timeout=WEBHOOK_TIMEOUT_SECONDS
            )
            if response.status_code >= 300:
                logger.warning(
                    "a notification was refused",
                    extra={"url": url, "status": response.status_code},
                )
                return 1
        except Exception:
            logger.exception("a notification could not be delivered", extra={"url": url})
            return 1
        return 0


def publisher_from_env(
    env: Mapping[str, str],
    *,
    session: Any,
    post: Callable[..., Any],
    webhook_of: Callable[[str], str | None],
) -> Publisher | None:
    """The deployment's publisher (``None`` when nothing is configured to hear it)."""
    bus = env.get("NOTIFICATIONS_BUS") or None
    local_url = env.get("NOTIFICATIONS_LOCAL_URL") or None
    secret_arn = env.get("NOTIFY_SECRET_ARN") or None
    cached: dict[str, str | None] = {}

    def secret() -> str | None:
        if "value" not in cached:
            if secret_arn:
                client = session.client("secretsmanager")
                cached["value"] = client.get_secret_value(SecretId=secret_arn)["SecretString"]
            else:
                cached["value"] = env.get("NOTIFY_SECRET") or None
        return cached["value"]

    return Publisher(
        bus=bus,
        include_arguments=env.get("NOTIFY_INCLUDE_ARGUMENTS", "").lower() in {"1", "true", "yes"},
        local_url=local_url,
        webhook_of=webhook_of,
        secret=secret,
        events_client=(lambda: session.client("events")) if bus else None,
        post=post,
    )


def environment() -> Mapping[str, str]:
    """The process environment (a seam for tests)."""
    return os.environ
