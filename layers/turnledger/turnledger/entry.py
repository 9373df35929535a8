"""Lambda entry points that load their handler on the first request, not at import.

Lambda imports a function's handler module before its first request (the init
phase) and the caller waits for it. The API's resolver (Powertools' event handler
with its OpenAPI and pydantic models), the service, the providers and the tool
executors take several times as long to import as ``boto3`` alone, so a handler
module imports only this module and :func:`deferred` imports the real handler
when the first event arrives (``make bench`` reports that first request's extra
set-up separately).

Where the init phase runs ahead of any request (SnapStart's snapshot,
provisioned concurrency), deferring would only move work onto a waiting caller:
there the handler is loaded at import, as before.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from typing import Any

#: ``AWS_LAMBDA_INITIALIZATION_TYPE`` values whose init phase no caller waits for.
EAGER_INITIALIZATION = frozenset({"snap-start", "provisioned-concurrency"})

Handler = Callable[[Any, Any], Any]


class DeferredHandler:
    """A Lambda handler that imports ``module`` and calls its ``name`` on the first event."""

    def __init__(self, module: str, name: str = "lambda_handler") -> None:
        """Remember what to load; load it now where init runs ahead of requests."""
        self.module = module
        self.name = name
        self._handler: Handler | None = None
        # The local runner may call one handler from several threads: import once.
        self._lock = threading.Lock()
        self.__doc__ = f"The Lambda entry point: ``{module}.{name}``, imported on first use."
        if os.environ.get("AWS_LAMBDA_INITIALIZATION_TYPE") in EAGER_INITIALIZATION:
            self.load()

    def load(self) -> Handler:
        """Import the handler (once) and return it.

        A process that forks environments from one initialized parent (the local
        runner's zygote) calls this before forking, as SnapStart would snapshot it.
        """
        with self._lock:
            if self._handler is None:
                handler = getattr(importlib.import_module(self.module), self.name)
                if not callable(handler):
                    raise TypeError(f"{self.module}.{self.name} is not callable")
                self._handler = handler
            return self._handler

    def __call__(self, event: Any, context: Any) -> Any:
        """Handle one event with the loaded handler."""
        handler = self._handler or self.load()
        return handler(event, context)


def deferred(module: str, name: str = "lambda_handler") -> DeferredHandler:
    """A Lambda handler that imports ``module`` and calls its ``name`` on the first event.

    Loaded at once instead when the environment is initialized ahead of requests
    (see :data:`EAGER_INITIALIZATION`).
    """
    return DeferredHandler(module, name)
