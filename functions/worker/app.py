"""Lambda entry point of the turn worker: runs turns sent with ``Prefer: respond-async``.

Invoked asynchronously by the turn and approval functions. The import is Lambda's init
phase: it builds what every event needs (see :func:`turnledger.runtime.prepare`).
"""

from turnledger.api.worker import worker_handler as lambda_handler
from turnledger.runtime import prepare

prepare()

__all__ = ["lambda_handler"]
