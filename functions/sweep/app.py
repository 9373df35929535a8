"""Lambda entry point of the scheduled TTL sweep (and of TTL-deletion stream records).

The sweep's module is imported on the first event (see :mod:`turnledger.entry`).
"""

from turnledger.entry import deferred

lambda_handler = deferred("turnledger.handlers", "sweep_handler")

__all__ = ["lambda_handler"]
