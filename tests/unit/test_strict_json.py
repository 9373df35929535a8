"""The strict parser refuses what Python's own would accept or crash on: a key twice,
lone surrogates, nesting past the limit, with a message that quotes no unbounded input."""

from __future__ import annotations

import pytest
from turnledger.core.strict_json import MAX_DEPTH, BodyError, parse, parse_object


@pytest.mark.parametrize(
    "text",
    ['{"a": 1, "a": 1}', '{"a": 1, "b": {"c": 2, "c": 3}}', '[{"x": [], "x": []}]'],
)
def test_a_key_twice_in_one_object_is_refused(text: str) -> None:
    with pytest.raises(BodyError, match="appears twice in one object"):
        parse(text)


def test_equal_keys_of_different_objects_are_fine() -> None:
    assert parse_object('{"a": {"k": 1}, "b": {"k": 2}}') == {"a": {"k": 1}, "b": {"k": 2}}


def test_a_long_repeated_key_is_quoted_cut() -> None:
    key = "k" * 100_000
    with pytest.raises(BodyError) as refused:
        parse(f'{{"{key}": 1, "{key}": 2}}')
    assert len(str(refused.value)) < 100


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"x": "\\ud800"}', "lone surrogate"),
        ('{"\\udfff": 1}', "lone surrogate"),
        ("[" * 100_000, f"the answer nests deeper than {MAX_DEPTH} levels"),
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), f"nests deeper than {MAX_DEPTH}"),
        ("{", "the answer is not JSON: expecting property name"),
    ],
)
def test_what_no_store_can_keep_is_refused_naming_the_document(text: str, reason: str) -> None:
    with pytest.raises(BodyError, match=reason):
        parse(text, "the answer")


def test_a_wrapping_document_may_nest_deeper() -> None:
    text = "[" * (MAX_DEPTH + 8) + "]" * (MAX_DEPTH + 8)
    assert parse(text, max_depth=MAX_DEPTH + 8) is not None
