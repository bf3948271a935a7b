"""The bench sweep (`recmesh bench e2e`, `floor`, `tls`) reads its --rates and --mix
or says what is wrong with them."""

from __future__ import annotations

import pytest

from recmesh.errors import InvalidArgument
from recmesh.tools.bench.sweep import parse_mix, parse_rates


def test_mix_is_normalised_and_case_insensitive() -> None:
    assert parse_mix("a:1,B:3") == {"A": 0.25, "B": 0.75}


def test_rates_in_order() -> None:
    assert parse_rates("20,50.5,100") == [20.0, 50.5, 100.0]


@pytest.mark.parametrize(
    ("text", "said"),
    [("A=1", "'A=1' is not CLASS:SHARE"), (":1", "each class needs a name"), ("A:0,B:0", "not all 0"),
     ("A:-1,B:2", "share >= 0"), ("A:inf", "finite"), ("A:1,a:2", "class A is given twice")],
)  # fmt: skip
def test_bad_mix_is_an_invalid_argument(text: str, said: str) -> None:
    with pytest.raises(InvalidArgument, match=said):
        parse_mix(text)


@pytest.mark.parametrize("text", ["1,x", "", "0,10", "-5", "inf", "nan"])
def test_bad_rates_are_an_invalid_argument(text: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_rates(text)
