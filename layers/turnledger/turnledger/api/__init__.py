"""The HTTP API (Powertools event handler) and the Lambda entry point of its functions.

Importing this package imports :mod:`.app` (the resolver of :mod:`.resolver` with
every route module registered on it): a Lambda function imports it during its init
phase, so no request pays for it. ``app`` is the resolver.

This package is the HTTP edge: request and response bodies, views, SSE framing and
error shapes live here, and nothing outside it imports it (tests/unit/test_layering.py).
"""

from __future__ import annotations

import sys
import types

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver

from .app import lambda_handler


class _Package(types.ModuleType):
    """This package, whose ``app`` is always the resolver, never the submodule of that name.

    Importing ``turnledger.api.app`` makes the import system set the package's ``app``
    attribute to the submodule; a property with a setter keeps ``app`` the resolver.
    """

    @property
    def app(self) -> APIGatewayHttpResolver:
        """The API's resolver (``turnledger.api.app.app``)."""
        from .app import app

        return app

    @app.setter
    def app(self, _submodule: object) -> None:
        # The import system records the submodule here; ``app`` stays the resolver.
        pass


sys.modules[__name__].__class__ = _Package

__all__ = ["app", "lambda_handler"]
