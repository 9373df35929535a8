"""AWS sessions and their clients, built from botocore alone.

The functions never import boto3: its import loads s3transfer (``boto3.compat``), a
fifth of a cold start, for a transfer manager and resources no request uses; its
clients are botocore's. An :class:`AwsSession` is a botocore session (credentials,
region, configuration) over the process's parsed service models (:data:`MODELS`, shared
by every session: a service's model, its endpoint rules and the partitions are read once
per process, whichever session or tenant builds a client next, and read faster than
botocore's own loader reads them: :class:`ModelLoader`).
"""

from __future__ import annotations

import gzip
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.loaders
import botocore.session
from botocore.exceptions import DataNotFoundError


class PlainJSONFiles(botocore.loaders.JSONFileLoader):
    """botocore's data files (``.json`` or ``.json.gz``), parsed into plain dicts.

    botocore parses them with ``object_pairs_hook=OrderedDict``, three times slower than
    plain dicts, which keep the files' order as well: for the DynamoDB, S3, STS, KMS and
    Lambda clients (their models, endpoint rules and ``endpoints.json``) about 28 ms of a
    cold start, measured on the bench's machine.
    """

    def load_file(self, file_path: str) -> Any:
        """The data of ``file_path`` + ``.json`` or ``.json.gz``; ``None`` when neither is
        a file."""
        for suffix in (".json", ".json.gz"):
            path = Path(file_path + suffix)
            if path.is_file():
                data = path.read_bytes()
                return json.loads(gzip.decompress(data) if suffix == ".json.gz" else data)
        return None


class ModelLoader(botocore.loaders.Loader):
    """botocore's loader over :class:`PlainJSONFiles`, checking a service's name against
    that service's own folder.

    botocore checks the name against :meth:`list_available_services` before it loads a
    model: a walk over the folders of all its ~450 services, once per model type, and a
    client needs two (its API, its endpoint rules). That is about 20 ms of a cold start
    for a check that one folder answers. A name with no model still gets botocore's own
    check and its ``UnknownServiceError``.
    """

    def __init__(self) -> None:
        super().__init__(file_loader=PlainJSONFiles())

    @botocore.loaders.instance_cache
    def load_service_model(
        self, service_name: str, type_name: str, api_version: str | None = None
    ) -> Any:
        """The model ``type_name`` of ``service_name`` (latest API version by default),
        with its extras merged, as botocore's
        :meth:`~botocore.loaders.Loader.load_service_model` loads it."""
        try:
            version = api_version or self.determine_latest_version(service_name, type_name)
            path = os.path.join(service_name, version, type_name)
            model = self.load_data(path)
        except DataNotFoundError:
            return super().load_service_model(service_name, type_name, api_version)
        _EXTRAS.process(model, self._extras(path))
        return model

    def _extras(self, path: str) -> Iterator[Any]:
        for kind in self.extras_types:
            try:
                yield self.load_data(f"{path}.{kind}-extras")
            except DataNotFoundError:
                continue


_EXTRAS = botocore.loaders.ExtrasProcessor()

#: The parsed service models (JSON read from botocore's data), shared by every session of
#: the process.
MODELS = ModelLoader()


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
