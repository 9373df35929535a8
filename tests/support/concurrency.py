"""Run one function on many threads at once and see every outcome.

A bare ``threading.Thread`` whose target raises only prints a warning: the test
goes on and may pass with requests that never got an answer. :func:`all_at_once` joins
every thread, re-raises the first failure and returns every result, in order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


def all_at_once[T](count: int, work: Callable[[int], T], *, timeout: float = 120) -> list[T]:
    """Call ``work(0) ... work(count - 1)`` on ``count`` threads released together.

    Returns every result in index order. Raises the first exception a thread raised
    (after all have ended), or ``AssertionError`` naming how many raised.
    """
    go = threading.Barrier(count, timeout=timeout)

    def released(index: int) -> T:
        go.wait()
        return work(index)

    with ThreadPoolExecutor(max_workers=count) as pool:
        futures = [pool.submit(released, index) for index in range(count)]
        errors = [error for future in futures if (error := future.exception(timeout)) is not None]
    if errors:
        raise AssertionError(f"{len(errors)} of {count} threads raised") from errors[0]
    results = [future.result() for future in futures]
    assert len(results) == count
    return results
