"""Lambda entry point of the scheduled TTL sweep (and of TTL-deletion stream records)."""

from turnledger.sweep import lambda_handler

__all__ = ["lambda_handler"]
