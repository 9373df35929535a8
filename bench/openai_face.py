"""The OpenAI face's loops, measured: a chained loop against a stateless one, and a session.

On DynamoDB Local (the table built from ``template.yaml``, S3 on moto's server, as
``bench/turns.py`` runs them), the API's ``lambda_handler`` answers API Gateway's own
events (``events/openai-*.json``, with the body, path and tenant replaced), the demo model
echoing a 700-character answer to each 300-character user message. Each loop runs in its
own tenant:

1. **chained**: ``--calls`` calls of ``POST /openai/v1/responses``, each after the first
   naming ``previous_response_id`` and sending only its new user message;
2. **stateless**: the same calls without ``previous_response_id``, each resending the whole
   history (every earlier input and output item, then the new user message), as the OpenAI
   Agents SDK does by default; the face finds the conversation they continue
   (:mod:`turnledger.api.openai.matching`); the two loops' calls alternate;
3. **session**: the Agents SDK's ``OpenAIConversationsSession`` pattern, without the SDK:
   ``POST /openai/v1/conversations``, then for each of ``--session-runs`` runs ``GET
   .../items``, a stateless ``POST /responses`` of those items and the new message, and
   ``POST .../items`` of the new message and the answer.

Capacity is priced as :mod:`bench.pricing` prices it (from the size of every item read and
written: the transactions, the face's chain and index items, the head reads) and also
given as DynamoDB Local reported it. Storage time is the time inside the store's public
calls (:class:`bench.metered.MeteredStore`); handler time the whole ``lambda_handler`` call.
Writes the section ``## OpenAI face: chained and stateless loops`` of ``bench/RESULTS.md``.

Run: ``make bench ARGS=openai`` or ``.venv/bin/python -m bench.openai_face``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from unittest.mock import patch

from turnledger.api import lambda_handler
from turnledger.core.config import Settings
from turnledger.core.models import ConversationKey
from turnledger.core.observability import metrics
from turnledger.providers.demo import DemoProvider
from turnledger.runtime import Runtime, set_runtime
from turnledger.store import keys
from turnledger.store.blobs import S3BlobStore
from turnledger.store.codec import A_PK, Item, SideItem
from turnledger.turn.pipeline import Conversations
from turnledger_local.gateway import LambdaContext
from turnledger_local.template import PROJECT_ROOT

from bench.conversation import REPLY_CHARS, BenchClock, text_of
from bench.engines import local_engines
from bench.metered import HEAD_SK, MeteredStore, PricedWrite, StorageWork
from bench.pricing import index_specs
from bench.results import command_line, machine_line, publish
from bench.turns import ddb_local_version

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

SECTION = "OpenAI face: chained and stateless loops"
#: Characters of each user message (before the ``echo:`` the demo model answers).
MESSAGE_CHARS = 300
EVENTS_DIR = PROJECT_ROOT / "events"


class FaceStore(MeteredStore):
    """:class:`MeteredStore`, also pricing and timing what the face does besides turns:
    ``GetItem`` reads (the head, the chain, index look-ups), side item puts and deletes."""

    def __init__(self, client: DynamoDBClient, table_name: str, blobs: S3BlobStore) -> None:
        super().__init__(client, table_name, blobs, index_specs())
        #: Every commit of the run, across :meth:`begin` calls.
        self.all_commits: list[Item] = []
        #: Of the current call's priced WCU, the face's side items (chain, index) and their
        #: index entries: what it writes beside the turn's transaction.
        self.side_wcu = 0.0

    def begin(self) -> StorageWork:
        """Start measuring a new call."""
        self.side_wcu = 0.0
        return super().begin()

    def get_side_item(self, key: ConversationKey, sort_key: str) -> SideItem | None:
        with self._timed():
            return super().get_side_item(key, sort_key)

    def put_side_item(self, key: ConversationKey, side: SideItem) -> None:
        with self._timed():
            super().put_side_item(key, side)

    def delete_side_items(self, key: ConversationKey, sort_keys: list[str]) -> None:
        with self._timed():
            super().delete_side_items(key, sort_keys)

    def _on_write(self, write: PricedWrite) -> None:
        super()._on_write(write)
        if not write.succeeded:
            return
        for item in write.items:
            if item.sk.startswith(keys.SIDE_PREFIX):
                self.side_wcu += item.table_wcu + sum(item.index_wcu.values())
            elif item.sk == HEAD_SK and item.item is not None:
                self.all_commits.append(item.item)


@dataclass(frozen=True)
class Call:
    """One HTTP call: its capacity, its times, what it sent."""

    wcu: float
    index_wcu: float
    #: The face's side items (:attr:`FaceStore.side_wcu`).
    side_wcu: float
    rcu: float
    reported_wcu: float
    reported_rcu: float
    storage_seconds: float
    handler_seconds: float
    items_sent: int


@dataclass
class Loop:
    """A loop of calls in one tenant, and what it left stored."""

    name: str
    calls: list[Call] = field(default_factory=list)
    conversations: int = 0
    events: int = 0
    #: Events of each conversation kept, largest first.
    per_conversation: list[int] = field(default_factory=list)
    #: Conversations the store committed to (created, whether kept or not).
    committed: int = 0


class Face:
    """The API's ``lambda_handler`` over a :class:`FaceStore`, called as API Gateway would."""

    def __init__(self, store: FaceStore, settings: Settings, service: Conversations) -> None:
        self.store = store
        self.service = service
        self.templates = {
            name: json.loads((EVENTS_DIR / f"openai-{name}.json").read_text(encoding="utf-8"))
            for name in ("response", "create-conversation", "list-items", "add-items")
        }
        set_runtime(
            Runtime(
                settings=settings,
                conversations=service,
                store=store,
                dynamodb=store.client,
            )
        )

    def call(
        self,
        template: str,
        tenant: str,
        body: dict[str, Any] | None,
        *,
        conversation: str | None = None,
        items_sent: int = 0,
    ) -> tuple[dict[str, Any], Call]:
        """Send ``template``'s event as ``tenant`` with ``body`` (on ``conversation``'s path)."""
        event = copy.deepcopy(self.templates[template])
        event["requestContext"]["authorizer"]["jwt"]["claims"]["tenant_id"] = tenant
        if conversation is not None:
            path = event["rawPath"].replace(event["pathParameters"]["id"], conversation)
            event["rawPath"] = event["requestContext"]["http"]["path"] = path
            event["pathParameters"] = {"id": conversation}
        if template == "list-items":
            event["queryStringParameters"] = {"order": "asc", "limit": "100"}
            event["rawQueryString"] = "order=asc&limit=100"
        if body is not None:
            event["body"] = json.dumps(body)
            event["headers"]["content-length"] = str(len(event["body"].encode()))
        work = self.store.begin()
        reported = self.store.meter.snapshot()
        context = LambdaContext(
            function_name="bench-api", memory_limit_in_mb=512, timeout_seconds=29
        )
        started = time.perf_counter()
        result = lambda_handler(event, context)
        seconds = time.perf_counter() - started
        metrics.clear_metrics()
        if result["statusCode"] >= 300:
            raise RuntimeError(f"{template} answered {result['statusCode']}: {result['body']}")
        used = self.store.meter.since(reported)
        sample = Call(
            wcu=work.priced_wcu,
            index_wcu=work.priced_index_wcu,
            side_wcu=self.store.side_wcu,
            rcu=work.priced_rcu,
            reported_wcu=used.write_units,
            reported_rcu=used.read_units,
            storage_seconds=work.seconds,
            handler_seconds=seconds,
            items_sent=items_sent,
        )
        answer: dict[str, Any] = json.loads(result["body"])
        return answer, sample

    @contextmanager
    def loop(self, name: str, tenant: str) -> Iterator[Loop]:
        """A loop in ``tenant``; on exit, what it stored: conversations and their events."""
        loop = Loop(name)
        first = len(self.store.all_commits)
        yield loop
        prefix = keys.tenant_partition_prefix(tenant)
        commits = self.store.all_commits[first:]
        partitions = {str(h[A_PK]) for h in commits if str(h[A_PK]).startswith(prefix)}
        loop.committed = len(partitions)
        for pk in partitions:
            key = ConversationKey(tenant=tenant, conversation_id=pk.removeprefix(prefix))
            head = self.store.get_head(key)
            # A conversation cleared (``store: false``) keeps no events.
            if head is not None and head.event_count:
                loop.per_conversation.append(self.service.get(key).events)
        loop.per_conversation.sort(reverse=True)
        loop.conversations = len(loop.per_conversation)
        loop.events = sum(loop.per_conversation)


def message(number: int) -> dict[str, Any]:
    """The user message of call ``number``: the demo model echoes its 700-character text."""
    text = text_of(f"call {number} reply", REPLY_CHARS)
    padding = text_of(f"call {number} note", MESSAGE_CHARS)
    return {"type": "message", "role": "user", "content": f"echo: {text}\n\n{padding}"}


@contextmanager
def face_on_engines() -> Iterator[tuple[Face, str]]:
    """The face on freshly started engines, the demo model answering, and DynamoDB Local's
    version; the handler's metrics are off (flushed to stdout on every call, they would
    drown the progress lines)."""
    with local_engines() as engines:
        clients, settings = engines.clients, engines.settings
        store = FaceStore(
            clients.dynamodb, settings.table_name, S3BlobStore(clients.s3, settings.bucket_name)
        )
        service = Conversations(
            store=store, provider=DemoProvider(), settings=settings, clock=BenchClock()
        )
        face = Face(store, settings, service)
        try:
            with patch.dict(os.environ, {"POWERTOOLS_METRICS_DISABLED": "true"}):
                yield face, ddb_local_version(engines.jar)
        finally:
            set_runtime(None)


def alternate(
    calls: int,
    first: Loop,
    first_call: Callable[[int], Call],
    second: Loop,
    second_call: Callable[[int], Call],
) -> None:
    """Calls 1..``calls`` of two loops, interleaved call by call and which goes first
    alternating, so neither runs on a colder DynamoDB Local."""
    for number in range(1, calls + 1):
        if number % 2:
            first.calls.append(first_call(number))
            second.calls.append(second_call(number))
        else:
            second.calls.append(second_call(number))
            first.calls.append(first_call(number))


def loops(face: Face, calls: int) -> tuple[Loop, Loop]:
    """The chained and the stateless loop, ``calls`` calls each, interleaved
    (:func:`alternate`)."""
    previous: str | None = None
    history: list[dict[str, Any]] = []

    def chained_call(number: int) -> Call:
        nonlocal previous
        body: dict[str, Any] = {"model": "demo-1", "input": [message(number)]}
        if previous is not None:
            body["previous_response_id"] = previous
        answer, sample = face.call("response", "bench-chained", body, items_sent=1)
        previous = str(answer["id"])
        return sample

    def stateless_call(number: int) -> Call:
        nonlocal history
        items = [*history, message(number)]
        body = {"model": "demo-1", "input": items}
        answer, sample = face.call("response", "bench-stateless", body, items_sent=len(items))
        history = [*items, *answer["output"]]
        return sample

    with (
        face.loop("chained", "bench-chained") as chained,
        face.loop("stateless", "bench-stateless") as stateless,
    ):
        alternate(calls, chained, chained_call, stateless, stateless_call)
    return chained, stateless


def session(face: Face, runs: int) -> Loop:
    """``OpenAIConversationsSession``'s calls: a conversation, then per run its items, a
    stateless response of them and the new message, and the two added to the conversation."""
    tenant = "bench-session"
    with face.loop("session", tenant) as loop:
        created, sample = face.call("create-conversation", tenant, {})
        conversation = str(created["id"])
        loop.calls.append(sample)
        for number in range(1, runs + 1):
            listed, sample = face.call("list-items", tenant, None, conversation=conversation)
            loop.calls.append(sample)
            # The SDK sends stored items back as they came.
            history = list(listed["data"])
            items = [*history, message(number)]
            body = {"model": "demo-1", "input": items}
            answer, sample = face.call("response", tenant, body, items_sent=len(items))
            loop.calls.append(sample)
            added = [message(number), *answer["output"]]
            _, sample = face.call(
                "add-items",
                tenant,
                {"items": added},
                conversation=conversation,
                items_sent=len(added),
            )
            loop.calls.append(sample)
    return loop


@dataclass(frozen=True)
class Results:
    """Everything the section reports."""

    calls: int
    chained: Loop
    stateless: Loop
    session: Loop | None
    ddb_version: str


def run(calls: int, session_runs: int) -> Results:
    """Start the engines and run the loops."""
    with face_on_engines() as (face, ddb_version):
        chained_loop, stateless_loop = loops(face, calls)
        print(f"  chained and stateless: {calls} calls each", flush=True)
        session_loop = session(face, session_runs) if session_runs > 0 else None
    return Results(calls, chained_loop, stateless_loop, session_loop, ddb_version)


def _units(value: float) -> str:
    return f"{value:g}"


def render(results: Results, command: str) -> str:
    """The section's markdown."""
    n = results.calls
    marked = sorted({1, max(1, n // 2), n})
    chained_loop, stateless_loop = results.chained, results.stateless
    lines = [
        f"Command: {command}; alone: `make bench ARGS=openai`. Run: {machine_line()}.",
        "",
        f"DynamoDB Local {results.ddb_version}, in memory, on loopback; S3 on moto's server. "
        "The API's `lambda_handler` answers API Gateway events (`events/openai-*.json`, body, "
        "path and tenant replaced); the demo model echoes a 700-character answer to each "
        f"user message (about {MESSAGE_CHARS + REPLY_CHARS} characters). Each loop runs in "
        "its own tenant. **Chained**: each call after the first names `previous_response_id` "
        "and sends its new message only. **Stateless**: each call resends every earlier "
        "input and output item and the new message, as the OpenAI Agents SDK does by default; "
        "the face finds the conversation it continues by the hash chain of its items. "
        "Capacity **priced** from the size of every item read and written (as *Turn storage "
        "cost* prices it: transactions x2, index entries 1 WCU; plus the face's `GetItem` "
        "reads, at least 1 RCU each, and its chain and index side items, standard writes); "
        "**reported**: what DynamoDB Local returned (it misreports transactions).",
        "",
        "### Stored",
        "",
        "| loop | calls | conversations kept | conversations committed to | events stored "
        "| expected (2 per call) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for loop in (chained_loop, stateless_loop):
        lines.append(
            f"| {loop.name} | {len(loop.calls)} | {loop.conversations} | {loop.committed} "
            f"| {loop.events} | {2 * len(loop.calls)} |"
        )
    lines += [
        "",
        "### Per call",
        "",
        "| call | loop | items sent | WCU priced | of which side items | of which index "
        "entries | RCU priced | WCU reported | RCU reported | storage ms | handler ms |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for number in marked:
        for loop in (chained_loop, stateless_loop):
            c = loop.calls[number - 1]
            lines.append(
                f"| {number} | {loop.name} | {c.items_sent} | {_units(c.wcu)} "
                f"| {_units(c.side_wcu)} | {_units(c.index_wcu)} | {_units(c.rcu)} "
                f"| {_units(c.reported_wcu)} "
                f"| {_units(c.reported_rcu)} | {c.storage_seconds * 1000:.1f} "
                f"| {c.handler_seconds * 1000:.1f} |"
            )

    def total(loop: Loop, name: str) -> float:
        return float(sum(getattr(c, name) for c in loop.calls))

    def median_ms(loop: Loop, name: str) -> float:
        return float(statistics.median(getattr(c, name) for c in loop.calls)) * 1000

    for loop in (chained_loop, stateless_loop):
        lines.append(
            f"| **1..{n}** | {loop.name} | {int(total(loop, 'items_sent'))} "
            f"| {_units(total(loop, 'wcu'))} | {_units(total(loop, 'side_wcu'))} "
            f"| {_units(total(loop, 'index_wcu'))} "
            f"| {_units(total(loop, 'rcu'))} | {_units(total(loop, 'reported_wcu'))} "
            f"| {_units(total(loop, 'reported_rcu'))} | | |"
        )
    lines += [
        "",
        "### Time per call",
        "",
        "Median over the calls; storage = inside the store's public calls, handler = the whole "
        "`lambda_handler` call (parsing, matching, the demo model, the response). "
        "DynamoDB Local on loopback has no network latency. The times of single calls in the "
        "table above vary with the load of the (shared) machine and call 1 includes the first "
        "connections: compare the medians.",
        "",
        "| | chained median ms | stateless median ms | stateless / chained |",
        "| --- | ---: | ---: | ---: |",
    ]
    ratios = {}
    for label, name in (("storage", "storage_seconds"), ("handler", "handler_seconds")):
        a, b = median_ms(chained_loop, name), median_ms(stateless_loop, name)
        ratios[label] = b / a
        lines.append(f"| {label} | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    if results.session is not None:
        s = results.session
        runs = (len(s.calls) - 1) // 3
        lines += [
            "",
            "### Session",
            "",
            "The Agents SDK's `OpenAIConversationsSession` pattern, without the SDK: "
            "`POST /openai/v1/conversations`, then per run `GET .../items`, a stateless "
            "`POST /responses` of those items and the new message, and `POST .../items` of "
            f"the new message and the answer. {runs} runs ({len(s.calls)} calls) in one "
            f"tenant left **{s.conversations} conversations** holding "
            f"**{s.events} events** ({' + '.join(map(str, s.per_conversation))}; committed to: "
            f"{s.committed}); "
            f"{_units(total(s, 'wcu'))} WCU and {_units(total(s, 'rcu'))} RCU priced in all.",
        ]
    lines += ["", "### Reading", "", *_reading(results, ratios)]
    return "\n".join(lines) + "\n"


def _reading(results: Results, ratios: dict[str, float]) -> list[str]:
    """Bullets that say what the numbers show, from the numbers."""
    n = results.calls
    chained_loop, stateless_loop = results.chained, results.stateless
    stored = [
        f"{loop.name}: {loop.conversations} conversation(s), {loop.events} events"
        for loop in (chained_loop, stateless_loop)
    ]
    once = all(
        loop.conversations == 1 and loop.events == 2 * n for loop in (chained_loop, stateless_loop)
    )
    last_c, last_s = chained_loop.calls[-1], stateless_loop.calls[-1]
    rcu_c = sum(c.rcu for c in chained_loop.calls)
    rcu_s = sum(c.rcu for c in stateless_loop.calls)
    wcu_c = sum(c.wcu for c in chained_loop.calls)
    wcu_s = sum(c.wcu for c in stateless_loop.calls)
    lines = [
        f"- Stored: {'; '.join(stored)}, for {2 * n} items sent once each: "
        + (
            "each item is stored once, the stateless loop's resent history adds nothing."
            if once
            else "**not** each item once (see the table above)."
        ),
        f"- Writes: {_units(wcu_s)} WCU for the stateless loop against {_units(wcu_c)} for the "
        f"chained one; at call {n} {_units(last_s.wcu)} against {_units(last_c.wcu)}, of which "
        f"{_units(last_s.side_wcu)} and {_units(last_c.side_wcu)} for the face's side items "
        "(the chain, the index item of the new response, the deleted one of the previous: "
        "both loops write them, since any stored response may be continued statelessly).",
        f"- Reads: {_units(rcu_s)} RCU against {_units(rcu_c)} ({rcu_s / rcu_c:.2f}x); at call "
        f"{n} {_units(last_s.rcu)} against {_units(last_c.rcu)}: the difference is the "
        "stateless call's matching, one `GetItem` of at least 1 RCU each: its index look-ups, "
        "longest candidate first (here one: the input ending with the previous answer, which "
        "hits; its own end, a user message, ends no response and is not looked up), and the "
        "conversation's chain, read to check the hit (its head read replaces the chained "
        "call's check of `previous_response_id`); "
        "the growth over the calls, in both loops, is the turn loading its context.",
        f"- Time: the stateless call's median is {ratios['storage']:.2f}x the chained one's "
        f"in storage and {ratios['handler']:.2f}x in the handler, though it sends "
        f"{last_s.items_sent} items at call {n} where the chained call sends 1.",
    ]
    if results.session is not None:
        s = results.session
        lines.append(
            f"- Session: the tenant holds {s.conversations} conversation(s) and {s.events} "
            f"events for {2 * ((len(s.calls) - 1) // 3)} items: "
            + (
                "each item once."
                if s.conversations == 1
                else "the session's own conversation and, apart, the one its stateless "
                "responses continue, each holding every item."
            )
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and rewrite its section of ``bench/RESULTS.md``."""
    parser = argparse.ArgumentParser(prog="python -m bench.openai_face", description=__doc__)
    parser.add_argument("--calls", type=int, default=20, help="calls of each loop (N)")
    parser.add_argument("--session-runs", type=int, default=3, help="runs of the session")
    parser.add_argument("--print-only", action="store_true")
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error("--calls must be at least 1")
    print(f"openai face benchmark: {args.calls} calls per loop", flush=True)
    results = run(args.calls, args.session_runs)
    command = command_line("bench.openai_face", sys.argv[1:] if argv is None else argv)
    publish(SECTION, render(results, command), print_only=args.print_only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
