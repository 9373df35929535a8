"""The HTTP API (Powertools event handler) and the Lambda entry point of its functions.

Importing this package imports nothing else: each API function imports its own routes
(:func:`.functions.serve`). ``lambda_handler`` and ``app`` (the resolver) here come
with every route registered (:func:`.functions.serve_every_route`): what the local
runner and the tests serve from one process.

This package is the HTTP edge: request and response bodies, views, SSE framing and
error shapes live here, and nothing outside it imports it (tests/unit/test_layering.py).
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aws_lambda_powertools.event_handler import APIGatewayHttpResolver


class _Package(types.ModuleType):
    """This package, whose ``app`` is always the resolver (never the submodule of that
    name) and whose ``app`` and ``lambda_handler`` have every route registered.

    Importing ``turnledger.api.app`` makes the import system set the package's ``app``
    attribute to the submodule; a property with a setter keeps ``app`` the resolver.
    """

    @property
    def app(self) -> APIGatewayHttpResolver:
        """The API's resolver (``turnledger.api.app.app``), with every route registered."""
        from .app import app
        from .functions import serve_every_route

        serve_every_route()
        return app

    @app.setter
    def app(self, _submodule: object) -> None:
        # The import system records the submodule here; ``app`` stays the resolver.
        pass

    @property
    def lambda_handler(self) -> Any:
        """The entry point of the API functions, with every route registered."""
        from .functions import serve_every_route

        return serve_every_route()


sys.modules[__name__].__class__ = _Package

__all__ = ["app", "lambda_handler"]
