"""The approval inbox, measured: what a call waiting for a person costs in capacity.

On DynamoDB Local (the table built from ``template.yaml``, S3 on moto's server),
:class:`~turnledger.turn.pipeline.Conversations` runs the demo model with a registry
whose ``send_email`` tool needs approval and runs over ``http`` against a local
sink (:class:`tests.functional.http_sink.HttpSink`). Each sample measures, on
fresh conversations of one tenant:

1. **text turn**: the first turn of a conversation, ``echo: {"to": ...}``, which
   the model answers with that text;
2. **approval turn**: the first turn of another conversation,
   ``/tool send_email {"to": ...}`` (the same arguments), which the model
   answers with one call that waits for approval: the head, its events, the
   inbox entry ``W#...`` and its ``by-inbox`` index entry;
3. **decision**: ``POST .../approvals`` approving it: the tool runs, the model
   answers, and the entry and its index entry are deleted;
4. the same in an **existing conversation** (the common case): the text turn's
   conversation gets a second text turn, then the approval turn and its decision, so
   none of them creates the conversation (its ``HEAD`` and that ``HEAD``'s
   ``by-expiry`` and ``by-tenant`` entries).

Then 3 tenants each get ``--pending`` calls waiting (one conversation each) and
each tenant's first inbox page of 50 (``GET /v1/approvals``,
:func:`turnledger.turn.approvals.list_inbox`) is read: its capacity, and how many
index items it read and whose they were.

Capacity is given two ways, as in ``bench/turns.py``: as DynamoDB Local reported
it (the store's :class:`~turnledger.store.base.CapacityMeter`) and as DynamoDB
prices it (:mod:`bench.pricing`, from the size of every item written or read,
index entries included). DynamoDB Local misreports ``TransactWriteItems``, so
write units are the priced ones. Writes the section ``## Approval inbox`` of
``bench/RESULTS.md``.

Run: ``make bench ARGS=approvals`` or ``.venv/bin/python -m bench.approvals``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx
from turnledger.api.schemas import ApprovalRequest, TurnRequest
from turnledger.core.observability import metrics
from turnledger.providers.demo import DemoProvider
from turnledger.store import codec, inbox
from turnledger.store.blobs import BlobStore, S3BlobStore
from turnledger.store.codec import Item
from turnledger.store.indexes import WAIT_INDEX
from turnledger.store.keyring import Keyring, LocalMasterKey, MemoryKeyItems
from turnledger.store.sealed import ItemSealer, SealedBlobStore
from turnledger.tools import ToolRegistry, ToolRunner
from turnledger.turn.approvals import DEFAULT_LIMIT, list_inbox
from turnledger.turn.pipeline import Conversations
from turnledger_local.template import load_template, table_definition

from bench.conversation import BenchClock
from bench.engines import local_engines
from bench.metered import HEAD_SK, TRANSCRIPT_PREFIX, MeteredStore, PricedWrite
from bench.pricing import IndexSpec, item_size, write_units
from bench.results import command_line, machine_line, publish
from tests.functional.http_sink import HttpSink, Reply
from tests.support import edge
from tests.support.aws import TABLE_RESOURCE
from tests.support.edge import Caller
from tests.support.legacy_layout import LegacyDynamoDBStore

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

SECTION = "Approval inbox"
TENANTS = ("acme", "globex", "initech")
TOOL = "send_email"
ARGUMENTS = {"to": "ops@example.com", "body": "The nightly report is ready."}


@dataclass
class Work:
    """What the store did for one request, priced from item sizes and as reported."""

    #: Head and transcript items (x2 inside a transaction).
    table_wcu: float = 0.0
    #: Inbox entry items put or deleted (x2 inside a transaction).
    entry_wcu: float = 0.0
    #: ``by-inbox`` index entries put or deleted.
    inbox_index_wcu: float = 0.0
    #: The head's ``by-wait`` index entry (the hour its earliest decision window closes).
    wait_index_wcu: float = 0.0
    #: The head's other keys-only indexes (``by-expiry``, ``by-tenant``).
    head_index_wcu: float = 0.0
    #: Writes of other items (drafts, leases, records), priced on the wire.
    other_wcu: float = 0.0
    rcu: float = 0.0
    #: Write requests, and those that put the head or transcript items.
    writes: int = 0
    commits: int = 0
    #: ``HEAD`` puts (a commit whose slow state changed).
    head_puts: int = 0
    events: int = 0
    #: Items of the ``by-inbox`` queries, and their index partitions.
    inbox_items: int = 0
    inbox_partitions: set[str] = field(default_factory=set)
    reported_wcu: float = 0.0
    reported_rcu: float = 0.0

    @property
    def wcu(self) -> float:
        """Every priced write unit."""
        return (
            self.table_wcu
            + self.entry_wcu
            + self.inbox_index_wcu
            + self.wait_index_wcu
            + self.head_index_wcu
            + self.other_wcu
        )

    @property
    def inbox_wcu(self) -> float:
        """The inbox's part: its entry items and their index entries."""
        return self.entry_wcu + self.inbox_index_wcu


def _index_layout() -> tuple[list[IndexSpec], tuple[str, ...]]:
    """The head's keys-only indexes, and the attributes ``by-inbox`` projects."""
    definition = table_definition(load_template(), TABLE_RESOURCE, "any")
    head_indexes: list[IndexSpec] = []
    projected: tuple[str, ...] = ()
    for index in definition.get("GlobalSecondaryIndexes", []):
        names = tuple(k["AttributeName"] for k in index["KeySchema"])
        if index["IndexName"] == inbox.INBOX_INDEX:
            extra = tuple(index["Projection"].get("NonKeyAttributes", []))
            projected = (codec.A_PK, codec.A_SK, *names, *extra)
        elif index["Projection"]["ProjectionType"] == "KEYS_ONLY":
            head_indexes.append(IndexSpec(name=index["IndexName"], key_attributes=names))
        else:
            raise ValueError(f"index {index['IndexName']}: its projection is not priced here")
    if not projected:
        raise ValueError(f"template.yaml declares no {inbox.INBOX_INDEX} index")
    return head_indexes, projected


class InboxMeteredStore(MeteredStore):
    """The metered store (every request priced on the wire), its writes sorted into the
    inbox's part and the turn's: entry items ``W#...`` and their ``by-inbox`` entries
    (priced on their projected attributes), the head's index entries, and the rest.
    One instance per thread.
    """

    def __init__(self, client: DynamoDBClient, table_name: str, blobs: BlobStore) -> None:
        head_indexes, self.projected = _index_layout()
        inbox_spec = IndexSpec(inbox.INBOX_INDEX, (inbox.A_INBOX, inbox.A_INBOX_SORT))
        super().__init__(client, table_name, blobs, [*head_indexes, inbox_spec])
        self.inbox_work = Work()
        self._reported = self.meter.snapshot()

    def measure(self) -> Work:
        """Start measuring a new request; the returned record fills as it runs."""
        self.begin()
        self.inbox_work = Work()
        self._reported = self.meter.snapshot()
        return self.inbox_work

    def finish(self) -> Work:
        """The record of the request :meth:`measure` started, with the reported units."""
        reported = self.meter.since(self._reported)
        work = self.inbox_work
        work.reported_wcu = reported.write_units
        work.reported_rcu = reported.read_units
        # What runs until the next measure() (setting up the inboxes) is counted apart.
        self.inbox_work = Work()
        return work

    def _index_units(self, old: Item | None, new: Item | None) -> dict[str, int]:
        found = super()._index_units(old, new)
        if inbox.INBOX_INDEX in found:
            # An inbox index entry is its projected attributes, priced as a standard write.
            entry = new if new is not None else old
            assert entry is not None
            projected = {k: v for k, v in entry.items() if k in self.projected}
            found[inbox.INBOX_INDEX] = write_units(item_size(projected))
        return found

    def _on_write(self, write: PricedWrite) -> None:
        super()._on_write(write)
        work = self.inbox_work
        work.writes += 1
        if any(i.sk == HEAD_SK or i.sk.startswith(TRANSCRIPT_PREFIX) for i in write.items):
            work.commits += 1
        for item in write.items:
            work.inbox_index_wcu += item.index_wcu.get(inbox.INBOX_INDEX, 0)
            work.wait_index_wcu += item.index_wcu.get(WAIT_INDEX, 0)
            work.head_index_wcu += sum(
                units
                for name, units in item.index_wcu.items()
                if name not in (inbox.INBOX_INDEX, WAIT_INDEX)
            )
            if item.sk.startswith(inbox.ENTRY_PREFIX):
                work.entry_wcu += item.table_wcu
            elif item.sk == HEAD_SK or item.sk.startswith(TRANSCRIPT_PREFIX):
                work.table_wcu += item.table_wcu
                work.head_puts += item.sk == HEAD_SK and item.item is not None
                work.events += item.item is not None and item.sk.startswith(TRANSCRIPT_PREFIX)
            else:
                work.other_wcu += item.table_wcu

    def _on_read(
        self, units: float, items: list[Item], limit: int | None, index: str | None
    ) -> None:
        super()._on_read(units, items, limit, index)
        self.inbox_work.rcu += units
        if index == inbox.INBOX_INDEX:
            self.inbox_work.inbox_items += len(items)
            self.inbox_work.inbox_partitions.update(str(i[inbox.A_INBOX]) for i in items)


class LegacyInboxMeteredStore(InboxMeteredStore, LegacyDynamoDBStore):
    """:class:`InboxMeteredStore` over the legacy layout (before issue 21): the baseline."""


class SealedInboxMeteredStore(InboxMeteredStore):
    """:class:`InboxMeteredStore` sealing content as the template deploys it by default
    (issue 24): under a local master key, so items weigh what they weigh deployed (the
    same ciphertext format) and no KMS round trip is timed."""

    def __init__(self, client: DynamoDBClient, table_name: str, blobs: BlobStore) -> None:
        super().__init__(client, table_name, blobs)
        keyring = Keyring(LocalMasterKey(), MemoryKeyItems())
        self.sealer = ItemSealer(keyring)
        self.blobs = SealedBlobStore(blobs, keyring)


@dataclass(frozen=True)
class Sample:
    """Text turns, approval turns and their decisions: as a conversation's first turn,
    and as turns of an existing conversation (``*_mid``)."""

    text: Work
    ask: Work
    decide: Work
    text_mid: Work
    ask_mid: Work
    decide_mid: Work


@dataclass(frozen=True)
class Listing:
    """One inbox page of one tenant."""

    tenant: str
    work: Work
    shown: int
    others: int


def _registry(sink: HttpSink) -> ToolRegistry:
    definition = {
        "name": TOOL,
        "description": "Send an email.",
        "parameters": {
            "type": "object",
            "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
            "required": ["to"],
        },
        "require_approval": True,
        "executor": {"type": "http", "url": sink.url("/email")},
    }
    return ToolRegistry.from_json(json.dumps({"tools": [definition]}))


def _sample(
    service: Conversations, store: InboxMeteredStore, number: int, tenant: str = TENANTS[0]
) -> Sample:
    caller = Caller(tenant=tenant, actor="ann")
    arguments = json.dumps(ARGUMENTS)
    clock = service.clock
    assert isinstance(clock, BenchClock)

    store.measure()
    request = TurnRequest(input=f"echo: {arguments}")
    reply = edge.turn(service, caller, f"text-{number}", request)
    text = store.finish()
    assert reply.status == "complete" and reply.output_text == arguments, reply.status
    clock.advance(1)

    ask, decide = _ask_and_decide(service, store, caller, f"ask-{number}")

    store.measure()
    reply = edge.turn(service, caller, f"text-{number}", request)
    text_mid = store.finish()
    assert reply.status == "complete" and reply.output_text == arguments, reply.status
    clock.advance(1)
    ask_mid, decide_mid = _ask_and_decide(service, store, caller, f"text-{number}")
    metrics.clear_metrics()
    return Sample(
        text=text,
        ask=ask,
        decide=decide,
        text_mid=text_mid,
        ask_mid=ask_mid,
        decide_mid=decide_mid,
    )


def _ask_and_decide(
    service: Conversations, store: InboxMeteredStore, caller: Caller, conversation: str
) -> tuple[Work, Work]:
    """A turn of ``conversation`` whose call waits for approval, then its approval."""
    clock = service.clock
    assert isinstance(clock, BenchClock)
    arguments = json.dumps(ARGUMENTS)
    store.measure()
    reply = edge.turn(service, caller, conversation, TurnRequest(input=f"/tool {TOOL} {arguments}"))
    ask = store.finish()
    assert reply.status == "awaiting_approval", reply.status
    [call] = reply.pending_tool_calls
    clock.advance(1)

    store.measure()
    done = edge.approve(service, caller, conversation, ApprovalRequest(approve=[call.id]))
    decide = store.finish()
    assert done.status == "complete", done.status
    assert done.output_text and '"sent":true' in done.output_text, done.output_text
    clock.advance(1)
    return ask, decide


def _fill(service: Conversations, pending: int) -> None:
    """``pending`` calls waiting in each tenant's inbox, interleaved in time across tenants."""
    clock = service.clock
    assert isinstance(clock, BenchClock)
    for n in range(pending):
        for tenant in TENANTS:
            caller = Caller(tenant=tenant, actor="ann")
            arguments = json.dumps({**ARGUMENTS, "to": f"user{n}@{tenant}.example"})
            reply = edge.turn(
                service, caller, f"inbox-{n}", TurnRequest(input=f"/tool {TOOL} {arguments}")
            )
            assert reply.status == "awaiting_approval", reply.status
            clock.advance(1)
            # Powertools prints its buffer every 100 values: keep the run's output readable.
            metrics.clear_metrics()


def _listing(service: Conversations, store: InboxMeteredStore, tenant: str) -> Listing:
    store.measure()
    page = list_inbox(service, tenant, limit=DEFAULT_LIMIT)
    work = store.finish()
    own = inbox.inbox_partition(tenant)
    return Listing(
        tenant=tenant,
        work=work,
        shown=len(page.entries),
        others=len(work.inbox_partitions - {own}),
    )


#: Each layout's samples run in a tenant of its own, of the same length (the same item sizes).
LAYOUT_TENANTS = {"legacy": "base", "sealed": "vault", "current": TENANTS[0]}
#: The layouts measured: the baseline before issue 21, the current store sealing content
#: (the deployed default), and the current store in clear (last: the listings use it).
LAYOUT_STORES: dict[str, type[InboxMeteredStore]] = {
    "legacy": LegacyInboxMeteredStore,
    "sealed": SealedInboxMeteredStore,
    "current": InboxMeteredStore,
}


def run(samples: int, pending: int) -> tuple[dict[str, list[Sample]], list[Listing]]:
    """Run the samples on every layout and the listings (current layout) on DynamoDB Local."""
    with local_engines() as engines, HttpSink() as sink, httpx.Client() as http:
        clients, settings = engines.clients, engines.settings
        sink.respond("/email", Reply(body={"sent": True}))
        blobs = S3BlobStore(clients.s3, settings.bucket_name)
        results: dict[str, list[Sample]] = {}
        for layout, store_class in LAYOUT_STORES.items():
            store = store_class(clients.dynamodb, settings.table_name, blobs)
            service = Conversations(
                store=store,
                provider=DemoProvider(),
                settings=settings,
                tools=_registry(sink),
                runner=ToolRunner(http, None),
                clock=BenchClock(),
            )
            results[layout] = []
            for number in range(1, samples + 1):
                tenant = LAYOUT_TENANTS[layout]
                results[layout].append(_sample(service, store, number, tenant))
                print(f"  {layout} sample {number}/{samples}", flush=True)
        # Every decided call left the inbox with its decision's commit.
        left = list_inbox(service, TENANTS[0])
        assert left.entries == [], [(e.conversation_id, e.call_id) for e in left.entries]
        _fill(service, pending)
        print(f"  {pending} calls waiting in each of {len(TENANTS)} inboxes", flush=True)
        listings = [_listing(service, store, tenant) for _ in range(samples) for tenant in TENANTS]
    return results, listings


#: What a sample measures, as the tables name it, in their order.
KINDS = (
    ("text turn, first", "text"),
    ("approval turn, first", "ask"),
    ("decision (first turn's call)", "decide"),
    ("text turn, existing conversation", "text_mid"),
    ("approval turn, existing conversation", "ask_mid"),
    ("decision, existing conversation", "decide_mid"),
)

#: Issue 21's targets: priced WCU of a turn that requests one approval, and of its decision.
ASK_TARGET_WCU = 8
DECIDE_TARGET_WCU = 8


def _layouts(by_layout: dict[str, list[Sample]]) -> list[str]:
    """The section's table of the layouts side by side, with the issue's targets."""

    def m(samples: list[Sample], kind: str, pick: str) -> float:
        return float(statistics.median([getattr(getattr(s, kind), pick) for s in samples]))

    legacy, current, sealed = by_layout["legacy"], by_layout["current"], by_layout["sealed"]
    lines = [
        "### Legacy layout beside the current one",
        "",
        "The same samples, in the same run, on the layout before issue 21 "
        "(`tests/support/legacy_layout.py`: one item per event, the whole head on every "
        "commit, one `TransactWriteItems` per commit) and on the current store, in clear "
        "and sealing content as the template deploys it by default (issue 24: each sealed "
        "value 34 bytes longer, a head state's content in an attribute of its own); on "
        "both, content values of 128 bytes or more are deflated first (issue 21, "
        "docs/STORAGE.md, *Compression*). "
        "Medians, priced.",
        "",
        "| | legacy WCU | current WCU | current, sealed WCU | current / legacy | legacy RCU "
        "| current RCU | legacy / current write requests |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, kind in KINDS:
        old, new = m(legacy, kind, "wcu"), m(current, kind, "wcu")
        lines.append(
            f"| {label} | {old:.1f} | {new:.1f} | {m(sealed, kind, 'wcu'):.1f} | {new / old:.2f} | "
            f"{m(legacy, kind, 'rcu'):.1f} | {m(current, kind, 'rcu'):.1f} | "
            f"{m(legacy, kind, 'writes'):.0f} / {m(current, kind, 'writes'):.0f} |"
        )
    verdict = {True: "met", False: "**missed**"}
    lines += [
        "",
        "| target (issue 21) | where | store | measured | verdict |",
        "| --- | --- | --- | ---: | --- |",
    ]
    for where, ask_kind, decide_kind, store, samples in (
        ("a turn of an existing conversation", "ask_mid", "decide_mid", "clear", current),
        ("a turn of an existing conversation", "ask_mid", "decide_mid", "sealed", sealed),
        ("a conversation's first turn (it also creates it)", "ask", "decide", "clear", current),
        ("a conversation's first turn (it also creates it)", "ask", "decide", "sealed", sealed),
    ):
        ask, decide = m(samples, ask_kind, "wcu"), m(samples, decide_kind, "wcu")
        where = f"{where} | {store}"
        lines += [
            f"| a turn that requests one approval <= {ASK_TARGET_WCU} WCU | {where} | "
            f"{ask:.1f} | {verdict[ask <= ASK_TARGET_WCU]} |",
            f"| its decision <= {DECIDE_TARGET_WCU} WCU | {where} | {decide:.1f} | "
            f"{verdict[decide <= DECIDE_TARGET_WCU]} |",
        ]
    lines += [
        "",
        "A conversation's first turn also creates it, in the same transaction: `HEAD` (x2) "
        "with its `by-expiry` and `by-tenant` entries, beside the inbox entry (x2) with its "
        "`by-inbox` and `by-wait` entries and the turn item (x2): at least 2 + 2 + 2 + 2 + 2 "
        "= 10 WCU with every item under 1 KiB, so an approval as a first turn cannot meet "
        f"<= {ASK_TARGET_WCU} in this layout (docs/STORAGE.md, *Approval and decision*); "
        "issue 21 judges per-turn targets on turns of an existing conversation.",
    ]
    return lines


def render(
    by_layout: dict[str, list[Sample]], listings: list[Listing], pending: int, command: str
) -> str:
    """The section's markdown."""
    samples = by_layout["current"]

    def m(pick: str, kind: str) -> float:
        return float(statistics.median([getattr(getattr(s, kind), pick) for s in samples]))

    rows = [
        ("head and transcript items `E#...`, x2 in a transaction", "table_wcu"),
        ("inbox entry item `W#...` (put / delete), x2", "entry_wcu"),
        ("`by-inbox` index entry (put / delete)", "inbox_index_wcu"),
        ("`by-wait` index entry (expiry sweep; the inbox entry's own)", "wait_index_wcu"),
        ("other head indexes (`by-expiry`, `by-tenant`)", "head_index_wcu"),
        ("other items (drafts, idempotency records)", "other_wcu"),
        ("**WCU, priced**", "wcu"),
        ("WCU as DynamoDB Local reported it", "reported_wcu"),
        ("**RCU, priced**", "rcu"),
        ("RCU as DynamoDB Local reported it", "reported_rcu"),
        ("write requests", "writes"),
        ("write requests that put the head or transcript items", "commits"),
        ("transcript items written (`E#...`)", "events"),
        ("`HEAD` puts", "head_puts"),
    ]
    arguments = json.dumps(ARGUMENTS)
    lines = [
        f"{command}; alone: `make bench ARGS=approvals`. On DynamoDB Local; {machine_line()}.",
        "",
        f"Median of {len(samples)} samples, each on new conversations of one tenant. "
        f"**Text turn**: the first turn of a conversation, `echo: {arguments}` "
        "(the demo model answers that JSON as text). **Approval turn**: the first turn "
        f"of another conversation, `/tool {TOOL} {arguments}` (same arguments), which the "
        f"model answers with one call of `{TOOL}` (registry: `require_approval: true`, "
        "executor `http` on a local sink), so the turn ends `awaiting_approval` and writes "
        "the call's inbox entry. **Decision**: `POST .../approvals` approving it: the tool "
        "runs, the model answers, the entry is deleted. **Existing conversation**: the text "
        "turn's conversation then gets a second text turn, an approval turn and its "
        "decision, none of which creates the conversation (its `HEAD` and that `HEAD`'s "
        "`by-expiry` and `by-tenant` entries); issue 21 judges its per-turn targets on such "
        "turns (the plain turn's at steady state). Write units are priced from item "
        "sizes (`bench/pricing.py`; DynamoDB Local misreports transactions); index entries "
        "at the standard rate, `by-inbox` on its projected attributes (`INCLUDE v, d`).",
        "",
        "| capacity | " + " | ".join(label for label, _ in KINDS) + " |",
        "| --- |" + " ---: |" * len(KINDS),
    ]
    for name, pick in rows:
        values = [m(pick, kind) for _, kind in KINDS]
        lines.append(f"| {name} | " + " | ".join(f"{v:.1f}" for v in values) + " |")
    ask_extra = m("wcu", "ask") - m("wcu", "text")
    ask_inbox = m("inbox_wcu", "ask")
    decide_inbox = m("inbox_wcu", "decide")
    lines += [
        "",
        f"- The approval turn writes {ask_extra:+.1f} WCU against the text turn "
        f"({m('wcu', 'ask'):.1f} against {m('wcu', 'text'):.1f}); the inbox (entry item + "
        f"`by-inbox` entry) is {ask_inbox:.1f} of its WCU "
        f"({ask_inbox / m('wcu', 'ask'):.0%}), the `by-wait` entry "
        f"{m('wait_index_wcu', 'ask'):.1f} more; the rest is the turn's own items "
        f"({m('events', 'ask'):.0f} transcript item(s) holding its events, the call and its "
        f"request among them, against {m('events', 'text'):.0f}, and a larger head holding the "
        "pending call).",
        "- Reads: a first turn reads only its (missing) head, priced 1 RCU (DynamoDB "
        "charges a read of a missing item; DynamoDB Local reports 0).",
        f"- The decision writes {m('wcu', 'decide'):.1f} WCU and reads "
        f"{m('rcu', 'decide'):.1f} RCU in {m('writes', 'decide'):.0f} write requests (the "
        "decision, then the tool's result with the model's answer); deleting the entry and "
        f"its index entry is {decide_inbox:.1f} WCU of it, removing the `by-wait` entry "
        f"{m('wait_index_wcu', 'decide'):.1f}.",
        f"- In an existing conversation the approval turn writes {m('wcu', 'ask_mid'):.1f} "
        f"WCU (the text turn {m('wcu', 'text_mid'):.1f}) and its decision "
        f"{m('wcu', 'decide_mid'):.1f} in {m('writes', 'decide_mid'):.0f} write requests, "
        f"putting `HEAD` {m('head_puts', 'ask_mid'):.0f} and "
        f"{m('head_puts', 'decide_mid'):.0f} times (the inbox entry files the wait on "
        "`by-wait` itself, so starting or ending a person's wait leaves `HEAD` alone).",
    ]
    lines += ["", *_layouts(by_layout)]
    shown = statistics.median([float(x.shown) for x in listings])
    read = statistics.median([float(x.work.inbox_items) for x in listings])
    others = max(x.others for x in listings)
    lines += [
        "",
        f"`GET /v1/approvals` (first page, `limit={DEFAULT_LIMIT}`) while {len(TENANTS)} "
        f"tenants each have {pending} calls waiting (each call in a conversation of its "
        f"own, requests interleaved in time across tenants); median of {len(listings)} listings "
        f"({len(listings) // len(TENANTS)} per tenant):",
        "",
        "| listing | value |",
        "| --- | ---: |",
        f"| calls shown | {shown:.0f} |",
        f"| index items read | {read:.0f} |",
        f"| items read of other tenants | {others} |",
        f"| RCU, priced (eventually consistent index query) | "
        f"{statistics.median([x.work.rcu for x in listings]):.1f} |",
        f"| RCU as DynamoDB Local reported it | "
        f"{statistics.median([x.work.reported_rcu for x in listings]):.1f} |",
        "",
        f"The page reads {read:.0f} of the index's {pending * len(TENANTS)} entries in one "
        "query (up to one more than it shows, to know whether a next page exists), all of "
        "the caller's tenant: the `by-inbox` partition is the tenant, so other tenants' "
        "entries are never read and do not add to the cost.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and rewrite its section of ``bench/RESULTS.md``."""
    parser = argparse.ArgumentParser(prog="python -m bench.approvals", description=__doc__)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--pending", type=int, default=60, help="waiting calls per tenant")
    parser.add_argument("--print-only", action="store_true")
    args = parser.parse_args(argv)
    print(f"approvals benchmark: {args.samples} samples", flush=True)
    samples, listings = run(args.samples, args.pending)
    others = [x for x in listings if x.others]
    if others:
        print(f"a listing read another tenant's entries: {others[0].tenant}", file=sys.stderr)
        return 1
    command = command_line("bench.approvals", sys.argv[1:] if argv is None else argv)
    markdown = render(samples, listings, args.pending, command)
    publish(SECTION, markdown, print_only=args.print_only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
