"""`recmesh bench e2e` sets its figures against the floor measured in the same run."""

from __future__ import annotations

from recmesh.tools.bench.e2e import baseline_table
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
