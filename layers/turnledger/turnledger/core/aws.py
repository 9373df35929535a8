"""AWS sessions and their clients, built from botocore alone.

The functions never import boto3: its import loads s3transfer (``boto3.compat``), a
fifth of a cold start, for a transfer manager and resources no request uses; its
clients are botocore's. An :class:`AwsSession` is a botocore session (credentials,
region, configuration) over the process's parsed service models (:data:`MODELS`, shared
by every session: a service's model, its endpoint rules and the partitions are read once
per process, whichever session or tenant builds a client next).
"""

from __future__ import annotations

import threading
from typing import Any

import botocore.loaders
import botocore.session

#: The parsed service models (JSON read from botocore's data), shared by every session of
#: the process.
MODELS = botocore.loaders.create_loader()


class AwsSession:
    """One botocore session over :data:`MODELS`: its credentials (the environment's, or
    the ones given) are resolved when its first client is built."""

    def __init__(
        self,
        *,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
    ) -> None:
        self.core = botocore.session.Session()
        self.core.register_component("data_loader", MODELS)
        if aws_access_key_id is not None and aws_secret_access_key is not None:
            self.core.set_credentials(aws_access_key_id, aws_secret_access_key, aws_session_token)
        # A botocore session is not thread-safe: two threads' clients are built in turn.
        self._lock = threading.Lock()

    def client(self, service_name: str, **kwargs: Any) -> Any:
        """A botocore client of ``service_name`` (``kwargs``: ``create_client``'s: endpoint,
        config, region, credentials)."""
        with self._lock:
            return self.core.create_client(service_name, **kwargs)
