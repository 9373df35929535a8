"""Check request bodies against each provider's own request schema.

* OpenAI: the official ``openai`` package's request types (``TypedDict``\\ s),
  through pydantic. Their ``Iterable[...]`` fields validate lazily, so every
  iterator is consumed here; and a ``TypedDict`` drops keys it does not know,
  so the validated body must equal the body sent: an unknown or misspelled key
  anywhere fails the check.
* Bedrock: botocore's service model of ``bedrock-runtime`` (the ``Converse``
  input shape), plus the id and name patterns botocore does not enforce itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import cache
from itertools import pairwise
from typing import Any

import botocore.session
from botocore.validate import validate_parameters
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)
from openai.types.responses.response_create_params import (
    ResponseCreateParamsNonStreaming,
    ResponseCreateParamsStreaming,
)
from pydantic import TypeAdapter

_BEDROCK_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def _materialize(value: Any) -> Any:
    """``value`` with every lazily validated iterator consumed (and so validated)."""
    if isinstance(value, Mapping):
        return {key: _materialize(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_materialize(item) for item in value]
    if isinstance(value, Iterator):
        return [_materialize(item) for item in value]
    return value


@cache
def _adapter(kind: str, stream: bool) -> TypeAdapter[Any]:
    if kind == "chat":
        return TypeAdapter(
            CompletionCreateParamsStreaming if stream else CompletionCreateParamsNonStreaming
        )
    return TypeAdapter(
        ResponseCreateParamsStreaming if stream else ResponseCreateParamsNonStreaming
    )


def _validate_openai(kind: str, body: dict[str, Any]) -> None:
    # A streamed request (every turn streams into its draft) has its own type.
    validated = _materialize(_adapter(kind, body.get("stream") is True).validate_python(body))
    assert validated == body, f"keys or values the {kind} request type does not know: {body}"


def validate_chat_request(body: dict[str, Any]) -> None:
    """Fail unless ``body`` is a ``POST /chat/completions`` body the ``openai`` package types."""
    _validate_openai("chat", body)


def validate_responses_request(body: dict[str, Any]) -> None:
    """Fail unless ``body`` is a valid ``POST /responses`` body for the ``openai`` package."""
    _validate_openai("responses", body)


@cache
def _converse_shape() -> Any:
    model = botocore.session.get_session().get_service_model("bedrock-runtime")
    return model.operation_model("Converse").input_shape


def validate_converse_request(params: dict[str, Any]) -> None:
    """Fail unless ``params`` are valid ``converse`` parameters by botocore's service model.

    Also checks what botocore leaves to the service: tool use ids and tool
    names match ``[a-zA-Z0-9_-]{1,64}``, text blocks are not blank, and user
    and assistant messages alternate, starting with a user message.
    """
    validate_parameters(params, _converse_shape())
    roles = [message["role"] for message in params["messages"]]
    assert roles and roles[0] == "user", roles
    assert all(a != b for a, b in pairwise(roles)), roles
    for message in params["messages"]:
        for block in message["content"]:
            if "text" in block:
                assert block["text"].strip(), params
            for key in ("toolUse", "toolResult"):
                if key in block:
                    assert _BEDROCK_ID.fullmatch(block[key]["toolUseId"]), block
            if "toolUse" in block:
                assert _BEDROCK_ID.fullmatch(block["toolUse"]["name"]), block
    for tool in params.get("toolConfig", {}).get("tools", []):
        assert _BEDROCK_ID.fullmatch(tool["toolSpec"]["name"]), tool
