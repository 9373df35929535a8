"""Content sealed at rest behind the real handlers (issue 24): the local runner seals with
moto's KMS, and a backup restored after ``DELETE`` is answered ``410 content_unreadable``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import httpx
import pytest
from turnledger.core.models import ConversationKey
from turnledger.store import codec, keys
from turnledger.store.base import ConversationStore
from turnledger.store.codec import Item
from turnledger.store.sealed import SEALED_VALUE
from turnledger.tools import arguments_sha256
from turnledger_local.runner import LocalConfig, LocalRunner

from tests.support.factories import (
    delete_raw_item,
    holds_text,
    put_raw_item,
    raw_item,
    raw_sort_keys,
)

from .conftest import ANN, store_of

SECRET = "my account number is 4711-0815"
TOOLS = Path(__file__).resolve().parents[2] / "events" / "local-tools.json"


@pytest.fixture
def runner_config(runner_config: LocalConfig) -> LocalConfig:
    """No key cache: an environment that held a key before an erasure may open a restored
    copy only within KEY_CACHE_SECONDS of it (docs/API.md); here that window is closed."""
    return dataclasses.replace(runner_config, env={"KEY_CACHE_SECONDS": "0"}, tools_file=TOOLS)


def _delete_then_restore(
    http: httpx.Client, store: ConversationStore, key: ConversationKey, backup: list[Item | None]
) -> None:
    """``DELETE`` the conversation, then put back the raw ``backup`` taken before, as a
    restore does: a new table holding exactly the copy (none of the clear's gravestones)."""
    deleted = http.delete(f"/v1/conversations/{key.conversation_id}", headers=ANN)
    assert deleted.status_code in (200, 204), deleted.text
    for sort_key in raw_sort_keys(store, key):
        delete_raw_item(store, key, sort_key)
    for item in backup:
        assert item is not None
        put_raw_item(store, item)


def test_a_backup_restored_after_delete_answers_410_content_unreadable(
    served: LocalRunner, http: httpx.Client
) -> None:
    """Content is ciphertext in the table; after DELETE, items restored from a copy taken
    before it are answered 410 content_unreadable (events, a new turn), never content,
    never a 500."""
    conversation = "crypto-erase-1"
    first = http.post(
        f"/v1/conversations/{conversation}/turns", json={"input": SECRET}, headers=ANN
    )
    assert first.status_code == 200, first.text
    store = store_of(served)
    key = ConversationKey(tenant="acme", conversation_id=conversation)
    backup = [raw_item(store, key, sk) for sk in raw_sort_keys(store, key)]
    assert backup and not any(holds_text(item, SECRET) for item in backup)
    bodies = [
        item[codec.A_BODY]
        for item in backup
        if item is not None and str(item[codec.A_SK]).startswith(keys.EVENT_PREFIX)
    ]
    assert bodies and all(body.startswith(SEALED_VALUE) for body in bodies)

    _delete_then_restore(http, store, key, backup)

    events = http.get(f"/v1/conversations/{conversation}/events", headers=ANN)
    assert events.status_code == 410, events.text
    assert events.json()["error"]["code"] == "content_unreadable"
    assert SECRET not in events.text
    again = http.post(
        f"/v1/conversations/{conversation}/turns", json={"input": "hello?"}, headers=ANN
    )
    assert again.status_code == 410, again.text
    assert again.json()["error"]["code"] == "content_unreadable"
    # DELETE still works on what was restored; the id starts afresh after it.
    assert http.delete(f"/v1/conversations/{conversation}", headers=ANN).status_code in (
        200,
        204,
    )
    fresh = http.post(f"/v1/conversations/{conversation}/turns", json={"input": "hi"}, headers=ANN)
    assert fresh.status_code == 200, fresh.text


def test_pending_call_arguments_are_sealed_and_a_restored_head_answers_410(
    served: LocalRunner, http: httpx.Client
) -> None:
    """A call waiting for approval keeps its arguments sealed in HEAD and the turn item
    (no argument text, no hash of them at rest); after DELETE, HEAD and the turn item
    restored from a copy answer 410 content_unreadable on every route that shows pending
    calls (the conversation, the approval inbox, the decision), never the arguments."""
    conversation = "crypto-erase-2"
    arguments = {"to": "ann@example.com", "subject": SECRET}
    asked = http.post(
        f"/v1/conversations/{conversation}/turns",
        json={"input": f"/tool send_email {json.dumps(arguments)}"},
        headers=ANN,
    )
    assert asked.status_code == 200, asked.text
    assert asked.json()["status"] == "awaiting_approval"
    [call] = asked.json()["pending_tool_calls"]
    assert call["arguments"] == arguments
    store = store_of(served)
    key = ConversationKey(tenant="acme", conversation_id=conversation)
    backup = [raw_item(store, key, sk) for sk in raw_sort_keys(store, key)]
    for item in backup:
        assert not holds_text(item, SECRET) and not holds_text(item, arguments_sha256(arguments))
    states = [i for i in backup if i is not None and codec.A_CONTENT in i]
    assert {str(i[codec.A_SK]) for i in states} >= {keys.HEAD_SK}
    shown = http.get(f"/v1/conversations/{conversation}", headers=ANN)
    assert shown.status_code == 200 and SECRET in shown.text  # it reads back

    _delete_then_restore(http, store, key, backup)

    head = http.get(f"/v1/conversations/{conversation}", headers=ANN)
    assert head.status_code == 410, head.text
    assert head.json()["error"]["code"] == "content_unreadable"
    listed = http.get("/v1/approvals", headers=ANN)
    assert listed.status_code == 200, listed.text
    assert SECRET not in listed.text
    assert [i["conversation_id"] for i in listed.json()["items"]] == []
    decided = http.post(
        f"/v1/conversations/{conversation}/approvals",
        json={"approve": [call["id"]]},
        headers=ANN,
    )
    assert decided.status_code == 410, decided.text
    assert decided.json()["error"]["code"] == "content_unreadable"
    assert SECRET not in decided.text
    assert http.delete(f"/v1/conversations/{conversation}", headers=ANN).status_code in (
        200,
        204,
    )
    assert http.get(f"/v1/conversations/{conversation}", headers=ANN).status_code == 404
