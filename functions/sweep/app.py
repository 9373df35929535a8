"""Lambda entry point of the scheduled TTL sweep (and of TTL-deletion stream records).

The import is Lambda's init phase: it builds what every event needs (see
:func:`turnledger.runtime.prepare`).
"""

from turnledger.core.initphase import init_phase

# The init: no garbage collection while it loads and builds (turnledger.core.initphase).
with init_phase():
    from turnledger.handlers import sweep_handler as lambda_handler
    from turnledger.runtime import prepare

    prepare()

__all__ = ["lambda_handler"]
