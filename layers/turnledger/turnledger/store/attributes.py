"""DynamoDB attribute values (the wire's ``{"S": ...}``) to and from Python values.

The conversions of boto3's ``boto3.dynamodb.types`` (the same types, the same number
context, the same errors), without importing boto3, whose import loads s3transfer: the
store's clients are botocore's (:mod:`turnledger.core.aws`). One difference: a binary
value reads back as ``bytes`` (boto3 wraps it in its ``Binary``).
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from decimal import Clamped, Context, Decimal, Inexact, Overflow, Rounded, Underflow
from typing import Any

#: DynamoDB's numbers: 38 digits, exponents -128..126; anything else raises.
NUMBERS = Context(
    Emin=-128, Emax=126, prec=38, traps=[Clamped, Overflow, Inexact, Rounded, Underflow]
)


def _number(value: int | Decimal) -> str:
    number = str(NUMBERS.create_decimal(value))
    if number in ("Infinity", "NaN"):
        raise TypeError("Infinity and NaN not supported")
    return number


def _is_number(value: Any) -> bool:
    if isinstance(value, float):
        raise TypeError("Float types are not supported. Use Decimal types instead.")
    return isinstance(value, int | Decimal) and not isinstance(value, bool)


def _set_type(value: Set[Any]) -> str | None:
    # An empty set passes the first test, as in boto3 (DynamoDB refuses it).
    for code, test in (("NS", _is_number), ("SS", _is_str), ("BS", _is_bytes)):
        if all(test(member) for member in value):
            return code
    return None


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_bytes(value: Any) -> bool:
    return isinstance(value, bytes | bytearray)


def serialize(value: Any) -> dict[str, Any]:
    """``value`` as a DynamoDB attribute value: ``None`` NULL, ``bool`` BOOL, ``int`` and
    ``Decimal`` N, ``str`` S, ``bytes`` B, sets of one of these NS/SS/BS, mappings M,
    lists and tuples L.

    Raises:
        TypeError: a float (use ``Decimal``), infinity or NaN, or an unsupported type.
        decimal.Inexact, decimal.Rounded...: a number DynamoDB cannot hold exactly.
    """
    if value is None:
        return {"NULL": True}
    if isinstance(value, bool):
        return {"BOOL": value}
    if _is_number(value):
        return {"N": _number(value)}
    if isinstance(value, str):
        return {"S": value}
    if _is_bytes(value):
        return {"B": value}
    if isinstance(value, Set):
        code = _set_type(value)
        if code == "NS":
            return {"NS": [_number(member) for member in value]}
        if code is not None:
            return {code: list(value)}
    elif isinstance(value, Mapping):
        return {"M": {key: serialize(member) for key, member in value.items()}}
    elif isinstance(value, list | tuple):
        return {"L": [serialize(member) for member in value]}
    raise TypeError(f'Unsupported type "{type(value)}" for value "{value}"')


def deserialize(attribute: Mapping[str, Any]) -> Any:
    """The Python value of a DynamoDB attribute value (numbers as ``Decimal``).

    Raises:
        TypeError: not one attribute value of a known type.
    """
    if not attribute:
        raise TypeError("Value must be a nonempty dictionary whose key is a valid dynamodb type.")
    code, value = next(iter(attribute.items()))
    match code:
        case "NULL":
            return None
        case "BOOL" | "S":
            return value
        case "N":
            return NUMBERS.create_decimal(value)
        case "B":
            return bytes(value)
        case "NS":
            return {NUMBERS.create_decimal(member) for member in value}
        case "SS":
            return set(value)
        case "BS":
            return {bytes(member) for member in value}
        case "L":
            return [deserialize(member) for member in value]
        case "M":
            return {key: deserialize(member) for key, member in value.items()}
    raise TypeError(f"Dynamodb type {code} is not supported")
