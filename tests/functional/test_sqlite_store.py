"""What only the SQLite backend has: a file that outlives the process, several processes on it,
and objects as files. The store contract itself runs on it in ``tests/contract``.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
from concurrent.futures import ProcessPoolExecutor
from contextlib import closing
from pathlib import Path

import pytest
from turnledger.core.exceptions import CorruptedState, InternalError
from turnledger.core.models import ConversationStatus
from turnledger.store import keys
from turnledger.store.base import ContextBudget
from turnledger.store.blobs import FileBlobStore
from turnledger.store.sqlite import SCHEMA_VERSION, SQLiteConversationStore

from tests.support.factories import START, commit_turn, data_sort_keys, make_key
from tests.support.sqlite_processes import commit_in_a_loop, commit_once, open_store

EVERYTHING = ContextBudget(max_events=10_000, max_chars=100_000_000)
KEY = make_key()
BIG = "x" * 70_000


def test_a_conversation_outlives_its_store(tmp_path: Path) -> None:
    """Closed and opened again on the same folder, the store reads back every event and
    offloaded payload, and the conversation goes on."""
    store = open_store(str(tmp_path))
    first = commit_turn(store, KEY, None, ["My name is Ann.", BIG])
    store.close()

    again = open_store(str(tmp_path))
    snapshot = again.load(KEY, EVERYTHING)
    assert snapshot.head == first.head
    assert snapshot.events == first.events
    second = commit_turn(again, KEY, first.head, ["And now?"])
    assert again.load(KEY, EVERYTHING).events == [*first.events, *second.events]
    again.close()


def test_a_file_of_a_newer_layout_is_refused(tmp_path: Path) -> None:
    """A database written by a newer build is not read (nor rewritten) by this one."""
    open_store(str(tmp_path)).close()
    with closing(sqlite3.connect(tmp_path / "turnledger.sqlite3")) as db:
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
        db.commit()

    with pytest.raises(InternalError, match="layout"):
        open_store(str(tmp_path))


def test_the_journal_is_write_ahead(tmp_path: Path) -> None:
    """WAL: readers never wait for a writer, in any process."""
    open_store(str(tmp_path)).close()
    with closing(sqlite3.connect(tmp_path / "turnledger.sqlite3")) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def _spawn_pool(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


def test_racing_commits_from_several_processes_exactly_one_wins(tmp_path: Path) -> None:
    """Processes committing on the same version at once: one lands whole, the others are busy
    and leave nothing, objects included."""
    store = open_store(str(tmp_path))
    first = commit_turn(store, KEY, None, ["q1"])
    contenders = 4
    with multiprocessing.get_context("spawn").Manager() as manager:
        start = manager.Barrier(contenders)
        with _spawn_pool(contenders) as pool:
            outcomes = list(
                pool.map(
                    commit_once,
                    [str(tmp_path)] * contenders,
                    [first.head.model_dump_json()] * contenders,
                    [f"p{n}" for n in range(contenders)],
                    [start] * contenders,
                )
            )

    assert sorted(outcomes) == ["busy"] * (contenders - 1) + ["won"]
    snapshot = store.load(KEY, EVERYTHING)
    assert snapshot.head is not None and snapshot.head.version == 2
    assert [e.sequence for e in snapshot.events] == [1, 2, 3]
    assert len(list(store.blobs.list_keys(keys.blob_prefix(KEY)))) == 1
    store.close()


def test_clear_wins_against_turns_from_other_processes(tmp_path: Path) -> None:
    """Two processes commit turns in a loop while this one clears, again and again: every clear
    succeeds, and the conversation is always whole or absent afterwards."""
    store = open_store(str(tmp_path))
    with _spawn_pool(2) as pool:
        writers = [pool.submit(commit_in_a_loop, str(tmp_path), 60) for _ in range(2)]
        clears = 0
        while not all(w.done() for w in writers) or clears < 3:
            store.clear(KEY, START)
            clears += 1
        landed = sum(w.result() for w in writers)

    assert landed > 0
    head = store.get_head(KEY)
    if head is None:
        assert data_sort_keys(store, KEY) == []
    else:
        assert head.status is not ConversationStatus.CLEARED
        events = store.read_events(KEY, head, after=0, limit=10_000)
        assert [e.sequence for e in events] == list(range(1, head.event_count + 1))
    store.clear(KEY, START)
    assert data_sort_keys(store, KEY) == []
    store.close()


# --- objects as files ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "tenant",
    [".", "..", "a/c/b", "%2E", "t" * 300, "ünïcode", "x%", "~"],
    ids=["dot", "dotdot", "slashes", "encoded-dot", "long", "unicode", "percent", "tilde"],
)
def test_object_keys_map_one_to_one_onto_files(tmp_path: Path, tenant: str) -> None:
    """Any tenant and id make a key that is stored inside the folder, under its own name,
    and listed by its own prefix only (no '.' or '..' path, no name over the filesystem's
    limit)."""
    blobs = FileBlobStore(tmp_path / "blobs")
    key = make_key(tenant, "c1")
    neighbour = make_key(tenant + "x", "c1")
    object_key = keys.blob_key(key, "g1", 1, "0" * 64, attempt="a1")
    other_key = keys.blob_key(neighbour, "g1", 1, "0" * 64, attempt="a1")

    blobs.put(object_key, b"mine")
    blobs.put(other_key, b"theirs")

    assert blobs.get(object_key) == b"mine"
    assert list(blobs.list_keys(keys.blob_prefix(key))) == [object_key]
    assert list(blobs.list_keys(keys.blob_prefix(key, "g1"))) == [object_key]
    for path in (tmp_path / "blobs").rglob("*"):
        assert path.resolve().is_relative_to((tmp_path / "blobs").resolve())
        assert len(path.name.encode()) <= 255
    assert blobs.delete_keys([object_key]) == 1
    assert list(blobs.list_keys(keys.blob_prefix(key))) == []
    assert blobs.get(other_key) == b"theirs"


def test_deleting_objects_leaves_no_empty_folders(tmp_path: Path) -> None:
    blobs = FileBlobStore(tmp_path / "blobs")
    names = [keys.blob_key(KEY, "g1", n, "0" * 64, attempt="a") for n in range(3)]
    for name in names:
        blobs.put(name, b"x")

    blobs.delete_keys(blobs.list_keys(keys.blob_prefix(KEY)))

    assert list((tmp_path / "blobs").iterdir()) == []
    with pytest.raises(CorruptedState):
        blobs.get(names[0])


def test_a_write_in_progress_is_never_listed(tmp_path: Path) -> None:
    """Objects are written to a temporary file and renamed: a half-written one is not an
    object."""
    blobs = FileBlobStore(tmp_path / "blobs")
    name = keys.blob_key(KEY, "g1", 1, "0" * 64, attempt="a")
    blobs.put(name, b"whole")
    folder = next(p for p in (tmp_path / "blobs").rglob("*") if p.is_file()).parent
    (folder / ".tmp-0123").write_bytes(b"half")

    assert list(blobs.list_keys(keys.blob_prefix(KEY))) == [name]


def test_store_and_blobs_of_one_folder(tmp_path: Path) -> None:
    """The layout ``--data-dir`` uses: the database file and the objects' folder side by side."""
    store = open_store(str(tmp_path))
    commit_turn(store, KEY, None, ["q", BIG])
    store.close()
    assert isinstance(store, SQLiteConversationStore)
    assert (tmp_path / "turnledger.sqlite3").is_file()
    assert any(p.is_file() for p in (tmp_path / "blobs").rglob("*"))


def test_a_layout_1_file_is_upgraded_in_place(tmp_path: Path) -> None:
    """A data folder written before the approval inbox (layout 1: no by-wait and by-inbox
    columns) is upgraded when opened: its conversations read back, and new commits are
    listed on both indexes."""
    path = tmp_path / "turnledger.sqlite3"
    with closing(sqlite3.connect(path)) as db:
        db.executescript(
            """
            CREATE TABLE items (pk TEXT NOT NULL, sk TEXT NOT NULL, item TEXT NOT NULL,
                xb TEXT, tn TEXT, PRIMARY KEY (pk, sk)) WITHOUT ROWID;
            PRAGMA user_version=1;
            """
        )
    old = SQLiteConversationStore(path, FileBlobStore(tmp_path / "blobs"))
    old.close()
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
        columns = {row[1] for row in db.execute("PRAGMA table_info(items)")}
    assert {"wb", "inbox_pk", "inbox_sk"} <= columns
    store = open_store(str(tmp_path))
    first = commit_turn(store, KEY, None, ["hello"])
    assert store.load(KEY, EVERYTHING).head == first.head
    assert list(store.of_tenant(KEY.tenant)) == [KEY]
    store.close()
