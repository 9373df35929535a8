"""``GET/PUT /v1/data-policy``: a tenant's own data policy, every version kept.

``PUT`` needs ``DATA_POLICY_ADMIN_SCOPE`` in the ``APPROVER_CLAIM`` claim (as deciding
approvals needs the approver scope; empty: tenants set none, ``403``); each put adds a
version (:mod:`turnledger.store.data_policies`) that replaces the deployment's policy for
the tenant's conversations. ``GET`` answers the policy in force and every version.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body
from pydantic import ConfigDict

from ..context.policy import DataPolicy
from ..core.exceptions import AdminScopeMissing
from ..core.models import Deferred
from ..runtime import get_runtime
from ..store.data_policies import PolicyVersions
from .resolver import app, caller, json_response, responses, scope_values


class PolicyVersionView(Deferred):
    """One version a tenant set."""

    model_config = ConfigDict(extra="forbid")

    number: int
    version: str
    set_by: str
    set_at: datetime


class DataPolicyView(Deferred):
    """Answer of ``GET/PUT /v1/data-policy``."""

    model_config = ConfigDict(extra="forbid")

    #: Whose policy is in force for the tenant: its own, the deployment's, or none.
    source: Literal["tenant", "deployment", "none"]
    policy: DataPolicy | None
    #: The tenant's own versions, oldest first (``number`` counts them).
    versions: list[PolicyVersionView]


def _view(tenant: str) -> DataPolicyView:
    service = get_runtime().conversations_for(tenant)
    versions = PolicyVersions(service.store, tenant).all()
    own = service.tenant_policy(tenant, fresh=True) if versions else None
    policy = own or service.data_policy(tenant)
    return DataPolicyView(
        source="tenant" if own is not None else "deployment" if policy is not None else "none",
        policy=policy,
        versions=[
            PolicyVersionView(number=v.number, version=v.version, set_by=v.set_by, set_at=v.set_at)
            for v in versions
        ],
    )


@app.get("/v1/data-policy", responses=responses(DataPolicyView, 400, 401, 422, 503))
def get_data_policy() -> DataPolicyView:
    """The data policy in force for the caller's tenant, and the tenant's own versions."""
    return _view(caller().tenant)


@app.put("/v1/data-policy", responses=responses(DataPolicyView, 400, 401, 403, 422, 503))
def put_data_policy(policy: Annotated[DataPolicy, Body()]) -> Response[str]:
    """Set the tenant's own data policy: a new version, kept with every earlier one."""
    who = caller()
    runtime = get_runtime()
    settings = runtime.settings
    scope = settings.data_policy_admin_scope
    if not scope or scope not in scope_values():
        raise AdminScopeMissing(
            f"setting the data policy needs {scope!r} in the {settings.approver_claim!r} claim"
            if scope
            else "tenants may not set their own data policy in this deployment",
            details={"claim": settings.approver_claim, "required": scope},
        )
    service = runtime.conversations_for(who.tenant)
    PolicyVersions(service.store, who.tenant).add(
        policy.version,
        policy.model_dump_json(by_alias=True, exclude_none=True),
        set_by=who.actor,
        set_at=service.clock(),
    )
    return json_response(200, _view(who.tenant).model_dump(mode="json", by_alias=True))
