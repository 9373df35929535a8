"""Turning telemetry on: the OpenTelemetry adapter (:mod:`.otel`) installed as the port of
:mod:`.telemetry` when the environment asks for it, at init (:func:`turnledger.runtime.prepare`).

Apart from :mod:`.telemetry` so that the port never imports its adapter (the adapter
imports the port's names).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from . import telemetry
from .observability import logger


def configure(environ: Mapping[str, str] = os.environ) -> telemetry.Telemetry:
    """Install the OpenTelemetry adapter (:mod:`turnledger.core.otel`) when the environment
    asks for telemetry (:func:`turnledger.core.telemetry.wanted`) and the OpenTelemetry API
    is installed; otherwise leave it off (a warning when asked for and missing). Once per
    process, at init: nothing of OpenTelemetry is imported while it is off."""
    if not telemetry.wanted(environ) or telemetry.active() is not telemetry.OFF:
        return telemetry.active()
    import importlib.util

    if importlib.util.find_spec("opentelemetry") is None:
        logger.warning("telemetry is asked for but the OpenTelemetry API is not installed")
        return telemetry.active()
    from .otel import from_environment

    telemetry.install(from_environment(environ))
    return telemetry.active()
