"""`recmesh bench graph`: the ranker's own Python per Rank, without its calls.

The ranker's CPU per answer is its graph (recall, fusion, the seen filter,
the block's categories, the final order, spans and metrics per node) plus
gRPC and the event loop. This measures the first alone: it builds the
ranker's graph in this process exactly as the ranker does (its settings,
repository, model directory, recall tables and index), asks the running
mesh's feature and inference services once per user and keeps their answers,
then replays those answers through the graph `--repeat` times, each Rank under
an unsampled server span as the ranker's own server opens it (no exporter:
the mesh's default). Printed: CPU ms per Rank (this process's CPU time over
the replay), the median and range of the repeats, and each node's own time
per Rank (its recorded answers return at once, so a node runs without
suspending and its time is its CPU; what the nodes do not add up to is the
graph's own scheduling: tasks, deadlines, spans). Nothing of gRPC, Redis or
the services is in the figure, so it moves only with the graph's code:
compare two trees by running it from each, alternated.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from recmesh.stats import percentile
from recmesh.tools.bench.common import emit

Key = tuple[str, str | None, bool | None]


class _Recorded:
    """A client whose calls answer from what the real one answered for the same
    method, user and kind of look-up (items or not), once recorded."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.answers: dict[Key, Any] = {}
        self.replaying = False

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._real, name)
        if not asyncio.iscoroutinefunction(method):
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            first = args[0] if args and isinstance(args[0], str) else None
            items = bool(args[1]) if len(args) > 1 and isinstance(args[1], list) else None
            key: Key = (name, first, items)
            if self.replaying and key in self.answers:
                return self.answers[key]
            got = await cast(Callable[..., Awaitable[Any]], method)(*args, **kwargs)
            self.answers[key] = got
            return got

        return call


async def run(users: list[str], repeat: int, passes: int) -> dict[str, Any]:
    from opentelemetry import trace

    from recmesh.clients.feature import FeatureClient
    from recmesh.clients.inference import InferenceClient
    from recmesh.errors import RecmeshError, Unavailable
    from recmesh.features.repository import served_feature_set
    from recmesh.resilience import request_scope
    from recmesh.settings import RankerSettings
    from recmesh.telemetry import setup_tracing
    from services.ranker.pipeline import build_pipeline

    setup_tracing("recmesh-ranker", redis=False)  # as the ranker: no exporter, nothing sampled
    server = trace.get_tracer("recmesh.bench.graph")
    settings = RankerSettings()
    features = _Recorded(FeatureClient(settings.feature_addr, "bench-graph", settings.hop_margin_ms))
    inference = _Recorded(InferenceClient(settings.inference_addr, "bench-graph", settings.hop_margin_ms))
    pipeline = build_pipeline(
        settings, cast(Any, features), cast(Any, inference), served_feature_set(settings.repository, "ranker")
    )
    as_of = int(time.time() * 1000)
    answers: dict[str, tuple[dict[Key, Any], dict[Key, Any]]] = {}
    degraded: set[str] = set()
    for user in users:  # recorded: each user's calls once, against the running mesh
        features.answers, inference.answers = {}, {}
        try:
            with request_scope("B", 1.0):
                ranked = await pipeline.rank(user, 10, as_of)
        except RecmeshError as err:
            raise Unavailable(
                f"{err} (bench graph records a running mesh's answers: start it with `recmesh up` and "
                f"source its <state dir>/secrets/cli.env; feature at {settings.feature_addr}, inference at "
                f"{settings.inference_addr})"
            ) from None
        degraded.update(ranked.degraded)
        answers[user] = (features.answers, inference.answers)
    features.replaying = inference.replaying = True
    before = _stage_seconds()
    per_rank_ms: list[float] = []
    for _ in range(repeat):
        started = time.process_time()
        for _ in range(passes):
            for user in users:
                features.answers, inference.answers = answers[user]
                with request_scope("B", 1.0), server.start_as_current_span("Rank"):
                    await pipeline.rank(user, 10, as_of)
        per_rank_ms.append((time.process_time() - started) / (passes * len(users)) * 1000)
    ranks = repeat * passes * len(users)
    after = _stage_seconds()
    by_node = {n: round((after[n] - before.get(n, 0.0)) / ranks * 1000, 3) for n in after}
    return {
        "users": len(users),
        "ranks_per_repeat": passes * len(users),
        "cpu_ms_per_rank": round(percentile(per_rank_ms, 50), 3),
        "cpu_ms_per_rank_range": [round(min(per_rank_ms), 3), round(max(per_rank_ms), 3)],
        "degraded_when_recorded": sorted(degraded),
        # each node's own time per Rank (its answers are in memory: it runs without
        # suspending, so its time is its CPU); the rest is the graph's scheduling
        "node_ms_per_rank": dict(sorted(by_node.items(), key=lambda kv: -kv[1])),
    }


def _stage_seconds() -> dict[str, float]:
    """Seconds each node of the graph has run so far in this process (the ranker's stage histogram)."""
    from services.ranker.pipeline import STAGE_LATENCY

    out: dict[str, float] = {}
    for metric in STAGE_LATENCY.collect():
        for sample in metric.samples:
            if sample.name.endswith("_sum"):
                node = sample.labels["stage"]
                out[node] = out.get(node, 0.0) + sample.value
    return out


def main(args: Any) -> int:
    users = [f"{args.user_prefix}{(n * 7919) % args.users}" for n in range(args.sample)]
    figures = asyncio.run(run(users, args.repeat, args.passes))
    lo, hi = figures["cpu_ms_per_rank_range"]
    table = (
        f"the ranker's graph alone, {figures['users']} users' recorded answers replayed "
        f"{args.repeat} x {figures['ranks_per_repeat']} Ranks: {figures['cpu_ms_per_rank']} ms CPU per Rank "
        f"(range {lo}-{hi})\n  each node's own ms per Rank: "
        + ", ".join(f"{n} {ms}" for n, ms in figures["node_ms_per_rank"].items())
        + f"\n  degraded while recording: {figures['degraded_when_recorded'] or 'none'}"
    )
    emit(figures, args.json, table)
    return 0
