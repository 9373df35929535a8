"""``turnledger local --otlp-endpoint URL``: the functions' spans (OpenTelemetry, GenAI
conventions: :mod:`turnledger.core.telemetry`) exported over OTLP/HTTP, protobuf, to
``URL/v1/traces``, as the SDK's standard exporter sends them, so a collector, Jaeger or
any OTLP receiver on this machine shows them.

Each function's environment gets ``TURNLEDGER_OTLP_ENDPOINT``, as deployed; each
execution environment (worker process) then builds its own exporting tracer provider at
init (:func:`turnledger.core.otel.from_environment`).
"""

from __future__ import annotations

import argparse
import importlib.util
from urllib.parse import urlsplit

from turnledger.core.telemetry import ENV_OTLP_ENDPOINT

#: What the exporter needs, beyond the OpenTelemetry API (the ``local`` extra installs both).
REQUIRED = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")


def _endpoint(raw: str) -> str:
    """An ``http(s)://host[:port][/path]`` URL, without a trailing ``/``."""
    parts = urlsplit(raw.strip())
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {raw!r}")
    if parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(f"an endpoint has no query or fragment: {raw!r}")
    return raw.strip().rstrip("/")


def add_flag(local: argparse.ArgumentParser) -> None:
    """Add ``--otlp-endpoint`` to the ``local`` command."""
    local.add_argument(
        "--otlp-endpoint",
        type=_endpoint,
        metavar="URL",
        help=(
            "export the functions' spans (OpenTelemetry GenAI conventions) over OTLP/HTTP "
            "(protobuf) to URL/v1/traces, e.g. http://localhost:4318 (default: no telemetry)"
        ),
    )


def environment(args: argparse.Namespace) -> dict[str, str]:
    """The functions' environment for ``--otlp-endpoint`` (empty without it)."""
    endpoint: str | None = getattr(args, "otlp_endpoint", None)
    if endpoint is None:
        return {}
    return {ENV_OTLP_ENDPOINT: endpoint}


def missing() -> list[str]:
    """The packages ``--otlp-endpoint`` needs that are not installed."""
    found = []
    for name in REQUIRED:
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            spec = None
        if spec is None:
            found.append(name)
    return found
