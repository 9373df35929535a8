"""Lambda entry point for the GET routes.

GET /v1/conversations/{id}, GET /v1/conversations/{id}/events and GET /v1/openapi.json;
GET /v1/approvals (the tenant's approval inbox) and GET /approvals (its web page).

All logic lives in the layer; API Gateway routes only this function's paths here, and it
registers only the route modules of those paths. The import is Lambda's init phase: it
builds what every request needs (see :func:`turnledger.runtime.prepare`).
"""

from turnledger.core.initphase import init_phase

# The init: no garbage collection while it loads and builds (turnledger.core.initphase).
with init_phase():
    from turnledger.api.functions import serve
    from turnledger.runtime import prepare

    # This function's routes only (turnledger.api.functions.ROUTES["read"]).
    lambda_handler = serve("read")
    # Reads and clears only: the provider, tools and turn pipeline wait for a first use.
    prepare(service=False)

__all__ = ["lambda_handler"]
