"""JsonInt reads integers as the published JSON Schema does."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from recmesh.jsontypes import JsonInt


class Counted(BaseModel):
    n: JsonInt


def test_a_number_with_a_zero_fraction_is_an_integer() -> None:
    assert Counted.model_validate_json(b'{"n": 74.0}').n == 74
    assert Counted.model_validate_json(b'{"n": 74}').n == 74
    assert Counted.model_json_schema()["properties"]["n"]["type"] == "integer"


@pytest.mark.parametrize("raw", [b'{"n": 74.5}', b'{"n": "74"}', b'{"n": true}', b'{"n": null}'])
def test_other_values_are_refused_as_before(raw: bytes) -> None:
    with pytest.raises(ValidationError, match="valid integer"):
        Counted.model_validate_json(raw)
