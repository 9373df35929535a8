"""Lambda entry point for POST /v1/conversations/{id}/turns.

All logic lives in the layer; API Gateway routes only this function's paths here.
"""

from turnledger.api import lambda_handler

__all__ = ["lambda_handler"]
