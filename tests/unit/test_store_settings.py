"""Which store the handlers get: ``STORE`` and ``DATA_DIR``, and ``turnledger local --data-dir``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from turnledger.core.config import ForeignResource, Settings
from turnledger.runtime import Runtime
from turnledger.store.dynamodb import DynamoDBConversationStore
from turnledger.store.keyring import DynamoDBKeyItems, KmsMasterKey, LocalMasterKey, SQLiteKeyItems
from turnledger.store.local_folder import (
    LOCAL_KEYS_FILE,
    LOCAL_MASTER_KEY_FILE,
    local_master_key_file,
    master_key_in_data_dir,
)
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


# --- content encryption (issue 24) ---------------------------------------------------------


def test_a_keys_table_makes_the_store_seal_under_kms() -> None:
    settings = Settings.from_env(
        {
            "KEYS_TABLE_NAME": "keys",
            "CONTENT_KMS_KEY_ID": "alias/content",
            "TENANT_KMS_KEY_IDS": '{"acme": "arn:aws:kms:us-east-1:111122223333:key/a"}',
            "KEY_CACHE_SECONDS": "60",
        }
    )
    keyring = Runtime.from_settings(settings).store.sealer.keyring
    assert keyring is not None and keyring.cache_seconds == 60
    assert isinstance(keyring.master, KmsMasterKey)
    assert keyring.master.default_key_id == "alias/content"
    assert keyring.master.tenant_key_ids == {"acme": "arn:aws:kms:us-east-1:111122223333:key/a"}
    assert isinstance(keyring.items, DynamoDBKeyItems) and keyring.items.table_name == "keys"
    # Without a keys table content stays clear, as before.
    assert Runtime.from_settings(Settings.from_env({})).store.sealer.keyring is None


def test_the_sqlite_store_seals_under_a_master_key_outside_the_data_folder(
    tmp_path: Path,
) -> None:
    """By default the master key is in the user's state folder, never in the data folder;
    the wrapped keys are in their own file beside the data file."""
    folder = tmp_path / "d"
    env = {"STORE": "sqlite", "DATA_DIR": str(folder), "XDG_STATE_HOME": str(tmp_path / "s")}
    settings = Settings.from_env(env)
    master = local_master_key_file(settings, env)
    assert master == tmp_path / "s" / "turnledger" / LOCAL_MASTER_KEY_FILE
    assert local_master_key_file(settings, {"HOME": str(tmp_path / "h")}) == (
        tmp_path / "h" / ".local" / "state" / "turnledger" / LOCAL_MASTER_KEY_FILE
    )
    given = Settings.from_env({**env, "MASTER_KEY_FILE": str(tmp_path / "k" / "m.key")})
    assert local_master_key_file(given, env) == tmp_path / "k" / "m.key"
    assert not master_key_in_data_dir(given)

    store = Runtime.from_settings(Settings.from_env({**env, "MASTER_KEY_FILE": str(master)})).store
    keyring = store.sealer.keyring
    assert keyring is not None and isinstance(keyring.master, LocalMasterKey)
    assert master.stat().st_mode & 0o777 == 0o600
    assert not (folder / LOCAL_MASTER_KEY_FILE).exists()
    assert isinstance(keyring.items, SQLiteKeyItems)
    assert keyring.items.path == folder / LOCAL_KEYS_FILE != folder / DATABASE_FILE
    store.close()


def test_a_master_key_left_in_the_data_folder_is_used_and_reported(tmp_path: Path) -> None:
    """An older build's ``master.key`` inside the data folder keeps opening it (unless
    ``MASTER_KEY_FILE`` names another); :func:`master_key_in_data_dir` says so."""
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / LOCAL_MASTER_KEY_FILE).write_bytes(bytes(32))
    env = {"STORE": "sqlite", "DATA_DIR": str(folder), "XDG_STATE_HOME": str(tmp_path / "s")}
    settings = Settings.from_env(env)
    assert local_master_key_file(settings, env) == folder / LOCAL_MASTER_KEY_FILE
    assert master_key_in_data_dir(settings)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KEYS_TABLE_NAME": "keys"}, "needs CONTENT_KMS_KEY_ID"),
        ({"TENANT_KMS_KEY_IDS": '{"acme": 1}'}, "TENANT_KMS_KEY_IDS must be"),
    ],
)
def test_bad_key_settings_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings.from_env(env)


# --- keys of this account and Region only (issue 47, point 14) -----------------------------

_OWN_KEY = "arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
_DEPLOYED = {
    "AWS_REGION": "eu-west-1",
    "TENANT_ROLE_ARN": "arn:aws:iam::111122223333:role/stack-TenantAccessRole-X",
    "KEYS_TABLE_NAME": "keys",
    "CONTENT_KMS_KEY_ID": _OWN_KEY,
}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"CONTENT_KMS_KEY_ID": _OWN_KEY.replace("111122223333", "444455556666")},
            r"CONTENT_KMS_KEY_ID names a resource of account 444455556666, not this stack's 1111",
        ),
        (
            {"CONTENT_KMS_KEY_ID": _OWN_KEY.replace("eu-west-1", "us-east-1")},
            r"CONTENT_KMS_KEY_ID names a resource of Region us-east-1, not this stack's eu-west-1",
        ),
        (
            {
                "CONTENT_KMS_KEY_ID": _OWN_KEY,
                "TENANT_KMS_KEY_IDS": '{"acme": "arn:aws:kms:eu-west-1:444455556666:alias/a"}',
            },
            r"TENANT_KMS_KEY_IDS\['acme'\] names a resource of account 444455556666",
        ),
        (
            {"OPENAI_API_KEY_SECRET": "arn:aws:secretsmanager:eu-west-1:444455556666:secret:k"},
            r"OPENAI_API_KEY_SECRET names a resource of account 444455556666",
        ),
        (
            {"NOTIFY_SECRET_ARN": "arn:aws:secretsmanager:eu-central-1:111122223333:secret:n"},
            r"NOTIFY_SECRET_ARN names a resource of Region eu-central-1, not this stack's eu-west",
        ),
    ],
)
def test_a_key_or_secret_of_another_account_or_region_is_refused(
    env: dict[str, str], message: str
) -> None:
    """The functions' roles may use this account's keys in this Region only (the
    template's ``TenantKeys`` and ``UseCustomerKey``): a key of another passes
    ``KmsKeyArn``'s pattern, and would be denied on every sealed read and write; a secret
    of another account is readable only under that account's key, one of another Region
    not at all from here."""
    with pytest.raises(ForeignResource, match=message):
        Settings.from_env({**_DEPLOYED, **env})


def test_keys_and_secrets_of_this_account_and_region_or_named_without_an_arn_are_accepted() -> None:
    tenants = json.dumps({"acme": "alias/acme", "beta": _OWN_KEY, "gamma": "0a1b"})
    own = {
        "CONTENT_KMS_KEY_ID": _OWN_KEY,
        "TENANT_KMS_KEY_IDS": tenants,
        "OPENAI_API_KEY_SECRET": "arn:aws:secretsmanager:eu-west-1:111122223333:secret:k",
        "NOTIFY_SECRET_ARN": "notify-secret-name",
    }
    settings = Settings.from_env({**_DEPLOYED, **own})
    assert settings.content_kms_key_id == _OWN_KEY and len(settings.tenant_kms_key_ids) == 3
    # Without a tenant role (the local runner, the sweep) the account is not known: only the
    # Region is compared.
    local = {"KEYS_TABLE_NAME": "keys", "AWS_REGION": "eu-west-1"}
    other_account = _OWN_KEY.replace("111122223333", "444455556666")
    assert Settings.from_env({**local, "CONTENT_KMS_KEY_ID": other_account}).content_kms_key_id
    other_region = _OWN_KEY.replace("eu-west-1", "us-east-1")
    with pytest.raises(ForeignResource, match="Region us-east-1"):
        Settings.from_env({**local, "CONTENT_KMS_KEY_ID": other_region})
