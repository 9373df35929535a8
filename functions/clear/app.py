"""Lambda entry point for DELETE /v1/conversations/{id} and DELETE /v1/conversations.

All logic lives in the layer; API Gateway routes only this function's paths here, and it
registers only the route modules of those paths. The import is Lambda's init phase: it
builds what every request needs (see :func:`turnledger.runtime.prepare`).
"""

from turnledger.core.initphase import init_phase

# The init: no garbage collection while it loads and builds (turnledger.core.initphase).
with init_phase():
    from turnledger.api.functions import serve
    from turnledger.runtime import prepare

    # This function's routes only (turnledger.api.functions.ROUTES["clear"]).
    lambda_handler = serve("clear")
    # Reads and clears only: the provider, tools and turn pipeline wait for a first use.
    # Every clear lists the conversation's blobs: S3's client is built now.
    prepare(service=False, blobs=True)

__all__ = ["lambda_handler"]
