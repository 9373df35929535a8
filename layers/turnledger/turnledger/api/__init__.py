"""The HTTP API (Powertools event handler) and the Lambda entry point of its functions."""

from .app import app, lambda_handler

__all__ = ["app", "lambda_handler"]
