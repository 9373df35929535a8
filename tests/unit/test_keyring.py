"""The keyring: envelope keys that erasure destroys, on every place keys can live."""

from __future__ import annotations

import sqlite3
import stat
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws
from turnledger.core.exceptions import ContentUnreadable, CorruptedState
from turnledger.store.keyring import (
    DynamoDBKeyItems,
    KeyItems,
    Keyring,
    KmsMasterKey,
    LocalMasterKey,
    MemoryKeyItems,
    SQLiteKeyItems,
    data_key_name,
    item_aad,
)

REGION = "us-east-1"


@pytest.fixture
def aws() -> Iterator[None]:
    with mock_aws():
        yield


def _keys_table() -> DynamoDBKeyItems:
    client = boto3.client("dynamodb", region_name=REGION)
    client.create_table(
        TableName="keys",
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": "name", "AttributeType": "S"},
            {"AttributeName": "owner", "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "name", "KeyType": "HASH"}],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by-owner",
                "KeySchema": [{"AttributeName": "owner", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
    )
    return DynamoDBKeyItems(client, "keys")


@pytest.fixture(params=["memory", "sqlite", "dynamodb"])
def items(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeyItems]:
    if request.param == "memory":
        yield MemoryKeyItems()
    elif request.param == "sqlite":
        yield SQLiteKeyItems(tmp_path / "keys.sqlite3")
    else:
        with mock_aws():
            yield _keys_table()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


AAD = item_aad("T#acme#C#c1", "E#000000000001", "d")


def test_content_sealed_under_a_conversation_key_opens_only_in_its_own_item(
    items: KeyItems,
) -> None:
    keyring = Keyring(LocalMasterKey(), items)
    key = keyring.data_key("acme", "c1", "g1", create=True)
    sealed = key.seal(b"my name is Ivo", AAD)
    assert b"Ivo" not in sealed
    assert key.unseal(sealed, AAD, where="E#1") == b"my name is Ivo"
    moved = item_aad("T#acme#C#c1", "E#000000000002", "d")
    with pytest.raises(CorruptedState, match="does not belong"):
        key.unseal(sealed, moved, where="E#2")
    other_life = keyring.data_key("acme", "c1", "g2", create=True)
    with pytest.raises(CorruptedState):
        other_life.unseal(sealed, AAD, where="E#1")


def test_two_environments_creating_a_key_at_once_end_with_one(items: KeyItems) -> None:
    master = LocalMasterKey()
    first, second = Keyring(master, items), Keyring(master, items)
    a = first.data_key("acme", "c1", "g1", create=True)
    b = second.data_key("acme", "c1", "g1", create=True)
    sealed = a.seal(b"x", AAD)
    assert b.unseal(sealed, AAD, where="E#1") == b"x"
    # A third environment that only reads finds the same key.
    assert Keyring(master, items).data_key("acme", "c1", "g1", create=False).material == a.material


def test_a_read_never_creates_a_key(items: KeyItems) -> None:
    keyring = Keyring(LocalMasterKey(), items)
    with pytest.raises(ContentUnreadable):
        keyring.data_key("acme", "never-written", "g1", create=False)
    assert list(items.names_of("acme")) == []


def test_destroying_a_conversation_key_makes_every_copy_unreadable(items: KeyItems) -> None:
    master = LocalMasterKey()
    keyring = Keyring(master, items)
    sealed = keyring.data_key("acme", "c1", "g1", create=True).seal(b"secret", AAD)
    keep = keyring.data_key("acme", "c2", "g1", create=True).seal(b"kept", AAD)
    backup = sealed  # what a point-in-time restore would bring back

    keyring.destroy_conversation("acme", "c1", ["g1"])

    for reader in (keyring, Keyring(master, items)):  # this environment and a fresh one
        with pytest.raises(ContentUnreadable) as caught:
            reader.data_key("acme", "c1", "g1", create=False)
        assert caught.value.status == 410
        assert reader.data_key("acme", "c2", "g1", create=False).unseal(keep, AAD, where="-") == (
            b"kept"
        )
    assert backup == sealed
    # A new life of the same id gets a new key: the old content stays unreadable.
    fresh = keyring.data_key("acme", "c1", "g1", create=True)
    with pytest.raises(CorruptedState):
        fresh.unseal(backup, AAD, where="E#1")


def test_tenant_erasure_destroys_the_tenant_key_and_its_data_keys(items: KeyItems) -> None:
    master = LocalMasterKey()
    keyring = Keyring(master, items)
    keyring.data_key("acme", "c1", "g1", create=True)
    keyring.data_key("acme", "c2", "g1", create=True)
    keyring.data_key("other", "c1", "g1", create=True)

    assert keyring.destroy_tenant("acme") is None  # the shared master key stays

    assert list(items.names_of("acme")) == []
    with pytest.raises(ContentUnreadable):
        Keyring(master, items).data_key("acme", "c1", "g1", create=False)
    assert Keyring(master, items).data_key("other", "c1", "g1", create=False)


def test_a_warm_environment_calls_the_master_key_once_per_cache_period() -> None:
    clock = Clock()
    master = LocalMasterKey()
    keyring = Keyring(master, MemoryKeyItems(), cache_seconds=300, clock=clock)
    for _ in range(300):
        keyring.data_key("acme", "c1", "g1", create=True)
    assert master.calls / 300 <= 0.01
    assert master.calls == 1  # the tenant key's creation; the data key is cached with it

    reader = Keyring(master, keyring.items, cache_seconds=300, clock=clock)
    reader.data_key("acme", "c1", "g1", create=False)
    assert master.calls == 2  # a new environment unwraps the tenant key once
    clock.now += 301
    reads = _counting(reader)
    reader.data_key("acme", "c1", "g1", create=False)
    # The data key's cache is bounded in time (its item is read again); the tenant key's
    # lasts longer (DEFAULT_TENANT_CACHE_SECONDS): no KMS call for it yet.
    assert (master.calls, reads) == (2, [data_key_name("acme", "c1", "g1")])
    clock.now += 3600
    reader.data_key("acme", "c1", "g1", create=False)
    assert master.calls == 3  # bounded in time too
    reader.forget()
    reader.data_key("acme", "c1", "g1", create=False)
    assert master.calls == 4  # and dropped after a snapshot restore


def _counting(keyring: Keyring) -> list[str]:
    """The names ``keyring`` reads from its key store from now on."""
    reads: list[str] = []
    get = keyring.items.get

    def counted(name: str) -> bytes | None:
        reads.append(name)
        return get(name)

    keyring.items.get = counted  # type: ignore[method-assign]
    return reads


def test_a_key_made_after_another_environment_erased_the_tenant_opens_everywhere() -> None:
    """An environment that cached a tenant key checks the stored one before it wraps a new
    data key with it: after another environment's tenant erasure, the tenant's next
    conversation is wrapped by a new tenant key that every environment opens."""
    master, items = LocalMasterKey(), MemoryKeyItems()
    first, second = Keyring(master, items), Keyring(master, items)
    first.data_key("acme", "c1", "g1", create=True)  # caches the tenant key
    second.destroy_tenant("acme")

    made = first.data_key("acme", "c2", "g1", create=True)
    assert second.data_key("acme", "c2", "g1", create=False).material == made.material


def test_the_cache_keeps_at_most_its_bound() -> None:
    keyring = Keyring(LocalMasterKey(), MemoryKeyItems(), max_cached=3)
    for n in range(10):
        keyring.data_key("acme", f"c{n}", "g1", create=True)
    assert len(keyring._cache) == 3


def test_the_local_master_key_file_is_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "master.key"
    items = SQLiteKeyItems(tmp_path / "keys.sqlite3")
    first = Keyring(LocalMasterKey.from_file(path), items)
    sealed = first.data_key("acme", "c1", "g1", create=True).seal(b"hello", AAD)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # Another process (a restart of the local runner) opens it with the same file.
    again = Keyring(LocalMasterKey.from_file(path), SQLiteKeyItems(tmp_path / "keys.sqlite3"))
    assert again.data_key("acme", "c1", "g1", create=False).unseal(sealed, AAD, where="-") == (
        b"hello"
    )
    path.write_bytes(b"short")
    with pytest.raises(CorruptedState):
        LocalMasterKey.from_file(path)


def test_kms_wraps_tenant_keys_and_a_tenant_key_of_its_own_is_scheduled_for_deletion(
    aws: None,
) -> None:
    kms = boto3.client("kms", region_name=REGION)
    shared = kms.create_key(Description="shared")["KeyMetadata"]["KeyId"]
    own = kms.create_key(Description="tenant acme's")["KeyMetadata"]["KeyId"]
    items = _keys_table()
    master = KmsMasterKey(kms, shared, {"acme": own})
    keyring = Keyring(master, items)
    sealed = keyring.data_key("acme", "c1", "g1", create=True).seal(b"x", AAD)
    keyring.data_key("beta", "c1", "g1", create=True)

    reader = Keyring(KmsMasterKey(kms, shared, {"acme": own}), items)
    assert reader.data_key("acme", "c1", "g1", create=False).unseal(sealed, AAD, where="-") == b"x"

    assert keyring.destroy_tenant("acme") == own
    assert kms.describe_key(KeyId=own)["KeyMetadata"]["KeyState"] == "PendingDeletion"
    assert kms.describe_key(KeyId=shared)["KeyMetadata"]["KeyState"] == "Enabled"
    with pytest.raises(ContentUnreadable):
        Keyring(KmsMasterKey(kms, shared, {"acme": own}), items).data_key(
            "acme", "c1", "g1", create=False
        )
    assert Keyring(KmsMasterKey(kms, shared), items).data_key("beta", "c1", "g1", create=False)


@pytest.mark.parametrize("error", ["DisabledException", "NotFoundException"])
def test_a_master_key_gone_or_disabled_answers_unreadable_not_a_crash(error: str) -> None:
    # moto's Decrypt ignores a key's state, so KMS's answer is stubbed (botocore's Stubber
    # checks it against the service model).
    kms = boto3.client("kms", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    items = MemoryKeyItems()
    items.put_new("T#acme", b"wrapped by kms", "acme")
    with Stubber(kms) as stub:
        stub.add_client_error("decrypt", service_error_code=error, http_status_code=400)
        with pytest.raises(ContentUnreadable) as caught:
            Keyring(KmsMasterKey(kms, "alias/shared"), items).data_key(
                "acme", "c1", "g1", create=True
            )
    assert caught.value.details == {"tenant": "acme"}


def test_a_tenant_key_bound_to_another_tenant_does_not_open(aws: None) -> None:
    kms = boto3.client("kms", region_name=REGION)
    shared = kms.create_key(Description="shared")["KeyMetadata"]["KeyId"]
    master = KmsMasterKey(kms, shared)
    _, wrapped = master.new_tenant_key("acme")
    with pytest.raises(CorruptedState):
        master.unwrap("beta", wrapped)


def _files_of(path: Path) -> bytes:
    """Every byte of a SQLite file and of its journal, WAL and shared memory beside it."""
    found = [path.with_name(path.name + suffix) for suffix in ("", "-journal", "-wal", "-shm")]
    return b"".join(file.read_bytes() for file in found if file.is_file())


def test_a_destroyed_key_leaves_no_copy_in_the_key_files(tmp_path: Path) -> None:
    """``secure_delete`` and a rollback journal: once destroyed, no byte of the key file or
    of a journal beside it holds the wrapped key, while the others still open."""
    path = tmp_path / "keys.sqlite3"
    items = SQLiteKeyItems(path)
    keyring = Keyring(LocalMasterKey(), items)
    for n in range(50):
        keyring.data_key("acme", f"c{n}", "g1", create=True)
    doomed = [items.get(data_key_name("acme", f"c{n}", "g1")) for n in range(0, 50, 7)]
    assert all(doomed)
    for n in range(0, 50, 7):
        keyring.destroy_conversation("acme", f"c{n}", ["g1"])
    content = _files_of(path)
    assert not any(key is not None and key in content for key in doomed)
    assert keyring.data_key("acme", "c1", "g1", create=False)


def test_a_key_file_an_older_build_left_in_wal_mode_is_moved_out_of_it_and_vacuumed(
    tmp_path: Path,
) -> None:
    """Opened alone, a WAL-mode key file (what older builds wrote) leaves WAL, and the keys
    its earlier deletes left in free pages are overwritten."""
    path = tmp_path / "keys.sqlite3"
    with closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA secure_delete=OFF")  # SQLite's own default; some builds change it
        db.execute("CREATE TABLE keys (name TEXT PRIMARY KEY, owner TEXT NOT NULL, key BLOB)")
        with db:
            db.executemany(
                "INSERT INTO keys VALUES (?, 'acme', ?)",
                [(f"k{n}", bytes([n]) * 61) for n in range(1, 40)],
            )
        with db:
            db.execute("DELETE FROM keys WHERE name = 'k7'")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert bytes([7]) * 61 in _files_of(path)  # what an older build left behind

    items = SQLiteKeyItems(path)
    assert items.get("k8") == bytes([8]) * 61
    assert not path.with_name("keys.sqlite3-wal").exists()
    assert bytes([7]) * 61 not in _files_of(path)
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
