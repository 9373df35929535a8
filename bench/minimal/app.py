"""The minimal handler of the cold-start benchmark: the same stack at its smallest.

Powertools' HTTP resolver with one route, answering ``GET /v1/conversations/{id}`` with
one ``GetItem`` through a boto3 DynamoDB resource, both built at import as Lambda's
guides advise. ``bench/coldstart.py`` measures it beside the real handlers, in the
same run, as what a function of this stack cannot do faster.
"""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response

app = APIGatewayHttpResolver()
table = boto3.resource("dynamodb", endpoint_url=os.environ.get("DYNAMODB_ENDPOINT")).Table(
    os.environ["TABLE_NAME"]
)


@app.get("/v1/conversations/<conversation_id>")
def get_conversation(conversation_id: str) -> Response[str] | dict[str, Any]:
    """The conversation's head item, or 404."""
    found = table.get_item(Key={"pk": conversation_id, "sk": "head"}).get("Item")
    if found is None:
        return Response(status_code=404, content_type="application/json", body="{}")
    return {"id": conversation_id}


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Route one HTTP API event."""
    return app.resolve(event, context)
