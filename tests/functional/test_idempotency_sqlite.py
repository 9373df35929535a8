"""Powertools idempotency records in the SQLite store: the put condition of the DynamoDB layer."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyItemAlreadyExistsError,
    IdempotencyItemNotFoundError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import DataRecord
from turnledger.api.idempotency_sqlite import SQLiteRecordPersistence
from turnledger.models import ConversationKey
from turnledger.store import keys
from turnledger.store.sqlite import SQLiteConversationStore

PK = keys.partition_key(ConversationKey(tenant="acme", conversation_id="c1"))
KEY = f"{keys.RECORD_PREFIX}abc"


@pytest.fixture
def layer(tmp_path: Path) -> SQLiteRecordPersistence:
    return SQLiteRecordPersistence(SQLiteConversationStore.in_folder(tmp_path), PK)


def in_progress(*, expires_in: float, lambda_left_ms: int) -> DataRecord:
    now = time.time()
    return DataRecord(
        idempotency_key=KEY,
        status="INPROGRESS",
        expiry_timestamp=int(now + expires_in),
        in_progress_expiry_timestamp=int(now * 1000) + lambda_left_ms,
    )


def test_a_record_is_written_read_updated_and_deleted(layer: SQLiteRecordPersistence) -> None:
    with pytest.raises(IdempotencyItemNotFoundError):
        layer._get_record(KEY)
    layer._put_record(in_progress(expires_in=3600, lambda_left_ms=30_000))
    assert layer._get_record(KEY).status == "INPROGRESS"
    done = DataRecord(
        idempotency_key=KEY,
        status="COMPLETED",
        expiry_timestamp=int(time.time() + 3600),
        response_data='{"turn": 1}',
    )
    layer._update_record(done)
    found = layer._get_record(KEY)
    assert (found.status, found.response_data) == ("COMPLETED", '{"turn": 1}')
    stored = layer.store.get_record(PK, KEY)
    assert stored is not None and stored["pk"] == PK and stored["sk"] == KEY
    layer._delete_record(done)
    with pytest.raises(IdempotencyItemNotFoundError):
        layer._get_record(KEY)


def test_a_live_record_refuses_a_second_put_and_returns_itself(
    layer: SQLiteRecordPersistence,
) -> None:
    layer._put_record(in_progress(expires_in=3600, lambda_left_ms=30_000))
    with pytest.raises(IdempotencyItemAlreadyExistsError) as caught:
        layer._put_record(in_progress(expires_in=3600, lambda_left_ms=30_000))
    assert caught.value.old_data_record is not None
    assert caught.value.old_data_record.status == "INPROGRESS"


def test_an_in_progress_record_whose_lambda_timed_out_is_taken_over(
    layer: SQLiteRecordPersistence,
) -> None:
    layer._put_record(in_progress(expires_in=3600, lambda_left_ms=-1_000))
    layer._put_record(in_progress(expires_in=3600, lambda_left_ms=30_000))  # no error
    assert layer._get_record(KEY).in_progress_expiry_timestamp is not None


def test_an_expired_record_is_replaced(layer: SQLiteRecordPersistence) -> None:
    layer._put_record(
        DataRecord(idempotency_key=KEY, status="COMPLETED", expiry_timestamp=int(time.time()) - 5)
    )
    layer._put_record(in_progress(expires_in=3600, lambda_left_ms=30_000))
    assert layer._get_record(KEY).status == "INPROGRESS"
