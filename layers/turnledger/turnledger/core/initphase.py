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

The init also turns pydantic's plugins off (``PYDANTIC_DISABLE_PLUGINS=__all__``, unless
the environment sets it): otherwise the first model built reads every installed
distribution's entry points looking for one, and none is deployed. It is set here, before
pydantic is imported, rather than in the template's environment, which Lambda caps at
4 KB; a deployment that adds a plugin (Logfire's, say) sets the variable to its names.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def init_phase() -> Iterator[None]:
    """Run the block (a function's init) with the collector paused, then freeze what it
    built and resume collecting as before; resumes even when the block raises."""
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
