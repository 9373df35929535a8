"""The local runner's store: SQLite in a data folder (``--data-dir``), its wrapped keys in a
file beside the data file, its master key outside the folder (a copy of the folder, the
natural backup, then holds only ciphertext that nothing in it opens). Lambda never builds
it: the runtime imports the SQLite store only when ``STORE=sqlite``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ..core.config import Settings
from .base import ConversationStore
from .keyring import Keyring, LocalMasterKey, SQLiteKeyItems


def sqlite_store(settings: Settings) -> ConversationStore:
    """The SQLite store of ``settings.data_dir``, its content sealed as deployed."""
    # Imported here: Lambda never runs it, and its cold start should not pay for it.
    from .sqlite import SQLiteConversationStore

    assert settings.data_dir is not None  # Settings refuses sqlite without a folder
    folder = Path(settings.data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    # Content sealed as deployed: wrapped keys in a file beside the data file (a copy of
    # the data file alone holds only ciphertext), the master key outside the folder.
    keyring = Keyring(
        LocalMasterKey.from_file(local_master_key_file(settings)),
        SQLiteKeyItems(folder / LOCAL_KEYS_FILE),
        cache_seconds=settings.key_cache_seconds,
    )
    return SQLiteConversationStore.in_folder(
        settings.data_dir, offload_threshold=settings.offload_threshold_bytes, keyring=keyring
    )


#: The SQLite store's wrapped keys, in its data folder (``--data-dir``).
LOCAL_KEYS_FILE = "keys.sqlite3"
#: The name of its master key's file (:func:`local_master_key_file`).
LOCAL_MASTER_KEY_FILE = "master.key"


def local_master_key_file(settings: Settings, env: Mapping[str, str] | None = None) -> Path:
    """Where the SQLite store's master key is kept (created there on first use).

    ``MASTER_KEY_FILE`` when set; else a ``master.key`` an older build left in the data
    folder (still used, so its conversations stay readable: :func:`master_key_in_data_dir`
    tells the runner to warn); else ``master.key`` in the user's state folder,
    ``$XDG_STATE_HOME/turnledger`` (``~/.local/state/turnledger`` without it), one key for
    every data folder of the user. Outside the folder, a copy of it (a backup) holds
    wrapped keys that nothing in it opens.

    Args:
        env: the environment to read ``XDG_STATE_HOME`` and ``HOME`` from (default: this
            process's).
    """
    if settings.master_key_file:
        return Path(settings.master_key_file).expanduser().resolve()
    assert settings.data_dir is not None  # Settings refuses sqlite without a folder
    left = Path(settings.data_dir) / LOCAL_MASTER_KEY_FILE
    if left.is_file():
        return left.resolve()
    given = os.environ if env is None else env
    state = given.get("XDG_STATE_HOME") or str(
        Path(given.get("HOME") or Path.home()) / ".local" / "state"
    )
    return (Path(state) / "turnledger" / LOCAL_MASTER_KEY_FILE).resolve()


def master_key_in_data_dir(settings: Settings) -> bool:
    """Whether the SQLite store's master key lies in its data folder: a copy of the folder
    then opens every conversation that was in it, deleted or not."""
    assert settings.data_dir is not None
    folder = Path(settings.data_dir).resolve()
    return folder in local_master_key_file(settings).parents


def prepare_local_store(settings: Settings) -> None:
    """Open the SQLite store's files once (the master key made if missing, the key file
    moved out of an older build's WAL mode, which only an opener alone can do:
    :class:`~turnledger.store.keyring.SQLiteKeyItems`), before any function's process
    opens them; the connections are closed again."""
    from .sqlite import SQLiteConversationStore

    store = sqlite_store(settings)
    assert isinstance(store, SQLiteConversationStore)
    store.close()
