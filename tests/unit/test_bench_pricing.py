"""The benchmarks' pricing of DynamoDB requests (``bench/metered.py``), on moto.

The benchmarks price what the store sends on the wire, so a store that writes a turn
another way (issue 21: a conditional ``PutItem`` instead of a transaction) is priced by
the same rules as the layout it replaces, and the legacy layout stays measurable beside it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from moto import mock_aws
from turnledger.store import codec
from turnledger.store.blobs import S3BlobStore
from turnledger.store.codec import SideItem

from bench.metered import MeteredLegacyStore, MeteredStore
from bench.pricing import TRANSACTION_FACTOR, index_specs, item_size, write_units
from tests.support.aws import aws_clients, create_bucket, create_conversations_table
from tests.support.factories import another_environment, build_turn, incompressible, make_key
from tests.support.legacy_layout import encode_event, encode_head


@pytest.fixture(params=[MeteredStore, MeteredLegacyStore], ids=["current", "legacy"])
def metered(request: pytest.FixtureRequest) -> Iterator[MeteredStore]:
    with mock_aws():
        clients = aws_clients()
        table = create_conversations_table(clients.dynamodb)
        blobs = S3BlobStore(clients.s3, create_bucket(clients.s3))
        store_class: type[MeteredStore] = request.param
        yield store_class(clients.dynamodb, table, blobs, index_specs())


def test_a_standard_put_is_priced_once_per_started_kib(metered: MeteredStore) -> None:
    key = make_key("tenant-price", "side")
    side = SideItem(sort_key="S#draft#1", attributes={"text": incompressible(1500)})
    work = metered.begin()
    metered.put_side_item(key, side)
    [write] = work.writes
    assert write.operation == "PutItem" and write.succeeded
    [priced] = write.items
    assert priced.table_wcu == write_units(item_size(priced.item or {})) == 2
    assert work.priced_wcu == 2 and work.write_requests == 1


def test_a_commit_is_priced_item_by_item_with_its_index_entries(metered: MeteredStore) -> None:
    """A first commit is one transaction, 2x per item, and the head's index entries
    (``by-expiry``, ``by-tenant``) put once: the legacy layout puts an item per event, the
    current one a single turn item holding both."""
    key = make_key("tenant-price", "commit")
    turn = build_turn(key, None, ["hello", "x" * 1200])
    work = metered.begin()
    metered.commit(key, expected_version=None, head=turn.head, events=turn.events)
    items = [encode_event(key, turn.head, e, None) for e in turn.events]
    head = encode_head(key, turn.head)
    if not isinstance(metered, MeteredLegacyStore):
        # One turn item carrying the head's fast state; HEAD with its bucket-end TTL.
        items = [codec.with_state(codec.encode_turn_item(key, turn.head, items), turn.head)]
        head = codec.encode_head(key, codec.head_of_record(turn.head))
        # As the store writes them: content over a few hundred bytes deflated (issue 21).
        items, head = [metered.sealer.seal(i) for i in items], metered.sealer.seal(head)
    table = TRANSACTION_FACTOR * sum(write_units(item_size(i)) for i in items)
    table += TRANSACTION_FACTOR * write_units(item_size(head))
    indexes = sum(spec.write_units(None, head) for spec in metered.indexes)
    [commit] = work.commits
    assert commit.events == items and commit.head is not None
    assert work.priced_wcu == table + indexes
    assert work.priced_index_wcu == indexes


def test_a_failed_conditional_write_is_priced_and_nothing_is_remembered(
    metered: MeteredStore,
) -> None:
    """DynamoDB bills a write whose condition fails: so does the benchmark."""
    key = make_key("tenant-price", "lost")
    turn = build_turn(key, None, ["hello", "world"])
    metered.commit(key, expected_version=None, head=turn.head, events=turn.events)
    # Another execution environment commits the next turn first: this one's write is sent
    # (it has no reason to read again) and refused by its condition.
    theirs = build_turn(key, turn.head, ["theirs", "first"])
    another_environment(metered).commit(
        key, expected_version=turn.head.version, head=theirs.head, events=theirs.events
    )
    mine = build_turn(key, turn.head, ["mine", "late"])
    work = metered.begin()
    with pytest.raises(Exception, match="committed"):
        metered.commit(key, expected_version=turn.head.version, head=mine.head, events=mine.events)
    [write] = work.writes
    assert not write.succeeded and write.wcu > 0
    assert work.commits == []


def test_a_plain_turn_is_one_conditional_put_priced_once(metered: MeteredStore) -> None:
    """A turn after the first: the current layout sends one ``PutItem`` of its turn item
    (a commit without a head, priced 1x per started KiB); the legacy layout a transaction
    of its event items and the head (2x each)."""
    key = make_key("tenant-price", "plain")
    first = build_turn(key, None, ["hello", "world"])
    metered.commit(key, expected_version=None, head=first.head, events=first.events)
    # Random text (DEFLATE saves a quarter of it): a turn item over 1 KiB once stored.
    turn = build_turn(key, first.head, [incompressible(400), incompressible(1000)])
    work = metered.begin()
    metered.commit(key, expected_version=first.head.version, head=turn.head, events=turn.events)
    [commit] = work.commits
    [write] = work.writes
    if isinstance(metered, MeteredLegacyStore):
        assert write.operation == "TransactWriteItems" and commit.head is not None
        return
    assert (write.operation, commit.head, commit.transactional) == ("PutItem", None, False)
    [item] = commit.events
    assert work.priced_wcu == write_units(item_size(item)) == 2
    assert work.priced_index_wcu == 0
