"""Fixtures shared by the provider tests: the fake OpenAI server and a recorder of retry waits."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.functional.fake_openai import FakeOpenAI
from tests.support.providers import Sleeps


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    """A fake OpenAI-compatible server on a free local port (a module may override it)."""
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def sleeps() -> Sleeps:
    """A provider's ``sleep``: each retry's wait is recorded, none is waited."""
    return Sleeps()
