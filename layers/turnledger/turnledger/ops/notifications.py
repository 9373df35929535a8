"""Telling people that a call waits for them, was decided, answered, expired or cancelled.

After a commit lands (never before: a commit that fails told nobody anything),
every approval it requested, decided or expired, every human-input call it
requested or got the answer of, and every such wait a cancel ended is published:

* as an EventBridge event on the deployment's bus (``NOTIFICATIONS_BUS``, the
  template's ``NotificationsBus``): source ``turnledger``, detail-type
  ``approval.requested`` / ``approval.decided`` / ``approval.expired`` and
  ``input.requested`` / ``input.provided`` (a human-input tool's call: kind
  ``input``), and ``approval.cancelled`` / ``input.cancelled`` when ``POST
  .../cancel`` ends such a wait; detail ``{event_id, tenant, conversation_id,
  call_id, tool, kind, expires_at}`` (plus ``decision``, ``approver``, ``reason`` for a
  decision; ``provided_by``, ``via`` for an answer, never the answer itself;
  ``cancelled_by``, ``reason`` for a cancel) and the arguments only when
  ``NOTIFY_INCLUDE_ARGUMENTS`` is true: a team routes them with rules to Slack,
  e-mail or a ticket queue, and closes the message when the wait ends.
  ``event_id`` is the same however often one commit's notification is sent
  (receivers de-duplicate on it); times are UTC with ``Z``, as the API writes them;
* to the tool's own ``notify`` webhook (tool registry), when it has one: a POST
  of ``{"source", "detail-type", "detail"}`` signed with HMAC-SHA256 over
  ``"<timestamp>.<body>"`` under **that receiver's** key (:func:`receiver_key`:
  derived from the deployment's secret, Secrets Manager ``NOTIFY_SECRET_ARN`` read
  through Powertools parameters and cached :data:`SECRET_MAX_AGE_SECONDS`, or
  ``NOTIFY_SECRET``), in the header
  ``Turnledger-Signature: t=<timestamp>,kid=<key id>,v1=<hex>``; receivers recompute it
  and refuse old timestamps. One commit's receivers are sent to at once (each one's
  notifications in order), all within :data:`WEBHOOK_BUDGET_SECONDS`; logs name a
  webhook by its host, never its whole URL;
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
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from aws_lambda_powertools.metrics import MetricUnit
from pydantic import TypeAdapter

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
    ToolInputRequested,
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
#: Seconds all of one commit's webhooks may take together: they run, at once, inside
#: the request that caused them, after its commit.
WEBHOOK_BUDGET_SECONDS = 3.0
#: Webhooks of one commit sent at the same time.
_WEBHOOK_THREADS = 8
#: How long the webhook secret read from Secrets Manager is cached (a rotation is seen
#: within this).
SECRET_MAX_AGE_SECONDS = 300
#: Times as the API writes them: UTC with ``Z``.
_TIME = TypeAdapter(datetime)
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
        elif isinstance(body, ToolInputRequested):
            # An MCP call whose server asks a person mid-call (each round is told).
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
                "event_id": event_id(key, event, call_id, detail_type),
                "tenant": key.tenant,
                "conversation_id": key.conversation_id,
                "call_id": call.id,
                "tool": call.name,
                "kind": "input"
                if call.requires == "input" or call.elicitation is not None
                else "approval",
                "expires_at": _TIME.dump_python(call.expires_at, mode="json")
                if call.expires_at
                else None,
                **extra,
            }
            if include_arguments:
                detail["arguments"] = call.arguments
            found.append(Notification(detail_type, detail, call.name))
    return found


def event_id(key: ConversationKey, event: Event, call_id: str, detail_type: str) -> str:
    """The id of what ``event`` tells of ``call_id``: ``evt_<32 hex>``, the same each time
    it is sent, another for each conversation, life, event, call and detail-type."""
    parts = (
        key.tenant,
        key.conversation_id,
        str(event.sequence),
        _TIME.dump_python(event.occurred_at, mode="json"),
        call_id,
        detail_type,
    )
    return "evt_" + hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


def receiver_key(secret: str, url: str) -> str:
    """The key that signs the webhooks sent to ``url``: hex HMAC-SHA256 of
    ``"turnledger-webhook:<url>"`` under the deployment's secret. Each receiver gets its
    own, so one cannot forge another's notifications."""
    return hmac.new(
        secret.encode(), f"turnledger-webhook:{url}".encode(), hashlib.sha256
    ).hexdigest()


def key_id(key: str) -> str:
    """The public id of a receiver key (``kid``): 16 hex of its SHA-256."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def signature(key: str, timestamp: int, body: bytes) -> str:
    """The ``Turnledger-Signature`` header value of ``body`` sent at ``timestamp`` under
    a receiver's ``key``."""
    mac = hmac.new(key.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},kid={key_id(key)},v1={mac.hexdigest()}"


def host_of(url: str) -> str:
    """What a log line may say of a URL: its scheme and host (no path, query or user)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}"


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
        """Deliver ``notes`` everywhere configured; failures are logged and counted only.

        The webhooks go out at once and are waited for at most
        :data:`WEBHOOK_BUDGET_SECONDS` in all; one still running then counts as failed.
        """
        failed = 0
        if self.bus is not None and self.events_client is not None:
            failed += self._put_events(notes)
        deliveries: list[tuple[str, Notification, bool]] = []
        for note in notes:
            url = self._webhook(note.tool)
            if url is not None:
                deliveries.append((url, note, True))
            if self.local_url is not None:
                deliveries.append((self.local_url, note, False))
        if deliveries:
            failed += self._deliver_all(deliveries)
        if failed:
            metrics.add_metric("NotificationsFailed", MetricUnit.Count, failed)

    def _deliver_all(self, deliveries: Sequence[tuple[str, Notification, bool]]) -> int:
        """Each receiver's notifications in order, the receivers at once, within the budget."""
        started = time.monotonic()
        by_receiver: dict[str, list[tuple[Notification, bool]]] = {}
        for url, note, signed in deliveries:
            by_receiver.setdefault(url, []).append((note, signed))

        def deliver(url: str, notes: list[tuple[Notification, bool]]) -> int:
            return sum(
                self._deliver(url, note, signed=signed, started=started) for note, signed in notes
            )

        pool = ThreadPoolExecutor(max_workers=min(_WEBHOOK_THREADS, len(by_receiver)))
        try:
            futures = {
                pool.submit(deliver, url, notes): len(notes) for url, notes in by_receiver.items()
            }
            done, late = wait(futures, timeout=WEBHOOK_BUDGET_SECONDS)
        finally:
            # Never wait for a late one: its own timeout ends it in the background.
            pool.shutdown(wait=False, cancel_futures=True)
        if late:
            logger.warning("notifications ran out of time", extra={"late": len(late)})
        return sum(futures[future] for future in late) + sum(f.result() for f in done)

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

    def _deliver(self, url: str, note: Notification, *, signed: bool, started: float) -> int:
        if self.post is None:
            return 1
        body = envelope(note)
        headers = {"Content-Type": "application/json"}
        where = host_of(url)
        try:
            if signed:
                secret = self.secret()
                if not secret:
                    logger.warning("a notify webhook is set but no secret is", extra={"url": where})
                    return 1
                key = receiver_key(secret, url)
                headers[SIGNATURE_HEADER] = signature(key, int(self.clock()), body)
            left = WEBHOOK_BUDGET_SECONDS - (time.monotonic() - started)
            if left <= 0:
                return 1
            response = self.post(url, content=body, headers=headers, timeout=left)
            if response.status_code >= 300:
                logger.warning(
                    "a notification was refused",
                    extra={"url": where, "status": response.status_code},
                )
                return 1
        except Exception as exc:
            # The exception's text may quote the whole URL: its type only.
            logger.warning(
                "a notification could not be delivered",
                extra={"url": where, "error": type(exc).__name__},
            )
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

    def secret() -> str | None:
        if not secret_arn:
            return env.get("NOTIFY_SECRET") or None
        # Imported here: only requests that sign a webhook pay for it. Cached for
        # SECRET_MAX_AGE_SECONDS, so a rotated secret is used within that.
        from aws_lambda_powertools.utilities import parameters

        value = parameters.get_secret(secret_arn, max_age=SECRET_MAX_AGE_SECONDS)
        return value.decode() if isinstance(value, bytes) else str(value)

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
