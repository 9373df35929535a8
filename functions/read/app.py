"""Lambda entry point for the GET routes.

GET /v1/conversations/{id}, GET /v1/conversations/{id}/events and GET /v1/openapi.json;
GET /v1/approvals (the tenant's approval inbox) and GET /approvals (its web page).

All logic lives in the layer; API Gateway routes only this function's paths here. The
import is Lambda's init phase: it builds what every request needs (see
:func:`turnledger.runtime.prepare`).
"""

from turnledger.api import lambda_handler
from turnledger.runtime import prepare

prepare()

__all__ = ["lambda_handler"]
