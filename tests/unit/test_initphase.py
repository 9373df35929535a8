"""A function's init runs with the garbage collector paused, and what it built is frozen.

``turnledger.core.initphase.init_phase`` wraps each handler module's init
(``functions/*/app.py``): ``make bench`` (*Cold start*) measures what the paused
collector saves; these tests check the state it leaves the collector in.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from turnledger.core.initphase import init_phase


@pytest.fixture(autouse=True)
def _collector_as_found() -> Iterator[None]:
    """Leave the test process's collector as it was: enabled, nothing frozen."""
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_the_block_runs_without_collections_and_what_it_built_is_frozen() -> None:
    gc.enable()
    gc.unfreeze()
    with init_phase():
        assert not gc.isenabled()
        built = [[i] for i in range(1000)]  # tracked containers, as init builds
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(built)


def test_the_collector_resumes_when_the_init_fails() -> None:
    gc.enable()
    with pytest.raises(RuntimeError, match="settings"), init_phase():
        raise RuntimeError("bad settings")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with init_phase():
        pass
    assert not gc.isenabled()
    assert gc.get_freeze_count() > 0
