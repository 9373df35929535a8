"""The ``/v1/memories`` routes: the caller's user's long-term memory records.

The user is the caller's ``sub``, or the user ``X-Memory-User`` names where the
deployment allows it (:func:`.resolver.memory_user`); the service is
:class:`~turnledger.turn.memories.MemoryControl` on the tenant's own store.
"""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query

from ..runtime import get_runtime
from ..store.memories import MEMORY_ID_PATTERN, MemoryRecord
from ..turn.memories import MemoryControl
from .resolver import app, caller, json_response, memory_user, responses
from .schemas import (
    MemoriesDeleted,
    MemoryCreate,
    MemoryPageView,
    MemoryPatch,
    MemoryView,
)

MemoryId = Annotated[str, Path(pattern=MEMORY_ID_PATTERN, description="A memory record's id.")]


def _who() -> tuple[str, str, MemoryControl]:
    """The tenant, the memory's user and the control of the tenant's records."""
    who = caller()
    service = get_runtime().reads_for(who.tenant)
    control = MemoryControl(service.store, service.clock, service.settings.memory_max_records)
    return who.tenant, memory_user() or who.actor, control


def _view(record: MemoryRecord) -> MemoryView:
    return MemoryView.model_validate(record.model_dump(exclude={"embedding"}))


@app.get("/v1/memories", responses=responses(MemoryPageView, 400, 401, 403, 422, 503))
def list_memories(
    after: Annotated[
        str | None, Query(pattern=MEMORY_ID_PATTERN, description="next_cursor of the last page.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200, description="At most this many records.")] = 50,
) -> MemoryPageView:
    """The caller's user's memory records, oldest first."""
    tenant, user, control = _who()
    page = control.page(tenant, user, after=after, limit=limit)
    return MemoryPageView(items=[_view(r) for r in page.items], next_cursor=page.next_cursor)


@app.post(
    "/v1/memories",
    responses=responses(MemoryView, 400, 401, 403, 409, 422, 503, status=201)
    | responses(MemoryView),
)
def add_memory(request: Annotated[MemoryCreate, Body()]) -> Response[str]:
    """Add a record (``201``), or supersede the record with the same ``key`` (``200``)."""
    tenant, user, control = _who()
    record, new = control.add(tenant, user, request.text, request.key)
    return json_response(201 if new else 200, _view(record))


@app.patch(
    "/v1/memories/<memory_id>", responses=responses(MemoryView, 400, 401, 403, 404, 422, 503)
)
def edit_memory(memory_id: MemoryId, request: Annotated[MemoryPatch, Body()]) -> MemoryView:
    """Change a record's ``text`` and/or ``key`` (``"key": null`` removes its key)."""
    tenant, user, control = _who()
    changes = {name: getattr(request, name) for name in request.model_fields_set}
    return _view(control.edit(tenant, user, memory_id, changes))


@app.delete(
    "/v1/memories/<memory_id>",
    responses=responses(None, 400, 401, 403, 404, 422, 503, status=204),
)
def delete_memory(memory_id: MemoryId) -> Response[str]:
    """Delete one record."""
    tenant, user, control = _who()
    control.delete(tenant, user, memory_id)
    return Response(status_code=204, body="")


@app.delete("/v1/memories", responses=responses(MemoriesDeleted, 400, 401, 403, 422, 503))
def delete_memories(
    conversation_id: Annotated[
        str | None,
        Query(min_length=1, max_length=256, description="Only records extracted from it."),
    ] = None,
) -> MemoriesDeleted:
    """Delete every record of the caller's user (or only those one conversation gave)."""
    tenant, user, control = _who()
    return MemoriesDeleted(deleted=control.delete_all(tenant, user, conversation_id))
