"""Request idempotency: an ``Idempotency-Key`` header makes a POST safe to retry.

Built on Powertools idempotency (records in their own DynamoDB table). The
record's key is the tenant, the conversation, the route and the header value;
its payload check is the request body, so the same key with another body is
``422 idempotency_key_reused``. Only successful answers are recorded: a
request that failed can be retried under the same key and runs again.

The Powertools module is imported only when a request carries the header
(it costs cold-start time every other request would pay for nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ..exceptions import ConversationBusy, IdempotencyKeyReused
from ..runtime import Runtime, get_runtime

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.idempotency import (
        DynamoDBPersistenceLayer,
        IdempotencyConfig,
    )

#: How long a key is remembered.
KEY_TTL_SECONDS = 24 * 3600


def _persistence() -> tuple[DynamoDBPersistenceLayer, IdempotencyConfig]:
    runtime = get_runtime()
    if runtime.idempotency is None:
        runtime.idempotency = _build(runtime)
    built: tuple[DynamoDBPersistenceLayer, IdempotencyConfig] = runtime.idempotency
    return built


def _build(runtime: Runtime) -> tuple[DynamoDBPersistenceLayer, IdempotencyConfig]:
    from aws_lambda_powertools.utilities.idempotency import (
        DynamoDBPersistenceLayer,
        IdempotencyConfig,
    )

    assert runtime.settings.idempotency_table_name is not None
    layer = DynamoDBPersistenceLayer(
        table_name=runtime.settings.idempotency_table_name, boto3_client=runtime.dynamodb
    )
    config = IdempotencyConfig(
        event_key_jmespath="[scope, key]",
        payload_validation_jmespath="body",
        raise_on_no_idempotency_key=True,
        expires_after_seconds=KEY_TTL_SECONDS,
    )
    return layer, config


def idempotent[T: BaseModel](
    *,
    key: str | None,
    scope: tuple[str, ...],
    body: dict[str, Any],
    run: Callable[[], T],
    parse: Callable[[Any], T],
) -> T:
    """``run()``, or the answer recorded for ``key`` within ``scope``.

    Raises:
        IdempotencyKeyReused: ``key`` was used with another body.
        ConversationBusy: the first request with ``key`` is still running.
    """
    if key is None or not get_runtime().settings.idempotency_table_name:
        return run()
    from aws_lambda_powertools.utilities.idempotency import idempotent_function
    from aws_lambda_powertools.utilities.idempotency.exceptions import (
        IdempotencyAlreadyInProgressError,
        IdempotencyValidationError,
    )

    from .app import app

    layer, config = _persistence()
    if app.lambda_context is not None:
        config.register_lambda_context(app.lambda_context)

    @idempotent_function(data_keyword_argument="request", persistence_store=layer, config=config)
    def once(request: dict[str, Any]) -> dict[str, Any]:
        return run().model_dump(mode="json")

    try:
        answer = once(request={"scope": list(scope), "key": key, "body": body})
    except IdempotencyValidationError as exc:
        raise IdempotencyKeyReused(
            "this Idempotency-Key was used with another request body"
        ) from exc
    except IdempotencyAlreadyInProgressError as exc:
        raise ConversationBusy("a request with this Idempotency-Key is still in progress") from exc
    return parse(answer)
