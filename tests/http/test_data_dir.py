"""``turnledger local --data-dir``: conversations kept in a folder survive the runner's restarts."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import httpx
from turnledger.core.config import Settings
from turnledger.core.models import ConversationKey
from turnledger.runtime import Runtime
from turnledger.store import keys
from turnledger.store.keyring import data_key_name
from turnledger.store.local_folder import LOCAL_KEYS_FILE, LOCAL_MASTER_KEY_FILE
from turnledger.store.sqlite import DATABASE_FILE, SQLiteConversationStore
from turnledger_local.runner import LocalConfig, LocalRunner

from tests.support.cli import read_until

ANN = {"Authorization": "Bearer local:acme:ann"}


@contextmanager
def served(data_dir: Path, expect: str | None = None) -> Iterator[str]:
    """``turnledger local --data-dir`` in its own process; stopped with Ctrl-C at the end.
    ``expect``: a line its banner must hold."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "turnledger_local.cli",
            "local",
            "--port",
            "0",
            "--data-dir",
            str(data_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        banner = read_until(process, "Ctrl-C stops.")
        url = re.search(r"serving (http://127\.0\.0\.1:\d+)", banner)
        assert url is not None, banner
        assert str(data_dir.resolve()) in banner
        assert expect is None or expect in banner, banner
        yield url.group(1)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def post_turn(url: str, conversation_id: str, text: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/conversations/{conversation_id}/turns",
        json={"input": text},
        headers=ANN,
        trust_env=False,
        timeout=30,
    )


def test_a_conversation_continues_after_a_restart(tmp_path: Path) -> None:
    """Turn 1 in one run, turn 2 in the next on the same folder: turn 2 knows what turn 1
    said; a clear in a third run is still in effect in a fourth."""
    data_dir = tmp_path / "data"

    with served(data_dir) as url:
        first = post_turn(url, "user-123", "My name is Ann.")
        assert first.status_code == 200, first.text
        assert first.json()["turn"] == 1
    assert (data_dir / DATABASE_FILE).is_file()

    with served(data_dir) as url:
        second = post_turn(url, "user-123", "What is my name?")
        assert second.status_code == 200, second.text
        assert second.json()["turn"] == 2
        assert second.json()["output_text"] == "Your name is Ann."
        events = httpx.get(
            f"{url}/v1/conversations/user-123/events", headers=ANN, trust_env=False, timeout=30
        )
        assert [e["sequence"] for e in events.json()["events"]] == [1, 2, 3, 4]
        cleared = httpx.delete(
            f"{url}/v1/conversations/user-123", headers=ANN, trust_env=False, timeout=30
        )
        assert cleared.status_code == 204

    with served(data_dir) as url:
        gone = httpx.get(f"{url}/v1/conversations/user-123", headers=ANN, trust_env=False)
        assert gone.status_code == 404
        assert gone.json()["error"]["code"] == "conversation_not_found"


def test_the_runner_hands_the_sqlite_store_to_the_handlers(tmp_path: Path) -> None:
    """With ``data_dir`` the handlers' runtime builds the SQLite store on that folder; the
    idempotency layer works (its records in that store)."""
    config = LocalConfig(port=0, data_dir=tmp_path / "data")
    with LocalRunner(config) as runner, httpx.Client(base_url=runner.url, timeout=30) as http:
        answer = http.post(
            "/v1/conversations/c1/turns",
            json={"input": "My name is Ann."},
            headers={**ANN, "Idempotency-Key": "k1"},
        )
        again = http.post(
            "/v1/conversations/c1/turns",
            json={"input": "My name is Ann."},
            headers={**ANN, "Idempotency-Key": "k1"},
        )
        # Handlers run in worker processes: build what they build from their environment.
        store = Runtime.from_settings(Settings.from_env(runner.environment)).store
        assert isinstance(store, SQLiteConversationStore)
        assert store.path == (tmp_path / "data" / DATABASE_FILE).resolve()
        assert answer.status_code == again.status_code == 200
        assert again.json() == answer.json()
        head = http.get("/v1/conversations/c1", headers=ANN).json()
        assert head["turns"] == 1


# --- Idempotency-Key records live in the data folder -------------------------------------


def idempotency_records(data_dir: Path) -> list[tuple[str, str]]:
    """``(pk, sk)`` of every idempotency record in the folder's database."""
    with closing(sqlite3.connect(data_dir / DATABASE_FILE)) as db:
        rows = db.execute(
            "SELECT pk, sk FROM items WHERE sk LIKE ? ORDER BY pk, sk", (f"{keys.RECORD_PREFIX}%",)
        ).fetchall()
    return [(str(pk), str(sk)) for pk, sk in rows]


def keyed_turn(url: str, conversation_id: str, text: str, key: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/conversations/{conversation_id}/turns",
        json={"input": text},
        headers={**ANN, "Idempotency-Key": key},
        trust_env=False,
        timeout=30,
    )


def test_an_idempotency_key_is_kept_across_a_restart(tmp_path: Path) -> None:
    """A keyed turn in one run; in the next run the same request answers the recorded reply
    (no second turn) and the same key with another body is 422."""
    data_dir = tmp_path / "data"
    with served(data_dir) as url:
        first = keyed_turn(url, "c1", "My name is Ann.", "k1")
        assert first.status_code == 200, first.text
    conversation = keys.partition_key(ConversationKey(tenant="acme", conversation_id="c1"))
    assert [pk for pk, _ in idempotency_records(data_dir)] == [conversation]

    with served(data_dir) as url:
        replay = keyed_turn(url, "c1", "My name is Ann.", "k1")
        assert replay.status_code == 200, replay.text
        assert replay.json() == first.json()
        head = httpx.get(f"{url}/v1/conversations/c1", headers=ANN, trust_env=False, timeout=30)
        assert head.json()["turns"] == 1
        reused = keyed_turn(url, "c1", "Another body.", "k1")
        assert reused.status_code == 422
        assert reused.json()["error"]["code"] == "idempotency_key_reused"


def test_clear_and_erasure_remove_the_idempotency_records(tmp_path: Path) -> None:
    """After DELETE (or tenant erasure) the same keyed request runs anew instead of
    answering the old reply, and no record of the old life is left in the folder."""
    data_dir = tmp_path / "data"
    config = LocalConfig(port=0, data_dir=data_dir)
    with LocalRunner(config) as runner:
        url = runner.url
        assert keyed_turn(url, "c1", "My name is Ann.", "k1").status_code == 200
        assert keyed_turn(url, "c2", "My name is Bob.", "k2").status_code == 200
        assert len(idempotency_records(data_dir)) == 2

        cleared = httpx.delete(f"{url}/v1/conversations/c1", headers=ANN, trust_env=False)
        assert cleared.status_code == 204
        c2 = keys.partition_key(ConversationKey(tenant="acme", conversation_id="c2"))
        assert [pk for pk, _ in idempotency_records(data_dir)] == [c2]
        again = keyed_turn(url, "c1", "My name is Ann.", "k1")
        assert again.status_code == 200, again.text
        head = httpx.get(f"{url}/v1/conversations/c1", headers=ANN, trust_env=False, timeout=30)
        assert head.status_code == 200  # ran anew: the conversation exists again

        erased = httpx.delete(f"{url}/v1/conversations", headers=ANN, trust_env=False, timeout=60)
        assert erased.status_code == 200, erased.text
        assert erased.json()["complete"] is True
        assert idempotency_records(data_dir) == []
        rerun = keyed_turn(url, "c2", "My name is Bob.", "k2")
        assert rerun.status_code == 200
        assert rerun.json()["turn"] == 1
        assert len(idempotency_records(data_dir)) == 1


# --- erasure by key destruction: nothing in the folder undoes it (issue 39) ---------------


def wrapped_keys(data_dir: Path, conversation_id: str) -> list[bytes]:
    """The wrapped data keys of ``conversation_id`` (acme) in the folder's key file."""
    with closing(sqlite3.connect(data_dir / LOCAL_KEYS_FILE)) as db:
        rows = db.execute(
            "SELECT key FROM keys WHERE name LIKE ?",
            (data_key_name("acme", conversation_id, "%"),),
        ).fetchall()
    return [bytes(row[0]) for row in rows]


def test_a_delete_leaves_no_wrapped_key_of_the_conversation_in_any_file(tmp_path: Path) -> None:
    """After DELETE, no byte of any file in the live data folder (the key file, its WAL,
    shared memory or journal, the database) holds a wrapped key of the conversation, and
    the master key is not in the folder: a copy of the folder taken after the delete
    cannot open the deleted conversation."""
    data_dir = tmp_path / "data"
    with LocalRunner(LocalConfig(port=0, data_dir=data_dir)) as runner:
        # Neighbours before and after it: its key shares pages with keys that stay.
        for conversation in ("c1", "doomed", "c3"):
            answer = post_turn(runner.url, conversation, f"My name is {conversation}.")
            assert answer.status_code == 200, answer.text
        # A second life too: both lives' keys must go.
        doomed = wrapped_keys(data_dir, "doomed")
        cleared = httpx.delete(f"{runner.url}/v1/conversations/doomed", headers=ANN)
        assert cleared.status_code == 204
        assert post_turn(runner.url, "doomed", "My name is Eve.").status_code == 200
        doomed += wrapped_keys(data_dir, "doomed")
        assert len(set(doomed)) == 2 and all(len(key) > 32 for key in doomed)

        deleted = httpx.delete(f"{runner.url}/v1/conversations/doomed", headers=ANN)
        assert deleted.status_code == 204, deleted.text

        files = [path for path in data_dir.rglob("*") if path.is_file()]
        assert data_dir / LOCAL_KEYS_FILE in files
        for path in files:
            content = path.read_bytes()
            assert not any(key in content for key in doomed), path.name
        assert wrapped_keys(data_dir, "doomed") == []
        # The others still read back: only the deleted conversation's keys went.
        kept = httpx.get(f"{runner.url}/v1/conversations/c1/events", headers=ANN)
        assert kept.status_code == 200 and "My name is c1." in kept.text
    assert not [path for path in data_dir.rglob("*") if path.name == LOCAL_MASTER_KEY_FILE]
    state = Path(os.environ["XDG_STATE_HOME"]) / "turnledger" / LOCAL_MASTER_KEY_FILE
    assert state.is_file() and state.stat().st_mode & 0o777 == 0o600


def test_a_master_key_an_older_version_left_in_the_folder_still_opens_it_with_a_warning(
    tmp_path: Path,
) -> None:
    """A folder whose ``master.key`` lies inside it (as older versions kept it) keeps its
    conversations readable; the runner says at start that the key is in the folder."""
    data_dir = tmp_path / "data"
    inside = data_dir / LOCAL_MASTER_KEY_FILE
    with LocalRunner(LocalConfig(port=0, data_dir=data_dir, master_key_file=inside)) as runner:
        assert post_turn(runner.url, "user-1", "My name is Ann.").status_code == 200
    assert inside.is_file()

    with served(data_dir, expect="warning: the master key is inside the data folder") as url:
        again = post_turn(url, "user-1", "What is my name?")
        assert again.status_code == 200, again.text
        assert again.json()["output_text"] == "Your name is Ann."
