"""Request idempotency: an ``Idempotency-Key`` header makes a POST safe to retry.

Built on Powertools idempotency, with one persistence layer for every store
backend (:mod:`.idempotency_records`) over the store's record primitives. The
records live in the conversation's own partition (``pk`` = the conversation's
partition key, ``sk = "I#<hash>"``, expiry in the table's TTL attribute: the
layout of Powertools' own DynamoDB layer, :mod:`turnledger.store.records`), so
clearing or erasing a conversation removes them with it: after ``DELETE``, the
same key runs anew instead of answering the old reply. ``"I#"`` sorts after
``"HEAD"``, outside every range the store reads.

The record's key hashes the tenant, the conversation, the route and the header
value; its payload check is the request body, so the same key with another
body is ``422 idempotency_key_reused``. Only successful answers are recorded:
a request that failed can be retried under the same key and runs again.

The Powertools module is imported only when a request carries the header
(it costs cold-start time every other request would pay for nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ..core.exceptions import ConversationBusy, IdempotencyKeyReused, TurnledgerError
from ..core.models import ConversationKey
from ..runtime import get_runtime
from ..store import keys

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
    from .idempotency_records import StoreRecordPersistence

    # The request's own store (the tenant's credentials, whatever the backend): the
    # records go to the conversation's partition through the store's record primitives.
    return StoreRecordPersistence(get_runtime().reads_for(conversation.tenant).store, conversation)


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
        ServiceUnavailable: the store throttled or failed the record's call.
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
        # The record's store call was refused (throttled, failing, a transaction or a
        # lock in the way): answered as the store answers any call (503, or 409 busy).
        cause = exc.__cause__
        if isinstance(cause, TurnledgerError):
            raise cause from exc
        raise
    return parse(answer)
