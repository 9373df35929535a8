"""Call ids mapped to what each provider accepts, deterministically and both ways."""

from __future__ import annotations

from turnledger.providers.call_ids import (
    BEDROCK_CALL_ID,
    OPENAI_CHAT_CALL_ID,
    CallIdMap,
)


def test_acceptable_ids_are_kept() -> None:
    ids = CallIdMap(BEDROCK_CALL_ID, unique=True)

    assert ids.call("tooluse_Ab-1") == "tooluse_Ab-1"
    assert ids.result("tooluse_Ab-1") == "tooluse_Ab-1"
    assert ids.canonical("tooluse_Ab-1") == "tooluse_Ab-1"


def test_refused_ids_are_derived_and_map_back() -> None:
    ids = CallIdMap(BEDROCK_CALL_ID)

    wire = ids.call("call.x:1")

    assert BEDROCK_CALL_ID.fullmatch(wire) and wire.startswith("tl_")
    assert ids.result("call.x:1") == wire
    assert ids.canonical(wire) == "call.x:1"


def test_the_mapping_is_deterministic() -> None:
    one, other = CallIdMap(OPENAI_CHAT_CALL_ID), CallIdMap(OPENAI_CHAT_CALL_ID)
    long_id = "call_" + "9" * 60

    assert one.call(long_id) == other.call(long_id) != long_id
    assert len(one.result(long_id)) <= 40


def test_a_repeated_id_gets_a_new_wire_id_only_where_ids_must_be_unique() -> None:
    unique, lenient = CallIdMap(BEDROCK_CALL_ID, unique=True), CallIdMap(BEDROCK_CALL_ID)

    first = unique.call("call_1")
    second = unique.call("call_1")

    assert first == "call_1" and second != first
    assert unique.result("call_1") == second  # a result answers the latest call
    assert unique.canonical(second) == "call_1"
    assert lenient.call("call_1") == lenient.call("call_1") == "call_1"


def test_a_result_without_a_call_is_mapped_the_same_way() -> None:
    ids = CallIdMap(BEDROCK_CALL_ID)

    assert ids.result("ok_id") == "ok_id"
    assert ids.result("bad id") == CallIdMap(BEDROCK_CALL_ID).call("bad id")
