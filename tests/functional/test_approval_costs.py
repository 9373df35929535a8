"""What an approval and its decision write, item by item, priced as DynamoDB bills them.

The approval benchmark's metered store (``bench/approvals.py``, every request priced on
the wire by ``bench/pricing.py``) over moto, with the benchmark's own conversation shape:
a text turn, then a turn whose call waits for approval, then its approval. Counts write
requests and the items each one writes, never times. Issue 21's targets: a turn that
requests one approval <= 8 WCU and its decision <= 8, in an existing conversation, with
content in clear and sealed (issue 24, the deployed default: each sealed value weighs its
clear text plus a nonce and a tag, which compressing it before sealing pays for).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from moto import mock_aws
from turnledger.providers.demo import DemoProvider
from turnledger.store import inbox
from turnledger.store.blobs import S3BlobStore
from turnledger.tools import ToolRunner
from turnledger.turn.pipeline import Conversations

from bench import approvals
from bench.conversation import BenchClock
from bench.metered import HEAD_SK, PricedWrite
from tests.functional.http_sink import HttpSink, Reply
from tests.support.aws import aws_clients, settings_on


class _Recording(approvals.InboxMeteredStore):
    """The benchmark's store, keeping every priced write request of the current request."""

    requests: list[PricedWrite]

    def _on_write(self, write: PricedWrite) -> None:
        super()._on_write(write)
        self.requests.append(write)


class _SealedRecording(_Recording, approvals.SealedInboxMeteredStore):
    """:class:`_Recording` sealing content as the template deploys it by default."""


@pytest.fixture(params=[_Recording, _SealedRecording], ids=["clear", "sealed"])
def sample(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[approvals.Sample, dict[str, list[PricedWrite]]]]:
    recording: type[_Recording] = request.param
    with mock_aws(), HttpSink() as sink, httpx.Client() as http:
        sink.respond("/email", Reply(body={"sent": True}))
        clients = aws_clients()
        settings = settings_on(clients)
        store = recording(
            clients.dynamodb,
            settings.table_name,
            S3BlobStore(clients.s3, settings.bucket_name),
        )
        store.requests = []
        by_request: dict[str, list[PricedWrite]] = {}
        measure = store.measure

        def measured() -> approvals.Work:
            store.requests = []
            by_request[f"request-{len(by_request)}"] = store.requests
            return measure()

        store.measure = measured  # type: ignore[method-assign]
        service = Conversations(
            store=store,
            provider=DemoProvider(),
            settings=settings,
            tools=approvals._registry(sink),
            runner=ToolRunner(http, None),
            clock=BenchClock(),
        )
        yield approvals._sample(service, store, 1), by_request


def _kinds(write: PricedWrite) -> list[str]:
    """What one request wrote: ``E`` a turn item, ``HEAD``, ``W+`` / ``W-`` an inbox entry
    put / deleted."""
    found = []
    for item in write.items:
        if item.sk.startswith(inbox.ENTRY_PREFIX):
            found.append("W-" if item.item is None else "W+")
        else:
            found.append(item.sk if item.sk == HEAD_SK else item.sk[:2].rstrip("#"))
    return sorted(found)


def test_an_approval_and_its_decision_in_a_conversation_write_no_head(
    sample: tuple[approvals.Sample, dict[str, list[PricedWrite]]],
) -> None:
    """In an existing conversation the approval turn is one transaction of its turn item
    and the inbox entry (which files the wait on ``by-wait`` itself), and the decision two
    writes: its turn item with the entry's delete, then the tool result's turn item alone.
    No ``HEAD`` write; 8 and at most 8 WCU, priced."""
    result, by_request = sample
    # Requests in order: text, ask, decide (first turn), text, ask, decide (mid).
    ask, decide = by_request["request-4"], by_request["request-5"]
    assert [(w.operation, _kinds(w)) for w in ask] == [("TransactWriteItems", ["E", "W+"])]
    [entry] = [i for i in ask[0].items if i.sk.startswith(inbox.ENTRY_PREFIX)]
    assert entry.index_wcu == {"by-inbox": 1, "by-wait": 1}
    assert [(w.operation, _kinds(w)) for w in decide] == [
        ("TransactWriteItems", ["E", "W-"]),
        ("PutItem", ["E"]),
    ]
    assert result.ask_mid.head_puts == 0 and result.decide_mid.head_puts == 0
    assert result.ask_mid.wcu <= approvals.ASK_TARGET_WCU
    assert result.decide_mid.wcu <= approvals.DECIDE_TARGET_WCU
    assert result.text_mid.writes == 1 and result.text_mid.head_puts == 0


def test_a_first_turn_approval_pays_for_creating_the_conversation(
    sample: tuple[approvals.Sample, dict[str, list[PricedWrite]]],
) -> None:
    """As a conversation's first turn the approval also puts ``HEAD`` (no ``by-wait`` entry
    of its own: the inbox entry has it) with its ``by-expiry`` and ``by-tenant`` entries;
    the decision leaves ``HEAD`` alone."""
    result, by_request = sample
    ask, decide = by_request["request-1"], by_request["request-2"]
    assert [(w.operation, _kinds(w)) for w in ask] == [("TransactWriteItems", ["E", "HEAD", "W+"])]
    [head] = [i for i in ask[0].items if i.sk == HEAD_SK]
    assert sorted(head.index_wcu) == ["by-expiry", "by-tenant"]
    assert [(w.operation, _kinds(w)) for w in decide] == [
        ("TransactWriteItems", ["E", "W-"]),
        ("PutItem", ["E"]),
    ]
    assert result.ask.wcu - result.ask_mid.wcu == 4  # HEAD x2 and its two index entries
    assert result.decide.wcu == result.decide_mid.wcu
