"""Lambda entry point for POST /v1/conversations/{id}/approvals.

All logic lives in the layer; API Gateway routes only this function's paths here. The
import is Lambda's init phase: it builds what every request needs (see
:func:`turnledger.runtime.prepare`).
"""

from turnledger.api import lambda_handler
from turnledger.runtime import prepare

prepare()

__all__ = ["lambda_handler"]
