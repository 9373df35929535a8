"""Lambda entry point for POST /v1/conversations/{id}/approvals.

All logic lives in the layer; API Gateway routes only this function's paths here, and it
registers only the route modules of those paths. The import is Lambda's init phase: it
builds what every request needs (see :func:`turnledger.runtime.prepare`).
"""

from turnledger.core.initphase import init_phase

# The init: no garbage collection while it loads and builds (turnledger.core.initphase).
with init_phase():
    from turnledger.api.functions import serve
    from turnledger.runtime import prepare

    # This function's routes only (turnledger.api.functions.ROUTES["approve"]).
    lambda_handler = serve("approve")
    prepare()

__all__ = ["lambda_handler"]
