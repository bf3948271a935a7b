"""`recmesh bench tls`'s summary: medians over alternated rounds, ratios on / off (pure logic)."""

from __future__ import annotations

import math

from recmesh.tools.bench.loadgen import ClassSummary, StepResult
from recmesh.tools.bench.tls import summary, table


def step(rate: float, p50_ms: float, cpu: dict[str, float]) -> StepResult:
    a = ClassSummary("A", 100, 100, 0, 0, 0, 100, p50_ms, p50_ms, p50_ms, 20.0, 0.0, 1.0)
    return StepResult(rate, 2.0, {"A": a}, 20.0, 0.0, cpu)


def test_medians_per_mode_and_ratios() -> None:
    def rnd(p50: float, unloaded_ranker: float, loaded_ranker: float, gw: float = 2.0) -> list[StepResult]:
        return [step(20, p50, {"gateway": gw, "ranker": unloaded_ranker}),
                step(100, 0, {"gateway": 1.0, "ranker": loaded_ranker})]  # fmt: skip

    runs = {
        "on": [rnd(12.0, 4.0, 3.0), rnd(14.0, 6.0, 5.0), rnd(30.0, 9.0, 4.0, gw=9.0)],
        "off": [rnd(10.0, 3.0, 2.0), rnd(10.0, 3.0, 3.0), rnd(11.0, 3.0, 2.0)],
    }
    s = summary(runs)
    assert s["on"]["unloaded_a_p50_ms"] == 14.0 and s["off"]["unloaded_a_p50_ms"] == 10.0  # medians
    assert s["on"]["cpu_ms_per_request"] == [8.0, 5.0] and s["off"]["cpu_ms_per_request"] == [5.0, 3.0]
    assert math.isclose(s["ratio"]["unloaded_a_p50"], 1.4)
    assert [round(r, 3) for r in s["ratio"]["cpu_ms_per_request"]] == [1.6, 1.667]
    text = table(s, 3)
    assert "1.40x" in text and "cpu ms @100/s" in text and "3 round(s)" in text
