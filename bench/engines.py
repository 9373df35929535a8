"""The engines a benchmark runs on: DynamoDB Local (the table built from ``template.yaml``)
and S3 on moto's server, started for one run and stopped after it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from moto.server import ThreadedMotoServer
from turnledger.core.config import Settings

from tests.support.aws import AwsClients, aws_clients, create_bucket, create_conversations_table
from tests.support.dynamodb_local import DynamoDBLocal, find_jar, free_port


@dataclass(frozen=True)
class Engines:
    """Clients of the running engines, and settings naming their table and bucket."""

    clients: AwsClients
    settings: Settings
    #: DynamoDB Local's jar (its version goes into the results).
    jar: Path


@contextmanager
def local_engines(**settings: Any) -> Iterator[Engines]:
    """Start both engines, create the table and a bucket; ``settings`` override the defaults
    (the table and bucket names are set here)."""
    jar = find_jar()
    s3_port = free_port()
    s3_server = ThreadedMotoServer(ip_address="127.0.0.1", port=s3_port, verbose=False)
    # The S3 server's request log would drown the progress lines.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    s3_server.start()
    try:
        with DynamoDBLocal(jar) as ddb:
            clients = aws_clients(ddb.endpoint, s3_endpoint=f"http://127.0.0.1:{s3_port}")
            named = replace(
                Settings(),
                table_name=create_conversations_table(clients.dynamodb),
                bucket_name=create_bucket(clients.s3),
                **settings,
            )
            yield Engines(clients=clients, settings=named, jar=jar)
    finally:
        s3_server.stop()
