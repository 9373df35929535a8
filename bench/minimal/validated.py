"""The minimal handler with the validation the project's stack adds: a comparison only.

``bench/minimal/app.py`` (the issue's yardstick: Powertools' HTTP resolver and one
``GetItem`` through a boto3 DynamoDB resource) with the resolver's request and response
validation on (``enable_validation=True``, which loads pydantic) and its answer a pydantic
model, as every route of turnledger's API is. ``bench/coldstart.py`` samples it beside the
handlers to show what of their cold start the validated stack itself costs; the verdicts
stay against the minimal handler.
"""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from pydantic import BaseModel

app = APIGatewayHttpResolver(enable_validation=True)
table = boto3.resource("dynamodb", endpoint_url=os.environ.get("DYNAMODB_ENDPOINT")).Table(
    os.environ["TABLE_NAME"]
)


class Conversation(BaseModel):
    """The answer: the conversation's id."""

    id: str


@app.get("/v1/conversations/<conversation_id>")
def get_conversation(conversation_id: str) -> Conversation:
    """The conversation's head item, or 404."""
    found = table.get_item(Key={"pk": conversation_id, "sk": "head"}).get("Item")
    if found is None:
        raise NotFoundError("no such conversation")
    return Conversation(id=conversation_id)


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Route one HTTP API event."""
    return app.resolve(event, context)
