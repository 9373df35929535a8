"""Driving ``turnledger`` commands in their own processes."""

from __future__ import annotations

import os
import selectors
import subprocess

import pytest


def read_until(process: subprocess.Popen[bytes], marker: str, timeout: float = 60) -> str:
    """Output of ``process`` up to ``marker``; fails after ``timeout`` seconds of silence."""
    assert process.stdout is not None
    # Unbuffered reads of the pipe itself: a buffered reader could hold the marker while
    # select() waits on an empty pipe.
    descriptor = process.stdout.fileno()
    seen = b""
    with selectors.DefaultSelector() as selector:
        selector.register(descriptor, selectors.EVENT_READ)
        while marker.encode() not in seen:
            if not selector.select(timeout):
                pytest.fail(f"no {marker!r} within {timeout} s: {seen.decode(errors='replace')}")
            chunk = os.read(descriptor, 65536)
            if not chunk:
                pytest.fail(f"exited with {process.wait()}: {seen.decode(errors='replace')}")
            seen += chunk
    return seen.decode(errors="replace")
