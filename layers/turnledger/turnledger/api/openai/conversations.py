"""The Conversations API of the OpenAI face, as the ``openai`` SDK and the Agents SDK's
``OpenAIConversationsSession`` use it, over the ledger's conversations.

* ``POST /openai/v1/conversations`` stores a new conversation at once (with its ``items``,
  if any, recorded with the client as their source); ``GET``/``DELETE`` read and clear it.
* ``GET .../items`` lists the transcript as items (``order``, ``after``, ``limit``;
  ``include`` is accepted); ``POST .../items`` appends items without calling a model;
  ``GET .../items/{item_id}`` reads one. ``DELETE .../items/{item_id}`` is refused: the
  ledger is append-only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query

from ...core.exceptions import InvalidRequest, TurnledgerError
from ...core.models import ConversationKey
from ...runtime import get_runtime
from ..resolver import app, caller, conversation, json_response
from .items import history_of, items_of, parse_input
from .matching import all_events
from .schemas import (
    PREFIX,
    ConversationCreate,
    ItemsCreate,
    OpenAIConversationId,
    epoch,
    new_conversation_id,
)

if TYPE_CHECKING:
    from ...turn.pipeline import Conversations
    from ...turn.reads import Reads

__all__ = ["AppendOnly", "ItemNotFound"]


class ItemNotFound(TurnledgerError):
    """No item of the conversation has that id."""

    status = 404
    code = "item_not_found"


class AppendOnly(TurnledgerError):
    """An item cannot be deleted: the ledger is append-only."""

    status = 400
    code = "append_only"


ItemId = Annotated[str, Path(min_length=1, max_length=300)]


def _conversation_body(
    conversation_id: str, created_at: int, metadata: dict[str, str]
) -> dict[str, Any]:
    return {
        "id": conversation_id,
        "object": "conversation",
        "created_at": created_at,
        "metadata": metadata,
    }


def _append(
    service: Conversations, key: ConversationKey, actor: str, raw: list[dict[str, Any]]
) -> None:
    items = parse_input(raw)
    refused = sorted(
        {i.kind for i in items} - {"user", "assistant", "function_call", "function_call_output"}
    )
    if refused:
        raise InvalidRequest(
            f"conversation items of kind {', '.join(refused)} are not supported "
            "(user and assistant messages, function calls and their outputs)",
            details={"param": "items"},
        )
    service.append(key, actor, history_of(items))


@app.post(f"{PREFIX}/conversations", include_in_schema=False)
def create_conversation(request: Annotated[ConversationCreate, Body()]) -> Response[str]:
    """Store a new conversation, with its ``items`` if any."""
    who = caller()
    key = who.key(new_conversation_id())
    service = get_runtime().conversations_for(key.tenant)
    _append(service, key, who.actor, request.items or [])
    view = service.get(key)
    return json_response(
        200, _conversation_body(key.conversation_id, epoch(view.created_at), request.metadata or {})
    )


@app.get(f"{PREFIX}/conversations/<conversation_id>", include_in_schema=False)
def retrieve_conversation(conversation_id: OpenAIConversationId) -> Response[str]:
    """The conversation (``metadata`` is not kept: ``{}``)."""
    _, key = conversation(conversation_id)
    view = get_runtime().reads_for(key.tenant).get(key)
    return json_response(200, _conversation_body(conversation_id, epoch(view.created_at), {}))


@app.delete(f"{PREFIX}/conversations/<conversation_id>", include_in_schema=False)
def delete_conversation(conversation_id: OpenAIConversationId) -> Response[str]:
    """Clear the conversation (as ``DELETE /v1/conversations/{id}``)."""
    _, key = conversation(conversation_id)
    get_runtime().reads_for(key.tenant).clear(key)
    return json_response(
        200, {"id": conversation_id, "object": "conversation.deleted", "deleted": True}
    )


def _items(service: Reads, key: ConversationKey, after: int = 0) -> list[dict[str, Any]]:
    return [item for event in all_events(service, key, after=after) for item in items_of(event)]


def _page(data: list[dict[str, Any]], *, has_more: bool = False) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


@app.get(f"{PREFIX}/conversations/<conversation_id>/items", include_in_schema=False)
def list_items(
    conversation_id: OpenAIConversationId,
    after: Annotated[str | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
    include: Annotated[list[str] | None, Query()] = None,
) -> Response[str]:
    """The transcript as items, ``order``ed, ``limit`` per page after the item ``after``
    (``include`` is accepted: items carry everything they have)."""
    _, key = conversation(conversation_id)
    items = _items(get_runtime().reads_for(key.tenant), key)
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise InvalidRequest(
                f"after names no item of this conversation: {after!r}",
                details={"param": "after"},
            )
        items = items[ids.index(after) + 1 :]
    return json_response(200, _for_reader(key, _page(items[:limit], has_more=len(items) > limit)))


@app.post(f"{PREFIX}/conversations/<conversation_id>/items", include_in_schema=False)
def create_items(
    conversation_id: OpenAIConversationId, request: Annotated[ItemsCreate, Body()]
) -> Response[str]:
    """Append ``items`` to the conversation, the client as their source, without calling a
    model; answers them as stored (with their ids)."""
    who, key = conversation(conversation_id)
    service = get_runtime().conversations_for(key.tenant)
    before = service.get(key).events
    _append(service, key, who.actor, request.items)
    return json_response(200, _for_reader(key, _page(_items(service, key, after=before))))


def _for_reader(key: ConversationKey, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` (items of ``key``) as the caller may read it under the data policy: tokens
    for the values of classes whose read scope it lacks (as the events route answers)."""
    from ..policy_views import reader_view  # the data policy's: loaded by reads only

    view = reader_view(key)
    return body if view is None else cast(dict[str, Any], view(body))


def _item(key: ConversationKey, item_id: str) -> dict[str, Any]:
    items = _items(get_runtime().reads_for(key.tenant), key)
    found = next((item for item in items if item["id"] == item_id), None)
    if found is None:
        raise ItemNotFound(
            f"no item {item_id!r} in conversation {key.conversation_id!r}",
            details={"param": "item_id"},
        )
    return found


@app.get(f"{PREFIX}/conversations/<conversation_id>/items/<item_id>", include_in_schema=False)
def retrieve_item(conversation_id: OpenAIConversationId, item_id: ItemId) -> Response[str]:
    """One item of the conversation."""
    _, key = conversation(conversation_id)
    return json_response(200, _for_reader(key, _item(key, item_id)))


@app.delete(f"{PREFIX}/conversations/<conversation_id>/items/<item_id>", include_in_schema=False)
def delete_item(conversation_id: OpenAIConversationId, item_id: ItemId) -> Response[str]:
    """Refused (once the item is found): the ledger is append-only; clear the conversation
    with ``DELETE /openai/v1/conversations/{id}`` instead."""
    _, key = conversation(conversation_id)
    _item(key, item_id)
    raise AppendOnly(
        "items cannot be deleted: the ledger is append-only (delete the conversation to clear it)",
        details={"param": "item_id"},
    )
