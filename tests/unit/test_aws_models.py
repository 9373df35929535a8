"""The layer's botocore loader (:class:`turnledger.core.aws.ModelLoader`) loads the same
models as botocore's own, in the same order, as plain dicts, without walking every
service's folder to check a name."""

from __future__ import annotations

import json
from typing import Any

import botocore.loaders
import pytest
from botocore.exceptions import DataNotFoundError, UnknownServiceError
from turnledger.core.aws import AwsSession, ModelLoader

#: Every service a function or the local runner builds a client of, and one more.
SERVICES = ("dynamodb", "s3", "sts", "kms", "lambda", "events", "bedrock-runtime", "sqs")
TYPES = ("service-2", "endpoint-rule-set-1")


class Counting(ModelLoader):
    """A :class:`ModelLoader` that counts botocore's walks over every service's folder."""

    def __init__(self) -> None:
        super().__init__()
        self.walks: list[str] = []

    def list_available_services(self, type_name: str) -> Any:
        self.walks.append(type_name)
        return super().list_available_services(type_name)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("service", SERVICES)
def test_a_model_is_the_one_botocore_loads(service: str, type_name: str) -> None:
    """The latest version by default; the same keys in the same order."""
    ours = ModelLoader().load_service_model(service, type_name)
    botocores = botocore.loaders.Loader().load_service_model(service, type_name)
    assert json.dumps(ours) == json.dumps(botocores)


@pytest.mark.parametrize("name", ["endpoints", "partitions", "_retry", "sdk-default-configuration"])
def test_botocores_own_data_files_are_read_as_botocore_reads_them(name: str) -> None:
    ours = ModelLoader().load_data(name)
    assert json.dumps(ours) == json.dumps(botocore.loaders.Loader().load_data(name))


def test_data_files_are_parsed_into_plain_dicts() -> None:
    """botocore's own parse (``OrderedDict`` pairs) takes three times as long."""
    endpoints = ModelLoader().load_data("endpoints")
    assert type(endpoints) is dict
    assert type(endpoints["partitions"][0]["services"]["dynamodb"]) is dict
    model = ModelLoader().load_service_model("dynamodb", "service-2")
    assert type(model["operations"]["GetItem"]) is dict


def test_a_missing_data_file_is_none_as_for_botocore() -> None:
    loader = ModelLoader()
    assert loader.file_loader.load_file(loader.search_paths[-1] + "/no-such-file") is None
    with pytest.raises(DataNotFoundError):
        loader.load_data("no-such-file")


def test_a_models_extras_are_merged_as_botocore_merges_them() -> None:
    pagination = ModelLoader().load_service_model("ec2", "paginators-1")["pagination"]
    # From ``paginators-1.sdk-extras.json``, not in ``paginators-1.json``.
    assert pagination["GetNetworkInsightsAccessScopeAnalysisFindings"]["non_aggregate_keys"]
    assert (
        pagination
        == botocore.loaders.Loader().load_service_model("ec2", "paginators-1")["pagination"]
    )


@pytest.mark.parametrize("loader", [ModelLoader, botocore.loaders.Loader])
def test_a_version_with_no_such_model_gets_botocores_own_error(loader: type[Any]) -> None:
    with pytest.raises(DataNotFoundError, match="dynamodb/2011-12-05/service-2"):
        loader().load_service_model("dynamodb", "service-2", "2011-12-05")


def test_building_the_layers_clients_walks_no_service_folder_but_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loader = Counting()
    monkeypatch.setattr("turnledger.core.aws.MODELS", loader)
    session = AwsSession(aws_access_key_id="a", aws_secret_access_key="b")
    for service in SERVICES:
        client = session.client(service, region_name="eu-west-1")
        assert client.meta.service_model.service_name == service
    assert loader.walks == []


def test_an_unknown_service_gets_botocores_own_error(monkeypatch: pytest.MonkeyPatch) -> None:
    loader = Counting()
    monkeypatch.setattr("turnledger.core.aws.MODELS", loader)
    with pytest.raises(UnknownServiceError, match=r"Unknown service: 'dynamodbx'.*dynamodb"):
        AwsSession().client("dynamodbx", region_name="eu-west-1")
    assert loader.walks == ["service-2"]
