"""A clock the local runner's functions read from a file: tests move time across processes.

The functions run in worker processes (``workers.py``), so a test cannot hand
them a clock object. With ``LocalConfig(clock_file=...)`` every function reads
the current instant from that file instead; :class:`ClockFile` is the
test's side of it::

    clock = ClockFile(tmp_path / "clock")           # starts at a fixed instant
    with LocalRunner(LocalConfig(clock_file=clock.path)) as runner:
        ...
        clock.advance(3600)                          # every worker sees it at once

Local only: a deployed function never reads a clock file.
"""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path


class FileClock:
    """The functions' side: ``now()`` is the instant written in ``path`` (ISO 8601, UTC)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self) -> datetime:
        """The instant in the file.

        Raises:
            OSError: the file cannot be read.
            ValueError: it holds no ISO 8601 instant with a time zone.
        """
        instant = datetime.fromisoformat(self.path.read_text(encoding="utf-8").strip())
        if instant.tzinfo is None:
            raise ValueError(f"{self.path}: the instant has no time zone")
        return instant.astimezone(UTC)


class ClockFile:
    """The driver's side: sets and moves the instant every function reads."""

    def __init__(self, path: Path, start: datetime) -> None:
        self.path = path
        self.current = start
        self._write()

    def now(self) -> datetime:
        """The instant the functions see."""
        return self.current

    def __call__(self) -> datetime:
        """``now()``: usable wherever a ``Callable[[], datetime]`` clock is taken."""
        return self.current

    def set(self, instant: datetime) -> datetime:
        """Move to ``instant`` (timezone-aware)."""
        if instant.tzinfo is None:
            raise ValueError("the instant needs a time zone")
        self.current = instant
        self._write()
        return self.current

    def advance(self, seconds: float) -> datetime:
        """Move forward by ``seconds``; returns the new instant."""
        return self.set(self.current + timedelta(seconds=seconds))

    def _write(self) -> None:
        # Replaced whole, never rewritten in place: a reader sees the old or the new instant.
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".clock-")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(self.current.isoformat())
        os.replace(temporary, self.path)
