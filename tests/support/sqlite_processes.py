"""Work for separate processes on one SQLite store: what several local workers would do.

The functions run in processes started with ``spawn`` (a fresh interpreter, as
separate runner workers are), so they take only picklable arguments and open
the store themselves.
"""

from __future__ import annotations

from multiprocessing.synchronize import Barrier

from turnledger.core.exceptions import ConversationBusy
from turnledger.core.models import Head
from turnledger.store.sqlite import SQLiteConversationStore

from tests.support.factories import build_turn, make_key


def open_store(folder: str) -> SQLiteConversationStore:
    """The store of ``turnledger local --data-dir folder``."""
    return SQLiteConversationStore.in_folder(folder)


def commit_once(folder: str, head_json: str, name: str, start: Barrier) -> str:
    """Commit one turn on the head given, all processes at once; ``"won"`` or ``"busy"``."""
    store = open_store(folder)
    key = make_key()
    turn = build_turn(key, Head.model_validate_json(head_json), [f"from {name}", "x" * 70_000])
    start.wait()
    try:
        store.commit(
            key, expected_version=turn.expected_version, head=turn.head, events=turn.events
        )
    except ConversationBusy:
        return "busy"
    finally:
        store.close()
    return "won"


def commit_in_a_loop(folder: str, turns: int) -> int:
    """Commit ``turns`` turns, each on the head just read; returns how many landed."""
    store = open_store(folder)
    key = make_key()
    landed = 0
    try:
        for n in range(turns):
            turn = build_turn(key, store.get_head(key), [f"q{n}", f"a{n}"])
            try:
                store.commit(
                    key, expected_version=turn.expected_version, head=turn.head, events=turn.events
                )
            except ConversationBusy:
                continue
            landed += 1
    finally:
        store.close()
    return landed
