"""`recmesh bench e2e` reads its --rates and --mix or says what is wrong with them,
and sets its figures against the floor measured in the same run."""

from __future__ import annotations

import pytest

from recmesh.errors import InvalidArgument
from recmesh.tools.bench.e2e import baseline_table
from recmesh.tools.bench.loadgen import ClassSummary, StepResult
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


def _step(rate: float, p50_ms: float, cpu: dict[str, float]) -> StepResult:
    step = StepResult(rate, 1.0, cpu_ms_per_request=cpu)
    step.classes["A"] = ClassSummary("A", 10, 10, 0, 0, 0, 10, p50_ms, p50_ms, p50_ms, 10.0, 0.0, 1.0)
    return step


def test_baseline_ratios_are_mesh_over_floor_step_by_step() -> None:
    mesh = [_step(20, 12.0, {"ranker": 4.0, "feature": 2.0}), _step(400, 80.0, {})]
    floor = [_step(20, 4.0, {"ranker": 1.5, "gateway": 0.5}), _step(400, 5.0, {"ranker": 1.0})]
    rows = baseline_table(mesh, floor).splitlines()[2:]
    assert rows[0].split() == ["20", "4.0", "ms", "3.00x", "2.00", "ms", "3.00x"]
    assert rows[1].split() == ["400", "5.0", "ms", "16.00x", "1.00", "ms", "-"], "no mesh CPU: no ratio"
