"""A deferred model is built by one thread at a time.

Pydantic's ``model_rebuild`` is not thread-safe before 2.14: first uses of a deferred
model from several threads at once could validate with the parent model's validator (a
replay over every conversation of a tenant once refused a record's every field as
"extra"). :class:`~turnledger.core.models.Deferred` builds under a lock.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from turnledger.core.models import Deferred

from tests.support.concurrency import all_at_once


class _Base(Deferred):
    model_config = ConfigDict(extra="forbid")


def test_concurrent_first_uses_build_the_model_once_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Record(_Base):
        id: str
        turns: int = 0

    inside = 0
    most = 0
    guard = threading.Lock()
    build = BaseModel.model_rebuild.__func__  # type: ignore[attr-defined]

    def slow_build(cls: type[BaseModel], **options: Any) -> bool | None:
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
        time.sleep(0.02)  # long enough for every other thread to arrive
        try:
            return build(cls, **options)  # type: ignore[no-any-return]
        finally:
            with guard:
                inside -= 1

    monkeypatch.setattr(BaseModel, "model_rebuild", classmethod(slow_build))
    records = all_at_once(8, lambda _: Record(id="rp_1", turns=2))
    assert most == 1
    assert [r.model_dump() for r in records] == [{"id": "rp_1", "turns": 2}] * 8
