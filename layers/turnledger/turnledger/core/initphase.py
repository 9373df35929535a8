"""Lambda's init phase without the cyclic garbage collector.

Loading the layer (its modules, pydantic's models, botocore's service models) and
building the runtime allocate several hundred thousand objects that live as long as the
process. With the collector on, every few hundred of those allocations start a
collection that walks them again: about a tenth of a function's init (``make bench``,
*Cold start*), and later a full collection still walks every one of them. So a
function's handler module runs its init inside :func:`init_phase`: no collection while
it runs, and what it built is then moved to the collector's permanent generation
(:func:`gc.freeze`), which no later collection walks.

The cost: garbage cycles made during init are frozen with the rest and never freed. They
are made once per execution environment and do not grow with requests. Nothing else of
turnledger is imported here: the handler module imports this before the layer.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def init_phase() -> Iterator[None]:
    """Run the block (a function's init) with the collector paused, then freeze what it
    built and resume collecting as before; resumes even when the block raises."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
