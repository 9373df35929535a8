"""The HTTP API (Powertools event handler) and the Lambda entry point of its functions.

Importing this package is cheap: :data:`lambda_handler` loads :mod:`.app` (the
resolver of :mod:`.resolver` with every route module registered on it) on the
first request (see :mod:`turnledger.entry`), and ``app`` (the resolver) is loaded
on first access.

This package is the HTTP edge: request and response bodies, views, SSE framing and
error shapes live here, and nothing outside it imports it (tests/unit/test_layering.py).
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING

from ..entry import deferred

if TYPE_CHECKING:
    from aws_lambda_powertools.event_handler import APIGatewayHttpResolver

lambda_handler = deferred("turnledger.api.app")


class _Package(types.ModuleType):
    """This package, whose ``app`` is always the resolver, never the submodule of that name.

    Importing ``turnledger.api.app`` makes the import system set the package's ``app``
    attribute to the submodule; a property with a setter keeps ``app`` the resolver.
    """

    @property
    def app(self) -> APIGatewayHttpResolver:
        """The API's resolver (``turnledger.api.app.app``), imported on first access."""
        from .app import app

        return app

    @app.setter
    def app(self, _submodule: object) -> None:
        # The import system records the submodule here; ``app`` stays the resolver.
        pass


sys.modules[__name__].__class__ = _Package

__all__ = ["app", "lambda_handler"]
