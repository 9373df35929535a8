"""Strict parsing of JSON from outside: any bytes get a clear answer, never a crash.

Every byte that crosses into the ledger from outside is read here: request bodies
(callbacks' too), a model's tool arguments (:func:`tool_arguments`), a tool's answer
and the ``202`` body of a deferred one (:mod:`turnledger.tools.calls`, a ``lambda``
tool's payload too), and the lines of an import (:mod:`turnledger.ops.transfer`).
A document must be UTF-8 JSON (RFC 8259 section 8.1) within these limits:

- nesting at most :data:`MAX_DEPTH` arrays and objects deep;
- every number at most :data:`MAX_NUMBER_CHARS` characters long and finite as
  a double (``1e400``, ``NaN`` and ``Infinity`` are refused);
- every string (keys too) valid Unicode: no lone surrogate such as ``"\\ud800"``,
  which no UTF-8 encoder can store;
- no key twice in one object (RFC 8259 section 4 leaves its meaning to each
  parser: one reader would take the first, another the last).

Python's own parser would instead raise ``RecursionError`` on deep nesting,
``ValueError`` on integers over 4,300 digits, keep the last of two equal keys, and
accept lone surrogates and ``NaN`` that break later, far from the request.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

#: How deep arrays and objects may nest in a request body.
MAX_DEPTH = 64
#: The longest number literal accepted, in characters.
MAX_NUMBER_CHARS = 64

#: How messages name a model's tool arguments.
_ARGUMENTS = "the arguments' JSON"
#: Characters of a repeated key quoted in the refusal (the rest is cut).
_QUOTED_KEY_CHARS = 40

_SURROGATE = re.compile(r"[\ud800-\udfff]")


class BodyError(ValueError):
    """The body is not a JSON object within the limits; the message says why."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details: dict[str, Any] = details


def _number(literal: str) -> int | float:
    if len(literal) > MAX_NUMBER_CHARS:
        raise BodyError(
            f"a number is longer than {MAX_NUMBER_CHARS} characters",
            limit=MAX_NUMBER_CHARS,
        )
    if any(mark in literal for mark in ".eE"):
        value = float(literal)
        if not math.isfinite(value):
            raise BodyError("a number is out of range")
        return value
    return int(literal)


def _constant(name: str) -> Any:
    raise BodyError(f"{name} is not JSON")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's members, refused when a key comes twice."""
    document = dict(pairs)
    if len(document) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                # Cut, and escaped by repr: the refusal never echoes unbounded input.
                cut = key[:_QUOTED_KEY_CHARS] + ("..." if len(key) > _QUOTED_KEY_CHARS else "")
                quoted = repr(cut)
                raise BodyError(f"the key {quoted} appears twice in one object")
            seen.add(key)
    return document


def _check(document: Any, what: str = "the body", max_depth: int = MAX_DEPTH) -> None:
    """Walk ``document`` without recursion: depth and strings."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                raise BodyError("a string holds a lone surrogate (invalid Unicode)")
            continue
        if not isinstance(value, dict | list):
            continue
        if depth > max_depth:
            raise BodyError(f"{what} nests deeper than {max_depth} levels", limit=max_depth)
        if isinstance(value, dict):
            for key, item in value.items():
                stack.append((key, depth))
                stack.append((item, depth + 1))
        else:
            stack.extend((item, depth + 1) for item in value)


def parse(body: bytes | str, what: str = "the body", *, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON document in ``body``, checked against the limits above (``what`` names it
    in the messages; ``max_depth`` replaces :data:`MAX_DEPTH` for a document that wraps
    others, as an import's line wraps an event).

    Raises:
        BodyError: not UTF-8, not JSON, or over a limit.
    """
    if isinstance(body, bytes):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BodyError(f"{what} is not UTF-8 text") from exc
    else:
        text = body
    try:
        document = json.loads(
            text,
            parse_int=_number,
            parse_float=_number,
            parse_constant=_constant,
            object_pairs_hook=_object,
        )
    except RecursionError as exc:
        raise BodyError(f"{what} nests deeper than {max_depth} levels", limit=max_depth) from exc
    except BodyError:
        raise
    except json.JSONDecodeError as exc:
        # Where it broke, in the editor's terms (line and column from 1) and as an offset.
        reason = exc.msg[:1].lower() + exc.msg[1:]
        raise BodyError(
            f"{what} is not JSON: {reason} at line {exc.lineno}, column {exc.colno}",
            line=exc.lineno,
            column=exc.colno,
            position=exc.pos,
        ) from exc
    except ValueError as exc:
        raise BodyError(f"{what} is not JSON") from exc
    _check(document, what, max_depth)
    return document


def parse_object(body: bytes | str) -> dict[str, Any]:
    """Like :func:`parse`, for a body that must be a JSON object.

    Raises:
        BodyError: as :func:`parse`, or the document is not an object.
    """
    document = parse(body)
    if not isinstance(document, dict):
        raise BodyError("the body must be a JSON object")
    return document


def tool_arguments(raw: str | dict[str, Any] | None) -> tuple[dict[str, Any], str | None]:
    """A model's tool-call arguments, held to a request body's limits.

    ``raw`` is the provider's argument text, or the object its own parser made.
    Returns ``(arguments, None)`` for a JSON object within the limits (nothing or blank
    text is ``{}``), else ``({}, text)``: the call keeps ``text`` as its raw arguments
    and is answered with the error of :func:`arguments_refusal` instead of running.
    """
    if raw is None:
        return {}, None
    if isinstance(raw, dict):
        try:
            _check(raw, _ARGUMENTS)
        except BodyError:
            try:
                return {}, json.dumps(raw, ensure_ascii=False)
            except (RecursionError, ValueError):
                return {}, f"(an object nested deeper than {MAX_DEPTH} levels)"
        return raw, None
    if not raw.strip():
        return {}, None
    try:
        parsed = parse(raw, _ARGUMENTS)
    except BodyError:
        return {}, raw
    return (parsed, None) if isinstance(parsed, dict) else ({}, raw)


def arguments_refusal(raw: str) -> str:
    """Why raw tool arguments that :func:`tool_arguments` refused were refused: the limit
    they are over, else that they are no JSON object."""
    try:
        parse(raw, _ARGUMENTS)
    except BodyError as exc:
        if "limit" in exc.details:
            return str(exc)
    return "the arguments were not a JSON object"
