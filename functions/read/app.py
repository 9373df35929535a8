"""Lambda entry point for the GET routes.

GET /v1/conversations/{id}, GET /v1/conversations/{id}/events and GET /v1/openapi.json;
GET /v1/approvals (the tenant's approval inbox) and GET /approvals (its web page).

All logic lives in the layer; API Gateway routes only this function's paths here.
"""

from turnledger.api import lambda_handler

__all__ = ["lambda_handler"]
