"""``turnledger seal-existing`` (issue 24's migration) through the command line's parser,
on a data folder written before content sealing was on."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from turnledger.core.config import Settings
from turnledger.runtime import store_from_settings
from turnledger.store.sqlite import DATABASE_FILE, SQLiteConversationStore
from turnledger_local.cli import main

from tests.contract.test_store_contract import EVERYTHING
from tests.support.factories import commit_turn, make_key, stored_uncompressed

SECRET = "the migration's secret: Ada's blood type is AB"


def _clear_rows(data: Path) -> int:
    """How many rows of the folder's database hold :data:`SECRET` in clear."""
    with sqlite3.connect(data / DATABASE_FILE) as db:
        rows = db.execute("SELECT item FROM items").fetchall()
    return sum(SECRET in item for (item,) in rows)


def test_seal_existing_seals_a_data_folder_written_in_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command seals every clear item of the tenant and prints its JSON report; a second
    run seals nothing; the conversations read back as before."""
    data = tmp_path / "data"
    before = SQLiteConversationStore.in_folder(data)  # no keys: the build of before
    with stored_uncompressed():
        for name in ("seal-cli-1", "seal-cli-2"):
            commit_turn(before, make_key("acme", name), None, [SECRET, "noted"])
    before.close()
    assert _clear_rows(data) == 2  # each conversation's turn item

    assert main(["seal-existing", "--data-dir", str(data), "--tenant", "acme"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first == {"sealed": 2, "already_sealed": 2, "skipped": 0}
    assert _clear_rows(data) == 0

    args = ["seal-existing", "--data-dir", str(data), "--tenant", "acme", "seal-cli-1"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out) == {"sealed": 0, "already_sealed": 2, "skipped": 0}
    store = store_from_settings(Settings(store="sqlite", data_dir=str(data)))
    events = store.load(make_key("acme", "seal-cli-2"), EVERYTHING).events
    assert [e.payload["content"] for e in events] == [SECRET, "noted"]
