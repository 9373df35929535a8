"""Content sealed at rest and erased by destroying its keys (issue 24), on real backends.

Each store here seals with a keyring: on moto (DynamoDB, S3 and KMS in one mock), on
DynamoDB Local with moto's KMS and S3 (its threaded server), and on SQLite with a local
key file. A "backup" is what a test reads raw before an erasure and writes back after it,
as a point-in-time restore of the table or an old version of an object would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from mypy_boto3_dynamodb.client import DynamoDBClient
from mypy_boto3_kms.client import KMSClient
from turnledger.core.exceptions import ContentUnreadable
from turnledger.core.models import ConversationKey, ConversationStatus, Head, PendingCall
from turnledger.ops.sweep import Sweeper
from turnledger.store import codec, inbox, keys
from turnledger.store.base import ConversationStore
from turnledger.store.blobs import FileBlobStore, S3BlobStore
from turnledger.store.codec import Item, SideItem
from turnledger.store.dynamodb import DynamoDBConversationStore
from turnledger.store.keyring import (
    DynamoDBKeyItems,
    Keyring,
    KmsMasterKey,
    LocalMasterKey,
    SQLiteKeyItems,
)
from turnledger.store.records import Record
from turnledger.store.sealed import DEFLATED, DEFLATED_VALUE, MAGIC, SEALED_VALUE, SealedBlobStore
from turnledger.store.sqlite import SQLiteConversationStore
from turnledger.tools import arguments_sha256

from tests.conftest import FAKE_ENVIRONMENT
from tests.support.aws import (
    AwsClients,
    aws_clients,
    create_bucket,
    create_conversations_table,
    create_keys_table,
)
from tests.support.factories import (
    START,
    FakeClock,
    Turn,
    another_environment,
    build_turn,
    commit_turn,
    delete_raw_item,
    holds_text,
    make_key,
    put_raw_item,
    raw_item,
    raw_sort_keys,
    stored_uncompressed,
)

from .test_store_contract import EVERYTHING

SECRET = "the patient's diagnosis is confidential"
#: Over the store's offload threshold (set low below): goes to the bucket.
BIG = "payload " + "x" * 2_000 + SECRET
TENANT = "tenant-a"
OWN_KEY_TENANT = "tenant-own"
KEY = make_key(TENANT, "sealed-1")


@dataclass
class Sealed:
    """A sealing store, and its KMS (``None``: a local key file)."""

    store: ConversationStore
    kms: KMSClient | None = None
    #: The customer-managed key :data:`OWN_KEY_TENANT` named (KMS only).
    own_key: str | None = None


def _kms_keyring(kms: KMSClient, dynamodb: DynamoDBClient) -> tuple[Keyring, str]:
    shared = kms.create_key(Description="turnledger shared")["KeyMetadata"]["KeyId"]
    own = kms.create_key(Description="a tenant's own")["KeyMetadata"]["KeyId"]
    master = KmsMasterKey(kms, shared, {OWN_KEY_TENANT: own})
    return Keyring(master, DynamoDBKeyItems(dynamodb, create_keys_table(dynamodb))), own


def _sealed_dynamodb(clients: AwsClients, kms: KMSClient) -> Sealed:
    """A sealing DynamoDB store on ``clients``, its keys wrapped by ``kms``."""
    keyring, own = _kms_keyring(kms, clients.dynamodb)
    store = DynamoDBConversationStore(
        clients.dynamodb,
        create_conversations_table(clients.dynamodb),
        S3BlobStore(clients.s3, create_bucket(clients.s3)),
        offload_threshold=1_000,
        keyring=keyring,
    )
    return Sealed(store, kms, own)


@pytest.fixture(
    params=[
        pytest.param("moto", id="moto"),
        pytest.param("dynamodb-local", id="dynamodb-local", marks=pytest.mark.integration),
        pytest.param("sqlite", id="sqlite"),
    ]
)
def sealed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sealed]:
    if request.param == "moto":
        with mock_aws():
            clients = aws_clients()
            kms = boto3.client("kms", region_name=FAKE_ENVIRONMENT["AWS_REGION"])
            yield _sealed_dynamodb(clients, kms)
        return
    if request.param == "dynamodb-local":
        ddb = request.getfixturevalue("ddb_local_endpoint")
        moto = request.getfixturevalue("moto_server_endpoint")
        clients = aws_clients(ddb, s3_endpoint=moto)
        kms = boto3.client("kms", region_name=FAKE_ENVIRONMENT["AWS_REGION"], endpoint_url=moto)
        yield _sealed_dynamodb(clients, kms)
        return
    keyring = Keyring(
        LocalMasterKey.from_file(tmp_path / "master.key"),
        SQLiteKeyItems(tmp_path / "keys.sqlite3"),
    )
    sqlite = SQLiteConversationStore(
        tmp_path / "turnledger.sqlite3",
        FileBlobStore(tmp_path / "blobs"),
        offload_threshold=1_000,
        keyring=keyring,
    )
    yield Sealed(sqlite)
    sqlite.close()


def _backup(store: ConversationStore, key: ConversationKey) -> tuple[list[Item], dict[str, bytes]]:
    """Every item of ``key``'s partition and every object of it, raw: a backup."""
    items = [raw_item(store, key, sk) for sk in raw_sort_keys(store, key)]
    blobs = store.blobs
    assert isinstance(blobs, SealedBlobStore)
    objects = {k: blobs.inner.get(k) for k in blobs.inner.list_keys(keys.blob_prefix(key))}
    return [item for item in items if item is not None], objects


def _restore(
    store: ConversationStore,
    key: ConversationKey,
    backup: tuple[list[Item], dict[str, bytes]],
) -> None:
    """The partition as ``backup`` holds it, as a restored table would (a restore is a new
    table: nothing written after the copy, such as a clear's gravestones, is in it)."""
    items, objects = backup
    for sort_key in raw_sort_keys(store, key):
        delete_raw_item(store, key, sort_key)
    for item in items:
        put_raw_item(store, item)
    blobs = store.blobs
    assert isinstance(blobs, SealedBlobStore)
    for object_key, data in objects.items():
        blobs.inner.put(object_key, data)


def _content_turn(store: ConversationStore, key: ConversationKey = KEY) -> None:
    """A turn with content in an event, an offloaded payload, a side item and a record."""
    turn = commit_turn(store, key, None, [SECRET, BIG])
    store.put_side_item(key, SideItem("S#draft#1#c#000001", {"text": SECRET}, gen=turn.head.gen))
    record = Record(key="I#req-1", status="COMPLETED", expires_at=2**31, data=SECRET)
    assert store.put_record(key, record, now=0) is None


def test_content_at_rest_is_ciphertext_and_reads_back(sealed: Sealed) -> None:
    """Every item and object holding content is ciphertext at rest; ids, kinds, sequence
    numbers and timestamps stay clear; the store reads the content back."""
    store = sealed.store
    _content_turn(store)

    items, objects = _backup(store, KEY)
    assert objects and all(SECRET.encode() not in data for data in objects.values())
    assert not any(holds_text(item, SECRET) for item in items)
    by_key = {str(item[codec.A_SK]): item for item in items}
    assert by_key["E#000000000001"][codec.A_BODY].startswith(SEALED_VALUE)
    assert by_key["S#draft#1#c#000001"]["text"].startswith(SEALED_VALUE)
    assert by_key["I#req-1"]["data"].startswith(SEALED_VALUE)
    assert by_key["I#req-1"]["status"] == "COMPLETED"  # conditions read it: clear
    assert json.loads(by_key[keys.HEAD_SK][codec.A_BODY])["seq"] == 2  # the head: clear

    snapshot = store.load(KEY, EVERYTHING)
    assert [e.payload["content"] for e in snapshot.events] == [SECRET, BIG]
    side = store.get_side_item(KEY, "S#draft#1#c#000001")
    assert side is not None and side.attributes["text"] == SECRET
    record = store.get_record(KEY, "I#req-1")
    assert record is not None and record.data == SECRET


def test_a_ciphertext_copied_to_another_item_is_refused(sealed: Sealed) -> None:
    """A sealed body is bound to its item: copied into another conversation's event item
    (same tenant, same shape), it does not open, and the read answers ContentUnreadable."""
    store = sealed.store
    other = make_key(TENANT, "sealed-2")
    commit_turn(store, KEY, None, [SECRET, "answer"])
    commit_turn(store, other, None, ["harmless", "answer"])
    stolen = raw_item(store, KEY, "E#000000000001")
    target = raw_item(store, other, "E#000000000001")
    assert stolen is not None and target is not None
    put_raw_item(store, {**target, codec.A_BODY: stolen[codec.A_BODY]})

    with pytest.raises(ContentUnreadable) as caught:
        store.load(other, EVERYTHING)
    assert caught.value.status == 410 and caught.value.code == "content_unreadable"


def test_a_backup_restored_after_delete_is_unreadable(sealed: Sealed) -> None:
    """After a clear (DELETE), items and objects restored from a copy taken before it are
    ciphertext under destroyed keys: every read answers ContentUnreadable (410), never
    content, never a 500."""
    store = sealed.store
    _content_turn(store)
    backup = _backup(store, KEY)

    store.clear(KEY, FakeClock().now())
    assert store.get_head(KEY) is None
    _restore(store, KEY, backup)

    with pytest.raises(ContentUnreadable):
        store.load(KEY, EVERYTHING)
    head = store.get_head(KEY)
    assert head is not None
    with pytest.raises(ContentUnreadable):
        store.read_events(KEY, head, after=0, limit=10)
    with pytest.raises(ContentUnreadable):
        store.get_side_item(KEY, "S#draft#1#c#000001")
    with pytest.raises(ContentUnreadable):
        store.get_record(KEY, "I#req-1")
    blobs = store.blobs
    assert isinstance(blobs, SealedBlobStore)
    for object_key in backup[1]:
        with pytest.raises(ContentUnreadable):
            blobs.get(object_key)
    # The restored conversation can still be cleared, and a new one starts on its id.
    store.clear(KEY, FakeClock().now())
    commit_turn(store, KEY, None, ["fresh", "start"])
    assert [e.payload["content"] for e in store.load(KEY, EVERYTHING).events] == [
        "fresh",
        "start",
    ]


def test_tenant_erasure_destroys_the_tenant_key_and_its_own_kms_key(sealed: Sealed) -> None:
    """Tenant erasure destroys the tenant key first (scheduling deletion of the KMS key the
    tenant named), then its items: a restored backup of them is unreadable; another
    tenant's content is untouched."""
    store = sealed.store
    mine = make_key(OWN_KEY_TENANT, "sealed-3")
    _content_turn(store, mine)
    _content_turn(store, KEY)
    backup = _backup(store, mine)

    report = Sweeper(store, clock=FakeClock().now).erase(OWN_KEY_TENANT)
    assert report.complete and report.conversations_removed == 1
    if sealed.kms is not None:
        state = sealed.kms.describe_key(KeyId=str(sealed.own_key))["KeyMetadata"]["KeyState"]
        assert state == "PendingDeletion"
    _restore(store, mine, backup)

    with pytest.raises(ContentUnreadable):
        store.load(mine, EVERYTHING)
    assert [e.payload["content"] for e in store.load(KEY, EVERYTHING).events] == [SECRET, BIG]


def test_clear_text_items_of_before_still_read_and_are_sealed_when_next_written(
    sealed: Sealed,
) -> None:
    """Migration: a conversation written before encryption was on reads as it is; its next
    turn is sealed."""
    store = sealed.store
    keyring = store.sealer.keyring
    store.sealer.keyring = None  # the build of before: writes clear text
    with stored_uncompressed():
        first = commit_turn(store, KEY, None, [SECRET, "answer"])
    store.sealer.keyring = keyring
    before = raw_item(store, KEY, "E#000000000001")
    assert before is not None and SECRET in str(before[codec.A_BODY])

    second = build_turn(KEY, first.head, ["again", "more"])
    store.commit(
        KEY, expected_version=second.expected_version, head=second.head, events=second.events
    )

    events = store.load(KEY, EVERYTHING).events
    assert [e.payload["content"] for e in events] == [SECRET, "answer", "again", "more"]
    after = raw_item(store, KEY, "E#000000000003")
    assert after is not None and after[codec.A_BODY].startswith(SEALED_VALUE)


def test_delete_still_names_the_provider_responses_its_sealed_run_records_hold(
    sealed: Sealed,
) -> None:
    """A purge destroys the keys first, yet still reads the stored provider responses
    that the run records of what it deletes name (their keys are held for the purge), so
    a DELETE forgets them at the provider as without encryption."""
    store = sealed.store
    turn = build_turn(KEY, None, [SECRET, "answer"])
    run = {
        "model": "m",
        "provider": "openai-responses",
        "latency_ms": 1,
        "tokens_estimated": 1,
        "budget_tokens": 1,
        "messages_sent": 1,
        "context_from": 1,
        "context_sha256": "0" * 64,
        "response_id": "resp_sealed_1",
    }
    answer = turn.events[1].model_copy(update={"payload": {"content": "answer", "run": run}})
    store.commit(KEY, expected_version=None, head=turn.head, events=[turn.events[0], answer])

    report = store.clear(KEY, FakeClock().now())

    assert ("openai-responses", "resp_sealed_1") in report.provider_responses


def test_the_inbox_leaves_out_an_entry_restored_after_delete(sealed: Sealed) -> None:
    """An approval-inbox entry is sealed (its arguments are content); restored after its
    conversation's DELETE it no longer opens, and the inbox lists the other entries
    without it instead of failing the page."""
    erased, kept = make_key(TENANT, "sealed-inbox-1"), make_key(TENANT, "sealed-inbox-2")
    entries = {}
    for key in (erased, kept):
        entries[key] = inbox.InboxEntry(
            kind="input",
            conversation_id=key.conversation_id,
            call_id=f"call_{key.conversation_id}",
            tool="ask_human",
            arguments={"question": SECRET},
            requested_by=None,
            requested_at=START,
            expires_at=None,
        )
        turn = build_turn(key, None, ["q"])
        sealed.store.commit(
            key,
            expected_version=None,
            head=turn.head,
            events=turn.events,
            inbox_changes=inbox.InboxChanges(puts=[entries[key]]),
        )
    backup = _backup(sealed.store, erased)
    assert not any(holds_text(item, SECRET) for item in backup[0])
    sealed.store.clear(erased, FakeClock().now())
    _restore(sealed.store, erased, backup)

    page = sealed.store.inbox_page(TENANT, now=START, limit=10)
    assert page.entries == [entries[kept]]


#: A pending call's arguments and a person's reason: content of the head state.
STATE_SECRET = "account 4711-0815 of Ann Example is overdrawn"
CALL_ARGUMENTS = {"to": "ann@example.com", "body": STATE_SECRET}
REASON = "the auditor wrote: " + STATE_SECRET


def _waiting_turn(store: ConversationStore, key: ConversationKey = KEY, **head: object) -> Turn:
    """The first turn of ``key`` (so ``HEAD`` is written whole too), waiting for a person's
    decision on a call whose arguments (and reason) are content."""
    call = PendingCall(
        id="call_sealed_1",
        name="send_email",
        arguments=CALL_ARGUMENTS,
        requires="approval",
        state="awaiting_approval",
        idempotency_key="idem-sealed-1",
        arguments_sha256=arguments_sha256(CALL_ARGUMENTS),
        reason=REASON,
        requested_at=START,
        requested_by="ann",
    )
    return commit_turn(
        store,
        key,
        None,
        ["mail it"],
        status=ConversationStatus.AWAITING_APPROVAL,
        pending=[call],
        **head,
    )


def _state_items(store: ConversationStore, key: ConversationKey) -> list[Item]:
    """``HEAD`` and every turn item of ``key``, raw."""
    items = [raw_item(store, key, sk) for sk in raw_sort_keys(store, key)]
    return [
        item
        for item in items
        if item is not None and (item[codec.A_SK] == keys.HEAD_SK or codec.A_STATE in item)
    ]


def _no_content(items: list[Item]) -> None:
    digest = arguments_sha256(CALL_ARGUMENTS)
    for item in items:
        assert not holds_text(item, STATE_SECRET), item[codec.A_SK]
        assert not holds_text(item, digest), item[codec.A_SK]


def _waiting_call(head: Head | None) -> PendingCall:
    assert head is not None and head.status is ConversationStatus.AWAITING_APPROVAL
    [call] = head.pending
    return call


def test_the_head_state_holds_no_content_at_rest_and_reads_back(sealed: Sealed) -> None:
    """A pending call's arguments (and a person's reason) are sealed in ``HEAD`` and in
    the turn item's head state alike; ids, names, states and timestamps stay clear, and
    the store reads the content back."""
    store = sealed.store
    _waiting_turn(store)

    items = _state_items(store, KEY)
    assert {str(item[codec.A_SK]) for item in items} == {keys.HEAD_SK, "E#000000000001"}
    _no_content(items)
    by_key = {str(item[codec.A_SK]): item for item in items}
    head = json.loads(by_key[keys.HEAD_SK][codec.A_BODY])
    state = json.loads(by_key["E#000000000001"][codec.A_STATE])
    for clear in (head, state):
        assert clear["status"] == "awaiting_approval"
        assert clear["pending"][0]["id"] == "call_sealed_1"
        assert clear["pending"][0]["name"] == "send_email"
        assert clear["pending"][0]["state"] == "awaiting_approval"
        assert "updated_at" in clear
    for item in items:
        assert item[codec.A_CONTENT].startswith(SEALED_VALUE)

    call = _waiting_call(store.get_head(KEY))
    assert call.arguments == CALL_ARGUMENTS and call.reason == REASON
    loaded = _waiting_call(store.load(KEY, EVERYTHING).head)
    assert loaded.arguments == CALL_ARGUMENTS
    fresh = another_environment(store)
    assert _waiting_call(fresh.get_head(KEY)).arguments == CALL_ARGUMENTS


def test_a_head_state_ciphertext_copied_to_a_turn_item_does_not_open(sealed: Sealed) -> None:
    """The sealed content of ``HEAD`` is bound to ``HEAD``: copied into the turn item's
    head state it does not open, and the read answers ContentUnreadable."""
    store = sealed.store
    _waiting_turn(store)
    head = raw_item(store, KEY, keys.HEAD_SK)
    newest = raw_item(store, KEY, "E#000000000001")
    assert head is not None and newest is not None
    put_raw_item(store, {**newest, codec.A_CONTENT: head[codec.A_CONTENT]})

    with pytest.raises(ContentUnreadable):
        another_environment(store).get_head(KEY)


def test_a_head_restored_after_delete_answers_content_unreadable(sealed: Sealed) -> None:
    """After DELETE, a ``HEAD`` and turn item restored from a copy taken before it answer
    ContentUnreadable (410) wherever pending calls are read, never their arguments and
    never a 500; the sweep passes over it and purges it once expired; DELETE removes it."""
    store = sealed.store
    _waiting_turn(store, ttl_seconds=3600, expires_at=int(START.timestamp()) + 3600)
    backup = _backup(store, KEY)
    store.clear(KEY, FakeClock().now())
    _restore(store, KEY, backup)

    for reader in (store, another_environment(store)):
        with pytest.raises(ContentUnreadable):
            reader.get_head(KEY)
        with pytest.raises(ContentUnreadable):
            reader.load(KEY, EVERYTHING)
    # The sweep reads no content: it passes over the live head, purges the expired one.
    clock = FakeClock()
    report = Sweeper(store, clock=clock.now).conversations([KEY])
    assert report.conversations_removed == 0
    assert raw_item(store, KEY, keys.HEAD_SK) is not None
    clock.advance(7200)
    report = Sweeper(store, clock=clock.now).conversations([KEY])
    assert report.conversations_removed == 1
    assert store.get_head(KEY) is None

    _restore(store, KEY, backup)
    store.clear(KEY, FakeClock().now())
    assert store.get_head(KEY) is None
    commit_turn(store, KEY, None, ["fresh", "start"])
    assert store.get_head(KEY) is not None


def test_clear_text_head_state_of_before_reads_and_is_sealed_when_next_written(
    sealed: Sealed,
) -> None:
    """Migration: a head state written before encryption was on (arguments in clear in
    ``HEAD`` and the turn item) reads as it is; the next commit seals both, ``HEAD``
    included, even though its slow state did not change."""
    store = sealed.store
    keyring = store.sealer.keyring
    store.sealer.keyring = None  # the build of before: writes clear text
    with stored_uncompressed():
        first = _waiting_turn(store)
    store.sealer.keyring = keyring
    before = raw_item(store, KEY, keys.HEAD_SK)
    assert before is not None and holds_text(before, STATE_SECRET)
    assert _waiting_call(store.get_head(KEY)).arguments == CALL_ARGUMENTS

    # A commit of no event that keeps the call waiting (a marker, as a lease renewal is).
    still = build_turn(
        KEY,
        first.head,
        [],
        continue_turn=True,
        status=ConversationStatus.AWAITING_APPROVAL,
        pending=first.head.pending,
    )
    store.commit(KEY, expected_version=still.expected_version, head=still.head, events=still.events)

    written = [i for i in _state_items(store, KEY) if i[codec.A_SK] != "E#000000000001"]
    assert [i[codec.A_SK] for i in written] == ["E#000000000002", keys.HEAD_SK]
    _no_content(written)
    assert _waiting_call(another_environment(store).get_head(KEY)).arguments == CALL_ARGUMENTS


def test_the_sweep_refiles_a_sealed_head_without_opening_its_content(sealed: Sealed) -> None:
    """Re-filing a head under the hour it is now due in (the sweep) rewrites ``HEAD``'s
    clear fields and keeps its sealed content as it was: the arguments still read back."""
    store = sealed.store
    epoch = int(START.timestamp())
    _waiting_turn(store, ttl_seconds=5 * 3600, expires_at=epoch + 5 * 3600)
    before = raw_item(store, KEY, keys.HEAD_SK)
    assert before is not None
    # As if filed under an hour that has come due while the conversation was in use.
    put_raw_item(
        store,
        {
            **before,
            codec.A_BODY: json.dumps(
                {**json.loads(before[codec.A_BODY]), "expiry_bucket": epoch // 3600 - 1}
            ),
        },
    )

    Sweeper(store, clock=FakeClock().now).conversations([KEY])

    after = raw_item(store, KEY, keys.HEAD_SK)
    assert after is not None
    assert json.loads(after[codec.A_BODY])["expiry_bucket"] == (epoch + 5 * 3600) // 3600
    assert after[codec.A_CONTENT] == before[codec.A_CONTENT]
    _no_content([after])
    call = _waiting_call(another_environment(store).get_head(KEY))
    assert call.arguments == CALL_ARGUMENTS and call.reason == REASON


# --- the migration's one-off command (turnledger seal-existing) ----------------------------

WAITING = make_key(TENANT, "sealed-before-2")
ASKING = make_key(TENANT, "sealed-before-3")


def _written_before(store: ConversationStore) -> None:
    """Conversations of :data:`TENANT` written by the build of before (no keys): events, an
    offloaded payload, a side item, an idempotency record, a head state with a pending
    call's arguments, an inbox entry."""
    keyring, blobs = store.sealer.keyring, store.blobs
    assert isinstance(blobs, SealedBlobStore)
    store.sealer.keyring, store.blobs = None, blobs.inner
    with stored_uncompressed():
        _written_in_clear(store)
    store.sealer.keyring, store.blobs = keyring, blobs


def _written_in_clear(store: ConversationStore) -> None:
    _content_turn(store)
    _waiting_turn(store, WAITING)
    entry = inbox.InboxEntry(
        kind="input",
        conversation_id=ASKING.conversation_id,
        call_id="call_before_3",
        tool="ask_human",
        arguments={"question": SECRET},
        requested_by=None,
        requested_at=START,
        expires_at=None,
    )
    turn = build_turn(ASKING, None, ["q"])
    store.commit(
        ASKING,
        expected_version=None,
        head=turn.head,
        events=turn.events,
        inbox_changes=inbox.InboxChanges(puts=[entry]),
    )


def _clear_items(store: ConversationStore) -> list[str]:
    """The sort keys of :data:`TENANT`'s items that hold a secret in clear."""
    return [
        f"{key.conversation_id}/{item[codec.A_SK]}"
        for key in (KEY, WAITING, ASKING)
        for item in _backup(store, key)[0]
        if holds_text(item, SECRET) or holds_text(item, STATE_SECRET)
    ]


def _reading(store: ConversationStore) -> list[object]:
    """What the store answers for :func:`_written_before`'s conversations."""
    reader = another_environment(store)
    return [
        reader.load(KEY, EVERYTHING),
        reader.load(WAITING, EVERYTHING),
        reader.load(ASKING, EVERYTHING),
        reader.get_side_item(KEY, "S#draft#1#c#000001"),
        reader.get_record(KEY, "I#req-1"),
        reader.inbox_page(TENANT, now=START, limit=10).entries,
    ]


def test_seal_existing_seals_what_was_written_before_and_erasure_reaches_it(
    sealed: Sealed,
) -> None:
    """Migration: ``seal-existing`` rewrites sealed every item written in clear before keys
    were on (events, head states, side items, records, inbox entries) and the objects of
    the live lives (an offloaded payload); the conversations read back the same; a second
    run seals nothing; after DELETE, a copy of the sealed items and objects restored
    answers 410."""
    from turnledger.ops.reseal import seal_tenant

    store = sealed.store
    _written_before(store)
    before = _reading(store)
    assert len(_clear_items(store)) >= 6
    objects = _backup(store, KEY)[1]
    assert [k for k, data in objects.items() if SECRET.encode() in data]  # offloaded, clear

    first = seal_tenant(store, TENANT)

    assert _clear_items(store) == []
    objects = _backup(store, KEY)[1]
    assert objects and all(data.startswith(MAGIC) for data in objects.values())
    assert not [k for k, data in objects.items() if SECRET.encode() in data]
    assert first.sealed >= 6 and first.skipped == 0
    assert _reading(store) == before
    second = seal_tenant(store, TENANT)
    assert second.sealed == 0 and second.skipped == 0
    assert second.already_sealed == first.sealed + first.already_sealed

    backups = {key: _backup(store, key) for key in (KEY, WAITING, ASKING)}
    for key, backup in backups.items():
        store.clear(key, FakeClock().now())
        _restore(store, key, backup)
        with pytest.raises(ContentUnreadable) as caught:
            another_environment(store).load(key, EVERYTHING)
        assert caught.value.status == 410
    assert store.inbox_page(TENANT, now=START, limit=10).entries == []


def test_seal_existing_never_overwrites_an_item_changed_after_it_read_it(
    sealed: Sealed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item that changes between the command's read and its rewrite (a concurrent
    writer) keeps the change: the rewrite is conditional, the item is counted skipped, and
    the next run seals what is clear then."""
    store = sealed.store
    _written_before(store)
    changed = {**_backup(store, KEY)[0][0]}
    assert changed[codec.A_SK] == "E#000000000001"
    # Another writer rewrote its content meanwhile (the build of before, still running).
    changed[codec.A_BODY] = str(changed[codec.A_BODY]).replace(SECRET, "rewritten meanwhile")
    query = store._query

    def query_then_change(*args: object, **kwargs: object) -> object:
        page = query(*args, **kwargs)  # type: ignore[arg-type]
        if any(item[codec.A_SK] == changed[codec.A_SK] for item in page.items):
            put_raw_item(store, changed)
        return page

    monkeypatch.setattr(store, "_query", query_then_change)
    report = store.seal_existing(KEY)
    monkeypatch.undo()

    assert report.skipped == 1 and report.sealed >= 1
    assert raw_item(store, KEY, changed[codec.A_SK]) == changed
    assert store.seal_existing(KEY).sealed == 1
    items = _backup(store, KEY)[0]
    assert not [i for i in items if holds_text(i, SECRET) or holds_text(i, "meanwhile")]
    events = another_environment(store).load(KEY, EVERYTHING).events
    assert [e.payload["content"] for e in events] == ["rewritten meanwhile", BIG]


def test_seal_existing_leaves_a_conversation_being_purged_alone(sealed: Sealed) -> None:
    """A conversation whose head is fenced (a DELETE under way) is not sealed: its items
    are skipped, never rewritten under a new key."""
    store = sealed.store
    _written_before(store)
    pk = keys.partition_key(KEY)
    assert store._fence_head(pk, "fence-1") is not None
    before = _backup(store, KEY)[0]

    report = store.seal_existing(KEY)

    assert report.sealed == 0 and report.skipped >= 3
    assert _backup(store, KEY)[0] == before


def test_seal_existing_seals_content_deflated_in_clear(sealed: Sealed) -> None:
    """Content a store without keys stored deflated in clear (issue 21) is sealed by the
    command, still deflated, and reads back as written everywhere."""
    store = sealed.store
    keyring = store.sealer.keyring
    store.sealer.keyring = None  # this build without keys: deflates, does not seal
    text = f"{SECRET}; " * 20
    commit_turn(store, KEY, None, [text, "answer"])
    store.sealer.keyring = keyring
    before = raw_item(store, KEY, "E#000000000001")
    assert before is not None and before[codec.A_BODY].startswith(DEFLATED_VALUE)
    assert holds_text(before, SECRET)

    assert store.seal_existing(KEY).sealed == 1

    after = raw_item(store, KEY, "E#000000000001")
    assert after is not None and after[codec.A_BODY].startswith(SEALED_VALUE + DEFLATED)
    assert not holds_text(after, SECRET)
    events = another_environment(store).load(KEY, EVERYTHING).events
    assert [e.payload["content"] for e in events] == [text, "answer"]
