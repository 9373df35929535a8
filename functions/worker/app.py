"""Lambda entry point of the turn worker: runs turns sent with ``Prefer: respond-async``.

Invoked asynchronously by the turn and approval functions; the module is imported on
the first event (see :mod:`turnledger.entry`).
"""

from turnledger.entry import deferred

lambda_handler = deferred("turnledger.api.worker", "worker_handler")

__all__ = ["lambda_handler"]
