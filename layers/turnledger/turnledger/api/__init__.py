"""The HTTP API (Powertools event handler) and the Lambda entry point of its functions."""

from . import openai_face  # noqa: F401  (registers the /openai/v1 routes on ``app``)
from .app import app, lambda_handler

__all__ = ["app", "lambda_handler"]
