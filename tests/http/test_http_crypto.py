"""Content sealed at rest behind the real handlers (issue 24): the local runner seals with
moto's KMS, and a backup restored after ``DELETE`` is answered ``410 content_unreadable``."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
from turnledger.core.models import ConversationKey
from turnledger.store import codec, keys
from turnledger.store.sealed import SEALED_VALUE
from turnledger_local.runner import LocalConfig, LocalRunner

from tests.support.factories import delete_raw_item, put_raw_item, raw_item, raw_sort_keys

from .conftest import ANN, store_of

SECRET = "my account number is 4711-0815"


@pytest.fixture
def runner_config(runner_config: LocalConfig) -> LocalConfig:
    """No key cache: an environment that held a key before an erasure may open a restored
    copy only within KEY_CACHE_SECONDS of it (docs/API.md); here that window is closed."""
    return dataclasses.replace(runner_config, env={"KEY_CACHE_SECONDS": "0"})


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
    assert backup and all(SECRET not in repr(item) for item in backup)
    bodies = [
        item[codec.A_BODY]
        for item in backup
        if item is not None and str(item[codec.A_SK]).startswith(keys.EVENT_PREFIX)
    ]
    assert bodies and all(body.startswith(SEALED_VALUE) for body in bodies)

    deleted = http.delete(f"/v1/conversations/{conversation}", headers=ANN)
    assert deleted.status_code in (200, 204), deleted.text
    # A restore is a new table holding exactly the copy (none of the clear's gravestones).
    for sort_key in raw_sort_keys(store, key):
        delete_raw_item(store, key, sort_key)
    for item in backup:
        assert item is not None
        put_raw_item(store, item)

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
