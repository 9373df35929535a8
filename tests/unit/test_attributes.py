"""The store's DynamoDB attribute values match boto3's ``boto3.dynamodb.types`` (which the
functions no longer import)."""

from __future__ import annotations

from decimal import Decimal, Inexact
from typing import Any

import pytest
from boto3.dynamodb.types import Binary, TypeDeserializer, TypeSerializer
from turnledger.store.attributes import deserialize, serialize

VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -7,
    2**62,
    Decimal("1.5"),
    Decimal("-0.000123"),
    Decimal("1E+20"),
    "",
    "héllo",
    b"\x00\xffsealed",
    bytearray(b"ab"),
    {1, 2, Decimal("3.25")},
    {"a", "b"},
    {b"x", b"y"},
    set(),
    [1, "two", None, [True, {"k": Decimal("2.5")}]],
    ("t", 1),
    {"m": {"n": 1, "s": "x", "l": [], "e": {}}, "b": False},
]


def _id(value: Any) -> str:
    """A test id that is the same in every process (xdist workers must agree): sets sorted
    by their members' reprs, bare objects by type, never an address or a hash order."""
    if isinstance(value, set | frozenset):
        return "{" + ", ".join(sorted(map(repr, value))) + "}" if value else "set()"
    if type(value) is object:
        return "object()"
    return repr(value)


@pytest.mark.parametrize("value", VALUES, ids=_id)
def test_values_are_written_as_boto3_writes_them(value: Any) -> None:
    assert serialize(value) == TypeSerializer().serialize(value)


def _plain(value: Any) -> Any:
    """boto3's ``Binary`` as bytes: the one difference."""
    if isinstance(value, Binary):
        return bytes(value.value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, set):
        return {_plain(v) for v in value}
    return value


@pytest.mark.parametrize("value", VALUES, ids=_id)
def test_values_are_read_as_boto3_reads_them(value: Any) -> None:
    wire = TypeSerializer().serialize(value)
    assert deserialize(wire) == _plain(TypeDeserializer().deserialize(wire))


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (1.5, TypeError),
        (Decimal("Infinity"), TypeError),
        (Decimal("NaN"), TypeError),
        (Decimal("1." + "1" * 40), Inexact),
        (object(), TypeError),
        ({1, "a"}, TypeError),
    ],
    ids=_id,
)
def test_what_boto3_refuses_is_refused(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        TypeSerializer().serialize(value)
    with pytest.raises(error):
        serialize(value)


def test_an_unknown_or_empty_attribute_is_refused() -> None:
    for wire in ({}, {"X": 1}):
        with pytest.raises(TypeError):
            deserialize(wire)
