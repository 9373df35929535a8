"""Backoff between attempts, shared by every provider that retries.

A wait is what the server asked for (``Retry-After``), capped; else an
exponential backoff with jitter: attempt ``n`` waits
``min(backoff * 2 ** (n - 1), cap) * (0.5 + jitter / 2)``, so concurrent
clients spread out instead of retrying in step.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Backoff:
    """How long to wait before the next attempt, and the waiting itself.

    Attributes:
        backoff_seconds: the first backoff; it doubles on each retry.
        max_backoff_seconds: cap of any wait, a server's ``Retry-After`` included.
        sleep: waits (tests pass a recorder).
        jitter: a number in ``[0, 1)``; a wait is ``backoff * (0.5 + jitter / 2)``.
    """

    backoff_seconds: float = 0.5
    max_backoff_seconds: float = 8.0
    sleep: Callable[[float], None] = field(default=time.sleep)
    jitter: Callable[[], float] = field(default=random.random)

    def delay(self, attempt: int, asked: float | None = None) -> float:
        """Seconds before attempt ``attempt + 1``: what the server asked, else backoff."""
        if asked is not None:
            return min(asked, self.max_backoff_seconds)
        ceiling = min(self.backoff_seconds * 2.0 ** (attempt - 1), self.max_backoff_seconds)
        return ceiling * (0.5 + self.jitter() / 2)

    def wait(self, attempt: int, asked: float | None = None) -> None:
        """Sleep :meth:`delay` seconds."""
        self.sleep(self.delay(attempt, asked))
