"""Pydantic field types that read JSON numbers as JSON Schema does.

A body's model is also its published JSON Schema (the gateway's OpenAPI
document), so the model must accept what that schema accepts: for JSON Schema
`74.0` is an integer (a number with a zero fraction), so a strict `int` field,
which refuses every float, would refuse input its own schema allows.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Strict


def _integral(value: object) -> object:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# An integer, as JSON Schema's "integer": 74 and 74.0, never 74.5, "74" or true.
JsonInt = Annotated[int, BeforeValidator(_integral), Strict()]
