"""Shared fixtures: fake AWS environment, clock, stores on every backend, local endpoints, events.

Backends of the ``store`` fixture:

* ``memory``: :class:`MemoryConversationStore` with a :class:`MemoryBlobStore`;
* ``moto``: :class:`DynamoDBConversationStore` and :class:`S3BlobStore` inside ``moto.mock_aws``;
* ``dynamodb-local``: :class:`DynamoDBConversationStore` against the real engine
  (DynamoDB Local, one per xdist worker) with S3 on moto's threaded server;
* ``sqlite``: :class:`SQLiteConversationStore` on a database file with a
  :class:`FileBlobStore` next to it (what ``turnledger local --data-dir`` runs);
* ``sealed``: the in-process backend with a keyring: content sealed at rest (issue 24).

Every store gets its own table and bucket, so tests are independent.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from moto import mock_aws
from moto.server import ThreadedMotoServer
from turnledger.store.base import ConversationStore
from turnledger.store.blobs import FileBlobStore, S3BlobStore
from turnledger.store.dynamodb import DynamoDBConversationStore
from turnledger.store.keyring import Keyring, LocalMasterKey, MemoryKeyItems
from turnledger.store.memory import MemoryConversationStore
from turnledger.store.sqlite import SQLiteConversationStore

from tests.functional.http_sink import HttpSink
from tests.support.aws import AwsClients, aws_clients, create_bucket, create_conversations_table
from tests.support.dynamodb_local import DynamoDBLocal, DynamoDBLocalError, find_jar
from tests.support.factories import FakeClock

EVENTS_DIR = Path(__file__).resolve().parent.parent / "events"

#: Set at import, before collection: modules that build clients at import time
#: (the functions' ``app.py``) must never see real credentials or a real region.
FAKE_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "POWERTOOLS_TRACE_DISABLED": "1",
    "POWERTOOLS_METRICS_NAMESPACE": "turnledger-tests",
    "POWERTOOLS_SERVICE_NAME": "turnledger",
}
for _name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL"):
    os.environ.pop(_name, None)
os.environ.update(FAKE_ENVIRONMENT)
# No shared config or credentials files either: nothing from the developer's machine.
os.environ["AWS_CONFIG_FILE"] = os.devnull
os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
# The master key of a data folder (turnledger.store.local_folder.local_master_key_file) lives in the
# user's state folder: the tests' go to one of their own, never the developer's.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="turnledger-test-state-")
atexit.register(shutil.rmtree, os.environ["XDG_STATE_HOME"], ignore_errors=True)

#: The ``store`` fixture's parameters; the real engine's runs are integration tests too.
STORE_BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("moto", id="moto"),
    pytest.param("dynamodb-local", id="dynamodb-local", marks=pytest.mark.integration),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("sealed", id="sealed"),
]


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock at a fixed instant; ``clock.advance(seconds)`` moves it."""
    return FakeClock()


@pytest.fixture
def load_event() -> Callable[[str], dict[str, Any]]:
    """Load ``events/<name>.json`` (the events ``sam local invoke -e`` uses too)."""

    def load(name: str) -> dict[str, Any]:
        path = EVENTS_DIR / f"{name.removesuffix('.json')}.json"
        loaded = json.loads(path.read_text(encoding="utf-8"))
        assert isinstance(loaded, dict), f"{path} is not a JSON object"
        return loaded

    return load


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    """A real HTTP server on loopback standing in for tools (scripted with ``respond``,
    every request it got in ``requests()``); a module may define its own, scripted."""
    with HttpSink() as server:
        yield server


# --- local endpoints (one per xdist worker) -----------------------------------------------


@pytest.fixture(scope="session")
def ddb_local_endpoint() -> Iterator[str]:
    """The URL of a DynamoDB Local started for this session (fails if it is not installed)."""
    try:
        server = DynamoDBLocal(find_jar()).start()
    except DynamoDBLocalError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server.endpoint
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto_server_endpoint() -> Iterator[str]:
    """The URL of a moto server on loopback (S3 next to DynamoDB Local)."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(name="aws_clients")
def aws_clients_fixture() -> Callable[..., AwsClients]:
    """``aws_clients(endpoint, s3_endpoint=None)``: clients with the fake credentials."""
    return aws_clients


# --- stores -------------------------------------------------------------------------------


@pytest.fixture
def memory_store() -> MemoryConversationStore:
    """The in-process backend."""
    return MemoryConversationStore()


@pytest.fixture
def sealed_store() -> MemoryConversationStore:
    """The in-process backend sealing content under a keyring (a local master key)."""
    return MemoryConversationStore(keyring=Keyring(LocalMasterKey(), MemoryKeyItems()))


def _one_request_at_a_time(clients: AwsClients) -> None:
    """Make moto apply each request atomically, as DynamoDB and S3 do.

    moto's in-process backends check a transaction's conditions and apply its
    writes without a lock, so two racing transactions could both pass; the
    real services never allow that. The lock is taken before a call is sent
    and released once it answered (or failed), in the calling thread.
    """
    lock = threading.RLock()

    def acquire(**_: Any) -> None:
        lock.acquire()

    def release(**_: Any) -> None:
        lock.release()

    for client in (clients.dynamodb, clients.s3):
        client.meta.events.register("before-call", acquire)
        client.meta.events.register("after-call", release)
        client.meta.events.register("after-call-error", release)


@pytest.fixture
def moto_store() -> Iterator[DynamoDBConversationStore]:
    """The DynamoDB backend on moto's in-process mock, with S3 on the same mock."""
    with mock_aws():
        clients = aws_clients()
        _one_request_at_a_time(clients)
        table = create_conversations_table(clients.dynamodb)
        bucket = create_bucket(clients.s3)
        yield DynamoDBConversationStore(clients.dynamodb, table, S3BlobStore(clients.s3, bucket))


@pytest.fixture
def ddb_local_store(
    ddb_local_endpoint: str, moto_server_endpoint: str
) -> Iterator[DynamoDBConversationStore]:
    """The DynamoDB backend on DynamoDB Local, with S3 on the moto server."""
    clients = aws_clients(ddb_local_endpoint, s3_endpoint=moto_server_endpoint)
    table = create_conversations_table(clients.dynamodb)
    bucket = create_bucket(clients.s3)
    yield DynamoDBConversationStore(clients.dynamodb, table, S3BlobStore(clients.s3, bucket))
    clients.dynamodb.delete_table(TableName=table)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SQLiteConversationStore]:
    """The SQLite backend on a fresh database file, objects in a folder beside it."""
    store = SQLiteConversationStore(
        tmp_path / "turnledger.sqlite3", FileBlobStore(tmp_path / "blobs")
    )
    yield store
    store.close()


_STORE_FIXTURES = {
    "memory": "memory_store",
    "moto": "moto_store",
    "dynamodb-local": "ddb_local_store",
    "sqlite": "sqlite_store",
    "sealed": "sealed_store",
}


@pytest.fixture(params=STORE_BACKENDS)
def store(request: pytest.FixtureRequest) -> ConversationStore:
    """The same store contract on every backend (ids: memory, moto, dynamodb-local, sqlite,
    sealed)."""
    backend: ConversationStore = request.getfixturevalue(_STORE_FIXTURES[request.param])
    return backend
