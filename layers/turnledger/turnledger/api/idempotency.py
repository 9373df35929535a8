"""Request idempotency: an ``Idempotency-Key`` header makes a POST safe to retry.

Built on Powertools idempotency. The records live in the conversation's own
partition of the conversations table (``pk`` = the conversation's partition
key, ``sk = "I#<hash>"``, expiry in the table's TTL attribute), so clearing or
erasing a conversation removes them with it: after ``DELETE``, the same key
runs anew instead of answering the old reply. ``"I#"`` sorts after
``"HEAD"``, outside every range the store reads.

The record's key hashes the tenant, the conversation, the route and the header
value; its payload check is the request body, so the same key with another
body is ``422 idempotency_key_reused``. Only successful answers are recorded:
a request that failed can be retried under the same key and runs again.

The Powertools module is imported only when a request carries the header
(it costs cold-start time every other request would pay for nothing).

With the SQLite store (``turnledger local --data-dir``) the same records live in
the SQLite database (:mod:`.idempotency_sqlite`), so they survive a restart and a
clear or an erasure removes them there too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError
from pydantic import BaseModel

from ..exceptions import ConversationBusy, IdempotencyKeyReused, TurnledgerError
from ..models import ConversationKey
from ..runtime import get_runtime
from ..store import codec, keys
from ..store.dynamodb import transient_error

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig
    from aws_lambda_powertools.utilities.idempotency.persistence.base import (
        BasePersistenceLayer,
    )

#: How long a key is remembered.
KEY_TTL_SECONDS = 24 * 3600
#: Powertools joins its key prefix and the hash with ``#``: records' sort keys are ``I#<hash>``.
_KEY_PREFIX = keys.RECORD_PREFIX.removesuffix("#")


def _persistence(conversation: ConversationKey) -> BasePersistenceLayer:
    from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

    runtime = get_runtime()
    if runtime.settings.store == "sqlite":
        # The local runner's data folder: the records go to the SQLite store, into the
        # same partition-scoped items, so they outlive a restart and a clear erases them.
        from ..store.sqlite import SQLiteConversationStore
        from .idempotency_sqlite import SQLiteRecordPersistence

        store = runtime.conversations_for(conversation.tenant).store
        if isinstance(store, SQLiteConversationStore):
            return SQLiteRecordPersistence(store, keys.partition_key(conversation))
    return DynamoDBPersistenceLayer(
        table_name=runtime.settings.table_name,
        # The tenant's own credentials: its records are in its conversations' partitions.
        boto3_client=runtime.dynamodb_for(conversation.tenant),
        key_attr=codec.A_PK,
        sort_key_attr=codec.A_SK,
        static_pk_value=keys.partition_key(conversation),
        # The table's TTL attribute: DynamoDB removes a record after its 24 hours.
        expiry_attr=codec.A_EXPIRES,
    )


def _config() -> IdempotencyConfig:
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig

    return IdempotencyConfig(
        event_key_jmespath="[scope, key]",
        payload_validation_jmespath="body",
        raise_on_no_idempotency_key=True,
        expires_after_seconds=KEY_TTL_SECONDS,
    )


def idempotent[T: BaseModel](
    *,
    key: str | None,
    conversation: ConversationKey,
    route: str,
    body: dict[str, Any],
    run: Callable[[], T],
    parse: Callable[[Any], T],
) -> T:
    """``run()``, or the answer recorded for ``key`` on ``route`` of ``conversation``.

    Raises:
        IdempotencyKeyReused: ``key`` was used with another body.
        ConversationBusy: the first request with ``key`` is still running, or the
            record's write met a running transaction.
        ServiceUnavailable: DynamoDB throttled or failed the record's call.
    """
    if key is None:
        return run()
    from aws_lambda_powertools.utilities.idempotency import idempotent_function
    from aws_lambda_powertools.utilities.idempotency.exceptions import (
        IdempotencyAlreadyInProgressError,
        IdempotencyPersistenceLayerError,
        IdempotencyValidationError,
    )

    from .resolver import app

    config = _config()
    if app.lambda_context is not None:
        config.register_lambda_context(app.lambda_context)

    @idempotent_function(
        data_keyword_argument="request",
        persistence_store=_persistence(conversation),
        config=config,
        key_prefix=_KEY_PREFIX,
    )
    def once(request: dict[str, Any]) -> dict[str, Any]:
        return run().model_dump(mode="json")

    scope = [conversation.tenant, conversation.conversation_id, route]
    try:
        answer = once(request={"scope": scope, "key": key, "body": body})
    except IdempotencyValidationError as exc:
        raise IdempotencyKeyReused(
            "this Idempotency-Key was used with another request body"
        ) from exc
    except IdempotencyAlreadyInProgressError as exc:
        raise ConversationBusy("a request with this Idempotency-Key is still in progress") from exc
    except IdempotencyPersistenceLayerError as exc:
        # The record's own DynamoDB call was throttled, failed or met a transaction:
        # answered like the store's own calls (503, or 409 busy).
        cause = exc.__cause__
        if isinstance(cause, TurnledgerError):
            raise cause from exc  # the SQLite store's own answer (a lock held too long)
        error = transient_error(cause) if isinstance(cause, ClientError) else None
        if error is None:
            raise
        raise error from exc
    return parse(answer)
