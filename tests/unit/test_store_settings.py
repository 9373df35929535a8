"""Which store the handlers get: ``STORE`` and ``DATA_DIR``, and ``turnledger local --data-dir``."""

from __future__ import annotations

from pathlib import Path

import pytest
from turnledger.core.config import Settings
from turnledger.runtime import Runtime
from turnledger.store.dynamodb import DynamoDBConversationStore
from turnledger.store.sqlite import DATABASE_FILE, SQLiteConversationStore
from turnledger_local.cli import build_parser, config_from_args
from turnledger_local.runner import LocalConfig, LocalRunner


def test_the_default_store_is_dynamodb() -> None:
    settings = Settings.from_env({})
    assert (settings.store, settings.data_dir) == ("dynamodb", None)
    assert isinstance(Runtime.from_settings(settings).store, DynamoDBConversationStore)


def test_store_sqlite_keeps_conversations_in_data_dir(tmp_path: Path) -> None:
    settings = Settings.from_env({"STORE": "sqlite", "DATA_DIR": str(tmp_path / "d")})
    store = Runtime.from_settings(settings).store
    assert isinstance(store, SQLiteConversationStore)
    assert store.path == tmp_path / "d" / DATABASE_FILE
    store.close()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"STORE": "sqlite"}, "needs DATA_DIR"),
        ({"STORE": "postgres", "DATA_DIR": "/tmp/x"}, "STORE must be one of"),
    ],
)
def test_bad_store_settings_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings.from_env(env)


def test_data_dir_flag_maps_onto_the_runner_config(tmp_path: Path) -> None:
    args = build_parser().parse_args(["local", "--data-dir", str(tmp_path)])
    assert config_from_args(args).data_dir == tmp_path
    assert config_from_args(build_parser().parse_args(["local"])).data_dir is None


def test_the_runner_sets_the_store_environment(tmp_path: Path) -> None:
    """The functions read ``STORE=sqlite`` and the folder, resolved; without a folder, neither."""
    runner = LocalRunner(LocalConfig(port=0, data_dir=tmp_path / "rel", provision_storage=False))
    env = runner._base_environment()
    assert (env["STORE"], env["DATA_DIR"]) == ("sqlite", str((tmp_path / "rel").resolve()))
    plain = LocalRunner(LocalConfig(port=0, provision_storage=False))._base_environment()
    assert "STORE" not in plain and "DATA_DIR" not in plain
