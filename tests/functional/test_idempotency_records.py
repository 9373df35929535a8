"""Powertools' persistence layer over the store's records (every backend), and its layout.

:class:`StoreRecordPersistence` is the one layer the API uses whatever the store:
these tests drive it as Powertools does (``_get_record``, ``_put_record``,
``_update_record``, ``_delete_record``) over the ``store`` fixture's backends, and
check on DynamoDB that its items are those of Powertools' own
``DynamoDBPersistenceLayer``: a record written by either is read by the other.
"""

from __future__ import annotations

import time

import pytest
from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyItemAlreadyExistsError,
    IdempotencyItemNotFoundError,
    IdempotencyValidationError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import DataRecord
from turnledger.api.idempotency_records import StoreRecordPersistence
from turnledger.core.models import ConversationKey
from turnledger.store import codec, keys
from turnledger.store.base import ConversationStore
from turnledger.store.dynamodb import DynamoDBConversationStore

CONVERSATION = ConversationKey(tenant="acme", conversation_id="c1")
PK = keys.partition_key(CONVERSATION)
KEY = f"{keys.RECORD_PREFIX}abc"


@pytest.fixture
def layer(store: ConversationStore) -> StoreRecordPersistence:
    return StoreRecordPersistence(store, CONVERSATION)


def in_progress(*, expires_in: float, lambda_left_ms: int, body_hash: str = "") -> DataRecord:
    now = time.time()
    return DataRecord(
        idempotency_key=KEY,
        status="INPROGRESS",
        expiry_timestamp=int(now + expires_in),
        in_progress_expiry_timestamp=int(now * 1000) + lambda_left_ms,
        payload_hash=body_hash,
    )


def test_a_record_is_written_read_updated_and_deleted(layer: StoreRecordPersistence) -> None:
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
    assert found.in_progress_expiry_timestamp is not None  # an update keeps it, as on DynamoDB
    layer._delete_record(done)
    with pytest.raises(IdempotencyItemNotFoundError):
        layer._get_record(KEY)


def test_a_live_record_refuses_a_second_put_and_returns_itself(
    layer: StoreRecordPersistence,
) -> None:
    layer._put_record(in_progress(expires_in=3600, lambda_left_ms=30_000))
    with pytest.raises(IdempotencyItemAlreadyExistsError) as caught:
        layer._put_record(in_progress(expires_in=3600, lambda_left_ms=30_000))
    assert caught.value.old_data_record is not None
    assert caught.value.old_data_record.status == "INPROGRESS"


def test_another_body_under_a_live_key_is_a_validation_error(store: ConversationStore) -> None:
    layer = StoreRecordPersistence(store, CONVERSATION)
    layer.payload_validation_enabled = True
    layer._put_record(in_progress(expires_in=3600, lambda_left_ms=30_000, body_hash="one"))
    assert layer._get_record(KEY).payload_hash == "one"
    with pytest.raises(IdempotencyValidationError):
        layer._put_record(in_progress(expires_in=3600, lambda_left_ms=30_000, body_hash="two"))


def test_an_in_progress_record_whose_lambda_timed_out_is_taken_over(
    layer: StoreRecordPersistence,
) -> None:
    layer._put_record(in_progress(expires_in=3600, lambda_left_ms=-1_000))
    layer._put_record(in_progress(expires_in=3600, lambda_left_ms=30_000))  # no error
    assert layer._get_record(KEY).in_progress_expiry_timestamp is not None


def test_an_expired_record_is_replaced(layer: StoreRecordPersistence) -> None:
    layer._put_record(
        DataRecord(idempotency_key=KEY, status="COMPLETED", expiry_timestamp=int(time.time()) - 5)
    )
    layer._put_record(in_progress(expires_in=3600, lambda_left_ms=30_000))
    assert layer._get_record(KEY).status == "INPROGRESS"


def powertools_layer(store: DynamoDBConversationStore) -> DynamoDBPersistenceLayer:
    """Powertools' own layer on the same table, configured as the API configured it."""
    return DynamoDBPersistenceLayer(
        table_name=store.table_name,
        boto3_client=store.client,
        key_attr=codec.A_PK,
        sort_key_attr=codec.A_SK,
        static_pk_value=PK,
        expiry_attr=codec.A_EXPIRES,
    )


def test_the_layout_is_powertools_own_on_dynamodb(moto_store: DynamoDBConversationStore) -> None:
    """Records written before this layer (by Powertools' DynamoDB layer) read the same, and
    Powertools' layer reads ours: a deployment's stored records survive the change."""
    ours = StoreRecordPersistence(moto_store, CONVERSATION)
    theirs = powertools_layer(moto_store)
    for layer in (ours, theirs):
        layer.payload_validation_enabled = True
    started = in_progress(expires_in=3600, lambda_left_ms=30_000, body_hash="h")
    theirs._put_record(started)
    written_by_them = moto_store.client.get_item(
        TableName=moto_store.table_name, Key={"pk": {"S": PK}, "sk": {"S": KEY}}
    )["Item"]
    theirs._delete_record(started)
    ours._put_record(started)
    written_by_us = moto_store.client.get_item(
        TableName=moto_store.table_name, Key={"pk": {"S": PK}, "sk": {"S": KEY}}
    )["Item"]
    assert written_by_us == written_by_them
    with pytest.raises(IdempotencyItemAlreadyExistsError):
        theirs._put_record(started)
    done = DataRecord(
        idempotency_key=KEY,
        status="COMPLETED",
        expiry_timestamp=int(time.time() + 3600),
        response_data='{"turn": 1}',
        payload_hash="h",
    )
    theirs._update_record(done)
    updated_by_them = moto_store.client.get_item(
        TableName=moto_store.table_name, Key={"pk": {"S": PK}, "sk": {"S": KEY}}
    )["Item"]
    ours._update_record(done)
    updated_by_us = moto_store.client.get_item(
        TableName=moto_store.table_name, Key={"pk": {"S": PK}, "sk": {"S": KEY}}
    )["Item"]
    assert updated_by_us == updated_by_them
    for reader in (ours, theirs):
        found = reader._get_record(KEY)
        assert (found.status, found.response_data, found.payload_hash) == (
            "COMPLETED",
            '{"turn": 1}',
            "h",
        )
