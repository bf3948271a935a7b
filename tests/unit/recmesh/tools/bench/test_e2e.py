"""`recmesh bench e2e` sets its figures against the floor measured in the same run."""

from __future__ import annotations

from pathlib import Path

import pytest

from recmesh.errors import InvalidArgument
from recmesh.tools.bench.e2e import (
    against_table,
    against_tree,
    baseline_table,
    full_answer_capacity,
    parse_against,
    ratio_table,
    ratios,
)
from recmesh.tools.bench.loadgen import ClassSummary, StepResult


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


def _loaded(rate: float, full: int, cpu: float, offered: int = 100) -> StepResult:
    """`full` of `offered` class-A answers within budget and not degraded."""
    step = StepResult(rate, 1.0, cpu_ms_per_request={"all": cpu})
    step.classes["A"] = ClassSummary("A", offered, offered, 0, 0, offered - full, offered, 5, 6, 7, 1, 0, 1)
    return step


def test_full_answer_capacity_is_the_last_rate_before_answers_degrade() -> None:
    steps = [_step(20, 4.0, {}), _loaded(100, 100, 1), _loaded(200, 96, 1), _loaded(400, 50, 1),
             _loaded(800, 99, 1)]  # fmt: skip
    assert full_answer_capacity(steps) == 200, "400/s had half degraded; 800/s after it does not count"
    assert full_answer_capacity([_step(20, 4.0, {}), _loaded(100, 10, 1)]) == 0


def test_round_ratios_and_their_spread() -> None:
    floor = [_step(20, 2.0, {}), _loaded(100, 100, 2.0), _loaded(200, 100, 2.0)]
    rounds = []
    for p50, cpu in ((4.0, 5.0), (5.0, 6.0), (3.0, 4.0)):
        mesh = [_step(20, p50, {}), _loaded(100, 100, cpu), _loaded(200, 10, cpu)]
        rounds.append(ratios(mesh, floor))
    assert rounds[0] == {"unloaded_p50": 2.0, "cpu@100": 2.5, "cpu@200": 2.5, "capacity_mesh": 100.0,
                         "capacity_floor": 200.0, "capacity": 0.5}  # fmt: skip
    text = ratio_table(rounds, [100.0, 200.0])
    assert "unloaded class-A p50        2.00x (range 1.50-2.50, 3 rounds)" in text
    assert "CPU per answer at   100/s   2.50x (range 2.00-3.00, 3 rounds)" in text
    assert "0.50x" in text and "mesh 100/s, floor 200/s" in text


def test_against_names_the_second_meshs_variables_and_refuses_anything_else() -> None:
    assert parse_against("RECMESH_RANKER_ITEM_BLOCK=false, A=1") == {
        "RECMESH_RANKER_ITEM_BLOCK": "false",
        "A": "1",
    }
    assert parse_against(None) == {} and parse_against("") == {}
    with pytest.raises(InvalidArgument, match="'RECMESH_X' is not VAR=VALUE"):
        parse_against("RECMESH_X")


def test_the_against_table_compares_each_process_round_by_round() -> None:
    def sweep(ranker: float, feature: float, p50: float = 4.0) -> list[StepResult]:
        return [_step(20, p50, {}), _step(100, 5.0, {"ranker": ranker, "feature": feature})]

    mesh = [sweep(2.0, 1.0, 4.0), sweep(3.0, 1.0, 6.0), sweep(2.0, 2.0, 5.0)]
    other = [sweep(4.0, 1.0, 4.0), sweep(3.0, 2.0, 4.0), sweep(4.0, 1.0, 5.0)]
    lines = against_table(mesh, other, "X=1").splitlines()
    assert lines[1].split()[4:8] == ["5.00", "against", "4.00", "ratio"], "medians of the unloaded p50s"
    assert lines[1].split()[8] == "1.00x" and "(range 1.00-1.50, 3 rounds)" in lines[1], "1, 1.5, 1"
    rows = {line.split()[0]: line.split() for line in lines[3:]}
    assert rows["ranker"][1:4] == ["2.00", "against", "4.00"]
    assert rows["ranker"][5] == "0.50x", "rounds: 0.5, 1.0, 0.5"
    assert rows["all"][1:4] == ["4.00", "against", "5.00"] and rows["all"][5] == "0.80x", "3, 4, 4 / 5"
    assert "(range 0.60-0.80, 3 rounds)" in " ".join(rows["all"])


def test_against_tree_must_be_a_recmesh_checkout(tmp_path: Path) -> None:
    assert against_tree(None) is None
    with pytest.raises(InvalidArgument, match="not a recmesh checkout"):
        against_tree(str(tmp_path))
    (tmp_path / "recmesh" / "tools").mkdir(parents=True)
    (tmp_path / "recmesh" / "tools" / "up.py").write_text("")
    (tmp_path / "services").mkdir()
    assert against_tree(str(tmp_path)) == tmp_path.resolve()
