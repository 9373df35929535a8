"""Which route modules each API function of ``template.yaml`` loads, and its entry point.

A route module registers its routes on the resolver when imported. An API function
(``functions/<name>/app.py``) calls :func:`serve` with its name during its init: it
imports only the route modules listed for it in :data:`ROUTES`, so its cold start
loads no module that only another function's routes need (the approve function never
loads the OpenAI face, the memory or the streaming routes). The local runner and the
tests use :func:`serve_every_route` (``turnledger.api.lambda_handler``): one resolver
with every route.

**A new route** goes in a route module listed under the function that
``template.yaml`` routes its path to; a new route module is one more name in that
function's entry of :data:`ROUTES` (``tests/unit/test_cold_import.py`` checks that each
function registers every route the template gives it).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from .app import AHEAD_OF_REQUESTS, lambda_handler, prepare_routes
from .live import StreamingHandler, streaming

#: The route modules (of this package) each API function imports, by its folder name.
ROUTES: dict[str, tuple[str, ...]] = {
    "turn": (
        "routes",
        "turn_routes",
        "openai.conversations",
        "openai.responses",
        "openai.chat",
        "memory_routes",
        "replay_routes",
        "compact_routes",
        "policy_routes",
        "pin_routes",
        "user_pin_routes",
    ),
    "approve": ("routes", "turn_routes", "waits"),
    # The OpenAI face's reads, deletes and catch-all need its Conversations API only.
    "read": (
        "routes",
        "openai.conversations",
        "memory_routes",
        "streaming_routes",
        "replay_routes",
        "state_routes",
    ),
    "clear": ("routes", "openai.conversations", "memory_routes"),
    # Streamed answers (its function URL): a turn with Accept: text/event-stream and the
    # face's stream: true; any other request to it is answered whole, as the API would.
    "stream": ("routes", "turn_routes", "openai.conversations", "openai.responses"),
}
#: The API functions whose routes take an ``Idempotency-Key`` (a turn, an approval): where
#: init runs ahead of requests, it loads the idempotency module (Powertools' idempotency,
#: which imports boto3) that a keyed request would otherwise load on its first.
KEYED = frozenset({"turn", "approve", "stream"})
#: Every route module: the local runner's and the OpenAPI document's.
EVERY_ROUTE = tuple(sorted({module for modules in ROUTES.values() for module in modules}))

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


def register(modules: tuple[str, ...]) -> None:
    """Import ``modules`` (route modules of this package): each registers its routes once."""
    for module in modules:
        importlib.import_module(f"{__package__}.{module}")


def serve(function: str) -> Handler:
    """The entry point of the API function ``function`` (a key of :data:`ROUTES`), its
    routes registered; where init runs ahead of requests (SnapStart, provisioned
    concurrency) their request models are built too (:func:`.app.prepare_routes`), and
    the :data:`KEYED` functions load the idempotency module.

    Raises:
        KeyError: ``function`` is no API function.
    """
    register(ROUTES[function])
    if os.environ.get("AWS_LAMBDA_INITIALIZATION_TYPE") in AHEAD_OF_REQUESTS:
        prepare_routes()
        if function in KEYED:
            importlib.import_module(f"{__package__}.idempotency_records")
    return lambda_handler


def serve_streaming(function: str) -> StreamingHandler:
    """The entry point of a streaming function (:func:`.live.streaming` over :func:`serve`).

    Raises:
        KeyError: ``function`` is no API function.
    """
    return streaming(serve(function))


def serve_every_route() -> Handler:
    """The entry point with every route of every API function registered."""
    register(EVERY_ROUTE)
    return lambda_handler
