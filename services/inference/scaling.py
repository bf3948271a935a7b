"""The GPU-driven scaling rule for inference replicas, and the same rule in PromQL.

Design notes (vLLM + Triton): scale out when GPU memory >= 85% and more than 32
requests are pending; scale in after 60 s at <= 40% with nothing pending.

The inputs are what the inference service exports (the names Prometheus sees):
`recmesh_inference_gpu_memory_used_ratio{gpu}` (pressure.py, NVML) and
`recmesh_inference_queue_depth` (batcher.py: requests waiting to be batched).
Over the whole fleet: GPU memory is the fullest GPU of any replica, pending the
sum of every replica's queue. One step per decision: +1, -1 or 0 replicas.

`scaling_step` is the policy, tested on traces; `scale_ratio_promql` is the
same rule as the query KEDA's Prometheus trigger runs (deploy/k8s/overlays/gpu),
built from the same constants so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

GPU_MEMORY_METRIC = "recmesh_inference_gpu_memory_used_ratio"
QUEUE_DEPTH_METRIC = "recmesh_inference_queue_depth"

SCALE_OUT_GPU_MEMORY_RATIO = 0.85  # at or above ...
SCALE_OUT_PENDING = 32  # ... and strictly more pending than this
SCALE_IN_GPU_MEMORY_RATIO = 0.40  # at or below ...
SCALE_IN_PENDING = 0  # ... with nothing pending ...
SCALE_IN_AFTER_S = 60  # ... for this long


@dataclass(frozen=True)
class Sample:
    """The fleet's load at one time."""

    at_s: float
    gpu_memory_ratio: float | None  # fullest GPU; None where no GPU reports (counts as empty)
    pending: int  # requests waiting, all replicas together


def fleet_sample(at_s: float, replicas: Iterable[tuple[float | None, int]]) -> Sample:
    """One Sample from every replica's (GPU memory ratio, queue depth)."""
    readings = list(replicas)
    memory = [m for m, _ in readings if m is not None]
    return Sample(at_s, max(memory) if memory else None, sum(q for _, q in readings))


def _memory(sample: Sample) -> float:
    return sample.gpu_memory_ratio or 0.0


def scaling_step(history: Sequence[Sample], now_s: float) -> int:
    """+1, -1 or 0 replicas, from the samples up to `now_s` (oldest first).

    Out on the latest sample alone (pressure does not wait); in only when the
    samples cover the last SCALE_IN_AFTER_S seconds and every one of them is idle.
    """
    seen = [s for s in history if s.at_s <= now_s]
    if not seen:
        return 0
    latest = seen[-1]
    if _memory(latest) >= SCALE_OUT_GPU_MEMORY_RATIO and latest.pending > SCALE_OUT_PENDING:
        return 1
    since = now_s - SCALE_IN_AFTER_S
    if seen[0].at_s > since:
        return 0  # not observed for long enough
    window = [s for s in seen if s.at_s > since]  # left-open, as a Prometheus 3 range selector
    if window and all(
        _memory(s) <= SCALE_IN_GPU_MEMORY_RATIO and s.pending <= SCALE_IN_PENDING for s in window
    ):
        return -1
    return 0


def trace_from_prometheus(memory: Sequence[dict[str, Any]], queue: Sequence[dict[str, Any]]) -> list[Sample]:
    """A recorded trace from two Prometheus range queries (`data.result` of /api/v1/query_range).

    `memory`: the series of GPU_MEMORY_METRIC, `queue`: those of QUEUE_DEPTH_METRIC, one series
    per pod (and GPU); values are `[unix_seconds, "value"]`. Per timestamp: the fullest GPU,
    and the sum of the queues (the fleet_sample aggregation). Timestamps without any queue
    series are left out: no replica answered then.
    """
    fullest: dict[float, float] = {}
    for series in memory:
        for at, value in series["values"]:
            fullest[float(at)] = max(fullest.get(float(at), 0.0), float(value))
    pending: dict[float, int] = {}
    for series in queue:
        for at, value in series["values"]:
            pending[float(at)] = pending.get(float(at), 0) + round(float(value))
    return [Sample(at, fullest.get(at), pending[at]) for at in sorted(pending)]


@dataclass(frozen=True)
class Step:
    at_s: float
    replicas: int
    change: int


def replay(
    trace: Sequence[Sample], replicas: int, min_replicas: int, max_replicas: int, every_s: float
) -> list[Step]:
    """The replica count a controller evaluating every `every_s` would keep over `trace`.

    At most one replica removed per SCALE_IN_AFTER_S, as the HPA scale-down
    policy in the manifest (`Pods: 1` per 60 s); out, one per evaluation.
    """
    if not trace:
        return []
    steps: list[Step] = []
    last_in_s = float("-inf")
    now = trace[0].at_s
    while now <= trace[-1].at_s:
        change = scaling_step(trace, now)
        if change < 0 and now - last_in_s < SCALE_IN_AFTER_S:
            change = 0
        target = min(max_replicas, max(min_replicas, replicas + change))
        change = target - replicas
        if change < 0:
            last_in_s = now
        replicas = target
        steps.append(Step(now, replicas, change))
        now += every_s
    return steps


# The query answers a ratio the HPA multiplies its current replica count by
# (metricType Value, threshold 1: desired = ceil(current x ratio)): 1 holds, OUT_RATIO
# asks for at least one more replica at any count, IN_RATIO for at least one fewer
# from 2 up; both clear the HPA's 10% tolerance. The manifest's HPA policies let
# one replica through per period (out: per evaluation, in: per SCALE_IN_AFTER_S),
# as `replay` does. The HPA's own count is used, not a count of scraped pods, so
# a pod still pulling its image does not read as a replica too many.
OUT_RATIO = 1.5
IN_RATIO = 0.5


def scale_ratio_promql(selector: str) -> str:
    """The rule as one PromQL expression: OUT_RATIO to add, IN_RATIO to remove, 1 to hold.

    `selector` picks the inference pods' series (e.g. `namespace="recmesh",job="inference"`).
    Absent GPU series (no NVML) read as 0, like `scaling_step`'s None. No queue series
    at all (no replica scraped, or Prometheus lost them) gives an empty result, which
    KEDA (ignoreNullValues "false") reports as an error: the HPA keeps its count.
    """
    memory = f"{GPU_MEMORY_METRIC}{{{selector}}}"
    queue = f"{QUEUE_DEPTH_METRIC}{{{selector}}}"
    window = f"[{SCALE_IN_AFTER_S}s]"
    out = (
        f"((max({memory}) or vector(0)) >= bool {SCALE_OUT_GPU_MEMORY_RATIO})"
        f" * (sum({queue}) > bool {SCALE_OUT_PENDING})"
    )
    scale_in = (
        f"((max(max_over_time({memory}{window})) or vector(0)) <= bool {SCALE_IN_GPU_MEMORY_RATIO})"
        f" * (sum(max_over_time({queue}{window})) <= bool {SCALE_IN_PENDING})"
    )
    return f"1 + {OUT_RATIO - 1} * ({out}) - {1 - IN_RATIO} * ({scale_in})"
