"""`recmesh bench inference` end to end on a short run: the figures it prints
are there and consistent (no speed is asserted: figures, not stopwatches)."""

from __future__ import annotations

import math
from pathlib import Path

from recmesh.tools.bench.inference import run, table


async def test_bench_figures_are_consistent(model_dir: Path) -> None:
    f = await run(model_dir, rows=2, concurrency=4, seconds=0.3)
    assert 0 < f["cold_start_s"] <= f["cold_start_max_s"]
    assert f["first_score_s"] >= f["cold_start_s"], "the first Score comes after SERVING"
    for mode in ("off", "on"):
        assert f[f"batching_{mode}_rps"] > 0
        assert math.isfinite(f[f"batching_{mode}_server_cpu_us"]) and f[f"batching_{mode}_server_cpu_us"] > 0
    assert f["request_cost_basis"] == "service CPU per request"
    assert 0 < f["model_share_of_request_cost"] < 1 and f["model_time_ratio_bound"] >= 1
    assert "x5 needs batching to save 80%" in table(f)


async def test_repeat_alternates_and_reports_each_wait(model_dir: Path) -> None:
    f = await run(model_dir, rows=1, concurrency=4, seconds=0.2, repeat=2, max_delays_us=[0, 500])
    assert f["configs"] == ["off", "on_wait0us", "on_wait500us"]
    assert f["rounds"] == 2
    for name in ("on_wait0us", "on_wait500us"):
        ratio = f["ratios"][f"throughput_ratio_{name}"]
        assert ratio["rounds"] == 2 and ratio["low"] <= ratio["median"] <= ratio["high"]
    text = table(f)
    assert "on_wait0us / off" in text and "2 rounds" in text
