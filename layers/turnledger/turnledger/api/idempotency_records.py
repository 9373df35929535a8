"""Powertools' persistence layer over the conversation store's idempotency records.

One class for every backend (DynamoDB, SQLite, memory): it adapts Powertools'
``BasePersistenceLayer`` calls to the store primitives
(:meth:`~turnledger.store.base.ConversationStore.get_record`, ``put_record``,
``update_record``, ``delete_record``), which every backend implements and
``tests/contract`` covers. The records are those Powertools' own DynamoDB layer
writes (:mod:`turnledger.store.records`), in the conversation's partition.

Imported only when a request carries an ``Idempotency-Key`` (Powertools'
idempotency module costs cold-start time).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyItemAlreadyExistsError,
    IdempotencyItemNotFoundError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.base import BasePersistenceLayer
from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import DataRecord

from ..core.models import ConversationKey
from ..store.base import ConversationStore
from ..store.records import Record


class StoreRecordPersistence(BasePersistenceLayer):
    """Powertools' persistence layer over one conversation's records in a store."""

    def __init__(
        self,
        store: ConversationStore,
        conversation: ConversationKey,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Records go to ``conversation``'s partition of ``store``; ``clock`` (epoch
        seconds) decides which stored records have expired."""
        self.store = store
        self.conversation = conversation
        self.clock = clock
        super().__init__()  # type: ignore[no-untyped-call]

    def _record(self, data_record: DataRecord, *, data: str | None) -> Record:
        validation = data_record.payload_hash if self.payload_validation_enabled else None
        return Record(
            key=data_record.idempotency_key,
            status=data_record.status,
            expires_at=data_record.expiry_timestamp or 0,
            in_progress_expires_at=data_record.in_progress_expiry_timestamp,
            data=data,
            # As Powertools' DynamoDB layer: no validation attribute for an empty hash.
            validation=validation or None,
        )

    @staticmethod
    def _data_record(record: Record) -> DataRecord:
        return DataRecord(
            idempotency_key=record.key,
            status=record.status,
            expiry_timestamp=record.expires_at,
            in_progress_expiry_timestamp=record.in_progress_expires_at,
            response_data=record.data or "",
            payload_hash=record.validation or "",
        )

    def _get_record(self, idempotency_key: str) -> DataRecord:
        record = self.store.get_record(self.conversation, idempotency_key)
        if record is None:
            raise IdempotencyItemNotFoundError
        return self._data_record(record)

    def _put_record(self, data_record: DataRecord) -> None:
        stored = self.store.put_record(
            self.conversation, self._record(data_record, data=None), now=self.clock()
        )
        if stored is None:
            return
        old = self._data_record(stored)
        # As Powertools' DynamoDB layer does with the item its refused put returns: another
        # body under the same key is IdempotencyValidationError, else the stored record.
        self._validate_payload(data_payload=data_record, stored_data_record=old)
        self._save_to_cache(data_record=old)
        raise IdempotencyItemAlreadyExistsError(old_data_record=old)

    def _update_record(self, data_record: DataRecord) -> None:
        self.store.update_record(
            self.conversation, self._record(data_record, data=data_record.response_data)
        )

    def _delete_record(self, data_record: DataRecord) -> None:
        self.store.delete_record(self.conversation, data_record.idempotency_key)
