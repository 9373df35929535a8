"""``POST /openai/v1/responses``: one turn (or one decision on pending calls) of a ledger
conversation, as an OpenAI ``response``.

Which conversation: the one ``conversation`` names (which must exist, as on OpenAI); the one
``previous_response_id`` belongs to when it is that conversation's latest response, else a
new fork of it after that response's turn (:func:`continued_from`: a chain continues from
any response, as on OpenAI); or, with neither, the one whose transcript, up to its latest
response, the input's leading items repeat in canonical form, whatever their ids
(:mod:`.matching`), else a new one whose history is the given items, recorded with the
client as their source. After a stored response, the conversation's transcript chain is
brought up to date (:func:`.matching.record`). A response id is
``resp_<turn>_<conversation id>``.

``tools``: function tools the registry has keep its executors and approval rules; the others
are the client's for this request (:class:`~turnledger.core.models.ClientTool`).
``stream: true`` answers the same response as Responses streaming events
(:mod:`.streaming`), written as the model writes them where the answer can stream (the
streaming function, :mod:`turnledger.api.live`), else at once at the end. ``store: false``
answers and keeps nothing (the conversation it ran in is cleared at once).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, NamedTuple

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body

from ...core.exceptions import (
    ApprovalPending,
    ConversationNotFound,
    ForkPointOpen,
    ForkTooDeep,
    InvalidConversationId,
    InvalidRequest,
    TurnledgerError,
)
from ...core.models import (
    CONVERSATION_ID_PATTERN,
    ClientTool,
    ConversationKey,
    JsonObjectFormat,
    JsonSchemaFormat,
    validate_conversation_id,
)
from ...core.observability import logger
from ...runtime import get_runtime
from ...tools.registry import client_tool
from ...turn import longturns
from ...turn.commands import ClientOutput, Decisions, TurnCommand
from ...turn.live import Delta
from ...turn.pipeline import Conversations
from ...turn.results import TurnResult
from ..live import EVENT_STREAM, Channel, channel
from ..resolver import (
    Caller,
    app,
    approver,
    caller,
    json_response,
    memory_user,
    with_approver_claims,
)
from ..schemas import ApprovalEdit, ApprovalRequest, Rejection
from ..views import decisions, pending_view, turn_response
from . import mcp
from .items import InputItem, history_of, item_id, output_message, parse_input
from .matching import continued, record
from .schemas import PREFIX, ResponseCreate, epoch, new_conversation_id
from .streaming import ResponseEvents, event_stream, sse_text

__all__ = [
    "SERVER_LABEL",
    "continued_from",
    "parse_response_id",
    "respond",
    "response_body",
    "response_id",
]

#: Shown as the ``server_label`` of approval requests: the ledger's own tool registry.
SERVER_LABEL = "turnledger"
#: Kept of ``instructions`` (and system/developer messages) on the turn's metadata.
INSTRUCTIONS_CHARS = 1000
#: A response id as :func:`response_id` writes it: the turn in ASCII digits, no leading
#: zero, far below any turn count (an unbounded run of digits is no number Python reads).
_RESPONSE_ID = re.compile(r"resp_(?P<turn>[1-9][0-9]{0,17})_(?P<conversation>.+)", re.ASCII)
_CONVERSATION_ID = re.compile(CONVERSATION_ID_PATTERN)


def response_id(conversation_id: str, turn: int) -> str:
    """The response id of ``turn`` of ``conversation_id``."""
    return f"resp_{turn}_{conversation_id}"


def parse_response_id(value: str) -> tuple[str, int]:
    """``(conversation id, turn)`` of a :func:`response_id`, read only as written: one id
    per response (``resp_01_c`` or ``resp_\u0661_c`` is not ``resp_1_c``).

    Raises:
        InvalidRequest: not a response id of this service (``param``
            ``previous_response_id``).
    """
    parsed = _RESPONSE_ID.fullmatch(value)
    if parsed is None or not _CONVERSATION_ID.fullmatch(parsed["conversation"]):
        raise InvalidRequest(
            f"previous_response_id {value[:200]!r} is not a response of this service",
            details={"param": "previous_response_id"},
        )
    return parsed["conversation"], int(parsed["turn"])


def continued_from(
    service: Conversations, who: Caller, previous_response_id: str
) -> tuple[ConversationKey, bool]:
    """The conversation a request naming ``previous_response_id`` runs in, and whether it
    is a new fork: the response's own conversation when it is that conversation's latest
    response; else a new conversation of this face (:func:`new_conversation_id`) forked
    from it after the response's turn (:meth:`~turnledger.turn.pipeline.Conversations.fork`),
    so a chain of ``previous_response_id`` continues from whichever response it names.

    Raises:
        InvalidRequest: not a response id of this service, or its conversation has no
            such turn.
        ConversationNotFound: its conversation is absent, expired, cleared or another
            tenant's.
        ForkPointOpen, ForkTooDeep: that response is no fork point (``param`` names
            ``previous_response_id``).
    """
    conversation_id, turn = parse_response_id(previous_response_id)
    key = who.key(conversation_id)
    latest = service.get(key).turns
    if turn == latest:
        return key, False
    if not 1 <= turn < latest:
        raise InvalidRequest(
            f"previous_response_id names no response of conversation {conversation_id!r} "
            f"(its turns are 1 to {latest})",
            details={"param": "previous_response_id"},
        )
    fork = who.key(new_conversation_id())
    try:
        service.fork(key, fork.conversation_id, turn)
    except (ForkPointOpen, ForkTooDeep) as exc:
        exc.details["param"] = "previous_response_id"
        raise
    return fork, True


def _named_conversation(service: Conversations, who: Caller, named: Any) -> ConversationKey:
    """The key of the conversation ``conversation`` names, which must exist, as on OpenAI
    (a request never makes one by naming it: ``POST /openai/v1/conversations`` does).

    Raises:
        InvalidRequest: not an id or ``{"id": ...}``.
        InvalidConversationId: the id breaks the id rule.
        ConversationNotFound: no such conversation of the caller's tenant (absent,
            expired, deleted or another tenant's).
    """
    value = named.get("id") if isinstance(named, dict) else named
    if not isinstance(value, str):
        raise InvalidRequest(
            "conversation must be an id or {'id': ...}", details={"param": "conversation"}
        )
    try:
        key = who.key(validate_conversation_id(value))
        service.get(key)
    except (InvalidConversationId, ConversationNotFound) as exc:
        exc.details["param"] = "conversation"
        raise
    return key


def _tools(
    service: Conversations, declared: list[dict[str, Any]] | None
) -> tuple[list[str] | None, list[ClientTool], list[str]]:
    """The registry tools a request offers (``None``: all of them), its client tools, and
    the tools its ``mcp`` tools' ``require_approval`` asks approval for."""
    if declared is None:
        return None, [], []
    registry = service.tools
    registered = set(registry.names)
    names: list[str] = []
    clients: list[ClientTool] = []
    stricter: list[str] = []
    for index, tool in enumerate(declared):
        kind = tool.get("type", "function")
        if kind == "mcp" and tool.get("server_label") == SERVER_LABEL:
            names.extend(registry.names)
            continue
        if kind == "mcp":
            offered, approve = mcp.mcp_tools(registry, tool, index)
            names.extend(offered)
            stricter.extend(approve)
            continue
        if kind != "function":
            raise InvalidRequest(
                f"tools of type {kind!r} are not supported (function tools only)",
                details={"param": f"tools.{index}"},
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("a function tool needs a name", details={"param": "tools"})
        if name in registered:
            names.append(name)
            continue
        try:
            declared_tool = ClientTool(
                name=name,
                description=str(tool.get("description") or ""),
                parameters=tool.get("parameters") or {"type": "object"},
            )
            client_tool(declared_tool)  # its parameters must be a JSON Schema of an object
        except ValueError as exc:
            raise InvalidRequest(
                f"function tool {name!r} is not usable: {exc}",
                details={"param": f"tools.{index}"},
            ) from None
        clients.append(declared_tool)
    return names, clients, stricter


def _command(
    service: Conversations,
    who: Caller,
    request: ResponseCreate,
    messages: list[str],
    outputs: list[ClientOutput],
    instructions: list[str],
    response_format: JsonObjectFormat | JsonSchemaFormat | None = None,
) -> TurnCommand:
    """The turn of a request: as ``POST .../turns`` builds it, the approver claims
    (outputs of calls waiting for a person or a job need them) and ``X-Memory-User``
    (:func:`~turnledger.api.resolver.memory_user`) included; ``response_format`` is
    JSON mode (the Chat Completions face's)."""
    tools, clients, stricter = _tools(service, request.tools)
    metadata = dict(request.metadata or {})
    said = "\n".join([*filter(None, [request.instructions]), *instructions])
    if said:
        # Kept on the turn; the deployment's system prompt is what the model is sent.
        metadata["instructions"] = said[:INSTRUCTIONS_CHARS]
    return TurnCommand(
        messages=messages,
        outputs=outputs,
        model=request.model,
        response_format=response_format,
        tools=tools,
        client_tools=clients,
        require_approval=stricter,
        metadata=metadata,
        memory_user=memory_user(),
        approver_claims=with_approver_claims(who).approver_claims,
        data_class=metadata.get("data_class"),
    )


def _decisions(approvals: list[InputItem], key: ConversationKey) -> Decisions:
    """The decisions of ``mcp_approval_response`` items; deciding here needs what the
    approvals route needs (:func:`~turnledger.api.resolver.approver`)."""
    who = approver(key.conversation_id)
    approve: list[str | ApprovalEdit] = []
    reject: list[str | Rejection] = []
    for item in approvals:
        call_id = item.call_id
        if item.approve:
            approve.append(call_id)
        else:
            reject.append(Rejection(id=call_id, reason=item.reason))
    return decisions(ApprovalRequest(approve=approve, reject=reject), who.approver_claims)


def _execute(
    service: Conversations,
    who: Caller,
    key: ConversationKey,
    command: TurnCommand | Decisions,
    stream: bool,
    live: LiveResponse | None = None,
) -> tuple[TurnResult, list[str] | None]:
    """Run ``command``; streamed, through the turn's draft (its chunks are the deltas), and
    written to the client as the model writes it when the answer can stream (``live``)."""
    if stream:
        return longturns.run_drafted(
            service,
            key,
            who.actor,
            command,
            answer=lambda result: turn_response(result).model_dump(mode="json"),
            read_back=live is None,
            listener=live,
        )
    if isinstance(command, TurnCommand):
        return service.turn(key, who.actor, command), None
    return service.approve(key, who.actor, command), None


def _run(
    service: Conversations,
    who: Caller,
    key: ConversationKey,
    request: ResponseCreate,
    items: list[InputItem],
    response_format: JsonObjectFormat | JsonSchemaFormat | None = None,
    live: LiveResponse | None = None,
) -> tuple[TurnResult, list[str] | None]:
    """Answer ``items`` on ``key``: decisions alone; else the leading outputs of waiting
    calls, then the client's history, then the trailing user messages as the turn."""
    instructions = [i.text for i in items if i.kind == "instructions"]
    items = [i for i in items if i.kind != "instructions"]
    approvals = [i for i in items if i.kind == "approval"]
    if approvals:
        if len(approvals) != len(items):
            raise InvalidRequest("send mcp_approval_response items on their own")
        return _execute(service, who, key, _decisions(approvals, key), request.stream, live)
    first = 0
    while first < len(items) and items[first].kind == "function_call_output":
        first += 1
    outputs = [ClientOutput(call_id=i.call_id, output=i.text) for i in items[:first]]
    last = len(items)
    while last > first and items[last - 1].kind == "user":
        last -= 1
    history, messages = items[first:last], [i.text for i in items[last:]]
    if outputs and history:
        raise InvalidRequest(
            "outputs of waiting calls must come after the history that asked for them"
        )
    command = _command(service, who, request, messages, outputs, instructions, response_format)
    if history:
        service.append(key, who.actor, history_of(history))
    try:
        return _execute(service, who, key, command, request.stream, live)
    except ApprovalPending as exc:
        raise mcp.unanswered(exc) from None


class Responded(NamedTuple):
    """What :func:`respond` did: the turn's result, its draft chunks when streamed, and
    the response's MCP items (``mcp_list_tools``, ``mcp_call``) that come before the rest
    of its output."""

    reply: TurnResult
    pieces: list[str] | None
    mcp_items: list[dict[str, Any]]


@app.post(f"{PREFIX}/responses", include_in_schema=False)
def create_response(request: Annotated[ResponseCreate, Body()]) -> Response[str]:
    """One turn (or a decision on pending calls) of a conversation, as an OpenAI response
    (or, with ``stream: true``, as its streaming events)."""
    who = caller()
    service = get_runtime().conversations_for(who.tenant)
    opened = channel() if request.stream else None
    live = LiveResponse(opened, request) if opened is not None else None
    try:
        done = respond(service, who, request, parse_input(request.input), live=live)
    except Exception as exc:
        if live is None or not live.opened:
            raise
        live.fail(exc)  # the stream began: its client learns of the failure there
        return live.answer()
    body = response_body(request, done.reply)
    output = body["output"]
    if live is not None and live.events.sent is not None:
        # The message streamed live holds output index 0 (the SDKs refuse an index given
        # twice): its MCP items follow it.
        body["output"] = [*output[:1], *done.mcp_items, *output[1:]]
    else:
        body["output"] = [*done.mcp_items, *output]
    if live is not None:
        live.finish(body)
        return live.answer()
    if request.stream:
        return event_stream(body, done.pieces)
    return json_response(200, body)


def respond(
    service: Conversations,
    who: Caller,
    request: ResponseCreate,
    items: list[InputItem],
    response_format: JsonObjectFormat | JsonSchemaFormat | None = None,
    live: LiveResponse | None = None,
) -> Responded:
    """Run ``request`` (its ``input`` read as ``items``) in the conversation it names or
    continues (see the module's docstring), and bring that conversation's transcript chain
    up to date; ``store: false`` keeps nothing. The Chat Completions face
    (:mod:`.chat`) answers through this too, so both faces continue the same chains.
    Streamed, its ``pieces`` are the answer's draft chunks; with ``live``, the answer's
    text also goes to it as the model writes it."""
    if request.conversation is not None and request.previous_response_id is not None:
        raise InvalidRequest("send conversation or previous_response_id, not both")
    found = None
    forked = False
    if not request.store:
        if request.conversation is not None or request.previous_response_id is not None:
            raise InvalidRequest(
                "store: false answers on its own: send the history as input, without "
                "conversation or previous_response_id",
                details={"param": "store"},
            )
        key = who.key(new_conversation_id())
    elif request.conversation is not None:
        key = _named_conversation(service, who, request.conversation)
    elif request.previous_response_id is not None:
        if not items:
            raise InvalidRequest("input holds no item", details={"param": "input"})
        key, forked = continued_from(service, who, request.previous_response_id)
    else:
        found = continued(service, who, items)
        key = found[0] if found is not None else who.key(new_conversation_id())
    if found is not None:
        items = found[1]
    elif not items:
        raise InvalidRequest("input holds no item", details={"param": "input"})
    if live is not None:
        live.conversation_id = key.conversation_id
    try:
        reply, pieces = _run(service, who, key, request, items, response_format, live)
        # Read before a store: false request's conversation is cleared.
        # Decisions, and outputs (an answer to an MCP server's question), may run MCP calls.
        decided = any(i.kind in ("approval", "function_call_output") for i in items)
        mcp_items = mcp.items(service, key, request.tools, reply, SERVER_LABEL, decided=decided)
    except Exception:
        if forked:
            service.clear(key)  # no response names the fork: nothing may continue it
        raise
    finally:
        if not request.store:
            service.clear(key)  # answered, nothing kept
    if request.store:
        record(service, key)
    return Responded(reply, pieces, mcp_items)


class LiveResponse:
    """A streamed response written as the model writes it (a
    :class:`~turnledger.turn.live.Listener`): opened once the turn is admitted, a delta
    event per piece, the rest from the whole response once it is committed."""

    def __init__(self, live: Channel, request: ResponseCreate) -> None:
        self.live = live
        self.request = request
        #: Set once the request's conversation is known (:func:`respond`).
        self.conversation_id = ""
        self.turn = 0
        self.events = ResponseEvents(lambda event: live.write(sse_text([event]).encode()))

    @property
    def opened(self) -> bool:
        """Whether the stream began."""
        return self.live.opened

    def started(self, turn: int) -> None:
        self.turn = turn
        self.live.open(200, {"content-type": EVENT_STREAM, "cache-control": "no-cache"})
        self.events.start(_envelope(self.request, self.conversation_id, turn, [], None))

    def delta(self, delta: Delta) -> None:
        self.events.text(item_id("msg", f"r{self.turn}", self.conversation_id), delta.text)

    def finish(self, body: dict[str, Any]) -> None:
        """The rest of the events, from the committed response's ``body``."""
        if not self.opened:
            self.started(self.turn or 1)  # nothing streamed (a retry's recorded answer)
        self.events.finish(body)

    def fail(self, error: Exception) -> None:
        """The stream's end when the turn failed after it began: an ``error`` event."""
        if not isinstance(error, TurnledgerError):
            logger.exception("a streamed response failed")
            error = TurnledgerError("internal error")
        self.events.event("error", code=error.code, message=error.message, param=None)

    def answer(self) -> Response[str]:
        """What the route returns (its body went out through the channel)."""
        return Response(status_code=200, content_type=EVENT_STREAM, body="")


def response_body(request: ResponseCreate, reply: TurnResult) -> dict[str, Any]:
    """The ``response`` object of ``reply``."""
    conversation_id, turn = reply.conversation_id, reply.turn
    output: list[dict[str, Any]] = []
    if reply.output_text:
        output.append(
            output_message(item_id("msg", f"r{turn}", conversation_id), reply.output_text)
        )
    for index, call in enumerate(map(pending_view, reply.waiting)):
        arguments = json.dumps(call.arguments)
        mcp_request = mcp.approval_request_item(call.id, call.name, arguments)
        if call.requires == "approval" and mcp_request is not None:
            output.append(mcp_request)
        elif call.requires == "approval":
            output.append(
                {
                    "type": "mcp_approval_request",
                    "id": call.id,
                    "name": call.name,
                    "arguments": arguments,
                    "server_label": SERVER_LABEL,
                }
            )
        elif call.requires in ("client", "input"):
            # A human-input call is answered the same way (function_call_output); a
            # deferred one waits for its job's callback, not for this client.
            output.append(
                {
                    "type": "function_call",
                    "id": item_id("fc", f"r{turn}.{index}", conversation_id),
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": arguments,
                    "status": "completed",
                }
            )
    usage = reply.usage
    return _envelope(
        request,
        conversation_id,
        turn,
        output,
        {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_input_tokens},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    )


def _envelope(
    request: ResponseCreate,
    conversation_id: str,
    turn: int,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """The ``response`` object of ``turn`` holding ``output`` and ``usage``."""
    now = get_runtime().clock()
    return {
        "id": response_id(conversation_id, turn),
        "object": "response",
        "created_at": epoch(now),
        "status": "completed",
        "model": request.model or get_runtime().settings.model,
        "output": output,
        "conversation": {"id": conversation_id} if request.store else None,
        "previous_response_id": request.previous_response_id,
        "instructions": request.instructions,
        "tools": request.tools or [],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "metadata": request.metadata or {},
        "store": request.store,
        "temperature": None,
        "top_p": None,
        "error": None,
        "incomplete_details": None,
        "usage": usage,
    }
