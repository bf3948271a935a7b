"""The GPU-driven scaling rule (services/inference/scaling.py) on generated traces."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.inference import batcher, pressure
from services.inference.scaling import (
    GPU_MEMORY_METRIC,
    QUEUE_DEPTH_METRIC,
    Sample,
    fleet_sample,
    replay,
    scale_ratio_promql,
    scaling_step,
    trace_from_prometheus,
)

promql_parser: Any = importlib.import_module("promql_parser")  # ships no type hints


def trace(
    seconds: int, every_s: int, load: Callable[[int], tuple[float | None, int]], start: int = 0
) -> list[Sample]:
    return [Sample(t, *load(t)) for t in range(start, start + seconds, every_s)]


def test_scale_out_needs_both_memory_and_pending() -> None:
    def step(memory: float | None, pending: int) -> int:
        return scaling_step([Sample(0, memory, pending)], 0)

    assert step(0.85, 33) == 1
    assert step(0.99, 500) == 1
    assert step(0.85, 32) == 0, "32 pending is not more than 32"
    assert step(0.849, 500) == 0
    assert step(None, 500) == 0, "no GPU reading: memory pressure cannot be claimed"


def test_scale_in_needs_a_full_idle_minute() -> None:
    idle = trace(61, 15, lambda t: (0.30, 0))  # samples at 0, 15, 30, 45, 60
    assert scaling_step(idle, 45) == 0, "45 s observed: not yet"
    assert scaling_step(idle, 60) == -1
    assert scaling_step([Sample(s.at_s, None, 0) for s in idle], 60) == -1, "no GPU: memory counts as 0"
    one_request = [s if s.at_s != 30 else Sample(30, 0.30, 1) for s in idle]
    assert scaling_step(one_request, 60) == 0, "something pending in the window"
    warm_gpu = [s if s.at_s != 15 else Sample(15, 0.41, 0) for s in idle]
    assert scaling_step(warm_gpu, 60) == 0, "above 40% in the window"
    assert scaling_step([*warm_gpu, Sample(75, 0.2, 0)], 75) == -1, "at 75 s the window is (15, 75]"


def test_between_the_thresholds_nothing_moves() -> None:
    middle = trace(600, 15, lambda t: (0.6, 10))
    assert all(s.change == 0 for s in replay(middle, 3, 1, 10, 15))


def test_fleet_sample_takes_the_fullest_gpu_and_all_pending() -> None:
    assert fleet_sample(5, [(0.5, 10), (0.9, 30), (None, 3)]) == Sample(5, 0.9, 43)
    assert fleet_sample(5, [(None, 0), (None, 2)]) == Sample(5, None, 2)


def test_a_surge_scales_out_each_evaluation_then_in_one_replica_a_minute() -> None:
    def surge(t: int) -> tuple[float, int]:
        if t < 120:
            return 0.35, 0  # quiet
        if t < 210:
            return 0.90, 120  # surge: memory and queue over the line
        if t < 330:
            return 0.60, 8  # busy but below both lines
        return 0.30, 0  # quiet again

    steps = replay(trace(700, 15, surge), replicas=2, min_replicas=1, max_replicas=10, every_s=15)
    changes = [(s.at_s, s.change, s.replicas) for s in steps if s.change]
    # Quiet for the first minute: 2 -> 1 at 60 s, and the min holds it at 1 until the surge.
    assert changes[0] == (60, -1, 1)
    outs = [c for c in changes if c[1] > 0]
    assert [c[0] for c in outs] == [120, 135, 150, 165, 180, 195]  # +1 per evaluation while surging
    assert max(s.replicas for s in steps) == 7
    ins = [c for c in changes if c[1] < 0 and c[0] > 200]
    # Last busy sample at 315 s: the first scale-in once the 60 s window (315, 375] holds only
    # quiet samples, then one replica a minute down to the minimum.
    assert [c[0] for c in ins] == [375, 435, 495, 555, 615, 675]
    assert steps[-1].replicas == 1
    assert all(abs(s.change) <= 1 for s in steps)


def test_flapping_load_around_the_scale_in_line_never_scales_in() -> None:
    # Memory crosses 40% every 30 s (design notes: short windows flapped on noise).
    flapping = trace(900, 15, lambda t: (0.30 if (t // 30) % 2 else 0.45, 0))
    assert all(s.change == 0 for s in replay(flapping, 4, 1, 10, 15))
    # A lone request every 45 s keeps it too.
    trickle = trace(900, 15, lambda t: (0.2, 1 if t % 45 == 0 else 0))
    assert all(s.change == 0 for s in replay(trickle, 4, 1, 10, 15))


def test_bounds_hold() -> None:
    hot = trace(600, 15, lambda t: (0.95, 1000))
    steps = replay(hot, 1, 1, 10, 15)
    assert steps[-1].replicas == 10 and max(s.replicas for s in steps) == 10
    cold = trace(600, 15, lambda t: (0.1, 0))
    assert min(s.replicas for s in replay(cold, 3, 2, 10, 15)) == 2


def test_the_query_reads_the_metrics_the_inference_service_exports() -> None:
    # prometheus_client names the series exactly as Prometheus will see them.
    assert pressure.GPU_MEMORY._name == GPU_MEMORY_METRIC
    assert batcher.QUEUE_DEPTH._name == QUEUE_DEPTH_METRIC
    query = scale_ratio_promql('namespace="recmesh",job="inference"')
    expr = promql_parser.parse(query)
    assert type(expr).__name__ == "BinaryExpr"
    text = expr.prettify()
    for needed in (">= bool\n", "0.85", "> bool 32", "<= bool\n", "0.4", "[1m]", "max_over_time("):
        assert needed in text, needed


def test_a_trace_in_prometheus_range_query_form_replays() -> None:
    # Shaped exactly like two /api/v1/query_range answers (15 s step); generated, since no GPU
    # cluster is at hand: pod a alone, a surge, pod b scraped from 165 s on, then quiet.
    # Record your own with curl 'PROM/api/v1/query_range?query=METRIC{job="inference"}&...'.
    recorded = json.loads((Path(__file__).parent / "data" / "gpu_scaling_trace.json").read_text())
    memory = recorded[GPU_MEMORY_METRIC]["data"]["result"]
    queue = recorded[QUEUE_DEPTH_METRIC]["data"]["result"]
    samples = trace_from_prometheus(memory, queue)
    t0 = samples[0].at_s
    by_offset = {s.at_s - t0: s for s in samples}
    assert len(samples) == 48
    assert by_offset[150] == Sample(t0 + 150, 0.91, 48), "one pod"
    assert by_offset[165] == Sample(t0 + 165, 0.91, 68), "two pods: fullest GPU, summed queues"
    steps = replay(samples, replicas=1, min_replicas=1, max_replicas=10, every_s=15)
    changes = [(s.at_s - t0, s.change) for s in steps if s.change]
    assert changes == [
        *((float(t), 1) for t in range(120, 240, 15)),  # surge: out every evaluation, 1 -> 9
        *((float(t), -1) for t in range(375, 720, 60)),  # quiet from 330 s: in once a minute, 9 -> 3
    ]
    assert steps[-1].replicas == 3
