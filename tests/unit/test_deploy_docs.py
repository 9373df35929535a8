"""docs/DEPLOY.md's parameter table cannot drift from template.yaml: it names every
parameter of the template, and only those, each with the template's default.

A row may name several parameters (``| `Provider`, `Model` | `demo`, `demo-1` | ...``): its
default cell then gives one default per name, in order, or one of ``(required)`` (no
default) and ``(none)`` (an empty default) for them all.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from turnledger_local.template import load_template

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "docs" / "DEPLOY.md"
_HEADER = "| parameter | default | meaning |"
_CODE = re.compile(r"`([^`]*)`")
#: The default cells that stand for every name of their row.
_SHARED = {"(required)": None, "(none)": ""}


def parameter_table(text: str) -> dict[str, str | None]:
    """Each parameter the table after :data:`_HEADER` names -> the default its row gives
    (``None``: required).

    Raises:
        ValueError: a row whose default cell gives neither one default per name nor a
            shared one, or a name given twice.
    """
    lines = text[text.index(_HEADER) :].splitlines()[2:]
    table: dict[str, str | None] = {}
    for row in lines:
        if not row.startswith("| "):
            break
        names_cell, default_cell = row[2:].split(" | ")[:2]
        names = _CODE.findall(names_cell)
        if default_cell in _SHARED:
            defaults = [_SHARED[default_cell]] * len(names)
        else:
            defaults = list(_CODE.findall(default_cell))
        if not names or len(defaults) != len(names):
            raise ValueError(f"a row gives {len(defaults)} defaults for {names}: {row[:80]}")
        for name, default in zip(names, defaults, strict=True):
            if name in table:
                raise ValueError(f"{name} is in the table twice")
            table[name] = default
    return table


def template_defaults(template: dict[str, Any]) -> dict[str, str | None]:
    """Each parameter of ``template`` -> its default as text (``None``: required)."""
    return {
        name: None if "Default" not in spec else str(spec["Default"])
        for name, spec in template["Parameters"].items()
    }


def drift(table: dict[str, str | None], parameters: dict[str, str | None]) -> list[str]:
    """What the table gets wrong about ``parameters``: each missing parameter, each name
    that is no parameter and each default that is not the template's."""
    problems = [f"{name} is not in the table" for name in parameters if name not in table]
    problems += [
        f"{name} is no parameter of template.yaml" for name in table if name not in parameters
    ]
    problems += [
        f"{name}: the table says {table[name]!r}, the template {default!r}"
        for name, default in parameters.items()
        if name in table and table[name] != default
    ]
    return problems


def test_the_parameter_table_names_every_parameter_with_its_default() -> None:
    table = parameter_table(DEPLOY.read_text(encoding="utf-8"))
    parameters = template_defaults(load_template())
    assert len(parameters) > 50  # the whole Parameters section was read
    assert drift(table, parameters) == []


def test_a_parameter_left_out_made_up_or_with_another_default_is_caught() -> None:
    """The check can fail: each kind of drift is reported."""
    parameters = template_defaults(load_template())
    table = parameter_table(DEPLOY.read_text(encoding="utf-8"))
    missing = {name: d for name, d in table.items() if name != "NotifySecretArn"}
    assert drift(missing, parameters) == ["NotifySecretArn is not in the table"]
    assert drift({**table, "NotifySecret": ""}, parameters) == [
        "NotifySecret is no parameter of template.yaml"
    ]
    assert drift({**table, "TtlSeconds": "86400"}, parameters) == [
        "TtlSeconds: the table says '86400', the template '604800'"
    ]
    assert drift({**table, "JwtIssuer": ""}, parameters) == [
        "JwtIssuer: the table says '', the template None"
    ]


@pytest.mark.parametrize(
    ("row", "table"),
    [
        ("| `Provider`, `Model` | `demo`, `demo-1` | x |", {"Provider": "demo", "Model": "demo-1"}),
        (
            "| `JwtIssuer`, `JwtAudience` | (required) | x |",
            {"JwtIssuer": None, "JwtAudience": None},
        ),
        ("| `KmsKeyArn` | (none) | x |", {"KmsKeyArn": ""}),
    ],
)
def test_a_row_gives_one_default_per_name_or_one_for_all(
    row: str, table: dict[str, str | None]
) -> None:
    assert parameter_table(f"{_HEADER}\n| --- | --- | --- |\n{row}\n\nafter") == table


def test_a_row_with_defaults_that_do_not_match_its_names_is_refused() -> None:
    with pytest.raises(ValueError, match="gives 1 defaults for"):
        parameter_table(f"{_HEADER}\n| --- | --- | --- |\n| `A`, `B` | `1` | x |\n")
